"""The tile timeline: a swimlane per (core, pipe), one bar per executed instruction.

Built on `matplotlib.figure.Figure` directly (no pyplot state machine), so it works headless,
in tests and in threads, and never leaves global figures behind.
"""
from __future__ import annotations

import functools

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
    from .static import fig_png
    return fig_png(fig, dpi)


# Fixed margins in inches: a layout engine (constrained/tight) costs a second full draw.
LEFT_IN, RIGHT_IN, TOP_IN, BOTTOM_IN = 0.95, 1.55, 0.32, 0.42
ROW_IN = 0.24


def timeline_height(n_rows: int) -> float:
    """Figure height in inches for this many rows (shared with the A/B comparison)."""
    return TOP_IN + BOTTOM_IN + 0.45 + ROW_IN * max(n_rows, 1)


def fit_margins(fig, top_in: float = TOP_IN, bottom_in: float = BOTTOM_IN, hspace_in: float = 0.0) -> None:
    """Place the axes of `fig` with fixed margins (room for row labels left, legend right)."""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=LEFT_IN / w, right=1 - RIGHT_IN / w, top=1 - top_in / h,
                        bottom=bottom_in / h, hspace=hspace_in / h * max(len(fig.axes), 1))


def occupancy(trace, n_cores: dict[str, int]):
    """Per (core type, pipe): step times and the fraction of that type's cores busy on the pipe."""
    import numpy as np
    steps: dict[tuple[str, str], list] = {}
    for e in trace:
        key = (e.core[:3], e.pipe)
        steps.setdefault(key, []).extend(((e.start, 1), (max(e.end, e.start + 1), -1)))
    out = {}
    for key, st in steps.items():
        st.sort()
        t = np.array([x for x, _ in st], dtype=float)
        busy = np.cumsum([d for _, d in st]) / max(n_cores[key[0]], 1)
        out[key] = (t, busy)
    return out


def _figure_and_axes(ax, n_rows: int):
    """The given axes and their figure, or a new timeline figure sized for `n_rows` rows."""
    if ax is not None:
        return ax.figure, ax
    fig = _figure_class()(figsize=(11, timeline_height(n_rows)))
    ax = fig.add_subplot()
    fit_margins(fig)
    return fig, ax


