"""Execution-level pass `scheduling` (`DynamicScheduler`): list scheduling of each task's stream.

Per task: a list schedule of its dependence DAG over the core's pipes, critical path first, and
flags batched behind loads; a task keeps its order unless the new one is estimated faster (a
single-core model of the timing engine, with the flags `sync.plan_flags` would insert).
"""
from __future__ import annotations

from collections import defaultdict
from itertools import chain, compress
import math
from operator import attrgetter
from typing import NamedTuple

from ..ir.core import gather
from ..ir.exec import STREAM_SHAPES, SYNC_OPS, ExecGraph, Instr, TileRef, store_regions, stream_accesses, stream_shape
from ..ir.gm import GMRef
from ..target.cost import is_vector, pipe_cycles
from ..target.machine import Machine, get_machine
from .api import OptimizationPass
from .pipeline import PassContext
from .sync import SET, SYNC_PLANS, WAIT, RangeValues, plan_flags, with_stream


class DynamicScheduler(OptimizationPass):
    """List-schedule each task's instructions across its pipes (Execution level).

    Per task: the dependence DAG of its instructions (read after write, write after read and
    write after write on on-chip byte ranges and on the GM windows the task writes); the longest
    path from every instruction to the task's end (its critical path: cycles of
    `pypto.target.cost.pipe_cycles`, a GM load's data ready an L2 hit or miss latency after its
    transfer (see `load_latencies`), FLAG_CYCLES for a flag between pipes); then a list schedule
    on the core's pipes, one instruction at a time per pipe: the instruction that can start
    first, the longest path to the end among equals.  The new program order is the order of
    start times.  A second rewrite batches flags (`batch_flags`): of two instructions in a row
    on one pipe waiting for two loads, the one waiting for the later load goes first, so one
    SET_FLAG covers both loads and the load pipe stalls once for the latency instead of twice.

    Dependent instructions never swap, so the sync pass after this one derives the flags of the
    new order.  The candidates (original order, list schedule, each with batched flags) are
    timed with their flags on one single-core model (`estimate_cycles`, GM transfers stretched
    by the level's share of the HBM and L2, `gm_slowdown`) and the fastest is kept when it is
    at least MIN_GAIN faster than the original: by the model no task gets slower, and
    differences within the model's error are left alone.  Tasks of a level bound by the shared
    bandwidth (slowdown above BANDWIDTH_BOUND) keep their order: no order of one core's
    instructions makes the HBM faster.  Isomorphic tasks (same instruction shapes, e.g. the
    tasks of a group) share one decision.  A task longer than REGION_MIN instructions is
    scheduled output tile by output tile (regions ending at each TSTORE), each decided alone
    and alike tiles sharing the decision: the regions a loop body will be.  The pipes still
    overlap consecutive tiles at run time; on every benchmark kernel the cycles are those of a
    whole-task schedule (a 4096^3 matmul's 4,649-instruction tasks cost a quarter as much to
    schedule).  `options={"list_scheduling": False}` keeps every task's order.
    """

    level = "exec"
    description = "list-schedule each task's instructions across pipes (critical path first, flags batched)"

    def apply(self, graph: ExecGraph, ctx: PassContext | None = None) -> ExecGraph:
        if ctx is not None and not ctx.options.get("list_scheduling", True):
            return graph
        machine = ctx.machine if ctx is not None else get_machine("a2a3")
        cache: dict = {}
        cycles: dict = {}       # base cycles of the on-chip instructions, by op and operand objects
        shared: dict = {}       # shape key -> the first _Stream of that key (its accesses, dependences, flag plans)
        kept: dict = {}         # shape key of a stream left in its order (bandwidth-bound) -> shape id
        tasks, changed, shapes = [], False, {}
        # each task's shape key, as the first stream of its shape gave it (equal keys: the same
        # object, so that the dicts keyed by it compare them by identity, and only one key per
        # shape is kept alive); None for a stream that is not scheduled (sync, < 2 instructions).
        # Streams the graph's side table gives one shape (select's twins: the same stream but for
        # the GM windows, moved by a fixed offset per buffer) have equal keys: the first one's is
        # taken, not built again
        keys: dict = {}
        by_shape: dict = {}
        skeys = []
        for t in graph.tasks:
            shape = stream_shape(graph, t.instrs)
            k = by_shape.get(shape, _NO_KEY) if shape is not None else _NO_KEY
            if k is _NO_KEY:
                k = _stream_key(t)
                k = keys.setdefault(k, k) if k is not None else None
                if shape is not None:
                    by_shape[shape] = k
            skeys.append(k)
        latencies = load_latencies(graph, machine, skeys)
        slowdowns = gm_slowdown(graph, machine, latencies, skeys)
        for t, lat, slow, skey in zip(graph.tasks, latencies, slowdowns, skeys):
            slow = round(slow, 2)
            res = schedule_task(t.instrs, machine, cache, lat, slow, cycles, shared, skey)
            if res.instrs is not t.instrs:
                changed = True
                t = with_stream(t, res.instrs)
            tasks.append(t)
            shape = res.shape
            if shape is None and slow > BANDWIDTH_BOUND and skey is not None:
                # not scheduled, but isomorphic streams still share their flags, their buffer
                # pressure and their decoding in the simulator: ids of their own (negative)
                shape = kept.setdefault(skey, -1 - len(kept))
            if shape is not None:
                shapes[id(t.instrs)] = (t.instrs, shape)
        out = graph.replace(tasks) if changed else graph
        out.__dict__[STREAM_SHAPES] = shapes
        # the flag plan of each shape's kept order, worked out while timing it: insert_sync
        # inserts those flags instead of planning them again
        out.__dict__[SYNC_PLANS] = {h[4]: h[5] for h in cache.values() if h[5] is not None}
        return out


