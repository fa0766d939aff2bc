"""Errors that speak to the user: the kernel's file and line, a caret, expected vs got.

Every error pypto raises on purpose is a `PyptoError`.  The message is built once, at
construction, so that `str(err)` is the whole story and no compiler frame is needed to
understand it.
"""
from __future__ import annotations

import functools
import linecache
import sys
from dataclasses import dataclass


@functools.lru_cache(maxsize=256)
def _cell_name(file: str) -> str | None:
    """'In[3]' when `file` holds a notebook / IPython cell (IPython names cells by temp files)."""
    ipython = sys.modules.get("IPython")           # never imported here: only used if loaded
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return None
    try:
        named = shell.compile.format_code_name(file)
    except Exception:  # noqa: BLE001 - an IPython without cell names: use the file name
        return None
    return named[1] if named else None


@dataclass(frozen=True)
class SourceLoc:
    """A place in the user's source: file, line and (optionally) the function."""

    file: str
    line: int
    func: str = ""

    def short(self) -> str:
        """`file.py:12`: stable across runs, used in printed IR and programs."""
        name = self.file.rsplit("/", 1)[-1]
        return f"{name}:{self.line}"

    def display(self) -> str:
        """`In[3]:12` for a notebook cell (what the user sees next to it), else `file.py:12`:
        for error messages."""
        cell = _cell_name(self.file)
        return f"{cell}:{self.line}" if cell else self.short()

    def source_line(self) -> str:
        return linecache.getline(self.file, self.line).rstrip("\n")

    def __str__(self) -> str:
        return self.short()


def format_location(loc: SourceLoc | None) -> str:
    """`file:line` followed by the source line and a caret under its first character."""
    if loc is None:
        return ""
    text = loc.source_line()
    cell = _cell_name(loc.file)
    where = f"  Cell {cell}, line {loc.line}" if cell else f'  File "{loc.file}", line {loc.line}'
    if loc.func:
        where += f", in {loc.func}"
    if not text.strip():
        return where
    stripped = text.lstrip()
    indent = "    "
    return f"{where}\n{indent}{stripped}\n{indent}^"


class PyptoError(Exception):
    """Base class of every error pypto raises on purpose."""

    def __init__(self, message: str, *, loc: SourceLoc | None = None,
                 expected: object = None, got: object = None):
        self.message = message
        self.loc = loc
        self.expected = expected
        self.got = got
        super().__init__(self._compose())

    def _compose(self) -> str:
        head = f"{self.loc.display()}: {self.message}" if self.loc else self.message
        parts = [head]
        if self.loc is not None:
            parts.append(format_location(self.loc))
        if self.expected is not None or self.got is not None:
            parts.append(f"  expected: {self.expected}\n  got:      {self.got}")
        return "\n".join(parts)


class KernelSignatureError(PyptoError):
    """The kernel was called with arguments that do not fit its signature."""


class ShapeError(PyptoError):
    """Tensor shapes do not fit an operation."""


class DTypeError(PyptoError):
    """A dtype is unsupported or does not fit an operation."""


class TileShapeError(PyptoError):
    """A tile shape is misaligned or does not fit its on-chip buffer."""


class UnsupportedError(PyptoError):
    """A construct pypto does not handle (yet)."""


class VerificationError(PyptoError):
    """An IR level broke one of its invariants (names the pass that broke it)."""


class SimulationError(PyptoError):
    """The simulator found the program impossible to run (deadlock, bad operand, ...)."""


class MagicUsageError(PyptoError):
    """Bad options or arguments given to the %%pypto cell magic."""
