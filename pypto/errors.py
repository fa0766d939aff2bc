"""Errors that speak to the user: the kernel's file and line, a caret, expected vs got.

Every error pypto raises on purpose is a `PyptoError`.  The message is built once, at
construction, so that `str(err)` is the whole story and no compiler frame is needed to
understand it.
"""
from __future__ import annotations

import functools
import linecache
import os
import sys
import sysconfig
from dataclasses import dataclass, field


_CELLS: dict = {}   # file -> (the shell's {cell file: number}, the number, the name) when last asked


def _cell_name(file: str) -> str | None:
    """'In[3]' when `file` holds a notebook / IPython cell (IPython names cells by temp files).
    A re-run cell (the same file: ipykernel names a cell by a hash of its text) takes its new
    number: the name is kept per file only as long as the shell's number for it is the same
    (`SourceLoc.short` is called per printed instruction: the check is one dict lookup)."""
    hit = _CELLS.get(file)
    if hit is not None and hit[0] is not None and hit[0].get(file) == hit[1]:
        return hit[2]
    ipython = sys.modules.get("IPython")           # never imported here: only used if loaded
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return None
    try:
        named = shell.compile.format_code_name(file)
    except Exception:  # noqa: BLE001 - an IPython without cell names: use the file name
        return None
    name = named[1] if named else None
    numbers = getattr(shell.compile, "_filename_map", None)
    if isinstance(numbers, dict):
        _CELLS[file] = (numbers, numbers.get(file), name)
    return name


def cell_number(shell) -> int:
    """The number of the cell `shell` is running now, as its prompt shows it (`In [7]`).
    IPython 9 counts the cell before running it, so `shell.execution_count` is already the
    next cell's number while a cell runs; the running cell's own result knows its number."""
    running = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    number = getattr(running, "execution_count", None)
    return number if isinstance(number, int) else shell.execution_count


@dataclass(frozen=True)
class SourceLoc:
    """A place in the user's source: file, line, (optionally) the function, and (optionally) the
    columns of the failing call on that line.

    `col` / `end_col` are Python's 0-based UTF-8 byte offsets on `line` (what `co_positions()` and
    `traceback.FrameSummary` give); `end_col=None` with a `col` means "to the end of the line" (a
    call that continues on the next lines).  They take no part in equality, hashing or `short()`:
    printed IR and programs name `file.py:12` (or `In[7]:12`) only."""

    file: str
    line: int
    func: str = ""
    col: int | None = field(default=None, compare=False, repr=False)
    end_col: int | None = field(default=None, compare=False, repr=False)

    def short(self) -> str:
        """`file.py:12`, or `In[7]:12` for a notebook / IPython cell (what the user sees next to
        it; ipykernel's file is a temporary `3308725122.py`): in printed IR, programs, graph
        nodes, traces, race reports and error messages."""
        cell = _cell_name(self.file)
        if cell:
            return f"{cell}:{self.line}"
        name = self.file.rsplit("/", 1)[-1]
        return f"{name}:{self.line}"

    display = short             # the name error messages use

    def source_line(self) -> str:
        return linecache.getline(self.file, self.line).rstrip("\n")

    def span(self, text: str | None = None) -> tuple[int, int] | None:
        """(start, end) character offsets of the call on the source line, or None when unknown."""
        if self.col is None:
            return None
        text = self.source_line() if text is None else text
        raw = text.encode("utf-8")
        start = len(raw[:self.col].decode("utf-8", errors="ignore"))
        end = len(text) if self.end_col is None else len(raw[:self.end_col].decode("utf-8", errors="ignore"))
        if end <= start:
            end = start + 1
        return start, end

    def __str__(self) -> str:
        return self.short()


