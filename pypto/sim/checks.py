"""Checked simulation: races between pipes and between tasks, found from the simulated times.

The program's order is its meaning: inside a task, an instruction must see the result of the
instruction before it in program order that wrote the bytes it reads, and must not overwrite
bytes an earlier instruction still reads.  A race is such a pair whose simulated time intervals
overlap or run in the wrong order (e.g. a WAIT_FLAG was removed).  Between tasks, a task that
reads or writes GM another task writes must run after it.
"""
from __future__ import annotations

import collections

import numpy as np

from ..errors import SimulationError
from ..ir.exec import SYNC_OPS, Intervals, accesses, per_shape, written_gm
from ..ir.gm import Footprint, GMRef
from ..ir.program import Program
from ..target.isa import gm_access


def _describe(task, k) -> str:
    ins = task.instrs[k]
    loc = ""
    if ins.loc:
        text = ins.loc.source_line().strip()
        loc = f" ({ins.loc.short()}: {text})" if text else f" ({ins.loc.short()})"
    return f"task {task.id} instruction {k} {ins.op} on {ins.pipe}{loc}"


def find_races(program: Program, times) -> list[str]:
    """Every race inside a task (first few per task), as readable sentences: on-chip bytes, and
    GM the task writes, by the byte ranges `pypto.ir.exec.accesses` defines for the sync pass.

    Which pairs of instructions must not overlap in time does not depend on the times: for each
    range, the last writer and the readers since (`_hazards`), found once per stream shape
    (isomorphic tasks have the same pairs, their GM windows moved together); a task's times are
    then compared pair by pair with numpy."""
    found = []
    pairs_of: dict = {}
    for t in program.tasks:
        k, j, a, kind = per_shape(program, pairs_of, t.code, lambda: _hazards(t.instrs))
        if not len(k):
            continue
        tt = times[t.id]
        try:
            se = np.array(tt, dtype=np.int64).reshape(len(tt), 2)
        except (TypeError, ValueError):         # an instruction that never ran: no times to compare
            continue
        bad = np.flatnonzero(se[j, 1] > se[k, 0])
        if not len(bad):
            continue
        written = written_gm(t.instrs)
        per_task, last = 0, None
        for b in bad.tolist():
            kk, jj = int(k[b]), int(j[b])
            if per_task >= 3 and kk != last:    # the first few: whole instructions
                break
            last = kk
            space, lo, hi, w = accesses(t.instrs[kk], written)[int(a[b])]
            start, j_end = tt[kk][0], tt[jj][1]
            if kind[b] == _WRITER:
                what = "overwrites" if w else "reads"
                found.append(f"race in task {t.id}: {_describe(t, kk)} {what} {space}[{lo:#x}:{hi:#x}] "
                             f"at cycle {start}, before {_describe(t, jj)} finished writing it "
                             f"(cycle {j_end})")
            else:
                found.append(f"race in task {t.id}: {_describe(t, kk)} overwrites "
                             f"{space}[{lo:#x}:{hi:#x}] at cycle {start} while "
                             f"{_describe(t, jj)} still reads it (until cycle {j_end})")
            per_task += 1
    return found


_WRITER, _READER = 0, 1         # a hazard's earlier instruction: the last writer, or a reader since


def _hazards(instrs):
    """The pairs (k, j) of a stream where instruction k must start after instruction j ends, in
    the order the checker reports them, as arrays: k, j, the index of k's access in
    `accesses(instrs[k], written)`, and whether j is the range's last writer or a reader since."""
    written = written_gm(instrs)
    last_write: dict[str, Intervals] = collections.defaultdict(Intervals)
    readers: dict[str, Intervals] = collections.defaultdict(Intervals)
    ks, js, idx, kinds = [], [], [], []
    for k, ins in enumerate(instrs):
        if ins.op in SYNC_OPS:
            continue
        acc = accesses(ins, written)
        for a, (space, lo, hi, w) in enumerate(acc):
            writes = last_write[space]
            for key in writes.overlapping(lo, hi):
                ks.append(k)
                js.append(writes.get(key))
                idx.append(a)
                kinds.append(_WRITER)
            if w:
                reads = readers[space]
                for key in reads.overlapping(lo, hi):
                    for j in reads.get(key):
                        ks.append(k)
                        js.append(j)
                        idx.append(a)
                        kinds.append(_READER)
        for space, lo, hi, w in acc:
            if w:
                for ranges in (last_write[space], readers[space]):
                    for key in ranges.overlapping(lo, hi):
                        ranges.remove(key)
                last_write[space].set((lo, hi), k)
            else:
                reads = readers[space]
                js_ = reads.get((lo, hi))
                if js_ is None:
                    reads.set((lo, hi), [k])
                else:
                    js_.append(k)
    return (np.asarray(ks, np.int64), np.asarray(js, np.int64), np.asarray(idx, np.int64),
            np.asarray(kinds, np.int8))


