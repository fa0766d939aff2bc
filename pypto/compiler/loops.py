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
nothing repeats.  Instructions are compared by ids that leave out what moves (GM offsets, event
ids, extract offsets); the copies must also move each of those by one constant step.  A loop's
body is folded too (inner loops), and a task isomorphic to one already folded takes its loops:
at once when its windows are those of the first task moved by one offset per buffer (`moved`),
else checked iteration by iteration (`replay`).

The instructions the task runs are exactly the ones before (`ExecTask.instrs` unrolls them), so
cycles and results do not change; what changes is what one reads (`ck.program.text()`, the
Exec level) and what the text costs.  `options={"loops": False}` keeps the streams unrolled.
"""
from __future__ import annotations

import itertools

import numpy as np

from ..ir.core import Attrs
from ..ir.exec import (EVENTS_PER_PIPE_PAIR, MOVING_STEPS, SIM_CACHE, STREAM_SHAPES, ExecGraph,
                       ExecTask, Instr, Loop, n_instrs, static_instrs, stream_shape)
from ..ir.gm import GMRef
from .pipeline import Pass, PassContext

MIN_TASK = 96                   # shorter tasks are left as they are (a few tiles: little to fold)
MIN_BODY = 8                    # a loop body is searched for inner loops from this length
SMALL_PERIOD = 48               # the periods up to this many tokens that occur are tried (inner
                                # loops), and the structural periods of the outer repetitions
MAX_DEPTH = 4                   # loops nest at most this deep
# tokens compared per token of a task when copies equal by their ids fail the constant-step check
# (a stream that repeats but moves irregularly, e.g. a matmul whose L1 reuse varies from tile to
# tile): the pass stops looking for other periods beyond it, so it stays linear in the stream
WORK_PER_TOKEN = 16


def fold_loops(g: ExecGraph, ctx: PassContext | None = None) -> ExecGraph:
    if ctx is not None and not ctx.options.get("loops", True):
        return g
    ids: dict = {}
    tasks, shapes, folded = [], {}, {}
    for t in g.tasks:
        shape = stream_shape(g, t.instrs)
        items = None
        if shape in folded:         # an isomorphic task: its loops are those of the first one
            first, template = folded[shape]
            items = moved(template, first, t.instrs)
            if items is None:
                items = replay(template, t.instrs)
        if items is None:
            items = fold(t.instrs, ids) if len(t.instrs) >= MIN_TASK else t.instrs
            if shape is not None:
                folded[shape] = (t.instrs, items)
        if items is not t.code:
            run = t.instrs
            t = ExecTask(t.id, t.group, t.core_type, t.deps, t.level, items, t.pair, t.core)
            t.__dict__["instrs"] = run      # what its loops unroll to: the very instructions it ran
                                            # (the simulators read them; no unrolling again)
        if shape is not None:       # the shape of the stream the task runs, folded or not
            shapes[id(t.code)] = (t.code, shape)
        tasks.append(t)
    out = g.replace(tasks)
    out.__dict__[STREAM_SHAPES] = shapes
    # the tasks run the very instructions they ran: what the simulator knows of them still holds
    out.__dict__[SIM_CACHE] = g.__dict__.setdefault(SIM_CACHE, {})
    return out


FOLD_LOOPS = Pass("loops", "exec", fold_loops, "write each task's repeated instruction sequences once, as loops")


def moved(template, first, instrs) -> tuple | None:
    """`instrs` with the loops of `template` (the folding of `first`) when it is `first` with the
    GM windows of each buffer moved by one offset (the same offset for every window of a buffer):
    then every loop holds with the same steps.  None when it is not.  Streams of one stream
    shape have the same ops, attributes, tiles and window shapes; what is left to compare is
    each window's buffer, strides and offset, and the source lines."""
    if len(first) != len(instrs):
        return None
    delta: dict[str, int] = {}
    for a, b in zip(first, instrs):
        if a is b:
            continue
        if a.op != b.op or (a.loc is not b.loc and a.loc != b.loc):
            return None
        for x, y in zip((a.dst, *a.srcs), (b.dst, *b.srcs)):
            if isinstance(x, GMRef):
                if not isinstance(y, GMRef) or x.buf.name != y.buf.name or x.strides != y.strides:
                    return None
                d = delta.setdefault(x.buf.name, y.offset - x.offset)
                if y.offset - x.offset != d:
                    return None
    if not any(isinstance(x, Loop) for x in template):
        return tuple(instrs)
    out, _ = _shifted(template, instrs, 0)
    return tuple(out)


