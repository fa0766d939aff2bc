"""Timing simulation: a deterministic event loop over cores, pipes, flags, the L2 and the HBM.

Each core runs one task at a time; each of its pipes executes its instructions in order.  A
WAIT_FLAG blocks its pipe until the matching SET_FLAG (counted per pipe pair and event id) has
executed.  A GM load is served by the shared L2 when the same window is resident there (it was
loaded or stored before and not evicted), else by the HBM; both are shared by all cores, first
come first served, and every transfer is also limited by its path's bandwidth.  DMA engines keep
several requests in flight: a load occupies its pipe only while its bytes stream, and its data is
ready an L2 hit (or miss) latency later; a SET_FLAG waits until every earlier instruction of its
pipe has its data ready, so the consumer behind the flag sees the latency once per batch of loads,
not once per load.  Tasks start when their dependencies are done, on the free core of their type
with the lowest id, after a dispatch overhead; a vector task paired with a cube task (1 AIC :
2 AIV) starts on AIV 2k + slot once its cube task has started on AIC k, and its
CROSS_WAIT_FLAGs consume, in order, the CROSS_SET_FLAGs that cube task makes for its slot.
Events are ordered by (cycle, sequence number), so the same program always gives the same
cycles and trace.

Two engines run this model with identical results: the event loop below (the reference), and
`timing_fast`, the same loop compiled with numba over an array encoding of the program, some
20-30x faster; `run_timing(engine=...)` chooses (by default the compiled one for large programs).
Both run the instructions as `Decoder` decodes them.
"""
from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

from ..errors import PyptoError, SimulationError
from ..gcpause import gc_paused
from ..progress import stage
from ..ir.exec import AIC_PIPES, AIV_PIPES, SIM_CACHE, stream_shape
from ..ir.gm import GMRef
from ..ir.program import Program
from ..target.cost import base_cycles, dma_bytes, dma_path, gm_fixed_cycles, is_vector
from ..target.machine import Machine

# instruction kinds of the decoded program
COMPUTE, VECTOR, SET, WAIT, GM_LOAD, GM_STORE, CROSS_SET, CROSS_WAIT = range(8)


class TraceEvent(NamedTuple):
    """One executed instruction (a NamedTuple: a trace has one per instruction, made fast)."""
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


class Trace(Sequence):
    """The trace of a timing run: its TraceEvents in execution order, made when first read.

    A run of a million instructions takes a fraction of a second in the compiled engine, while
    a million event objects take seconds to make: the engine keeps the few numbers per executed
    instruction, and the events are made only when a timeline, a Chrome trace or a test reads
    them (`make` returns the list; `n` is its length when known before).  Compares equal to the
    list of its events."""

    __slots__ = ("_make", "_n", "_events")

    def __init__(self, make, n: int | None = None):
        self._make, self._n, self._events = make, n, None

    @property
    def events(self) -> list:
        if self._events is None:
            with gc_paused():          # a million small objects that form no cycles
                self._events = list(self._make())
            self._make = None
        return self._events

    @property
    def made(self) -> bool:
        """Whether the events exist yet (reading the trace makes them)."""
        return self._events is not None

    def __len__(self):
        return len(self.events) if self._n is None or self._events is not None else self._n

    def __getitem__(self, i):
        return self.events[i]

    def __iter__(self):
        return iter(self.events)

    def __eq__(self, other):
        if isinstance(other, Trace):
            other = other.events
        return self.events == other if isinstance(other, list) else NotImplemented

    __hash__ = None

    def __repr__(self):
        return f"Trace({len(self)} events{'' if self.made else ', not made yet'})"


def sim_cache(program: Program) -> dict:
    """What the simulator keeps about a program's instruction streams (`ir.exec.SIM_CACHE`):
    shared with the programs the compiler made from the very same streams."""
    return program.__dict__.setdefault(SIM_CACHE, {})


def _decode(program: Program, machine: Machine):
    """Per task: a tuple per instruction (kind, pipe, cycles, flag key, bytes, path, bytes/cycle,
    window); and the program's matmul FLOPs.  Cached with the streams (`sim_cache`)."""
    cache = sim_cache(program)
    key = ("decode", machine)
    if key not in cache:
        decoder = Decoder(machine)
        cache[key] = ([decoder.task(t, program) for t in program.tasks], decoder.flops)
    return cache[key]


