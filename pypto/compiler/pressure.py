"""Buffer-pressure analysis (Execution level): peak live bytes per task and on-chip space.

A tile's bytes are live from the instruction that writes them to the last instruction that
reads them before they are overwritten (bytes a task reads before writing them are live from
its start; bytes written and never read, at their writer only).  Walking a task's instruction
order, the analysis sums the live bytes of each space (UB, L1, L0A, L0B, L0C, BT) at every
instruction and keeps the peak: how full each buffer gets in the order the pipes will run
it, against the machine's capacity.  An instruction that overwrites what it reads in place
(TMATMUL_ACC, an in-place vector op) counts those bytes once.

Live bytes beyond a space's capacity cannot have been allocated: that is an allocator (or a
hand-made graph's) bug, reported as a VerificationError naming the task, the space and the
instruction where the peak is reached.

    rows = pypto.compiler.buffer_pressure(ck.exec_graph, ck.machine)
    print(rows)                      # a table per group; rows.text(per_task=True): every task
    rows[0].peak, rows[0].share      # bytes, fraction of the capacity

The pass `buffer_pressure` (after `scheduling` and `insert_sync`) computes the table of the
graph it sees, once per shape of isomorphic tasks, and leaves the graph unchanged (a failing
check stops the compile).  `buffer_pressure(graph, machine)` returns the table of any
Execution Graph, computed once per graph and machine; for `ck.exec_graph` it has the pass's
peaks (flags, like the cross-core ones added later, change no live bytes; only the
instruction indices `at` move with them).
"""
from __future__ import annotations

from itertools import chain, compress
from operator import attrgetter, itemgetter, not_
from typing import NamedTuple

import numpy as np

from ..errors import VerificationError
from ..ir.core import gather
from ..ir.exec import SYNC_OPS, ExecGraph, accesses, per_shape
from ..target.machine import get_machine
from .pipeline import Pass, PassContext

SPACE_ORDER = ("UB", "L1", "L0A", "L0B", "L0C", "BT")


class PressureRow(NamedTuple):
    """The peak live bytes of one on-chip space in one task."""
    task: int
    group: int
    core_type: str
    space: str
    peak: int          # bytes live at the peak
    capacity: int      # bytes of the space on one core
    at: int            # index (in the task's instructions) of the first instruction at the peak
    tiles: int         # tiles live there

    @property
    def share(self) -> float:
        """peak / capacity."""
        return self.peak / self.capacity if self.capacity else float("inf")


class PressureTable(list):
    """PressureRow per task and space used (tasks in order, spaces UB, L1, L0A, L0B, L0C, BT)."""

    def by_task(self) -> dict[int, dict[str, PressureRow]]:
        out: dict[int, dict[str, PressureRow]] = {}
        for r in self:
            out.setdefault(r.task, {})[r.space] = r
        return out

    def peak(self, space: str) -> int:
        """The highest peak of a space over all tasks (0 when no task uses it)."""
        return max((r.peak for r in self if r.space == space), default=0)

    def text(self, per_task: bool = False) -> str:
        """A table: one line per group, core type and space (the highest peak of the group's
        tasks), or with `per_task=True` one line per task and space."""
        head = (f"{'task' if per_task else 'group':>6} {'core':<4} {'space':<5} {'peak bytes':>11} "
                f"{'capacity':>9} {'share':>7} {'tiles':>5}  " + ("at instr" if per_task else "tasks"))
        lines = [head]
        if per_task:
            for r in self:
                lines.append(f"{r.task:>6} {r.core_type:<4} {r.space:<5} {r.peak:>11} {r.capacity:>9} "
                             f"{100 * r.share:>6.1f}% {r.tiles:>5}  {r.at}")
            return "\n".join(lines)
        groups: dict[tuple, list] = {}
        for r in self:
            g = groups.setdefault((r.group, r.core_type, SPACE_ORDER.index(r.space) if r.space in SPACE_ORDER
                                   else len(SPACE_ORDER), r.space), [None, 0])
            if g[0] is None or r.peak > g[0].peak:
                g[0] = r
            g[1] += 1
        for (group, core, _, space), (r, n) in sorted(groups.items()):
            lines.append(f"{group:>6} {core:<4} {space:<5} {r.peak:>11} {r.capacity:>9} {100 * r.share:>6.1f}% "
                         f"{r.tiles:>5}  {n}")
        return "\n".join(lines)

    def __str__(self):
        return self.text()

    def _repr_pretty_(self, p, cycle):
        p.text(self.text())


