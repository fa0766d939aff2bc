"""Execution-level passes: list scheduling (`scheduling`), buffer-pressure analysis
(`buffer_pressure`) and event-id recycling in `insert_sync`."""
import dataclasses

import numpy as np
import pytest

import pypto
from pypto.compiler import PASSES, CompilerPipeline, DynamicScheduler, buffer_pressure, default_pipeline
from pypto.compiler.pipeline import PassContext
from pypto.compiler.pressure import task_pressure
from pypto.compiler.listsched import (_Stream, batch_flags, dependences, estimate_cycles, evaluate, load_latencies,
                                      schedule_task)
from pypto.compiler.sync import _sync_task, plan_flags
from pypto.ir.exec import accesses
from pypto.dtypes import DT_FP16, DT_FP32
from pypto.ir.core import Attrs
from pypto.ir.exec import SYNC_OPS, ExecGraph, ExecTask, Instr, TileRef
from pypto.ir.gm import GMBuffer, GMRef
from pypto.ir.program import Program
from pypto.target.cost import pipe_cycles
from pypto.target.machine import get_machine
from pypto.sim.timing import run_timing
from common import byte_accesses, layernorm, matmul, matmul_bias_gelu, softmax

A2 = get_machine("a2a3")
T = pypto.Tensor
OFF = {"list_scheduling": False, "loops": False}   # the streams as the scheduler saw them


def _data(rng, kind):
    """(kernel, arrays, constants) of a small case of each kernel."""
    if kind == "softmax":
        x = rng.standard_normal((256, 1024)).astype(np.float32)
        return softmax, (x, np.zeros_like(x)), {}
    if kind == "softmax_rows":
        x = rng.standard_normal((128, 1024)).astype(np.float32)
        return softmax, (x, np.zeros_like(x)), dict(TM=16, TN=1024)
    if kind == "layernorm":
        x = rng.standard_normal((128, 512)).astype(np.float32)
        w, b = rng.standard_normal(512).astype(np.float32), rng.standard_normal(512).astype(np.float32)
        return layernorm, (x, w, b, np.zeros_like(x)), {}
    if kind == "matmul":
        a = rng.standard_normal((256, 1024)).astype(np.float16)
        b = rng.standard_normal((1024, 256)).astype(np.float16)
        return matmul, (a, b, np.zeros((256, 256), np.float16)), {}
    a = rng.standard_normal((256, 512)).astype(np.float16)
    b = rng.standard_normal((512, 256)).astype(np.float16)
    bias = rng.standard_normal(256).astype(np.float16)
    return matmul_bias_gelu, (a, b, bias, np.zeros((256, 256), np.float16)), {}


KINDS = ["softmax", "softmax_rows", "layernorm", "matmul", "matmul_bias_gelu"]


def _unsynced(g: ExecGraph) -> ExecGraph:
    """The graph with its sync instructions removed: the order the scheduler saw."""
    return g.replace(ExecTask(t.id, t.group, t.core_type, t.deps, t.level,
                              tuple(i for i in t.instrs if i.op not in SYNC_OPS), t.pair) for t in g.tasks)


def _happens_before_violations(instrs) -> list[tuple[int, int]]:
    """Pairs (i, j), i before j in the stream on different pipes, touching overlapping bytes (one
    writing), that the stream's flags do not order (vector clocks over SET_FLAG -> WAIT_FLAG)."""
    clock: dict[str, dict] = {}
    pending: dict[tuple, list] = {}
    seen: list[tuple[int, str, dict]] = []       # (index, pipe, clock before it)
    bad = []
    for k, ins in enumerate(instrs):
        p = ins.pipe
        c = clock.setdefault(p, {})
        if ins.op == "SET_FLAG":
            a = ins.attrs
            pending.setdefault((a["src"], a["dst"], a["event"]), []).append(dict(c))
            continue
        if ins.op == "WAIT_FLAG":
            a = ins.attrs
            for q, v in pending[(a["src"], a["dst"], a["event"])].pop(0).items():
                c[q] = max(c.get(q, -1), v)
            continue
        acc = byte_accesses(ins)
        for j, pj, cj in seen:
            if pj == p or c.get(pj, -1) >= j:
                continue
            for s1, lo1, hi1, w1 in byte_accesses(instrs[j]):
                if any(s1 == s2 and lo1 < hi2 and lo2 < hi1 and (w1 or w2) for s2, lo2, hi2, w2 in acc):
                    bad.append((j, k))
                    break
        seen.append((k, p, dict(c)))
        c[p] = k
    return bad


