"""The optimisation passes `prune_dependencies` (Block level) and `eliminate_redundant_loads`
(Tile level), and `CompiledKernel.diff` (what a pass changed)."""
import collections
import re

import numpy as np
import pytest

import pypto
from pypto.compiler import Pipeline, default_passes
from pypto.frontend.kernel import ADDED_COLOR, PassDiff
from pypto.compiler.memory import TILE_PASSES
from pypto.compiler.partition import BLOCK_PASSES, prune_dependencies
from pypto.compiler.pipeline import PassContext
from pypto.compiler.reuse import eliminate_redundant_loads, find_redundant_loads
from pypto.dtypes import DT_FP32
from pypto.ir import tile as tile_ir
from pypto.ir.block import BlockGraph, Task
from pypto.ir.core import Attrs
from pypto.ir.gm import GMBuffer, GMRef
from pypto.ir.tile import GroupInfo, TileGraph, TileNode
from pypto.target.machine import get_machine


def _softmax(x, out, *, TM: int = 32, TN: int = 256):
    pypto.set_vec_tile_shapes(TM, TN)
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)


def _chain(x, out, *, TM: int = 32, TN: int = 256):
    """Three groups: m (group 0) <- s (group 1, reads m) <- out (group 2, reads m and s), so a
    group-2 task depends on a group-0 task directly and through a group-1 task."""
    pypto.set_vec_tile_shapes(TM, TN)
    m = pypto.amax(x, dim=-1, keepdim=True)
    s = pypto.sum(pypto.exp(x - m), dim=-1, keepdim=True)
    out[:] = x / m + s


def _without(*names):
    return Pipeline([p for p in default_passes() if p.name not in names])


softmax = pypto.jit(_softmax)
softmax_all_loads = pypto.jit(_softmax, pipeline=_without("eliminate_redundant_loads"))
chain = pypto.jit(_chain)
chain_unpruned = pypto.jit(_chain, pipeline=_without("prune_dependencies"))


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(7).random((256, 1024)).astype(np.float32)


def _ok(res):
    return all(v["ok"] for v in res.check.values())


def _edges(bg):
    return {(d, t.id) for t in bg.tasks for d in t.deps}


def _closure(bg):
    anc = {}
    for t in bg.tasks:
        anc[t.id] = set(t.deps).union(*(anc[d] for d in t.deps))
    return anc


# --- prune_dependencies -------------------------------------------------------------------------
def test_prune_dependencies_sits_between_dependencies_and_wavefronts(x):
    names = [p.name for p in BLOCK_PASSES]
    assert names.index("dependencies") < names.index("prune_dependencies") < names.index("wavefronts")
    log = [r.name for r in chain.compile(x, np.zeros_like(x)).pass_log]
    assert log.index("dependencies") < log.index("prune_dependencies") < log.index("wavefronts")


def test_prune_dependencies_on_a_hand_made_task_graph():
    deps = {0: (), 1: (0,), 2: (0,), 3: (0, 1, 2), 4: (0, 3), 5: (1, 2)}
    g = BlockGraph("t", None, tuple(Task(i, 0, "AIV", (i,), (), d) for i, d in deps.items()))
    out = prune_dependencies(g)
    assert [t.deps for t in out.tasks] == [(), (0,), (0,), (1, 2), (3,), (1, 2)]
    assert _closure(out) == _closure(g)
    assert out.tasks[0] is g.tasks[0] and out.tasks[5] is g.tasks[5]     # unchanged tasks are kept
    assert prune_dependencies(out).tasks == out.tasks                     # idempotent


