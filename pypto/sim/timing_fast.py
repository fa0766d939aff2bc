"""The compiled timing engine: the event loop of `timing.py`, in numba, on arrays.

`timing.run_timing` picks it for large programs (see `timing.COMPILED_MIN_INSTRUCTIONS`); its
results are identical to the Python engine's, which stays the reference: same cycles, task
times, busy cycles, bytes, L2 statistics, trace and errors.

Design:

- Encoding.  The program is decoded by the Python engine's `Decoder` (one home for what an
  instruction costs and does) into forms (its distinct rows) and per task the form of each
  instruction and its GM windows; the forms become flat columns (kind, cycles, flag key id,
  bytes, path id, ...).  Each task's instructions are grouped per local pipe (a pipe runs its
  queue in order) and the columns stored in that queue order, so that a pipe reads its
  instructions one after the other.  Tasks that decode to the same forms (isomorphic tasks,
  `Decoded.like`) on one core type share one block of columns (`qlo`, `qhi`: each task's queues
  in it); only their GM window ids are their own.  Flag keys, paths and GM windows become dense
  integer ids (equal windows, equal id: `_WindowIds`).  The encoding is cached on the program
  per machine, like `_decode`.
- State.  Everything the loop changes lives in arrays of a `_State` (slots = cores, AIC then
  AIV): the event heap, per core the running task and per pipe its queue position, free and
  data-ready times, the pending SET_FLAG times per (core, flag) as FIFO linked lists in a pool
  of nodes (one per core and flag at first, doubled when a program sets more before waiting),
  the L2's LRU as a doubly linked list over window ids, and the outputs.  Its size grows with
  the cores, tasks, GM windows and flag keys, not with the instructions; with trace=False
  nothing is kept per executed instruction.
- Same order.  Events are (cycle, sequence number, payload) in a binary heap; sequence numbers
  increase with every push, as in Python, so ties break the same way (the keys are unique: any
  correct heap pops them in the same order, whatever its layout).  A pipe step stays on top of
  the heap while it runs and is replaced by the pipe's next step.  The orders of the Python
  engine's dicts (busy, bytes per path, task times) and of its unwaited-flag and deadlock
  reports are rebuilt from "first seen" stamps.
- Chunks.  `_run` stops after a budget of executed instructions and resumes where it stopped
  (all state is in the arrays), so the progress bar is updated between chunks.
"""
from __future__ import annotations

from collections import namedtuple
from itertools import chain
from operator import attrgetter

import numpy as np

from ..errors import SimulationError
from ..ir.exec import AIC_PIPES, AIV_PIPES, Loop, static_instrs
from ..ir.gm import GMRef
from ..progress import stage
from ..ir.program import Program
from ..target.machine import Machine
from .timing import (CROSS_SET, CROSS_WAIT, GM_LOAD, GM_STORE, SET, VECTOR, WAIT, Decoder, Trace, TraceColumns,
                     TraceEvent, deadlock_report, event_reuse_message, events_of, sim_cache, timing_result,
                     unwaited_message)

try:
    from numba import njit
    AVAILABLE = True
except ImportError:     # the Python engine runs everything
    AVAILABLE = False

    def njit(*args, **kwargs):
        return (lambda f: f) if not args or not callable(args[0]) else args[0]

CORE_TYPES = ("AIC", "AIV")
PIPES = (AIC_PIPES, AIV_PIPES)          # local pipe index -> name, per core type
MAXP = max(len(AIC_PIPES), len(AIV_PIPES))
CHUNK = 1 << 21                         # instructions per call of the compiled loop (~0.1 s)
_BUF, _OFFSET, _SHAPE, _STRIDES = map(attrgetter, ("buf", "offset", "shape", "strides"))

# event payloads: kind + 4 * data (dispatch: no data; finish: slot; step: slot * MAXP + pipe)
EV_DISPATCH, EV_FINISH, EV_STEP = 0, 1, 2
# what _run returns
ST_BUDGET, ST_DONE, ST_EVENT_REUSE, ST_POOL_FULL = 0, 1, 2, 3
# pending SET_FLAGs the pool holds at first: a correct program has at most one per core and flag
# (the checked mode enforces it); the pool doubles when an unchecked one sets more
POOL_PER_CORE_AND_FLAG = 1
# integer scalars of the state (_State.g)
(G_SEQ, G_DONE, G_EXEC, G_END, G_HBM_BYTES, G_HITS, G_MISSES, G_HIT_BYTES, G_MISS_BYTES, G_L2_USED,
 G_LRU_HEAD, G_LRU_TAIL, G_HEAP_N, G_POOL_FREE, G_STAMP, G_FINISHED, G_ERR_G, G_ERR_SLOT, G_N_UNWAITED,
 G_RQ_HEAD0, G_RQ_HEAD1, G_RQ_TAIL0, G_RQ_TAIL1, N_G) = range(24)
F_HBM_FREE, F_L2_FREE = range(2)
# machine parameters (_Enc.mi, _Enc.mf)
M_NAIC, M_NAIV, M_DISPATCH, M_VEC_HEAD, M_L2_CAP, M_HIT_LAT, M_MISS_LAT = range(7)
MF_HBM_BPC, MF_L2_BPC = range(2)

# the encoded program (arrays only: what the compiled loop reads)
_Enc = namedtuple("_Enc", [
    # per instruction of a block (the tasks that decode alike share one), in queue order:
    "kind", "cyc", "key", "nbytes", "path",
    "xslot",                     # the AIV slot a CROSS_SET_FLAG signals (-1: other)
    "gmi",                       # a GM transfer's position among its task's (-1: other)
    "lorder",                    # its index in its task
    "window", "woff",            # per task (CSR): the window id of each of its GM transfers
    "qlo", "qhi",                # per (task, local pipe): the range of its queue in the block columns
    "ioff", "task_ct", "n_deps", "dep_off", "dependents",       # per task (dependents: CSR)
    "pair_task", "pair_slot",    # per task: the cube task an epilogue pairs with (-1: none), AIV slot
    "pin",                       # per task: the core the program assigns it (-1: any free one)
    "x_off",                     # per (cube task, slot): CSR offsets of its cross-core sets
    "path_bpc", "mi", "mf"])
