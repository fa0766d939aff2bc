"""Timing as a user calls it: `ck.simulate(mode="timing")` returns the run the compiler made to fix
the cores (assign_cores), its trace is made only when read, and its stats come from the engine.

The run kept with the instruction streams must be the very run a fresh simulation of the program
gives: every figure is compared with a simulation of the same program parsed from its text (a
new program, nothing kept).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import pypto
from pypto.ir.exec import SIM_CACHE
from pypto.sim import timing, timing_fast
from pypto.sim.timing import Trace, TraceEvent, matmul_flops

from common import matmul, softmax

F16, F32 = pypto.DT_FP16, pypto.DT_FP32
T = pypto.Tensor


def _fresh(ck):
    """The same program, parsed from its text: no streams shared, nothing kept."""
    return pypto.sim.simulate(pypto.Program.parse(ck.program.text()), machine=ck.machine, mode="timing",
                              progress=False)


def _mm(n=256):
    return matmul.compile(T([n, n], F16), T([n, n], F16), T([n, n], F16), machine="a2a3",
                          ML0=64, NL0=64, KL0=64, KL1=128)


def _sm():
    return softmax.compile(T([256, 512], F32), T([256, 512], F32), machine="a2a3", TM=16, TN=512)


@pytest.mark.parametrize("make", [_mm, _sm], ids=["matmul", "softmax"])
def test_simulate_returns_the_compilers_run(make, monkeypatch):
    ck = make()
    ran = []
    real = timing._run_timing
    monkeypatch.setattr(timing, "_run_timing", lambda *a, **k: ran.append(1) or real(*a, **k))
    res = ck.simulate(mode="timing")
    assert ran == []                                    # no second simulation
    fresh = _fresh(ck)
    assert ran == [1]
    assert res.cycles == fresh.cycles > 0
    assert res.stats == fresh.stats
    assert res.task_times == fresh.task_times
    assert not res.trace.made                           # nothing made yet ...
    assert len(res.trace) == len(ck.program) == res.stats["instructions"]
    assert res.trace == fresh.trace                     # ... until it is read: the same events
    assert ran == [1, 1] and res.trace.made


def test_kept_run_is_not_returned_to_a_program_with_other_cores():
    ck = _sm()
    kept = ck.simulate(mode="timing")
    # the same streams (and simulator cache), two tasks' cores swapped
    a, b = ck.program.tasks[0], ck.program.tasks[1]
    tasks = (dataclasses.replace(a, core=b.core), dataclasses.replace(b, core=a.core)) + ck.program.tasks[2:]
    other = pypto.Program(ck.program.name, ck.program.buffers, tasks)
    other.__dict__[SIM_CACHE] = ck.program.__dict__[SIM_CACHE]
    res = pypto.sim.simulate(other, machine=ck.machine, mode="timing", progress=False)
    assert res.task_times[0][0] == f"AIV{b.core}" and res.task_times[1][0] == f"AIV{a.core}"
    assert kept.task_times[0][0] == f"AIV{a.core}"
    fresh = pypto.sim.simulate(pypto.Program.parse(other.text()), machine=ck.machine, mode="timing", progress=False)
    assert res.task_times == fresh.task_times and res.cycles == fresh.cycles


def test_without_core_assignment_the_first_simulation_runs():
    ck = softmax.compile(T([256, 512], F32), T([256, 512], F32), machine="a2a3", TM=16, TN=512,
                         options={"core_assignment": False})
    assert all(t.core is None for t in ck.program.tasks)
    res = ck.simulate(mode="timing")
    assert res.cycles == _fresh(ck).cycles


def test_checked_and_race_runs_are_never_reused():
    ck = _sm()
    x = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)
    res = ck.simulate(x, np.zeros_like(x), mode="full")      # races looked for: times recorded
    assert res.ok and res.races == []
    assert res.cycles == _fresh(ck).cycles


def test_flops_are_counted_by_the_decoding():
    ck = _mm()
    want = sum(matmul_flops(i) for t in ck.program.tasks for i in t.instrs if i.op.startswith("TMATMUL"))
    assert want == 2 * 256 ** 3
    assert ck.simulate(mode="timing").stats["flops"] == want
    assert pypto.sim.simulate(ck.program, machine=ck.machine, mode="timing", engine="python",
                              progress=False).stats["flops"] == want
    if timing_fast.AVAILABLE:
        assert pypto.sim.simulate(ck.program, machine=ck.machine, mode="timing", engine="compiled",
                                  progress=False).stats["flops"] == want


def test_the_lazy_trace_feeds_the_timeline_and_the_chrome_trace(tmp_path):
    import json
    ck = _sm()
    res = ck.simulate(mode="timing")
    path = res.to_chrome_trace(tmp_path / "t.json")
    xs = [e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X" and e["cat"] != "task"]
    assert len(xs) == len(ck.program)
    fig = res.timeline()
    assert fig is not None


def test_trace_behaves_as_the_list_of_its_events():
    made = []
    events = [TraceEvent("AIV0", "V", "TADD", 0, 5, 0, 0, "k.py:3"), TraceEvent("AIV0", "MTE3", "TSTORE", 5, 9, 0, 1, "")]
    tr = Trace(lambda: made.append(1) or events, 2)
    assert len(tr) == 2 and tr and not tr.made and made == []
    assert tr[1].op == "TSTORE" and made == [1]
    assert list(tr) == events and tr == events and tr[-1:] == events[-1:]
    assert made == [1]                                  # made once
    assert Trace(lambda: [], 0) == [] and not Trace(lambda: [], 0)
    assert "2 events" in repr(tr)
