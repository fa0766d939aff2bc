"""The explorer: a kernel compiled and simulated live, with a control per compile-time choice.

Layout (one ipywidgets VBox):

    header      kernel, machine, cycles, time, bound, numpy check
    controls    a slider per keyword-only int constant; machine and dtype drop-downs
    tabs        Tensor | Tile | Block | Execution   graphviz views (zoom, "expand all tiles")
                PTO                                  the program, syntax-coloured
                Passes                               every pass; the level's text before/after one
                Timeline | Stats | Roofline          the simulation
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
"""
from __future__ import annotations

import html
import math
import time

import numpy as np

from ..errors import PyptoError, located
from ..gcpause import gc_paused


class ExplorerOptionError(PyptoError, ValueError):
    """A bad option of `pypto.explore` / `Explorer` (an unknown view or dtype, a bad range);
    also a ValueError."""

TABS = ("Tensor", "Tile", "Block", "Execution", "PTO", "Passes", "Timeline", "Stats", "Roofline")
GRAPH_TABS = ("Tensor", "Tile", "Block", "Execution")
SIM_TABS = ("Timeline", "Stats", "Roofline")
# Names accepted by `show=` (and `%%pypto --show`), mapped to tab titles.
TAB_NAMES = {"tensor": "Tensor", "tile": "Tile", "block": "Block", "exec": "Execution",
             "execution": "Execution", "pto": "PTO", "program": "PTO", "passes": "Passes",
             "timeline": "Timeline", "stats": "Stats", "roofline": "Roofline"}
SLIDER_VALUES = tuple(2 ** k for k in range(3, 13))     # 8 .. 4096, when a constant's dim is unknown
FLOAT_DTYPES = ("fp32", "fp16", "bf16")
PTO_TASKS = 4
MAX_CACHED_VIEWS = 64
MAX_CACHED_RESULTS = 48
MAX_PASS_TEXT_LINES = 400
DEBOUNCE_S = 0.1
TIMELINE_DPI = 80          # the static snapshot's PNG timeline
TIMELINE_WIDTH = 1000      # the live SVG timeline, pixels at zoom 100%
OPTION_KEYS = ("ranges", "show", "dtype", "simulate")    # explorer options passed with the constants


def tab_title(name: str) -> str:
    """The tab title for a view name ('tile', 'exec', 'Timeline', ...); KeyError when unknown."""
    if name in TABS:
        return name
    return TAB_NAMES[name.strip().lower()]


# --- slider values ---------------------------------------------------------------------------
def powers_of_two(lo: int, hi: int) -> list[int]:
    """The powers of two in [lo, hi]."""
    lo, hi = max(int(lo), 1), int(hi)
    k = 1 << max(lo - 1, 0).bit_length() if lo > 1 else 1
    out = []
    while k <= hi:
        out.append(k)
        k *= 2
    return out


def range_values(spec) -> list[int]:
    """Slider values of a range: (lo, hi) -> the powers of two in [lo, hi] plus lo and hi;
    (lo, hi, step) -> lo, lo+step, ..., hi; a list -> those values.  Strings "16:256",
    "16:256:16" and "16,32,48" mean the same.  ValueError when malformed."""
    if isinstance(spec, str):
        text = spec.strip()
        if ":" in text:
            spec = tuple(int(p) for p in text.split(":"))
        else:
            spec = [int(p) for p in text.split(",") if p.strip()]
    if isinstance(spec, (list, set, frozenset)):
        values = sorted({int(v) for v in spec})
        if not values or values[0] < 1:
            raise ExplorerOptionError(f"range values must be positive integers, got {spec!r}")
        return values
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise ExplorerOptionError(f"a range is (lo, hi) or (lo, hi, step), got {spec!r}")
    lo, hi = int(spec[0]), int(spec[1])
    if not 1 <= lo <= hi:
        raise ExplorerOptionError(f"a range needs 1 <= lo <= hi, got {lo}:{hi}")
    if len(spec) == 3:
        step = int(spec[2])
        if step < 1:
            raise ExplorerOptionError(f"a range step must be positive, got {step}")
        return list(range(lo, hi + 1, step)) + ([hi] if (hi - lo) % step else [])
    return sorted(set(powers_of_two(lo, hi)) | {lo, hi})