# --- list scheduling: values --------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_scheduled_programs_give_bit_identical_outputs(kind, rng):
    kernel, args, consts = _data(rng, kind)
    base = kernel.compile(*args, options=OFF, **consts)
    ck = kernel.compile(*args, **consts)
    r0, r1 = base.simulate(*args), ck.simulate(*args, checked=True)     # checked: races, event reuse
    assert r0.ok and r1.ok                                              # both match the numpy reference
    for name, v in r0.outputs.items():
        assert v.tobytes() == r1.outputs[name].tobytes(), f"{kind}: output {name} differs"
    # the scheduler did change something somewhere (else this test would prove nothing)
    if kind in ("matmul", "matmul_bias_gelu"):
        assert any(t0.instrs != t1.instrs for t0, t1 in zip(_unsynced(base.exec_graph).tasks,
                                                             _unsynced(ck.exec_graph).tasks))


@pytest.mark.parametrize("kind", KINDS)
def test_the_scheduled_order_keeps_every_dependence(kind, rng):
    kernel, args, consts = _data(rng, kind)
    ck = kernel.compile(*args, options=OFF, **consts)
    # (each position its own object, so that where an instruction went is its identity's:
    # select shares equal instructions)
    before = _unsynced(ck.exec_graph)
    before = before.replace(ExecTask(t.id, t.group, t.core_type, t.deps, t.level,
                                     tuple(dataclasses.replace(i) for i in t.instrs), t.pair) for t in before.tasks)
    after = DynamicScheduler().apply(before, PassContext(ck.machine))
    moved = 0
    done_shapes = set()
    for t0, t1 in zip(before.tasks, after.tasks):
        shape = (t0.group, len(t0.instrs))
        if shape in done_shapes:
            continue
        done_shapes.add(shape)
        pos = {id(ins): k for k, ins in enumerate(t1.instrs)}
        assert sorted(pos.values()) == list(range(len(t0.instrs))) and len(pos) == len(t0.instrs)
        moved += any(ins is not t1.instrs[k] for k, ins in enumerate(t0.instrs))
        acc = [byte_accesses(i) for i in t0.instrs]
        for j in range(len(t0.instrs)):
            for i in range(j):
                if any(s1 == s2 and lo1 < hi2 and lo2 < hi1 and (w1 or w2)
                       for s1, lo1, hi1, w1 in acc[i] for s2, lo2, hi2, w2 in acc[j]):
                    assert pos[id(t0.instrs[i])] < pos[id(t0.instrs[j])], \
                        f"task {t0.id}: {t0.instrs[i].text()} now after {t0.instrs[j].text()}"
    if kind in ("matmul", "matmul_bias_gelu"):
        assert moved
    # and in the final program every conflicting pair on two pipes is ordered by flags; the flags
    # insert_sync shares between isomorphic tasks are the ones each task gets on its own
    final = kernel.compile(*args, **consts).exec_graph
    for t, t1 in zip(final.tasks, _unsynced(final).tasks):
        assert _happens_before_violations(t.instrs) == [], f"task {t.id}"
        assert [i.text() for i in t.instrs if not i.op.startswith("CROSS_")] == \
            [i.text() for i in _sync_task(t1.instrs)]           # (cross-core flags come later)


def test_dependences_of_a_small_stream():
    ub = lambda addr: TileRef("UB", addr, DT_FP32, (8, 64), (8, 64))    # noqa: E731
    buf = GMBuffer("x", (8, 64), DT_FP32, "inout")
    g = GMRef.whole(buf)
    s = [Instr("TLOAD", "MTE2", ub(0), (g,)),                  # 0
         Instr("TEXP", "V", ub(0x800), (ub(0),)),              # 1 reads 0
         Instr("TLOAD", "MTE2", ub(0), (g,)),                  # 2 overwrites what 1 reads, reads GM 4 wrote
         Instr("TADD", "V", ub(0x800), (ub(0x800), ub(0))),    # 3 in place
         Instr("TSTORE", "MTE3", g, (ub(0x800),))]             # 4 writes GM the loads read
    assert dependences(s) == [{}, {0: True}, {1: False, 0: True}, {1: True, 2: True}, {0: False, 2: False, 3: True}]


