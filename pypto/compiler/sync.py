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

import bisect
import itertools
import operator
from typing import NamedTuple

import numpy as np

from ..ir.core import Attrs
from ..ir.exec import (EVENTS_PER_PIPE_PAIR, STREAM_SHAPES, ExecGraph, ExecTask, Instr, Intervals, stream_accesses,
                       store_regions, stream_shape)
from .pipeline import PassContext



# A graph's side table {stream shape id (STREAM_SHAPES): the `plan_flags` of streams of that
# shape}, set by the scheduling pass, which plans the flags of the order it keeps to time it
SYNC_PLANS = "_sync_plans"


# A stream longer than this is planned region by region (`region_layout`: its output tiles or row
# blocks, each planned once per canonical state and laid out once per sequence of plans): from a
# 4096^3 matmul's 4,649-instruction tasks on it costs half of planning the stream whole, and a
# fifth at 8192^3 (shorter streams: about the same or more)
REGION_PLAN_MIN = 2048


def insert_sync(g: ExecGraph, ctx: PassContext | None = None) -> ExecGraph:
    plans: dict = dict(g.__dict__.get(SYNC_PLANS, {}))     # stream shape -> its flag plan
    layouts: dict[int, tuple] = {}      # id(plan) -> its `_flag_layout` (`plans` keeps the plans alive)
    by_regions: dict = {}               # stream shape -> its `region_layout`
    regions = None                      # the RegionCache of the pass
    tasks, out_shapes = [], {}
    for t in g.tasks:
        shape = stream_shape(g, t.instrs)
        plan = plans.get(shape) if shape is not None else None
        made = by_regions.get(shape) if shape is not None else None
        if made is None and plan is None and len(t.instrs) > REGION_PLAN_MIN:
            if regions is None:
                regions = RegionCache()
            made = region_layout(t.instrs, regions)
            if shape is not None:
                by_regions[shape] = made
        if made is not None:
            flags, gather = made
            instrs = t.instrs if gather is None else gather(t.instrs + flags)
        else:
            instrs, plan, made = _synced(t.instrs, plan, layouts.get(id(plan)) if plan is not None else None)
            if shape is not None:
                plans[shape] = plan
                layouts[id(plan)] = made
        if shape is not None:
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
    attrs: dict = {}
    return tuple([_flag_instr(op, attrs) for op in distinct.values()]), operator.itemgetter(*at)


