"""A static HTML report of a compiled kernel: one self-contained file, readable in any browser.

`write_report(ck, path, *args)` simulates the kernel (with data when arrays are given, so the
outputs are checked against numpy; otherwise timing only) and writes one HTML file holding the
header figures, the stats, the pass log, a section per IR level (graphviz SVG inline plus the
printed text), the PTO program and the timeline (a PNG as a base64 data URI).  Nothing is fetched
from anywhere: no scripts, no stylesheets, no images by URL.

`report_html(ck, res)` returns the same document as a string (or, with `full_document=False`, a
`<div>` whose CSS is scoped to it, for embedding in a notebook output).

A view that cannot be drawn (no `dot` binary, no matplotlib) is replaced by a short note; the rest
of the report is still written.
"""
from __future__ import annotations

import base64
import html
import os

from ..ir.exec import item_lines

MAX_TEXT_LINES = 2000        # a level's printed text is cut after this many lines
MAX_PTO_LINES = 2000         # the PTO program: all tasks if it fits, else the first tasks

LEVEL_SECTIONS = (           # (anchor, title, level key of graphs.level_graph)
    ("tensor", "Tensor graph", "tensor"),
    ("tile", "Tile graph", "tile"),
    ("block", "Block graph", "block"),
    ("exec", "Execution graph", "exec"),
)

_CSS = """
{s} {{ font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222;
       line-height: 1.45; max-width: 1200px; margin: 0 auto; padding: 0 1.5em 3em; }}
{s} h1 {{ font-size: 1.6em; margin: 1em 0 0.2em; }}
{s} h2 {{ font-size: 1.25em; margin: 2em 0 0.6em; padding-bottom: 0.2em; border-bottom: 1px solid #ddd; }}
{s} .sub {{ color: #666; margin: 0 0 1em; }}
{s} .cards {{ display: flex; flex-wrap: wrap; gap: 0.8em; margin: 1em 0; }}
{s} .card {{ background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 6px; padding: 0.5em 0.9em;
             min-width: 8em; }}
{s} .card .k {{ font-size: 0.8em; color: #666; text-transform: uppercase; letter-spacing: 0.03em; }}
{s} .card .v {{ font-size: 1.15em; font-weight: 600; }}
{s} .ok {{ color: #137333; }}
{s} .bad {{ color: #c5221f; }}
{s} .muted {{ color: #777; }}
{s} nav.toc {{ background: #fafbfc; border: 1px solid #e1e4e8; border-radius: 6px; padding: 0.5em 1em;
               display: inline-block; }}
{s} nav.toc ol {{ margin: 0.3em 0; padding-left: 1.4em; }}
{s} a {{ color: #0b57d0; text-decoration: none; }}
{s} a:hover {{ text-decoration: underline; }}
{s} table.stats {{ border-collapse: collapse; font-size: 0.95em; }}
{s} table.stats th, {s} table.stats td {{ text-align: left; padding: 0.25em 1.2em 0.25em 0.4em;
                                           border-bottom: 1px solid #eee; vertical-align: top; }}
{s} table.stats th {{ font-weight: 600; color: #444; white-space: nowrap; }}
{s} pre {{ background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 6px; padding: 0.7em 0.9em;
           overflow: auto; max-height: 640px; font-size: 0.85em; line-height: 1.35; }}
{s} details {{ margin: 0.6em 0; }}
{s} summary {{ cursor: pointer; color: #0b57d0; }}
{s} .graph {{ overflow: auto; max-height: 760px; border: 1px solid #e1e4e8; border-radius: 6px;
              padding: 0.5em; background: white; }}
{s} .graph svg {{ max-width: none; height: auto; }}
{s} .note {{ color: #8a6d00; background: #fff8e1; border: 1px solid #f3e2a0; border-radius: 6px;
             padding: 0.4em 0.8em; }}
{s} img.timeline {{ max-width: 100%; border: 1px solid #e1e4e8; border-radius: 6px; }}
{s} footer {{ margin-top: 3em; color: #888; font-size: 0.85em; }}
"""