# --- list scheduling: cycles ---------------------------------------------------------------------
N = 1024
BENCH = {
    "softmax 64x256": (softmax, (T([N, N], DT_FP32),) * 2, dict(TM=64, TN=256)),
    "softmax 16x1024": (softmax, (T([N, N], DT_FP32),) * 2, dict(TM=16, TN=1024)),
    "layernorm 64x256": (layernorm, (T([N, N], DT_FP32), T([N], DT_FP32), T([N], DT_FP32), T([N, N], DT_FP32)),
                         dict(TM=64, TN=256)),
    "layernorm 16x1024": (layernorm, (T([N, N], DT_FP32), T([N], DT_FP32), T([N], DT_FP32),
                                      T([N, N], DT_FP32)), dict(TM=16, TN=1024)),
    "matmul fp16 1024^3": (matmul, (T([N, N], DT_FP16),) * 3, {}),
    "matmul+bias+gelu fp16 1024^3": (matmul_bias_gelu, (T([N, N], DT_FP16), T([N, N], DT_FP16), T([N], DT_FP16),
                                                        T([N, N], DT_FP16)), {}),
}


def _cycles(kernel, specs, consts, options=None):
    ck = kernel.compile(*specs, options=options, **consts)
    return pypto.sim.simulate(ck.program, machine=ck.machine, mode="timing", trace=False, progress=False).cycles


@pytest.mark.parametrize("name", list(BENCH))
def test_the_scheduler_never_makes_a_kernel_slower(name):
    kernel, specs, consts = BENCH[name]
    # a matmul reloading every operand chunk (no L1 reuse) is MTE2-bound: flag batching's case
    base = {"l1_reuse": False} if name.startswith("matmul") else {}
    identity = _cycles(kernel, specs, consts, {**base, **OFF})
    scheduled = _cycles(kernel, specs, consts, base)
    assert scheduled <= identity
    if name.startswith("matmul"):
        # one SET_FLAG per pair of operand loads: the MTE2-bound loop stalls half as often
        assert scheduled <= 0.985 * identity, (scheduled, identity)


def _tiny_matmul(order=(0, 1, 2, 3, 4, 5)):
    """LA, LB (GM->L1), XA (L1->L0A), XB (L1->L0B), MM, ST (L0C->GM), in `order`."""
    a = GMBuffer("a", (64, 64), DT_FP16, "input")
    b = GMBuffer("b", (64, 64), DT_FP16, "input")
    c = GMBuffer("c", (64, 64), DT_FP32, "output")
    t = lambda space, addr, dt=DT_FP16: TileRef(space, addr, dt, (64, 64), (64, 64))    # noqa: E731
    ins = [Instr("TLOAD", "MTE2", t("L1", 0), (GMRef.whole(a),)),
           Instr("TLOAD", "MTE2", t("L1", 0x2000), (GMRef.whole(b),)),
           Instr("TEXTRACT", "MTE1", t("L0A", 0), (t("L1", 0),), Attrs({"offsets": (0, 0)})),
           Instr("TEXTRACT", "MTE1", t("L0B", 0), (t("L1", 0x2000),), Attrs({"offsets": (0, 0)})),
           Instr("TMATMUL", "M", t("L0C", 0, DT_FP32), (t("L0A", 0), t("L0B", 0))),
           Instr("TSTORE", "FIX", GMRef.whole(c), (t("L0C", 0, DT_FP32),))]
    return (a, b, c), tuple(ins[k] for k in order)