def _minus(gaps, lo, hi):
    out = []
    for a, b in gaps:
        if b <= lo or hi <= a:
            out.append((a, b))
            continue
        if a < lo:
            out.append((a, lo))
        if hi < b:
            out.append((hi, b))
    return out


_SYNC = frozenset(SYNC_OPS)
_OP = attrgetter("op")
_WRITE = attrgetter("write")
# streams of this many instructions or more are tried slot by slot; on shorter ones numpy's cost per
# call is more than the walk piece by piece (a vector task's row blocks: 0.5 against 1 ms)
SLOT_MIN = 4096
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


def task_pressure(instrs, memo: dict | None = None) -> dict[str, tuple[int, int, int]]:
    """{space: (peak bytes, index of the first instruction at the peak, tiles live there)} of one
    task's instruction stream (sync instructions are skipped; indices are into `instrs`).

    Live bytes are tracked as pieces [lo, hi) of the tiles written (a write over part of a tile
    ends that part only); bytes read and never written in the task are live from its start.
    A long stream whose tiles never overlap but for being the same (slots: a matmul task's) is
    worked out slot by slot with numpy (`_slot_pressure`), the same figures (`memo`: what it
    learnt of the other streams of the graph, which share most of their instruction objects).
    """
    memo = {} if memo is None else memo
    got = None
    if not memo.get("overlap") and len(instrs) >= SLOT_MIN:
        got = _slot_pressure(instrs, memo)
        memo["overlap"] = got is None       # (a graph whose tiles overlap: piece by piece from now)
    return got if got is not None else _piece_pressure(instrs)


