"""The flag planner region by region (`sync.plan_regions`, `sync.region_layout`): a region met in a
canonical state met before takes the plan made then.  Against the plain planner (`plan_flags`,
`_synced`), which it must equal exactly, on compiled streams and on random long streams built to
reach every rule of the canonical state: run-ahead loads that use up a pipe pair's event ids
(flags back), GM buffers only written (left out of the state) and written then read (kept in it),
regions that repeat and regions that break the repetition."""
import numpy as np
import pytest

import pypto
from pypto.compiler import sync
from pypto.compiler.sync import (FlagPlanner, RegionCache, _synced, plan_flags, plan_regions, region_layout,
                                 stream_facts)
from pypto.dtypes import DT_FP16, DT_FP32
from pypto.ir.exec import SYNC_OPS, Instr, TileRef, stream_accesses
from pypto.ir.gm import GMBuffer, GMRef
from common import layernorm, matmul

T = pypto.Tensor


def _bounds(instrs):
    """The regions `region_layout` cuts a stream into: each ends at a GM store."""
    ends = [k + 1 for k, i in enumerate(instrs) if i.op == "TSTORE"]
    if not ends or ends[-1] != len(instrs):
        ends.append(len(instrs))
    return list(zip([0] + ends[:-1], ends))


def _random_stream(rng, read_back: bool, regions: int = 24):
    """A vector task's stream of `regions` row blocks, most of them copies of one random block of
    loads, vector ops and a store (GM windows moving from block to block), some of another: run
    ahead loads into fresh slots behind a long vector op use up the MTE2 -> V event ids.
    `read_back`: a block also loads what an earlier block stored (the output is read and
    written: kept in the canonical state)."""
    x = GMBuffer("x", (64, 8, 256), DT_FP32, "input")
    y = GMBuffer("y", (64, 8, 256), DT_FP32, "output")
    slots = [TileRef("UB", k * 0x2000, DT_FP32, (8, 256), (8, 256)) for k in range(24)]

    def block(seed: int, row: int) -> list:
        r = np.random.default_rng(seed)
        s = [Instr("TLOAD", "MTE2", slots[0], (GMRef(x, row * 2048, (8, 256), (256, 1)),))]
        s += [Instr("TEXP", "V", slots[0], (slots[0],))] * int(r.integers(1, 6))
        unread = []
        if r.random() < 0.5:        # 12 loads, then their 12 adds: more than 8 flags MTE2 -> V pending
            for k in range(12):
                s.append(Instr("TLOAD", "MTE2", slots[1 + k], (GMRef(x, int(r.integers(64)) * 2048, (8, 256),
                                                                      (256, 1)),)))
            s += [Instr("TADD", "V", slots[0], (slots[0], slots[1 + k])) for k in range(12)]
        for k in range(int(r.integers(6, 30))):
            u = r.random()
            if u < 0.4 or not unread:
                slot = slots[1 + k % 20]
                unread.append(slot)
                s.append(Instr("TLOAD", "MTE2", slot, (GMRef(x, int(r.integers(64)) * 2048, (8, 256), (256, 1)),)))
            elif u < 0.8:
                s.append(Instr("TADD", "V", slots[0], (slots[0], unread.pop(0))))
            else:
                a, d = (slots[i] for i in r.integers(21, 24, size=2))
                s.append(Instr("TEXP", "V", d, (a,)))
        if read_back and row > 0:
            s.append(Instr("TLOAD", "MTE2", slots[23], (GMRef(y, (row - 1) * 2048, (8, 256), (256, 1)),)))
            s.append(Instr("TADD", "V", slots[0], (slots[0], slots[23])))
        s.append(Instr("TSTORE", "MTE3", GMRef(y, row * 2048, (8, 256), (256, 1)), (slots[0],)))
        return s
    first, other = (int(v) for v in rng.integers(1 << 30, size=2))
    breaks = set(rng.choice(np.arange(2, regions), size=3, replace=False).tolist())
    out = []
    for row in range(regions):
        out += block(other if row in breaks else first, row)
    return tuple(out)


