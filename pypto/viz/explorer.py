"""The explorer: a kernel compiled and simulated live, with a slider per tile-size constant.

Layout (one ipywidgets VBox): a header (kernel, machine, cycles, time, check), the sliders, a Tab
with a view per IR level plus timeline and stats, and a status line.  Only the selected tab is
rendered after a change (results are cached per tab and configuration), so a slider release
costs one compile, one simulation and one view.
"""
from __future__ import annotations

import functools
import html
import time

from ..errors import PyptoError

TABS = ("Tensor", "Tile", "Block", "Execution", "PTO", "Timeline", "Stats")
# Names accepted by `show=` (and `%%pypto --show`), mapped to tab titles.
TAB_NAMES = {"tensor": "Tensor", "tile": "Tile", "block": "Block", "exec": "Execution",
             "execution": "Execution", "pto": "PTO", "program": "PTO", "timeline": "Timeline",
             "stats": "Stats"}
SLIDER_VALUES = tuple(2 ** k for k in range(3, 13))     # 8 .. 4096
PTO_TASKS = 4
MAX_CACHED_VIEWS = 64


def tab_title(name: str) -> str:
    """The tab title for a view name ('tile', 'exec', 'Timeline', ...); KeyError when unknown."""
    if name in TABS:
        return name
    return TAB_NAMES[name.strip().lower()]


class Explorer:
    """Compile + simulate `kernel(*args)`; show every level; recompile when a slider is released."""

    def __init__(self, kernel, args, machine="a2a3", consts=None, show=None):
        self.kernel = kernel
        self.args = tuple(args)
        self.machine = machine
        self._results: dict[tuple, tuple] = {}      # configuration -> (ck, res)
        self._views: dict[tuple, object] = {}       # (configuration, tab) -> rendered value
        self._rendered: dict[str, tuple] = {}       # tab -> configuration its widget shows
        self._error: Exception | None = None
        self._syncing = False
        try:
            self._eager = [tab_title(s) for s in (show or [])]
        except KeyError as e:
            raise ValueError(f"unknown view {e}; expected some of {', '.join(sorted(TAB_NAMES))}") from None
        try:
            self._ck, self._res = self._compute(dict(consts or {}))
        except PyptoError as e:
            raise e.with_traceback(None) from None   # nothing to show yet: say why, briefly
        self._consts = dict(self._ck.consts)
        self._build()
        if self._eager:
            self.tab.selected_index = TABS.index(self._eager[0])
        self._refresh()

    # --- public ----------------------------------------------------------------------------
    @property
    def ck(self):
        """The CompiledKernel on display."""
        return self._ck

    @property
    def res(self):
        """The SimResult on display."""
        return self._res

    @property
    def consts(self) -> dict:
        return dict(self._consts)

    @property
    def error(self) -> Exception | None:
        """The error of the last update, or None when it succeeded."""
        return self._error

    def update(self, **consts) -> None:
        """Apply constant changes exactly like a slider release; return once the view is fresh."""
        self._apply({**self._consts, **consts}, reraise=True)

    def text(self) -> str:
        """One deterministic line: configuration and result (what nbval compares)."""
        consts = "".join(f", {k}={v}" for k, v in self._consts.items())
        res = self._res
        verdict = {True: "OK", False: "MISMATCH", None: "not checked"}[res.ok]
        line = (f"Explorer({self._ck.name}, machine={self._ck.machine.name}{consts}): "
                f"{res.cycles} cycles, {res.time_us:.3f} us, check {verdict}")
        if self._error is not None:
            line += f" [last update failed: {type(self._error).__name__}]"
        return line

    def __repr__(self):
        return self.text()

    def _repr_mimebundle_(self, include=None, exclude=None):
        data = dict(self.widget._repr_mimebundle_(include=include, exclude=exclude) or {})
        data["text/plain"] = self.text()
        return data

    # --- compile, simulate, cache ----------------------------------------------------------
    def _key(self, consts) -> tuple:
        return tuple(sorted(consts.items()))

    def _compute(self, consts):
        key = self._key(consts)
        hit = self._results.get(key)
        if hit is None:
            t0 = time.perf_counter()
            ck = self.kernel.compile(*self.args, machine=self.machine, **consts)
            t1 = time.perf_counter()
            res = ck.simulate(*self.args)
            self._timing = (t1 - t0, time.perf_counter() - t1)
            hit = self._results[key] = (ck, res)
            # The compiler fills in defaults: remember the full configuration under both keys.
            self._results[self._key(ck.consts)] = hit
        else:
            self._timing = None
        return hit

    def _apply(self, consts, reraise=False):
        try:
            ck, res = self._compute(consts)
        except Exception as e:
            # Keep the previous view; the sliders go back to the configuration it shows.
            self._error = e
            self._sync_sliders()
            self._show_error(e)
            if reraise and not isinstance(e, PyptoError):
                raise
            return
        self._ck, self._res, self._consts = ck, res, dict(ck.consts)
        self._error = None
        self._sync_sliders()
        self._refresh()

    # --- widgets -----------------------------------------------------------------------------
    def _build(self):
        import ipywidgets as w   # lazily: importing pypto must not import ipywidgets
        self.header = w.HTML()
        self.sliders = {}
        for name in self.kernel.int_constants:
            value = self._consts[name]
            s = w.SelectionSlider(options=self._options(value), value=value, description=name,
                                  continuous_update=False, layout=w.Layout(width="420px"))
            s.observe(functools.partial(self._on_slider, name), names="value")
            self.sliders[name] = s
        children = [w.Image(format="png") if t == "Timeline" else w.HTML() for t in TABS]
        self.tab = w.Tab(children=children, titles=TABS)
        self.tab.observe(self._on_tab, names="selected_index")
        self.status = w.HTML()
        sliders = w.HBox(list(self.sliders.values()), layout=w.Layout(flex_flow="row wrap"))
        self.widget = w.VBox([self.header, sliders, self.tab, self.status])

    @staticmethod
    def _options(value):
        values = sorted(set(SLIDER_VALUES) | {value})
        return [(str(v), v) for v in values]

    def _sync_sliders(self):
        self._syncing = True      # programmatic moves must not trigger another compile
        try:
            for name, s in self.sliders.items():
                v = self._consts[name]
                if v not in [o[1] for o in s.options]:
                    s.options = self._options(v)
                s.value = v
        finally:
            self._syncing = False

    def _on_slider(self, name, change):
        if self._syncing:
            return
        try:     # never raise out of a widget callback: the status line tells what went wrong
            self._apply({**self._consts, name: change["new"]})
        except Exception as e:          # noqa: BLE001 (a bug in a view: still keep the UI alive)
            self._show_error(e)

    def _on_tab(self, change):
        try:
            self._render(TABS[change["new"]])
        except Exception as e:          # noqa: BLE001
            self._show_error(e)

    def _refresh(self):
        self.header.value = self._header_html()
        wanted = [TABS[self.tab.selected_index or 0]] + self._eager
        for t in dict.fromkeys(wanted):
            self._render(t)
        cfg = ", ".join(f"{k}={v}" for k, v in self._consts.items()) or "no constants"
        took = "cached" if self._timing is None else \
            "compile {:.2f} s, simulate {:.2f} s".format(*self._timing)
        self.status.value = f"<span style='color:#555'>ready: {html.escape(cfg)} ({took})</span>"

    def _show_error(self, e):
        kind = type(e).__name__
        self.status.value = (f"<pre style='color:#c00; white-space:pre-wrap; margin:0'>"
                             f"{html.escape(f'{kind}: {e}')}\n(showing the previous configuration)</pre>")

    def _render(self, title):
        key = self._key(self._consts)
        if self._rendered.get(title) == key:
            return
        value = self._views.get((key, title))
        if value is None:
            try:
                value = self._views[(key, title)] = self._view(title)
                if len(self._views) > MAX_CACHED_VIEWS:        # drop the oldest rendering
                    del self._views[next(iter(self._views))]
            except Exception as e:     # e.g. no `dot` binary: say so inside the tab
                value = f"<pre style='color:#c00'>{html.escape(f'{type(e).__name__}: {e}')}</pre>"
                if title == "Timeline":
                    self.status.value = value
                    return
        self.tab.children[TABS.index(title)].value = value
        self._rendered[title] = key

    # --- views -------------------------------------------------------------------------------
    def _view(self, title):
        from . import graphs
        ck, res = self._ck, self._res
        if title in ("Tensor", "Tile", "Block", "Execution"):
            svg = graphs.to_svg(graphs.level_graph(ck, title.lower()))
            return f"<div style='overflow:auto; max-height:640px'>{svg[svg.find('<svg'):]}</div>"
        if title == "PTO":
            return f"<pre style='max-height:640px; overflow:auto'>{html.escape(ck.program.text(max_tasks=PTO_TASKS))}</pre>"
        if title == "Timeline":
            from .timeline import timeline_png
            return timeline_png(res)
        return stats_html(res)

    def _header_html(self) -> str:
        ck, res = self._ck, self._res
        ok = res.ok
        verdict = ("<span style='color:#080'>check OK</span>" if ok else
                   "<span style='color:#c00'>check MISMATCH</span>" if ok is False else "not checked")
        return (f"<b>{html.escape(ck.name)}</b> on {html.escape(ck.machine.name)} &nbsp;|&nbsp; "
                f"<b>{res.cycles}</b> cycles &nbsp;|&nbsp; {res.time_us:.3f} us &nbsp;|&nbsp; {verdict}")


