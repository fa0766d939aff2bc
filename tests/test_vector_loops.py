"""A vector group at the Tile level is a loop too (a `NodeLoop`, as a matmul's): tiling lowers the
first outer iteration of each kind op by op and every iteration replays its `_Plan`s when a pass
reads them.  Held to the group lowered node by node (`tiling._vector_loop` returning None): the
same nodes at every level, the same Block level, the same program; and to the groups it must
leave node by node."""
from __future__ import annotations

import pytest

import pypto
from pypto.compiler import PASSES, tiling
from pypto.compiler.pipeline import PassContext
from pypto.ir.tile import LoopPart, LoopTileGraph, TileGraph, verify

from common import layernorm, matmul_bias_gelu, softmax

F16, F32 = pypto.DT_FP16, pypto.DT_FP32
T = pypto.Tensor

# (kernel, specs, constants): a layernorm (row blocks, weight rows a task keeps in UB), a softmax
# without a cut row (one load of each row block), a matmul's epilogue (tails in both dims)
CASES = {
    "layernorm": (layernorm, (T([96, 320], F32), T([320], F32), T([320], F32), T([96, 320], F32)), dict(TM=8, TN=320)),
    "softmax": (softmax, (T([100, 256], F32),) * 2, dict(TM=8, TN=256)),
    "epilogue": (matmul_bias_gelu, (T([300, 256], F16), T([256, 390], F16), T([390], F16), T([300, 390], F16)),
                 dict(VM=32, VN=64)),
}


def _levels(kern, specs, consts, plain: bool, monkeypatch):
    """The Tile graphs (tiling, assign_spaces, eliminate_redundant_loads, allocate) and the Block
    graphs (partition, l1_reuse, dependencies) of a kernel, its vector groups lowered as loops or
    (plain) node by node; and its compiled program."""
    if plain:
        monkeypatch.setattr(tiling, "_vector_loop", lambda *a: None)
    kern.cache_clear()
    ck = kern.compile(*specs, **consts)
    ctx = PassContext(ck.machine, {})
    tile = [PASSES["tiling"](ck.tensor_graph, ctx)]
    for name in ("assign_spaces", "eliminate_redundant_loads", "allocate"):
        tile.append(PASSES[name](tile[-1], ctx))
    block = [PASSES["partition"](tile[-1], ctx)]
    for name in ("l1_reuse", "dependencies"):
        block.append(PASSES[name](block[-1], ctx))
    kern.cache_clear()
    monkeypatch.undo()
    return tile, block, ck.program


def _vector_loops(g) -> list:
    return [p for p in getattr(g, "parts", ()) if isinstance(p, LoopPart)
            and g.groups[[i.id for i in g.groups].index(p[0].templates[0][0].group)].kind == "vector"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_vector_loop_is_its_group_node_by_node(case, monkeypatch):
    kern, specs, consts = CASES[case]
    tile, block, program = _levels(kern, specs, consts, False, monkeypatch)
    ptile, pblock, pprogram = _levels(kern, specs, consts, True, monkeypatch)
    assert _vector_loops(tile[0]) and not _vector_loops(ptile[0])
    # the Block level read the loop without making its nodes (what its tasks hold, l1_reuse's drops)
    assert "_nodes" not in block[-1].tiles.__dict__
    for g, p in zip(tile + [b.tiles for b in block], ptile + [b.tiles for b in pblock]):
        assert len(g) == len(p.nodes)
        assert g.nodes == p.nodes
        assert [x.attrs._dict for x in g.nodes] == [x.attrs._dict for x in p.nodes]
    for b, p in zip(block, pblock):
        assert b.tasks == p.tasks
    assert program.text() == pprogram.text()
    assert [t.instrs for t in program.tasks] == [t.instrs for t in pprogram.tasks]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_vector_loop_makes_any_iterations_and_their_gm_nodes_alone(case, monkeypatch):
    kern, specs, consts = CASES[case]
    tile, _, _ = _levels(kern, specs, consts, False, monkeypatch)
    g = tile[-1]                                    # (spaces and buffers decided)
    for part in _vector_loops(g):
        loop = part[0]
        n_outer = loop.count // loop.per
        whole = part.nodes()
        some = [n_outer - 1, 0, n_outer // 2]
        by_outer = {o: [x for x in whole if x.outer == o] for o in some}
        assert part.nodes(some) == [x for o in some for x in by_outer[o]]
        gm = [x for o in some for x in by_outer[o] if "gm" in x.attrs._dict]
        assert gm and part.nodes(some, gm_only=True) == gm
        # each kind's template is its first outer iteration, as lowered (no space, no buffer)
        kinds = {loop.kind(o): o for o in reversed(range(n_outer))}
        assert sorted(t[0].outer for t in loop.templates) == sorted(kinds.values())
    verify(g)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_debug_compile_checks_the_vector_loops_facts(case):
    """verify="each" (debug) checks every loop's outer iterations against its templates and the
    graph's facts against its nodes: it passes on the loops tiling makes."""
    kern, specs, consts = CASES[case]
    ck = pypto.jit(kern.fn, debug=True).compile(*specs, **consts)
    assert len(ck.program) > 0


def test_a_group_that_loads_a_window_twice_in_an_iteration_stays_node_by_node(monkeypatch):
    """A softmax whose rows are cut in tiles: the group that normalises them loads each row
    block's max and sum again at every inner step, which eliminate_redundant_loads drops: it
    reads those nodes, so the group is lowered node by node (its neighbours are loops)."""
    specs, consts = (T([256, 1024], F32),) * 2, dict(TM=64, TN=256)
    tile, block, program = _levels(softmax, specs, consts, False, monkeypatch)
    kinds = [isinstance(p, LoopPart) for p in tile[0].parts]
    assert kinds == [True, False, True]
    assert len(tile[2].nodes) < len(tile[1].nodes)          # (the repeated loads dropped)
    _, pblock, pprogram = _levels(softmax, specs, consts, True, monkeypatch)
    assert [b.tasks for b in block] == [b.tasks for b in pblock]
    assert [t.instrs for t in program.tasks] == [t.instrs for t in pprogram.tasks]


def test_l1_reuse_skips_a_loop_whose_windows_never_repeat(monkeypatch):
    """A vector loop whose loads all move with every outer dim loads no window twice: l1_reuse
    drops nothing there and makes none of its nodes; a layernorm's weight rows (the same window
    in every row block) keep the loop replayed."""
    from pypto.compiler import l1reuse
    kern, specs, consts = CASES["softmax"]
    tile, block, _ = _levels(kern, specs, consts, False, monkeypatch)
    loops = _vector_loops(tile[0])
    assert loops and all(p[0].windows_apart for p in loops)
    made = []
    real = LoopPart.nodes
    monkeypatch.setattr(LoopPart, "nodes", lambda self, *a, **k: made.append(a) or real(self, *a, **k))
    assert l1reuse.reused_loads(block[0]) == {} and not made
    kern, specs, consts = CASES["layernorm"]
    tile, _, _ = _levels(kern, specs, consts, False, monkeypatch)
    assert not any(p[0].windows_apart for p in _vector_loops(tile[0]))
