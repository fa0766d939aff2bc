"""Pictures of a sweep (`pypto.tune`) and of the advisor's findings: a results table with the best
row marked, cycles against the swept values, and the advice as HTML.  Deterministic for the same
results (nbval compares the HTML verbatim)."""
from __future__ import annotations

import html

from .static import fig_png, png_picture_html

BEST = "#e6f4ea"


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def plot_tune(res, ax=None):
    """Cycles against the swept values: a line per value of the second name when one or two
    numeric names vary (the x axis in log 2 when the values are powers of two), else a bar per
    configuration, fastest first.  Configurations that did not compile are left out (the table
    names them).  Returns the Figure."""
    import matplotlib.pyplot as plt
    rows = res.ok_rows
    varying = [n for n in res.names if len({repr(r["config"].get(n)) for r in res.rows}) > 1]
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
    else:
        fig = ax.figure
    xs = [r["config"].get(varying[0]) for r in rows] if varying else []
    lines = bool(varying) and len(varying) <= 2 and _numeric(xs)
    if lines:
        x, series = varying[0], varying[1] if len(varying) == 2 else None
        groups: dict = {}
        for r in rows:
            groups.setdefault(r["config"].get(series) if series else None, []).append(r)
        for key, rs in groups.items():
            rs = sorted(rs, key=lambda r: r["config"][x])
            ax.plot([r["config"][x] for r in rs], [r["cycles"] for r in rs], marker="o",
                    label=f"{series}={key}" if series else None)
        if all(v > 0 and (v & (v - 1)) == 0 for v in xs if isinstance(v, int)) and len(set(xs)) > 2:
            ax.set_xscale("log", base=2)
            ticks = sorted(set(xs))
            ax.set_xticks(ticks, [str(v) for v in ticks])
            ax.minorticks_off()
        ax.set_xlabel(x)
        ax.set_ylabel("cycles")
        if series:
            ax.legend(fontsize=8)
    else:
        ranked = sorted(rows, key=lambda r: r["cycles"])
        labels = [" ".join(f"{k}={r['config'][k]}" for k in varying if k in r["config"]) or "default" for r in ranked]
        ax.barh(range(len(ranked)), [r["cycles"] for r in ranked], color="#4c78a8")
        ax.set_yticks(range(len(ranked)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("cycles")
    best = res.best
    if best is not None and lines:
        ax.plot([best["config"][varying[0]]], [best["cycles"]], marker="*", markersize=14, color="#d62728",
                linestyle="none")
    ax.set_title(f"{res.kernel_name} on {res.machine}: {len(res.rows)} configurations", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    plt.close(fig)
    return fig


def tune_html(res, limit: int = 16) -> str:
    """The sweep as HTML: a line of what ran, the table (fastest first, the best marked) and the plot."""
    best = res.best
    head = "".join(f"<th>{html.escape(n)}</th>" for n in (*res.names, "cycles", "µs", "bound", "instructions", "tasks"))
    body = []
    for r in res.ranked()[:limit]:
        cfg = "".join(f"<td>{html.escape(str(getattr(r['config'].get(n, ''), 'name', r['config'].get(n, ''))))}</td>"
                      for n in res.names)
        if "cycles" in r:
            style = f" style='background:{BEST}'" if r is best else ""
            body.append(f"<tr{style}>{cfg}<td style='text-align:right'>{r['cycles']:,}</td>"
                        f"<td style='text-align:right'>{r['time_us']:.2f}</td><td>{html.escape(r['bound'])}</td>"
                        f"<td style='text-align:right'>{r['instructions']:,}</td>"
                        f"<td style='text-align:right'>{r['tasks']}</td></tr>")
        else:
            body.append(f"<tr style='color:#888'>{cfg}<td colspan=5>{html.escape(r['error'])}</td></tr>")
    more = f"<div style='color:#666'>… {len(res.rows) - limit} more</div>" if len(res.rows) > limit else ""
    summary = (f"<b>{html.escape(res.kernel_name)}</b>: {len(res.rows)} configurations on {html.escape(res.machine)} "
               f"({html.escape(res.executor)}; {res.cached} from the cache)")
    if best is not None:
        cfg = ", ".join(f"{k}={getattr(v, 'name', v)}" for k, v in best["config"].items())
        summary += f"; best <b>{html.escape(cfg)}</b>: {best['cycles']:,} cycles"
    picture = png_picture_html(fig_png(plot_tune(res)), f"cycles of {res.kernel_name} per configuration") \
        if res.ok_rows else ""
    return (f"<div class='pypto-tune'><div>{summary}</div>"
            f"<div style='display:flex; gap:16px; align-items:flex-start; flex-wrap:wrap'>"
            f"<table style='font-size:12px'><tr>{head}</tr>{''.join(body)}</table>{more}{picture}</div></div>")


def advice_html(adv) -> str:
    """The advice as HTML: the bound and its evidence, then the suggestions (fastest first) with
    their measured cycles, then the changes of precision apart."""
    ev = "".join(f"<tr><td style='color:#555; padding-right:12px'>{html.escape(e.label)}</td>"
                 f"<td>{html.escape(e.text)}</td></tr>" for e in adv.evidence)

    def rows(items, mark):
        out = []
        for i, s in enumerate(items):
            style = f" style='background:{BEST}'" if mark and i == 0 else ""
            out.append(f"<tr{style}><td><code>{html.escape(s.title)}</code></td>"
                       f"<td style='text-align:right'>{s.cycles:,}</td>"
                       f"<td style='text-align:right'>{s.gain_pct:.1f}%</td>"
                       f"<td style='text-align:right'>{s.speedup:.2f}x</td>"
                       f"<td>{html.escape(s.bound)}</td><td>{html.escape(s.why)}</td></tr>")
        return "".join(out)

    head = ("<tr><th>change</th><th>cycles</th><th>fewer</th><th>speed-up</th><th>bound after</th>"
            "<th>what moved</th></tr>")
    parts = [f"<div class='pypto-advice'><div><b>{html.escape(adv.kernel_name)}</b> on {html.escape(adv.machine)}: "
             f"{adv.cycles:,} cycles, <b>bound: {html.escape(adv.bound)}</b></div>",
             f"<table style='font-size:12px; margin:4px 0'>{ev}</table>"]
    if adv.suggestions:
        parts.append(f"<div>Suggestions, each compiled and re-simulated ({adv.tried} changes tried):</div>"
                     f"<table style='font-size:12px'>{head}{rows(adv.suggestions, True)}</table>")
    else:
        parts.append(f"<div>No suggestion: none of the {adv.tried} changes tried saves {adv.min_gain_pct:g}% of the "
                     f"cycles ({adv.failed} did not compile).</div>")
    if adv.precision:
        parts.append("<div style='margin-top:6px'>With other numerics (the outputs change):</div>"
                     f"<table style='font-size:12px; color:#555'>{head}{rows(adv.precision, False)}</table>")
    parts.append("</div>")
    return "".join(parts)