def stats_html(res) -> str:
    """The stats of a SimResult as an HTML table."""
    s = res.stats
    rows = [("cycles", s["cycles"]), ("time", f"{res.time_us:.3f} us at {res.machine.clock_ghz} GHz"),
            ("instructions", s["instructions"]), ("tasks", s["tasks"]),
            ("cores used", f"{s['cores_used']['AIC']} AIC + {s['cores_used']['AIV']} AIV")]
    rows += [(f"busy {pipe}", f"{pct:.1f} %") for pipe, pct in s["pipe_busy_pct"].items()]
    rows += [(f"bytes {path}", f"{n / 1024:.1f} KiB") for path, n in s["bytes_by_path"].items()]
    rows.append(("HBM", f"{s['hbm_bytes'] / 2**20:.2f} MiB at {s['hbm_gbps']:.1f} GB/s "
                        f"({s['hbm_util_pct']:.1f}% of {res.machine.hbm_gbps:.0f} GB/s)"))
    if s.get("flops"):
        rows.append(("compute", f"{s['tflops']:.2f} TFLOP/s ({s['cube_util_pct']:.1f}% of cube peak)"))
    for name, c in (res.check or {}).items():
        verdict = "OK" if c["ok"] else "MISMATCH"
        rows.append((f"check {name}", f"{verdict} vs numpy (max abs err {c['max_abs_err']:.3g}, rtol {c['rtol']:g})"))
    body = "".join(f"<tr><th style='text-align:left; padding-right:1em'>{html.escape(str(k))}</th>"
                   f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"