def _flag_instr(op: tuple, attrs: dict) -> Instr:
    """The SET_FLAG or WAIT_FLAG instruction of a plan's operation (op, pipe, (src, dst, event));
    `attrs`: (src, dst, event) -> the Attrs its flags share (a SET_FLAG and its WAIT_FLAG)."""
    key = op[2]
    a = attrs.get(key)
    if a is None:
        a = attrs[key] = Attrs.of({"src": key[0], "dst": key[1], "event": key[2]})
    return Instr._make(op[0], op[1], None, (), a, None)


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

    def put(self, key: str, lo: int, hi: int, value) -> None:
        """Add the range [lo, hi) of space `key` (not known yet) with `value` (a planner's state
        put back, `FlagPlanner.load`)."""
        t = self._tables.get(key)
        if t is None:
            t = self._tables[key] = Intervals()
            self._asked[key] = []
        t.set((lo, hi), (self._added, value))
        self._added += 1

    def items(self):
        """(space, (lo, hi), value) of every range, per space in order of start."""
        for key, t in self._tables.items():
            vals = t.values
            for r in t.keys:
                yield key, r, vals[r][1]

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
    two instructions (`canon`) and put one back (`load`): see `plan_regions`.

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
        for idx, q in zip(range(lo, hi), self.q_of[lo:hi]):
            need: dict[int, int] = {}
            sq = synced_to[q]
            # what it must wait for, and its own accesses recorded, access by access: the next
            # access of the instruction then sees this one's, which only adds instructions of Q
            # (no flag) in place of ones this one already had to see
            for a in accesses[idx]:
                overlapping, own = found.get(id(a)) or resolve(a)
                write = a[3]
                for v in overlapping:
                    p = v[0]                # any access: after the last writer
                    if p != q:
                        j = v[1]
                        if j > sq[p] and j > need.get(p, -1):
                            need[p] = j
                    if write:               # a write: after the readers since too
                        for p, j in v[2].items():
                            if p != q and j > sq[p] and j > need.get(p, -1):
                                need[p] = j
                        # a write supersedes everything it overlaps: later accesses only need to see it
                        v[0] = q
                        v[1] = idx
                        v[2] = {}
                if own is None:             # its range is new
                    ranges.add(a, [q, idx, {}] if write else [-1, -1, {q: idx}])
                elif not write:
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

    # --- the state at a cut, up to what cannot change what follows (`plan_regions`) ----------

    def canon(self, cut: int, skip: frozenset, users: dict) -> tuple:
        """The state after instructions 0 .. cut - 1, in a form equal for two cuts after which
        equal instructions (the same pipes and accesses) get the same flags, at the same positions
        relative to the cut and with the same event ids relative to each pipe pair's next id.
        `skip`: spaces left out (GM buffers only ever written, by one pipe: no range of theirs can
        make a flag); `users`: {space: (the pipes (numbers) that access it anywhere in the stream,
        those that write it)} (`stream_facts`).

        The plan only compares instruction indices, never computes with them, so an index is kept
        relative to the cut where it may still matter, and as None where it no longer can:
        - a writer (reader) of a range is dead once the flags into every other pipe that accesses
          (writes) its space cover it (their `synced_to` has reached it): it can never make a flag
          again;
        - a pending flag (event, consumer) of pair P->Q whose consumer is at most what P knows of
          Q, now (its clock) and at every live producer of P (their snapshots), is dropped the
          next time the pair takes an id, before anything reads it: gone;
        - any other index of pipe x (clocks, `synced_to`, snapshots, the newest instruction) is
          only ever compared with live indices of x, pending consumers on x and new ones, all
          later: below the oldest of those it is as good as -1 (None).
        Event ids count from the pair's next id.  `load` puts such a state back."""
        m = self.m
        rng = range(m)
        synced_to, pairs, clock, snap = self.synced_to, self.pairs, self.clock, self.snap
        # per space: per pipe p, the newest index of p that the flags into every other pipe that
        # accesses the space (writes it) cover: a writer (a reader) of a range there up to it is dead
        covers: dict[str, tuple] = {}
        for key, (acc, wr) in users.items():
            covers[key] = ([min([synced_to[q][p] for q in acc if q != p], default=1 << 62) for p in rng],
                           [min([synced_to[q][p] for q in wr if q != p], default=1 << 62) for p in rng])
        live: list[set] = [set() for _ in rng]
        ranges = []
        for key, (lo, hi), (wp, wi, rd) in self.ranges.items():
            if key in skip:
                continue
            cw, cr = covers[key]
            w = (wp, wi - cut) if wp >= 0 and wi > cw[wp] else (-1, None)
            if w[1] is not None:
                live[wp].add(wi)
            r = tuple(sorted((p, j - cut) for p, j in rd.items() if j > cr[p]))
            for p, j in r:
                live[p].add(j + cut)
            ranges.append((key, lo, hi, w, r))
        producers = sorted(set().union(*live))
        pending = []
        low = [set(x) for x in live]        # per pipe: the indices its values are compared with
        for q in rng:
            row = []
            for p in rng:
                pend, nxt = pairs[q][p]
                if pend:
                    done = min([clock[p][q]] + [snap[j][q] for j in live[p]])
                    kept = tuple(((e - nxt) % EVENTS_PER_PIPE_PAIR, c - cut) for e, c in pend if c > done)
                    for _, c in kept:
                        low[q].add(c + cut)
                    row.append(kept)
                else:
                    row.append(())
            pending.append(tuple(row))
        floor = [min(x) if x else 1 << 62 for x in low]

        def rel(v: int, x: int):
            return v - cut if v >= floor[x] else None

        def vec(vals):
            return tuple([rel(v, x) for x, v in enumerate(vals)])

        return (tuple(ranges), tuple(pending), tuple(map(vec, synced_to)), tuple(map(vec, clock)),
                vec(self.last_of), tuple((j - cut, vec(snap[j])) for j in producers))

    def load(self, state: tuple, cut: int, nxt) -> None:
        """Put back a state `canon` gave, at `cut`; `nxt`[q][p]: pair P->Q's next event id."""
        ranges, pending, synced_to, clock, last_of, snaps = state
        m = self.m

        def ab(v):
            return -1 if v is None else v + cut
        rv = self.ranges = RangeValues()
        for key, lo, hi, (wp, wi), rd in ranges:
            rv.put(key, lo, hi, [wp, ab(wi), {p: j + cut for p, j in rd}])
        self.pairs = [[[[((e + nxt[q][p]) % EVENTS_PER_PIPE_PAIR, c + cut) for e, c in pending[q][p]], nxt[q][p]]
                       for p in range(m)] for q in range(m)]
        self.synced_to = [list(map(ab, row)) for row in synced_to]
        self.clock = [list(map(ab, row)) for row in clock]
        self.last_of = list(map(ab, last_of))
        for j, row in snaps:
            self.snap[j + cut] = list(map(ab, row))

    def next_ids(self) -> list:
        """[q][p]: the next event id of pair P->Q."""
        return [[pair[1] for pair in row] for row in self.pairs]