def matmul_flops(ins) -> int:
    """2 M K N of a TMATMUL* instruction (of the valid shapes of its L0A and L0B operands)."""
    a, b = ins.srcs[-2], ins.srcs[-1]
    return 2 * a.valid[0] * a.valid[1] * b.valid[1]


class Decoder:
    """Decodes instructions for the timing engines (both run these rows; see `_decode`).

    Everything but a GM transfer's window and bytes depends only on the op and its operand
    objects, so it is worked out once per distinct (op, operands) of a program, keyed by object
    ids: they stay valid because the program keeps its instructions alive.
    """

    def __init__(self, machine: Machine):
        self.machine = machine
        self.sync_cycles: dict[str, int] = {}
        self.gm_paths: dict[tuple, tuple] = {}          # (src, dst) -> (path, bytes/cycle)
        self.computes: dict[tuple, tuple] = {}          # (op, operand ids) -> (kind, cycles, bytes, path)
        self.shapes: dict[int, tuple] = {}              # stream shape -> (rows, indices of its GM rows, flops)
        self.flops = 0                                  # of the matmuls of the tasks decoded

    def task(self, task, program=None) -> list[tuple]:
        """The rows of a task's instructions.  Tasks the compiler found isomorphic (the same
        stream shape, `compiler.sync.STREAM_SHAPES` on the program) share every row but their GM
        transfers': those are decoded, the rest is copied from the first task of the shape."""
        shape = stream_shape(program, task.code) if program is not None else None
        known = self.shapes.get(shape) if shape is not None else None
        if known is not None:
            rows = list(known[0])
            for k, r in zip(known[1], self._gm_rows(task, known)):
                rows[k] = r
            return rows
        before = self.flops
        rows = self._rows(task)
        if shape is not None:
            self.shapes[shape] = (rows, [k for k, r in enumerate(rows) if r[0] == GM_LOAD or r[0] == GM_STORE],
                                  self.flops - before)
        return rows

    def gm_rows(self, task, program) -> tuple[int, list[int], list[tuple]] | None:
        """For a task isomorphic to one decoded before: (its number of rows, the indices of its
        GM rows, those rows); the other rows are the first task's.  None for another task."""
        shape = stream_shape(program, task.code)
        known = self.shapes.get(shape) if shape is not None else None
        if known is None:
            return None
        return len(known[0]), known[1], self._gm_rows(task, known)

    def gm_windows(self, task, program) -> tuple[int, list[int], list, dict] | None:
        """`gm_rows` for the compiled engine's encoder: (rows, indices of the GM rows, the GM
        window of each, {position among them: the whole row} for the rows that differ from the
        first task's but for their window); None for a task of a shape not decoded before."""
        shape = stream_shape(program, task.code)
        known = self.shapes.get(shape) if shape is not None else None
        if known is None:
            return None
        rows, gm_at, flops = known
        self.flops += flops
        instrs, windows, other = task.instrs, [], {}
        append = windows.append
        for j, k in enumerate(gm_at):
            ins, r = instrs[k], rows[k]
            w = ins.srcs[0] if r[0] == GM_LOAD else ins.dst
            was = r[7]
            if not (w.buf is was.buf and w.strides == was.strides and w.shape == was.shape):
                other[j] = self._gm_row(ins)
            append(w)
        return len(rows), gm_at, windows, other

    def _gm_rows(self, task, known) -> list[tuple]:
        rows, gm_at, flops = known
        self.flops += flops
        instrs, out = task.instrs, []
        for k in gm_at:
            # a window of the same buffer, shape and strides: the same row but for the window
            ins, r = instrs[k], rows[k]
            w = ins.srcs[0] if r[0] == GM_LOAD else ins.dst
            was = r[7]
            out.append(r[:7] + (w,) if w.buf is was.buf and w.strides == was.strides and w.shape == was.shape
                       else self._gm_row(ins))
        return out

    def _gm_row(self, ins) -> tuple:
        sd = dma_path(ins)
        path = self.gm_paths.get(sd)
        if path is None:
            path = self.gm_paths[sd] = (f"{sd[0]}->{sd[1]}", self.machine.gm_load_bytes_per_cycle(*sd))
        # only the fixed cycles (a calibrated DMA's startup): the bytes are timed when they run
        # (L2, HBM)
        if ins.op == "TLOAD":
            return (GM_LOAD, ins.pipe, gm_fixed_cycles(ins, self.machine), None, dma_bytes(ins), path[0], path[1],
                    ins.srcs[0])
        return (GM_STORE, ins.pipe, 0, None, dma_bytes(ins), path[0], path[1], ins.dst)

    def _rows(self, task) -> list[tuple]:
        rows = []
        append = rows.append
        computes, sync_cycles, flops = self.computes, self.sync_cycles, 0
        for ins in task.instrs:
            op, dst, srcs = ins.op, ins.dst, ins.srcs
            if op == "SET_FLAG" or op == "WAIT_FLAG":
                cyc = sync_cycles.get(op)
                if cyc is None:
                    cyc = sync_cycles[op] = base_cycles(ins, self.machine)
                a = ins.attrs._dict
                append((SET if op == "SET_FLAG" else WAIT, ins.pipe, cyc, (a["src"], a["dst"], a["event"]),
                        0, None, None, None))
            elif op == "CROSS_SET_FLAG" or op == "CROSS_WAIT_FLAG":
                cyc = sync_cycles.get(op)
                if cyc is None:
                    cyc = sync_cycles[op] = base_cycles(ins, self.machine)
                # the key of a set is the AIV slot it signals; a wait's is its task's pair
                setting = op == "CROSS_SET_FLAG"
                append((CROSS_SET if setting else CROSS_WAIT, ins.pipe, cyc, ins.attrs["slot"] if setting else None,
                        0, None, None, None))
            elif (op == "TLOAD" or op == "TSTORE") and (isinstance(dst, GMRef) or isinstance(srcs[0], GMRef)):
                append(self._gm_row(ins))
            else:
                ck = (op, id(dst), *map(id, srcs))
                c = computes.get(ck)
                if c is None:
                    nbytes, path = 0, None
                    if op in ("TEXTRACT", "TMOV"):
                        src, dst_space = dma_path(ins)
                        path, nbytes = f"{src}->{dst_space}", dma_bytes(ins)
                    kind, cyc = VECTOR if is_vector(op) else COMPUTE, base_cycles(ins, self.machine)
                    # (its flops, its row: one tuple shared by every instruction with these operands)
                    c = computes[ck] = (matmul_flops(ins) if op.startswith("TMATMUL") else 0,
                                        (kind, ins.pipe, cyc, None, nbytes, path, None, None))
                flops += c[0]
                row = c[1]
                append(row if row[1] == ins.pipe else row[:1] + (ins.pipe,) + row[2:])
        self.flops += flops
        return rows


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


