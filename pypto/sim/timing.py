"""Timing simulation: a deterministic event loop over cores, pipes, flags, the L2 and the HBM.

Each core runs one task at a time; each of its pipes executes its instructions in order.  A
WAIT_FLAG blocks its pipe until the matching SET_FLAG (counted per pipe pair and event id) has
executed.  A GM load is served by the shared L2 when the same window is resident there (it was
loaded or stored before and not evicted), else by the HBM; both are shared by all cores, first
come first served, and every transfer is also limited by its path's bandwidth.  DMA engines keep
several requests in flight: a load occupies its pipe only while its bytes stream, and its data is
ready an L2 hit (or miss) latency later; a SET_FLAG waits until every earlier instruction of its
pipe has its data ready, so the consumer behind the flag sees the latency once per batch of loads,
not once per load.  Tasks start when
their dependencies are done, on the free core of their type with the lowest id, after a dispatch
overhead.  Events are ordered by (cycle, sequence number), so the same program always gives the
same cycles and trace.
"""
from __future__ import annotations

import heapq
import math
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass

from ..errors import SimulationError
from ..ir.exec import AIC_PIPES, AIV_PIPES, TileRef
from ..ir.gm import GMRef
from ..ir.program import Program
from .cost import base_cycles, dma_bytes, dma_path, is_vector
from .machine import Machine

# instruction kinds of the decoded program
COMPUTE, VECTOR, SET, WAIT, GM_LOAD, GM_STORE = range(6)


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
    ready: int = -1  # when the result is usable (a load's latency after `end`); -1: at `end`

    @property
    def done(self) -> int:
        return self.end if self.ready < 0 else self.ready


def _decode(program: Program, machine: Machine):
    """Per task: a tuple per instruction (kind, pipe, cycles, flag key, bytes, path, bytes/cycle, window)."""
    cache = program.__dict__.setdefault("_timing_decode", {})
    if machine in cache:
        return cache[machine]
    out = []
    cycles_of: dict[tuple, int] = {}      # interned operands: equal instructions cost the same
    for t in program.tasks:
        rows = []
        for ins in t.instrs:
            key = nbytes = path = bpc = window = None
            if ins.op == "SET_FLAG" or ins.op == "WAIT_FLAG":
                kind = SET if ins.op == "SET_FLAG" else WAIT
                key = (ins.attrs["src"], ins.attrs["dst"], ins.attrs["event"])
            elif ins.op in ("TLOAD", "TSTORE") and (isinstance(ins.dst, GMRef) or isinstance(ins.srcs[0], GMRef)):
                kind = GM_LOAD if ins.op == "TLOAD" else GM_STORE
                nbytes = dma_bytes(ins)
                src, dst = dma_path(ins)
                path, bpc = f"{src}->{dst}", machine.dma_bytes_per_cycle(src, dst)
                window = ins.srcs[0] if kind == GM_LOAD else ins.dst
            else:
                kind = VECTOR if is_vector(ins.op) else COMPUTE
                if ins.op in ("TEXTRACT", "TMOV"):
                    src, dst = dma_path(ins)
                    path, nbytes = f"{src}->{dst}", dma_bytes(ins)
            if window is not None:
                cyc = 0             # GM transfers are timed when they run (L2, HBM)
            else:
                ck = (ins.op, id(ins.dst), tuple(id(s) if isinstance(s, TileRef) else s for s in ins.srcs))
                cyc = cycles_of.get(ck)
                if cyc is None:
                    cyc = cycles_of[ck] = base_cycles(ins, machine)
            rows.append((kind, ins.pipe, cyc, key, nbytes, path, bpc, window))
        out.append(rows)
    cache[machine] = out
    return out


class L2Cache:
    """The shared L2, tracked by GM window: a load hits when the same window is resident.

    Loads and stores (write-allocate) make a window resident; the least recently used windows
    are evicted beyond the capacity.  Tracking whole tiles instead of 512-byte lines keeps the
    model cheap and captures the reuse tile kernels have: operand tiles re-read by other output
    tiles, workspaces re-read by the next group.
    """

    def __init__(self, capacity_bytes: int):
        self.capacity = capacity_bytes
        self.windows: OrderedDict = OrderedDict()
        self.used = 0
        self.hits = self.misses = self.hit_bytes = self.miss_bytes = 0

    def touch(self, window, nbytes: int) -> bool:
        """Make the window resident; return whether it already was."""
        hit = window in self.windows
        if hit:
            self.windows.move_to_end(window)
        else:
            self.windows[window] = nbytes
            self.used += nbytes
            while self.used > self.capacity and self.windows:
                _, b = self.windows.popitem(last=False)
                self.used -= b
        return hit