def find_task_races(program: Program, task_times, times=None) -> list[str]:
    """Tasks touching the same GM (one writing) whose runs overlap or go against program order.
    A paired epilogue reading its cube task's stores is checked store by store instead (with
    the instruction `times`): cross-core flags let it run alongside its cube task."""
    feet = []
    for t in program.tasks:
        r, w = Footprint(), Footprint()
        for ins in t.instrs:
            if ins.op == "TLOAD" and isinstance(ins.srcs[0], GMRef):
                r.add(ins.srcs[0])
            elif ins.op == "TSTORE" and isinstance(ins.dst, GMRef):
                w.add(ins.dst)
            elif gm_access(ins.op) is not None:         # MGATHER reads its window, MSCATTER writes it
                (r if gm_access(ins.op) == "read" else w).add(ins.srcs[0] if gm_access(ins.op) == "read" else ins.dst)
        feet.append((r, w))
    found = []
    for b in program.tasks:
        for a in program.tasks[:b.id]:
            if a.group == b.group:     # tasks of one group write disjoint tiles (or equal values)
                continue
            (ra, wa), (rb, wb) = feet[a.id], feet[b.id]
            if not (wa.overlaps(rb) or wa.overlaps(wb) or ra.overlaps(wb)):
                continue
            if b.pair is not None and b.pair[0] == a.id and times is not None and not (
                    wa.overlaps(wb) or ra.overlaps(wb)):
                found += _early_reads(a, b, times)
            elif task_times[a.id][2] > task_times[b.id][1]:
                found.append(f"race between tasks: task {b.id} (group {b.group}) starts at cycle "
                             f"{task_times[b.id][1]} on {task_times[b.id][0]} and touches GM that task {a.id} "
                             f"(group {a.group}) writes or reads until cycle {task_times[a.id][2]} on "
                             f"{task_times[a.id][0]}: a dependency is missing")
    return found


def _early_reads(cube, epilogue, times) -> list[str]:
    """Loads of a paired epilogue that start before the cube task's store of that data ended."""
    stores = [(k, i.dst) for k, i in enumerate(cube.instrs) if i.op == "TSTORE" and isinstance(i.dst, GMRef)]
    found = []
    for j, ins in enumerate(epilogue.instrs):
        if ins.op != "TLOAD" or not isinstance(ins.srcs[0], GMRef):
            continue
        start = times[epilogue.id][j][0]
        for k, w in stores:
            if w.overlaps(ins.srcs[0]) and times[cube.id][k][1] > start:
                found.append(f"race between paired tasks: {_describe(epilogue, j)} reads GM at cycle {start} "
                             f"before {_describe(cube, k)} stored it (cycle {times[cube.id][k][1]}): a "
                             f"cross-core flag is missing")
    return found


def find_all_races(program: Program, timing: dict) -> list[str]:
    """The races of a timing run made with record_times: between pipes, between tasks."""
    return find_races(program, timing["times"]) + find_task_races(program, timing["tasks"], timing["times"])


def check_races(program: Program, timing: dict) -> None:
    races = find_all_races(program, timing)
    if races:
        more = f"\n  ... and {len(races) - 5} more" if len(races) > 5 else ""
        raise SimulationError(f"{len(races)} race(s) found by the checked simulation:\n  "
                              + "\n  ".join(races[:5]) + more)