def tiled_dims(kernel, args, consts) -> dict[str, tuple[int, int]]:
    """For each int constant that sets a tile size: (smallest legal value, dim it tiles).

    Found by tracing the kernel twice (tracing is cheap, no compilation): once as is and once
    with the constant doubled; the tile attributes that change belong to the constant, and the
    tensor dim at that position bounds it.  Smallest values follow the alignment rules: a tile
    row is at least 32 bytes, a cube tile at least one 16x16 fractal, other dims 8.  Constants
    that set no tile size are left out.
    """
    try:
        specs = kernel._specs(args)
        base = kernel._trace(specs, kernel._constants(consts))
    except Exception:          # noqa: BLE001 -- a heuristic: no bounds, the caller falls back
        return {}
    out: dict[str, tuple[int, int]] = {}
    for name, value in kernel.int_constants.items():
        v = consts.get(name, value)
        try:
            probe = kernel._trace(specs, kernel._constants({**consts, name: v * 2}))
        except Exception:      # noqa: BLE001
            continue
        if len(probe.nodes) != len(base.nodes):
            continue
        bounds = []
        for a, b in zip(base.nodes, probe.nodes):
            ta, tb = _dims(a.attrs.get("tile")), _dims(b.attrs.get("tile"))
            if ta is None or tb is None or ta == tb or len(ta) != len(tb):
                continue
            for pos, (x, y) in enumerate(zip(ta, tb)):
                if x != y:
                    bounds.append(_tile_bound(base, a, ta, pos))
        bounds = [b for b in bounds if b is not None]
        if bounds:
            lo = max(b[0] for b in bounds)
            hi = max(b[1] for b in bounds)
            out[name] = (min(lo, _pow2_ceil(hi)), hi)
    return out


def _dims(tile):
    """The dims of a tile attribute (a TileSpec, or a plain tuple in older IR)."""
    if tile is None:
        return None
    dims = getattr(tile, "dims", tile)
    return tuple(dims) if isinstance(dims, (tuple, list)) else None


