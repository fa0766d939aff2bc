"""Simulating a program: functional, timing, or both; optionally checked for races."""
from __future__ import annotations

import numpy as np

from ..errors import KernelSignatureError, PyptoError, SimulationError
from ..gcpause import gc_paused
from ..ir.program import Program
from .checks import check_races, find_all_races
from .functional import run_functional
from ..target.machine import get_machine
from .result import SimResult, build_stats
from .timing import ENGINES, run_timing

MODES = ("full", "functional", "timing")


def bind_buffers(program: Program, args) -> dict[str, np.ndarray]:
    """Positional arrays for the program's non-workspace GM buffers, in their printed order."""
    names = [b for b in program.buffers if b.role != "workspace"]
    if len(args) == 1 and isinstance(args[0], dict):
        return dict(args[0])
    if len(args) != len(names):
        raise KernelSignatureError(f"program {program.name} takes {len(names)} arrays",
                                   expected=", ".join(b.name for b in names), got=f"{len(args)} arrays")
    return {b.name: np.asarray(a) for b, a in zip(names, args)}


def simulate(program: Program, *args, machine="a2a3", mode: str = "full", check: bool = False,
             trace: bool = True, progress: bool = True, engine: str = "auto", races: bool = False,
             step=None) -> SimResult:
    """Run a PTO program.

    `args` are numpy arrays for the program's GM buffers (inputs and outputs, in the order of its
    `.gm` lines; workspaces excluded) or one dict name -> array; `mode="timing"` needs none.
    `check=True` is the checked mode: uninitialised on-chip reads, event ids reused before their
    wait, and races between pipes or tasks raise `pypto.SimulationError`.
    `trace=False` keeps no per-instruction trace (less memory on large programs); `progress`
    shows a progress bar on stderr when the timing simulation takes longer than a second.

    `engine` chooses how the timing simulation runs; every engine gives the same results:
    "python", "compiled" (numba, some 20-30x faster; its first use in a process costs about half a
    second, its very first use on a computer some seconds to compile; an error when numba is not
    installed) or "auto" (default): compiled for programs of at least 100,000 instructions
    when numba is installed, and from 5,000 once it is loaded in the process; else Python.

    `races=True` (with a timing mode) looks for the races checked mode raises on, without
    raising: they are listed in `res.races` and make `res.ok` False.

    `step(what)`, if given, is called as each part of the work starts ("values", "timing",
    "races"): the steps of a caller's progress bar (`CompiledKernel.simulate`).
    """
    if mode not in MODES:
        raise PyptoError("unknown simulation mode", expected=" or ".join(MODES), got=repr(mode))
    if engine not in ENGINES:
        raise PyptoError("unknown timing engine", expected=" or ".join(ENGINES), got=repr(engine))
    m = get_machine(machine)
    with gc_paused():       # a plan, a trace: many small objects that form no cycles
        return _simulate(program, args, m, mode, check, trace, progress, engine, races, step or no_step)


def no_step(what: str) -> None:
    """A `step` that reports nothing (no progress bar to move)."""


def steps(mode: str, check: bool, races: bool) -> int:
    """How many times `simulate(..., step=)` calls `step` with these arguments."""
    timing = mode in ("full", "timing")
    return (mode in ("full", "functional")) + timing + (timing and (check or races))


def _simulate(program, args, m, mode, check, trace, progress, engine, races, step) -> SimResult:
    verified = program.__dict__.setdefault("_verified_for", set())
    if m not in verified:       # hand-written or edited programs: clear errors before running
        program.verify(m)
        verified.add(m)
    res = SimResult(program.name, m, None, program=program)
    if mode in ("full", "functional"):
        step("values")
        res.outputs = run_functional(program, m, bind_buffers(program, args), checked=check)
    if mode in ("full", "timing"):
        step("timing")
        t = run_timing(program, m, trace=trace, record_times=check or races, checked=check, progress=progress,
                       engine=engine)
        if check or races:
            step("races")
        if check:
            check_races(program, t)
            if t["unwaited"]:
                raise SimulationError("\n".join(t["unwaited"]))
        elif races:
            res.races = find_all_races(program, t)
        res.cycles = t["cycles"]
        res.trace = t["events"]
        res.task_times = t["tasks"]
        res.stats = build_stats(t, program, m)
    return res
