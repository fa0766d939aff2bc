"""Execution-level pass `insert_sync`: SET_FLAG / WAIT_FLAG between the pipes of a task.

`plan_flags` walks each task's stream in order and tracks, per on-chip (or GM) byte range, the
last writer and the readers since.  When an instruction on pipe Q needs an instruction on pipe
P != Q to have finished (read after write, write after read, write after write), it gets a
WAIT_FLAG(P->Q) before it and the newest such producer a SET_FLAG(P->Q) after it, unless an
earlier flag between the same pipes already covers that producer (pipes are in order).  Event
ids, 8 per pipe pair, are recycled only once the producer's pipe is known to be past the wait
of their previous use.
"""
from __future__ import annotations

import itertools
import operator

from ..ir.core import Attrs
from ..ir.exec import (EVENTS_PER_PIPE_PAIR, STREAM_SHAPES, ExecGraph, ExecTask, Instr, Intervals, stream_accesses,
                       stream_shape)
from .pipeline import PassContext



# A graph's side table {stream shape id (STREAM_SHAPES): the `plan_flags` of streams of that
# shape}, set by the scheduling pass, which plans the flags of the order it keeps to time it
SYNC_PLANS = "_sync_plans"


def insert_sync(g: ExecGraph, ctx: PassContext | None = None) -> ExecGraph:
    plans: dict = dict(g.__dict__.get(SYNC_PLANS, {}))     # stream shape -> its flag plan
    layouts: dict[int, tuple] = {}      # id(plan) -> its `_flag_layout` (`plans` keeps the plans alive)
    tasks, out_shapes = [], {}
    for t in g.tasks:
        shape = stream_shape(g, t.instrs)
        plan = plans.get(shape) if shape is not None else None
        instrs, plan, made = _synced(t.instrs, plan, layouts.get(id(plan)) if plan is not None else None)
        if shape is not None:
            plans[shape] = plan
            layouts[id(plan)] = made
            out_shapes[id(instrs)] = (instrs, shape)
        tasks.append(with_stream(t, instrs))
    out = g.replace(tasks)
    out.__dict__[STREAM_SHAPES] = out_shapes
    return out


def with_stream(t: ExecTask, instrs: tuple, deps: tuple | None = None) -> ExecTask:
    """Task `t` running the instruction stream `instrs` (no loops), with its `instrs` and
    `n_instrs` set: the first reader need not walk the whole stream for loops to find them.
    `deps`: its dependencies, when not those of `t`."""
    out = ExecTask(t.id, t.group, t.core_type, t.deps if deps is None else deps, t.level, instrs, t.pair)
    out.__dict__["instrs"] = instrs
    out.__dict__["n_instrs"] = len(instrs)
    return out


def _sync_task(instrs) -> tuple[Instr, ...]:
    """The stream with the flags `plan_flags` finds inserted."""
    return _synced(instrs)[0]


def _synced(instrs, plan=None, made=None):
    """(the stream with its flags, the plan used, the plan's `_flag_layout`); `plan`: one made
    for a stream of the same shape, `made` its layout (streams of one plan share it: the flag
    instructions are immutable, and the stream's length is the shape's)."""
    instrs = tuple(instrs)
    if plan is None:
        plan = plan_flags(list(map(_PIPE, instrs)), stream_accesses(instrs))
        made = None
    if made is None:
        made = _flag_layout(plan, len(instrs))
    flags, gather = made
    if gather is None:
        return instrs, plan, made
    return gather(instrs + flags), plan, made