def test_estimates_and_flag_batching_exactly():
    bufs, s = _tiny_matmul()
    la, lb, xa, xb, mm, st = (pipe_cycles(i, A2) for i in s)      # a load: its pipe time, latency after
    L = A2.l2_hit_cycles + A2.l2_miss_extra_cycles            # both loads touch their windows first
    lat = (L, L, 0, 0, 0, 0)
    # original order: a flag after each load; MTE2 stalls L after each (SET_FLAG waits for the data)
    e1 = la + L + 1 + lb + L + 1
    w1 = max(la + L + 2 + xa, e1)
    original = w1 + 1 + xb + 1 + 1 + mm + 1 + 1 + st
    # batched: XB before XA, so one flag after LB covers both loads
    e = la + lb + L + 1
    batched = e + 1 + xb + xa + 1 + 1 + mm + 1 + 1 + st
    assert original - batched == L + 1 - xa > 0
    st_ = _Stream(s, A2, lat)
    assert evaluate(list(range(6)), st_, A2) == original
    assert batch_flags(range(6), st_) == [0, 1, 3, 2, 4, 5]
    assert evaluate([0, 1, 3, 2, 4, 5], st_, A2) == batched
    # the estimate of a synced stream is the timing engine's, one task alone on a core
    for order in ((0, 1, 2, 3, 4, 5), (0, 1, 3, 2, 4, 5)):
        _, o = _tiny_matmul(order)
        synced = _sync_task(o)
        lat_o = [L if i.op == "TLOAD" else 0 for i in synced]
        prog = Program("tiny", bufs, (ExecTask(0, 0, "AIC", (), 0, synced),))
        assert run_timing(prog, A2, trace=False)["cycles"] == A2.dispatch_cycles + estimate_cycles(synced, A2, lat_o)
    assert estimate_cycles(_sync_task(s), A2, [L if i.op == "TLOAD" else 0 for i in _sync_task(s)]) == original
    # schedule_task keeps the best candidate, deterministic and cached by shape
    res = schedule_task(s, A2, {}, lat)
    assert res.before == original and res.after <= batched and res.reordered
    assert res.instrs.index(s[3]) < res.instrs.index(s[2])
    assert schedule_task(s, A2, {}, lat) == res
    # a stream that already holds flags is left alone
    synced = _sync_task(s)
    assert schedule_task(synced, A2).instrs == synced and not schedule_task(synced, A2).reordered


def test_a_long_stream_is_scheduled_tile_by_tile(monkeypatch):
    from pypto.compiler import listsched
    _, s = _tiny_matmul()
    L = A2.l2_hit_cycles + A2.l2_miss_extra_cycles
    tile_lat = (L, L, 0, 0, 0, 0)
    one = schedule_task(s, A2, {}, tile_lat)
    assert one.how == "original+batched"
    # three tiles in a row (each ending with its store): above REGION_MIN each tile is decided on
    # its own, alike tiles share that decision, and the tiles keep their order
    monkeypatch.setattr(listsched, "REGION_MIN", 10)
    three = s * 3
    cache = {}
    res = schedule_task(three, A2, cache, tile_lat * 3)
    assert res.instrs == one.instrs * 3
    assert res.how == "by tile (3 of 3 reordered)" and res.before is None and res.shape is not None
    assert len(cache) == 2                  # the tile's decision and the stream's
    perm = [6 * t + k for t in range(3) for k in (0, 1, 3, 2, 4, 5)]
    assert res.instrs == tuple(three[k] for k in perm) and _Stream(three, A2).valid(perm)
    assert schedule_task(three, A2, cache, tile_lat * 3) == res      # (cached whole)
    # one region (no store before the end): the whole stream, as below REGION_MIN
    assert schedule_task(s, A2, {}, tile_lat).how == "original+batched"


@pytest.mark.parametrize("kind", KINDS)
def test_tile_by_tile_scheduling_gives_bit_identical_outputs(kind, rng, monkeypatch):
    from pypto.compiler import listsched
    monkeypatch.setattr(listsched, "REGION_MIN", 40)        # (every task here is tile by tile)
    kernel, args, consts = _data(rng, kind)
    base = kernel.compile(*args, options=OFF, **consts)
    ck = kernel.compile(*args, options={"loops": False}, **consts)
    r0, r1 = base.simulate(*args), ck.simulate(*args, checked=True)     # checked: races, event reuse
    assert r0.ok and r1.ok
    for name, v in r0.outputs.items():
        assert v.tobytes() == r1.outputs[name].tobytes(), f"{kind}: output {name} differs"
    for t in ck.exec_graph.tasks:
        assert _happens_before_violations(t.instrs) == [], f"task {t.id}"
    if kind in ("matmul", "matmul_bias_gelu"):  # (the scheduler did reorder tiles)
        assert any(t0.instrs != t1.instrs for t0, t1 in zip(_unsynced(base.exec_graph).tasks,
                                                             _unsynced(ck.exec_graph).tasks))


