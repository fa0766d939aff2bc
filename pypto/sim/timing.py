"""Timing simulation: a deterministic event loop over cores, pipes, flags and the shared HBM.

Each core runs one task at a time; each of its pipes executes its instructions in order.  A
WAIT_FLAG blocks its pipe until the matching SET_FLAG (counted per pipe pair and event id) has
executed.  GM transfers are limited both by their path bandwidth and by the HBM, which serves
all cores first come, first served.  Tasks start when their dependencies are done, on the free
core of their type with the lowest id, after a dispatch overhead.  Events are ordered by
(cycle, sequence number), so the same program always gives the same cycles and trace.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from ..errors import SimulationError
from ..ir.exec import AIC_PIPES, AIV_PIPES, Instr
from ..ir.gm import GMRef
from ..ir.program import Program
from .cost import base_cycles, dma_bytes, dma_path, is_vector
from .machine import Machine


@dataclass(frozen=True)
class TraceEvent:
    core: str        # e.g. "AIV3"
    pipe: str
    op: str
    start: int
    end: int
    task: int
    index: int       # instruction index within the task
    line: str        # kernel source location, "" when none


class _Running:
    def __init__(self, task, core: str, start: int, pipes):
        self.task = task
        self.core = core
        self.queues = {p: [] for p in pipes}
        for k, ins in enumerate(task.instrs):
            self.queues[ins.pipe].append(k)
        self.ptr = {p: 0 for p in pipes}
        self.free = {p: start for p in pipes}
        self.last_vector_end = -1
        self.flags: dict[tuple, list[int]] = {}
        self.waiting: dict[tuple, str] = {}
        self.open = sum(1 for q in self.queues.values() if q)
        self.start = start
        self.end = start


def run_timing(program: Program, machine: Machine, trace: bool = True):
    tasks = program.tasks
    dependents: dict[int, list[int]] = {t.id: [] for t in tasks}
    left = {t.id: len(t.deps) for t in tasks}
    for t in tasks:
        for d in t.deps:
            dependents[d].append(t.id)
    costs = [[base_cycles(i, machine) for i in t.instrs] for t in tasks]
    n_cores = {"AIC": machine.n_aic, "AIV": machine.n_aiv}
    free_cores = {k: list(range(n)) for k, n in n_cores.items()}
    ready = {"AIC": [], "AIV": []}
    heap: list = []
    seq = 0

    def push(time, kind, data):
        nonlocal seq
        heapq.heappush(heap, (time, seq, kind, data))
        seq += 1

    running: dict[str, _Running] = {}
    events: list[TraceEvent] = []
    busy: dict[tuple[str, str], int] = {}
    bytes_by_path: dict[str, int] = {}
    hbm_free = 0.0
    hbm_bytes = 0
    done = 0
    end_time = 0
    task_times: dict[int, tuple[str, int, int]] = {}

    for t in tasks:
        if not t.deps:
            ready[t.core_type].append(t.id)
    push(0, "dispatch", None)

    while heap:
        now, _, kind, data = heapq.heappop(heap)
        if kind == "dispatch":
            for ct in ("AIC", "AIV"):
                while ready[ct] and free_cores[ct]:
                    tid = ready[ct].pop(0)
                    core_id = free_cores[ct].pop(0)
                    name = f"{ct}{core_id}"
                    start = now + machine.dispatch_cycles
                    r = _Running(tasks[tid], name, start, AIC_PIPES if ct == "AIC" else AIV_PIPES)
                    running[name] = r
                    if r.open == 0:
                        push(start, "finish", name)
                    for p, q in r.queues.items():
                        if q:
                            push(start, "pipe", (name, p))
            continue
        if kind == "finish":
            r = running.pop(data)
            tid = r.task.id
            task_times[tid] = (data, r.start, r.end)
            done += 1
            end_time = max(end_time, r.end)
            ct, cid = data[:3], int(data[3:])
            free_cores[ct].append(cid)
            free_cores[ct].sort()
            for d in dependents[tid]:
                left[d] -= 1
                if left[d] == 0:
                    ready[tasks[d].core_type].append(d)
            push(r.end, "dispatch", None)
            continue
        name, pipe = data
        r = running[name]
        k = r.queues[pipe][r.ptr[pipe]]
        ins: Instr = r.task.instrs[k]
        t0 = max(now, r.free[pipe])
        if ins.op == "WAIT_FLAG":
            key = (ins.attrs["src"], ins.attrs["dst"], ins.attrs["event"])
            avail = r.flags.get(key)
            if not avail:
                r.waiting[key] = pipe
                continue
            t0 = max(t0, avail.pop(0))
            dur = costs[r.task.id][k]
        elif ins.op == "SET_FLAG":
            dur = costs[r.task.id][k]
            key = (ins.attrs["src"], ins.attrs["dst"], ins.attrs["event"])
            r.flags.setdefault(key, []).append(t0 + dur)
            waiter = r.waiting.pop(key, None)
            if waiter is not None:
                push(t0 + dur, "pipe", (name, waiter))
        elif _touches_gm(ins):
            nbytes = dma_bytes(ins)
            src, dst = dma_path(ins)
            path_cycles = nbytes / machine.dma_bytes_per_cycle(src, dst)
            h0 = max(float(t0), hbm_free)
            hbm_free = h0 + nbytes / machine.hbm_bytes_per_cycle
            dur = max(1, math.ceil(max(t0 + path_cycles, hbm_free)) - t0)
            hbm_bytes += nbytes
            bytes_by_path[f"{src}->{dst}"] = bytes_by_path.get(f"{src}->{dst}", 0) + nbytes
        else:
            dur = costs[r.task.id][k]
            if is_vector(ins.op):
                if r.last_vector_end == t0:
                    dur -= machine.vec_head
                r.last_vector_end = t0 + dur
            elif ins.op in ("TEXTRACT", "TMOV"):
                src, dst = dma_path(ins)
                bytes_by_path[f"{src}->{dst}"] = bytes_by_path.get(f"{src}->{dst}", 0) + dma_bytes(ins)
        end = t0 + dur
        r.free[pipe] = end
        r.end = max(r.end, end)
        busy[(name, pipe)] = busy.get((name, pipe), 0) + dur
        if trace:
            events.append(TraceEvent(name, pipe, ins.op, t0, end, r.task.id, k,
                                     ins.loc.short() if ins.loc else ""))
        r.ptr[pipe] += 1
        if r.ptr[pipe] < len(r.queues[pipe]):
            push(end, "pipe", (name, pipe))
        else:
            r.open -= 1
            if r.open == 0:
                push(r.end, "finish", name)

    if done < len(tasks):
        raise SimulationError(_deadlock_report(running, tasks, done))
    return {"cycles": end_time, "events": events, "busy": busy, "bytes_by_path": bytes_by_path,
            "hbm_bytes": hbm_bytes, "instructions": sum(len(t.instrs) for t in tasks),
            "tasks": task_times}


def _touches_gm(ins: Instr) -> bool:
    return ins.op in ("TLOAD", "TSTORE") and (isinstance(ins.dst, GMRef) or isinstance(ins.srcs[0], GMRef))


def _deadlock_report(running, tasks, done) -> str:
    lines = [f"deadlock: {len(tasks) - done} of {len(tasks)} tasks cannot finish"]
    for name, r in running.items():
        for key, pipe in r.waiting.items():
            lines.append(f"  {name} task {r.task.id}: pipe {pipe} waits for flag {key[0]}->{key[1]} "
                         f"event {key[2]}, which no instruction will set")
    if len(lines) == 1:
        lines.append("  no task is running: a dependency cycle between tasks")
    return "\n".join(lines)
