"""`select_instructions`' twins (`schedule._Twins`): a task whose tile ops are an earlier task's
but for their GM windows takes that task's instructions with its own windows, not selected op
by op.  Checked against the op-by-op selection (the twins turned off) on compiled kernels that
take the shortcut, and on hand-built tasks that are twins or differ from one in a single thing
select reads: any difference in the instructions fails.
"""
import pytest

import pypto
from pypto.compiler import schedule
from pypto.compiler.schedule import select_instructions
from pypto.ir.block import BlockGraph, Task
from pypto.ir.core import Attrs
from pypto.ir.exec import TileRef
from pypto.ir.gm import GMBuffer, GMRef
from pypto.ir.tile import GroupInfo, TileGraph, TileNode

from common import mm_128 as mm, mm_bias_gelu_128 as mm_bias_gelu, softmax_16x128 as softmax

T, F16, F32 = pypto.Tensor, pypto.DT_FP16, pypto.DT_FP32


def _selected(g, monkeypatch, twins: bool):
    """(the exec graph, how many tasks were twins) of `select_instructions` on `g` (twins told
    by comparing columns, `_Twins`, or from a Tile-level loop, `_LoopTwins`)."""
    found = []

    def counted(stream):
        def count(self, *args):
            got = stream(self, *args)
            found.append(got[0] is not None)
            return got
        return count

    with monkeypatch.context() as m:
        m.setattr(schedule._Twins, "stream", counted(schedule._Twins.stream))
        m.setattr(schedule._LoopTwins, "stream", counted(schedule._LoopTwins.stream))
        if not twins:
            m.setattr(schedule._Twins, "MIN_OPS", 1 << 60)
        return select_instructions(g), sum(found)


def _same(fast, plain):
    assert fast.text() == plain.text()
    one = {}
    for ta, tb in zip(fast.tasks, plain.tasks, strict=True):
        assert ta.instrs == tb.instrs
        for ins in ta.instrs:           # equal on-chip operands are one object, as selected
            for r in (ins.dst, *ins.srcs):
                if isinstance(r, TileRef):
                    assert one.setdefault(r, r) is r


CASES = [
    (mm, (T([2048, 1024], F16), T([1024, 2048], F16), T([2048, 2048], F16))),
    (mm_bias_gelu, (T([1024, 512], F16), T([512, 1536], F16), T([1, 1536], F16), T([1024, 1536], F16))),
    (softmax, (T([1000, 700], F32), T([1000, 700], F32))),
]


@pytest.mark.parametrize("kernel,specs", CASES, ids=lambda c: getattr(c, "name", ""))
def test_twins_select_what_op_by_op_selection_does(kernel, specs, monkeypatch):
    g = dict(kernel.compile(*specs, snapshots=True).snapshots)["wavefronts"]
    fast, n = _selected(g, monkeypatch, twins=True)
    plain, none = _selected(g, monkeypatch, twins=False)
    assert n > 0 and none == 0          # the kernel takes the shortcut
    _same(fast, plain)


LOOP_CASES = [
    # tails in M and N, L1 reuse: tasks of several kinds of tile, phases and dropped loads
    (mm, (T([1000, 520], F16), T([520, 1400], F16), T([1000, 1400], F16)), None),
    (mm, (T([2048, 1024], F16), T([1024, 2048], F16), T([2048, 2048], F16)), {"double_buffer": False}),
    (mm, (T([2048, 1024], F16), T([1024, 2048], F16), T([2048, 2048], F16)), {"l1_reuse": False}),
    (mm_bias_gelu, (T([1024, 512], F16), T([512, 1536], F16), T([1, 1536], F16), T([1024, 1536], F16)), None),
]


@pytest.mark.parametrize("kernel,specs,options", LOOP_CASES, ids=["tails", "single_buffer", "no_l1_reuse", "mixed"])
def test_twins_of_a_loop_select_what_op_by_op_selection_does(kernel, specs, options, monkeypatch):
    from pypto.ir.tile import LoopTileGraph
    g = dict(kernel.compile(*specs, snapshots=True, options=options).snapshots)["wavefronts"]
    assert isinstance(g.tiles, LoopTileGraph) and "_nodes" not in g.tiles.__dict__
    loop_twins = []
    add = schedule._LoopTwins.stream
    monkeypatch.setattr(schedule._LoopTwins, "stream",
                        lambda self, t, part: loop_twins.append(add(self, t, part)) or loop_twins[-1])
    fast = select_instructions(g)
    monkeypatch.undo()
    assert any(got[0] is not None for got in loop_twins)      # the loop's twins were taken
    assert "_nodes" not in g.tiles.__dict__                   # and the loop's nodes were not all made
    plain, none = _selected(g, monkeypatch, twins=False)
    assert none == 0
    _same(fast, plain)