def write_report(ck, path, *args, res=None, title=None) -> str:
    """Simulate `ck` (full mode with a check when `args` are given, else timing only) unless `res`
    is given, and write the self-contained HTML report to `path`; return the path."""
    if res is None:
        res = ck.simulate(*args, mode="full") if args else ck.simulate(mode="timing")
    text = report_html(ck, res, title=title)
    path = os.fspath(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def report_html(ck, res, title=None, full_document: bool = True) -> str:
    """The report of a CompiledKernel and its SimResult as HTML text.

    `full_document=True`: a whole `<!DOCTYPE html>` page; `False`: one `<div class="pypto-report">`
    with its CSS scoped to it (for a notebook cell's output)."""
    title = title or f"pypto report: {ck.name}"
    sections = [("overview", "Overview", _overview(ck, res)),
                ("stats", "Statistics", _stats_table(res))]
    source = _source(ck)
    if source:
        sections.append(("source", "Kernel source", source))
    sections.append(("passes", "Pass log", _pre(ck.pass_log.text())))
    for anchor, name, key in LEVEL_SECTIONS:
        sections.append((anchor, name, _level_section(ck, key)))
    sections.append(("pto", "PTO program", _pto_section(ck)))
    sections.append(("timeline", "Timeline", _timeline_section(res)))

    toc = "".join(f'<li><a href="#{a}">{html.escape(t)}</a></li>' for a, t, _ in sections)
    body = [f"<h1>{html.escape(title)}</h1>",
            f'<p class="sub">{html.escape(_subtitle(ck))}</p>',
            f'<nav class="toc"><b>Contents</b><ol>{toc}</ol></nav>']
    for anchor, name, content in sections:
        body.append(f'<section id="{anchor}"><h2>{html.escape(name)}</h2>\n{content}\n</section>')
    body.append(f"<footer>generated by pypto {html.escape(_version())}</footer>")
    inner = "\n".join(body)
    if not full_document:
        css = _CSS.format(s=".pypto-report")
        return f'<div class="pypto-report"><style>{css}</style>\n{inner}\n</div>'
    css = _CSS.format(s="body")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{css}</style>\n</head>\n"
            f"<body>\n{inner}\n</body>\n</html>\n")


# --- sections ---------------------------------------------------------------------------------
def _version() -> str:
    from .. import __version__
    return __version__


def _consts_text(ck) -> str:
    return ", ".join(f"{k}={v}" for k, v in ck.consts.items()) or "none"


def _subtitle(ck) -> str:
    params = ", ".join(f"{p.name}: {p.dtype}[{','.join(str(d) for d in p.shape)}]" for p in ck.params)
    return f"{ck.name}({params}) on {ck.machine.name}"


def check_verdict(res) -> tuple[str, str]:
    """(text, css class) of the check against numpy."""
    if res.check is None:
        return "not checked (timing-only simulation, no data)", "muted"
    if res.ok:
        return "OK vs numpy", "ok"
    bad = ", ".join(n for n, c in res.check.items() if not c["ok"])
    return f"MISMATCH vs numpy ({bad})", "bad"


def _overview(ck, res) -> str:
    m = ck.machine
    verdict, cls = check_verdict(res)
    cycles = "n/a" if res.cycles is None else str(res.cycles)
    time_us = "n/a" if res.time_us is None else f"{res.time_us:.3f} us"
    cards = [("kernel", ck.name, ""), ("machine", m.name, ""), ("cycles", cycles, ""),
             ("time", time_us, ""), ("bound", res.stats.get("bound", "n/a"), ""),
             ("check", verdict, cls)]
    out = ['<div class="cards">']
    for k, v, c in cards:
        out.append(f'<div class="card"><div class="k">{html.escape(k)}</div>'
                   f'<div class="v {c}">{html.escape(str(v))}</div></div>')
    out.append("</div>")
    rows = [("constants", _consts_text(ck)),
            ("machine", f"{m.name}: {m.n_aic} AIC + {m.n_aiv} AIV cores at {m.clock_ghz} GHz, "
                        f"HBM {m.hbm_gbps:.0f} GB/s"),
            ("levels", f"{len(ck.tensor_graph)} tensor nodes, {len(ck.tile_graph)} tile ops, "
                       f"{len(ck.block_graph)} tasks, {len(ck.program)} PTO instructions")]
    out.append(_table(rows))
    return "\n".join(out)


