"""The explorer: a kernel compiled and simulated live, with a control per compile-time choice.

Layout (one ipywidgets VBox):

    header      kernel, machine, cycles, time, bound, numpy check
    controls    a slider per keyword-only int constant; machine and dtype drop-downs
    (error)     why the last move failed, the control named, the largest value that compiles
    (busy)      a progress bar while a change compiles and simulates (busy.py)
    tabs        Tensor | Tile | Block | Execution   graphviz views, fitted; pan, zoom, search
                                                     (graph_widget.py); "expand all tiles"
                PTO                                  the program, syntax-coloured
                Passes                               every pass; the level's text before/after one
                Timeline                             every core and pipe, interactive (timeline_widget.py):
                                                     zoom, pan, hover; a click shows the PTO and kernel line
                Stats | Roofline                     the simulation
                Advice                               what bounds it; changes re-simulated, only those
                                                     that help; a button sets the sliders to the best
    status      what the last change cost, or why it failed

A change (slider release, drop-down) recompiles and re-simulates; `Explorer.update(...)` applies
one synchronously, exactly like a slider release.  Only what is on screen is computed: the
selected tab is rendered (each rendering is cached per configuration), and the simulation records
a trace only when the Timeline needs it.  Results are cached per configuration, so going back to
a value seen before is instant.  In a live kernel, changes arriving in a burst are debounced:
the first one after a quiet period is applied at once, the others are coalesced and only the
last one is computed, `DEBOUNCE_S` after the burst ends.

Without a widget front end (nbconvert HTML, GitHub, nbviewer) the explorer shows a static
snapshot (`text/html`: header, stats, the Tensor graph, the timeline) and one `text/plain` line.

A dynamic kernel (a `pypto.DYNAMIC` first dim: `ck.dynamic`) gets one more slider, the size of
that dim, labelled with its symbol and the parameters that have it, e.g. `N (rows of x, out)`:
the powers of two from 1 to max(8192, the arrays' rows), the arrays' own rows (the default) and
any size passed.  Its keyword is the symbol: `pypto.explore(k, x, out, N=7)`,
`Explorer.update(N=7)` (`size=7` means the same, and is the only spelling when a constant of the
kernel is itself named N), `ranges={"N": (1, 65536)}` / `%%pypto --range N=1:65536` its values.
Moving it never recompiles: one compile serves every size, and a move re-simulates the program of
a call on that many rows (`ck.program_for(N)`, the `res.program` of the Timeline, Stats and
Roofline tabs), while the graph and PTO tabs keep showing the compiled chunk's levels (a note
says so).  At a size other than the arrays' own there are no user arrays of that size, so the
simulation and its numpy check run on arrays made from the user's (`sized_args`): their first N
rows when N is smaller, else all of their rows followed by N - rows rows drawn from them at random
(`numpy.random.default_rng(SIZE_SEED)`, the same rows for every dynamic parameter); the header
and the Stats tab say which data was checked.  The user's arrays are never written.
"""
from __future__ import annotations

import html
import time

from ..errors import PyptoError
from ..progress import listening
from . import views as _views_mod
from .session import (FLOAT_DTYPES, SLIDER_VALUES, ExplorerOptionError, Session, _pow2_ceil, powers_of_two,
                      size_values)
from .views import (_NO_SIM, GRAPH_TABS, SIM_TABS, TABS, _interesting_pass, graph_note_html, header_html,
                    instruction_html, pass_diff_html, tab_html, tab_title)

MAX_CACHED_VIEWS = 64
DEBOUNCE_S = 0.1
ERROR_COLOR = "#c00"


_CHECKER: list = []      # the worker thread the explorers' numpy checks run in (made when first needed)


def _checker():
    if not _CHECKER:
        from concurrent.futures import ThreadPoolExecutor
        _CHECKER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="pypto-check"))
    return _CHECKER[0]


