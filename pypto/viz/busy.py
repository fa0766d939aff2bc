"""Busy states: what a view shows while it compiles or simulates.

The compiler and the simulator report their stages as events (`pypto.progress`); a `BusyBar`
turns them into a progress bar with a line of text ("compiling softmax: pass scheduling, 7/24
passes, 0.8 s"), shown only once the work has run `SHOW_AFTER_S` (quick changes never flicker)
and redrawn at most every `REDRAW_S` (each redraw is a widget message).  The explorer keeps one
under its controls, for the recompiles and re-simulations a control starts; `first_render` shows
one in the cell's output during the first compile, when no explorer is on screen yet.
"""
from __future__ import annotations

import contextlib
import html
import time

from ..progress import ProgressEvent, listening

SHOW_AFTER_S = 0.3        # work quicker than this shows no bar
REDRAW_S = 0.1            # at most this often


class BusyBar:
    """A progress bar and a label (ipywidgets), hidden while idle.  `running(what)` is the
    context of one piece of work; `shown` lists the label texts it displayed (for tests)."""

    def __init__(self):
        import ipywidgets as w
        self.bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="220px"))
        self.label = w.HTML()
        self.widget = w.HBox([self.bar, self.label], layout=w.Layout(display="none", align_items="center"))
        self.widget.add_class("pypto-busy")
        self.shown: list[str] = []
        self._t0 = self._drawn = 0.0
        self._what = ""
        self.on_show = None         # called once per piece of work, when the bar first appears

    @property
    def visible(self) -> bool:
        return self.widget.layout.display != "none"

    @contextlib.contextmanager
    def running(self, what: str):
        """Listen to the stages the block runs; hide the bar when it ends (also on an error)."""
        self._t0, self._drawn, self._what = time.perf_counter(), 0.0, what
        try:
            with listening(self.event):
                yield self
        finally:
            self.widget.layout.display = "none"

    def start(self, what: str) -> None:
        """The start of work that runs elsewhere (the explorer's check, in a worker thread): its
        events come through `event` from the event loop; `stop` hides the bar."""
        self._t0, self._drawn, self._what = time.perf_counter(), 0.0, what

    def stop(self) -> None:
        self.widget.layout.display = "none"

    def note(self, detail: str) -> None:
        """Say what the work does now, between stages (drawing a view)."""
        self.event(ProgressEvent(self._what, 0, 0, detail, "", 0.0, False))

    def event(self, ev: ProgressEvent) -> None:
        now = time.perf_counter()
        elapsed = now - self._t0
        if elapsed < SHOW_AFTER_S or (now - self._drawn < REDRAW_S and self.visible):
            return
        self._drawn = now
        steps = f"{ev.done}/{ev.total}" if ev.total else ""
        parts = [p for p in (ev.detail, f"{steps} {ev.unit}".strip() if steps else "", f"{elapsed:.1f} s") if p]
        text = f"{ev.what or self._what}: " + ", ".join(parts)
        self.bar.value = ev.fraction if ev.total else self.bar.value
        self.label.value = f"<span style='color:#555'>{html.escape(text)}</span>"
        if not self.visible:
            self.widget.layout.display = "flex"
            if self.on_show is not None:
                self.on_show()
        self.shown.append(text)


def in_kernel() -> bool:
    """Whether a Jupyter kernel runs this code (a front end shows widgets as they change)."""
    import sys
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None


# An empty output: nothing to see.  (Another mime type than the bar's widget view, so that
# JupyterLab makes a new renderer for each: a widget view renderer once hidden stays hidden.)
HIDDEN = {"text/html": ""}


@contextlib.contextmanager
def first_render(what: str):
    """A `BusyBar` in the cell's output while the block runs (an explorer's first compile, when
    there is no explorer on screen yet to show it in).  In a Jupyter kernel only; elsewhere
    nothing.

    The cell gets one output, `HIDDEN`, at once; the bar replaces it (update_display) when the
    work has run `SHOW_AFTER_S`, and `HIDDEN` comes back when it ends.  So the stored notebook
    holds the same (empty) output however long the compile took (nbclient applies the updates;
    nbval, which ignores them, sees the first one: the same), and a reopened notebook shows
    nothing of it."""
    if not in_kernel():
        yield None
        return
    from IPython.display import display
    handle = display(HIDDEN, raw=True, display_id=True)
    bar = BusyBar()
    bar.widget.add_class("pypto-busy-first")
    bar.on_show = lambda: handle.update(bar.widget)
    try:
        with bar.running(what):
            yield bar
    finally:
        if bar.shown:
            handle.update(HIDDEN, raw=True)
        bar.widget.close()