# --- list scheduling ---------------------------------------------------------------------------

FLAG_CYCLES = 2     # a SET_FLAG on the producer's pipe and a WAIT_FLAG on the consumer's
BANDWIDTH_BOUND = 1.05  # a level whose GM traffic stretches its transfers more (`gm_slowdown`) is
                        # bound by the shared bandwidth: reordering one core's stream cannot help
MIN_GAIN = 0.01     # a new order is kept only when estimated at least this much faster (1 %): the
                    # model cannot tell smaller differences from the noise of HBM contention
REGION_MIN = 2048   # a longer stream is scheduled tile by tile (`_by_tiles`): on every benchmark
                    # kernel it keeps the cycles a whole-stream schedule gives, at a quarter of the
                    # cost on a 4096^3 matmul; on shorter ones (2048^3, 1000-1500 instructions a
                    # task) a whole-stream schedule gains up to 1.8 %


class TaskSchedule(NamedTuple):
    """What `schedule_task` decided for one task's instruction stream."""
    instrs: tuple          # the stream to keep (the input tuple itself when unchanged)
    before: int | None     # estimated cycles of the original order (None: not scheduled)
    after: int | None      # estimated cycles of the kept order
    how: str               # the kept candidate: "original", "list", "original+batched", "list+batched"
    shape: int | None = None   # equal for streams of the same shape scheduled alike (with a cache)

    @property
    def reordered(self) -> bool:
        return self.how != "original"


def dependences(instrs, acc=None) -> list[dict[int, bool]]:
    """preds[j] = {i: needs_data} for every earlier instruction i that j must follow.

    Edges come from overlapping byte ranges (on-chip tiles, and the GM windows of buffers the
    task writes; read-only GM cannot order anything): read after write and write after write
    need i's data (needs_data True: a load's latency counts), write after read only i's end.
    Transitively implied edges are mostly left out (a read depends on the last writer only).
    """
    if acc is None:
        acc = stream_accesses(instrs)
    # per range (of a space, of a GM buffer): [last writer or -1, readers since], the overlapping
    # ones found in O(log n + hits) and taken in the order they were added (a list scanned per
    # access made a task of 31,000 windows of one written buffer quadratic: 50 s)
    ranges = RangeValues()
    found, resolve = ranges.found, ranges.resolve
    preds: list[dict[int, bool]] = []
    for j, a in enumerate(acc):
        p: dict[int, bool] = {}
        for x in a:
            w = x[3]
            for writer, readers in (found.get(id(x)) or resolve(x))[0]:
                if writer >= 0 and writer != j:
                    p[writer] = True
                if w:
                    for r in readers:
                        if r != j and r not in p:
                            p[r] = False
        for x in a:
            overlapping, own = found.get(id(x)) or resolve(x)
            if own is None:
                overlapping, own = ranges.add(x, [-1, []])
            if x[3]:
                for v in overlapping:
                    v[0], v[1] = j, []
            else:
                own[1].append(j)
        preds.append(p)
    return preds


