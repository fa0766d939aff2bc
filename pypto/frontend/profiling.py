"""`pypto.profile()`: the kernel runs inside a `with` block, as a table.

Every call of a kernel (`kernel(*arrays)`) and every `ck.simulate(...)` made inside an open
block is recorded by every open block (an outer block also sees its inner blocks' runs); runs
made by other runs (the simulation inside a call, the timing a profile asks for) are not.

A kernel call runs functionally and has no cycles of its own.  With `timing=True` (the default)
the block times it in timing mode, once per compiled kernel (and per size of a dynamic dim): the
cycles depend on the program, not on the data, so repeated calls cost nothing more; the default
kernel call outside a block stays as fast as it was.  With `timing=False` such runs have
`cycles=None`.  A `simulate` in timing or full mode brings its own cycles.

This module holds the data (`Profiler.records`, `.rows`, `.text()`); `pypto.viz.profile`
draws it (`Profile._repr_html_`), and `pypto.profile()` returns that drawable kind.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

_ACTIVE: list["Profiler"] = []      # the open blocks, outermost first
_INNER = [0]                        # > 0 while a recorded run runs (its own runs are not recorded)


def collecting() -> bool:
    """Whether a run starting now is recorded (a block is open and no recorded run is running)."""
    return bool(_ACTIVE) and not _INNER[0]


_UNWATCHED = contextlib.nullcontext()    # (what every kernel call outside a block enters: no cost)


def inner_runs(active: bool = True):
    """While a recorded run runs: the runs it makes are part of it, not recorded apart."""
    return _inner_runs() if active else _UNWATCHED


@contextlib.contextmanager
def _inner_runs():
    _INNER[0] += 1
    try:
        yield
    finally:
        _INNER[0] -= 1


@dataclass(frozen=True)
class Run:
    """One recorded run: a kernel call ("call") or a simulation ("simulate")."""
    kernel: str
    machine: str
    config: str                 # the constants, "TM=32, TN=256"
    shapes: str                 # the tensor parameters, "x fp32[256,1024], out fp32[256,1024]"
    kind: str
    mode: str                   # functional, timing or full
    cycles: int | None
    time_us: float | None
    bound: str | None
    host_s: float               # wall-clock seconds the run took on this computer
    key: int                    # which compiled kernel (rows group runs by it)


def watch(ck, kind: str, run, args=(), size=None):
    """`run()` (a run of compiled kernel `ck`) timed and recorded, the runs it makes not."""
    start = time.perf_counter()
    with inner_runs():
        res = run()
    record(getattr(res, "compiled", None) or ck, kind, time.perf_counter() - start, args=args, res=res, size=size)
    return res


def record(ck, kind: str, seconds: float, args=(), res=None, size=None) -> None:
    """Record a run of compiled kernel `ck` in every open block."""
    if not _ACTIVE:
        return
    cycles = bound = None
    mode = "functional"
    if res is not None:
        mode = "functional" if res.cycles is None else ("timing" if not res.outputs else "full")
        if res.cycles is not None:
            cycles, bound = res.cycles, res.stats.get("bound")
    if cycles is None and any(p.timing for p in _ACTIVE):
        cycles, bound = _timed(ck, args, size)
    for p in _ACTIVE:
        timed = cycles if (p.timing or mode != "functional") else None
        p.records.append(Run(
            ck.name, ck.machine.name, ", ".join(f"{k}={v}" for k, v in ck.consts.items()),
            ", ".join(f"{q.name} {q.dtype}[{','.join(map(str, q.shape))}]" for q in ck.params), kind, mode,
            timed, None if timed is None else round(ck.machine.cycles_to_us(timed), 3),
            bound if timed is not None else None, seconds, id(ck)))


def _timed(ck, args, size) -> tuple[int | None, str | None]:
    """(cycles, bound) of one run of `ck` in timing mode, kept on `ck` per size of its dynamic dim."""
    if ck.dynamic is not None and size is None:
        try:
            size = ck._size(ck.bind(args))
        except Exception:  # noqa: BLE001 - no size known: not timed
            return None, None
    key = ("profile-timing", size)
    hit = ck._instances.get(key)
    if hit is None:
        with inner_runs():
            res = ck.simulate(mode="timing", trace=False, size=size)
        hit = ck._remember(key, (res.cycles, res.stats.get("bound")))
    return hit


class Profiler:
    """A `with` block collecting kernel runs (`pypto.profile()` returns the drawable subclass)."""

    def __init__(self, timing: bool = True):
        self.timing = timing
        self.records: list[Run] = []

    def __enter__(self):
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        _ACTIVE.remove(self)

    @property
    def rows(self) -> list[dict]:
        """One row per compiled kernel, the longest total time first: kernel, machine, config,
        shapes, calls (runs), cycles (per run; the mean when runs differ, a dynamic kernel on
        several sizes; None when no run was timed), time_us (per timed run), total_us (of the timed
        runs), bound, host_s (wall-clock seconds, compiles included)."""
        groups: dict[int, list[Run]] = {}
        for r in self.records:
            groups.setdefault(r.key, []).append(r)
        rows = []
        for runs in groups.values():
            first = runs[0]
            timed = [r for r in runs if r.cycles is not None]
            cycles = round(sum(r.cycles for r in timed) / len(timed)) if timed else None
            total = round(sum(r.time_us for r in timed), 3) if timed else None
            rows.append({"kernel": first.kernel, "machine": first.machine, "config": first.config,
                         "shapes": first.shapes, "calls": len(runs), "cycles": cycles,
                         "time_us": None if total is None else round(total / len(timed), 3), "total_us": total,
                         "bound": next((r.bound for r in timed if r.bound), None),
                         "host_s": sum(r.host_s for r in runs)})
        return sorted(rows, key=lambda r: (r["total_us"] is None, -(r["total_us"] or 0)))

    @property
    def total_us(self) -> float:
        """The simulated time of every timed run."""
        return rows_total_us(self.rows)

    COLUMNS = (("kernel", "kernel"), ("machine", "machine"), ("calls", "calls"), ("cycles", "cycles/call"),
               ("total_us", "total time"), ("bound", "bound"), ("host_s", "host time"))
    NUMERIC = frozenset((2, 3, 4, 6))       # the columns aligned right

    def cells(self, row: dict) -> list[str]:
        """A row's cells as text, in the order of COLUMNS."""
        name = row["kernel"] + (f"({row['config']})" if row["config"] else "")
        return [name, row["machine"], str(row["calls"]),
                "-" if row["cycles"] is None else f"{row['cycles']:,}",
                "-" if row["total_us"] is None else f"{row['total_us']:,.2f} us",
                row["bound"] or "-", f"{row['host_s']:.3f} s"]

    NOTE = "-: functional runs only; pypto.profile(timing=True) times them"

    @staticmethod
    def summary(rows: list[dict]) -> str:
        """`5 runs of 2 kernels, 12.34 us simulated` (of `rows`, non-empty)."""
        runs = sum(r["calls"] for r in rows)
        return (f"{runs} run{'s' if runs != 1 else ''} of {len(rows)} kernel{'s' if len(rows) != 1 else ''}, "
                f"{rows_total_us(rows):,.2f} us simulated")

    def text(self) -> str:
        rows = self.rows
        if not rows:
            return "profile: no kernel ran"
        table = [[title for _, title in self.COLUMNS]] + [self.cells(r) for r in rows]
        widths = [max(len(line[k]) for line in table) for k in range(len(table[0]))]
        lines = ["  ".join(c.rjust(w) if k in self.NUMERIC else c.ljust(w) for k, (c, w) in enumerate(zip(line, widths)))
                 .rstrip() for line in table]
        lines.append(self.summary(rows))
        if any(r["cycles"] is None for r in rows):
            lines.append(f"({self.NOTE})")
        return "\n".join(lines)

    def __str__(self):
        return self.text()

    def __repr__(self):
        return f"<pypto profile: {len(self.records)} runs of {len(self.rows)} kernels>"

    def _repr_pretty_(self, p, cycle):
        p.text(self.text())


def rows_total_us(rows: list[dict]) -> float:
    """The simulated time of `rows` (`Profiler.rows`): the sum of their timed runs."""
    return round(sum(r["total_us"] or 0 for r in rows), 3)