# what the compiled loop changes
_State = namedtuple("_State", [
    "g", "f",
    "htime", "hseq", "hval",                                    # event heap
    "rq", "left", "core_free",                                  # dispatch
    "slot_task", "slot_stamp", "qptr", "qend", "pfree", "pready", "lve", "n_open", "sstart", "send",
    "fhead", "ftail", "ffirst", "waiter", "wstamp", "pool_time", "pool_next",   # flags
    "wprev", "wnext", "wres", "wbytes",                         # L2 LRU over window ids
    "busy", "busy_first", "path_bytes", "path_first",
    "task_slot", "task_start", "task_end", "task_order",
    "ex_g", "ex_t0", "ex_end", "ex_ready",                      # per executed instruction (trace)
    "uw_task", "uw_slot", "uw_key",                             # checked: flags never waited for
    "x_time", "x_nset", "x_nwait", "x_waiter"])                 # cross-core flags per (cube task, slot)


class Encoding:
    """A program encoded for the compiled engine on one machine (see the module docstring)."""

    def __init__(self, arrays: _Enc, keys: list, paths: list, n_windows: int, flops: int):
        self.arrays, self.keys, self.paths, self.n_windows = arrays, keys, paths, n_windows
        self.flops = flops          # of the program's matmuls

    @property
    def total(self) -> int:
        return int(self.arrays.ioff[-1])


def encode(program: Program, machine: Machine) -> Encoding | None:
    """The program's encoding, or None for a program the Python engine must run: task ids out of
    order, an unknown dependency or an instruction on a foreign pipe.  Cached per machine with
    the streams (`timing.sim_cache`), which programs of the same streams with other cores fixed
    share: their encodings differ in the `pin` array only."""
    cache = sim_cache(program)
    key = ("encoding", machine)
    if key not in cache:
        cache[key] = _encode(program, machine)
    enc = cache[key]
    if enc is None:
        return None
    pin = _pins(program)
    if not np.array_equal(pin, enc.arrays.pin):     # (kept: the program asks again with its pins)
        enc = cache[key] = Encoding(enc.arrays._replace(pin=pin), enc.keys, enc.paths, enc.n_windows, enc.flops)
    return enc


def _pins(program: Program) -> np.ndarray:
    """Per task: the core the program fixes (`core=`), -1 for any free one."""
    return np.array([-1 if t.core is None else t.core for t in program.tasks], np.int64)


class _Ids(dict):
    """Dense ids of the distinct values looked up, None -> -1 (`map(ids.__getitem__, column)`)."""

    def __init__(self):
        super().__init__({None: -1})

    def __missing__(self, value):
        i = self[value] = len(self) - 1
        return i

    def values_by_id(self) -> list:
        return [v for v in self if v is not None]


