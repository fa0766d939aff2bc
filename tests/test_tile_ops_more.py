"""More of the Tile tier (issue #15): masks, selection, fills and index sequences (tcmp / tcmps,
tsel / tsels, texpands, tci) against numpy, alone and in a causal mask; GM round trips in
tile-level kernels (a later stage loads what an earlier one stored: the numpy reference reads
the stored data, the tasks are ordered by their GM windows) and the located errors of the
round trips the tile level cannot order."""
from __future__ import annotations

import os

import numpy as np
import pytest

import pypto
from common import marker_line

T = pypto.tile
THIS = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    return marker_line(THIS, f"# <M:{marker}>")


# ---------------------------------------------------------------------------------------
# masks, selection, fills, TCI

@pypto.jit(level="tile")
def cmp_k(x, y, out, *, CMP: str = "GT", TM: int = 16):
    for i in range(0, x.shape[0], TM):
        a, b = T.tload(x[i:i + TM, :]), T.tload(y[i:i + TM, :])
        T.tstore(out[i:i + TM, :], T.tsel(T.tcmp(a, b, CMP), a, b))


@pypto.jit(level="tile")
def scalar_forms(x, out, *, TM: int = 16):
    for i in range(0, x.shape[0], TM):
        a = T.tload(x[i:i + TM, :])
        T.tstore(out[i:i + TM, :], T.tsels(T.tcmps(a, 0.25, "LE"), a, -2.0))


@pypto.jit(level="tile")
def fill_and_iota(x, fill, rows, cols, *, TM: int = 16):
    n = x.shape[1]
    for i in range(0, x.shape[0], TM):
        T.tstore(fill[i:i + TM, :], T.tadd(T.tload(x[i:i + TM, :]), T.texpands((TM, n), 1.5)))
        T.tstore(rows[i:i + TM, :], T.tci((TM, n), dim=0, start=i))
        T.tstore(cols[i:i + TM, :], T.tci((TM, n), dim=1, start=3, step=2))


@pypto.jit(level="tile")
def causal_mask(s, out, *, TM: int = 16):
    """Scores with the entries above the diagonal (key after query) set to -inf: the row index
    (TCI along dim 0, from the tile's first row) against the column index (TCI along dim 1)."""
    n = s.shape[1]
    for i in range(0, s.shape[0], TM):
        t = T.tload(s[i:i + TM, :])
        keep = T.tcmp(T.tci((TM, n), dim=1), T.tci((TM, n), dim=0, start=i), "LE")
        T.tstore(out[i:i + TM, :], T.tsel(keep, t, T.texpands((TM, n), -np.inf)))


NP_CMP = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
          "GE": np.greater_equal}


@pytest.mark.parametrize("cmp", sorted(NP_CMP))
def test_tcmp_tsel_every_comparison(cmp, rng):
    x = rng.integers(-3, 4, (40, 64)).astype(np.float32)        # ties, for EQ / LE / GE; a tail of 8
    y = rng.integers(-3, 4, (40, 64)).astype(np.float32)
    out = np.zeros_like(x)
    res = cmp_k.compile(x, y, out, CMP=cmp, machine="teach").simulate(x, y, out)
    assert res.ok, res.check
    np.testing.assert_array_equal(res.outputs["out"], np.where(NP_CMP[cmp](x, y), x, y))


def test_scalar_forms(rng):
    x = rng.standard_normal((32, 64)).astype(np.float16)
    out = np.zeros_like(x)
    ck = scalar_forms.compile(x, out)
    res = ck.simulate(x, out)
    assert res.ok, res.check
    np.testing.assert_array_equal(res.outputs["out"], np.where(x <= np.float16(0.25), x, np.float16(-2.0)))
    text = ck.program.text()
    assert "TCMPS" in text and "cmp=LE" in text and "TSELS" in text


def test_fill_and_tci(rng):
    x = rng.standard_normal((48, 32)).astype(np.float32)
    fill, rows, cols = np.zeros_like(x), np.zeros(x.shape, np.int32), np.zeros(x.shape, np.int32)
    ck = fill_and_iota.compile(x, fill, rows, cols)
    res = ck.simulate(x, fill, rows, cols)
    assert res.ok, res.check
    np.testing.assert_array_equal(res.outputs["fill"], x + np.float32(1.5))
    np.testing.assert_array_equal(res.outputs["rows"], np.broadcast_to(np.arange(48)[:, None], x.shape))
    np.testing.assert_array_equal(res.outputs["cols"], np.broadcast_to(3 + 2 * np.arange(32), x.shape))
    # a loop's TCIs differ in their first value only: its iterations stay one group (per chain)
    assert [g.n_outer for g in ck.tile_graph.groups] == [3, 3, 3]


