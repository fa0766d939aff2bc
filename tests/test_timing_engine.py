"""The compiled timing engine (pypto/sim/timing_fast.py) gives the Python engine's results exactly.

Every kernel here is simulated by both engines and everything they return is compared: cycles,
task times, busy cycles per core and pipe, bytes per path, HBM bytes, L2 statistics, the trace,
the per-instruction times of the checked mode, and the errors of broken programs (same text).
Dicts are compared with their order: the viewers iterate them.
"""
from __future__ import annotations

import dataclasses

import pytest

import pypto
from pypto.sim import get_machine, simulate, timing, timing_fast
from pypto.sim.timing import run_timing

from common import layernorm, matmul, matmul_bias_gelu, softmax

pytestmark = pytest.mark.skipif(not timing_fast.AVAILABLE, reason="numba is not installed")

F16, F32 = pypto.DT_FP16, pypto.DT_FP32
T = pypto.Tensor


TINY_L2 = get_machine("a2a3").replace(name="a2a3-l2-1mib", l2_mib=1)


@pypto.jit
def scale3d(x, out):
    """3-D tiles: a window of 2 x 16 x 256 of a [8, 64, 256] tensor is two 2-D DMAs (calibrated
    loads pay a startup per DMA) and TROWSUM / TROWEXPANDSUB run per row."""
    pypto.set_vec_tile_shapes(2, 16, 256)
    out[:] = x - pypto.sum(x, dim=-1, keepdim=True) * 0.5


def _vec(n, m=None):
    return (T([n, m or n], F32), T([n, m or n], F32))


def _ln(n):
    return (T([n, n], F32), T([n], F32), T([n], F32), T([n, n], F32))


def _mm(m, k, n):
    return (T([m, k], F16), T([k, n], F16), T([m, n], F16))


CASES = {
    "softmax 64x256 a2a3": (softmax, _vec(1024), "a2a3", dict(TM=64, TN=256)),
    "softmax 8x512 a2a3": (softmax, _vec(1024), "a2a3", dict(TM=8, TN=512)),
    "softmax 32x128 teach": (softmax, _vec(1024), "teach", dict(TM=32, TN=128)),
    "softmax 16x256 tiny L2": (softmax, _vec(2048), TINY_L2, dict(TM=16, TN=256)),
    "layernorm 64x256 a2a3": (layernorm, _ln(1024), "a2a3", dict(TM=64, TN=256)),
    "layernorm 16x512 teach": (layernorm, _ln(1024), "teach", dict(TM=16, TN=512)),
    "matmul fp16 a2a3": (matmul, _mm(1024, 1024, 1024), "a2a3", {}),
    "matmul fp16 64/32-128/256 teach": (matmul, _mm(512, 1024, 512), "teach",
                                        dict(ML0=64, NL0=256, KL0=32, KL1=128)),
    "matmul fp16 tiny L2": (matmul, _mm(1024, 2048, 1024), TINY_L2, {}),
    "matmul+bias+gelu a2a3": (matmul_bias_gelu, _mm(1024, 1024, 1024)[:2] + (T([1024], F16), T([1024, 1024], F16)),
                              "a2a3", {}),
    "3-D tiles a2a3": (scale3d, (T([8, 64, 256], F32), T([8, 64, 256], F32)), "a2a3", {}),
    "3-D tiles public a2a3": (scale3d, (T([8, 64, 256], F32), T([8, 64, 256], F32)),
                              get_machine("a2a3").replace(name="a2a3-public", cost_model="public"), {}),
    "matmul+bias+gelu teach": (matmul_bias_gelu, _mm(256, 512, 512)[:2] + (T([512], F16), T([256, 512], F16)),
                               "teach", dict(VM=16, VN=256)),
}


def _compile(name):
    kernel, specs, machine, consts = CASES[name]
    return kernel.compile(*specs, machine=machine, **consts)


def _ordered(d):
    return list(d.items())


