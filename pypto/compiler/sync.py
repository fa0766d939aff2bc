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

import collections

from ..ir.core import Attrs
from ..ir.exec import (EVENTS_PER_PIPE_PAIR, STREAM_SHAPES, ExecGraph, ExecTask, Instr, Intervals, accesses,
                       stream_shape, written_gm)
from .pipeline import PassContext



# A graph's side table {stream shape id (STREAM_SHAPES): the `plan_flags` of streams of that
# shape}, set by the scheduling pass, which plans the flags of the order it keeps to time it
SYNC_PLANS = "_sync_plans"


def insert_sync(g: ExecGraph, ctx: PassContext | None = None) -> ExecGraph:
    # stream shape -> (plan, its flag instructions)
    plans: dict = {shape: (plan, None) for shape, plan in g.__dict__.get(SYNC_PLANS, {}).items()}
    tasks, out_shapes = [], {}
    for t in g.tasks:
        shape = stream_shape(g, t.instrs)
        known = plans.get(shape)
        instrs, plan, made = _synced(t.instrs, *(known or (None, None)))
        if shape is not None:
            plans[shape] = (plan, made)
            out_shapes[id(instrs)] = (instrs, shape)
        tasks.append(ExecTask(t.id, t.group, t.core_type, t.deps, t.level, instrs, t.pair))
    out = g.replace(tasks)
    out.__dict__[STREAM_SHAPES] = out_shapes
    return out


def _sync_task(instrs) -> tuple[Instr, ...]:
    """The stream with the flags `plan_flags` finds inserted."""
    return _synced(instrs)[0]


def _synced(instrs, plan=None, made=None):
    """(the stream with its flags, the plan used, the plan's flag instructions); `plan`: one made
    for a stream of the same shape, `made` its flag instructions (streams of one shape share
    them: the instructions are immutable)."""
    instrs = tuple(instrs)
    if plan is None:
        written = written_gm(instrs)
        plan = plan_flags([i.pipe for i in instrs], [accesses(i, written) for i in instrs])
        made = None
    if made is None:
        made = _flag_instrs(plan)
    before, after = made
    out = []
    append = out.append
    extend = out.extend
    if not before and not after:
        return instrs, plan, made
    for idx, ins in enumerate(instrs):
        pre = before.get(idx)
        if pre is not None:
            extend(pre)
        append(ins)
        post = after.get(idx)
        if post is not None:
            extend(post)
    return tuple(out), plan, made