def _encode(program: Program, machine: Machine) -> Encoding | None:
    tasks = program.tasks
    n = len(tasks)
    for i, t in enumerate(tasks):
        if t.id != i or t.core_type not in CORE_TYPES or any(not 0 <= d < n for d in t.deps):
            return None
    decoder, win_ids = Decoder(machine), _WindowIds()
    # (each task's windows read right after it is decoded: they are still in the CPU's caches)
    decoded = []
    for t in tasks:
        decoded.append(decoder.decoded(t, program))
        win_ids.add(decoded[-1])
    task_ct = np.array([CORE_TYPES.index(t.core_type) for t in tasks], np.int8)
    key_ids, path_ids = _Ids(), _Ids()
    f_kind, f_pipe, f_cyc, f_key, f_bytes, f_path, f_xslot = _form_columns(decoder.forms, key_ids, path_ids)
    f_lp = [np.array([local.get(p, -1) for p in f_pipe], np.int8).reshape(-1)       # per core type
            for local in ({p: j for j, p in enumerate(pipes)} for pipes in PIPES)]
    # the blocks: the queue-ordered columns of the tasks that decode to one form array (isomorphic
    # tasks, `Decoded.like`) on one core type, made once
    blocks: dict[tuple, tuple] = {}
    cols: list[list[np.ndarray]] = [[] for _ in range(8)]      # kind cyc key nbytes path xslot gmi lorder
    qlo, qhi = np.zeros((n, MAXP), np.int64), np.zeros((n, MAXP), np.int64)
    x_count = np.zeros(2 * n, np.int64)         # cross-core sets per (cube task, AIV slot)
    base = 0
    for i, (t, d) in enumerate(zip(tasks, decoded)):
        ct = int(task_ct[i])
        block = blocks.get((id(d.form), ct))
        if block is None:
            lp = f_lp[ct][d.form]
            if (lp < 0).any():          # an instruction on a pipe its core does not have
                return None
            order = np.argsort(lp, kind="stable")
            form = d.form[order]
            kind = f_kind[form]
            gm = (kind == GM_LOAD) | (kind == GM_STORE)
            gmi = np.full(len(form), -1, np.int32)
            gmi[gm] = np.searchsorted(d.gm_at, order[gm])        # the window's position in the task's
            xslot = f_xslot[form]
            block = blocks[(id(d.form), ct)] = (
                base, np.concatenate([[0], np.cumsum(np.bincount(lp, minlength=MAXP)[:MAXP])]),
                bool((kind == CROSS_WAIT).any()), np.bincount(xslot[(xslot == 0) | (xslot == 1)], minlength=2)[:2])
            for c, a in zip(cols, (kind, f_cyc[form], f_key[form], f_bytes[form], f_path[form], xslot, gmi,
                                   order.astype(np.int32))):
                c.append(a)
            base += len(form)
        at, qs, cross_wait, x_sets = block
        if cross_wait and t.pair is None:
            return None
        qlo[i], qhi[i] = at + qs[:-1], at + qs[1:]
        x_count[2 * i:2 * i + 2] += x_sets
    kind, cyc, key, nbytes, path, xslot, gmi, lorder = (
        np.concatenate(c).astype(dt, copy=False) if c else np.zeros(0, dt)
        for c, dt in zip(cols, (np.int8, np.int64, np.int32, np.int64, np.int32, np.int8, np.int32, np.int32)))
    sizes = np.array([len(d.form) for d in decoded], np.int64)
    ioff, woff = np.zeros(n + 1, np.int64), np.zeros(n + 1, np.int64)
    np.cumsum(sizes, out=ioff[1:])
    np.cumsum([len(d.gm_at) for d in decoded], out=woff[1:])
    dependents: list[list[int]] = [[] for _ in tasks]
    for t in tasks:
        for d in t.deps:
            dependents[d].append(t.id)
    dep_off = np.zeros(n + 1, np.int64)
    np.cumsum([len(d) for d in dependents], out=dep_off[1:])
    flat = np.array([x for d in dependents for x in d], np.int64)
    paths = path_ids.values_by_id()
    gm_bpc = dict(decoder.gm_paths.values())       # GM paths' bandwidth (on-chip moves have their cycles)
    mi = np.array([machine.n_aic, machine.n_aiv, machine.dispatch_cycles, machine.vec_head, machine.l2_bytes,
                   machine.l2_hit_cycles, machine.l2_hit_cycles + machine.l2_miss_extra_cycles], np.int64)
    mf = np.array([machine.hbm_bytes_per_cycle, machine.l2_bytes_per_cycle], np.float64)
    arrays = _Enc(kind, cyc, key, nbytes, path, xslot, gmi, lorder, win_ids.ids(), woff, qlo.reshape(-1),
                  qhi.reshape(-1), ioff, task_ct, np.array([len(t.deps) for t in tasks], np.int64), dep_off, flat,
                  np.array([t.pair[0] if t.pair else -1 for t in tasks], np.int64),
                  np.array([t.pair[1] if t.pair else 0 for t in tasks], np.int64),
                  _pins(program),
                  np.concatenate([[0], np.cumsum(x_count)]).astype(np.int64),
                  np.array([gm_bpc.get(p, 0.0) for p in paths], np.float64), mi, mf)
    return Encoding(arrays, key_ids.values_by_id(), paths, win_ids.n, decoder.flops)


def _form_columns(forms: list[tuple], key_ids: _Ids, path_ids: _Ids) -> list:
    """Per form (`Decoder.forms`): kind, pipe (its name), cycles, flag key id, bytes, path id and
    the AIV slot of a cross-core set (-1: another instruction)."""
    if not forms:
        return [np.zeros(0, d) for d in (np.int8, object, np.int64, np.int32, np.int64, np.int32, np.int8)]
    c_kind, c_pipe, c_cyc, c_key, c_bytes, c_path, _, _ = zip(*forms)
    key = [key_ids[k] if kd == SET or kd == WAIT else -1 for kd, k in zip(c_kind, c_key)]
    xslot = [k if kd == CROSS_SET else -1 for kd, k in zip(c_kind, c_key)]
    return [np.array(c_kind, np.int8), c_pipe, np.array(c_cyc, np.int64), np.array(key, np.int32),
            np.array(c_bytes, np.int64), np.array([path_ids[p] for p in c_path], np.int32), np.array(xslot, np.int8)]


class _WindowIds:
    """Dense ids of the GM windows of a program's tasks (`add` each task's, then `ids`), one per
    distinct window (`GMRef.__eq__`: the same or an equal buffer, offset, shape and strides).

    A window is (its class, its offset), the class the index of its (buffer, shape, strides)
    among the distinct ones; a task whose windows are its first isomorphic task's but for their
    offsets (`Decoded.like`) has that task's classes, so only its offsets are read.  The pairs
    are numbered with numpy, not by hashing tens of thousands of windows in Python."""

    def __init__(self):
        self.classes: list[np.ndarray] = []
        self.offsets: list[np.ndarray] = []
        self.of_first: dict[int, np.ndarray] = {}   # id of a first task's Decoded -> its classes
        self.keys = _Ids()                          # (buffer index, shape, strides) -> class
        self.buffers: dict[int, int] = {}           # id of a buffer -> the index of the buffers equal to it
        self.equal: dict = {}
        self.windows: list[list] = []
        self.plain = True                           # all GMRefs (else numbered by the objects)
        self.n = 0

    def add(self, d) -> None:
        windows = d.windows
        self.windows.append(windows)
        self.plain = self.plain and set(map(type, windows)) <= {GMRef}
        if self.plain:
            classes = self.of_first.get(id(d.like)) if d.like is not None else None
            if classes is None:
                classes = self.of_first[id(d)] = self._classes(windows)
            self.classes.append(classes)
            self.offsets.append(np.fromiter(map(_OFFSET, windows), np.int64, len(windows)))

    def _classes(self, windows: list) -> np.ndarray:
        bufs = list(map(_BUF, windows))
        buffers = self.buffers
        for b in dict(zip(map(id, bufs), bufs)).values():
            if id(b) not in buffers:
                buffers[id(b)] = self.equal.setdefault(b, len(self.equal))
        keys = zip(map(buffers.__getitem__, map(id, bufs)), map(_SHAPE, windows), map(_STRIDES, windows))
        return np.fromiter(map(self.keys.__getitem__, keys), np.int64, len(windows))

    def ids(self) -> np.ndarray:
        """The id of every window added, in order (sets `n`, the number of distinct ones)."""
        if not self.plain:
            objects = _Ids()
            ids = np.fromiter(map(objects.__getitem__, chain.from_iterable(self.windows)), np.int32)
            self.n = len(objects) - 1
            return ids
        cls = np.concatenate(self.classes or [np.zeros(0, np.int64)])
        off = np.concatenate(self.offsets or [np.zeros(0, np.int64)])
        if not len(cls):
            return np.zeros(0, np.int32)
        lo = int(off.min())
        span = int(off.max()) - lo + 1
        if int(cls.max() + 1) * span < 1 << 62:
            _, ids = np.unique(cls * span + (off - lo), return_inverse=True)
        else:
            _, ids = np.unique(np.stack([cls, off], 1), axis=0, return_inverse=True)
        self.n = int(ids.max()) + 1
        return ids.astype(np.int32).reshape(-1)


