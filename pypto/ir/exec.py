"""Level 4, the Execution Graph: task launches with dependencies, each an instruction stream.

Every instruction is bound to a pipe of its core; instructions on one pipe run in order, and
across pipes order exists only through SET_FLAG / WAIT_FLAG pairs (inserted by the sync pass).
Operands are resolved: on-chip tiles are byte ranges of a space, GM operands are windows.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import NamedTuple

from ..dtypes import DType
from ..errors import SourceLoc, VerificationError
from ..target.isa import ATTRS, INSTRUCTIONS, SYNC_OPS, pipe_of  # noqa: F401 - SYNC_OPS, pipe_of: re-exported
from .core import Attrs, TextForm, cached, fmt_shape, pair_problem, quick_init
from .gm import GMBuffer, GMRef
from .tile import tile_bytes

AIC_PIPES = ("MTE2", "MTE1", "M", "FIX", "S")
AIV_PIPES = ("MTE2", "V", "MTE3", "S")
# Cross-core flags of a 1 AIC : 2 AIV pair: a pipe of the cube task sets a flag of its AIV `slot`
# (CROSS_SET_FLAG FIX -> AIV1, EVENT_ID0), a pipe of the paired vector task waits for it
# (CROSS_WAIT_FLAG AIC -> MTE2, EVENT_ID0).  They count: every set is consumed by one wait.
CROSS_OPS = tuple(r.name for r in INSTRUCTIONS.values() if r.kind == "cross")
EVENTS_PER_PIPE_PAIR = 8
# SYNC_OPS (the flags and barriers) and pipe_of (the pipe an instruction runs on) are the
# instruction table's (pypto.target.isa), importable from here for the exec level's readers.


@quick_init
@dataclass(frozen=True)
class TileRef:
    space: str
    addr: int
    dtype: DType
    shape: tuple[int, ...]
    valid: tuple[int, ...]

    @cached
    def nbytes(self) -> int:
        return tile_bytes(self.shape, self.dtype)

    @cached
    def _accesses(self) -> tuple["Access", "Access"]:
        """(its read, its write) as `accesses` gives them (worked out once per tile operand)."""
        hi = self.addr + self.nbytes
        return Access(self.space, self.addr, hi, False), Access(self.space, self.addr, hi, True)

    def text(self) -> str:
        v = "" if self.valid == self.shape else f"{{{','.join(map(str, self.valid))}}}"
        return f"{self.space}[{self.addr:#x}]:{self.dtype}{fmt_shape(self.shape)}{v}"


@quick_init
@dataclass(frozen=True, slots=True)     # slots: a program holds one per instruction
class Instr:
    op: str
    pipe: str
    dst: TileRef | GMRef | None = None
    srcs: tuple = ()
    attrs: Attrs = field(default_factory=Attrs)
    loc: SourceLoc | None = None

    def text(self) -> str:
        a = self.attrs
        if self.op in ("SET_FLAG", "WAIT_FLAG"):
            body = f"{a['src']} -> {a['dst']}, EVENT_ID{a['event']}"
        elif self.op == "CROSS_SET_FLAG":
            body = f"{a['src']} -> AIV{a['slot']}, EVENT_ID{a['event']}"
        elif self.op == "CROSS_WAIT_FLAG":
            body = f"AIC -> {a['dst']}, EVENT_ID{a['event']}"
        elif self.op == "PIPE_BARRIER":
            body = a.get("pipes", "ALL")
        else:
            ops = [_operand(self.dst)] if self.dst is not None else []
            ops += [_operand(s) for s in self.srcs]
            extra = [f"{k}={_val(a[k])}" for k in ATTRS if k in a]
            body = ", ".join(ops + extra)
        loc = f"  ; {self.loc.short()}" if self.loc else ""
        return f"{self.op:<18} {body}{loc}"


class Access(NamedTuple):
    """A byte range an instruction reads or writes: `key` is an on-chip space ("UB", "L1", ...)
    or "GM:<buffer>"; [lo, hi) are bytes of the space, or elements of the GM buffer."""
    key: str
    lo: int
    hi: int
    write: bool


def accesses(ins: Instr, written_gm=None) -> list[Access]:
    """The one definition of what an instruction touches, read by the sync inserter, the list
    scheduler, the buffer-pressure analysis and the race checker alike, so that the flags the
    compiler inserts and the hazards the checker looks for agree by construction.

    A tile covers its whole allocated extent [addr, addr + nbytes) (row padding included); a GM
    window the span of its elements.  With `written_gm` (the names of the GM buffers the task
    writes), reads of other GM buffers are left out: read-only GM cannot order anything.
    """
    out = []
    o = ins.dst
    if isinstance(o, TileRef):
        out.append(o._accesses[1])
    elif isinstance(o, GMRef):
        out.append(_gm_accesses(o)[1])
    for o in ins.srcs:
        if isinstance(o, TileRef):
            out.append(o._accesses[0])
        elif isinstance(o, GMRef) and (written_gm is None or o.buf.name in written_gm):
            out.append(_gm_accesses(o)[0])
    return out


def _gm_accesses(o: GMRef) -> tuple[Access, Access]:
    """(read, write) of a GM window as `accesses` gives them, kept on the window (it is immutable)."""
    got = o.__dict__.get("_accesses")
    if got is None:
        lo, hi = o.span()
        key = "GM:" + o.buf.name
        got = o.__dict__["_accesses"] = (Access(key, lo, hi, False), Access(key, lo, hi, True))
    return got


class Intervals:
    """Ranges [lo, hi) of one space, each with a value, found by overlap in O(log n + hits): the
    ranges sorted by start, and the longest one bounds how far back an overlapping range can
    start.  The per-space range tables of the sync inserter and the race checker."""

    def __init__(self):
        self.keys: list[tuple[int, int]] = []
        self.values: dict[tuple[int, int], object] = {}
        self.longest = 0
        # the answers of `overlapping` since the ranges last changed: a task's tiles reuse a few
        # slots, so once every slot has been seen a lookup is one dict probe
        self._memo: dict[tuple[int, int], tuple] = {}

    def overlapping(self, lo: int, hi: int) -> tuple[tuple[int, int], ...]:
        """The ranges overlapping [lo, hi), in order of start."""
        q = (lo, hi)
        got = self._memo.get(q)
        if got is None:
            keys = self.keys
            i0 = bisect.bisect_left(keys, (lo - self.longest + 1,))
            i1 = bisect.bisect_left(keys, (hi,))
            got = self._memo[q] = tuple([k for k in keys[i0:i1] if k[1] > lo])
        return got

    def get(self, key, default=None):
        return self.values.get(key, default)

    def __contains__(self, key) -> bool:
        return key in self.values

    def set(self, key: tuple[int, int], value) -> None:
        if key not in self.values:
            bisect.insort(self.keys, key)
            self.longest = max(self.longest, key[1] - key[0])
            if self._memo:
                self._memo = {}
        self.values[key] = value

    def remove(self, key: tuple[int, int]) -> None:
        del self.keys[bisect.bisect_left(self.keys, key)]
        del self.values[key]
        if self._memo:
            self._memo = {}


def written_gm(instrs) -> set[str]:
    """The GM buffers an instruction stream writes."""
    return {i.dst.buf.name for i in instrs if isinstance(i.dst, GMRef)}


def _val(v):
    return "(" + ",".join(map(str, v)) + ")" if isinstance(v, tuple) else str(v)


def _operand(o) -> str:
    if isinstance(o, TileRef):
        return o.text()
    if isinstance(o, GMRef):
        return "GM:" + o.text()
    return repr(float(o)) if isinstance(o, float) else str(o)


@quick_init
@dataclass(frozen=True)
class ExecTask:
    id: int
    group: int
    core_type: str
    deps: tuple[int, ...]
    level: int
    instrs: tuple[Instr, ...]
    pair: tuple[int, int] | None = None     # see ir.block.Task.pair
    # the core (index among the machine's cores of core_type) the task runs on, set by the
    # assign_cores pass; None: the dispatcher picks a free one when the task is ready
    core: int | None = None

    def pipe_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in self.instrs:
            out[i.pipe] = out.get(i.pipe, 0) + 1
        return out


@dataclass(frozen=True)
class ExecGraph(TextForm):
    name: str
    buffers: tuple[GMBuffer, ...]
    tasks: tuple[ExecTask, ...]

    level = "exec"

    def __len__(self):
        return sum(len(t.instrs) for t in self.tasks)

    def replace(self, tasks) -> "ExecGraph":
        return ExecGraph(self.name, self.buffers, tuple(tasks))

    def text(self) -> str:
        lines = [f"exec_graph {self.name} {{"]
        for t in self.tasks:
            pc = ", ".join(f"{p} {c}" for p, c in sorted(t.pipe_counts().items()))
            syncs = sum(i.op in SYNC_OPS for i in t.instrs)
            core = t.core_type + ("" if t.core is None else str(t.core))
            lines.append(f"  launch task {t.id} on {core} after {list(t.deps)}: "
                         f"{len(t.instrs)} instrs ({pc}; {syncs} sync)"
                         + (f", paired with task {t.pair[0]} (AIV slot {t.pair[1]})" if t.pair else ""))
        lines.append("}")
        return "\n".join(lines)



# A graph's (or program's) side table {id(task.instrs): (task.instrs, shape id)}: streams of one
# shape id (isomorphic tasks, scheduled alike) get the same flags and the same buffer pressure,
# so insert_sync and buffer_pressure work them out once, and the simulator decodes them once.
# Only the passes that built a graph set it; `stream_shape` checks the entry is for that very
# stream.
STREAM_SHAPES = "_stream_shapes"


def stream_shape(g, instrs) -> int | None:
    """The shape id the side table of `g` gives the stream `instrs`, or None."""
    e = g.__dict__.get(STREAM_SHAPES, {}).get(id(instrs))
    return e[1] if e is not None and e[0] is instrs else None


_EVENT_OPS = frozenset(("SET_FLAG", "WAIT_FLAG", *CROSS_OPS))


def verify(g: ExecGraph) -> None:
    core_of: dict[int, str] = {}
    for t in g.tasks:
        pipes = AIC_PIPES if t.core_type == "AIC" else AIV_PIPES
        if any(d not in core_of for d in t.deps):
            raise VerificationError(f"exec graph task {t.id}: depends on a later or unknown task",
                                    got=list(t.deps))
        problem = pair_problem(t.core_type, t.pair, core_of)
        if problem:
            raise VerificationError(f"exec graph task {t.id}: {problem}", got=t.pair)
        for k, ins in enumerate(t.instrs):
            if ins.pipe not in pipes:
                raise VerificationError(f"exec graph task {t.id}, instruction {k} ({ins.op}): "
                                        f"pipe {ins.pipe} does not exist on {t.core_type}",
                                        loc=ins.loc, expected=" ".join(pipes), got=ins.pipe)
            if ins.op in _EVENT_OPS and not 0 <= ins.attrs["event"] < EVENTS_PER_PIPE_PAIR:
                raise VerificationError(f"exec graph task {t.id}, instruction {k}: event id out of range",
                                        expected=f"0..{EVENTS_PER_PIPE_PAIR - 1}", got=ins.attrs["event"])
        core_of[t.id] = t.core_type