def test_load_latencies_predict_l2_hits():
    bufs, s = _tiny_matmul()
    again = Instr("TLOAD", "MTE2", s[0].dst, s[0].srcs)      # the window of a again: an L2 hit
    g = ExecGraph("t", bufs, (ExecTask(0, 0, "AIC", (), 0, s), ExecTask(1, 0, "AIC", (), 0, (again,))))
    miss = A2.l2_hit_cycles + A2.l2_miss_extra_cycles
    assert load_latencies(g, A2) == [(miss, miss, 0, 0, 0, 0), (A2.l2_hit_cycles,)]


def test_list_scheduling_can_be_switched_off_and_is_deterministic(rng):
    kernel, args, consts = _data(rng, "matmul")
    off = kernel.compile(*args, options=OFF, **consts)
    on = kernel.compile(*args, **consts)
    select = {r.name: r for r in on.pass_log}
    names = [r.name for r in on.pass_log]
    assert names.index("select") < names.index("scheduling") < names.index("insert_sync") \
        < names.index("buffer_pressure") < names.index("codegen")
    assert select["scheduling"].level == "exec" and PASSES["scheduling"].doc
    unscheduled = CompilerPipeline().remove("scheduling").compile(kernel, *args, **consts)
    assert off.program.text() == unscheduled.program.text()
    assert on.program.text() != off.program.text()
    kernel._cache.clear()
    assert kernel.compile(*args, **consts).program.text() == on.program.text()


# --- event ids -----------------------------------------------------------------------------------
def test_event_ids_stay_in_range_on_a_long_matmul(rng):
    """128 matmul steps (K = 8192) in one task: hundreds of flags per pipe pair, ids recycled."""
    a = rng.standard_normal((128, 8192)).astype(np.float16)
    b = rng.standard_normal((8192, 128)).astype(np.float16)
    c = np.zeros((128, 128), np.float16)
    ck = matmul.compile(a, b, c)
    syncs = [i for t in ck.program.tasks for i in t.instrs if i.op in ("SET_FLAG", "WAIT_FLAG")]
    assert len(syncs) > 500
    assert {i.attrs["event"] for i in syncs} == set(range(8))
    res = pypto.sim.simulate(ck.program, a, b, c, machine=ck.machine, check=True)   # raises on reuse
    want = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(res.outputs["c"].astype(np.float32), want, rtol=2e-2, atol=0.5)


def _run_ahead(n=12):
    """A big vector op, then n small loads into distinct buffers: MTE2 sets n flags before V
    waits for the first of them (more than 8 pending if ids were simply taken in turn)."""
    big = GMBuffer("big", (32, 1024), DT_FP32, "input")
    xs = GMBuffer("xs", (n, 8, 64), DT_FP32, "input")
    out = GMBuffer("out", (8, 64), DT_FP32, "output")
    ub = lambda addr, shape: TileRef("UB", addr, DT_FP32, shape, shape)    # noqa: E731
    tb = ub(0, (32, 1024))
    s = [Instr("TLOAD", "MTE2", tb, (GMRef.whole(big),))] + [Instr("TEXP", "V", tb, (tb,))] * 3
    tiles = [ub(0x21000 + k * 0x800, (8, 64)) for k in range(n)]
    s += [Instr("TLOAD", "MTE2", t, (GMRef(xs, k * 512, (8, 64), (64, 1)),)) for k, t in enumerate(tiles)]
    acc = ub(0x20000, (8, 64))
    s.append(Instr("TADD", "V", acc, (tiles[0], tiles[1])))
    s += [Instr("TADD", "V", acc, (acc, t)) for t in tiles[2:]]
    s.append(Instr("TSTORE", "MTE3", GMRef.whole(out), (acc,)))
    return (big, xs, out), tuple(s)


