"""The Tile verifier and `allocate`'s key walk skip a node whose map, op, space, shape, dtype (and
input spaces) are the very objects of the last node they worked out with that map; the verifier
checks the rest once per `buf` (all it reads of a node's map), not per map.  What they skip must
be what the full work would have found: these graphs make the skipped nodes matter."""
from pypto.compiler.memory import _Keys
from pypto.dtypes import DT_FP32
from pypto.errors import VerificationError
from pypto.ir import tile as tile_ir
from pypto.ir.core import Attrs
from pypto.ir.gm import GMBuffer, GMRef
from pypto.ir.tile import GroupInfo, TileGraph, TileNode

_BUF = GMBuffer("x", (64, 256), DT_FP32, "inout")
_CAPS = {"UB": 4096, "L1": 1 << 20, "L0A": 1 << 16, "L0B": 1 << 16, "L0C": 1 << 17, "BT": 1024}


def _node(i, op, attrs, inputs=(), shape=(8, 64), space="UB", inner=0):
    return TileNode(i, op, tuple(inputs), shape, shape, DT_FP32, space, 0, 0, inner, attrs, par=inner)


def _error(nodes) -> str | None:
    g = TileGraph("t", (_BUF,), (GroupInfo(0, "vector", (64, 256), (8, 64), 1, 4),), tuple(nodes))
    try:
        tile_ir.verify(g, _CAPS)
    except VerificationError as e:
        return str(e)
    return None


def _own_maps(nodes):
    return [n.with_field("attrs", Attrs(n.attrs._dict)) for n in nodes]


def test_loads_of_their_own_maps_at_one_buf_are_each_checked_for_their_size():
    w = [GMRef.whole(_BUF).window((8 * i, 0), (8, 64)) for i in range(3)]
    small = [_node(i, "TLOAD", Attrs({"key": "x", "gm": w[i], "buf": 2048})) for i in range(2)]
    assert _error(small) is None                        # 2 KiB at 2048 of 4 KiB: fits
    big = _node(2, "TLOAD", Attrs({"key": "x", "gm": w[2], "buf": 2048}), shape=(16, 64))
    err = _error(small + [big])
    assert err is not None and "%2" in err and "tile overflows UB" in err


def test_a_node_the_verifier_skips_reads_its_inputs_in_their_spaces():
    exp = Attrs({"key": "e", "buf": 0})
    load = Attrs({"key": "x", "buf": 0})
    ok = [_node(0, "TLOAD", load, []), _node(1, "TEXP", exp, [0]), _node(2, "TEXP", exp, [1])]
    assert _error(ok) is None
    # the same map, op and fields as node 1, reading a tile in L1: checked, and refused
    bad = ok + [_node(3, "TLOAD", load, [], space="L1"), _node(4, "TEXP", exp, [3])]
    err = _error(bad)
    assert err is not None and "%4" in err and "vector ops work on UB tiles" in err
    assert err == _error(_own_maps(bad))


def _keys(nodes):
    k = _Keys(nodes, nodes)
    return k.size, k.space, k.persistent, k.chunks, k.asked, k.key_of


def test_the_last_tile_of_a_key_decides_its_space_when_its_map_was_seen_before():
    a, b = Attrs({"key": "k"}), Attrs({"key": "k", "persistent": True})
    nodes = [_node(0, "TEXP", a), _node(1, "TEXP", b, space="L1", inner=1), _node(2, "TEXP", a, inner=2)]
    assert _keys(nodes)[1] == {"k": "UB"} == _keys(_own_maps(nodes))[1]
    assert _keys(nodes[:2])[1] == {"k": "L1"}
    assert _keys(nodes) == _keys(_own_maps(nodes))


def test_the_k_chunks_of_a_ring_key_count_the_nodes_the_walk_skips():
    ring = Attrs({"key": "a1", "ring": True})
    nodes = [_node(i, "TLOAD", ring, space="L1", inner=i % 3) for i in range(7)]
    assert _keys(nodes)[3] == {"a1": {0, 1, 2}} == _keys(_own_maps(nodes))[3]