def _flag_layout(plan, n: int) -> tuple:
    """(the SET_FLAG / WAIT_FLAG instructions of a plan, a gather of the flagged stream of n
    instructions from `stream + flags`, or None when there are no flags).

    Equal flags are one instruction (immutable: a stream may hold it at many positions): one per
    distinct operation of the plan, and a SET_FLAG and its WAIT_FLAG share their attributes
    (and their key tuple in the plan).  The gather (an `operator.itemgetter` of positions) builds
    each stream of a shape in one C-level pass: a shape's tasks are many, its flags the same."""
    before, after, _ = plan
    if not before and not after:
        return (), None
    chain, flat = itertools.chain, itertools.chain.from_iterable
    # the plan's distinct operations (`plan_flags` hands out shared tuples: by id)
    ops = list(flat(chain(before.values(), after.values())))
    distinct = dict(zip(map(id, ops), ops))
    # the flagged stream as its items (instruction indices, operations) in order, from C-level
    # maps (nearly every position has flags: a loop over them costs more): per position, its
    # operations before (none: ()), itself (a 1-tuple) and its operations after
    idx = list(range(n))
    pre = dict.fromkeys(idx, ())
    pre.update(before)
    post = dict.fromkeys(idx, ())
    post.update(after)
    items = flat(flat(zip(pre.values(), zip(idx), post.values())))
    # then each item's position in `stream + flags` (by id: the indices are the objects of `idx`)
    slot = dict(zip(map(id, idx), idx))
    slot.update(zip(distinct, range(n, n + len(distinct))))
    at = list(map(slot.__getitem__, map(id, items)))
    attrs = {}
    for _, _, key in distinct.values():
        if id(key) not in attrs:
            attrs[id(key)] = Attrs.of({"src": key[0], "dst": key[1], "event": key[2]})
    make = Instr._make
    return (tuple([make(op, pipe, None, (), attrs[id(key)], None) for op, pipe, key in distinct.values()]),
            operator.itemgetter(*at))


class RangeValues:
    """Byte ranges (of `Access`es) per space with a mutable value each, and per access the values
    of the ranges overlapping it, the ones the sync planner and the list scheduler walk a
    stream with.

    `found` maps an access (by id: the caller keeps its accesses alive; tile operands share
    theirs) to (the values of the ranges overlapping it, in the order the ranges were added,
    its own range's value or None while that range is unknown); a miss is `resolve(a)`.  The
    hot loops read `found` directly: once a task's few tile slots have been seen, an access
    costs one dict probe.  Adding a range (`add`) forgets the answers of its space.
    """

    __slots__ = ("_tables", "_asked", "_added", "found")

    def __init__(self):
        self._tables: dict[str, Intervals] = {}     # space -> range -> (when added, value)
        self._asked: dict[str, list[int]] = {}      # space -> the accesses (ids) `found` answers
        self._added = 0
        self.found: dict[int, tuple] = {}

    def resolve(self, a) -> tuple:
        key = a[0]
        t = self._tables.get(key)
        if t is None:
            t = self._tables[key] = Intervals()
            self._asked[key] = []
        vals = t.values
        hits = [vals[k] for k in t.overlapping(a[1], a[2])]
        if len(hits) > 1:
            hits.sort(key=_FIRST)
        own = vals.get((a[1], a[2]))
        got = self.found[id(a)] = (tuple([v for _, v in hits]), None if own is None else own[1])
        self._asked[key].append(id(a))
        return got

    def add(self, a, value) -> tuple:
        """Add the range of access `a` (not known yet) with `value`; a's new `resolve`."""
        key = a[0]
        self._tables[key].set((a[1], a[2]), (self._added, value))
        self._added += 1
        found = self.found
        asked = self._asked[key]
        for k in asked:
            found.pop(k, None)
        asked.clear()
        return self.resolve(a)


_FIRST = operator.itemgetter(0)
_PIPE = operator.attrgetter("pipe")

SET, WAIT = "SET_FLAG", "WAIT_FLAG"     # the op names of a plan's operations (these very strings)

# (pipe names in order) -> [q][p][event]: the (SET_FLAG, WAIT_FLAG) operations of the flag P->Q
# with that event id, made once: the flags of every plan share them, and with them their key
# tuple (see `plan_flags`), so that the flag instructions of a stream share a few `Attrs`
_SYNC_OPS: dict[tuple, list] = {}


def _sync_ops(names: list) -> list:
    """The `_SYNC_OPS` table of the pipes `names` (in their order)."""
    key = tuple(names)
    got = _SYNC_OPS.get(key)
    if got is None:
        got = _SYNC_OPS[key] = [[[((SET, pn, fk), (WAIT, qn, fk))
                                   for fk in [(pn, qn, ev) for ev in range(EVENTS_PER_PIPE_PAIR)]]
                                  for pn in names] for qn in names]
    return got


def _take_event(pair: list, dst: int, known: list, floor: list):
    """A free event id for a SET_FLAG of `pair` (into pipe `dst`) whose pipe knows `known`,
    or None when all are pending.  `floor`: what every later SET_FLAG of the pair will
    know at least (ids it frees are dropped for good)."""
    events = EVENTS_PER_PIPE_PAIR
    pend = pair[0]
    done = floor[dst]
    while pend and pend[0][1] <= done:      # its WAIT_FLAG ran: the id is free again
        pend.pop(0)
    ev = pair[1]
    if len(pend) < events:                  # the usual case: the next id, when not pending
        for x in pend:
            if x[0] == ev:
                break
        else:
            pair[1] = (ev + 1) % events
            return ev
    done = known[dst]
    used = {e for e, c in pend if c > done}
    if len(used) >= events:
        return None
    while ev in used:
        ev = (ev + 1) % events
    pair[1] = (ev + 1) % events
    pend[:] = [x for x in pend if x[0] != ev]       # a newer use of the id replaces the old
    return ev


