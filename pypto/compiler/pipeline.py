"""Passes and the pipeline that runs them, verifying and logging between passes.

A pass is a named callable `graph, ctx -> graph` tagged with the level it works on.  A
lowering is a pass whose level is "a->b".  The pipeline runs them in order, calls the level's
verifier after each (naming the pass that broke an invariant), and records node counts and time.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import PyptoError, VerificationError
from ..gcpause import gc_paused
from ..progress import stage

LEVELS = ("tensor", "tile", "block", "exec", "pto")
BUILTIN_PASSES: set = set()   # filled by pypto.compiler: passes trusted to keep their level valid


@dataclass(frozen=True)
class Pass:
    name: str
    level: str
    fn: Callable[[Any, "PassContext"], Any]
    doc: str = ""

    def __call__(self, graph, ctx):
        return self.fn(graph, ctx)

    @property
    def is_lowering(self) -> bool:
        return "->" in self.level


# what `compile(..., options={...})` can turn off (every option defaults to True)
OPTIONS = {
    "fusion": "fuse elementwise chains, reductions and cube epilogues into groups",
    "autocast": "compute fp16/bf16 math in fp32 where precision needs it",
    "layout": "fold transposes and give cube operands the NZ layout",
    "double_buffer": "two buffers per loaded tile, so loads overlap compute",
    "l1_reuse": "serpentine K and operand chunks kept in L1 across the output tiles of a task",
    "pairing": "vector epilogues on the two AIVs paired with their cube task's AIC",
    "list_scheduling": "reorder each task's instructions across pipes (DynamicScheduler)",
    "cross_core_sync": "paired epilogues start on each stored tile, not after the whole cube task",
    "core_assignment": "fix each task's core in the program (else the simulator dispatches)",
    "loops": "write each task's repeated instruction sequences once, as loops (.loop N in the PTO text)",
}


def check_options(options: dict, passes) -> None:
    """Unknown option names are an error (a misspelt option would silently change nothing),
    unless the pipeline has passes of the user's, which may read options of their own."""
    unknown = sorted(k for k in options if k not in OPTIONS)
    if unknown and all(p in BUILTIN_PASSES for p in passes):
        from ..errors import PyptoError
        import difflib
        close = difflib.get_close_matches(unknown[0], list(OPTIONS), n=1)
        raise PyptoError(f"unknown compile option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}",
                         expected="some of " + ", ".join(OPTIONS), got=", ".join(unknown),
                         hint=f"did you mean {close[0]!r}?" if close else
                         "options turn built-in optimisations off: options={'fusion': False}")


@dataclass
class PassContext:
    machine: Any
    options: dict = field(default_factory=dict)
    # The timing model, `timing(program, machine) -> {"cycles": ..., "tasks": {id: (core, start,
    # end)}, ...}`, for the passes that time what they choose (assign_cores, AutoTilingPass with
    # search=True).  The compiler sits below the simulator and does not import it: whoever runs
    # the pipeline hands it in (the jit gives pypto.sim.timing.timed).
    timing: Callable[[Any, Any], dict] | None = None

    def timed(self, program, who: str) -> dict:
        """The timing model's run of `program` on the context's machine; `who` (the pass asking)
        names the pass in the error when the context has no timing model."""
        if self.timing is None:
            raise PyptoError(f"pass {who} times programs, but its PassContext has no timing model",
                             expected="PassContext(machine, options, timing=pypto.sim.timing.timed)",
                             got="timing=None",
                             hint="compile through a @pypto.jit kernel (kernel.compile), which gives one")
        return self.timing(program, self.machine)


@dataclass(frozen=True)
class PassRecord:
    name: str
    level: str
    nodes_before: int
    nodes_after: int
    ms: float

    def text(self, timing: bool = True) -> str:
        line = f"{self.level:>12}  {self.name:<25} {self.nodes_before:>7} -> {self.nodes_after:<7}"
        return line + (f" {self.ms:8.2f} ms" if timing else "")

    def __str__(self):
        return self.text()


class PassLog(list):
    """The passes that ran, in order (a list of PassRecord with a readable text form)."""

    def text(self, timing: bool = True) -> str:
        """One line per pass; `timing=False` leaves out the (machine-dependent) times."""
        head = f"{'level':>12}  {'pass':<25} {'nodes':>7}    {'':<7}" + (f" {'time':>8}" if timing else "")
        return "\n".join(line.rstrip() for line in [head] + [r.text(timing) for r in self])

    def __str__(self):
        return self.text()

    def _repr_pretty_(self, p, cycle):
        p.text(self.text())


