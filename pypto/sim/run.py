"""Simulating a program: functional, timing, or both."""
from __future__ import annotations

import numpy as np

from ..errors import PyptoError
from ..ir.program import Program
from .functional import run_functional
from .machine import get_machine
from .result import SimResult, build_stats
from .timing import run_timing

MODES = ("full", "functional", "timing")


def simulate(program: Program, arrays: dict[str, np.ndarray] | None = None, machine="a2a3",
             mode: str = "full", trace: bool = True) -> SimResult:
    if mode not in MODES:
        raise PyptoError("unknown simulation mode", expected=" or ".join(MODES), got=repr(mode))
    m = get_machine(machine)
    res = SimResult(program.name, m, None)
    if mode in ("full", "functional"):
        res.outputs = run_functional(program, m, arrays or {})
    if mode in ("full", "timing"):
        t = run_timing(program, m, trace=trace)
        res.cycles = t["cycles"]
        res.trace = t["events"]
        res.stats = build_stats(t, program, m)
    return res