def _shifted(items, instrs, pos):
    """The items with each instruction taken from `instrs` at its position of the first
    iteration, given the steps its template instruction has."""
    out = []
    for it in items:
        if isinstance(it, Loop):
            body, _ = _shifted(it.body, instrs, pos)
            out.append(Loop(it.count, tuple(body)))
            pos += it.count * n_instrs(it.body)
            continue
        x = instrs[pos]
        steps = {k: it.attrs[k] for k in MOVING_STEPS if k in it.attrs}
        out.append(Instr(x.op, x.pipe, x.dst, x.srcs, Attrs({**x.attrs, **steps}), x.loc) if steps else x)
        pos += 1
    return out, pos


def replay(template, instrs) -> tuple | None:
    """`instrs` (a stream isomorphic to the one `template` folds: the same instructions but for
    their GM windows) with the loops of `template`; its steps taken from `instrs` and checked at
    every iteration.  None when they do not hold (then the stream is folded on its own)."""
    if template is None or not any(isinstance(x, Loop) for x in template):
        return tuple(instrs) if template is not None and len(template) == len(instrs) else None
    try:
        items, end = _rebuild(template, instrs, 0, ())
    except _Mismatch:
        return None
    return tuple(items) if end == len(instrs) else None


class _Mismatch(Exception):
    pass


def _rebuild(items, instrs, pos, loops):
    out = []
    for it in items:
        if isinstance(it, Loop):
            size = n_instrs(it.body)
            body, _ = _rebuild(it.body, instrs, pos, loops + ((it.count, size),))
            out.append(Loop(it.count, tuple(body)))
            pos += it.count * size
            continue
        if pos >= len(instrs) or instrs[pos].op != it.op:
            raise _Mismatch
        x = instrs[pos]
        comps = _offsets(x)
        if loops:                   # every iteration: the same instruction, its windows moved
            same = _key(x)
            per_loop = [tuple(_step(a, b) for a, b in zip(comps, _offsets(instrs[pos + size])))
                        for _, size in loops]
            for idx in itertools.product(*(range(c) for c, _ in loops)):
                q = pos + sum(i * size for i, (_, size) in zip(idx, loops))
                if q != pos and _key(instrs[q]) != same:
                    raise _Mismatch
                got = _offsets(instrs[q])
                for k, (kind, base) in enumerate(comps):
                    want = base + sum(i * st[k] for i, st in zip(idx, per_loop))
                    if (got[k][1] - want) % EVENTS_PER_PIPE_PAIR if kind == 1 else got[k][1] != want:
                        raise _Mismatch
        if comps and loops:
            key = MOVING_STEPS[comps[0][0]]
            step = tuple(st if comps[0][0] == 2 else st[0] for st in per_loop)
            x = Instr(x.op, x.pipe, x.dst, x.srcs, Attrs({**x.attrs, key: step}), x.loc)
        out.append(x)
        pos += 1
    return out, pos


def fold(instrs, ids: dict | None = None) -> tuple:
    """A task's instructions (no loops) as instructions and loops that run exactly them."""
    ids = {} if ids is None else ids
    tokens = list(instrs)
    memo: dict[int, tuple] = {}         # id(token) -> (its id, its moving components)

    def describe(x):
        d = memo.get(id(x))
        if d is None:
            d = memo[id(x)] = (_token_id(x, ids), _offsets(x), x)     # (x kept: ids stay unique)
        return d
    for _ in range(MAX_DEPTH):
        described = [describe(x) for x in tokens]
        keys = [d[0] for d in described]
        offs = [d[1] for d in described]
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


