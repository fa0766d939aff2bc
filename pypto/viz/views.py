"""The explorer's views as functions of a session (session.py): what each tab, the header and
the static snapshot show, as HTML strings (the graph tabs' SVG, drawn by graph_widget.py; the
timeline is timeline_widget.py).  No widgets here: the explorer puts these strings into its
widgets, and the static snapshot is what nbconvert, GitHub and untrusted notebooks show.
"""
from __future__ import annotations

import html

TABS = ("Tensor", "Tile", "Block", "Execution", "PTO", "Passes", "Timeline", "Stats", "Roofline", "Advice")
GRAPH_TABS = ("Tensor", "Tile", "Block", "Execution")
SIM_TABS = ("Timeline", "Stats", "Roofline", "Advice")
# Names accepted by `show=` (and `%%pypto --show`), mapped to tab titles.
TAB_NAMES = {"tensor": "Tensor", "tile": "Tile", "block": "Block", "exec": "Execution",
             "execution": "Execution", "pto": "PTO", "program": "PTO", "passes": "Passes",
             "timeline": "Timeline", "stats": "Stats", "roofline": "Roofline", "advice": "Advice"}
PTO_TASKS = 4
MAX_PASS_TEXT_LINES = 400
TIMELINE_DPI = 80          # the static snapshot's PNG timeline
_NO_SIM = "not simulated: compiled only (--no-sim / simulate=False); no timeline, stats or roofline"


def pieces_text(ck, n: int) -> str:
    """How a call on n rows runs: 'runs 2 × 2048 + 1 × 1024 rows' (`CompiledKernel.pieces_for`)."""
    counts: dict[int, int] = {}
    for _, rows in ck.pieces_for(n):
        counts[rows] = counts.get(rows, 0) + 1
    return "runs " + " + ".join(f"{k} \u00d7 {rows}" for rows, k in counts.items()) + (
        " row" if list(counts) == [1] else " rows")


def tab_title(name: str) -> str:
    """The tab title for a view name ('tile', 'exec', 'Timeline', ...); KeyError when unknown."""
    if name in TABS:
        return name
    return TAB_NAMES[name.strip().lower()]


def header_html(s) -> str:
    """The explorer's header line: kernel, machine, (size), cycles, time, bound, check."""
    ck, res = s._ck, s._res
    dtype = f" ({html.escape(s._dtype)})" if s._dtype else ""
    head = f"<b>{html.escape(ck.name)}</b>{dtype} on {html.escape(ck.machine.name)} &nbsp;|&nbsp; "
    if s._size is not None:      # the size on display and how the call runs it
        head += (f"<b>{html.escape(s.size_name)} = {s._size}</b> row{'s' if s._size != 1 else ''} "
                 f"<span style='color:#555'>({html.escape(pieces_text(ck, s._size))})</span>"
                 f" &nbsp;|&nbsp; ")
    if res is None:
        program = s._program()
        return head + (f"not simulated (compile only) &nbsp;|&nbsp; {len(program)} instructions in "
                       f"{len(program.tasks)} tasks")
    ok = res.ok
    verdict = ("<span style='color:#080'>check OK</span>" if ok else
               "<span style='color:#c00'>check MISMATCH</span>" if ok is False else
               "<span style='color:#888'>checking…</span>")
    if s._size is not None:      # which data the numpy check ran on
        verdict += f" <span style='color:#555'>on {html.escape(s._data_text())}</span>"
    bound = res.stats.get("bound")
    bound = f" &nbsp;|&nbsp; bound: {html.escape(bound)}" if bound else ""
    return (head + f"<b>{res.cycles}</b> cycles &nbsp;|&nbsp; {res.time_us:.3f} us{bound}"
                   f" &nbsp;|&nbsp; {verdict}")


def dynamic_note_html(s) -> str:
    """The note of the compiled levels' tabs of a dynamic kernel (the same for every size)."""
    info = s._ck.dynamic
    if info is None:
        return ""
    note = (f"The levels of the program for {info.chunk} rows (the compiled chunk). {info.describe()}. "
            f"Timeline, Stats and Roofline show the call on the chosen {s.size_name}.")
    return f"<div class='pypto-dynamic-note' style='color:#555; font-size:11px'>{html.escape(note)}</div>"