def _compiled_streams():
    """Long unsynced streams of compiled kernels: a matmul's tasks (output tiles, K serpentine) and
    a layernorm's (row blocks); `loops` off, so that `t.instrs` is the stream as planned."""
    out = []
    for kernel, specs, consts in [
            (matmul, (T([2048, 1024], DT_FP16), T([1024, 2048], DT_FP16), T([2048, 2048], DT_FP16)), {}),
            (layernorm, (T([8192, 1024], DT_FP32), T([1024], DT_FP32), T([1024], DT_FP32), T([8192, 1024], DT_FP32)),
             dict(TM=8, TN=1024))]:
        ck = kernel.compile(*specs, **consts, options={"loops": False}, snapshots=True)
        g = dict(ck.snapshots)["scheduling"]
        out += [t.instrs for t in g.tasks[:4]]
    return out


@pytest.mark.parametrize("kind", ["compiled", "random", "read_back"])
def test_region_layout_is_the_plain_flagged_stream(kind, rng):
    streams = _compiled_streams() if kind == "compiled" else \
        [_random_stream(rng, kind == "read_back") for _ in range(12)]
    cache = RegionCache()           # (shared by the streams, as in a pass)
    regions = 0
    for instrs in streams:
        flags, gather = region_layout(instrs, cache)
        got = instrs if gather is None else gather(instrs + flags)
        assert got == _synced(instrs)[0]
        regions += len(_bounds(instrs))
    if kind == "compiled":          # (tasks of one kernel: most of their regions repeat a state)
        assert regions - len(cache.memo) > regions // 2, (len(cache.memo), regions)


def test_a_state_put_back_plans_what_the_planner_would(rng):
    """The canonical state of every cut, put back into a planner that forgot everything else
    (snapshots of instructions that are not live producers are gone), plans the rest as the plain
    planner: what `canon` leaves out cannot change a flag."""
    for instrs in [_random_stream(rng, read_back) for read_back in (False, True)] + _compiled_streams()[:2]:
        pipes = [i.pipe for i in instrs]
        acc = stream_accesses(instrs)
        bounds = _bounds(instrs)
        _, skip, users = stream_facts(pipes, acc, bounds, {})
        p = FlagPlanner(pipes, acc)
        for lo, hi in bounds:
            state = p.canon(lo, skip, users)
            p.snap = [None] * len(pipes)
            p.load(state, lo, p.next_ids())
            p.run(lo, hi)
        assert (p.before, p.after_of(), p.flags) == plan_flags(pipes, acc)


def test_plans_of_regions_met_in_the_same_state_are_shared(rng):
    """A region whose plan is taken from the memo adds no plan: a stream of copies of one block is
    planned in a few regions, however long it is; the plans are exact (equal to plan_flags')."""
    instrs = _random_stream(rng, False, regions=40)
    pipes = [i.pipe for i in instrs]
    acc = stream_accesses(instrs)
    bounds = _bounds(instrs)
    memo, interned = {}, {}
    sigs, skip, users = stream_facts(pipes, acc, bounds, interned)
    assert skip == {"GM:y"}
    records = plan_regions(pipes, acc, bounds, sigs, memo, skip, users)
    assert len(records) == 40 and len(memo) < 20
    # a second stream of the same blocks plans nothing new
    plan_regions(pipes, acc, bounds, sigs, memo, skip, users)
    assert len(memo) == len({id(r[0]) for r in records})


def test_insert_sync_plans_long_streams_by_region(monkeypatch):
    """The pass takes the region path for streams longer than REGION_PLAN_MIN: the same program
    as with every stream planned whole."""
    specs = (T([2048, 4096], DT_FP16), T([4096, 2048], DT_FP16), T([2048, 2048], DT_FP16))
    matmul.cache_clear()
    ck = matmul.compile(*specs, options={"loops": False})
    assert max(sum(i.op not in SYNC_OPS for i in t.instrs) for t in ck.program.tasks) > sync.REGION_PLAN_MIN
    calls = []
    real = sync.region_layout
    monkeypatch.setattr(sync, "region_layout", lambda *a: calls.append(1) or real(*a))
    matmul.cache_clear()
    ck = matmul.compile(*specs, options={"loops": False})
    assert calls
    monkeypatch.setattr(sync, "REGION_PLAN_MIN", 1 << 30)
    matmul.cache_clear()
    whole = matmul.compile(*specs, options={"loops": False})
    assert [t.instrs for t in ck.program.tasks] == [t.instrs for t in whole.program.tasks]
    matmul.cache_clear()