ENGINES = ("auto", "python", "compiled")
# Below this many instructions "auto" keeps the Python engine: the compiled engine's first use in a
# process costs ~0.5 s (importing numba, loading the compiled loop from numba's on-disk cache; ~8 s
# on the very first use, when numba compiles it), which is what the Python engine (0.25-0.5 M
# instructions/s) needs for 100-150 k instructions.
COMPILED_MIN_INSTRUCTIONS = 100_000


def timed(program: Program, machine: Machine) -> dict:
    """The timing run the compiler's timing passes ask for (`compiler.PassContext.timing`):
    `run_timing` without a trace or a progress bar."""
    return run_timing(program, machine, trace=False, progress=False)


def run_timing(program: Program, machine: Machine, trace: bool = True, record_times: bool = False,
               checked: bool = False, progress: bool = True, engine: str = "auto"):
    """Simulate the program's timing: cycles, per-task and per-pipe times, bytes, L2 statistics.

    `engine` picks the implementation of the same event loop, with identical results: "python"
    (this module), "compiled" (`timing_fast`, numba; an error when numba is not installed) or
    "auto": the compiled one for programs of at least COMPILED_MIN_INSTRUCTIONS instructions
    when numba is importable, else Python.
    """
    if engine not in ENGINES:
        raise PyptoError("unknown timing engine", expected=" or ".join(ENGINES), got=repr(engine))
    plain = not (record_times or checked)
    if plain and engine == "auto":      # a chosen engine runs: the engines are compared so
        kept = _kept_run(program, machine)
        if kept is not None:
            return kept if not trace else {**kept, "events": Trace(lambda: _fresh_trace(program, machine),
                                                                    kept["instructions"])}
    with gc_paused():
        out = _run_timing(program, machine, trace, record_times, checked, progress, engine)
    if plain:
        _keep_run(program, machine, out)
    return out