def _new_state(enc: Encoding, record: bool) -> _State:
    a = enc.arrays
    n = len(a.task_ct)
    slots = int(a.mi[M_NAIC] + a.mi[M_NAIV])
    nk, heap = max(len(enc.keys), 1), slots * (MAXP + 1) + n + 2
    ne = enc.total if record else 0
    g = np.zeros(N_G, np.int64)
    g[[G_LRU_HEAD, G_LRU_TAIL, G_ERR_G, G_ERR_SLOT]] = -1
    rq = np.zeros((2, n), np.int32)
    for c in range(2):          # tasks without dependencies are ready at the start, in task order
        first = np.flatnonzero((a.n_deps == 0) & (a.task_ct == c))
        rq[c, :len(first)] = first
        g[G_RQ_TAIL0 + c] = len(first)
    pool = max(POOL_PER_CORE_AND_FLAG * slots * len(enc.keys), 1)
    pool_next = np.arange(1, pool + 1, dtype=np.int32)
    pool_next[-1] = -1
    g[G_HEAP_N], g[G_SEQ] = 1, 1        # the first event: a dispatch at cycle 0 (all heap arrays are 0)

    def z(shape, dtype=np.int64, fill=0):
        return np.full(shape, fill, dtype)

    per_slot, per_pipe, per_flag, w = slots, (slots, MAXP), (slots, nk), enc.n_windows
    return _State(
        g=g, f=z(2, np.float64),
        htime=z(heap), hseq=z(heap), hval=z(heap),
        rq=rq, left=a.n_deps.copy(), core_free=z(slots, np.bool_, True),
        slot_task=z(per_slot, fill=-1), slot_stamp=z(per_slot), qptr=z(per_pipe), qend=z(per_pipe),
        pfree=z(per_pipe), pready=z(per_pipe), lve=z(per_slot), n_open=z(per_slot), sstart=z(per_slot),
        send=z(per_slot),
        fhead=z(per_flag, np.int32, -1), ftail=z(per_flag, np.int32, -1), ffirst=z(per_flag, fill=-1),
        waiter=z(per_flag, np.int32, -1), wstamp=z(per_flag), pool_time=z(pool), pool_next=pool_next,
        wprev=z(w, np.int32), wnext=z(w, np.int32), wres=z(w, np.bool_), wbytes=z(w),
        busy=z(per_pipe), busy_first=z(per_pipe, fill=-1),
        path_bytes=z(len(enc.paths)), path_first=z(len(enc.paths), fill=-1),
        task_slot=z(n, np.int32, -1), task_start=z(n), task_end=z(n), task_order=z(n, fill=-1),
        ex_g=z(ne, np.int32), ex_t0=z(ne), ex_end=z(ne), ex_ready=z(ne),
        uw_task=z(n), uw_slot=z(n), uw_key=z(n),
        x_time=z(int(a.x_off[-1])), x_nset=z(2 * n), x_nwait=z(2 * n), x_waiter=z(2 * n, fill=-1))


# --- the compiled loop -----------------------------------------------------------------------

@njit(cache=True)
def _push(s, t, val):
    """Push an event at cycle t; ties are broken by the sequence number (order of pushing)."""
    g, htime, hseq, hval = s.g, s.htime, s.hseq, s.hval
    seq = g[G_SEQ]
    g[G_SEQ] = seq + 1
    i = g[G_HEAP_N]
    g[G_HEAP_N] = i + 1
    while i > 0:
        parent = (i - 1) >> 1
        pt = htime[parent]
        if pt < t or (pt == t and hseq[parent] < seq):
            break
        htime[i], hseq[i], hval[i] = pt, hseq[parent], hval[parent]
        i = parent
    htime[i], hseq[i], hval[i] = t, seq, val


@njit(cache=True)
def _pop(s):
    """Remove the earliest event."""
    n = s.g[G_HEAP_N] - 1
    s.g[G_HEAP_N] = n
    if n > 0:
        _sift_top(s, n, s.htime[n], s.hseq[n], s.hval[n])


@njit(cache=True)
def _replace_top(s, t, val):
    """Remove the earliest event and push one at cycle t (`_pop` then `_push`, in one pass).  The
    event moves down from the top while a child is earlier: it is often among the next ones (a
    pipe's next step after a short instruction), so it stops early."""
    g, htime, hseq, hval = s.g, s.htime, s.hseq, s.hval
    q = g[G_SEQ]
    g[G_SEQ] = q + 1
    n = g[G_HEAP_N]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (htime[c + 1] < htime[c] or (htime[c + 1] == htime[c] and hseq[c + 1] < hseq[c])):
            c += 1
        if t < htime[c] or (t == htime[c] and q < hseq[c]):
            break
        htime[i], hseq[i], hval[i] = htime[c], hseq[c], hval[c]
        i = c
    htime[i], hseq[i], hval[i] = t, q, val