def test_event_ids_are_not_reused_while_pending():
    bufs, s = _run_ahead()
    written = {"out"}
    before, after, flags = plan_flags([i.pipe for i in s], [accesses(i, written) for i in s])
    # ids ran out for MTE2 -> V: V signalled MTE2 once (V -> MTE2) before the ninth flag
    back = [op for ops in before.values() for op in ops if op[0] == "SET_FLAG"]
    assert ("SET_FLAG", "V", ("V", "MTE2", 0)) in back
    synced = _sync_task(s)
    assert all(0 <= i.attrs["event"] < 8 for i in synced if i.op in ("SET_FLAG", "WAIT_FLAG"))
    assert _happens_before_violations(synced) == []
    prog = Program("run_ahead", bufs, (ExecTask(0, 0, "AIV", (), 0, synced),))
    rng = np.random.default_rng(0)
    big = rng.random((32, 1024), dtype=np.float32) * 0.01
    xs = rng.random((12, 8, 64), dtype=np.float32)
    res = pypto.sim.simulate(prog, big, xs, np.zeros((8, 64), np.float32), check=True)    # no reuse, no race
    np.testing.assert_allclose(res.outputs["out"], xs.sum(0), rtol=1e-5)


def test_random_streams_get_correct_flags(rng):
    """Random AIV streams over UB slots: flags order every conflict, ids are never reused while
    pending (the checked timing run) and nothing deadlocks, for the streams as generated and as
    scheduled.  Half of them let MTE2 run ahead (loads into fresh slots behind a long vector op)."""
    x = GMBuffer("x", (64, 8, 256), DT_FP32, "input")
    y = GMBuffer("y", (64, 8, 256), DT_FP32, "output")
    slots = [TileRef("UB", k * 0x2000, DT_FP32, (8, 256), (8, 256)) for k in range(24)]
    fallbacks = 0
    for trial in range(40):
        run_ahead = trial % 2 == 1
        s = [Instr("TLOAD", "MTE2", slots[0], (GMRef(x, 0, (8, 256), (256, 1)),))]
        if run_ahead:
            s += [Instr("TEXP", "V", slots[0], (slots[0],))] * 6
        fresh, unread = 1, []
        for k in range(80):
            r = rng.random()
            if run_ahead and r < 0.85:      # loads into the next slot; V reads them in order
                if r < 0.5 or not unread:
                    slot = slots[1 + fresh % 23]
                    fresh += 1
                    unread.append(slot)
                    s.append(Instr("TLOAD", "MTE2", slot, (GMRef(x, int(rng.integers(64)) * 2048, (8, 256),
                                                                   (256, 1)),)))
                else:
                    s.append(Instr("TADD", "V", slots[0], (slots[0], unread.pop(0))))
            elif r < 0.45:
                s.append(Instr("TLOAD", "MTE2", slots[rng.integers(24)],
                               (GMRef(x, int(rng.integers(64)) * 2048, (8, 256), (256, 1)),)))
            elif r < 0.85:
                a, b, d = (slots[i] for i in rng.integers(24, size=3))
                if rng.random() < 0.5:
                    s.append(Instr("TEXP", "V", d, (a,)))
                else:
                    s.append(Instr("TADD", "V", d, (a, b)))
            else:
                s.append(Instr("TSTORE", "MTE3", GMRef(y, int(rng.integers(64)) * 2048, (8, 256), (256, 1)),
                               (slots[rng.integers(24)],)))
        s = tuple(s)
        before, _, _ = plan_flags([i.pipe for i in s], [accesses(i, {"y"}) for i in s])
        fallbacks += any(op[0] == "SET_FLAG" for ops in before.values() for op in ops)
        for order in (s, schedule_task(s, A2).instrs):
            synced = _sync_task(order)
            assert _happens_before_violations(synced) == [], trial
            assert all(0 <= i.attrs["event"] < 8 for i in synced if i.op in ("SET_FLAG", "WAIT_FLAG"))
            prog = Program("r", (x, y), (ExecTask(0, 0, "AIV", (), 0, synced),))
            run_timing(prog, A2, trace=False, checked=True, record_times=True)   # raises on reuse or deadlock
    assert fallbacks > 0                   # some streams did exhaust the ids of a pipe pair


