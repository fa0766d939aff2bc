"""A loop's loads and stores with l1_reuse's loads dropped (`NodeLoop.gm_nodes`) are taken from the
set made before the drop, less the dropped loads, rather than made again: dependencies and select
read them after l1_reuse read the whole set.  Held to the loop making them anew (`make`)."""
from __future__ import annotations

from typing import NamedTuple

import pypto
from pypto.compiler import PASSES
from pypto.compiler.pipeline import PassContext
from pypto.ir.tile import LoopPart, NodeLoop

from common import matmul, matmul_bias_gelu

F16 = pypto.DT_FP16
T = pypto.Tensor


def _after_l1_reuse(kern, specs, consts):
    """The Block graphs of a kernel before and after l1_reuse."""
    kern.cache_clear()
    ck = kern.compile(*specs, **consts)
    ctx = PassContext(ck.machine, {})
    g = ck.tensor_graph
    for name in ("tiling", "assign_spaces", "eliminate_redundant_loads", "allocate", "partition"):
        g = PASSES[name](g, ctx)
    kern.cache_clear()
    return g, PASSES["l1_reuse"](g, ctx)


def _dropping_parts(g):
    return [p for p in g.tiles.parts if isinstance(p, LoopPart) and p[3]]


def test_the_gm_nodes_after_a_drop_are_those_made_before_less_the_dropped_loads():
    cases = [(matmul, (T([1024, 768], F16), T([768, 1024], F16), T([1024, 1024], F16)), {}),
             (matmul_bias_gelu, (T([900, 512], F16), T([512, 1000], F16), T([1000], F16), T([900, 1000], F16)),
              dict(VM=32, VN=64))]
    for kern, specs, consts in cases:
        before, after = _after_l1_reuse(kern, specs, consts)
        parts = _dropping_parts(after)
        assert parts, "l1_reuse dropped no load: nothing to compare"
        for part in parts:
            loop, spaces, place, dropped = part
            n_outer = loop.count // loop.per
            outer = list(range(n_outer))
            fresh = loop.make(spaces, place, dropped, outer, True)
            for placed in (True, False):
                loop.gm.clear()
                whole = loop.gm_nodes(spaces, place, None, outer)
                got = loop.gm_nodes(spaces, place, dropped, outer, placed)
                assert got == fresh
                assert [n.attrs._dict for n in got] == [n.attrs._dict for n in fresh]
                # taken from the set made first (the very node objects), not made again
                kept = {id(n) for n in whole}
                assert all(id(n) in kept for n in got)
                assert len(got) == len(whole) - sum(1 for n in whole if n.id in dropped)


class _Node(NamedTuple):
    id: int
    op: str
    inputs: tuple
    outer: int


def test_a_store_reading_a_dropped_load_is_made_again():
    """An iteration that stores a loaded tile as it is: with that load dropped its store reads the
    load kept instead, which only `make` knows; that iteration is made anew, the others taken."""
    def make(spaces, place, dropped=None, outer=None, gm_only=False):
        out = []
        for o in outer:
            load, other, store = 10 * o, 10 * o + 1, 10 * o + 2
            if not dropped or load not in dropped:
                out.append(_Node(load, "TLOAD", (), o))
            if not dropped or other not in dropped:
                out.append(_Node(other, "TLOAD", (), o))
            src = dropped.get(other, other) if dropped else other
            out.append(_Node(store, "TSTORE", (src,), o))
        return out

    loop = NodeLoop(0, 30, ((),), (0, 0), True, make, per=10)
    spaces, place = {}, None
    whole = loop.gm_nodes(spaces, place, None, [0, 1, 2])
    dropped = {10: 0, 21: 1}          # iteration 1 drops its first load, iteration 2 its stored one
    got = loop.gm_nodes(spaces, place, dropped, [0, 1, 2])
    assert got == make(spaces, place, dropped, [0, 1, 2], True)
    assert got[-1] == _Node(22, "TSTORE", (1,), 2)
    by_id = {n.id: n for n in whole}
    assert all(n is by_id[n.id] for n in got if n.outer < 2)      # taken
    assert got[-1] is not by_id[22]                                # made again