@njit(cache=True)
def _sift_top(s, n, t, q, v):
    """Fill the heap's top (of n events) with the event (t, q, v): bottom-up, the hole moves down
    along the earlier children to a leaf, then the event up from there (it is usually late:
    fewer comparisons than moving it down)."""
    htime, hseq, hval = s.htime, s.hseq, s.hval
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (htime[c + 1] < htime[c] or (htime[c + 1] == htime[c] and hseq[c + 1] < hseq[c])):
            c += 1
        htime[i], hseq[i], hval[i] = htime[c], hseq[c], hval[c]
        i = c
    while i > 0:
        parent = (i - 1) >> 1
        pt = htime[parent]
        if pt < t or (pt == t and hseq[parent] < q):
            break
        htime[i], hseq[i], hval[i] = pt, hseq[parent], hval[parent]
        i = parent
    htime[i], hseq[i], hval[i] = t, q, v


@njit(cache=True)
def _l2_touch(s, w, nbytes, capacity):
    """Make window w resident in the L2 (most recently used); return whether it already was."""
    g, prev, nxt = s.g, s.wprev, s.wnext
    if s.wres[w]:
        if g[G_LRU_TAIL] != w:          # unlink, append at the tail
            p, q = prev[w], nxt[w]
            if p >= 0:
                nxt[p] = q
            else:
                g[G_LRU_HEAD] = q
            prev[q] = p
            prev[w], nxt[w] = g[G_LRU_TAIL], -1
            nxt[g[G_LRU_TAIL]] = w
            g[G_LRU_TAIL] = w
        return True
    s.wres[w] = True
    s.wbytes[w] = nbytes
    prev[w], nxt[w] = g[G_LRU_TAIL], -1
    if g[G_LRU_TAIL] >= 0:
        nxt[g[G_LRU_TAIL]] = w
    else:
        g[G_LRU_HEAD] = w
    g[G_LRU_TAIL] = w
    g[G_L2_USED] += nbytes
    while g[G_L2_USED] > capacity and g[G_LRU_HEAD] >= 0:   # evict the least recently used
        v = g[G_LRU_HEAD]
        s.wres[v] = False
        g[G_L2_USED] -= s.wbytes[v]
        q = nxt[v]
        g[G_LRU_HEAD] = q
        if q >= 0:
            prev[q] = -1
        else:
            g[G_LRU_TAIL] = -1
    return False