def graph_note_html(s, title, expand) -> str:
    """What the HTML above a graph says (the graph itself is the tab's GraphWidget)."""
    from . import graphs
    note = ""
    level = title.lower()
    if title != "Tensor":
        if expand:
            note = (f"all tiles/tasks drawn, at most {graphs.MAX_EXPANDED_NODES} nodes "
                    f"(a note in the graph says when some were left out)")
        elif graphs.is_folded(s._ck, level):
            note = ("folded view: repeated tiles/tasks are drawn once (\"x N\"); "
                    "tick 'expand all tiles' to draw them all")
    note_html = f"<div style='color:#555; font-size:11px'>{html.escape(note)}</div>" if note else ""
    return dynamic_note_html(s) + note_html


def tab_html(s, title, variant):
    """The HTML of one tab for the configuration on display (a graph tab: its SVG; the Timeline
    is a widget of its own)."""
    from . import graphs
    from .static import img_html, pto_html, pto_legend_html, svg_body
    ck, res = s._ck, s._res
    if title in GRAPH_TABS:
        return svg_body(graphs.to_svg(graphs.level_graph(ck, title.lower(), expand=bool(variant))))
    if title == "PTO":
        return dynamic_note_html(s) + pto_legend_html() + pto_html(ck.program.text(max_tasks=PTO_TASKS))
    if title == "Passes":
        return passes_html(ck)
    if res is None:
        return f"<p style='color:#555'>{html.escape(_NO_SIM)}</p>"
    if title == "Advice":
        return advice_tab_html(s)
    if title == "Roofline":
        from .roofline import roofline_png
        return img_html(roofline_png(res, program=ck.program if res.program is None else res.program), alt="roofline")
    return stats_html(res, s._size_rows())


def advice_tab_html(s) -> str:
    """The Advice tab: the advisor's findings for the configuration on display (each suggestion
    compiled and re-simulated: seconds, so computed when the tab is first opened)."""
    from .tune import advice_html
    if s._ck.dynamic is not None:
        return ("<p style='color:#555'>The advisor works on one size: compile the kernel for the rows to advise on "
                "(pypto.Tensor([rows, ...])) and explore that.</p>")
    adv = s.advice()
    note = ""
    if adv.best is not None and s.applicable(adv.best):
        note = ("<div style='color:#555; font-size:11px'>The button under the table sets the sliders to the "
                "top suggestion.</div>")
    return advice_html(adv) + note


def instruction_html(s, sel) -> str:
    """What the explorer shows of the instruction clicked on the timeline: its task, its PTO line
    and its kernel line."""
    if not sel or s._res is None:
        return ""
    program = s._res.program if s._res.program is not None else s._ck.program
    task = program.tasks[sel["task"]]
    ins = task.instrs[sel["index"]]
    from .static import pto_line_html
    rows = [f"<b>task {task.id} instruction {sel['index']}</b> on {html.escape(sel['core'])} "
            f"{html.escape(sel['pipe'])}, cycles {sel['start']}&ndash;{sel['end']}",
            f"<code style='white-space:pre'>{pto_line_html(ins.text())}</code>"]
    if ins.loc is not None:
        src = ins.loc.source_line().strip()
        rows.append(f"kernel line {html.escape(ins.loc.short())}"
                    + (f": <code>{html.escape(src)}</code>" if src else ""))
    return ("<div class='pypto-timeline-selected' style='margin-top:4px'>"
            + "".join(f"<div>{r}</div>" for r in rows) + "</div>")