def code_loc(code, lasti: int, line: int | None = None, func: str | None = None) -> SourceLoc:
    """The location of the instruction at byte offset `lasti` of `code` (a frame's `f_lasti`):
    its line and the columns of the expression it evaluates (Python >= 3.11)."""
    col = end_col = None
    lineno = line
    try:
        positions = code.co_positions()
        for _ in range(lasti // 2):
            next(positions)
        start, end_line, c, e = next(positions)
        if start is not None and c is not None:
            lineno, col = start, c
            end_col = e if end_line == start else None
    except (AttributeError, StopIteration, TypeError, ValueError):
        pass
    if lineno is None:
        lineno = code.co_firstlineno
    return SourceLoc(code.co_filename, lineno, func if func is not None else code.co_name, col, end_col)


_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def in_package(fname: str) -> bool:
    """Whether `fname` is a file of the pypto package itself (not the user's code)."""
    return os.path.abspath(fname).startswith(_PKG_DIR)


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {os.path.abspath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")
            if paths.get(k)}
    return tuple(sorted(dirs))


def caller_loc(depth: int = 1) -> SourceLoc | None:
    """The user's line that called into pypto: the innermost frame (from `depth` frames up)
    outside the pypto package, the standard library and installed packages (IPython, pytest),
    with the columns of the call.  None when there is none (pypto called by a library only)."""
    f = sys._getframe(depth)
    libs = _library_dirs()
    while f is not None:
        name = f.f_code.co_filename
        if not in_package(name) and not os.path.abspath(name).startswith(libs) and not name.startswith("<frozen"):
            return code_loc(f.f_code, f.f_lasti, f.f_lineno)
        f = f.f_back
    return None


def located(err: "PyptoError", depth: int = 2) -> "PyptoError":
    """`err` itself when it has a location, else the same error pointing at the user's call
    (see `caller_loc`): for errors of the public API outside a kernel (machines, options,
    passes, program text)."""
    if err.loc is not None:
        return err
    loc = caller_loc(depth)
    return err.relocated(loc) if loc is not None else err


def at_caller(fn):
    """Decorator of a public API function outside a kernel (machines, pipeline editing): a
    PyptoError it raises without a location points at the user's line that called it
    (`located`), with no frame of pypto."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PyptoError as e:
            raise located(e).with_traceback(None) from None
    return wrapper


def format_location(loc: SourceLoc | None) -> str:
    """`file:line` followed by the source line and carets under the failing call (under the
    whole statement when the columns are not known)."""
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
    shift = len(text) - len(stripped)
    span = loc.span(text)
    if span is None:
        start, end = 0, len(stripped.rstrip())
    else:
        start, end = max(span[0] - shift, 0), max(span[1] - shift, 1)
        end = min(max(end, start + 1), max(len(stripped.rstrip()), start + 1))
    indent = "    "
    return f"{where}\n{indent}{stripped.rstrip()}\n{indent}{' ' * start}{'^' * (end - start)}"


class PyptoError(Exception):
    """Base class of every error pypto raises on purpose.

    `hint` (optional) says how to fix it; it is printed after expected/got and is not part of
    `message` (the one-line statement some callers print alone)."""

    def __init__(self, message: str, *, loc: SourceLoc | None = None,
                 expected: object = None, got: object = None, hint: str | None = None):
        self.message = message
        self.loc = loc
        self.expected = expected
        self.got = got
        self.hint = hint
        super().__init__(self._compose())

    def _compose(self) -> str:
        head = f"{self.loc.display()}: {self.message}" if self.loc else self.message
        parts = [head]
        if self.loc is not None:
            parts.append(format_location(self.loc))
        if self.expected is not None or self.got is not None:
            parts.append(f"  expected: {self.expected}\n  got:      {self.got}")
        if self.hint:
            parts.append(f"  hint:     {self.hint}")
        return "\n".join(parts)

    def relocated(self, loc: SourceLoc | None) -> "PyptoError":
        """The same error (same class and fields) pointing at `loc`."""
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        PyptoError.__init__(new, self.message, loc=loc, expected=self.expected, got=self.got, hint=self.hint)
        return new


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
