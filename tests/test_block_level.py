"""Block-level kernels (`@pypto.jit(level="block")`, `pypto.block`): tasks written by hand, entering
the pipeline at the Block Graph.  Results against numpy, the tasks and core types as written,
dependencies from GM and stated ones respected in the simulated schedule, a cube task with its
paired vector epilogue, and located errors."""
from __future__ import annotations

import os

import numpy as np
import pytest

import pypto
from pypto.ir.block import verify as verify_block
from pypto.ir.program import Program
from common import marker_line

T = pypto.tile
B = pypto.block
THIS = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    return marker_line(THIS, f"# <B:{marker}>")


# ---------------------------------------------------------------------------------------
# kernels

@pypto.jit(level="block")
def row_max_then_shift(x, rmax, out, *, TM: int = 16):
    """Task A (one per row block) stores the row maxima to GM; task B loads them back."""
    for i in range(0, x.shape[0], TM):
        with B.task("AIV"):
            T.tstore(rmax[i:i + TM, :], T.trowmax(T.tload(x[i:i + TM, :])))
    for i in range(0, x.shape[0], TM):
        with B.task("AIV"):
            t = T.tload(x[i:i + TM, :])
            T.tstore(out[i:i + TM, :], T.texp(T.trowexpandsub(t, T.tload(rmax[i:i + TM, :]))))


@pypto.jit(level="block")
def stated(x, y, out1, out2):
    """Two tasks sharing no data; the second is stated to run after the first, and the third
    (traced first) after the fourth: the order puts the fourth first."""
    with B.task("AIV") as a:
        T.tstore(out1[0:16, :], T.texp(T.tload(x[0:16, :])))
    with B.task("AIV") as b:
        T.tstore(out2[0:16, :], T.tabs(T.tload(y[0:16, :])))
    b.after(a)
    with B.task("AIV") as c:
        T.tstore(out1[16:32, :], T.tneg(T.tload(x[16:32, :])))
    with B.task("AIV") as d:
        T.tstore(out2[16:32, :], T.trelu(T.tload(y[16:32, :])))
    c.after(d)