def _raising_line(tb):
    """The innermost line of user code (outside pypto) in traceback `tb`, with its columns."""
    import os
    import traceback
    from ..errors import SourceLoc
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    loc = None
    for fs in traceback.extract_tb(tb):
        if not os.path.abspath(fs.filename).startswith(pkg):
            end = fs.end_colno if getattr(fs, "end_lineno", fs.lineno) == fs.lineno else None
            loc = SourceLoc(fs.filename, fs.lineno, fs.name, getattr(fs, "colno", None), end)
    return loc


def _pass_loc(p: Pass):
    """The `def` line of a user pass's function (its `apply`), or None for a built-in."""
    from ..errors import SourceLoc
    fn = getattr(p.fn, "user_fn", None)
    if p in BUILTIN_PASSES or fn is None:
        return None
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None), "__code__", None)
    if code is None:
        return None
    return SourceLoc(code.co_filename, code.co_firstlineno, code.co_name)


def _verifier(level: str):
    from ..ir import block, exec as exec_ir, tensor, tile
    return {"tensor": lambda g, ctx: tensor.verify(g),
            "tile": lambda g, ctx: tile.verify(g, ctx.machine.capacities()),
            "block": lambda g, ctx: block.verify(g),
            "exec": lambda g, ctx: exec_ir.verify(g)}.get(level)


class Pipeline:
    def __init__(self, passes: list[Pass]):
        self.passes = list(passes)

    def run(self, graph, ctx: PassContext, verify: bool | str = "levels", snapshots: bool = False):
        """Run every pass; return ({level: final graph}, PassLog, snapshots or None).

        `verify`: "levels" checks each level's invariants once, on the graph that leaves it (the
        default); "each" (or True, debug mode) after every pass, naming the pass that broke one;
        False never.
        """
        if verify is True:
            verify = "each"
        # the passes allocate millions of small acyclic objects (tile nodes, instructions): with
        # the cyclic GC on, the collections they trigger walk the growing program again and
        # again (about 45% of a 4096^3 matmul's compile); restored on any exit (gcpause.py)
        # the passes as progress events, for a listener (the explorer's busy bar); quiet otherwise:
        # a notebook cell would keep a timing-dependent stderr line among its outputs
        bar = stage(f"compiling {getattr(graph, 'name', 'kernel')}", len(self.passes), "passes", quiet=True)
        try:
            with gc_paused():
                return self._run(graph, ctx, verify, snapshots, bar)
        finally:
            bar.close(bar.done)

    def _run(self, graph, ctx: PassContext, verify, snapshots: bool, bar):
        last_of_level = {p.level.split("->")[-1]: i for i, p in enumerate(self.passes)}
        levels = {graph.level: graph}
        log = PassLog()
        snaps = [] if snapshots else None
        for i, p in enumerate(self.passes):
            bar.update(i, f"pass {p.name}")
            before = len(graph)
            t0 = time.perf_counter()
            try:
                out = p(graph, ctx)
            except PyptoError:
                raise
            except Exception as e:  # a pass bug: say which pass, keep the cause chained
                user = p not in BUILTIN_PASSES
                raise PyptoError(f"pass '{p.name}' ({p.level}) failed: {type(e).__name__}: {e}",
                                 loc=_raising_line(e.__traceback__) if user else None,
                                 hint="the exception was raised by this pass (a pass of yours); nothing was "
                                      "cached" if user else None) from e
            ms = (time.perf_counter() - t0) * 1e3
            want = p.level.split("->")[-1]
            if getattr(out, "level", None) != want:
                got = "None" if out is None else (f"a {out.level} graph" if hasattr(out, "level")
                                                  else type(out).__name__)
                hint = None
                if out is None:
                    hint = "apply(graph) must end with `return graph` (or the new graph it built)"
                raise PyptoError(f"pass '{p.name}' returned {got}"
                                 , loc=_pass_loc(p),
                                 expected=f"a {want} graph", got=got, hint=hint)
            # (the pass's input is let go first: at a large kernel's Tile level it is a graph as
            # big as the output, and the verifier's tables would come on top of both)
            graph = levels[want] = out
            if verify == "each" or (verify == "levels" and (last_of_level[want] == i or p not in BUILTIN_PASSES)):
                check = _verifier(want)
                if check is not None:
                    try:
                        check(out, ctx)
                    except VerificationError as e:
                        raise VerificationError(f"after pass '{p.name}': {e.message}", loc=e.loc,
                                                expected=e.expected, got=e.got) from None
            log.append(PassRecord(p.name, p.level, before, len(out), ms))
            if snaps is not None:
                snaps.append((p.name, out))
        bar.update(len(self.passes))
        return levels, log, snaps