class RegionPlan(NamedTuple):
    """What the flag planner made for one region of a stream met in one canonical state
    (`plan_regions`), every index relative to the region's start and every event id relative to
    its pair's next id there: `before` ((index, operations)), `sets` ((producer index, operation)),
    `flags` ((src, dst, producer, consumer)); an operation is (op, pipe, src, dst, event).  `state`:
    the canonical state at the region's end; `first_set`: the earliest producer among `sets` (the
    region's length when it sets none); `advance` [q][p]: how far pair P->Q's next id moved."""
    before: tuple
    sets: tuple
    flags: tuple
    state: tuple
    first_set: int
    advance: tuple


def plan_regions(pipes, accesses, bounds, sigs, memo: dict, skip: frozenset, users: dict) -> list:
    """`plan_flags` of a stream cut into regions (`bounds`: (lo, hi) of each, in order, covering
    it), a region planned once per (canonical state at its start, `sigs` of it): a region met
    again in a state met before takes the plan made then (`memo`, which streams may share; a
    `RegionPlan` per key).  Returns per region (its RegionPlan, its start, the next event id of
    each pipe pair there).  `sigs`, `skip`, `users`: `stream_facts` (see `FlagPlanner.canon`)."""
    planner = FlagPlanner(pipes, accesses)
    names, number, m = tuple(planner.names), planner.number, planner.m
    nxt = [[0] * m for _ in range(m)]
    state = planner.canon(0, skip, users)
    real = True
    out = []
    for (lo, hi), sig in zip(bounds, sigs):
        key = (names, skip, state, sig)
        rp = memo.get(key)
        if rp is None:
            if not real:
                planner.load(state, lo, nxt)
                real = True
            before = planner.before
            nb, ns, nf = len(before), len(planner.sets), len(planner.flags)
            planner.run(lo, hi)

            def rel(op):
                src, dst, ev = op[2]
                return op[0], op[1], src, dst, (ev - nxt[number[dst]][number[src]]) % EVENTS_PER_PIPE_PAIR
            mine = list(itertools.islice(reversed(before.items()), len(before) - nb))[::-1]
            got = planner.next_ids()
            rp = memo[key] = RegionPlan(
                tuple((k - lo, tuple(map(rel, ops))) for k, ops in mine),
                tuple((j - lo, rel(op)) for j, op in planner.sets[ns:]),
                tuple((pn, qn, j - lo, k - lo) for pn, qn, j, k in planner.flags[nf:]),
                planner.canon(hi, skip, users),
                min((j for j, _ in planner.sets[ns:]), default=hi) - lo,
                tuple(tuple((got[q][p] - nxt[q][p]) % EVENTS_PER_PIPE_PAIR for p in range(m)) for q in range(m)))
        else:
            real = False
        out.append((rp, lo, tuple(map(tuple, nxt))))
        adv = rp.advance
        nxt = [[(nxt[q][p] + adv[q][p]) % EVENTS_PER_PIPE_PAIR for p in range(m)] for q in range(m)]
        state = rp.state
    return out


