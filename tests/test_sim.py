"""The simulator: determinism, the cost model against hand calculations, machines, traces."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import pypto
from pypto.target.cost import cube_cycles
from pypto.target.machine import A2A3, TEACH
from common import byte_accesses

PUB = A2A3.replace(name="a2a3-public", cost_model="public")     # the public formulas, by hand below

# public figures (DESIGN section 4), written out here rather than read from pypto
CLOCK_HZ = 1.85e9
GIB = 2 ** 30
BW_GM_UB, BW_UB_GM, BW_GM_L1, BW_L1_L0A, BW_L1_L0B, BW_L0C_GM = 100.9, 188.46, 135.0, 441.0, 220.5, 70.0
HBM_BYTES_PER_CYCLE = 1600e9 / CLOCK_HZ
VEC_HEAD, VEC_TAIL, REPEAT_BYTES, DISPATCH = 12, 16, 256, 100


def dma(nbytes, gib_per_s):
    return math.ceil(nbytes / (gib_per_s * GIB / CLOCK_HZ))


def vec(nbytes, slope=1, head=True):
    return (VEC_HEAD if head else 0) + slope * math.ceil(nbytes / REPEAT_BYTES) + VEC_TAIL


@pypto.jit
def add_const(x, out):
    out[:] = x + 1.0


@pypto.jit
def exp_add(x, out):
    out[:] = pypto.exp(x) + 1.0


@pypto.jit
def softmax(x, out, *, TM: int = 32, TN: int = 64):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = pypto.softmax(x)


@pypto.jit
def mm(a, b, out):
    out[:] = a @ b


def test_machine_figures():
    assert (A2A3.n_aic, A2A3.n_aiv) == (24, 48)
    assert A2A3.clock_ghz == 1.85
    caps = A2A3.capacities()
    assert caps == {"UB": 192 * 1024, "L1": 512 * 1024, "L0A": 64 * 1024, "L0B": 64 * 1024, "L0C": 128 * 1024,
                    "BT": 1024}
    assert TEACH.capacities() == caps                    # same per-core rules
    assert (TEACH.n_aic, TEACH.n_aiv) != (A2A3.n_aic, A2A3.n_aiv)
    assert TEACH.n_aiv == 2 * TEACH.n_aic and TEACH.n_aiv < A2A3.n_aiv
    assert A2A3.dma_bytes_per_cycle("GM", "UB") == pytest.approx(BW_GM_UB * GIB / CLOCK_HZ)
    assert A2A3.peak_flops == pytest.approx(24 * 16 * 16 * 16 * 2 * 1.85e9)
    assert 360e12 < A2A3.peak_flops < 370e12


# ---------------------------------------------------------------------------------------
# determinism

def test_determinism(rng):
    x = rng.standard_normal((100, 300)).astype(np.float32)
    ck = softmax.compile(x, np.zeros_like(x), machine="teach")
    r1 = ck.simulate(x, np.zeros_like(x))
    r2 = ck.simulate(x, np.zeros_like(x))
    assert r1.cycles == r2.cycles > 0
    assert r1.trace == r2.trace and len(r1.trace) > 0
    assert r1.stats == r2.stats
    np.testing.assert_array_equal(r1.outputs["out"], r2.outputs["out"])
    # a fresh compile of the same kernel gives the same program and timing
    softmax.cache_clear()
    ck2 = softmax.compile(x, np.zeros_like(x), machine="teach")
    assert ck2 is not ck and ck2.program.text() == ck.program.text()
    r3 = ck2.simulate(x, np.zeros_like(x))
    assert r3.cycles == r1.cycles and r3.trace == r1.trace


# ---------------------------------------------------------------------------------------
# cost model by hand

L2_MISS_LATENCY = 50 + 150    # DESIGN.md: ~50-cycle L2 hit latency, ~+150 cycles on a miss

def test_single_tile_cycles_by_hand():
    """TLOAD -> flag -> TADDS -> flag -> TSTORE on one AIV core, computed from the public figures."""
    x = np.ones((8, 64), np.float32)
    ck = add_const.compile(x, np.zeros_like(x), machine=PUB)
    ops = [i.op for t in ck.program.tasks for i in t.instrs]
    assert len(ck.program.tasks) == 1
    assert ops == ["TLOAD", "SET_FLAG", "WAIT_FLAG", "TADDS", "SET_FLAG", "WAIT_FLAG", "TSTORE"]
    nbytes = 8 * 64 * 4
    assert nbytes / HBM_BYTES_PER_CYCLE < dma(nbytes, BW_GM_UB)      # not HBM-bound
    want = (DISPATCH
            + dma(nbytes, BW_GM_UB)     # TLOAD GM->UB on MTE2
            + L2_MISS_LATENCY           # first read of x: an L2 miss (50 hit + 150 extra cycles)
            + 1 + 1                     # SET_FLAG MTE2->V, WAIT_FLAG on V
            + vec(nbytes)               # TADDS: head + 1 cycle x 8 repeats + tail
            + 1 + 1                     # SET_FLAG V->MTE3, WAIT_FLAG on MTE3
            + dma(nbytes, BW_UB_GM))    # TSTORE UB->GM on MTE3 (posted: no latency)
    assert want == 100 + 35 + 200 + 2 + 36 + 2 + 19
    res = ck.simulate(x, np.zeros_like(x))
    assert res.cycles == want
    assert res.time_us == pytest.approx(want / (CLOCK_HZ / 1e6), abs=1e-3)
    by_op = {e.op: e.end - e.start for e in res.trace if not e.op.endswith("FLAG")}
    assert by_op == {"TLOAD": 35, "TADDS": 36, "TSTORE": 19}      # the pipe is busy while bytes stream
    load = next(e for e in res.trace if e.op == "TLOAD")
    assert load.ready == load.end + L2_MISS_LATENCY                # ... and the data is ready a latency later
    set_flag = next(e for e in res.trace if e.op == "SET_FLAG")
    assert set_flag.start == load.ready
    assert res.stats["bytes_by_path"] == {"GM->UB": nbytes, "UB->GM": nbytes}
    assert res.stats["hbm_bytes"] == 2 * nbytes
    assert res.stats["cores_used"] == {"AIC": 0, "AIV": 1}


def test_back_to_back_vector_ops_share_the_startup():
    """TEXP then TADDS on a busy V pipe: the second one has no head."""
    x = np.ones((8, 64), np.float32)
    ck = exp_add.compile(x, np.zeros_like(x), machine=PUB)
    nbytes = 8 * 64 * 4
    res = ck.simulate(x, np.zeros_like(x))
    ev = {e.op: e for e in res.trace}
    assert ev["TEXP"].end - ev["TEXP"].start == vec(nbytes, slope=4)          # 12 + 4*8 + 16 = 60
    assert ev["TADDS"].start == ev["TEXP"].end
    assert ev["TADDS"].end - ev["TADDS"].start == vec(nbytes, head=False)     # 8 + 16 = 24
    want = (DISPATCH + dma(nbytes, BW_GM_UB) + L2_MISS_LATENCY + 2 + vec(nbytes, 4) + vec(nbytes, head=False)
            + 2 + dma(nbytes, BW_UB_GM))
    assert res.cycles == want


def test_single_tile_cycles_by_hand_calibrated():
    """The same kernel on a2a3 (calibrated rules, docs/cost_model.md): the load's pipe time is
    its DMA startup less the L2 miss latency, then its bytes at 128 B/cycle; TADDS costs 26 + 1
    per repeat; the store keeps the public UB->GM figure."""
    x = np.ones((8, 64), np.float32)
    ck = add_const.compile(x, np.zeros_like(x))
    assert ck.machine.cost_model == "calibrated"
    nbytes = 8 * 64 * 4
    peak = 220.55 * GIB / CLOCK_HZ
    load = 264 - L2_MISS_LATENCY + math.ceil(nbytes / peak)
    want = DISPATCH + load + L2_MISS_LATENCY + 2 + (26 + 8) + 2 + dma(nbytes, BW_UB_GM)
    assert want == 100 + 80 + 200 + 2 + 34 + 2 + 19
    res = ck.simulate(x, np.zeros_like(x))
    assert res.cycles == want
    by_op = {e.op: e.end - e.start for e in res.trace if not e.op.endswith("FLAG")}
    assert by_op == {"TLOAD": 80, "TADDS": 34, "TSTORE": 19}
    # a lone cold load ends when pypto.sim.cost says
    ld = next(e for e in res.trace if e.op == "TLOAD")
    assert ld.ready - ld.start == pypto.sim.cost("TLOAD", shape=(8, 64), dtype="fp32")


def test_back_to_back_vector_ops_share_the_startup_calibrated():
    """TEXP (31 + 2 per repeat) then TADDS: the second one starts vec_head cycles early; an op
    shorter than the shared startup still takes a cycle."""
    x = np.ones((8, 64), np.float32)
    res = exp_add.compile(x, np.zeros_like(x)).simulate(x, np.zeros_like(x))
    ev = {e.op: e for e in res.trace}
    assert ev["TEXP"].end - ev["TEXP"].start == 31 + 2 * 8
    assert ev["TADDS"].start == ev["TEXP"].end
    assert ev["TADDS"].end - ev["TADDS"].start == 26 + 8 - VEC_HEAD


def test_cube_formula():
    # cycles = 6 + c * ceil(M/16) * ceil(K/K0) * ceil(N/16), K0 = 32 bytes / sizeof(A)
    assert cube_cycles(40, 50, 60, 2, A2A3) == 54 == 6 + 3 * 4 * 4
    assert cube_cycles(40, 50, 60, 4, A2A3) == 6 + 2 * 3 * 7 * 4            # fp32: K0 = 8, half rate
    assert cube_cycles(40, 50, 60, 1, A2A3) == 6 + 3 * 2 * 4                # int8: K0 = 32
    assert cube_cycles(16, 16, 16, 2, A2A3) == 7
    assert cube_cycles(128, 128, 128, 2, A2A3) == 6 + 8 * 8 * 8


def test_matmul_single_tile_cycles_by_hand():
    a = np.ones((40, 50), np.float16)
    b = np.ones((50, 60), np.float16)
    ck = mm.compile(a, b, np.zeros((40, 60), np.float16), machine=PUB)
    res = ck.simulate(a, b, np.zeros((40, 60), np.float16))
    np.testing.assert_array_equal(res.outputs["out"], np.full((40, 60), 50, np.float16))
    ev = {}
    for e in res.trace:
        ev.setdefault(e.op, []).append(e)
    assert [e.end - e.start for e in ev["TMATMUL"]] == [54]
    assert [e.end - e.start for e in ev["TLOAD"]] == [dma(40 * 50 * 2, BW_GM_L1), dma(50 * 60 * 2, BW_GM_L1)]
    assert [e.ready - e.end for e in ev["TLOAD"]] == [L2_MISS_LATENCY] * 2
    assert sorted(e.end - e.start for e in ev["TEXTRACT"]) == sorted(
        [dma(40 * 50 * 2, BW_L1_L0A), dma(50 * 60 * 2, BW_L1_L0B)])
    assert [e.end - e.start for e in ev["TSTORE"]] == [dma(40 * 60 * 2, BW_L0C_GM)]
    assert {e.pipe for e in ev["TMATMUL"]} == {"M"} and {e.pipe for e in ev["TSTORE"]} == {"FIX"}
    assert res.stats["flops"] == 2 * 40 * 50 * 60
    assert res.stats["cores_used"] == {"AIC": 1, "AIV": 0}


# ---------------------------------------------------------------------------------------
# machines, traffic, modes

def test_teach_and_a2a3_machines(rng):
    x = rng.standard_normal((512, 256)).astype(np.float32)

    @pypto.jit
    def k(x, out):
        pypto.set_vec_tile_shapes(8, 256)
        out[:] = x * 2.0

    r_big = k.compile(x, np.zeros_like(x), machine="a2a3").simulate(x, np.zeros_like(x))
    r_small = k.compile(x, np.zeros_like(x), machine="teach").simulate(x, np.zeros_like(x))
    assert r_big.machine.name == "a2a3" and r_small.machine.name == "teach"
    assert r_big.stats["cores_used"]["AIV"] == 48
    assert r_small.stats["cores_used"]["AIV"] == 4
    assert {e.core for e in r_small.trace} == {"AIV0", "AIV1", "AIV2", "AIV3"}
    assert r_small.cycles > r_big.cycles
    np.testing.assert_array_equal(r_big.outputs["out"], r_small.outputs["out"])
    # simulate(machine=...) on a kernel compiled for another machine recompiles for it
    ck = k.compile(x, np.zeros_like(x), machine="a2a3")
    r = ck.simulate(x, np.zeros_like(x), machine="teach")
    assert r.machine.name == "teach" and r.cycles == r_small.cycles


def test_more_hbm_traffic_more_cycles(rng):
    small = rng.standard_normal((64, 256)).astype(np.float32)
    big = rng.standard_normal((1024, 1024)).astype(np.float32)
    for machine in ("a2a3", "teach"):
        rs = add_const.compile(small, np.zeros_like(small), machine=machine).simulate(small, np.zeros_like(small))
        rb = add_const.compile(big, np.zeros_like(big), machine=machine).simulate(big, np.zeros_like(big))
        assert rb.stats["hbm_bytes"] == 2 * big.nbytes and rs.stats["hbm_bytes"] == 2 * small.nbytes
        assert rb.cycles > rs.cycles


def test_shared_hbm_limits_many_cores(rng):
    """48 cores streaming at once cannot beat the shared HBM bandwidth."""
    x = rng.standard_normal((2048, 1024)).astype(np.float32)
    ck = add_const.compile(x, np.zeros_like(x))
    res = ck.simulate(mode="timing")
    hbm_cycles = res.stats["hbm_bytes"] / HBM_BYTES_PER_CYCLE
    assert res.cycles >= hbm_cycles
    assert res.stats["hbm_util_pct"] <= 100.0


def test_timing_mode_needs_no_data(rng):
    x = rng.standard_normal((100, 300)).astype(np.float32)
    ck = softmax.compile(x, np.zeros_like(x))
    rt = ck.simulate(mode="timing")
    assert rt.cycles > 0 and rt.outputs == {} and rt.check is None
    spec = pypto.Tensor([100, 300], pypto.DT_FP32)
    rs = softmax.compile(spec, spec).simulate(mode="timing")
    assert rs.cycles == rt.cycles
    full = ck.simulate(x, np.zeros_like(x))
    assert full.cycles == rt.cycles and full.ok
    rf = ck.simulate(x, np.zeros_like(x), mode="functional")
    assert rf.cycles is None and rf.check is not None and rf.ok
    np.testing.assert_array_equal(rf.outputs["out"], full.outputs["out"])


def test_chrome_trace(tmp_path, rng):
    x = rng.standard_normal((100, 300)).astype(np.float32)
    ck = softmax.compile(x, np.zeros_like(x), machine="teach")
    res = ck.simulate(x, np.zeros_like(x))
    path = tmp_path / "trace.json"
    res.to_chrome_trace(str(path))
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    meta = [e for e in events if e.get("ph") == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert set(procs.values()) == {e.core for e in res.trace}
    assert {"MTE2", "V", "MTE3"} <= set(threads.values())
    xs = [e for e in events if e.get("ph") == "X" and e["cat"] != "task"]
    tasks = [e for e in events if e.get("ph") == "X" and e["cat"] == "task"]
    assert len(xs) == len(res.trace)
    assert sorted(e["args"]["task"] for e in tasks) == list(range(len(ck.program.tasks)))
    assert all(threads[(e["pid"], e["tid"])] == "tasks" for e in tasks)
    # a flow arrow per task dependency, from the producer's core to the consumer's
    n_deps = sum(len(t.deps) for t in ck.program.tasks)
    assert n_deps > 0
    assert sum(e.get("ph") == "s" for e in events) == sum(e.get("ph") == "f" for e in events) == n_deps
    # on-chip occupancy counters: one rise and one fall per task
    counters = [e for e in events if e.get("ph") == "C"]
    assert len(counters) == 2 * len(tasks) and max(c["args"]["UB"] for c in counters) > 0
    # overlapping events never share a track (checked in exact cycles, not rounded microseconds)
    by_track = {}
    for e in xs + tasks:
        a = e["args"]
        by_track.setdefault((e["pid"], e["tid"]), []).append((a["start_cycle"], a["start_cycle"] + a["cycles"]))
    for spans in by_track.values():
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    for e in xs:
        assert (e["pid"], e["tid"]) in threads
        assert isinstance(e["args"]["cycles"], int) and e["args"]["cycles"] >= 1
        assert e["dur"] == pytest.approx(e["args"]["cycles"] / (CLOCK_HZ / 1e6), abs=1e-5)
        assert e["ts"] >= 0
        assert threads[(e["pid"], e["tid"])] == e["cat"]
    assert sum(e["args"]["cycles"] for e in xs) == sum(e.end - e.start for e in res.trace)
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx(res.cycles / (CLOCK_HZ / 1e6), abs=1e-4)
    assert {e["name"] for e in xs} >= {"TLOAD", "TSTORE", "TEXP"}


def test_summary_and_stats(rng):
    a = rng.standard_normal((64, 64)).astype(np.float16)
    ck = mm.compile(a, a, np.zeros_like(a))
    res = ck.simulate(a, a, np.zeros_like(a))
    text = res.summary()
    assert "cycles" in text and "OK" in text and "a2a3" in text
    assert res.instructions == len(ck.program)
    assert res.stats["tasks"] == len(ck.program.tasks)
    assert res.stats["flops"] == 2 * 64 ** 3
    assert 0 < res.stats["cube_util_pct"] <= 100


# ---------------------------------------------------------------------------------------
# the timeline respects the program

@pytest.mark.parametrize("which", ["softmax_split", "softmax_row", "mm_tiles", "two_writes"])
def test_trace_has_no_races(which, rng):
    """In the simulated timeline, (a) each pipe runs one instruction at a time in program order,
    (b) instructions of a task that touch the same bytes (one writing) do not overlap in time and
    run in program order, (c) tasks that touch the same GM (one writing) do not overlap either."""
    x = rng.standard_normal((100, 300)).astype(np.float32)
    if which == "softmax_split":
        ck = softmax.compile(x, np.zeros_like(x), machine="teach")
        args = (x, np.zeros_like(x))
    elif which == "softmax_row":
        ck = softmax.compile(x, np.zeros_like(x), TM=8, TN=512, machine="teach")
        args = (x, np.zeros_like(x))
    elif which == "mm_tiles":
        @pypto.jit
        def k(a, b, out):
            pypto.set_cube_tile_shapes([32, 32], [32, 64], [32, 32])
            out[:] = pypto.relu(pypto.matmul(a, b))
        a = rng.standard_normal((100, 130)).astype(np.float16)
        b = rng.standard_normal((130, 70)).astype(np.float16)
        args = (a, b, np.zeros((100, 70), np.float16))
        ck = k.compile(*args, machine="teach")
    else:
        @pypto.jit
        def k(x, out):
            out[:] = x + 1.0
            out[0:50, :] = x[0:50, :] * 2.0
        args = (x, np.zeros_like(x))
        ck = k.compile(*args, machine="teach")
    res = ck.simulate(*args)
    assert res.ok
    when = {(e.task, e.index): e for e in res.trace}
    assert len(when) == len(res.trace) == len(ck.program)
    # (a) pipes: in order, no overlap
    lanes = {}
    for e in res.trace:
        lanes.setdefault((e.core, e.pipe), []).append(e)
    for evs in lanes.values():
        evs.sort(key=lambda e: (e.start, e.end))
        for p, q in zip(evs, evs[1:]):
            assert p.end <= q.start, (p, q)
            if p.task == q.task:
                assert p.index < q.index
    # (b) byte hazards inside a task
    spans = {}
    for t in ck.program.tasks:
        acc = [byte_accesses(i) for i in t.instrs]
        for j in range(len(t.instrs)):
            for i in range(j):
                if any(k1 == k2 and l1 < h2 and l2 < h1 and (w1 or w2)
                       for k1, l1, h1, w1 in acc[i] for k2, l2, h2, w2 in acc[j]):
                    assert when[(t.id, i)].end <= when[(t.id, j)].start, (t.id, i, j)
        evs = [when[(t.id, k)] for k in range(len(t.instrs))]
        spans[t.id] = (min(e.start for e in evs), max(e.end for e in evs), evs[0].core)
    # (c) GM hazards between tasks
    fp = {}
    for t in ck.program.tasks:
        rd = [i.srcs[0] for i in t.instrs if i.op == "TLOAD"]
        wr = [i.dst for i in t.instrs if i.op == "TSTORE"]
        fp[t.id] = (rd, wr)
    for b in ck.program.tasks:
        for a in ck.program.tasks[:b.id]:
            ra, wa = fp[a.id]
            rb, wb = fp[b.id]
            if any(p.overlaps(q) for p in wa for q in rb + wb) or any(p.overlaps(q) for p in ra for q in wb):
                assert spans[a.id][1] <= spans[b.id][0], f"tasks {a.id} and {b.id} race on GM"
    # tasks on one core do not overlap
    by_core = {}
    for tid, (s, e, core) in spans.items():
        by_core.setdefault(core, []).append((s, e))
    for iv in by_core.values():
        iv.sort()
        for p, q in zip(iv, iv[1:]):
            assert p[1] <= q[0]


def test_dispatch_waits_for_dependencies(rng):
    x = rng.standard_normal((100, 300)).astype(np.float32)
    ck = softmax.compile(x, np.zeros_like(x), machine="teach")
    res = ck.simulate(x, np.zeros_like(x))
    start, end = {}, {}
    for e in res.trace:
        start[e.task] = min(start.get(e.task, e.start), e.start)
        end[e.task] = max(end.get(e.task, e.end), e.end)
    for t in ck.program.tasks:
        for d in t.deps:
            assert start[t.id] >= end[d] + DISPATCH
    assert res.cycles == max(end.values())