def _table(rows) -> str:
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in rows)
    return f'<table class="stats">{body}</table>'


def stats_rows(res) -> list[tuple[str, str]]:
    """The SimResult's stats as (name, value) rows."""
    return res.stats_rows() or [("stats", "none (no timing simulation)")]


def _stats_table(res) -> str:
    return _table(stats_rows(res))


def _source(ck) -> str:
    fn = getattr(getattr(ck, "kernel", None), "fn", None)
    if fn is None:
        return ""
    import inspect
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return ""
    where = f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}"
    return f'<p class="muted">{html.escape(where)}</p>{_pre(src)}'


def _pre(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>"


def _cut(text: str, limit: int = MAX_TEXT_LINES) -> str:
    lines = text.splitlines()
    if len(lines) <= limit:
        return text
    return "\n".join(lines[:limit] + [f"... {len(lines) - limit} more lines not shown"])


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _svg(ck, key: str) -> str:
    from .graphs import level_graph, to_svg
    try:
        svg = to_svg(level_graph(ck, key))
    except Exception as e:     # noqa: BLE001 (no dot binary, no graphviz package: keep the report)
        return _note(f"graph not drawn: {type(e).__name__}: {e}")
    start = svg.find("<svg")   # drop the XML prolog and the DOCTYPE (which names an external DTD)
    return f'<div class="graph">{svg[start:] if start >= 0 else svg}</div>'


def _level_text(ck, key: str) -> str:
    return {"tensor": lambda: ck.tensor_graph.text(), "tile": lambda: ck.tile_graph.text(),
            "block": lambda: ck.block_graph.text(), "exec": lambda: ck.exec_graph.text()}[key]()


def _level_section(ck, key: str) -> str:
    text = _level_text(ck, key)
    n = len(text.splitlines())
    return (_svg(ck, key) +
            f"\n<details><summary>printed {html.escape(key)} level ({n} lines)</summary>"
            f"{_pre(_cut(text))}</details>")


def pto_text(program, max_lines: int = MAX_PTO_LINES) -> tuple[str, int]:
    """The program's text: all tasks when it fits in `max_lines`, else as many whole tasks as fit
    (at least one); returns (text, number of tasks shown)."""
    n_tasks = len(program.tasks)
    header = 1 + len(program.buffers)
    size = [len(item_lines(t.code)) for t in program.tasks]      # text lines per task
    total = header + sum(1 + n for n in size)
    if total <= max_lines:
        return program.text(), n_tasks
    lines, shown = header + 1, 0          # + the "... more tasks" line
    for n in size:
        if shown and lines + 1 + n > max_lines:
            break
        lines += 1 + n
        shown += 1
    return program.text(max_tasks=shown), shown


def _pto_section(ck) -> str:
    p = ck.program
    text, shown = pto_text(p)
    head = (f'<p>{len(p.tasks)} tasks, {len(p)} instructions '
            f'({sum(1 for t in p.tasks if t.core_type == "AIC")} on AIC, '
            f'{sum(1 for t in p.tasks if t.core_type == "AIV")} on AIV).</p>')
    if shown < len(p.tasks):
        head += _note(f"The program is long: showing the first {shown} of {len(p.tasks)} tasks "
                      f"(program.text() prints all of them).")
    return head + _pre(text)


def _timeline_section(res) -> str:
    if not res.trace:
        return _note("no trace events (simulated with trace=False, or functional mode only)")
    try:
        from .timeline import timeline_png
        png = timeline_png(res)
    except Exception as e:     # noqa: BLE001 (no matplotlib: keep the report)
        return _note(f"timeline not drawn: {type(e).__name__}: {e}")
    data = base64.b64encode(png).decode("ascii")
    alt = f"timeline of {res.kernel} on {res.machine.name}: {res.cycles} cycles"
    return (f'<img class="timeline" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
            f'<p class="muted">A row per (core, pipe), a bar per instruction; at most 8 cores are '
            f'shown. For every core, load the Chrome trace (res.to_chrome_trace) in Perfetto.</p>')