@pypto.jit
def _softmax_rows(x, out):
    pypto.set_vec_tile_shapes(8, 512)
    out[:] = pypto.softmax(x)


TILE_CASES = LOOP_CASES + [
    # five vector loops of alike tiles (the same kinds, slot copies and id patterns): a tile is
    # alike only one of its own loop
    (_softmax_rows, (T([8192, 512], F32), T([8192, 512], F32)), {"fusion": False}),
]


@pytest.mark.parametrize("kernel,specs,options", TILE_CASES,
                         ids=["tails", "single_buffer", "no_l1_reuse", "mixed", "unfused_softmax"])
def test_tiles_of_a_loop_task_select_what_op_by_op_selection_does(kernel, specs, options, monkeypatch):
    """A loop's task with no twin yet is selected output tile by output tile, a tile alike one
    selected before copying its instructions (`_TileTwins`): fewer tiles selected op by op than
    the tasks hold, and the instructions of op-by-op selection."""
    g = dict(kernel.compile(*specs, snapshots=True, options=options).snapshots)["wavefronts"]
    tiles, by_op = [], []
    split, ids = schedule._TileTwins._tiles, schedule._Ids.__init__
    monkeypatch.setattr(schedule._TileTwins, "_tiles",
                        staticmethod(lambda *a: tiles.append(split(*a)) or tiles[-1]))
    monkeypatch.setattr(schedule._Ids, "__init__", lambda self, nodes: by_op.append(1) or ids(self, nodes))
    fast = select_instructions(g)
    monkeypatch.undo()
    held = sum(len(x) for x in tiles if x is not None)
    assert held and len(by_op) < held
    plain, none = _selected(g, monkeypatch, twins=False)
    assert none == 0
    _same(fast, plain)


# hand-built: per task, `N` iterations of load -> exp -> store of one row block of x

N = 30
X = GMBuffer("x", (2 * N * 16, 128), F32, "inout")
WHOLE = GMRef.whole(X)
EXP_MAP = Attrs({"buf": 8192})          # (one object, as the tile level shares equal maps)


def _task_ops(first: int, row: int, change: dict | None = None) -> list[TileNode]:
    """The ops of a task from node id `first`, on row blocks from `row`; `change`: at iteration
    -> what that iteration does differently ("map": another exp map, "buf": a load map with
    another slot, "shape": another valid shape, "input": the store reads the load, "atomic": a
    store map holding True where the others hold 1 (equal, printed otherwise), "outside": the
    exp reads the exp two ids before the task (another task's tile), "far": the load and the
    store on the next row block: a twin still, but not one moved by one offset)."""
    change = change or {}
    ops = []
    for it in range(N):
        i = first + 3 * it
        how = change.get(it)
        w = WHOLE.window((((row + it + (how == "far")) % (2 * N)) * 16, 0), (16, 128))
        load = Attrs({"gm": w, "buf": 4096 if how == "buf" else 0})
        valid = (8, 128) if how == "shape" else (16, 128)
        ops.append(TileNode(i, "TLOAD", (), (16, 128), (16, 128), F32, "UB", 0, it, 0, load))
        ops.append(TileNode(i + 1, "TEXP", (first - 2,) if how == "outside" else (i,), (16, 128), valid, F32, "UB",
                            0, it, 0, Attrs({"buf": 8192}) if how == "map" else EXP_MAP))
        ops.append(TileNode(i + 2, "TSTORE", (i if how == "input" else i + 1,), (16, 128), (16, 128), F32, "", 0, it, 0,
                            Attrs({"gm": w, "atomic": True if how == "atomic" else 1})))
    return ops