def region_ops(names, nxt):
    """fn(relative operation of a RegionPlan) -> the operation, with the event id the pair's next
    id `nxt` makes it (the very tuples `plan_flags` hands out)."""
    ops = _sync_ops(list(names))
    number = {p: k for k, p in enumerate(names)}

    def op(r):
        name, _, src, dst, e = r
        q, p = number[dst], number[src]
        return ops[q][p][(e + nxt[q][p]) % EVENTS_PER_PIPE_PAIR][0 if name == SET else 1]
    return op


def stream_facts(pipes, accesses, bounds, interned: dict) -> tuple:
    """What the region planner needs of a stream's accesses: (per region (`bounds`) a key equal
    for regions of the same pipes and accesses; the write-only GM spaces, left out of the
    canonical state and of the keys but for their sizes (see `FlagPlanner.canon`);
    `FlagPlanner.users`).  A key is a tuple of ints, each an instruction's (pipe, accesses)
    numbered in `interned`.  Worked out per distinct (pipe, accesses), found with C-level maps
    (instructions alike share their accesses list; loads of other windows into one tile have
    equal ones)."""
    ids = list(map(id, accesses))
    first = list(dict(zip(ids, range(len(ids)))).values())         # a position of each distinct list
    keys = list(zip(map(pipes.__getitem__, first), map(tuple, map(accesses.__getitem__, first))))
    kinds = list(dict.fromkeys(keys))
    number = {p: k for k, p in enumerate(sorted(set(pipes), key=str))}
    acc: dict[str, set] = {}
    wr: dict[str, set] = {}
    read: set = set()
    for q, accs in kinds:
        for a in accs:
            acc.setdefault(a[0], set()).add(q)
            if a[3]:
                wr.setdefault(a[0], set()).add(q)
            else:
                read.add(a[0])
    # GM spaces written by one pipe and never read: no range of theirs can make a flag (a write
    # waits for the other pipes' writers and readers only)
    skip = frozenset(k for k, ps in wr.items() if k.startswith("GM:") and len(ps) == 1 and k not in read)
    users = {k: (frozenset(map(number.__getitem__, v)), frozenset(map(number.__getitem__, wr.get(k, ()))))
             for k, v in acc.items()}
    num = {}
    for kind in kinds:
        q, accs = kind
        if skip and any(a[0] in skip for a in accs):
            accs = tuple([(a[0], 0, a[2] - a[1], a[3]) if a[0] in skip else a for a in accs])
        num[kind] = interned.setdefault((q, accs), len(interned))
    content = dict(zip(map(ids.__getitem__, first), map(num.__getitem__, keys)))
    nums = list(map(content.__getitem__, ids))
    return [tuple(nums[lo:hi]) for lo, hi in bounds], skip, users


class RegionCache:
    """What `region_layout` keeps across the streams of one pass: the region plans (`plan_regions`'
    memo), the numbers of (pipe, accesses), the region templates, the flag instructions."""

    def __init__(self):
        self.memo: dict = {}
        self.interned: dict = {}
        self.templates: dict = {}       # (pipes, ids of the RegionPlans of a region and the next ones) -> `_template`
        self.rel_ids: dict = {}         # a relative flag operation -> its number
        self.rel: list = []             # number -> (op, pipe, src, dst, relative event)
        self.flag_ids: dict = {}        # an operation (the `_sync_ops` tuple, by id) -> its index in `flags`
        self.flags: list = []           # the flag instructions, one per distinct operation
        self.luts: dict = {}            # (names, next ids) -> relative number -> index in `flags` (np array)
        self.attrs: dict = {}           # (src, dst, event) -> the Attrs of its flags


