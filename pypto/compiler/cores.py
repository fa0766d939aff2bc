"""Execution-level pass `assign_cores`: which core runs each task.

Tasks are ready when their dependencies end; the machine's dispatcher gives a ready task the
free core of its type with the lowest id (a paired epilogue: the AIV of its cube task's AIC).
The pass runs that dispatch on the timing model — the program's own cycles, L2 and HBM sharing
included — and writes the core each task got into the program (`.task 3 AIC ... core=3`).  The
schedule does not change: a task pinned to the core it would have been given starts at the
same cycle.  What the program gains is a mapping one can read, and edit: move a task to
another core in the text, parse it back and simulate (`pypto.Program.parse`).

`options={"core_assignment": False}` leaves `core` unset: the simulator then dispatches at run
time, as it does for hand-written programs without `core=`.
"""
from __future__ import annotations

from ..ir.exec import ExecGraph, carry_streams
from .pipeline import Pass, PassContext
from .schedule import codegen


def assign_cores(g: ExecGraph, ctx: PassContext | None = None) -> ExecGraph:
    if ctx is None or not ctx.options.get("core_assignment", True) or not g.tasks:
        return g
    # the timing run is kept in the streams' simulator cache (`ir.exec.SIM_CACHE`): the program
    # with the cores fixed runs the same schedule, so simulate(mode="timing") reuses it
    t = ctx.timed(codegen(g, ctx), "assign_cores")
    core_of = {tid: int(name[3:]) for tid, (name, _, _) in t["tasks"].items()}    # "AIC12" -> 12
    out = g.replace(tuple(task.with_core(core_of[task.id]) for task in g.tasks))
    carry_streams(g, out)               # the instruction streams are the same objects
    return out


ASSIGN_CORES = Pass("assign_cores", "exec", assign_cores,
                    "fix the core of every task to the one the dispatcher gives it on the timing model")