def _is_gm_load(ins: Instr) -> bool:
    return ins.op == "TLOAD" and isinstance(ins.srcs[0], GMRef)


def load_latencies(graph: ExecGraph, machine: Machine, shapes=None) -> list[tuple[int, ...]]:
    """Per task, per instruction: cycles from the end of a GM load's transfer to its data being
    ready (0 for other instructions), as the timing model's L2 will likely serve it.

    The L2 keeps GM windows that were loaded or stored before: a load of a window an earlier
    task (or an earlier instruction of the task) touched is predicted to hit
    (`machine.l2_hit_cycles`), any other to miss (plus `machine.l2_miss_extra_cycles`).
    `shapes`: see `_gm_transfers`.
    """
    hit = machine.l2_hit_cycles
    miss = hit + machine.l2_miss_extra_cycles
    if machine.l2_mib == 0:
        hit = miss
    seen: set = set()
    add = seen.add
    out = []
    for t, (at, loads) in zip(graph.tasks, _gm_transfers(graph, shapes)):
        instrs = t.instrs
        lat = [0] * len(instrs)
        for k, load in zip(at, loads):
            if load:
                n = len(seen)
                add(_L2_KEY(instrs[k].srcs[0]))
                lat[k] = miss if len(seen) > n else hit     # (added: not seen before)
            else:
                add(_L2_KEY(instrs[k].dst))
        out.append(tuple(lat))
    return out


_L2_KEY = attrgetter("buf.name", "offset", "shape", "strides")     # a GM window, as the L2 keeps it


_TRANSFER_OPS = frozenset(("TLOAD", "TSTORE"))


def _gm_transfers(graph: ExecGraph, shapes=None) -> list[tuple[list[int], list[bool]]]:
    """Per task: (the indices of its GM transfers, a GM load (True) or store (False) each), in
    program order.  `shapes`: per task its `_shape_key` or None; tasks of equal keys have their
    transfers at the same indices, found once (the same lists).

    The transfers are a small part of a stream, found with C-level maps (every task's stream is
    walked)."""
    out = []
    known: dict = {}
    for t, key in zip(graph.tasks, shapes or [None] * len(graph.tasks)):
        got = known.get(key) if key is not None else None
        if got is None:
            instrs = t.instrs
            at = []
            loads = []
            for k in compress(range(len(instrs)), map(_TRANSFER_OPS.__contains__, map(_OP, instrs))):
                ins = instrs[k]
                if ins.op == "TLOAD":
                    if isinstance(ins.srcs[0], GMRef):
                        at.append(k)
                        loads.append(True)
                elif isinstance(ins.dst, GMRef):
                    at.append(k)
                    loads.append(False)
            got = (at, loads)
            if key is not None:
                known[key] = got
        out.append(got)
    return out


def gm_slowdown(graph: ExecGraph, machine: Machine, latencies=None, shapes=None) -> list[float]:
    """Per task: how much longer than its path's bandwidth allows a GM transfer will take, because
    the tasks of its wavefront level share the HBM and the L2 (a roofline per level).

    A level's transfers need (sum of their path-limited cycles) / (cores running the level) at
    least; its HBM bytes (predicted L2 misses, and stores) need bytes / HBM bandwidth, its L2
    hits bytes / L2 bandwidth.  When one of those is longer, every transfer of the level
    stretches by the ratio.  `latencies`: `load_latencies(graph, machine)`; `shapes`: see
    `_gm_transfers` (tasks of one shape have the same transfer bytes and paths, worked out once).
    """
    if latencies is None:
        latencies = load_latencies(graph, machine, shapes)
    hit = machine.l2_hit_cycles
    l2 = bool(machine.l2_mib)
    cores = {"AIC": machine.n_aic, "AIV": machine.n_aiv}
    levels: dict[int, list] = {}        # level -> [path cycles, HBM bytes, L2 bytes, {core type: tasks}]
    rates: dict[tuple, float] = {}
    sized: dict[int, list] = {}         # id(transfer indices) -> [(index, load, bytes, path cycles)]
    for t, lat, (at, loads) in zip(graph.tasks, latencies, _gm_transfers(graph, shapes)):
        lv = levels.setdefault(t.level, [0.0, 0, 0, {}])
        lv[3][t.core_type] = lv[3].get(t.core_type, 0) + 1
        rows = sized.get(id(at))
        if rows is None:
            rows = sized[id(at)] = []
            instrs = t.instrs
            for k, load in zip(at, loads):
                ins = instrs[k]
                if load:
                    nbytes, path = ins.srcs[0].nbytes, ("GM", ins.dst.space)
                else:
                    nbytes, path = ins.dst.nbytes, (ins.srcs[0].space, "GM")
                rate = rates.get(path)
                if rate is None:
                    rate = rates[path] = machine.gm_load_bytes_per_cycle(*path)
                rows.append((k, load, nbytes, nbytes / rate))
        # (the path cycles summed transfer by transfer, in program order, as floats add)
        cyc = lv[0]
        for k, load, nbytes, c in rows:
            if load:
                la = lat[k]
                lv[2 if 0 < la <= hit and l2 else 1] += nbytes
            else:
                lv[1] += nbytes
            cyc += c
        lv[0] = cyc
    factor = {}
    for level, (path, hbm, l2b, kinds) in levels.items():
        active = max(1, sum(min(n, cores.get(ct, n)) for ct, n in kinds.items()))
        need = path / active
        f = 1.0
        if need > 0:
            f = max(f, hbm / machine.hbm_bytes_per_cycle / need)
            if machine.l2_mib:
                f = max(f, l2b / machine.l2_bytes_per_cycle / need)
        factor[level] = f
    return [factor.get(t.level, 1.0) for t in graph.tasks]