def plot_occupancy(res, ax=None, title=None):
    """All cores at once: per core type and pipe, the share of cores busy over time (0-100%)."""
    from matplotlib.patches import Patch
    n_cores = {"AIC": res.machine.n_aic, "AIV": res.machine.n_aiv}
    occ = occupancy(res.trace, n_cores)
    order = {p: k for k, p in enumerate(("MTE2", "MTE1", "M", "FIX", "V", "MTE3", "S"))}
    rows = sorted(occ, key=lambda k: (k[0] != "AIC", order.get(k[1], 99)))
    fig, ax = _figure_and_axes(ax, len(rows))
    used = set()
    for k, key in enumerate(rows):
        t, busy = occ[key]
        cls = instr_class("TLOAD" if key[1] == "MTE2" else "TSTORE" if key[1] in ("MTE3", "FIX")
                          else "TEXTRACT" if key[1] == "MTE1" else "TMATMUL" if key[1] == "M" else "TADD", key[1])
        used.add(cls)
        ax.fill_between(t, k + 0.4, k + 0.4 - 0.8 * busy, step="post", color=CLASSES[cls][1], linewidth=0)
    ax.set_yticks(range(len(rows)), [f"{ct} {p}" for ct, p in rows], fontsize=8)
    ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)
    end = res.cycles if res.cycles else max((e.end for e in res.trace), default=1)
    ax.set_xlim(0, max(end, 1))
    ax.set_xlabel("cycles (bar height: share of the cores of that type busy on the pipe)")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    ax.legend(handles=[Patch(color=CLASSES[c][1], label=CLASSES[c][0]) for c in sorted(used)],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    types = sorted({ct for ct, _ in rows})
    cores = " + ".join(f"{n_cores[ct]} {ct}" for ct in types)
    ax.set_title(title or f"{res.kernel} on {res.machine.name}: {res.cycles} cycles, all {cores} cores", fontsize=10)
    return fig


def plot_timeline(res, cores=None, max_cores: int = 8, ax=None, title=None, aggregate: bool = False):
    """A matplotlib Figure of `res.trace`: rows (core, pipe), x in cycles, bars by instruction class.

    `aggregate=True` draws one row per core type and pipe with the share of cores busy, which
    stays readable for 48-core runs (otherwise the first `max_cores` cores are drawn)."""
    if aggregate:
        return plot_occupancy(res, ax=ax, title=title)
    import numpy as np
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    trace = res.trace
    shown, hidden = _pick_cores(trace, cores, max_cores)
    rows = timeline_rows(trace, shown)
    fig, ax = _figure_and_axes(ax, len(rows))
    row_of = {r: k for k, r in enumerate(rows)}
    # One PolyCollection per instruction class: a handful of artists instead of one per bar.
    bars: dict[int, list[tuple[int, int, int]]] = {}
    for e in trace:
        k = row_of.get((e.core, e.pipe))
        if k is not None:
            bars.setdefault(instr_class(e.op, e.pipe), []).append((k, e.start, max(e.end - e.start, 1)))
    for cls, spans in sorted(bars.items()):
        a = np.asarray(spans, dtype=float)
        y0, y1, x0, x1 = a[:, 0] - 0.4, a[:, 0] + 0.4, a[:, 1], a[:, 1] + a[:, 2]
        verts = np.stack([np.stack([x0, y0], 1), np.stack([x0, y1], 1),
                          np.stack([x1, y1], 1), np.stack([x1, y0], 1)], 1)
        ax.add_collection(PolyCollection(verts, facecolors=CLASSES[cls][1], edgecolors="white",
                                         linewidths=0.3))      # thin gaps show single instructions
    ax.set_yticks(range(len(rows)), [f"{c} {p}" for c, p in rows], fontsize=8)
    ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)   # first core on top
    if not rows:
        ax.text(0.5, 0.5, "no trace events (simulated with trace=False?)", transform=ax.transAxes,
                ha="center", va="center", color="#777777")
    end = res.cycles if res.cycles else max((e.end for e in trace), default=1)
    ax.set_xlim(0, max(end, 1))
    ax.set_xlabel("cycles")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    ax.legend(handles=[Patch(color=CLASSES[c][1], label=CLASSES[c][0]) for c in sorted(bars)],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    if title is None:
        title = (f"{res.kernel} on {res.machine.name}" + (f", {res.size}" if getattr(res, "size", None) else "")
                 + f": {res.cycles} cycles ({res.time_us} us)")
    if hidden:
        title += f"  ({hidden} more cores not shown)"
    ax.set_title(title, fontsize=10)
    return fig


def timeline_png(res, dpi: int = 90, **kw) -> bytes:
    """The timeline as PNG bytes (for ipywidgets.Image, HTML reports)."""
    return _png(plot_timeline(res, **kw), dpi)


# --- SVG timeline (the explorer's live tab) ---------------------------------------------------
# Drawn by hand: a few milliseconds for thousands of bars (matplotlib needs ~100 ms for its text
# alone), crisp at any zoom, and every bar has a hover tooltip naming its instruction.
SVG_LEFT, SVG_RIGHT, SVG_TOP, SVG_BOTTOM, SVG_ROW = 92, 150, 26, 34, 16


def nice_step(span: float, target: int = 8) -> int:
    """A round tick step (1, 2 or 5 x 10^k) giving about `target` ticks over `span`."""
    import math
    raw = max(span / max(target, 1), 1.0)
    k = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * k >= raw:
            return int(m * k)
    return int(10 * k)


def timeline_svg(res, cores=None, max_cores: int = 8, width: int = 1000, title=None,
                 tooltips: bool = True) -> str:
    """The timeline of `res.trace` as an SVG string: the rows, colours and title of
    `plot_timeline`; each bar's tooltip gives op, core, pipe, cycles, task and source line."""
    from html import escape
    trace = res.trace
    shown, hidden = _pick_cores(trace, cores, max_cores)
    rows = timeline_rows(trace, shown)
    row_of = {r: k for k, r in enumerate(rows)}
    end = res.cycles if res.cycles else max((e.end for e in trace), default=1)
    end = max(end, 1)
    plot_w = max(width - SVG_LEFT - SVG_RIGHT, 100)
    height = SVG_TOP + SVG_BOTTOM + SVG_ROW * max(len(rows), 1)
    sx = plot_w / end
    if title is None:
        title = (f"{res.kernel} on {res.machine.name}" + (f", {res.size}" if getattr(res, "size", None) else "")
                 + f": {res.cycles} cycles ({res.time_us} us)")
    if hidden:
        title += f"  ({hidden} more cores not shown)"
    out = [f'<svg class="pypto-timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" font-family="Helvetica,Arial,sans-serif" '
           f'font-size="10">',
           f'<text x="{SVG_LEFT + plot_w / 2:.0f}" y="15" text-anchor="middle" font-size="12">'
           f'{escape(title)}</text>']
    # grid and x axis
    y_axis = SVG_TOP + SVG_ROW * max(len(rows), 1)
    step = nice_step(end)
    ticks = []
    for c in range(0, end + 1, step):
        x = SVG_LEFT + c * sx
        ticks.append(f'<line x1="{x:.1f}" y1="{SVG_TOP}" x2="{x:.1f}" y2="{y_axis}" stroke="#dddddd" '
                     f'stroke-dasharray="2,2"/><text x="{x:.1f}" y="{y_axis + 13}" text-anchor="middle">'
                     f'{c}</text>')
    out += ticks
    out.append(f'<text x="{SVG_LEFT + plot_w / 2:.0f}" y="{y_axis + 28}" text-anchor="middle">cycles</text>')
    # rows
    for k, (c, p) in enumerate(rows):
        y = SVG_TOP + k * SVG_ROW
        if k % 2:
            out.append(f'<rect x="{SVG_LEFT}" y="{y}" width="{plot_w}" height="{SVG_ROW}" fill="#f7f7f7"/>')
        out.append(f'<text x="{SVG_LEFT - 6}" y="{y + SVG_ROW - 4}" text-anchor="end">{c} {p}</text>')
    # bars, grouped by class (one fill per group)
    bars: dict[int, list[str]] = {}
    for e in trace:
        k = row_of.get((e.core, e.pipe))
        if k is None:
            continue
        x = SVG_LEFT + e.start * sx
        w = max((e.end - e.start) * sx, 0.6)
        y = SVG_TOP + k * SVG_ROW + 2
        if tooltips:
            tip = (f"{e.op} on {e.core} {e.pipe}: cycles {e.start}-{e.end} ({e.end - e.start}), "
                   f"task {e.task}" + (f", data ready at {e.ready}" if e.ready >= 0 else "")
                   + (f", line {e.line}" if getattr(e, "line", "") else ""))
            bar = (f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{SVG_ROW - 4}">'
                   f'<title>{escape(tip)}</title></rect>')
        else:
            bar = f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{SVG_ROW - 4}"/>'
        bars.setdefault(instr_class(e.op, e.pipe), []).append(bar)
    for cls in sorted(bars):
        out.append(f'<g fill="{CLASSES[cls][1]}" stroke="white" stroke-width="0.3">{"".join(bars[cls])}</g>')
    out.append(f'<rect x="{SVG_LEFT}" y="{SVG_TOP}" width="{plot_w}" height="{y_axis - SVG_TOP}" fill="none" '
               f'stroke="#333333" stroke-width="0.8"/>')
    if not rows:
        out.append(f'<text x="{SVG_LEFT + plot_w / 2:.0f}" y="{SVG_TOP + 12}" text-anchor="middle" '
                   f'fill="#777777">no trace events (simulated with trace=False?)</text>')
    # legend
    lx = SVG_LEFT + plot_w + 12
    for n, cls in enumerate(sorted(bars)):
        y = SVG_TOP + n * 15
        out.append(f'<rect x="{lx}" y="{y}" width="12" height="10" fill="{CLASSES[cls][1]}"/>'
                   f'<text x="{lx + 16}" y="{y + 9}">{escape(CLASSES[cls][0])}</text>')
    out.append("</svg>")
    return "".join(out)


# --- the interactive timeline's data (drawn by timeline_widget.py's JavaScript) ----------------
MAX_WIDGET_EVENTS = 150_000     # beyond this many bars, the last cores are left out (and said so)
MAX_ARROWS = 4000               # dependency arrows kept (the first tasks')


def timeline_data(runs, labels=None, max_events: int = MAX_WIDGET_EVENTS) -> dict:
    """What the interactive timeline draws, as plain JSON-able data: for each run (a SimResult
    with a trace) its rows (every core and pipe with events, cores in order), its bars as
    columns (row, start, end, class, op, task, index, line, ready; op and line index the run's
    `ops` and `lines` tables), the tasks of its critical path and its dependency arrows (from the
    end of a task's last bar to the start of its dependent's first); `labels` name the runs
    ("A", "B": two runs on one time axis)."""
    runs = list(runs)
    labels = list(labels) if labels is not None else [""] * len(runs)
    out = []
    for res, label in zip(runs, labels):
        trace = res.trace
        present = sorted({e.core for e in trace}, key=_core_key)
        cores, hidden = present, 0
        if len(trace) > max_events:          # keep the first cores whose bars fit
            count: dict[str, int] = {}
            for e in trace:
                count[e.core] = count.get(e.core, 0) + 1
            kept, total = [], 0
            for c in present:
                if total + count[c] > max_events and kept:
                    break
                kept.append(c)
                total += count[c]
            cores, hidden = kept, len(present) - len(kept)
        rows = timeline_rows(trace, cores)
        row_of = {r: k for k, r in enumerate(rows)}
        cols = {k: [] for k in ("row", "start", "end", "cls", "op", "task", "index", "line", "ready")}
        ops: dict[str, int] = {}
        lines: dict[str, int] = {}
        first: dict[int, tuple[int, int]] = {}   # task -> (row, start) of its first bar
        last: dict[int, tuple[int, int]] = {}    # task -> (row, end) of its last bar
        for e in trace:
            r = row_of.get((e.core, e.pipe))
            if r is None:
                continue
            cols["row"].append(r)
            cols["start"].append(int(e.start))
            cols["end"].append(int(max(e.end, e.start + 1)))
            cols["cls"].append(instr_class(e.op, e.pipe))
            cols["op"].append(ops.setdefault(e.op, len(ops)))
            cols["task"].append(int(e.task))
            cols["index"].append(int(e.index))
            cols["line"].append(lines.setdefault(e.line or "", len(lines)))
            cols["ready"].append(int(e.ready))
            f = first.get(e.task)
            if f is None or e.start < f[1]:
                first[e.task] = (r, int(e.start))
            la = last.get(e.task)
            if la is None or e.end > la[1]:
                last[e.task] = (r, int(e.end))
        arrows = []
        program = getattr(res, "program", None)
        for t in getattr(program, "tasks", ()) or ():
            if t.id not in first:
                continue
            for d in t.deps:
                if d in last and len(arrows) < MAX_ARROWS:
                    arrows.append([last[d][0], last[d][1], first[t.id][0], first[t.id][1]])
        end = res.cycles if res.cycles else max(cols["end"], default=1)
        title = (f"{res.kernel} on {res.machine.name}" + (f", {res.size}" if getattr(res, "size", None) else "")
                 + f": {res.cycles} cycles ({res.time_us} us)")
        out.append({
            "label": label, "title": title, "cycles": int(max(end, 1)),
            "rows": [[c, p] for c, p in rows], "hidden_cores": hidden,
            "events": cols, "ops": list(ops), "lines": list(lines),
            "critical": [c["task"] for c in res.stats.get("critical_path", [])],
            "arrows": arrows,
        })
    return {"runs": out, "classes": [list(c) for c in CLASSES],
            "end": max((r["cycles"] for r in out), default=1)}
