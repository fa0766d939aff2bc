"""The interactive timeline: every core and pipe of a run (or two runs on one time axis), with
zoom and pan on the cycle axis, a tooltip per instruction, a click that selects it, and the
critical path and the dependencies between tasks on demand.

An anywidget whose JavaScript (`js/timeline.js`) and CSS ship inside the package: it works offline,
with no CDN.  Its data is `timeline.timeline_data(...)` (plain lists: the core returns data, the
JavaScript draws).  Its traits:

    data       what it draws (set by `show`; the bars as binary columns, `payload` as lists)
    view       [first, last] cycle on screen: follows zoom and pan, and setting it zooms
    selected   the instruction last clicked ({} when none): run, label, task, index, op, core,
               pipe, start, end, line

Where no widget front end runs (nbconvert, GitHub), the static PNG and SVG timelines
(`timeline.plot_timeline`, `timeline_svg`) stay the pictures.
"""
from __future__ import annotations

import pathlib

import anywidget
import numpy as np
import traitlets

from .timeline import timeline_data

_JS = pathlib.Path(__file__).with_name("js")


class TimelineWidget(anywidget.AnyWidget):
    _esm = _JS / "timeline.js"
    _css = _JS / "timeline.css"
    data = traitlets.Dict().tag(sync=True)
    view = traitlets.List(traitlets.Int(), default_value=[]).tag(sync=True)
    selected = traitlets.Dict().tag(sync=True)

    def __init__(self, runs=(), labels=None, **kw):
        super().__init__(**kw)
        self.payload: dict = {}
        if runs:
            self.show(runs, labels)

    def show(self, runs, labels=None) -> None:
        """Draw these runs (SimResults with a trace), the whole of the longest in view."""
        self.show_data(timeline_data(runs, labels))

    def show_data(self, data: dict) -> None:
        """Draw `timeline_data(...)` made before (the explorer keeps it per run), all of it in view.
        `payload` keeps it as given; `data`, what goes to the browser, has each bar column as one
        binary buffer of float64 (ipywidgets would otherwise walk every number of the lists looking
        for buffers: 9 ms for 5,000 bars, and JSON ten times the size)."""
        self.selected = {}
        self.view = []
        self.payload = data
        self.data = _wire(data)

    @property
    def visible_range(self) -> tuple[int, int]:
        """The cycles on screen: `view`, or the whole run before any zoom."""
        if len(self.view) == 2:
            return self.view[0], self.view[1]
        return 0, int(self.data.get("end", 1)) if self.data else 1


def _wire(data: dict) -> dict:
    runs = [{**run, "events": {k: memoryview(np.asarray(v, np.float64).tobytes()) for k, v in run["events"].items()}}
            for run in data.get("runs", ())]
    return {**data, "runs": runs}


def timeline_widget(res, other=None, labels=None) -> TimelineWidget:
    """The interactive timeline of `res` (and `other` on the same axis, labelled A and B)."""
    runs = [res] if other is None else [res, other]
    if labels is None and other is not None:
        labels = ["A", "B"]
    return TimelineWidget(runs, labels)