def _pipe_cycles(instrs, machine: Machine, known: dict | None = None, slowdown: float | None = None) -> list[int]:
    """`pipe_cycles` of each instruction, a GM transfer's stretched by `slowdown` (`_gm_cycles`);
    those without a GM operand are worked out once per (op, operand objects) in `known` (a dict
    that outlives them: its keys are object ids)."""
    if known is None:
        return [_gm_cycles(i, pipe_cycles(i, machine), slowdown) for i in instrs]
    out = []
    for ins in instrs:
        dst, srcs = ins.dst, ins.srcs
        if type(dst) is GMRef or GMRef in map(type, srcs):
            out.append(_gm_cycles(ins, pipe_cycles(ins, machine), slowdown))
            continue
        key = (ins.op, id(dst), *map(id, srcs))
        c = known.get(key)
        if c is None:
            c = known[key] = pipe_cycles(ins, machine)
        out.append(c)
    return out


def _vector(instrs) -> list[bool]:
    """`is_vector` of each instruction (worked out once per op)."""
    ops = list(map(_OP, instrs))
    known = {op: is_vector(op) for op in set(ops)}
    return list(map(known.__getitem__, ops))


def _gm_cycles(ins: Instr, base: int, slowdown: float | None) -> int:
    """A GM transfer's cycles, `slowdown` times its path-limited `base` (other instructions: base)."""
    if not slowdown or slowdown <= 1.0:
        return base
    if (ins.op == "TLOAD" and isinstance(ins.srcs[0], GMRef)) or (ins.op == "TSTORE" and isinstance(ins.dst, GMRef)):
        return math.ceil(base * slowdown)
    return base


class _Stream:
    """One task's instructions (no sync yet) with what scheduling needs, computed once."""

    def __init__(self, instrs, machine: Machine, latency=None, slowdown=None, cycles: dict | None = None,
                 same: "_Stream | None" = None):
        """`cycles`: see `_pipe_cycles`; `same`: the _Stream of a stream of the same shape key
        (`_shape_key`), which has the same pipes, accesses (up to where its GM windows lie),
        dependences and, in the same order, the same flags: they are shared, whatever the two
        streams' load latencies and transfer cycles."""
        self.instrs = instrs
        if same is None:
            self.acc = stream_accesses(instrs)
            self.pipe = list(map(_PIPE, instrs))
            self.vector = _vector(instrs)
            self.preds = dependences(instrs, self.acc)
            self.load_pipes = {i.pipe for i in instrs if _is_gm_load(i)}
            self._plans: dict[tuple, tuple] = {}
        else:
            self.acc, self.pipe, self.vector = same.acc, same.pipe, same.vector
            self.preds, self.load_pipes, self._plans = same.preds, same.load_pipes, same._plans
        self.latency = list(latency) if latency is not None else \
            [machine.l2_hit_cycles if _is_gm_load(i) else 0 for i in instrs]
        self.cycles = _pipe_cycles(instrs, machine, cycles, slowdown)
        # each instruction's entry in `_relax`'s queues (the same in every candidate order)
        self.entry = list(zip(self.cycles, self.latency, self.vector))

    def plan(self, order) -> tuple:
        """`plan_flags` of the stream in `order` (remembered: candidates share them)."""
        key = tuple(order)
        got = self._plans.get(key)
        if got is None:
            got = self._plans[key] = plan_flags([self.pipe[k] for k in key], [self.acc[k] for k in key])
        return got

    def valid(self, order) -> bool:
        """Whether `order` (a permutation) keeps every dependence."""
        if sorted(order) != list(range(len(self.instrs))):
            return False
        pos = [0] * len(order)
        for r, k in enumerate(order):
            pos[k] = r
        return all(pos[i] < pos[j] for j, p in enumerate(self.preds) for i in p)