@njit(cache=True)
def _run(e, s, budget, checked):
    """Run events until `budget` instructions have executed in total or no event is left."""
    g, f = s.g, s.f
    n_slot = (e.mi[M_NAIC], e.mi[M_NAIV])
    slot_base = (0, e.mi[M_NAIC])
    dispatch, vec_head, capacity = e.mi[M_DISPATCH], e.mi[M_VEC_HEAD], e.mi[M_L2_CAP]
    hit_lat, miss_lat = e.mi[M_HIT_LAT], e.mi[M_MISS_LAT]
    hbm_bpc, l2_bpc = e.mf[MF_HBM_BPC], e.mf[MF_L2_BPC]
    n_keys = s.fhead.shape[1]
    record = s.ex_g.shape[0] > 0
    while g[G_HEAP_N] > 0:
        if g[G_EXEC] >= budget:
            return ST_BUDGET
        if g[G_POOL_FREE] < 0:          # a step takes at most one node: grow before it, not in it
            return ST_POOL_FULL
        # the earliest event: a pipe step stays on the heap while it runs, replaced by the pipe's
        # next step when it ends (events it pushes meanwhile come after it: later sequence numbers)
        now, val = s.htime[0], s.hval[0]
        ev, data = val & 3, val >> 2
        if ev != EV_STEP:
            _pop(s)
        if ev == EV_DISPATCH:
            for c in range(2):
                j = g[G_RQ_HEAD0 + c]
                while j < g[G_RQ_TAIL0 + c]:
                    tid = s.rq[c, j]
                    j += 1
                    if tid < 0:                         # dispatched earlier, out of order
                        continue
                    lowest = -1
                    for core in range(n_slot[c]):       # the free core with the lowest id
                        if s.core_free[slot_base[c] + core]:
                            lowest = slot_base[c] + core
                            break
                    if lowest < 0:
                        break
                    slot = lowest
                    cube = e.pair_task[tid]
                    if e.pin[tid] >= 0:                 # the core the program assigns it
                        if cube >= 0 and s.task_slot[cube] < 0:
                            continue                    # an epilogue starts after its cube task
                        if not s.core_free[slot_base[c] + e.pin[tid]]:
                            continue                    # it waits; later tasks may go
                        slot = slot_base[c] + e.pin[tid]
                    elif cube >= 0:     # an epilogue runs on its AIV of the AIC of its cube task
                        slot = -1
                        if s.task_slot[cube] >= 0:
                            want = 2 * s.task_slot[cube] + e.pair_slot[tid]
                            if want < n_slot[c] and s.core_free[slot_base[c] + want]:
                                slot = slot_base[c] + want
                        if slot < 0:
                            continue                    # it waits; later tasks may go
                    s.rq[c, j - 1] = -1
                    while g[G_RQ_HEAD0 + c] < g[G_RQ_TAIL0 + c] and s.rq[c, g[G_RQ_HEAD0 + c]] < 0:
                        g[G_RQ_HEAD0 + c] += 1
                    s.task_slot[tid] = slot
                    s.core_free[slot] = False
                    start = now + dispatch
                    s.slot_task[slot] = tid
                    s.slot_stamp[slot] = g[G_STAMP]
                    g[G_STAMP] += 1
                    s.lve[slot] = -1
                    s.sstart[slot] = start
                    s.send[slot] = start
                    n_open = 0
                    for p in range(MAXP):
                        s.qptr[slot, p] = e.qlo[tid * MAXP + p]
                        s.qend[slot, p] = e.qhi[tid * MAXP + p]
                        s.pfree[slot, p] = start
                        s.pready[slot, p] = start
                        if s.qend[slot, p] > s.qptr[slot, p]:
                            n_open += 1
                    s.n_open[slot] = n_open
                    for k in range(n_keys):
                        s.fhead[slot, k] = -1
                        s.ftail[slot, k] = -1
                        s.ffirst[slot, k] = -1
                        s.waiter[slot, k] = -1
                    if n_open == 0:
                        _push(s, start, EV_FINISH + 4 * slot)
                    for p in range(MAXP):
                        if s.qend[slot, p] > s.qptr[slot, p]:
                            _push(s, start, EV_STEP + 4 * (slot * MAXP + p))
            continue
        if ev == EV_FINISH:
            slot = data
            tid = s.slot_task[slot]
            first, fk = -1, -1
            for k in range(n_keys):
                if s.fhead[slot, k] >= 0:
                    if checked and (first < 0 or s.ffirst[slot, k] < first):
                        first, fk = s.ffirst[slot, k], k
                    node = s.fhead[slot, k]         # give the pending sets back to the pool
                    while node >= 0:
                        nxt = s.pool_next[node]
                        s.pool_next[node] = g[G_POOL_FREE]
                        g[G_POOL_FREE] = node
                        node = nxt
                    s.fhead[slot, k] = -1
            if fk >= 0:
                u = g[G_N_UNWAITED]
                s.uw_task[u], s.uw_slot[u], s.uw_key[u] = tid, slot, fk
                g[G_N_UNWAITED] = u + 1
            s.task_start[tid] = s.sstart[slot]
            s.task_end[tid] = s.send[slot]
            s.task_order[tid] = g[G_FINISHED]
            g[G_FINISHED] += 1
            g[G_DONE] += 1
            if s.send[slot] > g[G_END]:
                g[G_END] = s.send[slot]
            s.slot_task[slot] = -1
            s.core_free[slot] = True
            for j in range(e.dep_off[tid], e.dep_off[tid + 1]):
                d = e.dependents[j]
                s.left[d] -= 1
                if s.left[d] == 0:
                    c = e.task_ct[d]
                    s.rq[c, g[G_RQ_TAIL0 + c]] = d
                    g[G_RQ_TAIL0 + c] += 1
            _push(s, s.send[slot], EV_DISPATCH)
            continue
        # a pipe step: the next instruction of one pipe of one core
        slot, p = data // MAXP, data % MAXP
        qi = s.qptr[slot, p]              # in the columns of the task's block
        kind = e.kind[qi]
        dur = e.cyc[qi]
        t0 = now if now > s.pfree[slot, p] else s.pfree[slot, p]
        data_ready = 0
        if kind == WAIT:
            k = e.key[qi]
            node = s.fhead[slot, k]
            if node < 0:                        # blocked until the matching SET_FLAG
                if s.waiter[slot, k] < 0:
                    s.wstamp[slot, k] = g[G_STAMP]
                    g[G_STAMP] += 1
                s.waiter[slot, k] = p
                _pop(s)
                continue
            st = s.pool_time[node]
            s.fhead[slot, k] = s.pool_next[node]
            s.pool_next[node] = g[G_POOL_FREE]
            g[G_POOL_FREE] = node
            if st > t0:
                t0 = st
        elif kind == SET:
            if s.pready[slot, p] > t0:
                t0 = s.pready[slot, p]
            k = e.key[qi]
            if s.ffirst[slot, k] < 0:
                s.ffirst[slot, k] = g[G_STAMP]
                g[G_STAMP] += 1
            if checked and s.fhead[slot, k] >= 0:
                g[G_ERR_G], g[G_ERR_SLOT] = qi, slot
                return ST_EVENT_REUSE
            node = g[G_POOL_FREE]
            g[G_POOL_FREE] = s.pool_next[node]
            s.pool_time[node] = t0 + dur
            s.pool_next[node] = -1
            if s.fhead[slot, k] < 0:
                s.fhead[slot, k] = node
            else:
                s.pool_next[s.ftail[slot, k]] = node
            s.ftail[slot, k] = node
            w = s.waiter[slot, k]
            if w >= 0:
                s.waiter[slot, k] = -1
                _push(s, t0 + dur, EV_STEP + 4 * (slot * MAXP + w))
        elif kind == CROSS_WAIT:
            tid = s.slot_task[slot]
            xk = 2 * e.pair_task[tid] + e.pair_slot[tid]
            if s.x_nwait[xk] >= s.x_nset[xk]:   # blocked until the paired AIC sets the flag
                s.x_waiter[xk] = slot * MAXP + p
                _pop(s)
                continue
            st = s.x_time[e.x_off[xk] + s.x_nwait[xk]]
            s.x_nwait[xk] += 1
            if st > t0:
                t0 = st
        elif kind == CROSS_SET:
            xk = 2 * s.slot_task[slot] + e.xslot[qi]
            s.x_time[e.x_off[xk] + s.x_nset[xk]] = t0 + dur
            s.x_nset[xk] += 1
            w = s.x_waiter[xk]
            if w >= 0:
                s.x_waiter[xk] = -1
                _push(s, t0 + dur, EV_STEP + 4 * w)
        elif kind == GM_LOAD or kind == GM_STORE:
            nb = e.nbytes[qi]
            t1 = t0 + dur                       # the fixed cycles (calibrated DMA startup) first; the
            # shared HBM / L2 are booked from t0 (see timing.py)
            hit = _l2_touch(s, e.window[e.woff[s.slot_task[slot]] + e.gmi[qi]], nb, capacity)
            if kind == GM_LOAD and hit:
                s0 = f[F_L2_FREE] if f[F_L2_FREE] > t0 else float(t0)
                f[F_L2_FREE] = s0 + nb / l2_bpc
                served, latency = f[F_L2_FREE], hit_lat
                g[G_HITS] += 1
                g[G_HIT_BYTES] += nb
            else:
                s0 = f[F_HBM_FREE] if f[F_HBM_FREE] > t0 else float(t0)
                f[F_HBM_FREE] = s0 + nb / hbm_bpc
                served = f[F_HBM_FREE]
                g[G_HBM_BYTES] += nb
                if kind == GM_LOAD:
                    latency = miss_lat
                    g[G_MISSES] += 1
                    g[G_MISS_BYTES] += nb
                else:
                    latency = 0                 # stores are posted
            pid = e.path[qi]
            path_end = t1 + nb / e.path_bpc[pid]
            dur = np.int64(np.ceil(path_end if path_end > served else served)) - t0
            if dur < 1:
                dur = 1
            data_ready = t0 + dur + latency
            if data_ready > s.pready[slot, p]:
                s.pready[slot, p] = data_ready
            if s.path_first[pid] < 0:
                s.path_first[pid] = g[G_EXEC]
            s.path_bytes[pid] += nb
        else:
            if kind == VECTOR:
                if s.lve[slot] == t0:           # shares the startup of the vector op before it
                    dur = dur - vec_head if dur > vec_head else 1
                s.lve[slot] = t0 + dur
            pid = e.path[qi]
            if pid >= 0:
                if s.path_first[pid] < 0:
                    s.path_first[pid] = g[G_EXEC]
                s.path_bytes[pid] += e.nbytes[qi]
        end = t0 + dur
        s.pfree[slot, p] = end
        done_at = data_ready if kind == GM_LOAD else end
        if done_at > s.send[slot]:
            s.send[slot] = done_at
        if s.busy_first[slot, p] < 0:
            s.busy_first[slot, p] = g[G_EXEC]
        s.busy[slot, p] += dur
        if record:
            x = g[G_EXEC]
            s.ex_g[x], s.ex_t0[x], s.ex_end[x] = e.ioff[s.slot_task[slot]] + e.lorder[qi], t0, end
            s.ex_ready[x] = done_at if kind == GM_LOAD else -1
        g[G_EXEC] += 1
        s.qptr[slot, p] += 1
        if s.qptr[slot, p] < s.qend[slot, p]:
            _replace_top(s, end, val)
        else:
            _pop(s)
            s.n_open[slot] -= 1
            if s.n_open[slot] == 0:
                _push(s, s.send[slot], EV_FINISH + 4 * slot)
    return ST_DONE


