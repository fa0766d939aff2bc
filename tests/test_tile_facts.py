"""Tiling notes facts about the Tile Graph it makes (`TileGraph.facts`): where each group's nodes
and its longest iteration are, and whether any outer iteration loads a GM window twice.
`allocate` and `find_redundant_loads` use them instead of walking every node, and
`assign_spaces` hands them on.  A graph without them (any graph a pass of the user's makes)
takes the walk: given the same nodes, both must come to exactly the same."""
import pytest

import pypto
from pypto.compiler import PASSES
from pypto.compiler.memory import _Keys, _groups, _longest_iteration, allocate, assign_spaces
from pypto.compiler.pipeline import PassContext
from pypto.compiler.reuse import eliminate_redundant_loads, find_redundant_loads
from pypto.dtypes import DT_FP32
from pypto.ir.core import Attrs
from pypto.ir.tile import TileNode

from common import conv_relu_nhwc as conv_relu, matmul, matmul_auto as bmm, matmul_bias_gelu, softmax

F16, F32 = pypto.DT_FP16, pypto.DT_FP32
T = pypto.Tensor


@pypto.jit
def same_a_twice(a, b, d, out):
    pypto.set_cube_tile_shapes([64, 64], [64, 128], [64, 64])
    out[:] = pypto.matmul(a, b) + pypto.matmul(a, d)


@pypto.jit
def gram(a, out):
    pypto.set_cube_tile_shapes([64, 64], [64, 128], [64, 64])
    out[:] = pypto.matmul(a, pypto.transpose(a, 0, 1))


def _softmax_reloads(x, out):
    pypto.set_vec_tile_shapes(32, 256)          # 4 column tiles per row: a row maximum reloaded
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)


softmax_reloads = pypto.jit(_softmax_reloads)

CASES = {
    "matmul": (matmul, (T([1000, 520], F16), T([520, 777], F16), T([1000, 777], F16))),
    "matmul_bias_gelu": (matmul_bias_gelu, (T([512, 384], F16), T([384, 640], F16), T([1, 640], F16),
                                            T([512, 640], F16))),
    "conv_relu": (conv_relu, (T([2, 10, 36, 16], F32), T([3, 3, 16, 32], F32), T([2, 8, 34, 32], F32))),
    "bmm": (bmm, (T([3, 256, 192], F16), T([3, 192, 320], F16), T([3, 256, 320], F16))),
    "same_a_twice": (same_a_twice, (T([128, 256], F32), T([256, 96], F32), T([256, 96], F32), T([128, 96], F32))),
    "gram": (gram, (T([128, 256], F32), T([128, 128], F32))),
    "softmax": (softmax, (T([1000, 1000], F32), T([1000, 1000], F32))),
    "softmax_reloads": (softmax_reloads, (T([64, 1024], F32), T([64, 1024], F32))),
}


def _tiled(name, options=None):
    kern, args = CASES[name]
    ck = kern.compile(*args, machine="teach" if name in ("conv_relu", "same_a_twice", "gram") else "a2a3",
                      options=options)
    ctx = PassContext(ck.machine, dict(options or {}))
    return PASSES["tiling"](ck.tensor_graph, ctx), ctx


def _summary(nodes, template) -> tuple:
    """What allocate learns of a group's keys from its nodes and its longest iteration."""
    k = _Keys(list(nodes), list(template))
    return k.size, k.space, k.persistent, k.chunks, k.asked, k.key_of


def _bare(g):
    """g's nodes in a graph of their own, without facts (as a pass of the user's would make it)."""
    out = g.replace(list(g.nodes))
    assert not out.facts()
    return out


