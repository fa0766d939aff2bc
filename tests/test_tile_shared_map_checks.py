"""The Tile verifier and `allocate`'s key walk remember what they worked out per attribute map
(by its identity: equal maps are one shared object), together with what else decides it (the
node's op, space, shape, dtype and input spaces for the verifier; its space, shape and dtype
for the keys).  Nodes that share a map but differ in one of those must still be checked and
counted each as itself: these graphs share maps where they differ."""
import pytest

from pypto.compiler.memory import _Keys
from pypto.dtypes import DT_FP16, DT_FP32
from pypto.errors import VerificationError
from pypto.ir import tile as tile_ir
from pypto.ir.core import Attrs
from pypto.ir.gm import GMBuffer, GMRef
from pypto.ir.tile import GroupInfo, TileGraph, TileNode

_BUF = GMBuffer("x", (64, 256), DT_FP32, "inout")
_W = GMRef.whole(_BUF).window((0, 0), (8, 64))
_CAPS = {"UB": 4096, "L1": 1 << 20, "L0A": 1 << 16, "L0B": 1 << 16, "L0C": 1 << 17, "BT": 1024}


def _node(i, op, attrs, inputs=(), shape=(8, 64), space="UB", dtype=DT_FP32, inner=0):
    return TileNode(i, op, tuple(inputs), shape, shape, dtype, space, 0, 0, inner, attrs, par=inner)


def _graph(nodes):
    return TileGraph("t", (_BUF,), (GroupInfo(0, "vector", (64, 256), (8, 64), 1, 4),), tuple(nodes))


def _own_maps(nodes):
    return [n.with_field("attrs", Attrs(n.attrs._dict)) for n in nodes]


def _error(nodes) -> str | None:
    try:
        tile_ir.verify(_graph(nodes), _CAPS)
    except VerificationError as e:
        return str(e)
    return None


def test_a_shared_map_with_a_larger_tile_still_overflows():
    at = Attrs({"key": "a", "gm": _W, "buf": 2048})     # 8x64 fp32 = 2 KiB: fits at 2048 of 4 KiB
    nodes = [_node(0, "TLOAD", at), _node(1, "TLOAD", at, shape=(16, 64))]
    assert _error(nodes[:1]) is None
    err = _error(nodes)
    assert err is not None and "%1" in err and "tile overflows UB" in err
    assert err == _error(_own_maps(nodes))


def test_a_shared_map_in_another_space_or_with_other_inputs_is_checked_again():
    load = Attrs({"key": "x", "gm": _W, "buf": 0})
    exp = Attrs({"key": "e", "buf": 0})
    ok = [_node(0, "TLOAD", load), _node(1, "TEXP", exp, [0])]
    assert _error(ok) is None
    # the same map on a vector op whose tile is in L1, then on one reading an L1 tile
    for bad, where in ((ok + [_node(2, "TEXP", exp, [0], space="L1")], "%2"),
                       (ok + [_node(2, "TLOAD", load, space="L1"), _node(3, "TEXP", exp, [2])], "%3")):
        err = _error(bad)
        assert err is not None and where in err and "vector ops work on UB tiles" in err
        assert err == _error(_own_maps(bad))


def test_a_shared_map_with_another_dtype_still_overflows():
    at = Attrs({"key": "a", "gm": _W, "buf": 3072})     # 8x64 fp16 = 1 KiB: fits; fp32 does not
    nodes = [_node(0, "TLOAD", at, dtype=DT_FP16), _node(1, "TLOAD", at)]
    assert _error(nodes[:1]) is None
    err = _error(nodes)
    assert err is not None and "%1" in err and "tile overflows UB" in err


def _keys(nodes):
    k = _Keys(nodes, nodes)
    return k.size, k.space, k.persistent, {key: sorted(c) for key, c in k.chunks.items()}, k.asked, k.key_of


@pytest.mark.parametrize("order", [0, 1], ids=["small_first", "large_first"])
def test_the_keys_of_shared_maps_are_those_of_own_maps(order):
    a = Attrs({"key": "a", "gm": _W, "ring": True})
    b = Attrs({"key": "a", "gm": _W, "persistent": True, "buffers": 3})
    shapes = [(8, 64), (16, 64)][::1 if order == 0 else -1]
    nodes = [_node(0, "TLOAD", a, shape=shapes[0], inner=0),
             _node(1, "TLOAD", a, shape=shapes[1], inner=1),       # same map, another size
             _node(2, "TLOAD", a, shape=shapes[1], inner=2),       # same map, size and space
             _node(3, "TLOAD", b, space="L1", inner=3),            # another map of key a, in L1
             _node(4, "TLOAD", a, shape=shapes[1], inner=4)]       # a's again: back in UB
    shared = _keys(nodes)
    assert shared == _keys(_own_maps(nodes))
    size, space, persistent, chunks, asked, _ = shared
    assert size == {"a": 16 * 64 * 4} and space == {"a": "UB"} and persistent == {"a"}
    assert chunks == {"a": [0, 1, 2, 4]} and asked == {"a": 3}
    # the last tile of a key decides its space, wherever its map was seen first
    assert _keys(nodes[:4])[1] == {"a": "L1"} == _keys(_own_maps(nodes[:4]))[1]