def region_layout(instrs, cache: RegionCache) -> tuple:
    """`_flag_layout(plan_flags(...), len(instrs))` of a stream cut into regions at its GM
    stores (a matmul task's output tiles, a vector task's row blocks), from per-region plans
    (`plan_regions`): each distinct region is planned once per canonical state, and its flagged
    text (its own flags and those later regions set after its instructions) laid out once per
    sequence of plans, as positions into `instrs + flags`; only the gather is per stream."""
    n = len(instrs)
    pipes = list(map(_PIPE, instrs))
    acc = stream_accesses(instrs)
    bounds = store_regions(instrs)
    sigs, skip, users = stream_facts(pipes, acc, bounds, cache.interned)
    records = plan_regions(pipes, acc, bounds, sigs, cache.memo, skip, users)
    names = tuple(sorted(set(pipes), key=str))
    rps = [r[0] for r in records]
    reach = _reach(rps, bounds)
    most = max(reach, default=0)
    parts = []
    for r, (lo, hi) in enumerate(bounds):
        key = (names, tuple(map(id, rps[r:r + most + 1])))
        tpl = cache.templates.get(key)
        if tpl is None:
            tpl = cache.templates[key] = _template(r, bounds, records, names, most, cache)
        ipos, fslots, fids = tpl
        pos = ipos + lo if lo else ipos.copy()
        if len(fslots):
            pos[fslots] = n + _lut(cache, names, records[r][2])[fids]
        parts.append(pos)
    if sum(map(len, parts)) == n:
        return (), None
    flags = tuple(cache.flags)
    at = np.concatenate(parts).tolist()
    return flags, operator.itemgetter(*at)


def _reach(rps, bounds) -> list[int]:
    """Per region: how many regions back its SET_FLAGs may land (its earliest producer's region)."""
    starts = [lo for lo, _ in bounds]
    return [r - (bisect.bisect_right(starts, rp.first_set + starts[r]) - 1) if rp.first_set < 0 else 0
            for r, rp in enumerate(rps)]


def _lut(cache: RegionCache, names, nxt) -> np.ndarray:
    """Relative flag number -> index of its flag instruction in `cache.flags`, at next ids `nxt`."""
    key = (names, nxt)
    got = cache.luts.get(key)
    if got is None or len(got) < len(cache.rel):
        op = region_ops(names, nxt)
        out = []
        for rel in cache.rel:
            if rel[2] not in names or rel[3] not in names:     # (a flag of other pipes' streams)
                out.append(0)
                continue
            o = op(rel)
            k = cache.flag_ids.get(id(o))
            if k is None:
                k = cache.flag_ids[id(o)] = len(cache.flags)
                cache.flags.append(_flag_instr(o, cache.attrs))
            out.append(k)
        got = cache.luts[key] = np.array(out, np.int64)
    return got


def _template(r: int, bounds, records, names, most: int, cache: RegionCache) -> tuple:
    """The flagged text of region r as (per entry the instruction's offset in the region or -1,
    the entries that are flags, their relative flag numbers): its own flags and the SET_FLAGs
    regions r .. r + most set after its instructions, events relative to its pair's next ids."""
    lo, hi = bounds[r]
    rp, _, nxt = records[r]
    number = {p: k for k, p in enumerate(names)}
    after: dict[int, list] = {}
    for src in range(r, min(r + most, len(records) - 1) + 1):
        srp, slo, snxt = records[src]
        for j, o in srp.sets:
            k = slo + j - lo
            if 0 <= k < hi - lo:
                q, p = number[o[3]], number[o[2]]
                after.setdefault(k, []).append(o[:4] + ((o[4] + snxt[q][p] - nxt[q][p]) % EVENTS_PER_PIPE_PAIR,))
    pre = dict(rp.before)
    ipos, fids = [], []
    rel_ids, rel = cache.rel_ids, cache.rel

    def fid(o):
        got = rel_ids.get(o)
        if got is None:
            got = rel_ids[o] = len(rel)
            rel.append(o)
        return got
    for k in range(hi - lo):
        for o in pre.get(k, ()):
            fids.append(fid(o))
            ipos.append(-1)
        ipos.append(k)
        for o in after.get(k, ()):
            fids.append(fid(o))
            ipos.append(-1)
    ipos = np.array(ipos, np.int64)
    return ipos, np.flatnonzero(ipos < 0), np.array(fids, np.int64)
