"""Block -> Execution lowering and the Execution-level pipeline: pipe binding (`select`),
scheduling (listsched.py), sync insertion (sync.py), buffer pressure (pressure.py), codegen."""
from __future__ import annotations

from ..ir.block import BlockGraph
from ..ir.core import Attrs
from ..ir.exec import ExecGraph, carry_streams, ExecTask, Instr, TileRef, pipe_of
from ..ir.program import Program
from ..target.isa import ATTRS, gm_access
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
    tasks = []
    for t in g.tasks:
        instrs = []
        for i in t.nodes:
            n = nodes[i]
            a = {k: v for k, v in n.attrs.items() if k in ATTRS or k == "scalar"}
            srcs = tuple(refs[j] for j in n.inputs)
            if "scalar" in a:
                srcs += (a.pop("scalar"),)
            if n.op == "TLOAD":
                ins = Instr("TLOAD", "MTE2", refs[n.id], (n.attrs["gm"],), Attrs(a), n.loc)
            elif n.op == "TSTORE":
                ins = Instr("TSTORE", pipe_of("TSTORE", srcs[0].space), n.attrs["gm"], srcs, Attrs(a), n.loc)
            elif gm_access(n.op) == "read":     # MGATHER: dst <- GM window, index tile
                ins = Instr(n.op, pipe_of(n.op), refs[n.id], (n.attrs["gm"],) + srcs, Attrs(a), n.loc)
            elif gm_access(n.op) == "write":    # MSCATTER: GM window <- values, index tile
                ins = Instr(n.op, pipe_of(n.op), n.attrs["gm"], srcs, Attrs(a), n.loc)
            else:
                ins = Instr(n.op, pipe_of(n.op), refs[n.id], srcs, Attrs(a), n.loc)
            instrs.append(ins)
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