# --- buffer pressure -----------------------------------------------------------------------------
def _hand_task():
    """x (16x64 fp32, 4096 B) and its row max m (16x1, rows padded to 32 B: 512 B) loaded,
    y = x - m into a third tile, then exp(y) back into x's bytes, stored."""
    x = GMBuffer("x", (16, 64), DT_FP32, "input")
    mx = GMBuffer("m", (16, 1), DT_FP32, "input")
    out = GMBuffer("out", (16, 64), DT_FP32, "output")
    t = TileRef("UB", 0, DT_FP32, (16, 64), (16, 64))
    m = TileRef("UB", 0x1000, DT_FP32, (16, 1), (16, 1))
    y = TileRef("UB", 0x2000, DT_FP32, (16, 64), (16, 64))
    s = (Instr("TLOAD", "MTE2", t, (GMRef.whole(x),)),
         Instr("TLOAD", "MTE2", m, (GMRef.whole(mx),)),
         Instr("TROWEXPANDSUB", "V", y, (t, m)),
         Instr("TEXP", "V", t, (y,)),
         Instr("TSTORE", "MTE3", GMRef.whole(out), (t,)))
    return (x, mx, out), s


def test_pressure_of_a_hand_made_task():
    bufs, s = _hand_task()
    assert (s[0].dst.nbytes, s[1].dst.nbytes) == (4096, 512)
    # live bytes per instruction: 4096, 4096+512, x+m+y = 8704, y+exp(y) = 8192, 4096
    assert task_pressure(s) == {"UB": (8704, 2, 3)}
    synced = _sync_task(s)
    peak, at, tiles = task_pressure(synced)["UB"]
    assert (peak, tiles) == (8704, 3) and synced[at] is s[2]
    g = ExecGraph("hand", bufs, (ExecTask(0, 0, "AIV", (), 0, synced),))
    rows = buffer_pressure(g, "a2a3")
    assert rows == [(0, 0, "AIV", "UB", 8704, 192 * 1024, at, 3)]
    assert rows[0].share == pytest.approx(8704 / (192 * 1024))
    assert buffer_pressure(g, A2) is rows                             # computed once per graph and machine
    text = rows.text()
    assert "UB" in text and "8704" in text and "4.4%" in text
    assert rows.text(per_task=True).splitlines()[1].split()[:5] == ["0", "AIV", "UB", "8704", "196608"]


def test_in_place_accumulation_counts_once():
    bufs, s = _tiny_matmul()
    acc = Instr("TMATMUL_ACC", "M", s[4].dst, (s[4].dst, s[2].dst, s[3].dst))
    found = task_pressure(s[:5] + (acc, s[5]))
    assert found["L0C"] == (64 * 64 * 4, 4, 1)                     # one 16 KiB accumulator, never two
    assert found["L1"] == (2 * 8192, 1, 2) and found["L0A"][0] == found["L0B"][0] == 8192