def test_a_loop_gives_its_windows_without_making_its_nodes():
    """`NodeLoop.windows`: a loop's loads and stores, (op, window) in node order, worked out
    without the nodes (a vector group's from its plans, a matmul's (bias rows, K serpentine,
    tails) from its tiles: the twins no pass made nodes for), read off nodes a pass made, less
    l1_reuse's dropped loads: those of the nodes."""
    from common import layernorm, softmax
    cases = [(softmax, (T([100, 256], pypto.DT_FP32),) * 2, dict(TM=8, TN=256)),
             (layernorm, (T([96, 320], pypto.DT_FP32), T([320], pypto.DT_FP32), T([320], pypto.DT_FP32),
                          T([96, 320], pypto.DT_FP32)), dict(TM=8, TN=320)),
             (matmul, (T([1000, 768], F16), T([768, 1000], F16), T([1000, 1000], F16)), {}),
             (matmul_bias_gelu, (T([900, 512], F16), T([512, 1000], F16), T([1000], F16), T([900, 1000], F16)),
              dict(VM=32, VN=64))]
    seen_drop = False
    for kern, specs, consts in cases:
        _, after = _after_l1_reuse(kern, specs, consts)
        parts = [p for p in after.tiles.parts if isinstance(p, LoopPart) and p[0]._windows is not None]
        assert parts
        for part in parts:
            loop, spaces, place, dropped = part
            n_outer = loop.count // loop.per
            some = [n_outer - 1, 0, n_outer // 2, 1]
            first_loads = {n.id: n.id for n in loop.make(None, None, None, some[:1], True) if n.op == "TLOAD"}
            for drop in (None, dropped, first_loads):
                want = [(n.op, n.attrs._dict["gm"]) for n in loop.make(spaces, place, drop, some, True)]
                loop.gm.clear()
                made = []
                real = loop.make
                loop.make = lambda *a, **k: made.append(a) or real(*a, **k)
                try:
                    assert loop.windows(spaces, place, drop, some) == want       # worked out
                finally:
                    loop.make = real
                assert not made
                loop.gm_nodes(spaces, place, None, some)
                assert loop.windows(spaces, place, drop, some) == want           # read off the nodes
                seen_drop |= bool(drop)
    assert seen_drop


@pypto.jit
def _scaled_rows(x, w, out, *, TM: int = 8, TN: int = 256):
    """A weight row loaded at every row block into a slot nothing else writes: dropped after the
    first block of each task."""
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = x * w + w


def test_l1_reuse_gives_a_twin_task_the_drops_of_the_task_it_is_like(monkeypatch):
    """A task of a loop alike one replayed before (`LoopPart.task_key`), its windows that one's moved
    by one offset per buffer, takes that one's drops (its ids moved) without a replay: the drops
    of every task are those of replaying each (held to the pass with no task alike another)."""
    from pypto.compiler import l1reuse
    F32 = pypto.DT_FP32
    cases = [(matmul, (T([2048, 1024], F16), T([1024, 2048], F16), T([2048, 2048], F16)), {}),
             (_scaled_rows, (T([4000, 256], F32), T([256], F32), T([4000, 256], F32)), {})]
    for kern, specs, consts in cases:
        before, _ = _after_l1_reuse(kern, specs, consts)
        replays = []
        real = l1reuse._replay
        monkeypatch.setattr(l1reuse, "_replay", lambda ops, dup, sizes: replays.append(1) or real(ops, dup, sizes))
        got = l1reuse.reused_loads(before)
        n_twins = len(before.tasks) - len(replays)
        monkeypatch.setattr(LoopPart, "task_key", lambda self, *a: None)
        want = l1reuse.reused_loads(before)
        monkeypatch.undo()
        assert want and got == want and list(got) == list(want)
        assert n_twins > len(before.tasks) // 2, "the tasks were all replayed: no twin to check"


def test_windows_moved_alike_are_moved_by_one_offset_per_buffer():
    from pypto.ir.gm import GMBuffer, GMRef, moved_alike, window_columns
    a, b = GMBuffer("a", (64, 64), F16, "input"), GMBuffer("b", (64, 64), F16, "input")

    def w(buf, off, shape=(8, 8), strides=(64, 1)):
        return GMRef(buf, off, shape, strides)

    first = [w(a, 0), w(b, 8), w(a, 512), w(b, 16)]
    cols = window_columns(first)
    assert moved_alike([w(a, 8), w(b, 8 + 640), w(a, 520), w(b, 16 + 640)], cols)     # a by 8, b by 640
    assert not moved_alike([w(a, 8), w(b, 8), w(a, 528), w(b, 16)], cols)            # a by 8, then 16
    assert not moved_alike([w(a, 0), w(b, 8), w(a, 512, strides=(32, 1)), w(b, 16)], cols)
    assert not moved_alike([w(a, 0), w(a, 8), w(a, 512), w(b, 16)], cols)            # another buffer
    assert not moved_alike([w(a, 0), w(b, 8), w(a, 512, shape=(4, 8)), w(b, 16)], cols)