def _fresh_trace(program: Program, machine: Machine):
    """The trace of a kept run (`_kept_run`), made by running the program again with one."""
    with gc_paused():
        return _run_timing(program, machine, True, False, False, False, "auto")["events"]


def _keep_run(program: Program, machine: Machine, run: dict) -> None:
    """Keep a plain run (no recorded times, unchecked) with the streams (`sim_cache`), without
    its trace, and the core each task ran on (both engines give the same run)."""
    cores = {tid: int(core[3:]) for tid, (core, _, _) in run["tasks"].items()}
    sim_cache(program)[("timing", machine)] = ({**run, "events": []}, cores)


def _kept_run(program: Program, machine: Machine) -> dict | None:
    """The kept run of these streams (`_keep_run`) if this program runs it: every task it fixes
    a core for (`core=`) ran on that core.  The dispatch is deterministic, and a task pinned to
    the core the dispatcher gave it starts when it started then, so the compiler's own run (the
    assign_cores pass, before it fixed the cores) is the program's run.  A copy, without trace."""
    kept = sim_cache(program).get(("timing", machine))
    if kept is None:
        return None
    run, cores = kept
    if any(t.core is not None and cores.get(t.id) != t.core for t in program.tasks):
        return None
    return {**run, "busy": dict(run["busy"]), "bytes_by_path": dict(run["bytes_by_path"]),
            "tasks": dict(run["tasks"]), "l2": dict(run["l2"]), "unwaited": list(run["unwaited"])}


def _run_timing(program: Program, machine: Machine, trace: bool, record_times: bool, checked: bool,
                progress: bool, engine: str):
    if engine == "compiled" or (engine == "auto" and len(program) >= COMPILED_MIN_INSTRUCTIONS):
        from . import timing_fast
        if not timing_fast.AVAILABLE and engine == "compiled":
            raise PyptoError("the compiled timing engine needs numba, which is not installed",
                             expected='engine="python" or "auto", or pip install numba', got=repr(engine))
        if timing_fast.AVAILABLE:
            out = timing_fast.run_compiled(program, machine, trace=trace, record_times=record_times,
                                           checked=checked, progress=progress)
            if out is not None:         # None: a program the encoding does not cover (malformed)
                return out
    return _run_python(program, machine, trace, record_times, checked, progress)


def _core_for(task, free: list[int], core_of: dict[int, int]) -> int | None:
    """The core a ready task starts on: the one the program assigns it (`core=`), else the free
    one with the lowest id, or for an epilogue paired with a cube task (1 AIC : 2 AIV) the AIV
    `slot` of the AIC that runs or ran it; None: it waits (no free core, its core is busy, or,
    for an epilogue, its cube task has not started)."""
    if task.pair is not None and task.pair[0] not in core_of:
        return None
    if task.core is not None:
        return task.core if task.core in free else None
    if task.pair is None:
        return free[0] if free else None
    cube, slot = task.pair
    core = 2 * core_of[cube] + slot
    return core if core in free else None