@pytest.mark.parametrize("options", [None, {"l1_reuse": False}, {"double_buffer": False}],
                         ids=["default", "no_l1_reuse", "single_buffer"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_facts_of_tiling_are_what_the_walks_find(name, options):
    g, ctx = _tiled(name, options)
    assert "groups" in g.facts()
    bare = _bare(g)
    noted, walked = list(_groups(g)), list(_groups(bare))
    assert [info for info, _, _ in noted] == [info for info, _, _ in walked]
    for (_, nodes, template), (_, all_nodes, all_template) in zip(noted, walked):
        assert template == all_template
        # (a matmul group is a loop: its templates stand for its nodes, and say the same of them)
        assert _summary(nodes, template) == _summary(all_nodes, all_template)
    if g.facts().get("distinct_loads"):
        assert find_redundant_loads(bare) == {}
    spaced = assign_spaces(g, ctx)
    assert spaced.facts() == g.facts()                 # (it changes nothing but spaces)
    assert spaced.nodes == assign_spaces(bare, ctx).nodes
    for (_, nodes, template), (_, all_nodes, all_template) in zip(_groups(spaced), _groups(_bare(spaced))):
        assert _summary(nodes, template) == _summary(all_nodes, all_template)
    for step in ("eliminate_redundant_loads", "allocate"):
        fast, slow = PASSES[step](spaced, ctx), PASSES[step](_bare(spaced), ctx)
        assert fast.nodes == slow.nodes
        assert [n.attrs._dict for n in fast.nodes] == [n.attrs._dict for n in slow.nodes]
        spaced = fast


@pytest.mark.parametrize("name", ["matmul", "matmul_bias_gelu", "conv_relu", "bmm"])
def test_a_matmul_group_loads_no_window_twice(name):
    g, _ = _tiled(name)
    facts = g.facts()
    # (matmul_bias_gelu's epilogue is a vector group lowered as a loop, which says it of its
    # iterations: its templates load each window once)
    assert facts.get("distinct_loads", False)
    assert not find_redundant_loads(_bare(g))


@pytest.mark.parametrize("name", ["same_a_twice", "gram", "softmax_reloads"])
def test_no_such_fact_where_a_window_may_be_loaded_twice(name):
    g, ctx = _tiled(name)
    assert not g.facts().get("distinct_loads")
    if name != "gram":                      # (A and B panels of one buffer: none alike here)
        assert find_redundant_loads(g)
    spaced = assign_spaces(g, ctx)
    assert eliminate_redundant_loads(spaced, ctx).nodes == eliminate_redundant_loads(_bare(spaced), ctx).nodes


def test_a_graph_a_pass_rebuilds_has_no_facts():
    g, ctx = _tiled("matmul")
    assert not g.replace(list(g.nodes)).facts()
    assert not eliminate_redundant_loads(assign_spaces(_tiled("softmax_reloads")[0], ctx), ctx).facts()
    assert allocate(assign_spaces(g, ctx), ctx).facts() == {}


def _node(i, outer, inner):
    return TileNode(i, "TEXP", (), (8, 8), (8, 8), DT_FP32, "UB", 0, outer, inner, Attrs({"key": "e"}))


def test_the_longest_iteration_counts_every_run_of_it():
    # iteration (0, 0) has three nodes in two runs, (0, 1) two in one: (0, 0) is the longest
    nodes = [_node(0, 0, 0), _node(1, 0, 0), _node(2, 0, 1), _node(3, 0, 1), _node(4, 0, 0)]
    assert [n.id for n in _longest_iteration(nodes)] == [0, 1, 4]
    # a tie: the first iteration to appear
    nodes = [_node(0, 1, 0), _node(1, 0, 0), _node(2, 1, 0), _node(3, 0, 0)]
    assert [n.id for n in _longest_iteration(nodes)] == [0, 2]
    assert _longest_iteration([]) == []


def test_the_verifier_checks_the_facts_a_graph_carries():
    from pypto.errors import VerificationError
    from pypto.ir.tile import verify
    g, ctx = _tiled("matmul")
    verify(g)                                           # tiling's facts hold
    spans = dict(g.facts()["groups"])
    gid, (start, end, first, last) = next(iter(spans.items()))
    wrong = _bare(g).noted({"groups": {**spans, gid: (start, end - 1, first, last)}})
    with pytest.raises(VerificationError, match='"groups" fact puts group'):
        verify(wrong)
    wrong = _bare(g).noted({"groups": {**spans, gid: (start, end, first + 1, last)}})
    with pytest.raises(VerificationError, match="longest iteration"):
        verify(wrong)
    # softmax_reloads loads a row's maximum again in its iteration: no such fact may be claimed
    r, _ = _tiled("softmax_reloads")
    with pytest.raises(VerificationError, match='"distinct_loads" fact'):
        verify(_bare(r).noted({"distinct_loads": True}))


def test_a_debug_compile_verifies_the_facts_after_every_pass():
    # (the lowering's and assign_spaces' graphs carry facts: verified after each pass)
    for name in ("matmul", "bmm", "softmax_reloads"):
        kern, args = CASES[name]
        assert len(pypto.jit(kern.fn, debug=True).compile(*args).program) > 0
