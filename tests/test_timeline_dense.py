"""A long run's timeline: the trace read as columns (no TraceEvent made), and rows of more bars than
pixels drawn as strips shaded by how busy each pipe was, not as bars hidden by their outlines.

What must hold: the columns are the events' fields, for both engines, a program with loops and a
kept run; the busy cycles per bin are exact (against a brute-force count); the strip of a pipe
busy all along is its class's solid colour; the occupancy curve is the one its steps give and its
binned form keeps its area; small runs keep their bars."""
from __future__ import annotations

import numpy as np
import pytest

import pypto
from pypto.sim.timing import TraceColumns, run_timing, trace_columns
from pypto.viz import timeline as tl

from common import matmul, softmax

pytest.importorskip("matplotlib")

F16, F32 = pypto.DT_FP16, pypto.DT_FP32
T = pypto.Tensor


FIELDS = ("core", "pipe", "op", "line", "start", "end", "ready", "task", "index")


def _named(c: TraceColumns) -> list:
    """The columns as the events' field values, the named ones looked up in their tables."""
    tables = {"core": c.cores, "pipe": c.pipes, "op": c.ops, "line": c.lines}
    return [np.asarray(tables[f], object)[getattr(c, f)].tolist() if f in tables else getattr(c, f).tolist()
            for f in FIELDS]


def _fields(events) -> list:
    return [[getattr(e, f) for e in events] for f in FIELDS]


@pytest.fixture(scope="module")
def mm():
    return matmul.compile(T([512, 1024], F16), T([1024, 512], F16), T([512, 512], F16), machine="a2a3",
                          ML0=128, NL0=128, KL0=64, KL1=128)


@pytest.mark.parametrize("engine", ["compiled", "python"])
def test_columns_are_the_events_fields(mm, engine):
    if engine == "compiled":
        pytest.importorskip("numba")
    run = run_timing(mm.program, mm.machine, engine=engine, progress=False)
    cols = trace_columns(run["events"])
    if engine == "compiled":            # read off the run: no event made for them
        assert not run["events"].made
    assert _named(cols) == _fields(list(run["events"]))
    assert len(cols) == run["instructions"]


def test_columns_of_a_program_read_from_its_text(mm):
    """A program with loops, never unrolled: each instruction run's pipe and op from its loop body."""
    pytest.importorskip("numba")
    parsed = pypto.Program.parse(mm.program.text(), machine=mm.machine)
    run = run_timing(parsed, mm.machine, engine="compiled", progress=False)
    assert _named(trace_columns(run["events"])) == _fields(list(run["events"]))
    assert not any("instrs" in t.__dict__ and t.code is not t.instrs for t in parsed.tasks)


def test_columns_of_a_kept_run_rerun_once(mm):
    """ck.simulate's trace re-runs the compiler's timing run when read: its columns and events
    are of that one run."""
    res = mm.simulate(mode="timing")
    cols = res.trace.columns()
    assert _named(cols) == _fields(list(res.trace))


def test_busy_in_bins_is_exact():
    rng = np.random.default_rng(7)
    start = rng.integers(0, 1000, 300)
    end = start + rng.integers(1, 40, 300)          # overlapping intervals too
    edges = np.linspace(0, 1100, 57)
    got = tl.busy_in_bins(start, end, edges)
    t = np.arange(1100) + 0.5                       # cycle c is [c, c + 1): running at its midpoint
    running = ((start[:, None] <= t) & (t < end[:, None])).sum(0).astype(float)
    # bins cut cycles in two: each cycle's share in each bin
    cyc = np.zeros(len(edges) - 1)
    for c in range(1100):
        for b, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
            cyc[b] += running[c] * max(0.0, min(hi, c + 1) - max(lo, c))
    assert got == pytest.approx(cyc)
    assert got.sum() == pytest.approx((end - start).sum())


