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
import sys
from collections import OrderedDict
from collections.abc import Sequence
from itertools import compress
from operator import attrgetter, itemgetter
from typing import NamedTuple

import numpy as np

from ..errors import PyptoError, SimulationError
from ..gcpause import gc_paused
from ..progress import stage
from ..ir.core import Attrs, gatherer
from ..ir.exec import (AIC_PIPES, AIV_PIPES, EVENT_STEP, EVENTS_PER_PIPE_PAIR as EVENTS, GM_STEP, SIM_CACHE, Instr,
                       Loop, has_loops, static_instrs, stream_shape)
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


class TraceColumns(NamedTuple):
    """A trace as columns, one entry per executed instruction in execution order (what a timeline
    of a million instructions reads, without a TraceEvent each): `core`, `pipe`, `op`, `line`
    index the name tables `cores`, `pipes`, `ops`, `lines` (a line "" when none); the rest are
    the TraceEvent fields of the same names."""
    core: np.ndarray        # int32
    pipe: np.ndarray        # int32
    op: np.ndarray          # int32
    line: np.ndarray        # int32
    start: np.ndarray       # int64
    end: np.ndarray         # int64
    ready: np.ndarray       # int64
    task: np.ndarray        # int64
    index: np.ndarray       # int64
    cores: tuple
    pipes: tuple
    ops: tuple
    lines: tuple

    def __len__(self):      # (the events', not the fields')
        return len(self.start)


def trace_columns(trace) -> TraceColumns:
    """The columns of a trace: a `Trace` gives them from its run without making its events when it
    can (the compiled engine's); a list of TraceEvents (the Python engine's, a merged profile's)
    is read column by column."""
    if isinstance(trace, Trace):
        return trace.columns()
    return _columns_of(trace)


def events_of(cols: TraceColumns) -> list[TraceEvent]:
    """The TraceEvents of a trace's columns (made with C-level maps)."""
    def named(col, names):
        return map(names.__getitem__, col.tolist())
    return list(map(TraceEvent, named(cols.core, cols.cores), named(cols.pipe, cols.pipes), named(cols.op, cols.ops),
                    cols.start.tolist(), cols.end.tolist(), cols.task.tolist(), cols.index.tolist(),
                    named(cols.line, cols.lines), cols.ready.tolist()))


def _columns_of(events) -> TraceColumns:
    n = len(events)
    named = []
    for field in ("core", "pipe", "op", "line"):
        ids: dict = {}
        col = np.fromiter((ids.setdefault(v, len(ids)) for v in map(attrgetter(field), events)), np.int32, n)
        named.append((col, tuple(ids)))
    ints = [np.fromiter(map(attrgetter(f), events), np.int64, n) for f in ("start", "end", "ready", "task", "index")]
    return TraceColumns(*(c for c, _ in named), *ints, *(names for _, names in named))


class Trace(Sequence):
    """The trace of a timing run: its TraceEvents in execution order, made when first read.

    A run of a million instructions takes a fraction of a second in the compiled engine, while
    a million event objects take seconds to make: the engine keeps the few numbers per executed
    instruction, and the events are made only when a timeline, a Chrome trace or a test reads
    them (`make` returns the list; `n` is its length when known before).  Compares equal to the
    list of its events."""

    __slots__ = ("_make", "_n", "_events", "_columns")

    def __init__(self, make, n: int | None = None, columns=None):
        # `columns`: fn() -> the TraceColumns of the run, made without the events (None: read
        # off the events)
        self._make, self._n, self._events, self._columns = make, n, None, columns

    def columns(self) -> TraceColumns:
        """The trace as columns (`TraceColumns`): from the run when the events are not made yet
        and the run can give them, else read off the events."""
        if self._events is None and self._columns is not None:
            return self._columns()
        return _columns_of(self.events)

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