def _graph(*changes) -> BlockGraph:
    """A task per change (None: none), each on the next `N` row blocks."""
    nodes, tasks = [], []
    for k, change in enumerate(changes):
        nodes += _task_ops(3 * N * k, N * k, change)
        tasks.append(Task(k, 0, "AIV", tuple(range(N * k, N * (k + 1))), tuple(range(3 * N * k, 3 * N * (k + 1)))))
    group = GroupInfo(0, "vector", X.shape, (16, 128), N * len(changes), 1)
    return BlockGraph("k", TileGraph("k", (X,), (group,), tuple(nodes)), tuple(tasks))


@pytest.mark.parametrize("changes,twins", [
    ((None, None), 1),
    ((None, {7: "map"}), 0),        # an equal map, not the same object
    ((None, {7: "buf"}), 0),        # a load to another slot
    ((None, {7: "shape"}), 0),      # another valid shape
    ((None, {7: "input"}), 0),      # an input at another position
    ((None, {7: "atomic"}), 0),     # a moved map whose other items are equal, not alike
    # the last two read the last exp of the task before them, the first of those exps of
    # another valid shape: alike but for what they read outside themselves
    (({N - 1: "shape"}, {0: "outside"}, {0: "outside"}), 0),
])
def test_hand_built_twins_and_near_twins(changes, twins, monkeypatch):
    g = _graph(*changes)
    fast, n = _selected(g, monkeypatch, twins=True)
    plain, _ = _selected(g, monkeypatch, twins=False)
    assert n == twins
    _same(fast, plain)


def test_twins_moved_by_one_offset_per_buffer_share_a_stream_shape():
    # the side table select hands on: a twin whose windows all move by one offset per buffer
    # has its representative's shape (the scheduler takes its key, insert_sync its flags)
    from pypto.compiler.listsched import _shape_key
    from pypto.ir.exec import stream_shape
    g = dict(mm.compile(*CASES[0][1], snapshots=True).snapshots)["wavefronts"]
    out = select_instructions(g)
    shapes = [stream_shape(out, t.instrs) for t in out.tasks]
    assert None not in shapes and len(set(shapes)) < len(shapes)
    for shape in set(shapes):
        keys = {_shape_key(t.instrs) for t, s in zip(out.tasks, shapes) if s == shape}
        assert len(keys) == 1
    uniform = select_instructions(_graph(None, None))
    assert stream_shape(uniform, uniform.tasks[1].instrs) == stream_shape(uniform, uniform.tasks[0].instrs) is not None
    # a twin whose one iteration works on another row block: selected as a twin, no shape
    moved = _graph(None, {7: "far"})
    fast, n = _selected(moved, pytest.MonkeyPatch(), twins=True)
    assert n == 1
    assert stream_shape(fast, fast.tasks[1].instrs) is None


@pypto.jit
def _plus_row_index(x, out):
    m, _ = x.shape
    pypto.set_vec_tile_shapes(2, 64)
    out[:] = x + pypto.arange(m, dtype=pypto.DT_FP32).reshape(m, 1)


def test_a_loop_whose_iotas_start_where_their_tile_does_is_not_copied(monkeypatch):
    """A vector loop with an iota (TCI's first value is the row its tile starts at) moves more than
    GM windows from iteration to iteration (`NodeLoop.windows_only` False): neither its tasks nor its
    tiles are copied from one another (they were: every task and tile ran its representative's
    first rows, 245760 off).  The program is that of op-by-op selection and the values numpy's."""
    import numpy as np
    x = np.random.default_rng(0).random((8192, 64), dtype=np.float32)
    ck = _plus_row_index.compile(x, np.zeros_like(x), machine="teach", snapshots=True)
    g = dict(ck.snapshots)["wavefronts"]
    iotas = [p for p in g.tiles.parts if hasattr(p, "count") and not p[0].windows_only]
    assert iotas and max(len(t.nodes) for t in g.tasks if t.group == iotas[0][0].templates[0][0].group) \
        >= schedule._Twins.MIN_OPS                  # (tasks long enough to be copied otherwise)
    plain, _ = _selected(g, monkeypatch, twins=False)
    _same(select_instructions(g), plain)
    res = ck.simulate(x, np.zeros_like(x))
    assert np.array_equal(res.outputs["out"], x + np.arange(8192, dtype=np.float32)[:, None])