def _slot_pressure(instrs, memo: dict) -> dict[str, tuple[int, int, int]] | None:
    """`task_pressure` of a stream whose on-chip accesses are whole slots that never overlap one
    another (None for any other stream): the accesses of each slot in order, reads before writes
    in an instruction, cut into the pieces of `_piece_pressure` at its writes (a piece lives from
    its write to its last read before the next write, or from the task's start for reads before
    the first), their bytes summed over the stream with numpy."""
    n = len(instrs)
    at = list(compress(range(n), map(not_, map(_SYNC.__contains__, map(_OP, instrs)))))
    if not at:
        return {}
    slots = memo.setdefault("slots", {})           # (space, lo, hi) -> slot number
    rows = memo.setdefault("rows", {})             # id of an instruction -> (its slots, writes: reads first; it)
    objs = gather(instrs, at)
    ids = list(map(id, objs))
    for key, x in dict(zip(ids, objs)).items():     # (each instruction object once, in order)
        if key in rows:
            continue
        acc = sorted((a for a in accesses(x) if not a.key.startswith("GM:")), key=_WRITE)
        rows[key] = ([slots.setdefault(a[:3], len(slots)) for a in acc], [a.write for a in acc], x)
    got = list(map(rows.__getitem__, ids))
    slot = list(chain.from_iterable(map(_FIRST, got)))
    write = list(chain.from_iterable(map(_SECOND, got)))
    pos = np.repeat(np.array(at, np.int64), np.fromiter(map(len, map(_FIRST, got)), np.int64, len(got)))
    if not slot:
        return {}
    keys = list(slots)                             # (a few dozen)
    slot_a = np.array(slot, np.int64)
    by_space: dict = {}
    for k in np.unique(slot_a).tolist():           # (the slots of this stream)
        space, lo, hi = keys[k]
        by_space.setdefault(space, []).append((lo, hi))
    for ranges in by_space.values():
        ranges.sort()
        if any(b[0] < a[1] for a, b in zip(ranges, ranges[1:])):
            return None         # (tiles that overlap in part: piece by piece)
    last = at[-1]
    pos_a, write_a = pos, np.array(write, bool)
    order = np.argsort(slot_a, kind="stable")       # each slot's accesses in stream order
    pos_a, slot_a, write_a = pos_a[order], slot_a[order], write_a[order]
    # the pieces: from each slot's first access (reads before any write: live from the start)
    # and from each write, to the access before the next piece's first
    first = np.ones(len(slot_a), bool)
    first[1:] = slot_a[1:] != slot_a[:-1]
    first = np.flatnonzero(first | write_a)
    p_slot, p_write = slot_a[first], write_a[first]
    p_start = np.where(p_write, pos_a[first], 0)
    p_end = np.maximum.reduceat(pos_a, first)        # its last read (or its write)
    # a piece whose slot's next write is the instruction of its last read is overwritten in place:
    # its bytes are the new piece's there
    next_write = np.zeros(len(first), bool)
    next_write[:-1] = (p_slot[1:] == p_slot[:-1]) & p_write[1:]
    in_place = next_write & (p_end == np.append(pos_a[first[1:]], -1))
    end = p_end - in_place
    size = np.array([hi - lo for _, lo, hi in keys], np.int64)[p_slot]
    space_of = np.array([k[0] for k in keys], object)[p_slot]      # (all slots: a few dozen)
    out = {}
    for space in sorted(by_space):
        mine = space_of == space
        live = mine & (end >= p_start)
        delta = np.bincount(p_start[live], size[live], minlength=last + 2) - \
            np.bincount(end[live] + 1, size[live], minlength=last + 2)
        curve = np.cumsum(delta[:last + 1])
        k = int(curve.argmax())
        peak = int(curve[k])
        if peak <= 0:
            peak, k = 0, 0
        out[space] = (peak, k, int(np.count_nonzero(mine & (p_start <= k) & (k <= end))))
    return out


