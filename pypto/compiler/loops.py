"""Execution-level pass `loops`: each task's repeated instruction sequences become loops.

A task runs the same few instructions once per tile: the same ops on the same on-chip buffers,
the same flags, only the GM windows move, by the same number of elements every tile.  The pass
finds those repetitions and writes them once, as a loop whose instructions name their window at
the first iteration and by how much it moves per iteration (`gm_step=`, see `ir.exec.Loop`):

    .loop 62
      WAIT_FLAG          V -> MTE2, EVENT_ID0
      TLOAD              UB[0x0]:fp32[16,1024], GM:x[16:32,0:1024], gm_step=16384  ; softmax.py:4
      ...
    .endloop

Loops are found inner first: a pass over the instructions folds the runs of identical copies
of a sequence (the longest saving first at each position), then the same over the loops and
instructions it made, which nests loops (a matmul's K chunks inside its output tiles), until
nothing repeats.  Sequences are compared by hashes of their instructions with the GM offsets
left out; the copies must also move every GM window by one constant step.

The instructions the task runs are exactly the ones before (`ExecTask.stream` unrolls them), so
cycles and results do not change; what changes is what one reads (`ck.program.text()`, the
Exec level) and what the text costs.  `options={"loops": False}` keeps the streams unrolled.
"""
from __future__ import annotations

import bisect

from ..ir.core import Attrs
from ..ir.exec import (EVENT_STEP, EVENTS_PER_PIPE_PAIR, GM_STEP, SIM_CACHE, STREAM_SHAPES, ExecGraph, ExecTask, Instr, Loop, static_instrs,
                       stream_shape)
from ..ir.gm import GMRef
from .pipeline import Pass, PassContext

MIN_TASK = 8                    # shorter tasks are left as they are
MAX_CANDIDATES = 24             # periods tried at a position: the next occurrences of its first token
MAX_DEPTH = 4                   # loops nest at most this deep
_MOD = (1 << 61) - 1            # hashes of token sequences (polynomial, mod a Mersenne prime)
_BASE = 1_000_003


def fold_loops(g: ExecGraph, ctx: PassContext | None = None) -> ExecGraph:
    if ctx is not None and not ctx.options.get("loops", True):
        return g
    ids: dict = {}
    tasks, shapes, by_shape = [], {}, {}
    for t in g.tasks:
        shape = stream_shape(g, t.instrs)
        items = fold(t.instrs, ids) if len(t.instrs) >= MIN_TASK else t.instrs
        if items is not t.instrs:
            t = ExecTask(t.id, t.group, t.core_type, t.deps, t.level, items, t.pair, t.core)
        if shape is not None:       # isomorphic streams folded alike stay isomorphic
            sig = (shape, _signature(items, ids))
            shapes[id(t.instrs)] = (t.instrs, by_shape.setdefault(sig, len(by_shape)))
        tasks.append(t)
    out = g.replace(tasks)
    out.__dict__[STREAM_SHAPES] = shapes
    # the tasks run the very instructions they ran: what the simulator knows of them still holds
    out.__dict__[SIM_CACHE] = g.__dict__.setdefault(SIM_CACHE, {})
    return out


FOLD_LOOPS = Pass("loops", "exec", fold_loops, "write each task's repeated instruction sequences once, as loops")


def fold(instrs, ids: dict | None = None) -> tuple:
    """A task's instructions (no loops) as instructions and loops that run exactly them."""
    ids = {} if ids is None else ids
    tokens = list(instrs)
    for _ in range(MAX_DEPTH):
        keys = [_token_id(x, ids) for x in tokens]
        offs = [_offsets(x) for x in tokens]
        folded = _fold_pass(tokens, keys, offs)
        if folded is None:
            break
        tokens = folded
    return tuple(tokens) if len(tokens) != len(instrs) else tuple(instrs)


# ---------------------------------------------------------------------------------------

def _operand_key(o):
    if isinstance(o, GMRef):
        return ("GM", o.buf.name, o.shape, o.strides)
    return o


def _token_id(x, ids: dict) -> int:
    """The id of an instruction or loop, equal for tokens that differ only in GM offsets."""
    if isinstance(x, Loop):
        key = ("loop", x.count, tuple(_token_id(y, ids) for y in x.body))
    else:
        attrs = x.attrs if "event" not in x.attrs else tuple((k, v) for k, v in x.attrs.items() if k != "event")
        key = (x.op, x.pipe, _operand_key(x.dst), tuple(_operand_key(o) for o in x.srcs), attrs, x.loc)
    i = ids.get(key)
    if i is None:
        i = ids[key] = len(ids)
    return i