def assert_same(a: dict, b: dict):
    """Two run_timing results are identical, dict orders included."""
    assert a.keys() == b.keys()
    assert a["cycles"] == b["cycles"]
    assert _ordered(a["tasks"]) == _ordered(b["tasks"])
    assert _ordered(a["busy"]) == _ordered(b["busy"])
    assert _ordered(a["bytes_by_path"]) == _ordered(b["bytes_by_path"])
    assert a["hbm_bytes"] == b["hbm_bytes"] and a["instructions"] == b["instructions"]
    assert a["l2"] == b["l2"]
    assert a["events"] == b["events"]
    assert a["times"] == b["times"]
    assert a["unwaited"] == b["unwaited"]
    assert a == b


def both(program, machine, **kw):
    m = get_machine(machine)
    py = run_timing(program, m, progress=False, engine="python", **kw)
    fast = run_timing(program, m, progress=False, engine="compiled", **kw)
    assert_same(py, fast)
    return py, fast


@pytest.mark.parametrize("name", list(CASES))
def test_same_results_as_the_python_engine(name):
    ck = _compile(name)
    py, _ = both(ck.program, ck.machine)
    assert py["cycles"] > 0 and py["events"]
    if ck.machine is TINY_L2:       # the variant exists to evict: re-reads that hit in a full L2 miss
        full = run_timing(ck.program, get_machine("a2a3"), trace=False, progress=False)
        assert py["l2"]["misses"] > full["l2"]["misses"]


def test_without_trace_and_with_recorded_times():
    ck = _compile("matmul+bias+gelu a2a3")
    py, fast = both(ck.program, ck.machine, trace=False)
    assert fast["events"] == [] and fast["times"] is None
    both(ck.program, ck.machine, trace=False, record_times=True, checked=True)


def test_simulate_results_and_stats_are_the_same():
    ck = _compile("softmax 8x512 a2a3")
    py = simulate(ck.program, machine=ck.machine, mode="timing", engine="python", progress=False)
    fast = simulate(ck.program, machine=ck.machine, mode="timing", engine="compiled", progress=False)
    assert fast.cycles == py.cycles and fast.trace == py.trace
    assert _ordered(fast.task_times) == _ordered(py.task_times)
    assert fast.stats == py.stats and fast.summary() == py.summary()


def test_checked_mode_passes_on_compiled_programs():
    ck = _compile("softmax 32x128 teach")
    for engine in ("python", "compiled"):
        simulate(ck.program, machine=ck.machine, mode="timing", check=True, engine=engine)


# --- broken programs: the same errors -------------------------------------------------------------

def _edit(program, drop=None, dup=None, insert=None):
    lines = program.text().splitlines()
    if drop is not None:
        del lines[drop]
    if dup is not None:
        lines.insert(dup, lines[dup])
    if insert is not None:
        lines.insert(*insert)
    return pypto.Program.parse("\n".join(lines))


def _line(program, start, contains=""):
    return next(i for i, ln in enumerate(program.text().splitlines())
                if ln.strip().startswith(start) and contains in ln)


def same_error(program, machine, **kw):
    msgs = []
    for engine in ("python", "compiled"):
        with pytest.raises(pypto.SimulationError) as ei:
            simulate(program, machine=machine, mode="timing", engine=engine, progress=False, **kw)
        msgs.append(str(ei.value))
    assert msgs[0] == msgs[1]
    return msgs[0]


def test_deadlock_same_report():
    ck = _compile("softmax 32x128 teach")
    bad = _edit(ck.program, drop=_line(ck.program, "SET_FLAG"))
    msg = same_error(bad, "teach")
    assert msg.startswith("deadlock:") and "waits for flag MTE2->V event 0" in msg


def test_deadlock_of_every_task_same_report():
    # every SET_FLAG V -> MTE2 removed: each running task blocks, the others never start
    ck = _compile("softmax 32x128 teach")
    lines = [ln for ln in ck.program.text().splitlines() if not ("SET_FLAG" in ln and "V -> MTE2" in ln)]
    msg = same_error(pypto.Program.parse("\n".join(lines)), "teach")
    assert msg.count("waits for flag") > 1


def test_dependency_cycle_same_report():
    ck = _compile("softmax 32x128 teach")
    t0, t1 = ck.program.tasks[:2]
    cyclic = dataclasses.replace(ck.program, tasks=(dataclasses.replace(t0, deps=(1,)),
                                                    dataclasses.replace(t1, deps=(0,))))
    errors = []
    for engine in ("python", "compiled"):
        with pytest.raises(pypto.SimulationError) as ei:
            run_timing(cyclic, ck.machine, progress=False, engine=engine)
        errors.append(str(ei.value))
    assert errors[0] == errors[1] and "dependency cycle" in errors[0]


