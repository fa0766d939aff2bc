"""The fast paths of the exec-level analyses against plain computations: `task_pressure`'s
whole-piece look-ups (against a count over 32-byte granules) and the per-shape transfer tables
that `load_latencies` / `gm_slowdown` share between isomorphic tasks (against each task's own)."""
import random

import pytest

from pypto.compiler.listsched import _stream_key, gm_slowdown, load_latencies
from pypto.compiler.pressure import task_pressure
from pypto.dtypes import DT_FP16, DT_FP32
from pypto.ir.core import Attrs
from pypto.ir.exec import SYNC_OPS, ExecGraph, ExecTask, Instr, TileRef, accesses
from pypto.ir.gm import GMBuffer, GMRef
from pypto.target.machine import get_machine

A2 = get_machine("a2a3")
G = 32      # bytes per granule: every tile below is a whole number of them


def _granule_pressure(instrs) -> dict:
    """`task_pressure` by its definition, granule by granule.  A piece is the granules of one
    write (or of one run of never-written granules a read touches); it is live from its write
    (or the task's start) to the last read of any of its granules, and a write over part of it
    ends that part there (the part read by the writing instruction itself: up to the one before,
    in place) and leaves the rest two pieces, left and right of the write; a tile is the pieces
    of one write, or of one read."""
    where: dict = {}            # (space, granule) -> its open piece's id
    state: dict = {}            # piece id -> [start, last read, tile]
    ended: list = []            # (space, start, end, tile, in place) per granule ended
    spaces: set = set()
    tile, last, ids = 0, -1, iter(range(10 ** 9))
    for i, ins in enumerate(instrs):
        if ins.op in SYNC_OPS:
            continue
        last = i
        acc = [a for a in accesses(ins) if not a[0].startswith("GM:")]
        for space, lo, hi, w in acc:
            spaces.add(space)
            if w:
                continue
            gs = range(lo // G, hi // G)
            if any((space, g) not in where for g in gs):
                tile += 1
            run = None
            for g in gs:
                p = where.get((space, g))
                if p is None:
                    if run is None:
                        run = next(ids)
                        state[run] = [0, i, tile]
                    where[(space, g)] = run
                else:
                    run = None
                    state[p][1] = i
        for space, lo, hi, w in acc:
            if not w:
                continue
            tile += 1
            new = next(ids)
            state[new] = [i, i, tile]
            cut = {where.get((space, g)) for g in range(lo // G, hi // G)} - {None}
            for g, p in list(where.items()):
                if g[0] == space and p in cut:
                    s, e, t = state[p]
                    if lo // G <= g[1] < hi // G:
                        ended.append((space, s, e, t, e == i))
                        where[g] = new
                    else:                   # the part left (or right) of the write: a piece of its own
                        side = (p, g[1] < lo // G)
                        if side not in state:
                            state[side] = [s, e, t]
                        where[g] = side
            for g in range(lo // G, hi // G):
                where[(space, g)] = new
    ended += [(space, *state[p], False) for (space, _), p in where.items()]
    out = {}
    for space in spaces:
        best = (0, 0)
        for k in range(last + 1):
            live = sum(G for sp, s, e, _, inp in ended if sp == space and s <= k <= e - inp)
            if live > best[0]:
                best = (live, k)
        tiles = {t for sp, s, e, t, inp in ended if sp == space and s <= best[1] <= e - inp}
        out[space] = (best[0], best[1], len(tiles))
    return out


def _random_stream(rng: random.Random, n: int, tile=None) -> tuple:
    """Vector instructions on UB tiles of 1 to 4 granules at granule addresses (overlapping
    partly, wholly, or not at all), some in place, with flags between them (`tile`: another
    way to pick each tile)."""
    if tile is None:
        def tile():
            shape = (1, 8 * rng.randint(1, 4))
            return TileRef("UB", G * rng.randrange(12), DT_FP32, shape, shape)

    flag = Instr("SET_FLAG", "V", None, (), Attrs.of({"src": "V", "dst": "MTE3", "event": 0}))
    out = []
    for _ in range(n):
        srcs = tuple(tile() for _ in range(rng.randint(1, 2)))
        dst = rng.choice(srcs) if rng.random() < 0.3 else tile()
        out.append(Instr("TADD", "V", dst, srcs))
        if rng.random() < 0.3:
            out.append(flag)
    return tuple(out)


@pytest.mark.parametrize("seed", range(40))
def test_task_pressure_matches_a_granule_count(seed):
    s = _random_stream(random.Random(seed), 14)
    assert task_pressure(s) == _granule_pressure(s)


def _matmul_graph(tasks: int) -> ExecGraph:
    """`tasks` tasks of two isomorphic stream shapes (A and B panels loaded, C stored), whose
    loads of A partly repeat (L2 hits) and whose levels differ."""
    a, b = GMBuffer("a", (256, 64), DT_FP16, "input"), GMBuffer("b", (64, 256), DT_FP16, "input")
    c = GMBuffer("c", (256, 256), DT_FP16, "output")
    l1a = TileRef("L1", 0, DT_FP16, (64, 64), (64, 64))
    l1b = TileRef("L1", 8192, DT_FP16, (64, 64), (64, 64))
    l0c = TileRef("L0C", 0, DT_FP32, (64, 64), (64, 64))
    out = []
    for t in range(tasks):
        i, j = t % 4, t // 4
        s = [Instr("TLOAD", "MTE2", l1a, (GMRef.whole(a).window((64 * i, 0), (64, 64)),)),
             Instr("TLOAD", "MTE2", l1b, (GMRef.whole(b).window((0, 64 * j), (64, 64)),)),
             Instr("TMATMUL", "M", l0c, (l1a, l1b))]
        if t % 2:
            s.append(Instr("TLOAD", "MTE2", l1a, (GMRef.whole(a).window((64 * ((i + 1) % 4), 0), (64, 64)),)))
        s.append(Instr("TSTORE", "FIX", GMRef.whole(c).window((64 * i, 64 * j), (64, 64)), (l0c,)))
        out.append(ExecTask(t, 0, "AIC", (), t // 5, tuple(s)))
    return ExecGraph("mm", (a, b, c), tuple(out))


def test_transfer_tables_shared_by_shape_match_each_tasks_own():
    g = _matmul_graph(12)
    keys: dict = {}
    shapes = [keys.setdefault(k, k) for k in map(_stream_key, g.tasks)]
    assert len(keys) == 2                                     # the tables are shared
    lat = load_latencies(g, A2)
    assert load_latencies(g, A2, shapes) == lat
    assert len(set(lat)) > 2                                  # hits and misses differ within a shape
    assert gm_slowdown(g, A2, lat, shapes) == gm_slowdown(g, A2, lat) == gm_slowdown(g, A2)


def _slot_stream(rng: random.Random, n: int) -> tuple:
    """Like `_random_stream`, but every tile is one of a few slots of UB and L1 that never overlap
    (a slot of 1 to 3 granules, the same slot always the same tile): the streams `task_pressure`
    works out slot by slot."""
    slots, at = [], 0
    for space in ("UB", "L1"):
        for _ in range(rng.randint(2, 5)):
            shape = (1, 8 * rng.randint(1, 3))
            slots.append(TileRef(space, at, DT_FP32, shape, shape))
            at += G * shape[1] // 8 + G * rng.randint(0, 1)
    return _random_stream(rng, n, lambda: rng.choice(slots))


@pytest.mark.parametrize("seed", range(60))
def test_task_pressure_slot_by_slot_matches_a_granule_count(seed):
    from pypto.compiler.pressure import _slot_pressure
    s = _slot_stream(random.Random(seed), 16)
    assert _slot_pressure(s, {}) == _granule_pressure(s) == task_pressure(s)


def test_task_pressure_of_compiled_kernels_slot_by_slot_and_piece_by_piece():
    """A matmul's, a fused epilogue's and an attention's task streams (thousands of instructions,
    rings of slots, in-place accumulations): the slot path and the piece path agree."""
    import sys
    import os
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import pypto
    from kernels import causal_attention, matmul_auto, matmul_bias_gelu_auto
    from pypto.compiler.pressure import _piece_pressure, _slot_pressure
    T, F16 = pypto.Tensor, pypto.DT_FP16
    memo, slot_streams = {}, 0
    for kernel, args in [(matmul_auto, (T([1024, 2048], F16), T([2048, 768], F16), T([1024, 768], F16))),
                         (matmul_bias_gelu_auto, (T([768, 1024], F16), T([1024, 640], F16), T([1, 640], F16),
                                                  T([768, 640], F16))),
                         (causal_attention, (T([256, 64], F16),) * 4)]:
        for t in kernel.compile(*args).exec_graph.tasks:
            got = _slot_pressure(t.instrs, memo)
            if got is not None:
                slot_streams += 1
                assert got == _piece_pressure(t.instrs), (kernel, t.id)
    assert slot_streams >= 20