@pytest.mark.parametrize("machine", ["a2a3", "teach"])
def test_prune_dependencies_drops_the_implied_edges_only(x, machine):
    out = np.zeros_like(x)
    before = chain_unpruned.compile(x, out, machine=machine).block_graph
    ck = chain.compile(x, out, machine=machine)
    after = ck.block_graph
    group = {t.id: t.group for t in after.tasks}
    dropped = _edges(before) - _edges(after)
    assert not _edges(after) - _edges(before)                 # nothing added
    # every group-2 task lost its edge to group 0: it waits for group 1, which waits for group 0
    n2 = sum(group[t] == 2 for t in group)
    assert len(dropped) == n2 > 0
    assert {(group[a], group[c]) for a, c in dropped} == {(0, 2)}
    assert all(group[d] == 1 for t in after.tasks if t.group == 2 for d in t.deps)
    assert len(_edges(after)) == len(_edges(before)) - n2
    # no ordering is lost, wavefronts stay as they were
    assert _closure(after) == _closure(before)
    assert [t.level for t in after.tasks] == [t.level for t in before.tasks]
    rec = {r.name: r for r in ck.pass_log}["prune_dependencies"]
    assert rec.level == "block" and rec.nodes_before == rec.nodes_after == len(after.tasks)


@pytest.mark.parametrize("machine", ["a2a3", "teach"])
def test_prune_dependencies_keeps_cycles_and_outputs(x, machine):
    out = np.zeros_like(x)
    r0 = chain_unpruned.compile(x, out, machine=machine).simulate(x, out)
    r1 = chain.compile(x, out, machine=machine).simulate(x, out)
    assert _ok(r0) and _ok(r1)
    assert r1.cycles <= r0.cycles
    np.testing.assert_array_equal(r1.outputs["out"], r0.outputs["out"])


def test_prune_dependencies_leaves_softmax_alone(x):
    """Softmax's groups form a chain without shortcuts: nothing to prune."""
    ck = softmax.compile(x, np.zeros_like(x), snapshots=True)
    d = ck.diff("prune_dependencies")
    assert d.text == "" and d.added == d.removed == ()


# --- eliminate_redundant_loads ------------------------------------------------------------------
def _loads(g, group=None, buf=None):
    return [n for n in g.nodes if n.op == "TLOAD" and (group is None or n.group == group)
            and (buf is None or n.attrs["gm"].buf.name == buf)]


def test_eliminate_redundant_loads_runs_before_allocate():
    names = [p.name for p in TILE_PASSES]
    assert names.index("assign_spaces") < names.index("eliminate_redundant_loads") < names.index("allocate")


def test_softmax_loads_the_row_max_once_per_row_block(x):
    out = np.zeros_like(x)
    g0 = softmax_all_loads.compile(x, out).tile_graph
    ck = softmax.compile(x, out)
    g1 = ck.tile_graph
    n_outer = g1.groups[1].n_outer
    assert g1.groups[1].n_inner == 4 and n_outer == 8         # TN=256 < N=1024: 4 column tiles per row
    # group 1 reloaded the row max ws0[r:r+32, 0:1] for every column tile; now once per row block
    assert len(_loads(g0, 1, "ws0")) == 4 * n_outer
    kept = _loads(g1, 1, "ws0")
    assert len(kept) == n_outer
    assert [n.outer for n in kept] == list(range(n_outer)) and all(n.inner == 0 for n in kept)
    assert len(_loads(g1)) == len(_loads(g0)) - 3 * n_outer
    assert len(g1) == len(g0) - 3 * n_outer
    for grp in (0, 2):                                          # nothing to reuse there
        assert len(_loads(g1, grp)) == len(_loads(g0, grp))
    # the column tiles of a row block all read the kept tile
    users = collections.Counter(i for n in g1.nodes for i in n.inputs)
    assert all(users[n.id] == 4 for n in kept)
    # it lives across the inner loop: persistent, buffered by outer iteration
    assert all(n.attrs["persistent"] and n.par == n.outer for n in kept)
    # ... in a fixed slot of its own (two copies: the next row block's load runs ahead)
    assert len({n.attrs["buf"] for n in kept}) == kept[0].attrs["nbuf"] == 2
    slots = {(n.attrs["buf"], n.attrs["buf"] + tile_ir.tile_bytes(n.shape, n.dtype)) for n in kept}
    for n in g1.nodes:
        if n.group == 1 and n.space == "UB" and n.key != kept[0].key:
            lo, hi = n.attrs["buf"], n.attrs["buf"] + tile_ir.tile_bytes(n.shape, n.dtype)
            assert not any(lo < b and a < hi for a, b in slots), n
    # ids stay unique, inputs refer to earlier nodes (the tile verifier agrees)
    assert len({n.id for n in g1.nodes}) == len(g1.nodes)
    tile_ir.verify(g1, ck.machine.capacities())