@pytest.mark.parametrize("machine", ["a2a3", "teach"])
def test_causal_mask(machine, rng):
    s = rng.standard_normal((64, 64)).astype(np.float32)
    out = np.zeros_like(s)
    ck = causal_mask.compile(s, out, machine=machine)
    res = ck.simulate(s, out)
    assert res.ok, res.check
    want = np.where(np.tril(np.ones(s.shape, bool)), s, np.float32(-np.inf))
    np.testing.assert_array_equal(res.outputs["out"], want)
    assert ck.simulate(s, out, mode="timing").cycles > 0
    ops = {n.op for n in ck.tile_graph.nodes}
    assert {"TCI", "TCMP", "TSEL", "TEXPANDS"} <= ops


@pypto.jit(level="tile")
def bad_cmp(x, out):
    t = T.tload(x[0:16, :])
    T.tstore(out[0:16, :], T.tsel(T.tcmp(t, t, "BIGGER"), t, t))   # <M:cmp>


@pypto.jit(level="tile")
def bad_mask(x, out):
    t = T.tload(x[0:16, :])
    T.tstore(out[0:16, :], T.tsel(t, t, t))   # <M:mask>


@pypto.jit(level="tile")
def bad_fill(x, out):
    t = T.tload(x[0:16, :])
    T.tstore(out[0:16, :], T.tadd(t, T.texpands((16, 64), 0.5, pypto.DT_INT32)))   # <M:fill>


@pypto.jit(level="tile")
def bad_tci(x, out):
    t = T.tload(x[0:16, :])
    T.tstore(out[0:16, :], T.tadd(t, T.tci((16, 64), dim=2)))   # <M:tci>


# ---------------------------------------------------------------------------------------
# GM round trips

@pypto.jit(level="tile")
def two_stage(x, rmax, out, *, TM: int = 16):
    """Stage 1 stores the row maxima into the workspace `rmax`; stage 2 loads them back."""
    for i in range(0, x.shape[0], TM):
        T.tstore(rmax[i:i + TM, :], T.trowmax(T.tload(x[i:i + TM, :])))
    for i in range(0, x.shape[0], TM):
        t = T.tload(x[i:i + TM, :])
        m = T.tload(rmax[i:i + TM, :])
        T.tstore(out[i:i + TM, :], T.texp(T.trowexpandsub(t, m)))


@pypto.jit(level="tile")
def same_loop(x, out, *, TM: int = 16):
    """Each iteration adds the rows the previous one stored: iterations of one group."""
    T.tstore(out[0:TM, :], T.tload(x[0:TM, :]))
    for i in range(TM, x.shape[0], TM):
        prev = T.tload(out[i - TM:i, :])   # <M:same-loop>
        T.tstore(out[i:i + TM, :], T.tadd(prev, T.tload(x[i:i + TM, :])))


@pytest.mark.parametrize("machine", ["a2a3", "teach"])
def test_two_stage_round_trip(machine, rng):
    x = rng.standard_normal((72, 64)).astype(np.float32)        # a tail of 8
    rmax, out = np.zeros((72, 1), np.float32), np.zeros_like(x)
    ck = two_stage.compile(x, rmax, out, machine=machine)
    res = ck.simulate(x, rmax, out)
    assert res.ok, res.check
    np.testing.assert_array_equal(res.outputs["rmax"], x.max(1, keepdims=True))
    np.testing.assert_allclose(res.outputs["out"], np.exp(x - x.max(1, keepdims=True)), rtol=1e-6)
    # the reference reads the stored maxima: poisoned first contents of the workspace change nothing
    ws = np.full_like(rmax, np.nan)
    again = ck.simulate(x, ws, out)
    assert again.ok, again.check
    np.testing.assert_allclose(again.outputs["out"], res.outputs["out"])
    # the stage-2 tasks depend on the stage-1 tasks that stored their rows, and run after them
    tasks = ck.block_graph.tasks
    stage1 = {t.id for t in tasks if t.group == 0}
    assert all(t.deps and set(t.deps) <= stage1 for t in tasks if t.group == 1)
    timed = ck.simulate(x, rmax, out, mode="timing")
    for t in ck.program.tasks:
        for d in t.deps:
            assert timed.task_times[d][2] <= timed.task_times[t.id][1]


ERRORS = [
    (bad_cmp, "cmp", pypto.UnsupportedError, "unknown comparison"),
    (bad_mask, "mask", pypto.DTypeError, "not a mask"),
    (bad_fill, "fill", pypto.DTypeError, "would be truncated"),
    (bad_tci, "tci", pypto.ShapeError, "dim out of range"),
    (same_loop, "same-loop", pypto.UnsupportedError, "same loop"),
]


@pytest.mark.parametrize("kernel, marker, cls, says", ERRORS, ids=[e[1] for e in ERRORS])
def test_errors_point_at_the_users_line(kernel, marker, cls, says):
    x = np.ones((64, 64), np.float32)
    with pytest.raises(cls) as ei:
        kernel.compile(x, np.zeros_like(x))
    err = ei.value
    assert err.loc is not None and os.path.abspath(err.loc.file) == THIS, str(err)
    assert err.loc.line == line_of(marker), str(err)
    assert says in str(err)