def list_schedule(instrs, machine: Machine, preds=None, cycles=None, latency=None) -> list[int]:
    """A new order (indices into `instrs`) from a list schedule of the dependence DAG.

    Resources: the pipes, one instruction at a time each.  An instruction can start when its
    pipe is free and every predecessor is done (its end, plus a load's latency when the data is
    needed, plus FLAG_CYCLES across pipes).  Repeatedly the instruction that can start first is
    placed, the one with the longest path to the end (critical path) among equals, then the
    lowest index; the result is the order of start times (a topological order of the DAG).
    """
    n = len(instrs)
    if preds is None:
        preds = dependences(instrs)
    if cycles is None:
        cycles = [pipe_cycles(i, machine) for i in instrs]
    if latency is None:
        latency = [machine.l2_hit_cycles if _is_gm_load(i) else 0 for i in instrs]
    pipe = list(map(_PIPE, instrs))
    done = [cycles[k] + latency[k] for k in range(n)]
    # per edge i -> j: what j waits for beyond i's cycles (i's latency when it needs i's data,
    # FLAG_CYCLES across pipes)
    succs: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for j, ps in enumerate(preds):
        pj = pipe[j]
        for i, data in ps.items():
            succs[i].append((j, (latency[i] if data else 0) + (FLAG_CYCLES if pipe[i] != pj else 0)))
    prio = [0] * n                              # longest path from an instruction's start to the end
    for i in range(n - 1, -1, -1):
        best = done[i]
        c = cycles[i]
        for j, extra in succs[i]:
            v = c + extra + prio[j]
            if v > best:
                best = v
        prio[i] = best
    vec_head = machine.vec_head
    vector = _vector(instrs)
    left = list(map(len, preds))
    est = [0] * n
    start = [0] * n
    free = dict.fromkeys(pipe, 0)
    last_vector_end = -1
    ready = [k for k in range(n) if left[k] == 0]
    placed = []
    while ready:
        # the least (start, -prio, index) (compared field by field: no key tuples)
        bk = -1
        for k in ready:
            f = free[pipe[k]]
            s = est[k]
            if f > s:
                s = f
            if bk < 0 or s < bs or (s == bs and (prio[k] > bp or (prio[k] == bp and k < bk))):
                bk, bs, bp = k, s, prio[k]
        ready.remove(bk)
        s = bs
        d = cycles[bk]
        if vector[bk]:
            if last_vector_end == s and d > vec_head:
                d -= vec_head
            last_vector_end = s + d
        end = s + d
        free[pipe[bk]] = end
        start[bk] = s
        placed.append(bk)
        for j, extra in succs[bk]:
            t = end + extra
            if t > est[j]:
                est[j] = t
            left[j] -= 1
            if left[j] == 0:
                ready.append(j)
    return sorted(placed, key=start.__getitem__)      # by start, then placement (a stable sort)


def batch_flags(order, st: _Stream, rounds: int = 4) -> list[int]:
    """Let one SET_FLAG after a load cover several loads (a rewrite of a program order).

    A SET_FLAG on a load pipe waits until the data of the pipe's earlier loads is ready, so
    the pipe stalls a latency per flag.  When two instructions in a row on pipe Q wait for two
    loads on P (two flags P->Q), and the second does not depend on anything between them, it
    moves in front of the first: its flag then covers both loads.
    """
    order = list(order)
    load_pipes = st.load_pipes
    for _ in range(rounds):
        pipes = list(map(st.pipe.__getitem__, order))
        flags = st.plan(order)[2]
        prev: dict[tuple, tuple] = {}       # (P, Q) -> the last flag P->Q from a load pipe P
        moves = []
        for p, q, j, c in flags:
            if p not in load_pipes:
                continue
            pair = (p, q)
            if pair in prev:
                j1, c1 = prev[pair]
                # (c1 and c are on Q: in a row when no Q instruction is between them)
                if j < c1 and q not in pipes[c1 + 1:c]:
                    pk = st.preds[order[c]]
                    if not any(order[r] in pk for r in range(c1, c)):
                        moves.append((c1, c))
            prev[pair] = (j, c)
        if not moves:
            break
        taken = -1
        for c1, c in sorted(moves, reverse=True):      # from the back: earlier positions stay valid
            if taken != -1 and c >= taken:
                continue
            order.insert(c1, order.pop(c))
            taken = c1
    return order


