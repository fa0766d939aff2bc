"""A model's profile (`pypto.nn.profile_model`) as HTML: the kernels on one time axis (an SVG bar
per layer), a table per layer, per compiled kernel and per op kind.  Deterministic for the same
profile (no timestamps, no random ids)."""
from __future__ import annotations

import html

from .static import svg_img_html

_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7")


def layers_svg(prof, width: int = 760, bar: int = 16) -> str:
    """A bar per kernel run on the model's cycle axis, coloured by compiled kernel."""
    total = max(prof.cycles, 1)
    kernels = dict.fromkeys(layer["kernel"] for layer in prof.layers)
    color_of = {k: _COLORS[i % len(_COLORS)] for i, k in enumerate(kernels)}
    left, right = 190, 40
    span = width - left - right
    h = 24 + bar * len(prof.layers) + 22
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{h}' font-family='sans-serif' "
           f"font-size='11'>"]
    for i, layer in enumerate(prof.layers):
        y = 8 + i * bar
        x0 = left + span * layer["start"] / total
        w = max(span * layer["cycles"] / total, 1.0)
        color = color_of[layer["kernel"]]
        name = html.escape(layer["name"])
        out.append(f"<text x='{left - 6}' y='{y + bar - 5}' text-anchor='end'>{name}</text>")
        out.append(f"<rect x='{x0:.1f}' y='{y + 1}' width='{w:.1f}' height='{bar - 3}' fill='{color}'>"
                   f"<title>{name}: {html.escape(layer['kernel'])}, {layer['cycles']} cycles "
                   f"({layer['time_us']} us)</title></rect>")
    y = 12 + bar * len(prof.layers)
    out.append(f"<line x1='{left}' y1='{y}' x2='{left + span}' y2='{y}' stroke='#888'/>")
    for k in range(5):
        x = left + span * k / 4
        out.append(f"<text x='{x:.1f}' y='{y + 14}' text-anchor='middle'>{round(total * k / 4)}</text>")
    out.append("</svg>")
    return "".join(out)


def _table(headers, rows) -> str:
    head = "".join(f"<th style='text-align:left;padding:2px 8px'>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td style='padding:2px 8px'>{html.escape(str(v))}</td>" for v in r) + "</tr>"
                   for r in rows)
    return f"<table style='border-collapse:collapse;font-size:12px'><tr>{head}</tr>{body}</table>"


def profile_html(prof, max_ops: int = 12) -> str:
    """The profile of a model: totals, the timeline of its kernels, tables per layer, per
    kernel, per unit and per op kind (the `max_ops` busiest)."""
    head = (f"<b>{html.escape(prof.model)}</b> on {html.escape(prof.machine.name)}: {prof.cycles} cycles "
            f"({prof.time_us} us), {len(prof.layers)} kernel runs of {len(prof.kernels)} compiled kernels")
    layers = _table(["layer", "kernel", "cycles", "time (us)", "start cycle", "instructions", "bound"],
                    [(x["name"], x["kernel"], x["cycles"], x["time_us"], x["start"], x["instructions"], x["bound"])
                     for x in prof.layers])
    kernels = _table(["kernel", "calls", "cycles per call", "total cycles", "instructions", "compile (s)"],
                     [(k["kernel"], k["calls"], k["cycles"], k["total_cycles"], k["instructions"], k["compile_s"])
                      for k in prof.kernels])
    units = _table(["unit", "busy cycles", "share of busy cycles"],
                   [(u["unit"], u["busy_cycles"], f"{u['share']:.1f}%") for u in prof.units])
    ops = _table(["op", "unit", "busy cycles", "share of busy cycles"],
                 [(o["op"], o["unit"], o["busy_cycles"], f"{o['share']:.1f}%") for o in prof.ops[:max_ops]])
    return (f"<div>{head}<div>{svg_img_html(layers_svg(prof), 'kernels on the time axis')}</div>"
            f"<div style='display:flex;gap:24px;flex-wrap:wrap'><div>{layers}</div><div>{kernels}<br/>{units}</div>"
            f"<div>{ops}</div></div></div>")


def plot_profile_timeline(prof, aggregate: bool = True, **kw):
    """The kernels of a model on one time axis (`pypto.viz.timeline.plot_timeline` of the merged
    trace), a dotted line and the layer's name at the start of each kernel."""
    from .timeline import plot_timeline
    kw.setdefault("title", f"{prof.model} on {prof.machine.name}: {len(prof.layers)} kernels, "
                           f"{prof.cycles} cycles ({prof.time_us} us)")
    fig = plot_timeline(prof.as_result(), aggregate=aggregate, **kw)
    ax = fig.axes[0]
    ax.set_title(ax.get_title(), fontsize=10, pad=12)       # room for the layers' names
    for layer in prof.layers:
        ax.axvline(layer["start"], color="#444444", linestyle=":", linewidth=0.8)
        label = layer["name"].split(".", 1)[-1]            # without the model's class
        ax.text(layer["start"], 1.0, " " + label, transform=ax.get_xaxis_transform(), fontsize=7, va="bottom",
                ha="left", color="#444444")
    return fig