# --- the Python side ---------------------------------------------------------------------------

def loaded() -> bool:
    """Whether the compiled loop is loaded in this process (it ran once): another run costs no
    import or load of numba's cache, only the encoding of its program."""
    return AVAILABLE and bool(getattr(_run, "signatures", None))


def run_compiled(program: Program, machine: Machine, trace: bool = True, record_times: bool = False,
                 checked: bool = False, progress: bool = True) -> dict | None:
    """`run_timing` on the compiled engine (same arguments and result), or None when the program
    is not encodable (then the Python engine runs it and reports what is wrong)."""
    enc = encode(program, machine)
    if enc is None:
        return None
    a = enc.arrays
    s = _new_state(enc, trace or record_times)
    bar = stage(f"simulating {program.name}", enc.total, "instructions") if progress else None
    while True:
        status = _run(a, s, int(s.g[G_EXEC]) + CHUNK, checked)
        if status == ST_POOL_FULL:
            s = _grow_pool(s)
            continue
        if bar is not None:
            bar.update(int(s.g[G_EXEC]))
        if status != ST_BUDGET:
            break
    if bar is not None:
        bar.close(int(s.g[G_EXEC]))
    cores = _cores(machine)
    if status == ST_EVENT_REUSE:
        qi, slot = int(s.g[G_ERR_G]), int(s.g[G_ERR_SLOT])
        raise SimulationError(event_reuse_message(program.tasks[int(s.slot_task[slot])], int(a.lorder[qi]),
                                                  enc.keys[a.key[qi]], cores[slot][0]))
    n, done = len(program.tasks), int(s.g[G_DONE])
    if done < n:
        raise SimulationError(deadlock_report(_waiting(s, enc, cores), n, done))
    n_uw = int(s.g[G_N_UNWAITED])
    unwaited = [unwaited_message(t, cores[sl][0], enc.keys[k]) for t, sl, k in
                zip(s.uw_task[:n_uw].tolist(), s.uw_slot[:n_uw].tolist(), s.uw_key[:n_uw].tolist())]
    return timing_result(
        int(s.g[G_END]), Trace(lambda: _trace(program, s, a, cores), int(s.g[G_EXEC]),
                               lambda: _columns(program, s, a, cores)) if trace else [],
        _busy(s, cores), _bytes_by_path(s, enc), int(s.g[G_HBM_BYTES]), enc.total, _task_times(s, cores),
        _times(program, s, a) if record_times else None, unwaited,
        int(s.g[G_HITS]), int(s.g[G_MISSES]), int(s.g[G_HIT_BYTES]), int(s.g[G_MISS_BYTES]), enc.flops)


def _grow_pool(s: _State) -> _State:
    """Twice the pending-flag pool (the new nodes free); the loop resumes where it stopped."""
    n = len(s.pool_time)
    s.g[G_POOL_FREE] = n
    more = np.arange(n + 1, 2 * n + 1, dtype=np.int32)
    more[-1] = -1
    return s._replace(pool_time=np.concatenate([s.pool_time, np.zeros(n, np.int64)]),
                      pool_next=np.concatenate([s.pool_next, more]))