def _relax(queues: dict, machine: Machine) -> int | None:
    """Run per-pipe queues of (a, b, c) entries: an instruction (a cycles, b data latency, c
    vector), or a flag operation as `plan_flags` gives them (a `sync.SET` or `sync.WAIT`, these
    very strings, b its pipe, c its flag key).  The makespan, or None when the flags deadlock."""
    ptr = dict.fromkeys(queues, 0)
    free = dict.fromkeys(queues, 0)
    ready = dict.fromkeys(queues, 0)
    flags: dict = {}
    vec_head = machine.vec_head
    last_vector_end = -1
    progress = True
    while progress:
        progress = False
        for p, q in queues.items():
            k0 = ptr[p]
            n = len(q)
            if k0 == n:
                continue
            fp, rp = free[p], ready[p]      # the pipe's free and ready times, kept local
            for k in range(k0, n):
                a, b, c = q[k]
                if a is WAIT:
                    pending = flags.get(c)
                    if not pending:
                        break
                    s = pending.pop(0)
                    fp = (s if s > fp else fp) + 1
                elif a is SET:
                    fp = (rp if rp > fp else fp) + 1
                    pending = flags.get(c)
                    if pending is None:
                        flags[c] = [fp]
                    else:
                        pending.append(fp)
                else:
                    if c:
                        if last_vector_end == fp and a > vec_head:
                            a -= vec_head
                        last_vector_end = fp + a
                    fp += a
                    if b and fp + b > rp:
                        rp = fp + b
            else:
                k = n
            if k != k0:
                progress = True
                free[p], ready[p] = fp, rp
                ptr[p] = k
    if any(ptr[p] < len(q) for p, q in queues.items()):
        return None
    # a pipe's times only grow, and every end (a load's data latency included) is one of them
    return max(max(free.values(), default=0), max(ready.values(), default=0))


def evaluate(order, st: _Stream, machine: Machine) -> int | None:
    """`estimate_cycles` of the stream in `order` with the flags the sync pass would insert."""
    pipe, entry = st.pipe, st.entry
    before, after, _ = st.plan(order)
    queues: dict[str, list] = defaultdict(list)     # per pipe, in the order pipes first appear
    pre_of, post_of = before.get, after.get
    for r, k in enumerate(order):
        ops = pre_of(r)
        if ops is not None:
            for op in ops:
                queues[op[1]].append(op)
        queues[pipe[k]].append(entry[k])
        ops = post_of(r)
        if ops is not None:
            for op in ops:
                queues[op[1]].append(op)
    return _relax(dict(queues), machine)


def estimate_cycles(instrs, machine: Machine, latency=None) -> int | None:
    """Cycles of one task's stream (with its flags) alone on a core, by the timing engine's
    per-core rules.

    Each pipe runs its instructions in order; a WAIT_FLAG waits for its SET_FLAG (first in,
    first out per pipe pair and event id); a SET_FLAG waits until the data of its pipe's
    earlier loads is ready; a vector instruction right behind another shares its startup.
    Durations are `pipe_cycles` (a GM transfer at its path's bandwidth: no other core competes
    for the HBM or the L2 here); a GM load's data is ready `latency` cycles after its transfer
    (a sequence with one entry per instruction; default: an L2 hit).  None when the flags
    deadlock.
    """
    queues: dict[str, list] = {}
    for k, ins in enumerate(instrs):
        if ins.op in ("SET_FLAG", "WAIT_FLAG"):
            a = ins.attrs
            e = (SET if ins.op == "SET_FLAG" else WAIT, ins.pipe, (a["src"], a["dst"], a["event"]))
        else:
            lat = 0
            if _is_gm_load(ins):
                lat = latency[k] if latency is not None else machine.l2_hit_cycles
            e = (pipe_cycles(ins, machine), lat, is_vector(ins.op))
        queues.setdefault(ins.pipe, []).append(e)
    return _relax(queues, machine)