# what the decoder tells apart by op: flags, cross-core flags, loads and stores (GM transfers
# when an operand is a GM window), anything else
_FLAG, _CROSS, _TRANSFER, _OTHER = range(4)


class _Categories(dict):
    def __missing__(self, op):
        self[op] = _OTHER
        return _OTHER


_CATEGORY = _Categories({"SET_FLAG": _FLAG, "WAIT_FLAG": _FLAG, "CROSS_SET_FLAG": _CROSS,
                         "CROSS_WAIT_FLAG": _CROSS, "TLOAD": _TRANSFER, "TSTORE": _TRANSFER})
_OP, _PIPE, _DST, _SRCS, _ATTRS = map(attrgetter, ("op", "pipe", "dst", "srcs", "attrs"))
_BUF, _SHAPE, _STRIDES, _OFFSET = map(attrgetter, ("buf", "shape", "strides", "offset"))
_STEPS = frozenset((GM_STEP, EVENT_STEP))          # the steps that move what a row holds
_EVENT_FORMS = frozenset(("SET_FLAG", "WAIT_FLAG"))     # flags whose row holds their event id
_INT = frozenset((int,))
_FIRST = itemgetter(0)


class Decoded(NamedTuple):
    """A task's instructions as `Decoder.decoded` gives them: per instruction the index of its
    row in the decoder's `forms`; the positions of its GM transfers and the GM window of each
    (which their rows in `forms` leave out: None); and `like`, the Decoded of the first task of
    its stream shape when its windows have the same buffers, shapes and strides as that task's,
    position by position (they differ in their offsets only), else None."""
    form: np.ndarray        # int32, one per instruction (shared by tasks that decode alike: read only)
    gm_at: np.ndarray       # int64
    windows: list
    like: "Decoded | None" = None