def _merged(mine: list, known: list, pipe: int, at: int) -> list:
    """`mine` updated with `known` and with `pipe` being past instruction `at` (a new list)."""
    out = [x if x > y else y for x, y in zip(mine, known)]
    if at > out[pipe]:
        out[pipe] = at
    return out


def plan_flags(pipes, accesses):
    """The flags of one task's stream: (before, after, flags).

    `pipes[k]`, `accesses[k]`: the pipe and the `accesses` of instruction k, in program order.
    `before[k]` / `after[k]`: the sync operations (op, pipe, (src, dst, event)) to emit before /
    after instruction k (a SET_FLAG and its WAIT_FLAG share one key tuple); `flags`: (src pipe,
    dst pipe, producer index, consumer index) of each flag, in order.

    Per byte range the plan tracks the last writer and the newest reader per pipe since; an
    instruction on pipe Q that must follow an instruction on pipe P != Q (read after write,
    write after read, write after write) gets a WAIT_FLAG(P->Q) before it and the newest such
    producer a SET_FLAG(P->Q) after it, unless an earlier flag between the same pipes covers it.

    Event ids (EVENTS_PER_PIPE_PAIR per pipe pair) are recycled, never while still pending: a
    flag's id is free again once the producer's pipe is known to be past the consumer's
    WAIT_FLAG, which the plan knows from the flags themselves (a vector clock per pipe: the
    newest instruction of every other pipe known to have finished).  When all ids of a pair are
    pending, the consumer's pipe first signals the producer's pipe that it is past the oldest
    wait (a flag back, Q->P), and the new SET_FLAG goes right behind that wait on P.
    """
    p = FlagPlanner(pipes, accesses)
    p.run(0, len(pipes))
    return p.before, p.after_of(), p.flags


