"""Block -> Execution lowering and the Execution-level pipeline: pipe binding (`select`),
scheduling (listsched.py), sync insertion (sync.py), buffer pressure (pressure.py), codegen."""
from __future__ import annotations

from ..ir.block import BlockGraph
from ..ir.core import Attrs
from ..ir.exec import ExecGraph, carry_streams, ExecTask, Instr, TileRef, pipe_of
from ..ir.program import Program
from ..target.isa import ATTRS, SYNC_OPS, gm_access
from .listsched import DynamicScheduler
from .pipeline import Pass, PassContext
from .pressure import BUFFER_PRESSURE
from .sync import insert_sync


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
    # per op: (how its GM window is an operand, its pipe); per tuple of attribute names: the
    # names an instruction keeps, in their order (none: one shared empty Attrs)
    how: dict[str, tuple[str, str | None]] = {}
    kept_of: dict[tuple, tuple] = {}
    keep = set(ATTRS) | {"scalar"}
    empty = Attrs()
    make = Instr._make                  # (op, pipe, dst, srcs, attrs, loc), all given
    tasks = []
    for t in g.tasks:
        instrs = []
        append = instrs.append
        for i in t.nodes:
            n = nodes[i]
            op = n.op
            h = how.get(op)
            if h is None:
                acc = gm_access(op)
                kind = "load" if op == "TLOAD" else "store" if op == "TSTORE" else acc or (
                    "flag" if op in SYNC_OPS else "tile")
                h = how[op] = (kind, None if op == "TSTORE" else "MTE2" if op == "TLOAD" else pipe_of(op))
            kind, pipe = h
            d = n.attrs._dict
            if kind == "flag":      # a tile-level kernel's own flag (pypto.tile.set_flag / wait_flag)
                append(make(op, d["src"] if op == "SET_FLAG" else d["dst"], None, (),
                            Attrs({k: d[k] for k in ("src", "dst", "event")}), n.loc))
                continue
            names = tuple(d)
            kept = kept_of.get(names)
            if kept is None:
                kept = kept_of[names] = tuple(k for k in names if k in keep)
            srcs = tuple([refs[j] for j in n.inputs])
            if kept:
                a = {k: d[k] for k in kept}
                if "scalar" in a:
                    srcs += (a.pop("scalar"),)
                a = Attrs(a)
            else:
                a = empty
            if kind == "load":
                ins = make("TLOAD", "MTE2", refs[i], (d["gm"],), a, n.loc)
            elif kind == "store":
                ins = make("TSTORE", pipe_of("TSTORE", srcs[0].space), d["gm"], srcs, a, n.loc)
            elif kind == "read":     # MGATHER: dst <- GM window, index tile
                ins = make(op, pipe, refs[i], (d["gm"],) + srcs, a, n.loc)
            elif kind == "write":    # MSCATTER: GM window <- values, index tile
                ins = make(op, pipe, d["gm"], srcs, a, n.loc)
            else:
                ins = make(op, pipe, refs[i], srcs, a, n.loc)
            append(ins)
        tasks.append(ExecTask(t.id, t.group, t.core_type, t.deps, t.level, tuple(instrs), t.pair))
    return ExecGraph(g.name, g.tiles.buffers, tuple(tasks))


def codegen(g: ExecGraph, ctx: PassContext | None = None) -> Program:
    program = Program(g.name, g.buffers, g.tasks)
    carry_streams(g, program)           # isomorphic task streams: the simulator decodes each shape once
    # the Execution level's verifier and the compiler's construction vouch for it: the simulator
    # need not re-check it as it checks hand-written programs
    program.__dict__["_verified_for"] = {ctx.machine} if ctx is not None else set()
    return program


SELECT = Pass("select", "block->exec", select_instructions, "bind every tile op to a pipe with resolved operands")
EXEC_PASSES = [
    DynamicScheduler().as_pass("scheduling"),
    Pass("insert_sync", "exec", insert_sync, "SET_FLAG/WAIT_FLAG between pipes where data or buffers are shared"),
    BUFFER_PRESSURE,
]
CODEGEN = Pass("codegen", "exec->pto", codegen, "emit the PTO program")