def _brute_pressure(instrs):
    """Peak live bytes per space from 32-byte granules (an independent count): a granule is live
    at instruction k when k writes it, or when a later-or-equal instruction reads it before the
    next write after k (an instruction reads before it writes)."""
    real = [(k, ins) for k, ins in enumerate(instrs) if ins.op not in SYNC_OPS]

    def granules(o):
        return {(o.space, g) for g in range(o.addr // 32, (o.addr + o.nbytes) // 32)} if isinstance(o, TileRef) \
            else set()

    reads = [set().union(*(granules(o) for o in ins.srcs)) for _, ins in real]
    writes = [granules(ins.dst) for _, ins in real]
    peak: dict = {}
    for k in range(len(real)):
        live = set(writes[k])
        for key in set().union(*reads[k:]):
            for j in range(k, len(real)):
                if key in reads[j]:
                    live.add(key)
                    break
                if key in writes[j]:
                    break
        for space in {sp for sp, _ in live}:
            peak[space] = max(peak.get(space, 0), 32 * sum(1 for sp, _ in live if sp == space))
    return peak


def test_pressure_of_a_compiled_single_tile_kernel(rng):
    @pypto.jit
    def k(x, out):
        pypto.set_vec_tile_shapes(16, 128)
        out[:] = pypto.exp(x - pypto.amax(x, dim=-1, keepdim=True)) * 2.0

    x = rng.standard_normal((16, 128)).astype(np.float32)
    ck = k.compile(x, np.zeros_like(x))
    rows = buffer_pressure(ck.exec_graph, ck.machine)
    assert len(ck.exec_graph.tasks) == len(rows) >= 1
    for t in ck.exec_graph.tasks:
        want = _brute_pressure(t.instrs)
        got = {r.space: r.peak for r in rows if r.task == t.id}
        assert got == want, t.id
    assert {r.space for r in rows} == {"UB"} and all(r.capacity == 192 * 1024 for r in rows)


def test_pressure_over_capacity_is_an_error():
    big = GMBuffer("big", (256, 256), DT_FP32, "input")
    out = GMBuffer("out", (256, 256), DT_FP32, "output")
    t0 = TileRef("UB", 0, DT_FP32, (128, 256), (128, 256))            # 128 KiB each, 256 KiB together
    t1 = TileRef("UB", 0x20000, DT_FP32, (128, 256), (128, 256))
    s = (Instr("TLOAD", "MTE2", t0, (GMRef.whole(big),)), Instr("TLOAD", "MTE2", t1, (GMRef.whole(big),)),
         Instr("TADD", "V", t0, (t0, t1)), Instr("TSTORE", "MTE3", GMRef.whole(out), (t0,)))
    g = ExecGraph("over", (big, out), (ExecTask(7, 0, "AIV", (), 0, _sync_task(s)),))
    with pytest.raises(pypto.VerificationError) as ei:
        buffer_pressure(g, A2)
    msg = str(ei.value)
    assert "task 7" in msg and "UB" in msg and "262144 bytes" in msg and "196608" in msg
    with pytest.raises(pypto.VerificationError, match="task 7"):        # the pass reports it too
        PASSES["buffer_pressure"](g, PassContext(A2))
    ok = ExecGraph("ok", (big, out), (ExecTask(7, 0, "AIV", (), 0, _sync_task(s[:1] + s[3:])),))
    assert PASSES["buffer_pressure"](ok, PassContext(A2)) is ok        # an analysis: the graph is unchanged
    assert buffer_pressure(ok, A2)[0].peak == 128 * 1024 and buffer_pressure(ok, get_machine("a5"))[0].share == 0.5


def test_pressure_table_of_a_matmul(rng):
    kernel, args, consts = _data(rng, "matmul")
    ck = kernel.compile(*args, **consts)
    rows = buffer_pressure(ck.exec_graph, ck.machine)
    assert {r.space for r in rows} == {"L1", "L0A", "L0B", "L0C"}
    by = rows.by_task()[0]
    assert by["L0C"].peak == 128 * 128 * 4 and by["L0C"].capacity == 128 * 1024
    assert all(r.peak <= r.capacity for r in rows) and rows.peak("L1") >= 2 * 128 * 256 * 2
    # shared between isomorphic tasks, the rows are each task's own
    for t in ck.exec_graph.tasks:
        assert {sp: (v[0], v[1], v[2]) for sp, v in task_pressure(t.instrs).items()} == \
            {r.space: (r.peak, r.at, r.tiles) for r in rows if r.task == t.id}
    assert "buffer_pressure" in default_pipeline().names


def test_shared_flags_need_the_very_same_stream():
    """insert_sync shares one flag plan between streams the scheduler found isomorphic; an entry
    of that side table for another object (e.g. a stale id) is not used."""
    from pypto.compiler.sync import insert_sync
    from pypto.ir.exec import STREAM_SHAPES
    kernel, specs, consts = BENCH["matmul fp16 1024^3"]
    ck = kernel.compile(*specs, **consts)
    plain = _unsynced(ck.exec_graph)
    want = [[i.text() for i in _sync_task(t.instrs)] for t in plain.tasks]
    scheduled = DynamicScheduler().apply(plain, PassContext(ck.machine))
    assert len({e[1] for e in scheduled.__dict__[STREAM_SHAPES].values()}) < len(scheduled.tasks)   # shared
    other = _unsynced(ck.exec_graph)
    for g in (other, scheduled):
        if g is other:      # a table whose ids point at streams of another graph, shapes all alike
            g.__dict__[STREAM_SHAPES] = {id(t.instrs): (u.instrs, 0) for t, u in zip(g.tasks, plain.tasks)}
        got = insert_sync(g)
        assert [[i.text() for i in t.instrs] for t in got.tasks] == \
            [[i.text() for i in _sync_task(t.instrs)] for t in g.tasks]
    assert [[i.text() for i in t.instrs] for t in insert_sync(other).tasks] == want