class FlagPlanner:
    """`plan_flags`, resumable: `run(lo, hi)` plans instructions lo .. hi - 1 (in order, each
    once), its state kept between calls, so that a caller can look at the state at a cut between
    two instructions (`canon`) and put one back (`load`) — see `plan_looped`.

    The outputs: `before` {k: [operations before instruction k]}, `sets` [(producer index,
    SET_FLAG operation)] in the order the plan made them (`after_of` groups them per producer),
    `flags` as `plan_flags` gives them."""

    def __init__(self, pipes, accesses):
        self.pipes, self.accesses = pipes, accesses
        n = len(pipes)
        # the pipes by number (lists indexed by pipe beat dicts in the loop), in the order of their
        # names: numbers sort as the names do (str: a hand-made stream may leave a pipe None)
        self.names = names = sorted(set(pipes), key=str)
        self.number = number = {p: k for k, p in enumerate(names)}
        self.q_of = list(map(number.__getitem__, pipes))
        m = self.m = len(names)
        # per range [writer's pipe, writer's index, {pipe: newest reader since}] (updated in place;
        # both -1 until it is written: -1 is no instruction, so that no flag waits for it)
        self.ranges = RangeValues()
        self.synced_to = [[-1] * m for _ in range(m)]    # [q][p]: the newest P instruction a flag P->Q covers
        # [q][p]: the pipe pair P->Q's pending flags (event, consumer index) and its next id
        self.pairs = [[[[], 0] for _ in range(m)] for _ in range(m)]
        # what each pipe knows: the newest instruction of every pipe known to have finished (-1:
        # none; a vector clock, a new list on change, so that an instruction's snapshot is a shared
        # reference)
        self.clock = [[-1] * m] * m
        self.last_of = [-1] * m                     # the newest instruction of each pipe so far
        self.snap: list = [None] * n                # the clock of an instruction's pipe at it
        self.before: dict[int, list] = {}
        self.sets: list[tuple] = []
        self.flags: list[tuple] = []
        self.sync_ops = _sync_ops(names)

    def after_of(self) -> dict[int, list]:
        """{k: the SET_FLAG operations after instruction k, in order}."""
        after: dict[int, list] = {}
        for j, op in self.sets:
            a = after.get(j)
            if a is None:
                after[j] = [op]
            else:
                a.append(op)
        return after

    def run(self, lo: int, hi: int) -> None:
        events = EVENTS_PER_PIPE_PAIR
        names, accesses, snap, before, flags, sync_ops = (self.names, self.accesses, self.snap, self.before,
                                                          self.flags, self.sync_ops)
        ranges, synced_to, pairs, clock, last_of = self.ranges, self.synced_to, self.pairs, self.clock, self.last_of
        found, resolve = ranges.found, ranges.resolve
        add_set = self.sets.append
        take_event, merged = _take_event, _merged
        for idx in range(lo, hi):
            q = self.q_of[idx]
            need: dict[int, int] = {}
            sq = synced_to[q]
            # what it must wait for, and its own accesses recorded, access by access: the next
            # access of the instruction then sees this one's, which only adds instructions of Q
            # (no flag) in place of ones this one already had to see
            for a in accesses[idx]:
                overlapping, own = found.get(id(a)) or resolve(a)
                if a[3]:                    # a write: after the last writer and the readers since
                    for v in overlapping:
                        p = v[0]
                        if p != q:
                            j = v[1]
                            if j > sq[p] and j > need.get(p, -1):
                                need[p] = j
                        for p, j in v[2].items():
                            if p != q and j > sq[p] and j > need.get(p, -1):
                                need[p] = j
                        # a write supersedes everything it overlaps: later accesses only need to see it
                        v[0] = q
                        v[1] = idx
                        v[2] = {}
                    if own is None:         # its range is new
                        ranges.add(a, [q, idx, {}])
                else:                       # a read: after the last writer
                    for v in overlapping:
                        p = v[0]
                        if p != q:
                            j = v[1]
                            if j > sq[p] and j > need.get(p, -1):
                                need[p] = j
                    if own is None:
                        ranges.add(a, [-1, -1, {q: idx}])
                    else:
                        own[2][q] = idx
            cq = clock[q]
            if need:
                pre = before[idx] = []
                into = pairs[q]
                into_ops = sync_ops[q]         # [p][event]: the operations of flag P->Q
                qn = names[q]
                for p, j in sorted(need.items()) if len(need) > 1 else need.items():
                    known = snap[j]
                    pair = into[p]
                    # take_event(pair, q, known, known), its usual case inline: the next id, not pending
                    pend = pair[0]
                    done = known[q]
                    while pend and pend[0][1] <= done:
                        pend.pop(0)
                    ev = pair[1]
                    if len(pend) < events:
                        for x in pend:
                            if x[0] == ev:
                                ev = take_event(pair, q, known, known)
                                break
                        else:
                            pair[1] = (ev + 1) % events
                    else:
                        ev = take_event(pair, q, known, known)
                    pn = names[p]
                    if ev is None:
                        # all ids pending: Q tells P it is past the oldest WAIT_FLAG (a flag back,
                        # covering every Q instruction so far), P waits for it and sets the new flag
                        # right after; all four just before this instruction
                        back = pairs[p][q]
                        bev = take_event(back, p, cq, cq)
                        if bev is None:     # both directions exhausted (never seen): reuse the oldest id
                            bev = back[0].pop(0)[0]
                        pre.extend(sync_ops[p][q][bev])
                        back[0].append((bev, idx))
                        sp = synced_to[p]
                        if last_of[q] > sp[q]:
                            sp[q] = last_of[q]
                        cp = clock[p] = merged(clock[p], cq, q, last_of[q])
                        known = cp
                        ev = take_event(pair, q, known, snap[j])
                        if ev is None:      # cannot happen: P now knows Q is past every pending wait
                            ev = pend.pop(0)[0]
                        set_op, wait_op = into_ops[p][ev]
                        pre.append(set_op)
                        at = last_of[p]
                    else:
                        set_op, wait_op = into_ops[p][ev]
                        add_set((j, set_op))
                        at = j
                    pre.append(wait_op)
                    pend.append((ev, idx))
                    # cq = merged(cq, known, p, at), inline (a copy: snapshots share the old one)
                    cq = cq[:]
                    for x, y in enumerate(known):
                        if y > cq[x]:
                            cq[x] = y
                    if at > cq[p]:
                        cq[p] = at
                    sq[p] = j
                    flags.append((pn, qn, j, idx))
                clock[q] = cq
            snap[idx] = cq
            last_of[q] = idx