def _run_python(program: Program, machine: Machine, trace: bool, record_times: bool, checked: bool,
                progress: bool):
    decoded, flops = _decode(program, machine)
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
    times = [[None] * t.n_instrs for t in tasks] if record_times else None
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
    core_of: dict[int, int] = {}        # task -> index of the core it was dispatched to
    cross: dict[tuple, list[int]] = {}  # (cube task, AIV slot) -> times of its unconsumed cross-core sets
    cross_waiting: dict[tuple, tuple] = {}     # (cube task, AIV slot) -> (core, pipe) blocked on it
    unwaited: list[str] = []
    total = sum(t.n_instrs for t in tasks)
    bar = stage(f"simulating {program.name}", total, "instructions") if progress else None

    for t in tasks:
        if not t.deps:
            ready[t.core_type].append(t.id)
    heapq.heappush(heap, (0, seq, 0, None))     # kind 0: dispatch, 1: finish, 2: pipe step
    seq += 1

    while heap:
        now, _, kind, data = heapq.heappop(heap)
        if kind == 0:
            for ct in ("AIC", "AIV"):
                for tid in list(ready[ct]) if free_cores[ct] else ():
                    core = _core_for(tasks[tid], free_cores[ct], core_of)
                    if core is None:
                        if free_cores[ct]:
                            continue        # a paired task waits for its AIV; later tasks may go
                        break
                    ready[ct].remove(tid)
                    free_cores[ct].remove(core)
                    core_of[tid] = core
                    name = f"{ct}{core}"
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
                unwaited.append(unwaited_message(tid, data, next(k for k, v in r.flags.items() if v)))
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
                raise SimulationError(event_reuse_message(r.task, k, key, r.core))
            pending.append(t0 + dur)
            waiter = r.waiting.pop(key, None)
            if waiter is not None:
                heapq.heappush(heap, (t0 + dur, seq, 2, (name, waiter)))
                seq += 1
        elif ikind == CROSS_WAIT:
            avail = cross.get(r.task.pair)
            if not avail:
                cross_waiting[r.task.pair] = (name, pipe)
                continue
            s = avail.pop(0)
            t0 = t0 if t0 > s else s
        elif ikind == CROSS_SET:
            xk = (r.task.id, key)
            cross.setdefault(xk, []).append(t0 + dur)
            waiter = cross_waiting.pop(xk, None)
            if waiter is not None:
                heapq.heappush(heap, (t0 + dur, seq, 2, waiter))
                seq += 1
        elif ikind == GM_LOAD or ikind == GM_STORE:
            # `dur` is the transfer's fixed cycles (calibrated DMA startup): its bytes leave the pipe
            # after it; the shared HBM / L2 are booked from the start (booking them from the end of
            # the startup would hold back transfers the engine handles later but that start earlier)
            t1 = t0 + dur
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
            path_end = t1 + nbytes / bpc
            dur = max(1, math.ceil(max(path_end, served)) - t0)
            data_ready = t0 + dur + latency
            if data_ready > r.ready[pipe]:
                r.ready[pipe] = data_ready
            bytes_by_path[path] = bytes_by_path.get(path, 0) + nbytes
        else:
            if ikind == VECTOR:
                if r.last_vector_end == t0:     # shares the startup of the vector op before it
                    dur = dur - machine.vec_head if dur > machine.vec_head else 1
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
        waiting = [(name, r.task.id, pipe, key) for name, r in running.items() for key, pipe in r.waiting.items()]
        waiting += [(name, running[name].task.id, pipe, ("AIC", pipe, 0))      # cross-core waits
                    for _, (name, pipe) in sorted(cross_waiting.items())]
        raise SimulationError(deadlock_report(waiting, len(tasks), done))
    return timing_result(end_time, events, busy, bytes_by_path, hbm_bytes, total, task_times, times, unwaited,
                         l2.hits, l2.misses, l2.hit_bytes, l2.miss_bytes, flops)


def timing_result(cycles, events, busy, bytes_by_path, hbm_bytes, instructions, task_times, times, unwaited,
                  hits, misses, hit_bytes, miss_bytes, flops) -> dict:
    """What `run_timing` returns, whichever engine ran (`flops`: of the program's matmuls)."""
    return {"cycles": cycles, "events": events, "busy": busy, "bytes_by_path": bytes_by_path,
            "hbm_bytes": hbm_bytes, "instructions": instructions, "tasks": task_times, "times": times,
            "unwaited": unwaited, "flops": flops,
            "l2": {"hits": hits, "misses": misses, "hit_bytes": hit_bytes, "miss_bytes": miss_bytes}}


def unwaited_message(task_id: int, core: str, key) -> str:
    return (f"task {task_id} on {core} ends with flag {key[0]} -> {key[1]}, "
            f"EVENT_ID{key[2]} set but never waited for (a WAIT_FLAG is missing)")


def event_reuse_message(task, k: int, key, core: str) -> str:
    ins = task.instrs[k]
    return (f"event id reused before its wait: task {task.id} instruction {k} "
            f"SET_FLAG {key[0]} -> {key[1]}, EVENT_ID{key[2]} while the previous set of that event "
            f"has not been waited for (on {core}); at most one set per event id may be pending"
            + (f" ({ins.loc.short()})" if ins.loc else ""))


def deadlock_report(waiting, n_tasks: int, done: int) -> str:
    """`waiting`: (core, task id, pipe, flag key) of every blocked WAIT_FLAG, in dispatch order."""
    lines = [f"deadlock: {n_tasks - done} of {n_tasks} tasks cannot finish"]
    for name, tid, pipe, key in waiting:
        lines.append(f"  {name} task {tid}: pipe {pipe} waits for flag {key[0]}->{key[1]} "
                     f"event {key[2]}, which no instruction will set")
    if len(lines) == 1:
        lines.append("  no task is running: a dependency cycle between tasks")
    return "\n".join(lines)