def _cores(machine: Machine) -> list[tuple[str, tuple]]:
    """Per slot: the core's name and its pipes (by local index)."""
    return ([(f"AIC{i}", AIC_PIPES) for i in range(machine.n_aic)]
            + [(f"AIV{i}", AIV_PIPES) for i in range(machine.n_aiv)])


def _first_seen(first: np.ndarray) -> list:
    """Indices (tuples for 2-D) of the entries >= 0, ordered by value: dict order in Python."""
    idx = np.argwhere(first >= 0)
    return [tuple(i) for i in idx[np.argsort(first[tuple(idx.T)], kind="stable")].tolist()]


def _busy(s: _State, cores) -> dict:
    return {(cores[sl][0], cores[sl][1][p]): int(s.busy[sl, p]) for sl, p in _first_seen(s.busy_first)}


def _bytes_by_path(s: _State, enc: Encoding) -> dict:
    out: dict[str, int] = {}
    for (i,) in _first_seen(s.path_first):
        out[enc.paths[i]] = out.get(enc.paths[i], 0) + int(s.path_bytes[i])
    return out


def _task_times(s: _State, cores) -> dict:
    return {t: (cores[int(s.task_slot[t])][0], int(s.task_start[t]), int(s.task_end[t]))
            for (t,) in _first_seen(s.task_order)}


def _executed(s: _State, a: _Enc):
    """Per executed instruction, in execution order: (task, index in task, start, end, ready) lists."""
    x = int(s.g[G_EXEC])
    gi = s.ex_g[:x]
    tid = np.searchsorted(a.ioff, gi, "right") - 1
    return (tid.tolist(), (gi - a.ioff[tid]).tolist(), s.ex_t0[:x].tolist(), s.ex_end[:x].tolist(),
            s.ex_ready[:x].tolist())


def _trace(program: Program, s: _State, a: _Enc, cores) -> list[TraceEvent]:
    """The run's TraceEvents: its columns (`_columns`: a program read from its text is not
    unrolled for them) made into events with C-level maps."""
    return events_of(_columns(program, s, a, cores))


def _columns(program: Program, s: _State, a: _Enc, cores) -> TraceColumns:
    """The run's trace as columns (`TraceColumns`), no TraceEvent made: per executed instruction
    the pipe, op and source line of the instruction of the task's text it is (numbered per
    distinct one, repeated over the loops and gathered with numpy), its task's core, its cycles."""
    x = int(s.g[G_EXEC])
    gi = s.ex_g[:x]
    tid = np.searchsorted(a.ioff, gi, "right") - 1
    pipes: dict = {}
    ops: dict = {}
    lines: dict = {}
    texts: dict = {}                    # id of a source location -> its line's number
    code: dict = {}                     # id of an instruction of the text -> pipe, op, line numbers
    for t in program.tasks:
        for ins, _ in static_instrs(t.code):
            if id(ins) not in code:
                loc = ins.loc
                line = texts.get(id(loc))
                if line is None:
                    line = texts[id(loc)] = lines.setdefault(loc.short() if loc else "", len(lines))
                code[id(ins)] = (pipes.setdefault(ins.pipe, len(pipes)), ops.setdefault(ins.op, len(ops)), line)
    per_run = np.concatenate([_run_codes(t.code, code) for t in program.tasks]).reshape(-1, 3)[gi]
    names: dict = {}
    slot_core = np.array([names.setdefault(cores[sl][0], len(names)) if sl >= 0 else -1
                          for sl in s.task_slot.tolist()], np.int32)
    return TraceColumns(slot_core[tid], *(np.ascontiguousarray(per_run[:, j]) for j in range(3)),
                        s.ex_t0[:x].astype(np.int64), s.ex_end[:x].astype(np.int64), s.ex_ready[:x].astype(np.int64),
                        tid.astype(np.int64), (gi - a.ioff[tid]).astype(np.int64),
                        tuple(names), tuple(pipes), tuple(ops), tuple(lines))


def _run_codes(items, code: dict) -> np.ndarray:
    """`code[id(instruction)]` (a tuple) of every instruction `items` runs, in order, flat: a loop's
    body's once, repeated with numpy (`run_sources` without a list entry per instruction run)."""
    parts, plain = [], []
    for it in items:
        if type(it) is Loop:
            if plain:
                parts.append(np.array(plain, np.int32).reshape(-1))
                plain = []
            parts.append(np.tile(_run_codes(it.body, code), it.count))
        else:
            plain.append(code[id(it)])
    if plain:
        parts.append(np.array(plain, np.int32).reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def _times(program: Program, s: _State, a: _Enc) -> list[list]:
    times = [[None] * t.n_instrs for t in program.tasks]
    for t, k, t0, end, ready in zip(*_executed(s, a)):
        times[t][k] = (t0, end if ready < 0 else ready)
    return times


def _waiting(s: _State, enc: Encoding, cores) -> list[tuple]:
    """The blocked WAIT_FLAGs of the running tasks, then the blocked cross-core waits, in the
    order the Python engine lists them."""
    out = []
    for (sl,) in _first_seen(np.where(s.slot_task >= 0, s.slot_stamp, -1)):
        for (k,) in _first_seen(np.where(s.waiter[sl] >= 0, s.wstamp[sl], -1)):
            out.append((cores[sl][0], int(s.slot_task[sl]), cores[sl][1][s.waiter[sl, k]], enc.keys[k]))
    for w in s.x_waiter[s.x_waiter >= 0].tolist():
        sl, pipe = cores[w // MAXP][0], cores[w // MAXP][1][w % MAXP]
        out.append((sl, int(s.slot_task[w // MAXP]), pipe, ("AIC", pipe, 0)))
    return out