def test_event_reuse_same_error():
    ck = softmax.compile(T([32, 2048], F32), T([32, 2048], F32), machine="teach")
    bad = _edit(ck.program, dup=_line(ck.program, "SET_FLAG", "V -> MTE2"))
    both(bad, "teach")                      # unchecked: runs the same
    assert "event id reused before its wait" in same_error(bad, "teach", check=True)


def test_pending_flag_pool_grows(monkeypatch):
    monkeypatch.setattr(timing_fast, "POOL_PER_CORE_AND_FLAG", 0)      # starts with one node
    both(_compile("matmul+bias+gelu teach").program, "teach")
    ck = softmax.compile(T([32, 2048], F32), T([32, 2048], F32), machine="teach")
    both(_edit(ck.program, dup=_line(ck.program, "SET_FLAG", "V -> MTE2")), "teach")   # two pending sets


def test_unwaited_flag_same_error():
    ck = _compile("softmax 32x128 teach")
    bad = _edit(ck.program, insert=(_line(ck.program, ".task 1"), "  SET_FLAG           V -> MTE3, EVENT_ID7"))
    py, _ = both(bad, "teach", checked=True, record_times=True)
    assert py["unwaited"]
    assert "set but never waited for" in same_error(bad, "teach", check=True)


def test_race_same_error():
    ck = _compile("softmax 32x128 teach")
    bad = _edit(ck.program, drop=_line(ck.program, "WAIT_FLAG"))
    assert "race in task" in same_error(bad, "teach", check=True)


# --- engine choice, progress, state -----------------------------------------------------------------

def test_auto_uses_the_compiled_engine_only_for_large_programs(monkeypatch):
    ck = _compile("softmax 64x256 a2a3")
    used = []
    real = timing_fast.run_compiled
    monkeypatch.setattr(timing_fast, "run_compiled", lambda *a, **k: used.append(1) or real(*a, **k))
    program = pypto.Program.parse(ck.program.text())    # no run kept with its streams
    want = run_timing(program, ck.machine, progress=False)
    assert used == []                       # tests and tutorials do not pay the compiler
    monkeypatch.setattr(timing, "COMPILED_MIN_INSTRUCTIONS", len(ck.program))
    program = pypto.Program.parse(ck.program.text())
    assert_same(run_timing(program, ck.machine, progress=False), want)
    assert used == [1]
    again = run_timing(program, ck.machine, progress=False)
    assert used == [1]                      # "auto" returns the run kept with the streams...
    assert not again["events"].made
    assert_same(again, want)                # ... and makes its trace when it is read
    assert used == [1, 1]


def test_auto_takes_the_compiled_engine_once_it_is_loaded(monkeypatch):
    """Loaded in the process (a large program ran on it), the compiled engine costs the encoding
    only: "auto" takes it from WARM_MIN_INSTRUCTIONS, with the Python engine's results."""
    big, small = _compile("matmul fp16 a2a3"), _compile("softmax 64x256 a2a3")
    assert len(small.program) < timing.WARM_MIN_INSTRUCTIONS <= len(big.program) < timing.COMPILED_MIN_INSTRUCTIONS
    want = run_timing(big.program, big.machine, progress=False, engine="python")
    assert_same(run_timing(big.program, big.machine, progress=False, engine="compiled"), want)
    assert timing_fast.loaded()
    used = []
    real = timing_fast.run_compiled
    monkeypatch.setattr(timing_fast, "run_compiled", lambda *a, **k: used.append(1) or real(*a, **k))
    for loaded, runs in ((False, []), (True, [1])):
        monkeypatch.setattr(timing_fast, "loaded", lambda: loaded)
        used.clear()
        assert_same(run_timing(pypto.Program.parse(big.program.text()), big.machine, progress=False), want)
        assert used == runs
        run_timing(pypto.Program.parse(small.program.text()), small.machine, progress=False)
        assert used == runs


