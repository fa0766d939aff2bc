"""Errors that speak to the user: the kernel's file and line, a caret, expected vs got.

Every error pypto raises on purpose is a `PyptoError`.  The message is built once, at
construction, so that `str(err)` is the whole story and no compiler frame is needed to
understand it.
"""
from __future__ import annotations

import linecache
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLoc:
    """A place in the user's source: file, line and (optionally) the function."""

    file: str
    line: int
    func: str = ""

    def short(self) -> str:
        name = self.file.rsplit("/", 1)[-1]
        return f"{name}:{self.line}"

    def source_line(self) -> str:
        return linecache.getline(self.file, self.line).rstrip("\n")

    def __str__(self) -> str:
        return self.short()


def format_location(loc: SourceLoc | None) -> str:
    """`file:line` followed by the source line and a caret under its first character."""
    if loc is None:
        return ""
    text = loc.source_line()
    where = f'  File "{loc.file}", line {loc.line}'
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
        head = f"{self.loc.short()}: {self.message}" if self.loc else self.message
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
