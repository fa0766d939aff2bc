"""`pypto.profile()` drawn: the runs of a profile block as an HTML table, a bar per kernel's share
of the simulated time (the data and its text are `pypto.frontend.profiling`'s)."""
from __future__ import annotations

import html

from ..frontend.profiling import Profiler, rows_total_us

BAR = "#4c78a8"


def profile_html(p: Profiler) -> str:
    """The table of `p.rows`: a row per compiled kernel, the longest total time first."""
    rows = p.rows
    if not rows:
        return "<div><b>profile</b>: no kernel ran</div>"
    total = rows_total_us(rows)
    head = "".join(f"<th style='text-align:left'>{html.escape(title)}</th>" for _, title in p.COLUMNS)
    body = []
    for r in rows:
        cells = p.cells(r)
        share = (r["total_us"] or 0.0) / total if total else 0.0
        tds = []
        for k, c in enumerate(cells):
            align = "right" if k in p.NUMERIC else "left"
            title = f" title='{html.escape(r['shapes'])}'" if k == 0 else ""
            tds.append(f"<td style='text-align:{align}'{title}>{html.escape(c)}</td>")
        bar = (f"<td><div style='background:{BAR}; height:10px; width:{max(round(120 * share), 1)}px' "
               f"title='{100 * share:.1f}% of the simulated time'></div></td>") if r["total_us"] else "<td></td>"
        body.append(f"<tr>{''.join(tds)}{bar}</tr>")
    note = (f"<div style='color:#666'>{html.escape(p.NOTE)}</div>"
            if any(r["cycles"] is None for r in rows) else "")
    return (f"<div><b>profile</b>: {html.escape(p.summary(rows))}"
            f"<table style='font-size:12px'><tr>{head}<th></th></tr>{''.join(body)}</table>{note}</div>")


class Profile(Profiler):
    """What `pypto.profile()` returns: a `Profiler` that a notebook shows as a table."""

    def _repr_html_(self) -> str:
        return profile_html(self)


def profile(timing: bool = True) -> Profile:
    """`with pypto.profile() as prof: ...` collects every kernel call and simulation in the block
    (see `pypto.frontend.profiling`); `prof.rows`, `print(prof)`, or the table in a notebook."""
    return Profile(timing=timing)