@pytest.mark.parametrize("machine", ["a2a3", "teach"])
def test_eliminate_redundant_loads_keeps_outputs_and_saves_cycles(x, machine):
    out = np.zeros_like(x)
    r0 = softmax_all_loads.compile(x, out, machine=machine).simulate(x, out)
    ck = softmax.compile(x, out, machine=machine)
    r1 = ck.simulate(x, out)
    assert _ok(r0) and _ok(r1)
    assert r1.cycles <= r0.cycles
    assert r1.stats["bytes_by_path"]["GM->UB"] < r0.stats["bytes_by_path"]["GM->UB"]
    assert sum(i.op == "TLOAD" for t in ck.program.tasks for i in t.instrs) < \
        sum(i.op == "TLOAD" for t in softmax_all_loads.compile(x, out, machine=machine).program.tasks
            for i in t.instrs)


def test_eliminate_redundant_loads_passes_the_checked_simulation(x):
    out = np.zeros_like(x)
    ck = softmax.compile(x, out, machine="teach")
    res = pypto.sim.simulate(ck.program, x, out, machine="teach", check=True)   # raises on a race
    ref = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(res.outputs["out"], ref / ref.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert _ok(ck.simulate(x, out, checked=True))


def test_nothing_to_eliminate_when_a_row_is_one_tile(x):
    out = np.zeros_like(x)
    g0 = softmax_all_loads.compile(x, out, TM=8, TN=1024).tile_graph
    g1 = softmax.compile(x, out, TM=8, TN=1024).tile_graph
    assert [(n.id, n.op) for n in g1.nodes] == [(n.id, n.op) for n in g0.nodes]
    assert find_redundant_loads(g1) == {}


# hand-made tile graphs: one vector group, one outer iteration, inner iterations 0..k
_BUF = GMBuffer("x", (8, 256), DT_FP32, "inout")
_W = GMRef.whole(_BUF).window((0, 0), (8, 64))
_W2 = GMRef.whole(_BUF).window((0, 64), (8, 64))


def _node(i, op, inner, inputs=(), key="a", gm=None, space="UB"):
    attrs = {"key": key}
    if gm is not None:
        attrs["gm"] = gm
    shape = () if op == "TSTORE" else (8, 64)
    return TileNode(i, op, tuple(inputs), shape, shape, DT_FP32, "" if op == "TSTORE" else space, 0, 0, inner,
                    Attrs(attrs), par=inner)


def _graph(nodes, n_inner):
    return TileGraph("t", (_BUF,), (GroupInfo(0, "vector", (8, 256), (8, 64), 1, n_inner),), tuple(nodes))


def test_a_reload_across_inner_iterations_reuses_the_first_tile():
    g = _graph([_node(0, "TLOAD", 0, gm=_W), _node(1, "TEXP", 0, [0], key="e"),
                _node(2, "TLOAD", 1, gm=_W), _node(3, "TEXP", 1, [2], key="e")], 2)
    out = eliminate_redundant_loads(g, PassContext(get_machine("a2a3")))
    assert [n.id for n in out.nodes] == [0, 1, 3]
    assert out.by_id()[3].inputs == (0,)
    assert out.by_id()[0].attrs["persistent"] is True and out.by_id()[0].par == 0
    tile_ir.verify(out)


def test_a_store_between_two_loads_of_its_window_keeps_the_reload():
    g = _graph([_node(0, "TLOAD", 0, gm=_W), _node(1, "TEXP", 0, [0], key="e"),
                _node(2, "TSTORE", 0, [1], key="s", gm=_W),
                _node(3, "TLOAD", 1, gm=_W), _node(4, "TEXP", 1, [3], key="e")], 2)
    assert find_redundant_loads(g) == {}
    assert eliminate_redundant_loads(g, None) is g
    # a store elsewhere does not matter
    g2 = g.replace([n.replace(attrs=n.attrs.replace(gm=_W2)) if n.op == "TSTORE" else n for n in g.nodes])
    assert find_redundant_loads(g2) == {3: 0}


def test_a_key_holding_two_tiles_is_not_made_persistent():
    """Key 'a' loads W, W2, W: keeping the first W across the loop would need two slots for 'a'."""
    g = _graph([_node(0, "TLOAD", 0, gm=_W), _node(1, "TEXP", 0, [0], key="e"),
                _node(2, "TLOAD", 1, gm=_W2), _node(3, "TEXP", 1, [2], key="e"),
                _node(4, "TLOAD", 2, gm=_W), _node(5, "TEXP", 2, [4], key="e")], 3)
    assert find_redundant_loads(g) == {4: 0}
    out = eliminate_redundant_loads(g, None)
    assert [n.id for n in out.nodes] == [0, 1, 2, 3, 4, 5]
    assert not any(n.attrs.get("persistent") for n in out.nodes)


def test_a_reload_in_the_same_iteration_needs_no_persistence():
    g = _graph([_node(0, "TLOAD", 0, gm=_W), _node(1, "TLOAD", 0, key="b", gm=_W),
                _node(2, "TADD", 0, [0, 1], key="e")], 1)
    out = eliminate_redundant_loads(g, None)
    assert [n.id for n in out.nodes] == [0, 2] and out.by_id()[2].inputs == (0, 0)
    assert "persistent" not in out.by_id()[0].attrs


# --- CompiledKernel.diff ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ck(x):
    return softmax.compile(x, np.zeros_like(x), snapshots=True)


def test_diff_of_eliminate_redundant_loads(ck):
    d = ck.diff("eliminate_redundant_loads")
    assert isinstance(d, PassDiff) and d.level == "tile" and not d.is_lowering
    assert str(d) == d.text and d.text.startswith("--- before eliminate_redundant_loads\n+++ after")
    minus = [ln for ln in d.text.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    assert sum("TLOAD() GM ws0[0:32,0:1]" in ln for ln in minus) == 3     # outer iteration 0 is printed
    assert not any(ln.startswith("+") and "TLOAD" in ln for ln in d.text.splitlines())
    # every node: 24 loads gone, their 24 users rewired (one removed and one added line each)
    n_outer = ck.tile_graph.groups[1].n_outer
    gone = [s for s in d.removed if "TLOAD()" in s]
    assert len(gone) == 3 * n_outer and all("GM ws0[" in s and s.startswith("group 1 [") for s in gone)
    assert len(d.added) == 3 * n_outer and len(d.removed) == 6 * n_outer
    assert all(re.search(r"TROWEXPANDSUB\(TLOAD\[(\d+)\.\d\], TLOAD\[\1\.0\]\)", s) for s in d.added)
    assert "group 1 [0.1] TROWEXPANDSUB(TLOAD[0.1], TLOAD[0.1])" in " ".join(d.removed)
    assert "eliminate_redundant_loads (tile): 24 added, 48 removed" in repr(d)


def test_diff_html_and_graph(ck):
    d = ck.diff("eliminate_redundant_loads")
    page = d._repr_html_()
    assert "<b>eliminate_redundant_loads</b>" in page
    assert "background:#e6ffec" in page and "background:#ffebe9" in page   # added green, removed red
    assert "48 removed nodes" in page
    dg = d.graph()
    src = dg.source
    assert src.count(f'fillcolor="{ADDED_COLOR}"') == 3     # the rewired users of outer iteration 0
    assert "48 removed" in src and "TLOAD() GM ws0[0:32,0:1]" in src


def test_diff_of_a_block_pass_and_its_graph(x):
    ck = chain.compile(x, np.zeros_like(x), snapshots=True)
    d = ck.diff("prune_dependencies")
    n2 = sum(t.group == 2 for t in ck.block_graph.tasks)
    assert len(d.added) == len(d.removed) == n2
    assert all(re.search(r"deps \[\d+, \d+\]", s) for s in d.removed)
    assert all(re.search(r"deps \[\d+\]", s) for s in d.added)
    src = d.graph().source
    assert ADDED_COLOR in src


def test_diff_of_a_tensor_pass_ignores_renumbering(x):
    @pypto.jit(debug=True)
    def k(x, out):
        unused = pypto.exp(x) * 3.0   # noqa: F841
        out[:] = x + 1.0

    ck = k.compile(x, np.zeros_like(x))                     # debug=True keeps snapshots
    d = ck.diff("dce")
    assert d.added == ()
    assert [s.split(" :")[0] for s in d.removed] == ["exp(x)", "const() value=3.0", "mul(exp, 3.0)"]
    assert "-  %2 = exp(%0)" in d.text
    assert ADDED_COLOR not in d.graph().source


def test_diff_of_a_lowering_gives_both_texts(ck):
    d = ck.diff("tiling")
    assert d.is_lowering and d.added == d.removed == ()
    assert "lowering" in d.text and "tensor_graph _softmax(" in d.text and "tile_graph _softmax {" in d.text
    assert d.before_text in d.text and d.after_text in d.text
    assert "before: tensor" in d._repr_html_()
    assert d.graph().source.count(ADDED_COLOR) == 0


def test_diff_by_index_and_errors(ck, x):
    names = [r.name for r in ck.pass_log]
    k = names.index("allocate")
    assert ck.diff(k).text == ck.diff("allocate").text
    with pytest.raises(pypto.PyptoError) as e:
        ck.diff("no_such_pass")
    assert "no_such_pass" in str(e.value) and all(n in str(e.value) for n in names)
    with pytest.raises(pypto.PyptoError, match="no pass #99"):
        ck.diff(99)
    plain = softmax.compile(x, np.zeros_like(x))
    assert plain.snapshots is None
    with pytest.raises(pypto.PyptoError) as e:
        plain.diff("allocate")
    assert "snapshots=True" in str(e.value) and "debug=True" in str(e.value)


class _Machine:
    def __init__(self, ub):
        self.ub = ub

    def capacities(self):
        return {"UB": self.ub}


def test_no_elimination_that_would_cost_double_buffering():
    """The kept tile's fixed slot can no longer be shared with a later tile: when that would make
    the group's tiles fit UB only once, the reloads stay (fewer loads, but a serialised loop)."""
    nodes = []
    for k in range(2):
        b = 3 * k
        nodes += [_node(b, "TLOAD", k, gm=_W), _node(b + 1, "TEXP", k, [b], key="e"),
                  _node(b + 2, "TEXP", k, [b + 1], key="f")]
    g = _graph(nodes, 2)
    tile = tile_ir.tile_bytes((8, 64), DT_FP32)
    assert find_redundant_loads(g) == {3: 0}
    # before: slots {a, f} and {e}; after: a is pinned, so {a}, {e}, {f}
    roomy = eliminate_redundant_loads(g, PassContext(_Machine(2 * 3 * tile)))
    assert [n.id for n in roomy.nodes] == [0, 1, 2, 4, 5]
    tight = eliminate_redundant_loads(g, PassContext(_Machine(2 * 2 * tile)))
    assert [n.id for n in tight.nodes] == [0, 1, 2, 3, 4, 5]
    assert not any(n.attrs.get("persistent") for n in tight.nodes)
    # without double buffering there is nothing to lose
    single = eliminate_redundant_loads(g, PassContext(_Machine(3 * tile), {"double_buffer": False}))
    assert [n.id for n in single.nodes] == [0, 1, 2, 4, 5]