class _Running:
    __slots__ = ("task", "rows", "core", "queues", "ptr", "free", "ready", "last_vector_end", "flags",
                 "waiting", "open", "start", "end")

    def __init__(self, task, rows, core: str, start: int, pipes):
        self.task, self.rows, self.core = task, rows, core
        self.queues = {p: [] for p in pipes}
        for k, row in enumerate(rows):
            self.queues[row[1]].append(k)
        self.ptr = {p: 0 for p in pipes}
        self.free = {p: start for p in pipes}
        self.ready = {p: start for p in pipes}      # when the pipe's last in-flight data is ready
        self.last_vector_end = -1
        self.flags: dict[tuple, list[int]] = {}
        self.waiting: dict[tuple, str] = {}
        self.open = sum(1 for q in self.queues.values() if q)
        self.start = self.end = start


class _Progress:
    """A one-line progress bar on stderr, shown only when the simulation runs longer than a second."""

    def __init__(self, total: int, what: str):
        self.total, self.what = max(total, 1), what
        self.t0 = time.perf_counter()
        self.shown = False

    def update(self, done: int):
        elapsed = time.perf_counter() - self.t0
        if elapsed < 1.0:
            return
        self.shown = True
        frac = done / self.total
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r{self.what} [{bar:<30}] {100 * frac:5.1f}% {done}/{self.total} instructions, "
                         f"{elapsed:.1f} s")
        sys.stderr.flush()

    def close(self, done: int):
        if self.shown:
            self.update(done)
            sys.stderr.write("\n")


