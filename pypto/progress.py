"""Progress of long work (compiling, simulating) as events, for whoever shows it.

The compiler and the simulator report what they do as steps of a `Stage`: `stage(what, total)`
opens one (`what`: "compiling softmax", "simulating softmax"; `total`: the steps it will take,
passes or instructions, `unit` naming them), `update(done, detail)` says how far it is, `close()` ends it.  They never
draw.  Who listens decides how it looks:

- by default, a one-line bar on stderr once a stage has run for `STDERR_AFTER_S` (a script or a
  terminal sees a long simulation move, as before); not in a Jupyter kernel, where the line would
  stay among the cell's stored outputs, there or not by the machine's speed (nbval compares them);
  the explorer, the magic and `pypto.tune` draw bars of their own there;
- inside `listening(callback)` (the explorer and the magic use it), `callback(event)` gets every
  update as a `ProgressEvent` instead, and nothing is written to stderr; the callback throttles
  and draws (a progress bar in the notebook, next to the view it is refreshing).

A listener is per thread (a `contextvars.ContextVar`): a simulation in a worker thread does not
report to the notebook's bar.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from typing import Callable, NamedTuple

STDERR_AFTER_S = 1.0      # the default stderr bar appears after a stage has run this long


class ProgressEvent(NamedTuple):
    what: str             # "compiling softmax", "simulating softmax"
    done: int             # steps done (passes, instructions)
    total: int            # steps the stage takes
    detail: str           # what it is doing now ("pass scheduling"), or ""
    unit: str             # what the steps are ("passes", "instructions"), or ""
    elapsed: float        # seconds since the stage opened
    closed: bool          # the stage has ended

    @property
    def fraction(self) -> float:
        return min(self.done / self.total, 1.0) if self.total > 0 else 0.0


_LISTENER: contextvars.ContextVar[Callable[[ProgressEvent], None] | None] = \
    contextvars.ContextVar("pypto_progress_listener", default=None)


@contextlib.contextmanager
def listening(callback: Callable[[ProgressEvent], None]):
    """Within the block, the stages opened in this thread report to `callback` (and not to
    stderr).  A callback that raises is dropped for the rest of the block: showing progress
    never breaks the work."""
    def safe(event):
        nonlocal alive
        if alive:
            try:
                callback(event)
            except Exception:       # noqa: BLE001 - a broken display must not stop a compile
                alive = False
    alive = True
    token = _LISTENER.set(safe)
    try:
        yield
    finally:
        _LISTENER.reset(token)


class Stage:
    """One piece of long work: see the module docstring.  `quiet=True`: no stderr bar (a
    listener still hears it)."""

    def __init__(self, what: str, total: int, unit: str = "", quiet: bool = False):
        self.what, self.total, self.unit = what, max(int(total), 1), unit
        self.t0 = time.perf_counter()
        self.listener = _LISTENER.get()
        self.quiet = quiet
        self.shown = False          # the stderr bar was written
        self.done = 0

    def update(self, done: int, detail: str = "") -> None:
        self.done = done
        elapsed = time.perf_counter() - self.t0
        if self.listener is not None:
            self.listener(ProgressEvent(self.what, done, self.total, detail, self.unit, elapsed, False))
        elif not self.quiet and elapsed >= STDERR_AFTER_S and not _in_kernel():
            self.shown = True
            frac = min(done / self.total, 1.0)
            bar = "#" * int(30 * frac)
            sys.stderr.write(f"\r{self.what} [{bar:<30}] {100 * frac:5.1f}% {done}/{self.total}"
                             f"{' ' + self.unit if self.unit else ''}{', ' + detail if detail else ''}, {elapsed:.1f} s")
            sys.stderr.flush()

    def close(self, done: int | None = None) -> None:
        done = self.total if done is None else done
        if self.listener is not None:
            self.listener(ProgressEvent(self.what, done, self.total, "", self.unit, time.perf_counter() - self.t0, True))
        elif self.shown:
            self.update(done)
            sys.stderr.write("\n")


def _in_kernel() -> bool:
    """Whether stderr is a Jupyter kernel's stream (ipykernel's OutStream)."""
    return type(sys.stderr).__module__.startswith("ipykernel")


def stage(what: str, total: int, unit: str = "", quiet: bool = False) -> Stage:
    return Stage(what, total, unit, quiet)