def _offsets(x) -> tuple[tuple[int, int], ...]:
    """What moves from copy to copy in a token's instructions (at their first iteration), in
    text order: (0, GM offset) of an instruction with a GM operand, (1, event id) of a flag."""
    if isinstance(x, Loop):
        out = []
        for ins, _ in static_instrs(x.body):
            out.extend(_offsets(ins))
        return tuple(out)
    if "event" in x.attrs:
        return ((1, x.attrs["event"]),)
    gm = x.dst if isinstance(x.dst, GMRef) else next((o for o in x.srcs if isinstance(o, GMRef)), None)
    return () if gm is None else ((0, gm.offset),)


def _step(a, b) -> int:
    """The step from component a to component b: GM elements, or event ids modulo their count."""
    return b[1] - a[1] if a[0] == 0 else (b[1] - a[1]) % EVENTS_PER_PIPE_PAIR


def _fold_pass(tokens, keys, offs):
    """One pass over the tokens: runs of copies folded into loops, or None when nothing repeats."""
    n = len(keys)
    pre = [0] * (n + 1)
    for i, k in enumerate(keys):
        pre[i + 1] = (pre[i] * _BASE + k + 1) % _MOD
    powers = [1] * (n + 1)
    for i in range(n):
        powers[i + 1] = powers[i] * _BASE % _MOD

    def h(a, b):
        return (pre[b] - pre[a] * powers[b - a]) % _MOD
    where: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        where.setdefault(k, []).append(i)
    out, i, changed = [], 0, False
    while i < n:
        best = None                 # (saved, period, copies, steps)
        occ = where[keys[i]]
        at = bisect.bisect_right(occ, i)
        for j in occ[at:at + MAX_CANDIDATES]:
            p = j - i
            if i + 2 * p > n:
                break
            r, steps = _copies(i, p, n, keys, offs, h)
            if r >= 2 and (best is None or p * (r - 1) > best[0]):
                best = (p * (r - 1), p, r, steps)
        if best is None or best[0] < 3:
            out.append(tokens[i])
            i += 1
            continue
        _, p, r, steps = best
        out.append(Loop(r, _with_steps(tokens[i:i + p], steps)))
        changed = True
        i += p * r
    return out if changed else None


def _copies(i, p, n, keys, offs, h):
    """How many copies of tokens[i:i+p] follow one another from i (each moving every GM offset
    by the same step as the first copy), and those steps (one per GM offset of the body)."""
    body = h(i, i + p)
    if h(i + p, i + 2 * p) != body or keys[i:i + p] != keys[i + p:i + 2 * p]:
        return 1, None
    steps = []
    for a, b in zip(offs[i:i + p], offs[i + p:i + 2 * p]):
        steps.extend(_step(x, y) for x, y in zip(a, b))
    r = 2
    while i + (r + 1) * p <= n and h(i + r * p, i + (r + 1) * p) == body:
        lo = i + r * p
        if keys[lo:lo + p] != keys[i:i + p]:
            break
        k, ok = 0, True
        for a, b in zip(offs[lo - p:lo], offs[lo:lo + p]):
            for x, y in zip(a, b):
                if _step(x, y) != steps[k]:
                    ok = False
                    break
                k += 1
            if not ok:
                break
        if not ok:
            break
        r += 1
    return r, steps


def _with_steps(body, steps):
    """The body with each GM instruction's step of the new (outer) loop put before its steps."""
    it = iter(steps)

    def add(x):
        if isinstance(x, Loop):
            return Loop(x.count, tuple(add(y) for y in x.body))
        moving = _offsets(x)
        if not moving:
            return x
        key = GM_STEP if moving[0][0] == 0 else EVENT_STEP
        step = (next(it),) + x.attrs.get(key, ())
        return Instr(x.op, x.pipe, x.dst, x.srcs, Attrs({**x.attrs, key: step}), x.loc)
    return tuple(add(x) for x in body)


def _signature(items, ids) -> tuple:
    return tuple(_token_id(x, ids) for x in items)