def _key(x: Instr) -> tuple:
    """An instruction with what moves from copy to copy (GM offsets, event ids, offsets) left out."""
    attrs = x.attrs if not _MOVING.intersection(x.attrs.keys()) else tuple(
        (k, v) for k, v in x.attrs.items() if k not in _MOVING)
    return (x.op, x.pipe, _operand_key(x.dst), tuple(_operand_key(o) for o in x.srcs), attrs, x.loc)


def _token_id(x, ids: dict) -> int:
    """The id of an instruction or loop, equal for tokens that differ only in GM offsets."""
    key = ("loop", x.count, tuple(_token_id(y, ids) for y in x.body)) if isinstance(x, Loop) else _key(x)
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
    if "offsets" in x.attrs and x.op == "TEXTRACT":
        return tuple((2, o) for o in x.attrs["offsets"])
    gm = x.dst if isinstance(x.dst, GMRef) else next((o for o in x.srcs if isinstance(o, GMRef)), None)
    return () if gm is None else ((0, gm.offset),)


_MOVING = {"event", "offsets"}      # attributes that may move from copy to copy (with the GM windows)


def _step(a, b) -> int:
    """The step from component a to component b: GM elements, or event ids modulo their count."""
    return (b[1] - a[1]) % EVENTS_PER_PIPE_PAIR if a[0] == 1 else b[1] - a[1]


def _fold_pass(tokens, keys, offs):
    """One pass over the tokens: runs of copies folded into loops, or None when nothing repeats.

    For each candidate period p (every small one, and the structural periods of the outer
    repetitions) numpy finds, at every position, how many copies of the next p tokens follow by
    their ids alone; walking left to right, the period saving most tokens at a position is taken
    when its copies also move their GM windows, event ids and offsets by constant steps."""
    n = len(keys)
    k = np.asarray(keys, np.int64)
    best_saved = np.zeros(n, np.int64)
    best_p = np.zeros(n, np.int64)
    periods = _candidate_periods(keys, n)
    for p in periods:
        same = k[:n - p] == k[p:]                  # token i == token i + p
        run = _run_lengths(same)                   # how far that holds from i on
        copies = run // p + 1
        saved = np.where(copies >= 2, p * (copies - 1), 0)
        better = saved > best_saved[:n - p]
        best_saved[:n - p][better] = saved[better]
        best_p[:n - p][better] = p
    if not (best_saved >= 3).any():
        return None
    out, i, changed, work = [], 0, False, 0
    saved_at, p_at = best_saved.tolist(), best_p.tolist()
    while i < n:
        if saved_at[i] >= 3:
            # the best period by ids; when its copies do not move by constant steps, the others
            r, steps, p = *_copies(i, p_at[i], n, keys, offs), p_at[i]
            work += p
            if (r < 2 or p * (r - 1) < 3) and work < WORK_PER_TOKEN * n:
                tries = [(q, *_copies(i, q, n, keys, offs)) for q in periods
                         if q != p_at[i] and i + 2 * q <= n and keys[i + q] == keys[i]]
                work += sum(q for q, _, st in tries if st is not None)
                p, r, steps = max(tries, key=lambda x: (x[0] * (x[1] - 1), -x[0]), default=(p, 1, None))
            if r >= 2 and p * (r - 1) >= 3:
                out.append(Loop(r, _nested(tokens[i:i + p], steps, offs[i:i + p])))
                changed = True
                i += p * r
                continue
        out.append(tokens[i])
        i += 1
    return out if changed else None


def _run_lengths(same: np.ndarray) -> np.ndarray:
    """For each i: how many consecutive True values `same` has from i on."""
    m = len(same)
    idx = np.arange(m, dtype=np.int64)
    stop = np.where(same, m, idx)                  # the first False at or after i ...
    stop = np.minimum.accumulate(stop[::-1])[::-1]
    return stop - idx