def test_strip_of_a_pipe_busy_all_along_is_solid():
    # row 0: one class back to back over the whole span; row 1: the first half, a 3-cycle bar
    # every 6 cycles (a bin is 6 cycles)
    span = 6 * tl.STRIP_BINS
    start0 = np.arange(0, span, 3)
    start1 = np.arange(0, span // 2, 6)
    row = np.concatenate([np.zeros(len(start0), np.int64), np.ones(len(start1), np.int64)])
    cls = np.concatenate([np.full(len(start0), 2), np.full(len(start1), 0)])
    start = np.concatenate([start0, start1])
    end = start + 3
    share = tl.strip_shares(row, cls, start, end, 2, float(span))
    assert share.shape == (2, len(tl.CLASSES), tl.STRIP_BINS)
    assert np.allclose(share[0, 2], 1.0) and np.allclose(np.delete(share[0], 2, 0), 0.0)
    assert np.allclose(share[1, 0, :tl.STRIP_BINS // 2], 0.5) and np.allclose(share[1, 0, tl.STRIP_BINS // 2:], 0.0)
    img = tl._strips(row, cls, start, end, 2, float(span))
    from matplotlib.colors import to_rgb
    red = to_rgb(tl.CLASSES[2][1])
    assert np.allclose(img[1:tl.STRIP_ROWS - 1], red)           # the bar's image rows, every bin
    assert np.allclose(img[0], 1.0) and np.allclose(img[tl.STRIP_ROWS - 1], 1.0)   # the gaps between rows
    half = img[tl.STRIP_ROWS + 1, 0]
    assert np.allclose(half, 1 - 0.5 * (1 - np.array(to_rgb(tl.CLASSES[0][1]))))   # half busy: half ink


def test_dense_timeline_draws_strips_of_the_run(mm, monkeypatch):
    """A run whose rows hold more bars than DENSE_ROW_BARS: one image, no bar collections, its
    cells the run's busy shares; below the threshold the bars as before."""
    from matplotlib.collections import PolyCollection
    from matplotlib.image import AxesImage
    res = mm.simulate(mode="timing")
    fig = tl.plot_timeline(res, cores=["AIC0"])
    assert any(isinstance(c, PolyCollection) for c in fig.axes[0].collections)
    assert not fig.axes[0].images
    monkeypatch.setattr(tl, "DENSE_ROW_BARS", 10)
    fig = tl.plot_timeline(res, cores=["AIC0"])
    ax = fig.axes[0]
    assert not ax.collections and len(ax.images) == 1 and isinstance(ax.images[0], AxesImage)
    assert "instructions; shade: how busy the pipe was" in ax.get_xlabel()
    rows = tl.timeline_rows(res.trace, ["AIC0"])
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"{c} {p}" for c, p in rows]
    # the cells: per row, the busy cycles of its events over each bin, by brute force on the events
    img = ax.images[0].get_array()
    span = res.cycles
    edges = np.linspace(0, span, tl.STRIP_BINS + 1)
    for k, (core, pipe) in enumerate(rows):
        ev = [e for e in res.trace if e.core == core and e.pipe == pipe]
        busy = np.zeros(tl.STRIP_BINS)
        for e in ev:
            lo, hi = e.start, max(e.end, e.start + 1)
            b0, b1 = np.searchsorted(edges, lo, "right") - 1, np.searchsorted(edges, hi, "left")
            for b in range(max(b0, 0), min(b1, tl.STRIP_BINS)):
                busy[b] += max(0.0, min(hi, edges[b + 1]) - max(lo, edges[b]))
        ink = 1.0 - img[k * tl.STRIP_ROWS + 1].min(axis=1)      # some channel is inked by any class
        assert ((ink > 1e-9) == (busy > 1e-9)).all()
    assert fig._repr_png_().startswith(b"\x89PNG")


def test_occupancy_is_the_events_steps_and_its_bins_keep_the_area():
    ck = softmax.compile(T([4096, 512], F32), T([4096, 512], F32), machine="a2a3", TM=8, TN=512)
    res = ck.simulate(mode="timing")
    occ = tl.occupancy(res.trace, {"AIC": 24, "AIV": 48})
    for (ct, pipe), (t, busy) in occ.items():       # the steps a sort of (time, +-1) tuples gives
        steps = sorted([(e.start, 1) for e in res.trace if e.core[:3] == ct and e.pipe == pipe]
                       + [(max(e.end, e.start + 1), -1) for e in res.trace if e.core[:3] == ct and e.pipe == pipe])
        assert t.tolist() == [float(a) for a, _ in steps]
        assert np.allclose(busy, np.cumsum([d for _, d in steps]) / 48)
        edges, mean = tl._binned(t, busy, res.cycles)
        assert len(edges) == tl.STRIP_BINS + 1 and mean[-1] == 0
        area = float(np.sum(np.diff(t) * busy[:-1]))
        assert float(np.sum(np.diff(edges) * mean[:-1])) == pytest.approx(area)