def _running_loop():
    """The kernel's asyncio loop when there is one (a live notebook), else None (scripts, tests)."""
    import asyncio
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class Explorer(Session):
    """Compile + simulate `kernel(*args)`; show every level; recompile when a control changes
    (a `Session` with widgets: see the module docstring; the options are the session's)."""

    def _first_compute(self, name: str):
        from .busy import first_render
        return first_render(f"{name}: first compile and simulation")

    def _ready(self) -> None:
        self._checking: dict[int, tuple] = {}     # id(run) -> (run, future of its check in the worker, token)
        self._check_token = None
        self._views: dict[tuple, object] = {}     # (configuration, tab, variant) -> rendered value
        self._rendered: dict[str, tuple] = {}     # tab -> what its widget shows
        self._syncing = False
        self._timer = None
        self._pending = None
        self._last_activity = 0.0
        self._static_cache: tuple | None = None
        self._build()
        if self._eager:
            self.tab.selected_index = TABS.index(self._eager[0])
        self._refresh()

    # --- public ----------------------------------------------------------------------------
    def update(self, machine=None, dtype=None, size=None, **consts) -> None:
        """Apply changes exactly like a slider release (or a drop-down change); return once the
        view is refreshed.  `dtype="fp32"|"fp16"|"bf16"` casts the float arguments.  Of a dynamic
        kernel, `N=7` (the keyword is `size_name`, the dynamic dim's symbol) or `size=7` moves the
        size slider: a re-simulation on 7 rows, never a recompile.  A bad value (an unknown or
        illegal constant, a size that is not a positive integer) is shown in the status line and
        kept in `error`, like a bad slider value; the view stays on the previous configuration."""
        self._cancel_pending()
        name = self.size_name
        if name is not None and name != "size" and name in consts:
            value = consts.pop(name)
            if size is not None and size != value:
                self._fail(ExplorerOptionError(f"two sizes given: size={size!r} and {name}={value!r}",
                                               expected="one of them", got=f"size={size!r}, {name}={value!r}"))
                return
            size = value
        cfg = (machine or self._machine_key, self._dtype if dtype is None else self._norm_dtype(dtype),
               {**self._consts, **consts}, self._size if size is None else size)
        self._apply(cfg, reraise=True)

    def select(self, title: str) -> None:
        """Select a tab by title or view name ('Timeline', 'tile', ...); renders it."""
        self.tab.selected_index = TABS.index(tab_title(title))

    def view_value(self, title: str):
        """What the tab shows (HTML text) once rendered for the current configuration."""
        self._settle()
        t = tab_title(title)
        self._render(t)
        return self.views[t].value + (self.graphs[t].svg if t in GRAPH_TABS else "")


    def _repr_mimebundle_(self, include=None, exclude=None):
        data = dict(self.widget._repr_mimebundle_(include=include, exclude=exclude) or {})
        data["text/plain"] = self.text()
        try:
            data["text/html"] = self.static_html()
        except Exception as e:          # noqa: BLE001 (no `dot`?): the widget still shows
            data["text/html"] = f"<pre>{html.escape(self.text())}\n{html.escape(type(e).__name__)}: " \
                                f"{html.escape(str(e))}</pre>"
        return data


    def static_html(self) -> str:
        """A self-contained snapshot of the current configuration: header, stats, the Tensor
        graph and the timeline as pictures (views.static_html).  Deterministic for the same
        configuration; cached."""
        self._settle()
        key = self._run_key()
        if self._static_cache and self._static_cache[0] == key:
            return self._static_cache[1]
        out = _views_mod.static_html(self)
        self._static_cache = (key, out)
        return out

    def _view_key(self, title) -> tuple:
        """What a tab's rendering depends on: the graph, PTO and Passes tabs show the compiled
        levels (the same for every size), the simulation tabs the run on display."""
        return self._run_key() if title in SIM_TABS else self._key()


    def _finish_check(self, hit):
        """The deferred check of the configuration on display, run now (its progress in the busy
        bar when it takes a while: a large kernel's check takes seconds): then its header and stats."""
        try:
            with self.busy.running(f"{self.kernel.name}: numpy check"):
                checked = self._check(hit)
            if checked:
                self._check_shown(hit)
        except Exception as e:          # noqa: BLE001 - a callback must not raise
            self._show_error(e)

    def _check_shown(self, hit):
        """A run's check has arrived: the header and stats of the run on display say so."""
        if hit.res is not self._res:
            return
        self.header.value = header_html(self)
        for key in [k for k in self._views if len(k) == 3 and k[1] == "Stats"]:
            del self._views[key]
        self._rendered.pop("Stats", None)
        if "Stats" in self._visible():
            self._render("Stats")

    def _schedule_check(self, hit):
        """In a live kernel the check runs in a worker thread once the view is sent: the slider
        feels instant, and the kernel keeps answering the controls while a large kernel's check
        takes seconds (numpy lets go of the GIL); its result is shown from the event loop, or by
        the first public reader that needs it (`_settle`: `text()`, `res`, the snapshot), so a
        notebook's next cell sees it as before.  A check that starts after its configuration left
        the screen is skipped (it runs again if it comes back).  Without an event loop (scripts,
        tests) the check runs now."""
        loop = _running_loop()
        if loop is None:
            self._finish_check(hit)
            return
        if hit.res is None or hit.res.check is not None or id(hit) in self._checking:
            return

        token = self._check_token = object()        # the check whose progress the busy bar shows
        self.busy.start(f"{self.kernel.name}: numpy check")

        def values():
            if hit.res is not self._res:
                return None
            # (its steps reach the busy bar through the event loop: listeners are per thread)
            with listening(lambda ev: loop.call_soon_threadsafe(self._check_progress, token, ev)):
                return self._check_values(hit)
        future = _checker().submit(values)
        self._checking[id(hit)] = (hit, future, token)
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(self._settle_one, id(hit)))

    def _check_progress(self, token, ev) -> None:
        if token is self._check_token:
            self.busy.event(ev)

    def _settle_one(self, key) -> None:
        """Show the result of a check run in the worker (waiting for it if it still runs)."""
        entry = self._checking.pop(key, None)
        if entry is None:               # shown already
            return
        hit, future, token = entry
        if token is self._check_token:
            self._check_token = None
            self.busy.stop()
        try:
            got = future.result()
            if got is not None and hit.res.check is None:
                self._store_check(hit, got)
                self._check_shown(hit)
        except Exception as e:          # noqa: BLE001 - a callback must not raise
            self._show_error(e)

    def _settle(self) -> None:
        for key in list(getattr(self, "_checking", ())):
            self._settle_one(key)


    def _needs_trace(self) -> bool:
        if not hasattr(self, "tab"):
            return True
        return "Timeline" in self._visible()

    def _visible(self) -> list[str]:
        return list(dict.fromkeys([TABS[self.tab.selected_index or 0]] + self._eager))

    def _apply(self, cfg, reraise=False):
        machine, dtype, consts, size = cfg
        what = self._cfg_text(cfg)
        self.status.value = f"<span style='color:#555'>updating: {html.escape(what)} ...</span>"
        with self.busy.running(f"{self.kernel.name} ({what})"):
            try:
                ck, res, n = self._compute(machine, dtype, consts, size, trace=self._needs_trace(),
                                           check_now=False)
            except Exception as e:
                self._fail(e, cfg)
                if reraise and not isinstance(e, PyptoError):
                    raise
                return
            run = self._last_run
            self._set_current(machine, dtype, ck, res, n)
            self._error = None
            self._sync_controls()
            self._clear_control_error()
            self.busy.note("drawing the views")
            self._refresh()
        self._schedule_check(run)


    def _fail(self, e, cfg=None):
        """Keep the previous view; the controls go back to the configuration it shows; the
        status line says what went wrong, and so does a line right under the controls, naming
        the control that was moved and, for a constant, the largest value that compiles."""
        self._error = e
        self._sync_controls()
        self._show_error(e)
        if cfg is not None:
            self._show_control_error(e, cfg)

    # --- errors next to the controls ----------------------------------------------------------
    def _moved(self, cfg) -> list[str]:
        """The controls `cfg` changes, against the configuration on display."""
        machine, dtype, consts, size = cfg
        moved = [k for k in self.kernel.int_constants if k in consts and consts[k] != self._consts.get(k)]
        if self.size_slider is not None and size is not None and size != self._size:
            moved.append(self.size_name)
        m = machine if isinstance(machine, str) else getattr(machine, "name", str(machine))
        if m != self._machine_key:
            moved.append("machine")
        if dtype != self._dtype:
            moved.append("dtype")
        return moved


    def _fit_values(self, name: str) -> list[int]:
        return [v for _, v in self.sliders[name].options]

    def _show_control_error(self, e, cfg) -> None:
        moved = self._moved(cfg)
        what = ", ".join(f"{k}={cfg[2][k]}" if k in cfg[2] else k for k in moved) or self._cfg_text(cfg)
        kind = type(e).__name__
        first = (e.message if isinstance(e, PyptoError) else str(e)).splitlines()[0] if str(e) else kind
        lines = [f"<b>{html.escape(what)}</b>: {html.escape(kind)}: {html.escape(first)}"]
        self._fit = None
        tile = [k for k in moved if k in self.sliders]
        if len(tile) == 1 and isinstance(e, PyptoError):
            name = tile[0]
            others = ", ".join(f"{k}={v}" for k, v in cfg[2].items() if k != name and k in self.sliders)
            with_others = f" (with {others})" if others else ""
            v = self.largest_fitting(cfg, name)
            if v is not None:
                self._fit = (name, v)
                lines.append(f"the largest {html.escape(name)} that compiles{html.escape(with_others)} is "
                             f"<b>{v}</b>")
            else:
                lines.append(f"no smaller {html.escape(name)} compiles{html.escape(with_others)} either")
        for k in tile:
            self.sliders[k].style.handle_color = ERROR_COLOR
        shown = self._consts_text()
        lines.append(f"<span style='color:#555'>showing {html.escape(shown)}; the full message is below the "
                     "views</span>")
        self.control_error.value = (f"<div class='pypto-control-error' style='color:{ERROR_COLOR}; "
                                    "margin:2px 0 4px 8px'>" + "<br>".join(lines) + "</div>")
        self.fit_button.description = f"use {self._fit[0]}={self._fit[1]}" if self._fit else ""
        self.fit_button.layout.display = "" if self._fit else "none"
        self.control_error_box.layout.display = "flex"

    def _clear_control_error(self) -> None:
        self.control_error.value = ""
        self.control_error_box.layout.display = "none"
        self._fit = None
        for s in self.sliders.values():
            s.style.handle_color = None

    def _on_fit(self, _button) -> None:
        if self._fit is not None:
            name, v = self._fit
            if self.sliders[name].value == v:   # on display already: nothing to recompile
                self._clear_control_error()
            else:
                self.sliders[name].value = v    # as if the user moved it there


    def _schedule(self, cfg):
        """Apply a change from a control: at once without an event loop (tests, scripts), else
        debounced on the kernel's loop (see the module docstring)."""
        loop = _running_loop()
        if loop is None:
            self._apply(cfg)
            return
        now = time.monotonic()
        quiet = now - self._last_activity >= DEBOUNCE_S and self._timer is None
        self._last_activity = now
        self._pending = cfg
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(0.0 if quiet else DEBOUNCE_S, self._flush)

    def _flush(self):
        self._timer = None
        cfg, self._pending = self._pending, None
        if cfg is None:
            return
        try:    # never raise out of a callback: the status line tells what went wrong
            self._apply(cfg)
        except Exception as e:          # noqa: BLE001
            self._show_error(e)
        self._last_activity = time.monotonic()

    def _cancel_pending(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending = None

    # --- widgets -----------------------------------------------------------------------------
    def _build(self):
        import ipywidgets as w   # lazily: importing pypto must not import ipywidgets
        from ..target.machine import MACHINES
        self.header = w.HTML()
        self.size_slider = None
        controls = []
        if self._size is not None:        # a dynamic kernel: the rows of its dynamic dim
            self.size_slider = w.SelectionSlider(
                options=self._size_options(self._size), value=self._size, description=self.size_label,
                continuous_update=False, style={"description_width": "initial"},
                layout=w.Layout(width="420px"))
            self.size_slider.observe(self._on_control, names="value")
            controls.append(self.size_slider)
        self.sliders = {}
        for name in self.kernel.int_constants:
            value = self._consts[name]
            s = w.SelectionSlider(options=self._options(name, value), value=value, description=name,
                                  continuous_update=False, layout=w.Layout(width="380px"))
            s.observe(self._on_control, names="value")
            self.sliders[name] = s
        names = list(MACHINES)
        if self.machine not in names:
            names.append(self.machine)
        self.machine_dropdown = w.Dropdown(options=names, value=self.machine, description="machine",
                                           layout=w.Layout(width="200px"))
        self.machine_dropdown.observe(self._on_control, names="value")
        controls += list(self.sliders.values()) + [self.machine_dropdown]
        self.dtype_dropdown = None
        if self._has_float_args():
            # never a list mixing (label, value) pairs and plain strings: ipywidgets reads it as
            # all labels and then finds no value "as given" (a TraitError)
            opts = list(FLOAT_DTYPES) if self._float_dtype else ["as given", *FLOAT_DTYPES]
            value = self._dtype or self._float_dtype or "as given"
            self.dtype_dropdown = w.Dropdown(options=opts, value=value, description="dtype",
                                             layout=w.Layout(width="180px"))
            self.dtype_dropdown.observe(self._on_control, names="value")
            controls.append(self.dtype_dropdown)
        # Graph tabs: "expand all tiles" for all of them; each graph pans, zooms and searches
        # itself (graph_widget.py), opened fitted to its view
        self.expand = w.Checkbox(value=False, description="expand all tiles", indent=False,
                                 layout=w.Layout(width="160px"))
        self.expand.observe(self._on_graph_option, names="value")
        toolbar = w.HBox([self.expand])
        self.views = {t: w.HTML() for t in TABS}
        from .graph_widget import GraphWidget
        self.graphs = {t: GraphWidget() for t in GRAPH_TABS}
        from .timeline_widget import TimelineWidget
        self.timeline = TimelineWidget()           # zoom, pan, hover and click of its own
        self.timeline.observe(self._on_timeline_select, names="selected")
        self.timeline_info = w.HTML()
        self._timeline_of = None
        self.pass_dropdown = w.Dropdown(description="pass", options=[], layout=w.Layout(width="420px"))
        self.pass_dropdown.observe(self._on_pass, names="value")
        self.pass_diff = w.HTML()
        children = []
        for t in TABS:
            if t in GRAPH_TABS:
                children.append(w.VBox(([toolbar] if t != "Tensor" else []) + [self.views[t], self.graphs[t]]))
            elif t == "Timeline":
                children.append(w.VBox([self.views[t], self.timeline, self.timeline_info]))
            elif t == "Passes":
                children.append(w.VBox([self.views[t], self.pass_dropdown, self.pass_diff]))
            elif t == "Advice":
                self.advice_button = w.Button(description="", button_style="success",
                                              layout=w.Layout(display="none", width="auto"))
                self.advice_button.on_click(self._on_advice_apply)
                children.append(w.VBox([self.views[t], self.advice_button]))
            else:
                children.append(self.views[t])
        self.tab = w.Tab(children=children, titles=TABS)
        self.tab.observe(self._on_tab, names="selected_index")
        self.status = w.HTML()
        self.controls = w.HBox(controls, layout=w.Layout(flex_flow="row wrap"))
        # right under the controls: why the last move failed, and the work in progress
        from .busy import BusyBar
        self.control_error = w.HTML()
        self.fit_button = w.Button(description="", button_style="warning", layout=w.Layout(display="none"))
        self.fit_button.on_click(self._on_fit)
        self.control_error_box = w.HBox([self.control_error, self.fit_button],
                                        layout=w.Layout(display="none", align_items="center"))
        self._fit = None
        self.busy = BusyBar()
        self.widget = w.VBox([self.header, self.controls, self.control_error_box, self.busy.widget, self.tab,
                              self.status])

    def _options(self, name, value):
        if name in self._ranges:
            values = set(self._ranges[name])
        elif name in self._dims:
            lo, hi = self._dims[name]
            values = set(powers_of_two(lo, _pow2_ceil(hi)))
        else:
            values = set(SLIDER_VALUES)
        return [(str(v), v) for v in sorted(values | {value})]

    def _size_options(self, value):
        values = size_values(self._own_size, value) if self._size_range is None else \
            sorted(set(self._size_range) | {value})
        return [(str(v), v) for v in values]

    def _sync_controls(self):
        self._syncing = True      # programmatic moves must not trigger another compile
        try:
            for name, s in self.sliders.items():
                v = self._consts[name]
                if v not in [o[1] for o in s.options]:
                    s.options = self._options(name, v)
                s.value = v
            s = self.size_slider
            if s is not None:
                if self._size not in [o[1] for o in s.options]:
                    s.options = self._size_options(self._size)
                s.value = self._size
            self.machine_dropdown.value = self.machine
            if self.dtype_dropdown is not None:
                self.dtype_dropdown.value = self._dtype or self._float_dtype or "as given"
        finally:
            self._syncing = False

    def _controls_cfg(self):
        consts = {**self._consts, **{name: s.value for name, s in self.sliders.items()}}
        dtype = self._dtype
        if self.dtype_dropdown is not None:
            dtype = self._norm_dtype(self.dtype_dropdown.value)
        size = self.size_slider.value if self.size_slider is not None else None
        return (self.machine_dropdown.value, dtype, consts, size)

    def _on_control(self, change):
        if self._syncing:
            return
        try:     # never raise out of a widget callback: the status line tells what went wrong
            self._schedule(self._controls_cfg())
        except Exception as e:          # noqa: BLE001 (a bug in a view: still keep the UI alive)
            self._show_error(e)

    def _on_tab(self, change):
        try:
            title = TABS[change["new"]]
            if title == "Timeline":
                self._ensure_trace()
            if title == "Advice" and self._rendered.get(title) != (self._view_key(title), None):
                with self.busy.running(f"advising {self.kernel.name}"):
                    self._render(title)
            else:
                self._render(title)
        except Exception as e:          # noqa: BLE001
            self._show_error(e)

    def _sync_advice_button(self):
        """The button under the Advice tab: 'use TN=1024' for a top suggestion the sliders can make."""
        adv = self.advice(compute=False)
        best = adv.best if adv is not None else None
        if best is not None and self.applicable(best):
            change = ", ".join(f"{k}={v}" for k, v in best.consts.items() if self._consts.get(k) != v)
            self.advice_button.description = f"use {change} ({best.cycles:,} cycles)"
            self.advice_button.layout.display = "inline-flex"
            self._advice_change = {k: v for k, v in best.consts.items() if self._consts.get(k) != v}
        else:
            self.advice_button.layout.display = "none"
            self._advice_change = None

    def _on_advice_apply(self, _button) -> None:
        """Move the sliders to the top suggestion (one recompile, as a move of several sliders)."""
        change = getattr(self, "_advice_change", None)
        if not change:
            return
        try:
            self._syncing = True
            for name, v in change.items():
                s = self.sliders[name]
                if v not in [o[1] for o in s.options]:
                    s.options = self._options(name, v)
                s.value = v
        finally:
            self._syncing = False
        try:
            self._schedule(self._controls_cfg())
        except Exception as e:          # noqa: BLE001
            self._show_error(e)

    def _on_graph_option(self, change):
        try:
            for t in self._visible():
                if t in GRAPH_TABS:
                    self._render(t)
        except Exception as e:          # noqa: BLE001
            self._show_error(e)

    def _on_pass(self, change):
        if self._syncing or change["new"] is None:
            return
        try:
            self.pass_diff.value = self._pass_diff(change["new"])
        except Exception as e:          # noqa: BLE001
            self._show_error(e)

    def _refresh(self):
        t0 = time.perf_counter()
        self.header.value = header_html(self)
        if self._needs_trace():
            self._ensure_trace()
        for t in self._visible():
            self._render(t)
        cfg = self._cfg_text((self._machine_key, self._dtype, self._consts, self._size))
        if self._timing is None:
            took = "cached"
        else:
            self._timing[2] = time.perf_counter() - t0
            took = "compile {:.2f} s, simulate {:.2f} s, view {:.2f} s".format(*self._timing)
            if not self._recompiled:         # another size of a dynamic kernel: its one compile
                took = "no recompile, simulate {:.2f} s, view {:.2f} s".format(*self._timing[1:])
            if not self.simulate:
                took = "compile {:.2f} s, not simulated, view {:.2f} s".format(self._timing[0], self._timing[2])
                if not self._recompiled:
                    took = "no recompile, not simulated, view {:.2f} s".format(self._timing[2])
        self.status.value = f"<span style='color:#555'>ready: {html.escape(cfg)} ({took})</span>"

    def _show_error(self, e):
        kind = type(e).__name__
        self.status.value = (f"<pre style='color:#c00; white-space:pre-wrap; margin:0'>"
                             f"{html.escape(f'{kind}: {e}')}\n(showing the previous configuration)</pre>")

    def _variant(self, title):
        if title in GRAPH_TABS:
            return self.expand.value and title != "Tensor"
        return None

    def _render(self, title):
        key = self._view_key(title)
        variant = self._variant(title)
        if self._rendered.get(title) == (key, variant):
            return
        if title in GRAPH_TABS:
            svg = self._cached_view(key, title, variant)
            failed = svg.startswith("<pre")            # no `dot`?  the message instead of a graph
            value = svg if failed else graph_note_html(self, title, variant)
            self.graphs[title].svg = "" if failed else svg
        elif title == "Timeline":
            value = self._timeline_view()
        else:
            value = self._cached_view(key, title, variant)
        self.views[title].value = value
        self._rendered[title] = (key, variant)
        if title == "Passes":
            self._sync_passes()
        if title == "Advice":
            self._sync_advice_button()

    def _cached_view(self, key, title, variant):
        ck = (key, title, variant)
        value = self._views.get(ck)
        if value is None:
            try:
                value = tab_html(self, title, variant)
            except Exception as e:     # e.g. no `dot` binary: say so inside the tab
                return f"<pre style='color:#c00'>{html.escape(f'{type(e).__name__}: {e}')}</pre>"
            self._keep_view(ck, value)
        return value

    def _keep_view(self, key, value):
        """Keep a rendering (the oldest go beyond MAX_CACHED_VIEWS); return it."""
        self._views[key] = value
        if len(self._views) > MAX_CACHED_VIEWS:
            del self._views[next(iter(self._views))]
        return value

    # --- views -------------------------------------------------------------------------------

    def _timeline_view(self) -> str:
        """The Timeline tab: the interactive timeline (timeline_widget.py) of the run on display,
        every core and pipe; the HTML above it only says when there is nothing to draw."""
        res = self._res
        if res is None:
            self.timeline.layout.display = "none"
            return f"<p style='color:#555'>{html.escape(_NO_SIM)}</p>"
        self._ensure_trace()
        if self._timeline_of is not res:
            key = (self._view_key("Timeline"), "Timeline", "data")   # kept like the other views
            data = self._views.get(key)
            if data is None:
                from .timeline import timeline_data
                data = self._keep_view(key, timeline_data([res]))
            self.timeline.show_data(data)
            self._timeline_of = res
            self.timeline_info.value = ""
        self.timeline.layout.display = ""
        return ""

    def _on_timeline_select(self, change) -> None:
        """A click on a bar: its instruction in the PTO program and its kernel line, under the
        timeline."""
        try:
            self.timeline_info.value = instruction_html(self, change["new"])
        except Exception as e:          # noqa: BLE001 - a callback must not raise
            self._show_error(e)


    def _sync_passes(self):
        """Fill the pass drop-down for the kernel on display (keeping the selected pass)."""
        log = self._ck.pass_log
        options = [(f"{k + 1:>2}. {r.level}: {r.name} ({r.nodes_before} -> {r.nodes_after})", k)
                   for k, r in enumerate(log)]
        old = self.pass_dropdown.value
        self._syncing = True
        try:
            self.pass_dropdown.options = options
            if old is None or old >= len(options):
                old = _interesting_pass(log)
            self.pass_dropdown.value = old
        finally:
            self._syncing = False
        self.pass_diff.value = self._pass_diff(old) if options else ""

    def _pass_diff(self, k) -> str:
        key = (self._key(), "pass", k)          # the compiled levels: the same for every size
        hit = self._views.get(key)
        if hit is None:
            hit = self._views[key] = pass_diff_html(self._ck, k)
        return hit