def _piece_pressure(instrs) -> dict[str, tuple[int, int, int]]:
    """`task_pressure` piece by piece (any stream)."""
    # space -> the open pieces {lo: [lo, hi, start, last read, tile id]}: they never overlap (a
    # write cuts what it overlaps), so their starts differ, and an access of exactly a piece's
    # range touches that piece only: one dict probe (a task's accesses are mostly whole tiles,
    # its pieces whole tiles too)
    opened: dict[str, dict] = {}
    pieces: dict[str, list] = {}        # space -> every piece (lo, hi, start, end, tile id, in place)
    last = -1
    tile = 0
    # id of an instruction -> (its on-chip reads, its on-chip writes), worked out once per
    # instruction object: equal instructions are mostly one object (a matmul's extracts and
    # MACs repeat from output tile to output tile)
    onchip: dict[int, tuple] = {}
    # (the instructions other than sync ones, picked at C level: a synced stream is mostly flags)
    for i in compress(range(len(instrs)), map(not_, map(_SYNC.__contains__, map(_OP, instrs)))):
        last = i
        ins = instrs[i]
        got = onchip.get(id(ins))
        if got is None:
            mine = [a for a in accesses(ins) if not a.key.startswith("GM:")]
            got = onchip[id(ins)] = ([a for a in mine if not a.write], [a for a in mine if a.write])
        reads, writes = got
        for space, lo, hi, _ in reads:
            vals = opened.get(space)
            if vals is None:
                vals = opened[space] = {}
            v = vals.get(lo)
            if v is not None and v[1] == hi:
                v[3] = i
                continue
            gaps = [(lo, hi)]
            for v in vals.values():
                if v[0] < hi and lo < v[1]:
                    v[3] = i
                    if gaps:
                        # (a piece covering the whole read leaves no gap)
                        gaps = [] if v[0] <= lo and hi <= v[1] else _minus(gaps, v[0], v[1])
            if gaps:                    # never written in the task: live from its start
                tile += 1
                for x, y in gaps:
                    vals[x] = [x, y, 0, i, tile]
        for space, lo, hi, _ in writes:
            done = pieces.get(space)
            if done is None:
                done = pieces[space] = []
            vals = opened.get(space)
            if vals is None:
                vals = opened[space] = {}
            v = vals.get(lo)
            if v is not None and v[1] == hi:        # (the only piece it overlaps)
                # (e == i: read here, overwritten here)
                done.append((lo, hi, v[2], v[3], v[4], v[3] == i))
            else:
                for key in [key for key, v in vals.items() if v[0] < hi and lo < v[1]]:
                    a, b, s, e, t = vals.pop(key)
                    done.append((a if a > lo else lo, b if b < hi else hi, s, e, t, e == i))
                    if a < lo:
                        vals[a] = [a, lo, s, e, t]
                    if hi < b:
                        vals[hi] = [hi, b, s, e, t]
            tile += 1
            vals[lo] = [lo, hi, i, i, tile]
    out = {}
    for space in sorted(set(opened) | set(pieces)):
        vals = pieces.get(space, []) + [(v[0], v[1], v[2], v[3], v[4], False) for v in opened.get(space, {}).values()]
        delta: dict[int, int] = {}
        for lo, hi, s, e, _, in_place in vals:
            if in_place:                # its bytes are the new tile's at e: counted up to e - 1
                e -= 1
            if e < s:
                continue
            delta[s] = delta.get(s, 0) + hi - lo
            delta[e + 1] = delta.get(e + 1, 0) - (hi - lo)
        live = 0
        best = (0, 0)
        for k in sorted(delta):
            if k > last:
                break
            live += delta[k]
            if live > best[0]:
                best = (live, k)
        peak, at = best
        tiles = {t for lo, hi, s, e, t, in_place in vals if s <= at <= e - in_place}
        out[space] = (peak, at, len(tiles))
    return out


def buffer_pressure(g: ExecGraph, machine) -> PressureTable:
    """The PressureTable of an Execution Graph on a machine (computed once per graph and
    machine).  Raises VerificationError when a task's live bytes exceed a space's capacity."""
    machine = get_machine(machine)
    cache = g.__dict__.setdefault("_pressure", {})
    if machine in cache:
        return cache[machine]
    caps = machine.capacities()
    table = PressureTable()
    known: dict = {}
    memo: dict = {}             # (the instruction objects the streams share, for `task_pressure`)
    for t in g.tasks:
        found = per_shape(g, known, t.instrs, lambda: task_pressure(t.instrs, memo))
        for space in sorted(found, key=lambda s: (SPACE_ORDER.index(s) if s in SPACE_ORDER else 99, s)):
            peak, at, tiles = found[space]
            cap = caps.get(space, 0)
            if peak > cap:
                ins = t.instrs[at]
                raise VerificationError(
                    f"buffer pressure: task {t.id} ({t.core_type}, group {t.group}) has {peak} bytes of {space} "
                    f"live at instruction {at} ({ins.op}), more than the {space} capacity: an allocation bug",
                    loc=ins.loc, expected=f"at most {cap} bytes of {space} ({cap // 1024} KiB)", got=f"{peak} bytes")
            table.append(PressureRow(t.id, t.group, t.core_type, space, peak, cap, at, tiles))
    cache[machine] = table
    return table


def _pressure_pass(g: ExecGraph, ctx: PassContext | None = None) -> ExecGraph:
    if ctx is not None:
        buffer_pressure(g, ctx.machine)
    return g


BUFFER_PRESSURE = Pass("buffer_pressure", "exec", _pressure_pass,
                       "peak live bytes per task and on-chip space against the capacity (an analysis)")