def _pow2_ceil(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _tile_bound(g, node, tile, pos):
    """(smallest legal, dim) of tile position `pos` of a node's tile attribute."""
    shapes = [node.shape] + [g.node(i).shape for i in node.inputs]
    if tile and isinstance(tile[0], (tuple, list)):          # cube: (M, K, N) pairs
        a = g.node(node.inputs[0]).shape if node.inputs else node.shape
        a_trans = bool(node.attrs.get("a_trans"))
        dim = {0: node.shape[-2] if len(node.shape) > 1 else None,
               1: (a[-2] if a_trans else a[-1]) if len(a) > 1 else None,
               2: node.shape[-1]}.get(pos)
        return None if dim is None else (16, dim)
    back = len(tile) - pos                 # the vector tile is aligned to the trailing dims
    dims = [s[-back] for s in shapes if len(s) >= back]
    if not dims:
        return None
    dim = max(dims)
    itemsize = max(node.dtype.itemsize, 1)
    lo = max(32 // itemsize, 1) if pos == len(tile) - 1 else 8
    return (min(lo, dim), dim)



def _running_loop():
    """The kernel's asyncio loop when there is one (a live notebook), else None (scripts, tests)."""
    import asyncio
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None

class Explorer:
    """Compile + simulate `kernel(*args)`; show every level; recompile when a control changes.

    Options (also accepted among the constants of `pypto.explore(kernel, *args, **consts)`):
    `ranges={"TM": (16, 256)}` slider values per constant (see `range_values`), `show=["tile"]`
    views rendered first and on every change, `dtype="fp16"` cast the float arguments,
    `simulate=False` compile only (the simulation tabs say so).
    """

    def __init__(self, kernel, args, machine="a2a3", consts=None, show=None, ranges=None,
                 simulate=True, dtype=None):
        try:
            self._setup(kernel, args, machine, consts, show, ranges, simulate, dtype)
        except PyptoError as e:      # at the user's pypto.explore line, no frame of ours
            raise located(e).with_traceback(None) from None

    def _setup(self, kernel, args, machine, consts, show, ranges, simulate, dtype):
        from ..target.machine import get_machine
        consts = dict(consts or {})
        for key in OPTION_KEYS:      # explorer options among the constants (pypto.explore(**kw))
            if key in consts and key not in kernel.const_params:
                value = consts.pop(key)
                if key == "ranges":
                    ranges = value
                elif key == "show":
                    show = value
                elif key == "dtype":
                    dtype = value
                else:
                    simulate = bool(value)
        self.kernel = kernel
        self.simulate = bool(simulate)
        self._orig_args = tuple(args)
        try:
            self._eager = [tab_title(s) for s in ([show] if isinstance(show, str) else show or [])]
        except KeyError as e:
            raise ExplorerOptionError(f"unknown view {e}; expected some of {', '.join(sorted(TAB_NAMES))}") from None
        try:
            get_machine(machine)
        except PyptoError as e:
            raise e.with_traceback(None) from None
        self._float_dtype = self._common_float_dtype()
        if dtype is not None:
            dtype = str(dtype)
            if dtype not in FLOAT_DTYPES:
                raise ExplorerOptionError(f"unknown dtype {dtype!r}; expected one of {', '.join(FLOAT_DTYPES)}")
            if dtype == self._float_dtype:
                dtype = None
        self._ranges = {}
        for name, spec in (ranges or {}).items():
            if name not in kernel.int_constants:
                raise ExplorerOptionError(f"--range: {name} is not an int constant of {kernel.name}; "
                                 f"expected one of {', '.join(kernel.int_constants) or 'none'}")
            self._ranges[name] = range_values(spec)
        # A default value outside a given range starts at the nearest value in range.
        for name, values in self._ranges.items():
            if name not in consts and kernel.int_constants[name] not in values:
                d = kernel.int_constants[name]
                consts[name] = min(values, key=lambda v: (abs(math.log2(v) - math.log2(max(d, 1))), v))
        self._cast_args: dict = {}
        self._results: dict[tuple, list] = {}     # configuration -> [ck, res]
        self._views: dict[tuple, object] = {}     # (configuration, tab, variant) -> rendered value
        self._rendered: dict[str, tuple] = {}     # tab -> what its widget shows
        self._error: Exception | None = None
        self._syncing = False
        self._timer = None
        self._pending = None
        self._last_activity = 0.0
        self._timing = None
        self._check_time = 0.0
        self._static_cache: tuple | None = None
        self._cfg = (machine, dtype)
        try:
            # The first view may be shown statically (nbconvert): simulate with the trace once.
            ck, res = self._compute(machine, dtype, consts, trace=True)
        except PyptoError as e:
            raise e.with_traceback(None) from None   # nothing to show yet: say why, briefly
        self._set_current(machine, dtype, ck, res)
        self._dims = tiled_dims(kernel, self._args_for(dtype), self._consts) \
            if set(kernel.int_constants) - set(self._ranges) else {}
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
        """The SimResult on display (None when compiled only)."""
        return self._res

    @property
    def consts(self) -> dict:
        return dict(self._consts)

    @property
    def machine(self) -> str:
        return self._ck.machine.name

    @property
    def dtype(self) -> str | None:
        """The float dtype the arguments are cast to, or None for the arguments as given."""
        return self._dtype

    @property
    def args(self) -> tuple:
        """The arguments the kernel on display was compiled and simulated with."""
        return self._args_for(self._dtype)

    @property
    def error(self) -> Exception | None:
        """The error of the last update, or None when it succeeded."""
        return self._error

    def update(self, machine=None, dtype=None, **consts) -> None:
        """Apply changes exactly like a slider release (or a drop-down change); return once the
        view is refreshed.  `dtype="fp32"|"fp16"|"bf16"` casts the float arguments."""
        self._cancel_pending()
        cfg = (machine or self._machine_key, self._dtype if dtype is None else self._norm_dtype(dtype),
               {**self._consts, **consts})
        self._apply(cfg, reraise=True)

    def select(self, title: str) -> None:
        """Select a tab by title or view name ('Timeline', 'tile', ...); renders it."""
        self.tab.selected_index = TABS.index(tab_title(title))

    def view_value(self, title: str):
        """What the tab shows (HTML text) once rendered for the current configuration."""
        t = tab_title(title)
        self._render(t)
        return self.views[t].value

    def text(self) -> str:
        """One deterministic line: configuration and result (what nbval compares)."""
        consts = "".join(f", {k}={v}" for k, v in self._consts.items())
        dtype = f", dtype={self._dtype}" if self._dtype else ""
        head = f"Explorer({self._ck.name}, machine={self._ck.machine.name}{consts}{dtype}): "
        res = self._res
        if res is None:
            line = head + (f"not simulated (compile only), {len(self._ck.program)} instructions in "
                           f"{len(self._ck.program.tasks)} tasks")
        else:
            verdict = {True: "OK", False: "MISMATCH", None: "not checked"}[res.ok]
            line = head + f"{res.cycles} cycles, {res.time_us:.3f} us, check {verdict}"
        if self._error is not None:
            line += f" [last update failed: {type(self._error).__name__}]"
        return line

    def __repr__(self):
        return self.text()

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
        graph (SVG) and the timeline (PNG data URI).  Deterministic for the same configuration."""
        from . import graphs
        from .static import img_html, scroll_box, svg_body
        from .timeline import timeline_png
        key = self._key()
        if self._static_cache and self._static_cache[0] == key:
            return self._static_cache[1]
        parts = [f"<div class='pypto-explorer-static'><div>{self._header_html()}</div>"]
        if self._res is not None:
            self._ensure_trace()
            parts.append(stats_html(self._res))
        else:
            parts.append(f"<p>{html.escape(_NO_SIM)}</p>")
        svg = graphs.to_svg(graphs.level_graph(self._ck, "tensor"))
        parts.append("<h4 style='margin:6px 0 2px 0'>Tensor graph</h4>" + scroll_box(svg_body(svg), 480))
        if self._res is not None:
            parts.append("<h4 style='margin:6px 0 2px 0'>Timeline</h4>" +
                         img_html(timeline_png(self._res, dpi=TIMELINE_DPI), alt="timeline"))
        parts.append("</div>")
        out = "".join(parts)
        self._static_cache = (key, out)
        return out

    # --- compile, simulate, cache ----------------------------------------------------------
    @property
    def _machine_key(self):
        return self._cfg[0]

    def _key(self, machine=None, dtype=None, consts=None) -> tuple:
        if consts is None:
            machine, dtype, consts = self._machine_key, self._dtype, self._consts
        m = machine if isinstance(machine, str) else getattr(machine, "name", str(machine))
        return (m, dtype, tuple(sorted(consts.items())))

    def _common_float_dtype(self) -> str | None:
        from .. import dtypes as dt
        from ..frontend.kernel import as_array
        names = set()
        for a in self._orig_args:
            try:
                d = dt.from_numpy(as_array(a).dtype)
            except Exception:          # noqa: BLE001 (not an array: the compiler will say so)
                continue
            if d is not None and d.is_float:
                names.add(d.name)
        return names.pop() if len(names) == 1 else None

    def _has_float_args(self) -> bool:
        from .. import dtypes as dt
        from ..frontend.kernel import as_array
        for a in self._orig_args:
            try:
                d = dt.from_numpy(as_array(a).dtype)
            except Exception:          # noqa: BLE001
                continue
            if d is not None and d.is_float:
                return True
        return False

    def _norm_dtype(self, dtype):
        if dtype in (None, "as given"):
            return None
        dtype = str(dtype)
        if dtype not in FLOAT_DTYPES:
            raise ExplorerOptionError(f"unknown dtype {dtype!r}; expected one of {', '.join(FLOAT_DTYPES)}")
        return None if dtype == self._float_dtype else dtype

    def _args_for(self, dtype):
        """The arguments with every float array cast to `dtype` (None: as given); cached."""
        if dtype is None:
            return self._orig_args
        hit = self._cast_args.get(dtype)
        if hit is None:
            from .. import dtypes as dt
            from ..frontend.kernel import as_array
            target = dt.parse(dtype).np_dtype
            out = []
            for a in self._orig_args:
                arr = as_array(a)
                d = dt.from_numpy(arr.dtype) if isinstance(arr, np.ndarray) else None
                out.append(arr.astype(target) if d is not None and d.is_float else a)
            hit = self._cast_args[dtype] = tuple(out)
        return hit

    def _compute(self, machine, dtype, consts, trace=False, check_now=True):
        """Compile and time a configuration (cached); its numpy check runs now or, with
        `check_now=False`, later through `_check` (a slider release shows cycles first)."""
        key = self._key(machine, dtype, consts)
        hit = self._results.get(key)
        if hit is None:
            args = self._args_for(dtype)
            # the cyclic GC paused: with a few configurations cached, every collection walks a
            # large heap (about 10% of a slider release)
            with gc_paused():
                t0 = time.perf_counter()
                ck = self.kernel.compile(*args, machine=machine, snapshots=True, **consts)
                t1 = time.perf_counter()
                res = ck.simulate(mode="timing", trace=trace) if self.simulate else None
            self._timing = [t1 - t0, time.perf_counter() - t1, 0.0]
            hit = [ck, res, args]
            self._results[key] = hit
            # The compiler fills in defaults: remember the full configuration under both keys.
            self._results[self._key(machine, dtype, ck.consts)] = hit
            while len(self._results) > 2 * MAX_CACHED_RESULTS:      # drop the oldest
                del self._results[next(iter(self._results))]
        else:
            self._timing = None
        if check_now:
            self._check(hit)
        return hit[0], hit[1]

    def _check(self, hit) -> bool:
        """Run the functional simulation and the numpy check of a result that has none yet."""
        ck, res, args = hit
        if res is None or res.check is not None:
            return False
        with gc_paused():
            t0 = time.perf_counter()
            done = ck.simulate(*args, mode="functional", check=True)
            self._check_time = time.perf_counter() - t0
        res.outputs, res.check = done.outputs, done.check
        return True

    def _finish_check(self, hit):
        """The deferred check of the configuration on display: then its header and stats."""
        try:
            if not self._check(hit) or hit[0] is not self._ck:
                return
            self.header.value = self._header_html()
            for key in [k for k in self._views if len(k) == 3 and k[1] == "Stats"]:
                del self._views[key]
            self._rendered.pop("Stats", None)
            if "Stats" in self._visible():
                self._render("Stats")
        except Exception as e:          # noqa: BLE001 - a callback must not raise
            self._show_error(e)

    def _schedule_check(self, hit):
        """In a live kernel the check runs right after the view is sent (the slider feels
        instant); without an event loop (scripts, tests) it runs now."""
        loop = _running_loop()
        if loop is None:
            self._finish_check(hit)
        else:
            loop.call_soon(self._finish_check, hit)

    def _ensure_trace(self):
        """Give the result on display a trace (it was simulated without one: no view needed it)."""
        res = self._res
        if res is None or res.trace or not res.stats.get("instructions"):
            return
        t0 = time.perf_counter()
        res.trace = self._ck.simulate(*self.args, mode="timing", trace=True).trace
        if self._timing is not None:
            self._timing[1] += time.perf_counter() - t0

    def _set_current(self, machine, dtype, ck, res):
        self._cfg = (machine, dtype)
        self._dtype = dtype
        self._ck, self._res, self._consts = ck, res, dict(ck.consts)

    def _needs_trace(self) -> bool:
        if not hasattr(self, "tab"):
            return True
        return "Timeline" in self._visible()

    def _visible(self) -> list[str]:
        return list(dict.fromkeys([TABS[self.tab.selected_index or 0]] + self._eager))

    def _apply(self, cfg, reraise=False):
        machine, dtype, consts = cfg
        try:
            ck, res = self._compute(machine, dtype, consts, trace=self._needs_trace(), check_now=False)
        except Exception as e:
            # Keep the previous view; the controls go back to the configuration it shows.
            self._error = e
            self._sync_controls()
            self._show_error(e)
            if reraise and not isinstance(e, PyptoError):
                raise
            return
        self._set_current(machine, dtype, ck, res)
        self._error = None
        self._sync_controls()
        self._refresh()
        self._schedule_check(self._results[self._key(machine, dtype, consts)])

    # --- debounce ------------------------------------------------------------------------------
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
        controls = list(self.sliders.values()) + [self.machine_dropdown]
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
        # Graph tabs share one toolbar: zoom (the SVG's size; scroll to pan) and expand.
        self.zoom = w.FloatSlider(value=1.0, min=0.25, max=3.0, step=0.25, description="zoom",
                                  readout_format=".0%", continuous_update=False,
                                  layout=w.Layout(width="300px"))
        self.expand = w.Checkbox(value=False, description="expand all tiles", indent=False,
                                 layout=w.Layout(width="160px"))
        self.zoom.observe(self._on_graph_option, names="value")
        self.expand.observe(self._on_graph_option, names="value")
        toolbar = w.HBox([self.zoom, self.expand])
        zoom_only = w.HBox([self.zoom])
        self.views = {t: w.HTML() for t in TABS}
        self.pass_dropdown = w.Dropdown(description="pass", options=[], layout=w.Layout(width="420px"))
        self.pass_dropdown.observe(self._on_pass, names="value")
        self.pass_diff = w.HTML()
        children = []
        for t in TABS:
            if t in GRAPH_TABS:
                children.append(w.VBox([toolbar, self.views[t]]))
            elif t == "Timeline":
                children.append(w.VBox([zoom_only, self.views[t]]))
            elif t == "Passes":
                children.append(w.VBox([self.views[t], self.pass_dropdown, self.pass_diff]))
            else:
                children.append(self.views[t])
        self.tab = w.Tab(children=children, titles=TABS)
        self.tab.observe(self._on_tab, names="selected_index")
        self.status = w.HTML()
        self.controls = w.HBox(controls, layout=w.Layout(flex_flow="row wrap"))
        self.widget = w.VBox([self.header, self.controls, self.tab, self.status])

    def _options(self, name, value):
        if name in self._ranges:
            values = set(self._ranges[name])
        elif name in self._dims:
            lo, hi = self._dims[name]
            values = set(powers_of_two(lo, _pow2_ceil(hi)))
        else:
            values = set(SLIDER_VALUES)
        return [(str(v), v) for v in sorted(values | {value})]

    def _sync_controls(self):
        self._syncing = True      # programmatic moves must not trigger another compile
        try:
            for name, s in self.sliders.items():
                v = self._consts[name]
                if v not in [o[1] for o in s.options]:
                    s.options = self._options(name, v)
                s.value = v
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
        return (self.machine_dropdown.value, dtype, consts)

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
            self._render(title)
        except Exception as e:          # noqa: BLE001
            self._show_error(e)

    def _on_graph_option(self, change):
        try:
            for t in self._visible():
                if t in GRAPH_TABS or t == "Timeline":
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
        self.header.value = self._header_html()
        if self._needs_trace():
            self._ensure_trace()
        for t in self._visible():
            self._render(t)
        cfg = ", ".join(f"{k}={v}" for k, v in self._consts.items()) or "no constants"
        if self._dtype:
            cfg += f", dtype={self._dtype}"
        if self._timing is None:
            took = "cached"
        else:
            self._timing[2] = time.perf_counter() - t0
            took = "compile {:.2f} s, simulate {:.2f} s, view {:.2f} s".format(*self._timing)
            if not self.simulate:
                took = "compile {:.2f} s, not simulated, view {:.2f} s".format(self._timing[0], self._timing[2])
        self.status.value = f"<span style='color:#555'>ready: {html.escape(cfg)} ({took})</span>"

    def _show_error(self, e):
        kind = type(e).__name__
        self.status.value = (f"<pre style='color:#c00; white-space:pre-wrap; margin:0'>"
                             f"{html.escape(f'{kind}: {e}')}\n(showing the previous configuration)</pre>")

    def _variant(self, title):
        if title in GRAPH_TABS:
            return (self.expand.value and title != "Tensor", self.zoom.value)
        if title == "Timeline":
            return self.zoom.value
        return None

    def _render(self, title):
        key = self._key()
        variant = self._variant(title)
        if self._rendered.get(title) == (key, variant):
            return
        if title in GRAPH_TABS:
            expand, zoom = variant
            svg = self._cached_view(key, title, expand)
            value = svg if svg.startswith("<pre") else self._graph_html(title, svg, expand, zoom)
        else:
            value = self._cached_view(key, title, variant)
        self.views[title].value = value
        self._rendered[title] = (key, variant)
        if title == "Passes":
            self._sync_passes()

    def _cached_view(self, key, title, variant):
        ck = (key, title, variant)
        value = self._views.get(ck)
        if value is None:
            try:
                value = self._view(title, variant)
            except Exception as e:     # e.g. no `dot` binary: say so inside the tab
                return f"<pre style='color:#c00'>{html.escape(f'{type(e).__name__}: {e}')}</pre>"
            self._views[ck] = value
            if len(self._views) > MAX_CACHED_VIEWS:        # drop the oldest rendering
                del self._views[next(iter(self._views))]
        return value

    # --- views -------------------------------------------------------------------------------
    def _view(self, title, variant):
        from . import graphs
        from .static import img_html, pto_html, pto_legend_html, svg_body
        ck, res = self._ck, self._res
        if title in GRAPH_TABS:
            return svg_body(graphs.to_svg(graphs.level_graph(ck, title.lower(), expand=bool(variant))))
        if title == "PTO":
            return pto_legend_html() + pto_html(ck.program.text(max_tasks=PTO_TASKS))
        if title == "Passes":
            return passes_html(ck)
        if res is None:
            return f"<p style='color:#555'>{html.escape(_NO_SIM)}</p>"
        if title == "Timeline":
            # A hand-drawn SVG (milliseconds, where a matplotlib PNG takes ~100 ms), shown as an
            # <img>; zoom stretches the time axis, scroll to pan.
            from .static import scroll_box, svg_img_html
            from .timeline import timeline_svg
            self._ensure_trace()
            svg = timeline_svg(res, width=int(TIMELINE_WIDTH * (variant or 1.0)), tooltips=False)
            return scroll_box(svg_img_html(svg, alt="timeline"), 720)
        if title == "Roofline":
            from .roofline import roofline_png
            return img_html(roofline_png(res, program=ck.program), alt="roofline")
        return stats_html(res)

    def _graph_html(self, title, svg, expand, zoom):
        from . import graphs
        from .static import scroll_box, zoom_svg
        note = ""
        level = title.lower()
        if title != "Tensor":
            if expand:
                note = (f"all tiles/tasks drawn, at most {graphs.MAX_EXPANDED_NODES} nodes "
                        f"(a note in the graph says when some were left out)")
            elif graphs.is_folded(self._ck, level):
                note = ("folded view: repeated tiles/tasks are drawn once (\"x N\"); "
                        "tick 'expand all tiles' to draw them all")
        note_html = f"<div style='color:#555; font-size:11px'>{html.escape(note)}</div>" if note else ""
        return note_html + scroll_box(zoom_svg(svg, zoom))

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
        key = (self._key(), "pass", k)
        hit = self._views.get(key)
        if hit is None:
            hit = self._views[key] = pass_diff_html(self._ck, k)
        return hit

    def _header_html(self) -> str:
        ck, res = self._ck, self._res
        dtype = f" ({html.escape(self._dtype)})" if self._dtype else ""
        head = f"<b>{html.escape(ck.name)}</b>{dtype} on {html.escape(ck.machine.name)} &nbsp;|&nbsp; "
        if res is None:
            return head + (f"not simulated (compile only) &nbsp;|&nbsp; {len(ck.program)} instructions in "
                           f"{len(ck.program.tasks)} tasks")
        ok = res.ok
        verdict = ("<span style='color:#080'>check OK</span>" if ok else
                   "<span style='color:#c00'>check MISMATCH</span>" if ok is False else
                   "<span style='color:#888'>checking…</span>")
        bound = res.stats.get("bound")
        bound = f" &nbsp;|&nbsp; bound: {html.escape(bound)}" if bound else ""
        return (head + f"<b>{res.cycles}</b> cycles &nbsp;|&nbsp; {res.time_us:.3f} us{bound}"
                       f" &nbsp;|&nbsp; {verdict}")


_NO_SIM = "not simulated: compiled only (--no-sim / simulate=False); no timeline, stats or roofline"


def _interesting_pass(log) -> int:
    """The pass shown first: the first one within a level that changed the node count."""
    for k, r in enumerate(log):
        if "->" not in r.level and r.nodes_before != r.nodes_after:
            return k
    return 0 if log else None


def level_text(g) -> str:
    """The text form of one level's IR for the Passes tab (the PTO program: its first tasks)."""
    from ..ir.program import Program
    if isinstance(g, Program):
        return g.text(max_tasks=PTO_TASKS)
    text = str(g)
    lines = text.splitlines()
    if len(lines) > MAX_PASS_TEXT_LINES:
        text = "\n".join(lines[:MAX_PASS_TEXT_LINES] + [f"... {len(lines) - MAX_PASS_TEXT_LINES} more lines"])
    return text


def passes_html(ck) -> str:
    """The pass log as a table: level, pass, nodes before -> after, time."""
    rows = []
    for k, r in enumerate(ck.pass_log):
        bold = "" if r.nodes_before == r.nodes_after else "; font-weight:bold"
        rows.append(f"<tr><td>{k + 1}</td><td>{html.escape(r.level)}</td><td>{html.escape(r.name)}</td>"
                    f"<td style='text-align:right{bold}'>{r.nodes_before} -&gt; {r.nodes_after}</td>"
                    f"<td style='text-align:right; color:#777'>{r.ms:.1f} ms</td></tr>")
    head = ("<tr><th>#</th><th style='text-align:left'>level</th><th style='text-align:left'>pass</th>"
            "<th>nodes before -&gt; after</th><th>time</th></tr>")
    note = ("<div style='color:#555; font-size:11px; margin:4px 0'>Pick a pass to see its level's text "
            "before and after it (a lowering shows both levels side by side).</div>")
    return f"<table class='pypto-passes'>{head}{''.join(rows)}</table>{note}"


def pass_diff_html(ck, k: int) -> str:
    """The text of the level before and after pass `k` of `ck.pass_log`: a coloured unified diff
    within a level, both texts side by side across a lowering."""
    from .static import diff_html, side_by_side_html
    snaps = ck.snapshots
    if not snaps:
        return "<p style='color:#555'>compiled without snapshots: compile with snapshots=True</p>"
    name, after = snaps[k]
    before = ck.traced if k == 0 else snaps[k - 1][1]
    a, b = level_text(before), level_text(after)
    title = f"<b>{html.escape(name)}</b> ({html.escape(ck.pass_log[k].level)})"
    if getattr(before, "level", None) != getattr(after, "level", None):
        return title + side_by_side_html(a, b, f"before: {before.level}", f"after: {after.level}")
    return title + diff_html(a, b, f"before {name}", f"after {name}")


def stats_html(res) -> str:
    """The stats of a SimResult as an HTML table."""
    rows = res.stats_rows()
    body = "".join(f"<tr><th style='text-align:left; padding-right:1em'>{html.escape(str(k))}</th>"
                   f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"

