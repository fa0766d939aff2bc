"""Static HTML pieces shared by the explorer, the A/B comparison and reports.

Everything here returns plain strings (HTML, SVG) or bytes (PNG) and is deterministic for the same
input on the same machine: no timestamps, no object ids, no random ids -- notebooks checked by
nbval compare `text/html` outputs verbatim.  Heavy libraries are imported inside the functions.
"""
from __future__ import annotations

import base64
import difflib
import html
import io
import re

from ..ir.exec import SYNC_OPS


# --- images ---------------------------------------------------------------------------------
def fig_png(fig, dpi: int = 90) -> bytes:
    """PNG bytes of a matplotlib Figure, without the (version-dependent) Software metadata."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def img_html(png: bytes, alt: str = "", width: str | None = None) -> str:
    """An <img> holding the PNG as a data URI (self-contained: works in nbconvert HTML, GitHub)."""
    style = f" style='width:{width}; max-width:none'" if width else " style='max-width:100%'"
    return f"<img src='{png_data_uri(png)}' alt='{html.escape(alt, quote=True)}'{style}/>"


def svg_data_uri(svg: str) -> str:
    """An SVG document as a data URI (its namespace added when missing: an image needs it)."""
    if "xmlns=" not in svg[:200]:
        svg = svg.replace("<svg", '<svg xmlns="http://www.w3.org/2000/svg"', 1)
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def svg_img_html(svg: str, alt: str = "") -> str:
    """An <img> holding an SVG document as a data URI (drawn at its own width and height)."""
    return f"<img src='{svg_data_uri(svg)}' alt='{html.escape(alt, quote=True)}' style='max-width:none'/>"


# --- pictures that untrusted notebooks show ---------------------------------------------------
# JupyterLab sanitizes the HTML of an untrusted notebook (one opened without being run or
# trusted): <svg> is dropped but its text kept (a graph becomes a blob of labels) and an <img>
# loses a data: src; a `background-image: url(data:...)` style survives.  So the static
# snapshots (explorer, compare), which untrusted notebooks, nbconvert and nbviewer show, draw
# their pictures as a <div role=img> with the image as its background.
def _picture(uri: str, width: float, height: float, alt: str) -> str:
    a = html.escape(alt, quote=True)
    return (f"<div role='img' aria-label='{a}' title='{a}' style='width:{width:.0f}px; height:{height:.0f}px; "
            f"max-width:100%; background-image:url({uri}); background-size:contain; "
            "background-repeat:no-repeat; background-position:left top'></div>")


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's IHDR chunk."""
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def png_picture_html(png: bytes, alt: str) -> str:
    """The PNG as a picture every notebook shows, trusted or not (see above), at its own size."""
    w, h = png_size(png)
    return _picture(png_data_uri(png), w, h, alt)


_COMMENT = re.compile(r"<!--.*?-->\n?", re.S)


def svg_picture_html(svg: str, alt: str) -> str:
    """A graphviz SVG as a picture every notebook shows, trusted or not (see above), at its own
    size (pt -> px).  Its comments (graphviz's version among them) are left out: the picture
    depends on the drawing only."""
    body = _COMMENT.sub("", svg_body(svg))
    m = _SVG_SIZE.search(body)
    w, h = (float(m.group(1)) * 4 / 3, float(m.group(2)) * 4 / 3) if m else (600.0, 400.0)
    return _picture(svg_data_uri(body), w, h, alt)


