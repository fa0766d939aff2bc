"""The tile timeline: a swimlane per (core, pipe), one bar per executed instruction.

Built on `matplotlib.figure.Figure` directly (no pyplot state machine), so it works headless,
in tests and in threads, and never leaves global figures behind.
"""
from __future__ import annotations

import functools
import io

from ..ir.exec import AIC_PIPES, AIV_PIPES, SYNC_OPS

# Instruction classes, in legend order: (name, color).
CLASSES = (
    ("DMA load (MTE2)", "#4c78a8"),
    ("L1->L0 (MTE1)", "#72b7b2"),
    ("cube (M)", "#e45756"),
    ("vector (V)", "#54a24b"),
    ("store (MTE3/FIX)", "#f58518"),
    ("scalar (S)", "#b279a2"),
    ("sync", "#bab0ac"),
)
_PIPE_CLASS = {"MTE2": 0, "MTE1": 1, "M": 2, "V": 3, "MTE3": 4, "FIX": 4, "S": 5}


def instr_class(op: str, pipe: str) -> int:
    """Index into CLASSES of one trace event."""
    if op in SYNC_OPS:
        return len(CLASSES) - 1
    return _PIPE_CLASS.get(pipe, 5)


def _core_key(core: str):
    return (core[:3] != "AIC", int(core[3:]) if core[3:].isdigit() else 0, core)


def _pick_cores(trace, cores, max_cores):
    """(cores to show in display order, number of cores left out)."""
    present = sorted({e.core for e in trace}, key=_core_key)
    if cores is not None:
        wanted = set(cores)
        shown = [c for c in present if c in wanted]
        return shown, len(present) - len(shown)
    if len(present) <= max_cores:
        return present, 0
    # Keep both core types of a mixed kernel in view: each type gets a share of the rows in
    # proportion to its cores in use, and within a type the first cores in order (tasks go to the
    # free core with the lowest id, so these are also the busiest ones).
    by_type: dict[str, list[str]] = {}
    for c in present:
        by_type.setdefault(c[:3], []).append(c)
    share = {t: max(1, round(max_cores * len(cs) / len(present))) for t, cs in by_type.items()}
    while sum(share.values()) > max_cores:
        t = max(share, key=lambda k: share[k])
        share[t] -= 1
    while sum(share.values()) < max_cores:
        t = max(share, key=lambda k: len(by_type[k]) - share[k])
        share[t] += 1
    picked = []
    for t, cs in by_type.items():
        picked += cs[:share[t]]
    return sorted(picked, key=_core_key), len(present) - len(picked)


def timeline_rows(trace, cores):
    """The (core, pipe) rows that have events, top to bottom."""
    have = {(e.core, e.pipe) for e in trace}
    rows = []
    for c in cores:
        for p in (AIC_PIPES if c.startswith("AIC") else AIV_PIPES):
            if (c, p) in have:
                rows.append((c, p))
    return rows


@functools.cache
def _figure_class():
    from matplotlib.figure import Figure   # lazily: importing pypto must not import matplotlib

    class TimelineFigure(Figure):
        """A Figure that shows itself in a notebook even when no pyplot backend is active."""

        def _repr_png_(self):
            return _png(self)

    return TimelineFigure


def _png(fig, dpi: int = 90) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def plot_timeline(res, cores=None, max_cores: int = 8, ax=None, title=None):
    """A matplotlib Figure of `res.trace`: rows (core, pipe), x in cycles, bars by instruction class."""
    from matplotlib.patches import Patch

    trace = res.trace
    shown, hidden = _pick_cores(trace, cores, max_cores)
    rows = timeline_rows(trace, shown)
    if ax is None:
        fig = _figure_class()(figsize=(11, 1.4 + 0.24 * max(len(rows), 1)), layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    row_of = {r: k for k, r in enumerate(rows)}
    # One broken_barh per (row, class): a few collections instead of one artist per instruction.
    bars: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for e in trace:
        k = row_of.get((e.core, e.pipe))
        if k is not None:
            bars.setdefault((k, instr_class(e.op, e.pipe)), []).append((e.start, max(e.end - e.start, 1)))
    for (k, cls), spans in bars.items():
        ax.broken_barh(spans, (k - 0.4, 0.8), facecolors=CLASSES[cls][1],
                       edgecolor="white", linewidth=0.3)   # thin gaps show single instructions
    ax.set_yticks(range(len(rows)), [f"{c} {p}" for c, p in rows], fontsize=8)
    ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)   # first core on top
    if not rows:
        ax.text(0.5, 0.5, "no trace events (simulated with trace=False?)", transform=ax.transAxes,
                ha="center", va="center", color="#777777")
    end = res.cycles if res.cycles else max((e.end for e in trace), default=1)
    ax.set_xlim(0, max(end, 1))
    ax.set_xlabel("cycles")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    used = sorted({cls for _, cls in bars})
    ax.legend(handles=[Patch(color=CLASSES[c][1], label=CLASSES[c][0]) for c in used],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    if title is None:
        title = f"{res.kernel} on {res.machine.name}: {res.cycles} cycles ({res.time_us} us)"
    if hidden:
        title += f"  ({hidden} more cores not shown)"
    ax.set_title(title, fontsize=10)
    return fig


def timeline_png(res, dpi: int = 90, **kw) -> bytes:
    """The timeline as PNG bytes (for ipywidgets.Image, HTML reports)."""
    return _png(plot_timeline(res, **kw), dpi)