def static_html(s) -> str:
    """A self-contained snapshot of the current configuration: header, stats, the Tensor
    graph (SVG) and the timeline (PNG data URI).  Deterministic for the same configuration."""
    from . import graphs
    from .static import png_picture_html, scroll_box, svg_picture_html
    from .timeline import timeline_png
    parts = [f"<div class='pypto-explorer-static'><div>{header_html(s)}</div>"]
    if s._res is not None:
        s._ensure_trace()
        parts.append(stats_html(s._res, s._size_rows()))
    else:
        parts.append(f"<p>{html.escape(_NO_SIM)}</p>")
    # pictures an untrusted notebook shows too (static.py); no kernel lines in the graph: the
    # snapshot stays the same when the kernel's cell gets another number
    svg = graphs.to_svg(graphs.tensor_graph(s._ck.tensor_graph, locations=False))
    parts.append("<h4 style='margin:6px 0 2px 0'>Tensor graph</h4>" + dynamic_note_html(s)
                 + scroll_box(svg_picture_html(svg, f"Tensor graph of {s._ck.name}"), 480))
    if s._res is not None:
        parts.append("<h4 style='margin:6px 0 2px 0'>Timeline</h4>" +
                     png_picture_html(timeline_png(s._res, dpi=TIMELINE_DPI), f"timeline of {s._ck.name}"))
    parts.append("</div>")
    return "".join(parts)

# --- compile, simulate, cache ----------------------------------------------------------


def _interesting_pass(log) -> int:
    """The pass shown first: the first one within a level that changed the node count."""
    for k, r in enumerate(log):
        if "->" not in r.level and r.nodes_before != r.nodes_after:
            return k
    return 0 if log else None


def level_text(g) -> str:
    """The text form of one level's IR for the Passes tab (the PTO program: its first tasks)."""
    from ..ir.program import Program
    if isinstance(g, Program):
        return g.text(max_tasks=PTO_TASKS)
    text = str(g)
    lines = text.splitlines()
    if len(lines) > MAX_PASS_TEXT_LINES:
        text = "\n".join(lines[:MAX_PASS_TEXT_LINES] + [f"... {len(lines) - MAX_PASS_TEXT_LINES} more lines"])
    return text


def passes_html(ck) -> str:
    """The pass log as a table: level, pass, nodes before -> after, time."""
    rows = []
    for k, r in enumerate(ck.pass_log):
        bold = "" if r.nodes_before == r.nodes_after else "; font-weight:bold"
        rows.append(f"<tr><td>{k + 1}</td><td>{html.escape(r.level)}</td><td>{html.escape(r.name)}</td>"
                    f"<td style='text-align:right{bold}'>{r.nodes_before} -&gt; {r.nodes_after}</td>"
                    f"<td style='text-align:right; color:#777'>{r.ms:.1f} ms</td></tr>")
    head = ("<tr><th>#</th><th style='text-align:left'>level</th><th style='text-align:left'>pass</th>"
            "<th>nodes before -&gt; after</th><th>time</th></tr>")
    note = ("<div style='color:#555; font-size:11px; margin:4px 0'>Pick a pass to see its level's text "
            "before and after it (a lowering shows both levels side by side).</div>")
    return f"<table class='pypto-passes'>{head}{''.join(rows)}</table>{note}"


def pass_diff_html(ck, k: int) -> str:
    """The text of the level before and after pass `k` of `ck.pass_log`: a coloured unified diff
    within a level, both texts side by side across a lowering."""
    from .static import diff_html, side_by_side_html
    snaps = ck.snapshots
    if not snaps:
        return "<p style='color:#555'>compiled without snapshots: compile with snapshots=True</p>"
    name, after = snaps[k]
    before = ck.traced if k == 0 else snaps[k - 1][1]
    a, b = level_text(before), level_text(after)
    title = f"<b>{html.escape(name)}</b> ({html.escape(ck.pass_log[k].level)})"
    if getattr(before, "level", None) != getattr(after, "level", None):
        return title + side_by_side_html(a, b, f"before: {before.level}", f"after: {after.level}")
    return title + diff_html(a, b, f"before {name}", f"after {name}")


def stats_html(res, extra=()) -> str:
    """The stats of a SimResult as an HTML table (`extra` (label, text) rows first)."""
    rows = list(extra) + res.stats_rows()
    body = "".join(f"<tr><th style='text-align:left; padding-right:1em'>{html.escape(str(k))}</th>"
                   f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