class _ShapeKey(tuple):
    """A `_shape_key`: its columns (thousands long), the attribute dicts and the operands first;
    it keys several dicts per task, so it is hashed once, and without those two columns (slow to
    hash; the ops, the pipes and the other operands tell shapes apart already; equal keys still
    compare every column)."""

    def __hash__(self):
        h = self.__dict__.get("hash")
        if h is None:
            h = self.__dict__["hash"] = hash(self[2:])
        return h


_OP, _PIPE, _DST, _SRCS, _ATTRS = map(attrgetter, ("op", "pipe", "dst", "srcs", "attrs"))
_ATTR_DICT = attrgetter("attrs._dict")


def _shape_key(instrs) -> tuple:
    """Equal for two streams that schedule the same: same ops, pipes, attributes and on-chip
    operands (interned TileRefs), same GM window shapes, and the windows of the GM buffers the
    stream writes at the same offsets relative to each buffer's lowest one.

    Every task is keyed, so the key is built column by column with C-level maps: the attribute
    dicts (an `Attrs`' own dict: equal as the Attrs are, and no copy), the operands (every dst,
    then every source: the tiles themselves, compared by identity first), the ops, the pipes,
    the operand counts, and the other operands (GM windows, scalars) by position, found with
    `list.index` per kind of operand; only those take a Python step each."""
    try:
        attrs = tuple(map(_ATTR_DICT, instrs))
    except AttributeError:                  # attributes that are not all `Attrs`
        attrs = tuple(dict(a) if a else {} for a in map(_ATTRS, instrs))
    srcs = tuple(map(_SRCS, instrs))
    operands = list(map(_DST, instrs))
    n = len(operands)
    operands.extend(chain.from_iterable(srcs))
    kinds = list(map(type, operands))
    others: dict[int, object] = {}      # position -> an operand that is not a tile (then its token)
    for kind in set(kinds):
        if kind is not TileRef:
            k = kinds.index(kind)
            while True:
                others[k] = operands[k]
                try:
                    k = kinds.index(kind, k + 1)
                except ValueError:
                    break
    if others:
        others = dict(sorted(others.items()))
        written = {o.buf.name for k, o in others.items() if k < n and isinstance(o, GMRef)}    # (`written_gm`)
        base: dict[str, int] = {}
        if written:
            for o in others.values():
                if isinstance(o, GMRef) and o.buf.name in written:
                    lo = o.span()[0]
                    if lo < base.get(o.buf.name, lo + 1):
                        base[o.buf.name] = lo
        for k, o in others.items():
            if isinstance(o, GMRef):
                name = o.buf.name
                if name in written:
                    lo, hi = o.span()
                    o = (name, lo - base[name], hi - base[name], o.shape)
                else:
                    o = (name, o.shape)
            operands[k] = others[k] = o
    return _ShapeKey((attrs, tuple(operands), tuple(map(_OP, instrs)), tuple(map(_PIPE, instrs)),
                      tuple(map(len, srcs)), tuple(others.items())))


_SYNC = frozenset(SYNC_OPS)
_NO_KEY = object()      # (a shape whose key is not known yet: None is the key of an unscheduled stream)


def _schedulable(instrs) -> bool:
    """Whether `schedule_task` may reorder a stream: two instructions at least, no sync yet."""
    return len(instrs) >= 2 and _SYNC.isdisjoint(map(_OP, instrs))


def _stream_key(t) -> tuple | None:
    """The `_shape_key` of task `t`'s stream, or None for a stream the pass leaves as it is
    (not `_schedulable`)."""
    return _shape_key(t.instrs) if _schedulable(t.instrs) else None