class Decoder:
    """Decodes instructions for the timing engines (both run these rows; see `_decode`).

    A row depends only on the op, the pipe and the operand objects (keyed by object ids: they
    stay valid because the program keeps its instructions alive), and a GM transfer's row on its
    window only through the window's buffer, shape and strides, not its offset (the window itself
    is the row's last field).  So a row is worked out once per distinct key, in `forms` (the rows
    without their window), and a task decodes to the index of each instruction's form: C-level
    passes over its stream (`_decode_stream`), not a Python step per instruction.
    """

    def __init__(self, machine: Machine):
        self.machine = machine
        self.forms: list[tuple] = []                    # distinct rows, their GM window None
        self.form_flops: list[int] = []                 # matmul FLOPs of an instruction of each form
        self.keyed: dict[tuple, int] = {}               # (op, pipe, operand ids or GM window key) -> form
        self.sync_cycles: dict[str, int] = {}
        self.gm_paths: dict[tuple, tuple] = {}          # (src, dst) -> (path, bytes/cycle)
        self.computes: dict[tuple, tuple] = {}          # (op, operand ids) -> (flops, row)
        # id of a flag or on-chip instruction decoded -> its form (the program keeps the
        # instructions alive while it is decoded: the ids stay theirs)
        self.by_obj: dict[int, int] = {}
        # stream shape -> (Decoded of its first task, its flops, its _GMLayout); none for a shape
        # whose first task has GM transfers of windows that are not GM windows (each task decodes)
        self.shapes: dict[int, tuple] = {}
        self.flops = 0                                  # of the matmuls of the tasks decoded
        self.event_forms: dict[tuple, int] = {}         # (op, pipe, src, dst, event id) -> form

    def task(self, task, program=None) -> list[tuple]:
        """The rows of a task's instructions (`decoded`, each form with its window)."""
        d = self.decoded(task, program)
        rows = list(map(self.forms.__getitem__, d.form.tolist()))
        for k, w in zip(d.gm_at.tolist(), d.windows):
            rows[k] = rows[k][:7] + (w,)
        return rows

    def decoded(self, task, program=None) -> Decoded:
        """A task's instructions decoded.  Tasks the compiler found isomorphic (the same stream
        shape, `compiler.sync.STREAM_SHAPES` on the program) share every form but their GM
        transfers': only their windows are read, and the row of a window of another buffer,
        shape or strides than the first task's there."""
        shape = stream_shape(program, task.code) if program is not None else None
        known = self.shapes.get(shape) if shape is not None else None
        if known is None:
            before = self.flops
            d = None
            if shape is None and "instrs" not in task.__dict__ and has_loops(task.code):
                d = self._decode_loops(task.code)       # (a program read from its text)
            if d is None:
                d = self._decode_stream(task.instrs)
            if shape is not None and all(isinstance(w, GMRef) for w in d.windows):
                self.shapes[shape] = (d, self.flops - before, _GMLayout(task.instrs, d))
            return d
        first, flops, layout = known
        self.flops += flops
        if not layout.n:
            return first
        windows = layout.windows(task.instrs)
        changed = layout.changed(windows)
        if not changed:
            return Decoded(first.form, first.gm_at, windows, first)
        form = first.form.copy()
        instrs = task.instrs
        for j in changed:
            k = int(first.gm_at[j])
            form[k] = self._gm_form(instrs[k], windows[j])
        return Decoded(form, first.gm_at, windows)

    def _decode_stream(self, instrs) -> Decoded:
        n = len(instrs)
        form = np.zeros(n, np.int32)
        ops = list(map(_OP, instrs))
        category = np.fromiter(map(_CATEGORY.__getitem__, ops), np.int8, n)
        # flags: the form of (op, pipe, attributes)
        flag = category <= _CROSS
        if flag.any():
            sub = list(compress(instrs, flag.tolist()))
            form[flag] = self._known_forms(sub, lambda sub: (list(zip(map(_OP, sub), map(_PIPE, sub),
                                                                           map(id, map(_ATTRS, sub)))),
                                                                  self._flag_row))
        # loads and stores: GM transfers (the form of their window's key) or on-chip moves
        other = category == _OTHER
        gm_at, windows, gm_form = [], [], []
        for k in np.flatnonzero(category == _TRANSFER).tolist():
            ins = instrs[k]
            if isinstance(ins.dst, GMRef) or isinstance(ins.srcs[0], GMRef):
                w = ins.srcs[0] if ins.op == "TLOAD" else ins.dst
                gm_form.append(self._gm_form(ins, w))
                gm_at.append(k)
                windows.append(w)
            else:
                other[k] = True
        form[gm_at] = gm_form
        # anything else: the form of (op, pipe, operands)
        if other.any():
            sub = list(compress(instrs, other.tolist()))
            got = self._known_forms(sub, lambda sub: ([(i.op, i.pipe, id(i.dst), *map(id, i.srcs)) for i in sub],
                                                      self._compute_row))
            form[other] = got
            self.flops += sum(map(self.form_flops.__getitem__, got.tolist()))
        return Decoded(form, np.array(gm_at, np.int64), windows)

    def _decode_loops(self, code) -> Decoded | None:
        """`_decode_stream` of the instructions `code` (with loops) runs, without making them: the
        instructions of its text decoded once, as at the first iteration of their loops, then the
        form and GM window of every instruction run worked out loop by loop with numpy.  Of a row
        only a flag's event id (`event_step`) moves with the loops, and a transfer's window by its
        offset (`gm_step`), which the row leaves out; tiles moving on the chip (`addr_step`) and
        extract offsets move nothing a row holds (its cycles and bytes come from shapes, spaces
        and types).  None when a step or offset is not an int (the instructions are made then)."""
        static = [ins for ins, _ in static_instrs(code)]
        n = len(static)
        steps = [(k, ins.attrs._dict) for k, ins in enumerate(static) if not _STEPS.isdisjoint(ins.attrs._dict)]
        depth = max((len(a[key]) for _, a in steps for key in _STEPS if key in a), default=0)
        gm_step, ev_step = np.zeros((n, depth + 1), np.int64), np.zeros((n, depth + 1), np.int64)
        events = np.zeros(n, np.int64)
        for k, a in steps:
            gs, es = a.get(GM_STEP), a.get(EVENT_STEP)
            if gs is not None:
                if not _INT.issuperset(map(type, gs)):
                    return None
                gm_step[k, :len(gs)] = gs
            if es is not None and static[k].op in _EVENT_FORMS:
                if not _INT.issuperset(map(type, es)) or type(a.get("event")) is not int:
                    return None
                ev_step[k, :len(es)] = es
                events[k] = a["event"]
        flops = self.flops
        first = self._decode_stream(static)
        self.flops = flops                  # (counted below, per instruction run)
        offsets = np.zeros(n, np.int64)
        if first.windows:
            if not all(type(w) is GMRef and type(w.offset) is int for w in first.windows):
                return None
            offsets[first.gm_at] = list(map(_OFFSET, first.windows))
        at = iter(range(n))

        def expand(items, d: int) -> tuple:
            """(static index, event id, GM offset) of each instruction `items` run, the loops
            around them at their first iteration (`d` of them)."""
            parts, run = [], []
            for it in items:
                if type(it) is not Loop:
                    run.append(next(at))
                    continue
                if run:
                    parts.append((np.asarray(run), events[run], offsets[run]))
                    run = []
                k, ev, off = expand(it.body, d + 1)
                i = np.arange(it.count, dtype=np.int64)[:, None]
                parts.append((np.tile(k, it.count), ((ev + i * ev_step[k, d]) % EVENTS).reshape(-1),
                              (off + i * gm_step[k, d]).reshape(-1)))
            if run:
                parts.append((np.asarray(run), events[run], offsets[run]))
            if len(parts) == 1:
                return parts[0]
            return tuple(np.concatenate(c) for c in zip(*parts))

        k, ev, off = expand(code, 0)
        form = first.form[k]
        moving = ev_step.any(axis=1)[k]
        if moving.any():                # flags whose event id moves: one form per (flag, id)
            where = np.flatnonzero(moving)
            pairs, inverse = np.unique(k[where] * EVENTS + ev[where], return_inverse=True)
            got = [self._event_form(static[p // EVENTS], p % EVENTS) for p in pairs.tolist()]
            form[where] = np.asarray(got, np.int32)[inverse]
        transfers = np.zeros(n, bool)
        transfers[first.gm_at] = True
        gm_at = np.flatnonzero(transfers[k])
        which = np.zeros(n, np.int64)
        which[first.gm_at] = np.arange(len(first.gm_at))
        windows = [w if o == w.offset else GMRef(w.buf, o, w.shape, w.strides)
                   for w, o in zip(map(first.windows.__getitem__, which[k[gm_at]].tolist()), off[gm_at].tolist())]
        self.flops += int(np.asarray(self.form_flops, np.int64)[form].sum())
        return Decoded(form, gm_at.astype(np.int64), windows)

    def _event_form(self, ins, event: int) -> int:
        """The form of the flag `ins` with event id `event`: one per op, pipe, pipe pair and id
        (what its row holds)."""
        a = ins.attrs._dict
        key = (ins.op, ins.pipe, a["src"], a["dst"], event)
        f = self.event_forms.get(key)
        if f is None:
            x = Instr(ins.op, ins.pipe, ins.dst, ins.srcs, Attrs({**a, "event": event}), ins.loc)
            f = self.event_forms[key] = self._new_form(*self._flag_row(x))
        return f

    def _known_forms(self, instrs: list, keyed) -> np.ndarray:
        """The forms of flags or on-chip instructions: an instruction object met before (the
        flags and on-chip ops of a task's output tiles are mostly the same objects, tile after
        tile) has the form it had; the others by their keys, `keyed(them) -> (keys, row)` (see
        `_forms`), in program order."""
        by_obj = self.by_obj
        got = list(map(by_obj.get, map(id, instrs)))
        if None in got:
            miss = [k for k, f in enumerate(got) if f is None]
            new = list(map(instrs.__getitem__, miss))
            keys, row = keyed(new)
            for k, x, f in zip(miss, new, self._forms(keys, new, row).tolist()):
                got[k] = by_obj[id(x)] = f
        return np.array(got, np.int32)

    def _forms(self, keys: list, instrs: list, row) -> np.ndarray:
        """The forms of instructions by key; `row(ins)` -> (flops, row) makes a new key's, from
        its first instruction (in program order, as a Python loop over them would)."""
        keyed = self.keyed
        first = dict(zip(reversed(keys), range(len(keys) - 1, -1, -1)))     # key -> its first position
        for j in sorted(j for k, j in first.items() if k not in keyed):
            keyed[keys[j]] = self._new_form(*row(instrs[j]))
        return np.fromiter(map(keyed.__getitem__, keys), np.int32, len(keys))

    def _new_form(self, flops: int, row: tuple) -> int:
        self.forms.append(row)
        self.form_flops.append(flops)
        return len(self.forms) - 1

    def _flag_row(self, ins) -> tuple[int, tuple]:
        op = ins.op
        cyc = self.sync_cycles.get(op)
        if cyc is None:
            cyc = self.sync_cycles[op] = base_cycles(ins, self.machine)
        if op == "SET_FLAG" or op == "WAIT_FLAG":
            a = ins.attrs._dict
            return 0, (SET if op == "SET_FLAG" else WAIT, ins.pipe, cyc, (a["src"], a["dst"], a["event"]),
                       0, None, None, None)
        # the key of a cross-core set is the AIV slot it signals; a wait's is its task's pair
        setting = op == "CROSS_SET_FLAG"
        return 0, (CROSS_SET if setting else CROSS_WAIT, ins.pipe, cyc, ins.attrs["slot"] if setting else None,
                   0, None, None, None)

    def _compute_row(self, ins) -> tuple[int, tuple]:
        op, dst, srcs = ins.op, ins.dst, ins.srcs
        ck = (op, id(dst), *map(id, srcs))
        c = self.computes.get(ck)
        if c is None:
            nbytes, path = 0, None
            if op in ("TEXTRACT", "TMOV"):
                src, dst_space = dma_path(ins)
                path, nbytes = f"{src}->{dst_space}", dma_bytes(ins)
            kind, cyc = VECTOR if is_vector(op) else COMPUTE, base_cycles(ins, self.machine)
            c = self.computes[ck] = (matmul_flops(ins) if op.startswith("TMATMUL") else 0,
                                     (kind, ins.pipe, cyc, None, nbytes, path, None, None))
        row = c[1]
        return c[0], (row if row[1] == ins.pipe else row[:1] + (ins.pipe,) + row[2:])

    def _gm_form(self, ins, w) -> int:
        """The form of a GM transfer with window `w`: of its op, pipe, operands (by id) but the
        window, and the window's buffer, shape and strides."""
        if not isinstance(w, GMRef):
            return self._new_form(0, self._gm_row(ins)[:7] + (None,))
        op, srcs = ins.op, ins.srcs
        load = op == "TLOAD"            # (the window: a load's first source, else the destination)
        key = (op, ins.pipe, id(w.buf), w.shape, w.strides, id(ins.dst) if load else None,
               *map(id, srcs[1:] if load else srcs))
        f = self.keyed.get(key)
        if f is None:
            f = self.keyed[key] = self._new_form(0, self._gm_row(ins)[:7] + (None,))
        return f

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


class _GMLayout:
    """The GM transfers of the tasks of one stream shape (as the first task's `Decoded` has
    them), read with C-level gathers: the window of each (a load's source, a store's
    destination), and whether its row is the first task's, which it is when the window has the
    same buffer, shape and strides (see `Decoder`)."""

    def __init__(self, instrs, first: Decoded):
        gm_at = first.gm_at.tolist()
        loads = [j for j, k in enumerate(gm_at) if instrs[k].op == "TLOAD"]
        stores = [j for j, k in enumerate(gm_at) if instrs[k].op != "TLOAD"]
        self.n = len(gm_at)
        self.loads, self.stores = gatherer([gm_at[j] for j in loads]), gatherer([gm_at[j] for j in stores])
        # the windows come as the loads' then the stores': back to program order
        self.order = gatherer(np.argsort(loads + stores).tolist()) if loads and stores else None
        self.bufs, self.shapes, self.strides = _gm_keys(first.windows)

    def windows(self, instrs) -> list:
        got = (*map(_FIRST, map(_SRCS, self.loads(instrs))), *map(_DST, self.stores(instrs)))
        return list(self.order(got) if self.order is not None else got)

    def changed(self, windows: list) -> list[int]:
        """The positions among the GM transfers whose row is not the first task's."""
        bufs, shapes, strides = _gm_keys(windows)
        if bufs == self.bufs and shapes == self.shapes and strides == self.strides:
            return []
        return [j for j, key in enumerate(zip(bufs, shapes, strides))
                if key != (self.bufs[j], self.shapes[j], self.strides[j])]


def _gm_keys(windows: list) -> tuple[list, list, list]:
    """What the row of a GM transfer depends on, per window: its buffer (id), shape, strides."""
    return list(map(id, map(_BUF, windows))), list(map(_SHAPE, windows)), list(map(_STRIDES, windows))


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
# process costs 0.1-0.5 s (importing numba, loading the compiled loop from numba's on-disk cache;
# ~8 s on the very first use, when numba compiles it), which is what the Python engine (0.25-0.7 M
# instructions/s) needs for 70-150 k instructions.
COMPILED_MIN_INSTRUCTIONS = 100_000
# Once the compiled loop is loaded in the process (`timing_fast.loaded`: a large program ran on it)
# "auto" takes it from this many instructions: then it costs the encoding only (a 61k-instruction
# softmax: 10 ms against 86 ms in Python; an 8.7k-instruction matmul 3 ms against 10 ms).
WARM_MIN_INSTRUCTIONS = 5_000


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
    when numba is importable, and from WARM_MIN_INSTRUCTIONS once it is loaded in the process;
    else Python.
    """
    if engine not in ENGINES:
        raise PyptoError("unknown timing engine", expected=" or ".join(ENGINES), got=repr(engine))
    plain = not (record_times or checked)
    if plain and engine == "auto":      # a chosen engine runs: the engines are compared so
        kept = _kept_run(program, machine)
        if kept is not None:
            return kept if not trace else {**kept, "events": _rerun_trace(program, machine, kept["instructions"])}
    with gc_paused():
        out = _run_timing(program, machine, trace, record_times, checked, progress, engine)
    if plain:
        _keep_run(program, machine, out)
    return out


def _rerun_trace(program: Program, machine: Machine, n: int) -> Trace:
    """The trace of a kept run (`_kept_run`), made when first read by running the program again
    with one (once: its events and its columns read the same run)."""
    run: list = []

    def fresh():
        if not run:
            with gc_paused():
                run.append(_run_timing(program, machine, True, False, False, False, "auto")["events"])
        return run[0]
    return Trace(fresh, n, lambda: trace_columns(fresh()))


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
    if engine == "compiled" or (engine == "auto" and _compiled_pays(len(program))):
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


def _compiled_pays(n: int) -> bool:
    """Whether "auto" runs a program of n instructions on the compiled engine."""
    if n >= COMPILED_MIN_INSTRUCTIONS:
        return True
    if n < WARM_MIN_INSTRUCTIONS:
        return False
    fast = sys.modules.get(__package__ + ".timing_fast")     # (not imported for a small program)
    return fast is not None and fast.loaded()


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
