"""Graph views that a big graph does not defeat: a graphviz SVG opened fitted to its view, with
mouse pan and zoom and a search that marks the nodes naming an op.

An anywidget whose JavaScript (`js/graph.js`) and CSS ship inside the package (offline, no CDN).
Traits: `svg` (the drawing), `query` (the search text, both ways), `zoom` (the scale on screen,
set by the front end), `matches` (how many nodes the query marks; worked out here from the SVG, so
scripts and tests see it too).
"""
from __future__ import annotations

import html
import pathlib
import re

import anywidget
import traitlets

_JS = pathlib.Path(__file__).with_name("js")
_TEXT = re.compile(r"<text[^>]*>(.*?)</text>", re.S)


def node_texts(svg: str) -> list[str]:
    """The text of every node of a graphviz SVG (its label lines joined by spaces)."""
    out = []
    for part in svg.split('class="node"')[1:]:
        body = part.split("</g>\n<!--", 1)[0]
        out.append(" ".join(html.unescape(t) for t in _TEXT.findall(body)))
    return out


def matching_nodes(svg: str, query: str) -> int:
    """How many nodes the search `query` marks: those whose text contains it, ignoring case."""
    q = query.strip().lower()
    return 0 if not q else sum(q in t.lower() for t in node_texts(svg))


class GraphWidget(anywidget.AnyWidget):
    _esm = _JS / "graph.js"
    _css = _JS / "graph.css"
    svg = traitlets.Unicode("").tag(sync=True)
    query = traitlets.Unicode("").tag(sync=True)
    zoom = traitlets.Float(1.0).tag(sync=True)
    matches = traitlets.Int(0).tag(sync=True)

    @traitlets.observe("svg", "query")
    def _count(self, _change):
        self.matches = matching_nodes(self.svg, self.query)