@pypto.jit(level="block")
def matmul_relu(a, b, c, out, *, TM: int = 32):
    """Per row block: a cube task stores A @ B into GM scratch c, two paired vector tasks (one
    half of the rows each) apply relu."""
    for i in range(0, a.shape[0], TM):
        with B.task("AIC") as cube:
            a0 = T.textract(T.tload(a[i:i + TM, :], space="L1"), "L0A")
            b0 = T.textract(T.tload(b[:, :], space="L1"), "L0B")
            T.tstore(c[i:i + TM, :], T.tmatmul(a0, b0))
        halves = []
        for h in range(2):
            r = i + h * TM // 2
            with B.task("AIV") as v:
                T.tstore(out[r:r + TM // 2, :], T.trelu(T.tload(c[r:r + TM // 2, :])))
            halves.append(v)
        B.pair(cube, *halves)


def ends_before_starts(ck, res):
    """Every dependency of the program: the task it names ended before the dependent started."""
    times = res.task_times
    for t in ck.program.tasks:
        for d in t.deps:
            assert times[d][2] <= times[t.id][1], (d, t.id, times)


# ---------------------------------------------------------------------------------------
# results

@pytest.mark.parametrize("machine", ["a2a3", "teach"])
def test_two_tasks_through_gm(machine, rng):
    x = rng.standard_normal((40, 64)).astype(np.float32)          # 40 rows: a tail of 8
    rmax, out = np.zeros((40, 1), np.float32), np.zeros_like(x)
    ck = row_max_then_shift.compile(x, rmax, out, machine=machine)
    res = ck.simulate(x, rmax, out)
    assert res.ok, res.check
    np.testing.assert_allclose(res.outputs["out"], np.exp(x - x.max(1, keepdims=True)), rtol=1e-6)
    np.testing.assert_array_equal(res.outputs["rmax"], x.max(1, keepdims=True))
    tasks = ck.block_graph.tasks
    assert [(t.core_type, t.group) for t in tasks] == [("AIV", 0)] * 3 + [("AIV", 1)] * 3
    assert [t.deps for t in tasks] == [(), (), (), (0,), (1,), (2,)]      # B of rows i after A of rows i
    assert [(t.id, t.core_type) for t in ck.program.tasks] == [(t.id, t.core_type) for t in tasks]
    verify_block(ck.block_graph)
    timed = ck.simulate(x, rmax, out, mode="timing")
    ends_before_starts(ck, timed)
    for a in range(3):
        assert timed.task_times[a][2] <= timed.task_times[a + 3][1]


def test_stated_dependencies_and_order(rng):
    x, y = (rng.standard_normal((32, 64)).astype(np.float32) for _ in range(2))
    o1, o2 = np.zeros_like(x), np.zeros_like(y)
    ck = stated.compile(x, y, o1, o2)
    res = ck.simulate(x, y, o1, o2)
    assert res.ok, res.check
    np.testing.assert_allclose(res.outputs["out1"], np.concatenate([np.exp(x[:16]), -x[16:]]), rtol=1e-6)
    np.testing.assert_allclose(res.outputs["out2"], np.concatenate([np.abs(y[:16]), np.maximum(y[16:], 0)]))
    ops = [[ck.tile_graph.by_id()[i].op for i in t.nodes][1] for t in ck.block_graph.tasks]
    assert ops == ["TEXP", "TABS", "TRELU", "TNEG"]               # d (traced fourth) before c
    assert [t.deps for t in ck.block_graph.tasks] == [(), (0,), (), (2,)]
    ends_before_starts(ck, ck.simulate(x, y, o1, o2, mode="timing"))


def test_cube_task_with_paired_vector_epilogue(rng):
    a = rng.standard_normal((64, 32)).astype(np.float16)
    b = rng.standard_normal((32, 48)).astype(np.float16)
    c, out = np.zeros((64, 48), np.float32), np.zeros((64, 48), np.float32)
    ck = matmul_relu.compile(a, b, c, out)
    res = ck.simulate(a, b, c, out)
    assert res.ok, res.check
    want = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(res.outputs["out"], np.maximum(want, 0), rtol=1e-3, atol=1e-3)
    tasks = ck.block_graph.tasks
    assert [t.core_type for t in tasks] == ["AIC", "AIV", "AIV"] * 2
    assert [t.pair for t in tasks] == [None, (0, 0), (0, 1), None, (3, 0), (3, 1)]
    assert [t.deps for t in tasks] == [(), (0,), (0,), (), (3,), (3,)]
    assert ck.tile_graph.groups[0].kind == "cube"
    # the epilogues wait for the cube's tile through cross-core flags, on the AIVs of its AIC
    text = ck.program.text()
    assert "CROSS_SET_FLAG" in text and "CROSS_WAIT_FLAG" in text
    timed = ck.simulate(a, b, c, out, mode="timing")
    times = timed.task_times
    for cube in (0, 3):
        aic = int(times[cube][0][3:])
        assert {times[v][0] for v in (cube + 1, cube + 2)} == {f"AIV{2 * aic}", f"AIV{2 * aic + 1}"}
    unpaired = matmul_relu.compile(a, b, c, out, options={"pairing": False})
    assert all(t.pair is None for t in unpaired.block_graph.tasks)
    ends_before_starts(unpaired, unpaired.simulate(a, b, c, out, mode="timing"))


def test_every_level_and_the_program_text_round_trip(rng):
    x = rng.standard_normal((40, 64)).astype(np.float32)
    rmax, out = np.zeros((40, 1), np.float32), np.zeros_like(x)
    ck = row_max_then_shift.compile(x, rmax, out, machine="teach", snapshots=True)
    assert set(ck.levels) == {"tensor", "tile", "block", "exec", "pto"}
    names = [r.name for r in ck.pass_log]
    assert names[0] == "tile_kernel" and "block_kernel" in names and "partition" not in names
    assert ck.diff("block_kernel").is_lowering
    assert all(n.loc is not None and os.path.abspath(n.loc.file) == THIS for n in ck.tile_graph.nodes)
    text = ck.program.text()
    assert Program.parse(text).text() == text
    assert "block_graph" in ck.block_graph.text()
    row_max_then_shift(x, rmax, out, machine="teach")                 # the call form fills the outputs
    np.testing.assert_allclose(out, np.exp(x - x.max(1, keepdims=True)), rtol=1e-6)


# ---------------------------------------------------------------------------------------
# errors at the user's line

@pypto.jit(level="block")
def vector_in_cube(x, out):
    with B.task("AIC"):
        T.tstore(out[0:16, :], T.texp(T.tload(x[0:16, :])))   # <B:vec-in-aic>


@pypto.jit(level="block")
def cube_in_vector(a, b, out):
    with B.task("AIV"):
        a1 = T.tload(a[0:16, :], space="L1")   # <B:cube-in-aiv>
        T.tstore(out[0:16, :], T.tmatmul(T.textract(a1, "L0A"), T.textract(T.tload(b, space="L1"), "L0B")))


@pypto.jit(level="block")
def no_store(x, out):
    with B.task("AIV"):
        T.tstore(out[0:16, :], T.tload(x[0:16, :]))
    with B.task("AIV"):   # <B:no-store>
        T.texp(T.tload(x[16:32, :]))


@pypto.jit(level="block")
def cycle(x, out):
    with B.task("AIV") as a:
        T.tstore(out[0:16, :], T.texp(T.tload(x[0:16, :])))
    with B.task("AIV") as b:
        T.tstore(x[16:32, :], T.tabs(T.tload(out[0:16, :])))       # b reads what a stored
    a.after(b)   # <B:cycle>


@pypto.jit(level="block")
def outside(x, out):
    with B.task("AIV"):
        T.tstore(out[0:16, :], T.tload(x[0:16, :]))
    T.tstore(out[16:32, :], T.tload(x[16:32, :]))   # <B:outside>


@pypto.jit(level="block")
def shared_tile(x, out):
    with B.task("AIV"):
        t = T.tload(x[0:16, :])
        T.tstore(out[0:16, :], t)
    with B.task("AIV"):
        T.tstore(out[16:32, :], T.texp(t))   # <B:shared>


@pypto.jit(level="block")
def bad_pair(x, out):
    with B.task("AIV") as a:
        T.tstore(out[0:16, :], T.tload(x[0:16, :]))
    with B.task("AIV") as b:
        T.tstore(out[16:32, :], T.tload(x[16:32, :]))
    B.pair(a, b)   # <B:pair>


@pypto.jit(level="block")
def nested(x, out):
    with B.task("AIV"):
        with B.task("AIV"):   # <B:nested>
            T.tstore(out[0:16, :], T.tload(x[0:16, :]))


@pypto.jit(level="tile")
def task_in_tile_kernel(x, out):
    with B.task("AIV"):   # <B:tile-level>
        T.tstore(out[0:16, :], T.tload(x[0:16, :]))


CASES = [
    (vector_in_cube, "vec-in-aic", "vector instruction", 2),
    (cube_in_vector, "cube-in-aiv", "cube instruction", 3),
    (no_store, "no-store", "stores nothing", 2),
    (cycle, "cycle", "cycle", 2),
    (outside, "outside", "outside a task", 2),
    (shared_tile, "shared", "another task", 2),
    (bad_pair, "pair", "cube task", 2),
    (nested, "nested", "task inside a task", 2),
    (task_in_tile_kernel, "tile-level", 'level="block"', 2),
]


@pytest.mark.parametrize("kernel, marker, says, n_args", CASES, ids=[c[1] for c in CASES])
def test_errors_point_at_the_users_line(kernel, marker, says, n_args):
    x = np.ones((64, 64), np.float32)
    args = [x] * (n_args - 1) + [np.zeros_like(x)]
    with pytest.raises(pypto.UnsupportedError) as ei:
        kernel.compile(*args)
    err = ei.value
    assert err.loc is not None and os.path.abspath(err.loc.file) == THIS, str(err)
    assert err.loc.line == line_of(marker), str(err)
    assert says in str(err), str(err)
    assert err.expected is not None and err.got is not None


def test_block_level_is_a_kernel_level():
    assert pypto.jit(level="block")(lambda x: None).level == "block"
    with pytest.raises(pypto.UnsupportedError, match="no kernel level"):
        pypto.jit(level="exec")