def _flag_instrs(plan) -> tuple[dict, dict]:
    """The SET_FLAG / WAIT_FLAG instructions of a plan: {index: [Instr]} before and after (a
    SET_FLAG and its WAIT_FLAG share their attributes)."""
    before, after, _ = plan
    attrs: dict[int, Attrs] = {}
    make = Instr._make

    def sync(op, pipe, key):
        a = attrs.get(id(key))
        if a is None:
            a = attrs[id(key)] = Attrs.of({"src": key[0], "dst": key[1], "event": key[2]})
        return make(op, pipe, None, (), a, None)

    # (ids of the plan's key tuples: the plan keeps them alive)
    return ({idx: [sync(*e) for e in ops] for idx, ops in before.items()},
            {idx: [sync(*e) for e in ops] for idx, ops in after.items()})


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
    n = len(pipes)
    events = EVENTS_PER_PIPE_PAIR
    # per range [writer's pipe or None, writer's index, {pipe: newest reader since}] (updated in place)
    ranges: dict[str, Intervals] = collections.defaultdict(Intervals)
    # per access (by id: the accesses outlive the call; tile operands share theirs): (its table,
    # the table's size when resolved, the value lists of the ranges overlapping it, its own
    # range's value list); a range added to the table makes it resolve again
    resolved: dict[int, tuple] = {}

    def resolve(a):
        table = ranges[a[0]]
        lo, hi = a[1], a[2]
        vals = table.values
        got = (table, len(vals), tuple([vals[k] for k in table.overlapping(lo, hi)]), vals.get((lo, hi)))
        resolved[id(a)] = got
        return got

    synced_to: dict[str, dict[str, int]] = {}   # q -> p -> the newest P instruction a flag P->Q covers
    next_event: dict[tuple[str, str], int] = {}
    live: dict[tuple[str, str], list] = {}      # pending flags per pair: [event, consumer index]
    # what each pipe knows: the newest instruction of every other pipe known to have finished
    # (a vector clock; copied on change, so an instruction's snapshot is a shared reference)
    clock: dict[str, dict[str, int]] = {}
    last_of: dict[str, int] = {}                # the newest instruction of each pipe so far
    snap: list = [None] * n                     # the clock of an instruction's pipe at it
    before: dict[int, list] = {}
    after: dict[int, list] = {}
    flags: list[tuple] = []
    empty: dict = {}

    def take_event(pair, known, floor):
        """A free event id for a SET_FLAG of the pair whose pipe knows `known`, or None when all
        are pending.  `floor`: what every later SET_FLAG of the pair will know at least (ids
        it frees are dropped for good)."""
        pend = live.get(pair)
        if pend is None:
            pend = live[pair] = []
        dst = pair[1]
        done = floor.get(dst, -1)
        while pend and pend[0][1] <= done:      # its WAIT_FLAG ran: the id is free again
            pend.pop(0)
        ev = next_event.get(pair, 0)
        if len(pend) < events:                  # the usual case: the next id, when not pending
            for x in pend:
                if x[0] == ev:
                    break
            else:
                next_event[pair] = (ev + 1) % events
                return ev
        done = known.get(dst, -1)
        used = {e for e, c in pend if c > done}
        if len(used) >= events:
            return None
        while ev in used:
            ev = (ev + 1) % events
        next_event[pair] = (ev + 1) % events
        pend[:] = [x for x in pend if x[0] != ev]       # a newer use of the id replaces the old
        return ev

    def merged(mine: dict, known: dict, pipe: str, at: int) -> dict:
        """`mine` updated with `known` and with `pipe` being past instruction `at` (a new dict
        when anything changes)."""
        out = None
        if at > mine.get(pipe, -1):
            out = dict(mine)
            out[pipe] = at
        for p, k in known.items():
            if k > mine.get(p, -1) and (out is None or k > out.get(p, -1)):
                if out is None:
                    out = dict(mine)
                out[p] = k
        return mine if out is None else out

    for idx in range(n):
        q = pipes[idx]
        need: dict[str, int] = {}
        acc = accesses[idx]
        sq = synced_to.get(q)
        if sq is None:
            sq = synced_to[q] = {}
        for a in acc:
            r = resolved.get(id(a))
            if r is None or len(r[0].values) != r[1]:
                r = resolve(a)
            w = a[3]
            for v in r[2]:
                p = v[0]
                if p is not None and p != q:
                    j = v[1]
                    if j > sq.get(p, -1) and j > need.get(p, -1):
                        need[p] = j
                if w:
                    for p, j in v[2].items():
                        if p != q and j > sq.get(p, -1) and j > need.get(p, -1):
                            need[p] = j
        cq = clock.get(q, empty)
        if need:
            pre = before.setdefault(idx, [])
            for p, j in sorted(need.items()) if len(need) > 1 else need.items():
                pair = (p, q)
                known = snap[j]
                # take_event(pair, known, known), its usual case inline: the next id, not pending
                pend = live.get(pair)
                if pend is None:
                    pend = live[pair] = []
                done = known.get(q, -1)
                while pend and pend[0][1] <= done:
                    pend.pop(0)
                ev = next_event.get(pair, 0)
                if len(pend) < events:
                    for x in pend:
                        if x[0] == ev:
                            ev = take_event(pair, known, known)
                            break
                    else:
                        next_event[pair] = (ev + 1) % events
                else:
                    ev = take_event(pair, known, known)
                if ev is None:
                    # all ids pending: Q tells P it is past the oldest WAIT_FLAG (a flag back,
                    # covering every Q instruction so far), P waits for it and sets the new flag
                    # right after; all four just before this instruction
                    back = (q, p)
                    bev = take_event(back, cq, cq)
                    if bev is None:     # both directions exhausted (never seen): reuse the oldest id
                        bev = live[back].pop(0)[0]
                    bk = (q, p, bev)
                    pre.append(("SET_FLAG", q, bk))
                    pre.append(("WAIT_FLAG", p, bk))
                    live[back].append([bev, idx])
                    if q in last_of:
                        sp = synced_to.get(p)
                        if sp is None:
                            sp = synced_to[p] = {}
                        sp[q] = max(sp.get(q, -1), last_of[q])
                    cp = clock[p] = merged(clock.get(p, empty), cq, q, last_of.get(q, -1))
                    known = cp
                    ev = take_event(pair, known, snap[j])
                    if ev is None:      # cannot happen: P now knows Q is past every pending wait
                        ev = live[pair].pop(0)[0]
                    fk = (p, q, ev)
                    pre.append(("SET_FLAG", p, fk))
                    at = last_of[p]
                else:
                    fk = (p, q, ev)
                    a = after.get(j)
                    if a is None:
                        after[j] = [("SET_FLAG", p, fk)]
                    else:
                        a.append(("SET_FLAG", p, fk))
                    at = j
                pre.append(("WAIT_FLAG", q, fk))
                live[pair].append([ev, idx])
                cq = merged(cq, known, p, at)
                sq[p] = j
                flags.append((p, q, j, idx))
            clock[q] = cq
        snap[idx] = cq
        last_of[q] = idx
        for a in acc:
            r = resolved.get(id(a))
            if r is None or len(r[0].values) != r[1]:
                r = resolve(a)
            v = r[3]
            if v is None:               # its range is new: in the table, and resolved again
                r[0].set((a[1], a[2]), [None, -1, {}])
                r = resolve(a)
                v = r[3]
            if a[3]:
                # a write supersedes everything it overlaps: later accesses only need to see it
                for o in r[2]:
                    o[0] = q
                    o[1] = idx
                    o[2] = {}
            else:
                v[2][q] = idx
    return before, after, flags