def test_without_numba(monkeypatch):
    ck = _compile("softmax 64x256 a2a3")
    monkeypatch.setattr(timing_fast, "AVAILABLE", False)
    monkeypatch.setattr(timing, "COMPILED_MIN_INSTRUCTIONS", 0)
    res = simulate(ck.program, machine=ck.machine, mode="timing", progress=False)      # auto: Python
    assert res.cycles > 0
    with pytest.raises(pypto.PyptoError, match="needs numba"):
        simulate(ck.program, machine=ck.machine, mode="timing", engine="compiled")


def test_unknown_engine():
    ck = _compile("softmax 64x256 a2a3")
    with pytest.raises(pypto.PyptoError, match="unknown timing engine"):
        simulate(ck.program, machine=ck.machine, mode="timing", engine="fast")


def test_runs_in_chunks_and_updates_the_progress_bar(monkeypatch):
    ck = _compile("matmul fp16 a2a3")
    want = run_timing(ck.program, ck.machine, progress=False, engine="python")
    seen = []
    monkeypatch.setattr(timing_fast, "CHUNK", 333)
    from pypto.progress import listening
    with listening(lambda ev: seen.append((ev.what, ev.done, ev.unit, ev.closed))):
        assert_same(run_timing(ck.program, ck.machine, engine="compiled"), want)
    what = f"simulating {ck.program.name}"
    assert seen[:3] == [(what, 333, "instructions", False), (what, 666, "instructions", False),
                        (what, 999, "instructions", False)]
    assert seen[-1] == (what, len(ck.program), "instructions", True)


def test_encoding_is_cached_and_the_state_holds_nothing_per_instruction():
    ck = _compile("matmul fp16 a2a3")
    enc = timing_fast.encode(ck.program, ck.machine)
    assert timing_fast.encode(ck.program, ck.machine) is enc
    assert enc.total == len(ck.program)
    # isomorphic tasks share their encoded instructions: only their GM windows are their own
    from pypto.ir.exec import stream_shape
    first = {}                          # stream shape -> its first task
    for t in ck.program.tasks:
        first.setdefault(stream_shape(ck.program, t.code), t)
    assert len(first) < len(ck.program.tasks)
    assert len(enc.arrays.kind) == sum(t.n_instrs for t in first.values())
    gm = sum(1 for t in ck.program.tasks for i in t.instrs if i.op in ("TLOAD", "TSTORE"))
    assert len(enc.arrays.window) == gm
    state = timing_fast._new_state(enc, record=False)
    per_instruction = [f for f, v in zip(state._fields, state) if v.size >= len(ck.program)]
    assert per_instruction == []


def test_isomorphic_tasks_are_decoded_once_with_the_same_results():
    """The compiler marks tasks of the same stream shape; the decoder copies their rows but for
    the GM transfers, and the simulation is the same as decoding every task on its own."""
    from pypto.ir.exec import STREAM_SHAPES
    from pypto.ir.program import Program
    ck = matmul.compile(T([1024, 1024], F16), T([1024, 1024], F16), T([1024, 1024], F16))
    program = ck.program
    shapes = {e[1] for e in program.__dict__[STREAM_SHAPES].values()}
    assert len(shapes) < len(program.tasks)                       # some tasks share a shape
    decoder = timing.Decoder(ck.machine)
    shared = [decoder.task(t, program) for t in program.tasks]
    assert len(decoder.shapes) == len(shapes)
    alone = [timing.Decoder(ck.machine).task(t) for t in program.tasks]
    assert shared == alone
    bare = Program(program.name, program.buffers, program.tasks)    # no side table
    for engine in ("python", "compiled"):
        a = simulate(program, machine=ck.machine, mode="timing", engine=engine)
        b = simulate(bare, machine=ck.machine, mode="timing", engine=engine)
        assert (a.cycles, a.task_times, a.stats) == (b.cycles, b.task_times, b.stats)


def test_compiled_kernels_simulate_on_either_engine(rng):
    x = rng.standard_normal((256, 512)).astype("float32")
    ck = softmax.compile(x, x * 0)
    runs = [ck.simulate(x, x * 0, engine=e) for e in ("python", "compiled")]
    assert runs[0].cycles == runs[1].cycles and runs[0].trace == runs[1].trace and runs[0].ok and runs[1].ok
    with pytest.raises(pypto.PyptoError, match="engine"):
        ck.simulate(x, x * 0, engine="fast")