def schedule_task(instrs, machine: Machine, cache: dict | None = None, latency=None,
                  slowdown: float | None = None, cycles: dict | None = None,
                  shared: dict | None = None, skey: tuple | None = None) -> TaskSchedule:
    """Schedule one task's stream (see DynamicScheduler): the fastest of the original order, its
    list schedule, and both with batched flags, by `evaluate`; the original on a tie.  A stream
    longer than REGION_MIN is scheduled output tile by output tile (`_by_tiles`).  Streams
    that already hold sync instructions are left alone.  `cache` (a dict) shares the decision
    between streams of the same shape; `latency`: per instruction, a GM load's data latency
    (default: an L2 hit); `slowdown`: how much longer than its path allows a GM transfer takes
    (see `gm_slowdown`; default 1); `cycles`, `shared`: what streams of one pass share (see
    `_Stream`); `skey`: the stream's `_shape_key`, when the caller has it."""
    instrs = tuple(instrs)
    if skey is None and not _schedulable(instrs):     # (a stream with a key is schedulable: `_stream_key`)
        return TaskSchedule(instrs, None, None, "original")
    if slowdown is not None and slowdown > BANDWIDTH_BOUND:
        # the level waits for the shared HBM / L2 whatever each core's order: keep it
        return TaskSchedule(instrs, None, None, "original")
    perm, before, after, how, shape, _ = _decision(instrs, machine, cache, latency, slowdown, cycles, shared, skey)
    if perm is None:
        return TaskSchedule(instrs, before, after, how, shape)
    # (one C-level gather: a task of a 4096^3 matmul is twelve thousand instructions)
    return TaskSchedule(gather(instrs, perm), before, after, how, shape)


def _decision(instrs: tuple, machine: Machine, cache, latency, slowdown, cycles, shared, skey=None) -> tuple:
    """What `schedule_task` keeps for a schedulable stream: (the new order, a permutation, or None
    for the original; estimated cycles before and after; the kept candidate's name; the shape id
    (with a cache, else None); the flag plan of the kept order, None when none was made).
    Cached by shape key, load latencies and slowdown."""
    if latency is None:
        latency = tuple(machine.l2_hit_cycles if _is_gm_load(i) else 0 for i in instrs)
    if cache is None:
        skey = None
    elif skey is None:
        skey = _shape_key(instrs)
    key = (skey, tuple(latency), slowdown) if cache is not None else None
    hit = cache.get(key) if key is not None else None
    if hit is not None:
        return hit
    if len(instrs) > REGION_MIN:
        hit = _by_tiles(instrs, machine, cache, latency, slowdown, cycles, shared)
        if hit is not None:
            hit = (*hit, len(cache) if key is not None else None, None)
            if key is not None:
                cache[key] = hit
            return hit
    same = shared.get(skey) if shared is not None and skey is not None else None
    st = _Stream(instrs, machine, latency, slowdown, cycles, same)
    if same is None and shared is not None and skey is not None:
        shared[skey] = st
    original = list(range(len(instrs)))
    cands = [("original", original)]
    ls = list_schedule(instrs, machine, st.preds, st.cycles, st.latency)
    if ls != original:
        cands.append(("list", ls))
    for name, order in list(cands):
        b = batch_flags(order, st)
        if b != order and all(b != o for _, o in cands):
            cands.append((name + "+batched", b))
    before = best = evaluate(original, st, machine)
    how, perm = "original", None
    if before is not None:
        for name, order in cands[1:]:
            c = evaluate(order, st, machine)
            if c is not None and c < best and c <= before * (1 - MIN_GAIN) and st.valid(order):
                how, perm, best = name, tuple(order), c
    # the flags of the kept order: the sync pass inserts those (SYNC_PLANS)
    hit = (perm, before, best, how, len(cache) if key is not None else None, st.plan(perm or original))
    if key is not None:
        cache[key] = hit
    return hit


def _by_tiles(instrs: tuple, machine: Machine, cache, latency, slowdown, cycles, shared) -> tuple | None:
    """A long stream scheduled region by region, a region ending at each TSTORE (a matmul task's
    output tile, a vector task's row block): each region decided as a stream of its own
    (`_decision`: regions alike share one through the cache), the regions kept in their order,
    so every dependence between two of them holds.  (the new order or None, None, None, how):
    not timed as a whole; None for a stream of one region."""
    regions = store_regions(instrs)
    if len(regions) < 2:
        return None
    perm, reordered = [], 0
    for at, end in regions:
        region = instrs[at:end]
        got = _decision(region, machine, cache, latency[at:end], slowdown, cycles, shared)[0] \
            if _schedulable(region) else None
        if got is None:
            perm.extend(range(at, end))
        else:
            perm.extend([at + k for k in got])
            reordered += 1
    if not reordered:
        return None, None, None, "original"
    return tuple(perm), None, None, f"by tile ({reordered} of {len(regions)} reordered)"