# --- SVG --------------------------------------------------------------------------------------
_SVG_SIZE = re.compile(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"')


def svg_body(svg: str) -> str:
    """The <svg> element of a graphviz SVG document (no XML prolog or DOCTYPE), for inline HTML."""
    k = svg.find("<svg")
    return svg[k:] if k >= 0 else svg


def zoom_svg(svg: str, zoom: float = 1.0) -> str:
    """Scale a graphviz SVG by changing its width/height (the viewBox keeps the drawing)."""
    if zoom == 1.0:
        return svg

    def scaled(m):
        w, h = float(m.group(1)) * zoom, float(m.group(2)) * zoom
        return f'<svg width="{w:.0f}pt" height="{h:.0f}pt"'

    return _SVG_SIZE.sub(scaled, svg, count=1)


def scroll_box(inner: str, max_height: int = 640) -> str:
    """A scrollable box: big graphs pan by scrolling, zoom changes the size of what is inside."""
    return (f"<div style='overflow:auto; max-height:{max_height}px; max-width:100%; "
            f"border:1px solid #e0e0e0'>{inner}</div>")


# --- PTO assembly with syntax colouring --------------------------------------------------------
PTO_COLORS = {
    "op": "#0b4f9c",          # opcodes
    "sync": "#b3261e",        # SET_FLAG / WAIT_FLAG / PIPE_BARRIER
    "comment": "#6a737d",     # // comments and ; source lines
    "directive": "#7b3fa0",   # .task / .gm
    "attr": "#555555",        # dim=1, offsets=(...)
    "event": "#b3261e",
}
SPACE_TEXT_COLORS = {"GM": "#5f5f5f", "UB": "#1a5fb4", "L1": "#26813a", "L0A": "#a66f00",
                     "L0B": "#c15c00", "L0C": "#b3265e", "BT": "#6b4fa0"}
# TileRef "UB[0x0]:fp32[64,256]{32,72}" (valid shape optional) and GMRef "GM:x[0:64,0:256]".
_OPERAND = re.compile(r"\b(GM|UB|L1|L0A|L0B|L0C|BT)(?:\[[^\]]*\])?:[\w.]+(?:\[[^\]]*\])?(?:\{[^}]*\})?")
_INSTR = re.compile(r"^(\s+)([A-Z][A-Z0-9_]*)(\s+)(.*?)(\s+;\s+.*)?$")
PTO_STYLE = ("<style>.pto span.pto-op{font-weight:bold} .pto span.pto-sync{font-weight:bold}</style>")


def _span(kind: str, text: str, color: str) -> str:
    return f"<span class='pto-{kind}' style='color:{color}'>{text}</span>"


def _operands_html(body: str) -> str:
    """Colour the operands of one instruction by memory space (input is raw text)."""
    out, pos = [], 0
    for m in _OPERAND.finditer(body):
        out.append(_attrs_html(html.escape(body[pos:m.start()])))
        space = m.group(1)
        out.append(_span(f"space-{space}", html.escape(m.group(0)), SPACE_TEXT_COLORS[space]))
        pos = m.end()
    out.append(_attrs_html(html.escape(body[pos:])))
    return "".join(out)


def _attrs_html(text: str) -> str:
    return re.sub(r"\b(dim|offsets|to)=(\S+?)(?=,|$)",
                  lambda m: _span("attr", m.group(0), PTO_COLORS["attr"]), text)


def pto_line_html(line: str) -> str:
    """One line of `Program.text()` as HTML with coloured spans."""
    stripped = line.strip()
    if stripped.startswith("//"):
        return _span("comment", html.escape(line), PTO_COLORS["comment"])
    if stripped.startswith("."):
        return _span("directive", html.escape(line), PTO_COLORS["directive"])
    m = _INSTR.match(line)
    if not m:
        return html.escape(line)
    indent, op, gap, body, comment = m.groups()
    if op in SYNC_OPS:
        head = _span("sync", op, PTO_COLORS["sync"])
        body_html = re.sub(r"EVENT_ID\d+", lambda e: _span("event", e.group(0), PTO_COLORS["event"]),
                           html.escape(body))
    else:
        head = _span("op", op, PTO_COLORS["op"])
        body_html = _operands_html(body)
    tail = _span("comment", html.escape(comment), PTO_COLORS["comment"]) if comment else ""
    return f"{indent}{head}{gap}{body_html}{tail}"


def pto_html(text: str, max_height: int | None = 640) -> str:
    """PTO assembly text (`Program.text()`) as a <pre> with syntax colouring.

    Opcodes are blue and bold, SET_FLAG / WAIT_FLAG / PIPE_BARRIER red, operands coloured by memory
    space (GM grey, UB blue, L1 green, L0A/L0B/L0C amber..rose), `// ...` and `; file:line` grey.
    """
    body = "\n".join(pto_line_html(line) for line in text.splitlines())
    style = "font-size:12px; line-height:1.35; margin:0"
    if max_height:
        style += f"; max-height:{max_height}px; overflow:auto"
    return f"{PTO_STYLE}<pre class='pto' style='{style}'>{body}</pre>"


def pto_legend_html() -> str:
    items = [_span("op", "TOP", PTO_COLORS["op"]) + " opcode",
             _span("sync", "SET_FLAG", PTO_COLORS["sync"]) + " sync"]
    items += [_span(f"space-{s}", s, c) + " operand" for s, c in SPACE_TEXT_COLORS.items() if s != "BT"]
    items.append(_span("comment", "; file:line", PTO_COLORS["comment"]) + " kernel source line")
    return "<div style='font-size:11px; margin:2px 0 4px 0'>" + " &nbsp; ".join(items) + "</div>"


# --- diffs ------------------------------------------------------------------------------------
DIFF_COLORS = {"+": "#e6ffec", "-": "#ffebe9", "@": "#ddf4ff"}


def unified_diff(a: str, b: str, name_a: str = "before", name_b: str = "after", context: int = 3) -> list[str]:
    return list(difflib.unified_diff(a.splitlines(), b.splitlines(), name_a, name_b, lineterm="", n=context))


def diff_html(a: str, b: str, name_a: str = "before", name_b: str = "after", max_lines: int = 400,
              context: int = 3, max_height: int | None = 520) -> str:
    """A coloured unified diff (added lines green, removed red, hunks blue), truncated to `max_lines`."""
    lines = unified_diff(a, b, name_a, name_b, context)
    if not lines:
        return "<p style='color:#555'>no textual change</p>"
    shown = lines[:max_lines]
    rows = []
    for line in shown:
        color = DIFF_COLORS.get(line[:1]) if not line.startswith(("+++", "---")) else "#f6f8fa"
        style = f" style='background:{color}; display:block'" if color else " style='display:block'"
        rows.append(f"<span class='diff-line'{style}>{html.escape(line) or ' '}</span>")
    if len(lines) > max_lines:
        rows.append(f"<span style='color:#555'>... {len(lines) - max_lines} more diff lines not shown</span>")
    style = "font-size:12px; line-height:1.3; margin:0"
    if max_height:
        style += f"; max-height:{max_height}px; overflow:auto"
    return f"<pre class='diff' style='{style}'>{''.join(rows)}</pre>"


def side_by_side_html(a: str, b: str, name_a: str, name_b: str, max_lines: int = 200) -> str:
    """Two texts next to each other (a lowering: the levels differ, a line diff would mean nothing)."""
    def pane(title, text):
        lines = text.splitlines()
        body = "\n".join(lines[:max_lines])
        if len(lines) > max_lines:
            body += f"\n... {len(lines) - max_lines} more lines"
        return (f"<div style='flex:1; min-width:0'><b>{html.escape(title)}</b>"
                f"<pre style='font-size:11px; max-height:520px; overflow:auto; margin:0'>"
                f"{html.escape(body)}</pre></div>")
    return f"<div style='display:flex; gap:12px'>{pane(name_a, a)}{pane(name_b, b)}</div>"