def run_timing(program: Program, machine: Machine, trace: bool = True, record_times: bool = False,
               checked: bool = False, progress: bool = True):
    decoded = _decode(program, machine)
    tasks = program.tasks
    dependents: dict[int, list[int]] = {t.id: [] for t in tasks}
    left = {t.id: len(t.deps) for t in tasks}
    for t in tasks:
        for d in t.deps:
            dependents[d].append(t.id)
    n_cores = {"AIC": machine.n_aic, "AIV": machine.n_aiv}
    free_cores = {k: list(range(n)) for k, n in n_cores.items()}
    ready: dict[str, list[int]] = {"AIC": [], "AIV": []}
    heap: list = []
    seq = 0
    running: dict[str, _Running] = {}
    events: list[TraceEvent] = []
    times = [[None] * len(t.instrs) for t in tasks] if record_times else None
    busy: dict[tuple[str, str], int] = {}
    bytes_by_path: dict[str, int] = {}
    l2 = L2Cache(machine.l2_bytes)
    hbm_free = l2_free = 0.0
    hbm_bpc, l2_bpc = machine.hbm_bytes_per_cycle, machine.l2_bytes_per_cycle
    hit_latency = machine.l2_hit_cycles
    miss_latency = machine.l2_hit_cycles + machine.l2_miss_extra_cycles
    hbm_bytes = 0
    done = executed = 0
    end_time = 0
    task_times: dict[int, tuple[str, int, int]] = {}
    unwaited: list[str] = []
    total = sum(len(t.instrs) for t in tasks)
    bar = _Progress(total, f"simulating {program.name}") if progress else None

    for t in tasks:
        if not t.deps:
            ready[t.core_type].append(t.id)
    heapq.heappush(heap, (0, seq, 0, None))     # kind 0: dispatch, 1: finish, 2: pipe step
    seq += 1

    while heap:
        now, _, kind, data = heapq.heappop(heap)
        if kind == 0:
            for ct in ("AIC", "AIV"):
                while ready[ct] and free_cores[ct]:
                    tid = ready[ct].pop(0)
                    name = f"{ct}{free_cores[ct].pop(0)}"
                    start = now + machine.dispatch_cycles
                    r = _Running(tasks[tid], decoded[tid], name, start, AIC_PIPES if ct == "AIC" else AIV_PIPES)
                    running[name] = r
                    if r.open == 0:
                        heapq.heappush(heap, (start, seq, 1, name))
                        seq += 1
                    for p, q in r.queues.items():
                        if q:
                            heapq.heappush(heap, (start, seq, 2, (name, p)))
                            seq += 1
            continue
        if kind == 1:
            r = running.pop(data)
            tid = r.task.id
            if checked and any(r.flags.values()):
                key = next(k for k, v in r.flags.items() if v)
                unwaited.append(f"task {tid} on {data} ends with flag {key[0]} -> {key[1]}, "
                                f"EVENT_ID{key[2]} set but never waited for (a WAIT_FLAG is missing)")
            task_times[tid] = (data, r.start, r.end)
            done += 1
            end_time = max(end_time, r.end)
            ct = data[:3]
            free_cores[ct].append(int(data[3:]))
            free_cores[ct].sort()
            for d in dependents[tid]:
                left[d] -= 1
                if left[d] == 0:
                    ready[tasks[d].core_type].append(d)
            heapq.heappush(heap, (r.end, seq, 0, None))
            seq += 1
            continue
        name, pipe = data
        r = running[name]
        k = r.queues[pipe][r.ptr[pipe]]
        ikind, _, dur, key, nbytes, path, bpc, window = r.rows[k]
        t0 = now if now > r.free[pipe] else r.free[pipe]
        if ikind == WAIT:
            avail = r.flags.get(key)
            if not avail:
                r.waiting[key] = pipe
                continue
            s = avail.pop(0)
            t0 = t0 if t0 > s else s
        elif ikind == SET:
            if r.ready[pipe] > t0:
                t0 = r.ready[pipe]
            pending = r.flags.setdefault(key, [])
            if checked and pending:
                raise SimulationError(_event_reuse(r, k, key))
            pending.append(t0 + dur)
            waiter = r.waiting.pop(key, None)
            if waiter is not None:
                heapq.heappush(heap, (t0 + dur, seq, 2, (name, waiter)))
                seq += 1
        elif ikind == GM_LOAD or ikind == GM_STORE:
            hit = l2.touch(window, nbytes)
            if ikind == GM_LOAD and hit:
                s0 = l2_free if l2_free > t0 else float(t0)
                l2_free = s0 + nbytes / l2_bpc
                served, latency = l2_free, hit_latency
                l2.hits += 1
                l2.hit_bytes += nbytes
            else:
                s0 = hbm_free if hbm_free > t0 else float(t0)
                hbm_free = s0 + nbytes / hbm_bpc
                served = hbm_free
                hbm_bytes += nbytes
                if ikind == GM_LOAD:
                    latency = miss_latency
                    l2.misses += 1
                    l2.miss_bytes += nbytes
                else:
                    latency = 0      # stores are posted: the pipe moves on once the data left
            path_end = t0 + nbytes / bpc
            dur = max(1, math.ceil(max(path_end, served)) - t0)
            data_ready = t0 + dur + latency
            if data_ready > r.ready[pipe]:
                r.ready[pipe] = data_ready
            bytes_by_path[path] = bytes_by_path.get(path, 0) + nbytes
        else:
            if ikind == VECTOR:
                if r.last_vector_end == t0:
                    dur -= machine.vec_head
                r.last_vector_end = t0 + dur
            if path is not None:
                bytes_by_path[path] = bytes_by_path.get(path, 0) + nbytes
        end = t0 + dur
        r.free[pipe] = end
        done_at = data_ready if ikind == GM_LOAD else end
        if done_at > r.end:
            r.end = done_at
        bk = (name, pipe)
        busy[bk] = busy.get(bk, 0) + dur
        executed += 1
        if trace:
            ins = r.task.instrs[k]
            events.append(TraceEvent(name, pipe, ins.op, t0, end, r.task.id, k,
                                     ins.loc.short() if ins.loc else "", done_at if ikind == GM_LOAD else -1))
        if times is not None:
            times[r.task.id][k] = (t0, done_at)
        if bar is not None and executed % 20000 == 0:
            bar.update(executed)
        r.ptr[pipe] += 1
        if r.ptr[pipe] < len(r.queues[pipe]):
            heapq.heappush(heap, (end, seq, 2, bk))
        else:
            r.open -= 1
            if r.open == 0:
                heapq.heappush(heap, (r.end, seq, 1, name))
        seq += 1

    if bar is not None:
        bar.close(executed)
    if done < len(tasks):
        raise SimulationError(_deadlock_report(running, tasks, done))
    return {"cycles": end_time, "events": events, "busy": busy, "bytes_by_path": bytes_by_path,
            "hbm_bytes": hbm_bytes, "instructions": total, "tasks": task_times, "times": times,
            "unwaited": unwaited,
            "l2": {"hits": l2.hits, "misses": l2.misses, "hit_bytes": l2.hit_bytes,
                   "miss_bytes": l2.miss_bytes}}


def _event_reuse(r: _Running, k: int, key) -> str:
    ins = r.task.instrs[k]
    return (f"event id reused before its wait: task {r.task.id} instruction {k} "
            f"SET_FLAG {key[0]} -> {key[1]}, EVENT_ID{key[2]} while the previous set of that event "
            f"has not been waited for (on {r.core}); at most one set per event id may be pending"
            + (f" ({ins.loc.short()})" if ins.loc else ""))


def _deadlock_report(running, tasks, done) -> str:
    lines = [f"deadlock: {len(tasks) - done} of {len(tasks)} tasks cannot finish"]
    for name, r in running.items():
        for key, pipe in r.waiting.items():
            lines.append(f"  {name} task {r.task.id}: pipe {pipe} waits for flag {key[0]}->{key[1]} "
                         f"event {key[2]}, which no instruction will set")
    if len(lines) == 1:
        lines.append("  no task is running: a dependency cycle between tasks")
    return "\n".join(lines)