def _candidate_periods(keys, n: int) -> list[int]:
    """Every period up to SMALL_PERIOD, and the likely periods of the outer repetitions."""
    where: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        where.setdefault(key, []).append(i)
    # a period p repeats every token of the body p later: p is a gap between occurrences of the
    # tokens found once per copy (the gaps between consecutive occurrences, and twice them)
    small: set[int] = set()
    for occ in where.values():
        for a, b in zip(occ, occ[1:]):
            if b - a <= SMALL_PERIOD:
                small.add(b - a)
                small.add(2 * (b - a))
    return list(dict.fromkeys(sorted(p for p in small if p <= n // 2)
                              + [p for p in _structural_periods(where, n) if p <= n // 2]))


def _structural_periods(where: dict, n: int, most: int = 16) -> list[int]:
    """Likely periods of the outer repetitions: the commonest gaps between consecutive
    occurrences of the rarer tokens (a store per output tile, a load per chunk), with twice
    them (ping-pong buffers repeat every second tile)."""
    gaps: dict[int, int] = {}
    rare = max(2, n // 16)
    for occ in where.values():
        if 2 <= len(occ) <= rare:
            for a, b in zip(occ, occ[1:]):
                gaps[b - a] = gaps.get(b - a, 0) + 1
                gaps.setdefault(2 * (b - a), 0)
    return sorted(gaps, key=lambda g: (-gaps[g], g))[:most]


def _copies(i, p, n, keys, offs):
    """How many copies of tokens[i:i+p] follow one another from i (each moving every GM offset,
    event id and extract offset by the same step as the second copy moved it), and those steps
    (one per moving component of the body, in text order)."""
    body = keys[i:i + p]
    if keys[i + p:i + 2 * p] != body:
        return 1, None
    steps = [_step(x, y) for a, b in zip(offs[i:i + p], offs[i + p:i + 2 * p]) for x, y in zip(a, b)]
    r = 2
    while i + (r + 1) * p <= n and keys[i + r * p:i + (r + 1) * p] == body:
        lo = i + r * p
        moved = [_step(x, y) for a, b in zip(offs[lo - p:lo], offs[lo:lo + p]) for x, y in zip(a, b)]
        if moved != steps:
            break
        r += 1
    return r, steps


def _nested(body, steps, offs):
    """The body of a new loop: its own repetitions folded first (inner loops; the greedy pass
    takes the longest saving, the outer loop, first), when the new loop's step of every
    instruction is the same at each of its inner iterations; else the body as it is."""
    if len(body) >= MIN_BODY and all(isinstance(x, Instr) for x in body):
        inner = fold(body)
        if any(isinstance(x, Loop) for x in inner):
            per_token, k = [], 0
            for o in offs:
                per_token.append(tuple(steps[k:k + len(o)]))
                k += len(o)
            outer: dict[int, tuple] = {}
            ok = True
            for static, st in zip(_dynamic_statics(inner), per_token):
                if outer.setdefault(id(static), st) != st:
                    ok = False
                    break
            if ok:
                return _with_steps(inner, [x for ins, _ in static_instrs(inner) for x in outer[id(ins)]])
    return _with_steps(body, steps)


def _dynamic_statics(items):
    """For each instruction the items run, in order: the instruction of the text it comes from."""
    for it in items:
        if isinstance(it, Loop):
            for _ in range(it.count):
                yield from _dynamic_statics(it.body)
        else:
            yield it


def _with_steps(body, steps):
    """The body with each GM instruction's step of the new (outer) loop put before its steps."""
    it = iter(steps)

    def add(x):
        if isinstance(x, Loop):
            return Loop(x.count, tuple(add(y) for y in x.body))
        moving = _offsets(x)
        if not moving:
            return x
        kind = moving[0][0]
        key = MOVING_STEPS[kind]
        mine = tuple(next(it) for _ in moving)
        step = ((mine if kind == 2 else mine[0]),) + x.attrs.get(key, ())
        return Instr(x.op, x.pipe, x.dst, x.srcs, Attrs({**x.attrs, key: step}), x.loc)
    return tuple(add(x) for x in body)
