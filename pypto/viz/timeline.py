"""The tile timeline: a swimlane per (core, pipe), one bar per executed instruction (a long run's
rows, bars narrower than pixels, as strips shaded by how busy the pipe was: `plot_timeline`).
The figures and the interactive timeline's data read the trace as columns
(`pypto.sim.timing.trace_columns`: no event made); the SVG timeline, a tooltip per bar, its events.

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


def _columns(trace):
    """`trace` (a trace, a list of TraceEvents or its columns) as `TraceColumns`."""
    from ..sim.timing import TraceColumns, trace_columns
    return trace if isinstance(trace, TraceColumns) else trace_columns(trace)


def _present(cols) -> list[str]:
    """The cores with events, in no particular order."""
    import numpy as np
    return [cols.cores[i] for i in np.unique(cols.core).tolist()]


def _pick_cores(trace, cores, max_cores):
    """(cores to show in display order, number of cores left out)."""
    present = sorted(_present(_columns(trace)), key=_core_key)
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
    """The (core, pipe) rows that have events, top to bottom (`trace`: a trace or its columns)."""
    import numpy as np
    cols = _columns(trace)
    pairs = np.unique(cols.core.astype(np.int64) * len(cols.pipes) + cols.pipe).tolist()
    have = {(cols.cores[k // len(cols.pipes)], cols.pipes[k % len(cols.pipes)]) for k in pairs}
    rows = []
    for c in cores:
        for p in (AIC_PIPES if c.startswith("AIC") else AIV_PIPES):
            if (c, p) in have:
                rows.append((c, p))
    return rows


def _row_and_class(cols, rows):
    """Per event of `cols`: its row among `rows` (-1: not shown) and its instruction class."""
    import numpy as np
    row_of = {r: k for k, r in enumerate(rows)}
    row = np.array([[row_of.get((c, p), -1) for p in cols.pipes] for c in cols.cores] or [[-1]], np.int64)
    cls = np.array([[instr_class(o, p) for o in cols.ops] for p in cols.pipes] or [[0]], np.int64)
    if not len(cols):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return row[cols.core, cols.pipe], cls[cols.pipe, cols.op]


def _least_per_task(task, key):
    """Per task, the index of its element of least `key` (the first in trace order on a tie)."""
    import numpy as np
    k = np.lexsort((key, task))
    return k[np.r_[True, task[k][1:] != task[k][:-1]]]


def busy_in_bins(start, end, edges):
    """Cycles of the intervals [start, end) that fall in each bin between consecutive `edges`:
    the integral of the number of intervals running at t, at each edge, differenced (exact for
    any intervals, overlapping or not)."""
    import numpy as np
    s = np.sort(np.asarray(start, np.float64))
    e = np.sort(np.asarray(end, np.float64))
    cs, ce = np.concatenate([[0.0], np.cumsum(s)]), np.concatenate([[0.0], np.cumsum(e)])
    ks, ke = np.searchsorted(s, edges, "right"), np.searchsorted(e, edges, "right")
    covered = (ks * edges - cs[ks]) - (ke * edges - ce[ke])
    return np.diff(covered)


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
    cols = _columns(trace)
    out = {}
    types = sorted({c[:3] for c in cols.cores})
    of_core = np.array([types.index(c[:3]) for c in cols.cores], np.int64)
    key = of_core[cols.core] * len(cols.pipes) + cols.pipe      # (core type, pipe) of each event
    for k in np.unique(key).tolist():
        ct, pipe = types[k // len(cols.pipes)], cols.pipes[k % len(cols.pipes)]
        sel = key == k
        start = cols.start[sel]
        end = np.maximum(cols.end[sel], start + 1)
        # a step up at each start, down at each end; at one time the ends first (as tuples sort)
        t = np.concatenate([start, end])
        d = np.concatenate([np.ones(len(start), np.int64), -np.ones(len(end), np.int64)])
        order = np.lexsort((d, t))
        out[(ct, pipe)] = (t[order].astype(float), np.cumsum(d[order]) / max(n_cores[ct], 1))
    return out


# a timeline whose rows hold more bars than this on average is drawn as strips of STRIP_BINS
# shaded cells per row (its bars about a pixel wide or less, at 11 inches: each would be hidden by
# its neighbours' white outlines); an occupancy curve of more steps than STRIP_BINS * 4 as the
# mean busy share per bin
DENSE_ROW_BARS = 400
STRIP_BINS = 1500


def _figure_and_axes(ax, n_rows: int):
    """The given axes and their figure, or a new timeline figure sized for `n_rows` rows."""
    if ax is not None:
        return ax.figure, ax
    fig = _figure_class()(figsize=(11, timeline_height(n_rows)))
    ax = fig.add_subplot()
    fit_margins(fig)
    return fig, ax


def _binned(t, busy, end: float):
    """A step curve of many steps (`occupancy`) as its mean over STRIP_BINS bins of [0, end]:
    (bin edges, mean per bin, a last 0), the same area (its integral is piecewise linear between
    steps, read at the edges)."""
    import numpy as np
    area = np.concatenate([[0.0], np.cumsum(np.diff(t) * busy[:-1])])
    edges = np.linspace(0.0, max(end, t[-1]), STRIP_BINS + 1)
    mean = np.diff(np.interp(edges, t, area, left=0.0)) / np.diff(edges)
    return edges, np.append(mean, 0.0)


def plot_occupancy(res, ax=None, title=None):
    """All cores at once: per core type and pipe, the share of cores busy over time (0-100%);
    a long run's curve (more steps than pixels) as its mean per 1/STRIP_BINS of the run."""
    from matplotlib.patches import Patch
    n_cores = {"AIC": res.machine.n_aic, "AIV": res.machine.n_aiv}
    occ = occupancy(res.trace, n_cores)
    order = {p: k for k, p in enumerate(("MTE2", "MTE1", "M", "FIX", "V", "MTE3", "S"))}
    rows = sorted(occ, key=lambda k: (k[0] != "AIC", order.get(k[1], 99)))
    fig, ax = _figure_and_axes(ax, len(rows))
    end = res.cycles if res.cycles else max((float(t[-1]) for t, _ in occ.values()), default=1)
    used = set()
    binned = False
    for k, key in enumerate(rows):
        t, busy = occ[key]
        if len(t) > 4 * STRIP_BINS:
            t, busy = _binned(t, busy, end)
            binned = True
        cls = instr_class("TLOAD" if key[1] == "MTE2" else "TSTORE" if key[1] in ("MTE3", "FIX")
                          else "TEXTRACT" if key[1] == "MTE1" else "TMATMUL" if key[1] == "M" else "TADD", key[1])
        used.add(cls)
        ax.fill_between(t, k + 0.4, k + 0.4 - 0.8 * busy, step="post", color=CLASSES[cls][1], linewidth=0)
    ax.set_yticks(range(len(rows)), [f"{ct} {p}" for ct, p in rows], fontsize=8)
    ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)
    ax.set_xlim(0, max(end, 1))
    ax.set_xlabel("cycles (bar height: share of the cores of that type busy on the pipe"
                  + (f", mean per 1/{STRIP_BINS} of the run)" if binned else ")"))
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
    stays readable for 48-core runs (otherwise the first `max_cores` cores are drawn).  Rows of
    more than DENSE_ROW_BARS bars on average (a long run: bars a pixel wide or less) are drawn
    as strips of STRIP_BINS cells, each shaded by how much of its cycles the pipe spent on each
    class of instruction: a pipe busy all along is a solid bar, not a row of outlines."""
    if aggregate:
        return plot_occupancy(res, ax=ax, title=title)
    import numpy as np
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    cols = _columns(res.trace)
    shown, hidden = _pick_cores(cols, cores, max_cores)
    rows = timeline_rows(cols, shown)
    fig, ax = _figure_and_axes(ax, len(rows))
    row, cls = _row_and_class(cols, rows)
    keep = row >= 0
    row, cls = row[keep], cls[keep]
    start = cols.start[keep]
    end_ = np.maximum(cols.end[keep], start + 1)
    end = res.cycles if res.cycles else int(cols.end.max(initial=1))
    used = sorted(set(np.unique(cls).tolist()))
    dense = len(row) > DENSE_ROW_BARS * len(rows)
    if dense:
        span = max(end, 1)
        ax.imshow(_strips(row, cls, start, end_, len(rows), span), extent=(0, span, len(rows) - 0.5, -0.5),
                  aspect="auto", interpolation="antialiased")
    else:
        # One PolyCollection per instruction class: a handful of artists instead of one per bar.
        for c in used:
            sel = cls == c
            y0, y1 = row[sel] - 0.4, row[sel] + 0.4
            x0, x1 = start[sel].astype(float), end_[sel].astype(float)
            verts = np.stack([np.stack([x0, y0], 1), np.stack([x0, y1], 1),
                              np.stack([x1, y1], 1), np.stack([x1, y0], 1)], 1)
            ax.add_collection(PolyCollection(verts, facecolors=CLASSES[c][1], edgecolors="white",
                                             linewidths=0.3))      # thin gaps show single instructions
    ax.set_yticks(range(len(rows)), [f"{c} {p}" for c, p in rows], fontsize=8)
    ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)   # first core on top
    if not rows:
        ax.text(0.5, 0.5, "no trace events (simulated with trace=False?)", transform=ax.transAxes,
                ha="center", va="center", color="#777777")
    ax.set_xlim(0, max(end, 1))
    ax.set_xlabel("cycles" + (f" ({len(row):,} instructions; shade: how busy the pipe was in each 1/{STRIP_BINS} "
                              "of the run)" if dense else ""))
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    ax.legend(handles=[Patch(color=CLASSES[c][1], label=CLASSES[c][0]) for c in used],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    if title is None:
        title = (f"{res.kernel} on {res.machine.name}" + (f", {res.size}" if getattr(res, "size", None) else "")
                 + f": {res.cycles} cycles ({res.time_us} us)")
    if hidden:
        title += f"  ({hidden} more cores not shown)"
    ax.set_title(title, fontsize=10)
    return fig


STRIP_ROWS = 10     # image rows per timeline row: the strip fills 8 (a bar's 0.8 of the row)


def strip_shares(row, cls, start, end, n_rows: int, span: float) -> np.ndarray:
    """[row, class, bin]: the share of each of STRIP_BINS bins of [0, span] that each row's pipe
    spent on each class of instruction."""
    import numpy as np
    edges = np.linspace(0.0, float(span), STRIP_BINS + 1)
    width = np.diff(edges)
    out = np.zeros((n_rows, len(CLASSES), STRIP_BINS))
    key = row * len(CLASSES) + cls
    order = np.argsort(key, kind="stable")
    bounds = np.searchsorted(key[order], np.arange(n_rows * len(CLASSES) + 1))
    for k in range(n_rows * len(CLASSES)):
        lo, hi = bounds[k], bounds[k + 1]
        if hi > lo:
            at = order[lo:hi]
            out[k // len(CLASSES), k % len(CLASSES)] = busy_in_bins(start[at], end[at], edges) / width
    return out


def _strips(row, cls, start, end, n_rows: int, span: float) -> np.ndarray:
    """The RGB image of the dense timeline: per row STRIP_ROWS image rows, the middle ones each
    bin's colour, the classes' colours mixed on white by their shares (`strip_shares`)."""
    import numpy as np
    from matplotlib.colors import to_rgb
    share = np.clip(strip_shares(row, cls, start, end, n_rows, span), 0.0, 1.0)
    total = share.sum(axis=1, keepdims=True)
    share = share / np.maximum(total, 1.0)          # (a pipe runs one instruction at a time)
    ink = 1.0 - np.array([to_rgb(c) for _, c in CLASSES])           # [class, rgb]
    rgb = 1.0 - np.einsum("rcb,ck->rbk", share, ink)                 # [row, bin, rgb]
    img = np.ones((n_rows * STRIP_ROWS, STRIP_BINS, 3))
    for r in range(n_rows):
        img[r * STRIP_ROWS + 1:(r + 1) * STRIP_ROWS - 1] = rgb[r]
    return img


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
    import numpy as np
    runs = list(runs)
    labels = list(labels) if labels is not None else [""] * len(runs)
    out = []
    for res, label in zip(runs, labels):
        cols = _columns(res.trace)
        present = sorted(_present(cols), key=_core_key)
        cores, hidden = present, 0
        if len(cols) > max_events:           # keep the first cores whose bars fit
            count = dict(zip(cols.cores, np.bincount(cols.core, minlength=len(cols.cores)).tolist()))
            kept, total = [], 0
            for c in present:
                if total + count[c] > max_events and kept:
                    break
                kept.append(c)
                total += count[c]
            cores, hidden = kept, len(present) - len(kept)
        rows = timeline_rows(cols, cores)
        row, cls = _row_and_class(cols, rows)
        at = np.flatnonzero(row >= 0)       # the shown bars, in trace order
        row, cls = row[at], cls[at]
        start, end, task = cols.start[at], cols.end[at], cols.task[at]
        # a task's first bar: its earliest start (the first such in trace order); its last: its
        # latest end
        first: dict[int, tuple[int, int]] = {}
        last: dict[int, tuple[int, int]] = {}
        if len(at):
            head = _least_per_task(task, start)
            first = dict(zip(task[head].tolist(), zip(row[head].tolist(), start[head].tolist())))
            head = _least_per_task(task, -end)
            last = dict(zip(task[head].tolist(), zip(row[head].tolist(), end[head].tolist())))
        cols_out = {"row": row.tolist(), "start": start.tolist(), "end": np.maximum(end, start + 1).tolist(),
                    "cls": cls.tolist(), "op": None, "task": task.tolist(), "index": cols.index[at].tolist(),
                    "line": None, "ready": cols.ready[at].tolist()}
        tables = {}
        for name, col, names in (("op", cols.op[at], cols.ops), ("line", cols.line[at], cols.lines)):
            # numbered as first met among the shown bars
            uniq, where, inv = np.unique(col, return_index=True, return_inverse=True)
            order = np.argsort(where, kind="stable")
            renum = np.empty(len(uniq), np.int64)
            renum[order] = np.arange(len(uniq))
            cols_out[name] = renum[inv.reshape(-1)].tolist()
            tables[name] = [names[i] for i in uniq[order].tolist()]
        arrows = []
        program = getattr(res, "program", None)
        for t in getattr(program, "tasks", ()) or ():
            if t.id not in first:
                continue
            for d in t.deps:
                if d in last and len(arrows) < MAX_ARROWS:
                    arrows.append([last[d][0], last[d][1], first[t.id][0], first[t.id][1]])
        end = res.cycles if res.cycles else max(cols_out["end"], default=1)
        title = (f"{res.kernel} on {res.machine.name}" + (f", {res.size}" if getattr(res, "size", None) else "")
                 + f": {res.cycles} cycles ({res.time_us} us)")
        out.append({
            "label": label, "title": title, "cycles": int(max(end, 1)),
            "rows": [[c, p] for c, p in rows], "hidden_cores": hidden,
            "events": cols_out, "ops": tables["op"], "lines": tables["line"],
            "critical": [c["task"] for c in res.stats.get("critical_path", [])],
            "arrows": arrows,
        })
    return {"runs": out, "classes": [list(c) for c in CLASSES],
            "end": max((r["cycles"] for r in out), default=1)}
