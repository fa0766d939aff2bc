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
FIT_SEARCH_S = 3.0         # a constant that does not compile: how long to look for the largest that does
ERROR_COLOR = "#c00"
TIMELINE_DPI = 80          # the static snapshot's PNG timeline
OPTION_KEYS = ("ranges", "show", "dtype", "simulate", "size")  # explorer options passed with the constants
SIZE_MAX = 8192            # the size slider's powers of two go up to max(SIZE_MAX, the arrays' rows)
SIZE_SEED = 0              # the rows drawn for a size above the arrays' own (see `sized_args`)
MAX_MADE_BYTES = 2 ** 30   # arrays made for a size: at most this many bytes in all
MAX_CACHED_SIZES = 16      # simulated sizes kept per compiled configuration


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


# --- the size of a dynamic dim --------------------------------------------------------------
def size_values(own: int | None, *more) -> list[int]:
    """The size slider's values: the powers of two from 1 to max(SIZE_MAX, own), own and `more`."""
    top = max(SIZE_MAX, own or 0)
    return sorted(set(powers_of_two(1, top)) | {v for v in (own, *more) if v is not None})


def check_size(n, what: str = "N") -> int:
    """`n` as a positive int; ExplorerOptionError otherwise (0, negative, a float, a string, a bool)."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ExplorerOptionError(f"{what} must be a positive integer (rows of the dynamic dim)",
                                  expected=f"{what.split(' ')[0]}=1, 2, ...", got=repr(n))
    return int(n)


def sized_args(args, names, dynamic, n: int, seed: int = SIZE_SEED) -> tuple:
    """The arguments of a call on `n` rows of the dynamic dim, made from `args` (named `names`;
    `dynamic` the names with the dynamic dim, all of the same R rows): for n <= R their first n
    rows, else their R rows followed by n - R of them drawn at random
    (`numpy.random.default_rng(seed)`, the same rows for every dynamic argument, so that rows of
    different arguments stay together).  Deterministic; always copies; the other arguments as given."""
    from ..frontend.kernel import as_array
    arrays = [as_array(a) if name in dynamic else a for name, a in zip(names, args)]
    rows = next(a.shape[0] for name, a in zip(names, arrays) if name in dynamic)
    idx = np.arange(min(n, rows))
    if n > rows:
        idx = np.concatenate([idx, np.random.default_rng(seed).integers(0, rows, n - rows)])
    return tuple(np.take(a, idx, axis=0) if name in dynamic else a for name, a in zip(names, arrays))


def pieces_text(ck, n: int) -> str:
    """How a call on n rows runs: 'runs 2 × 2048 + 1 × 1024 rows' (`CompiledKernel.pieces_for`)."""
    counts: dict[int, int] = {}
    for _, rows in ck.pieces_for(n):
        counts[rows] = counts.get(rows, 0) + 1
    return "runs " + " + ".join(f"{k} \u00d7 {rows}" for rows, k in counts.items()) + (
        " row" if list(counts) == [1] else " rows")


def tiled_dims(kernel, args, consts) -> dict[str, tuple[int, int]]:
    """For each int constant that sets a tile size: (smallest legal value, dim it tiles).

    Found by tracing the kernel twice (tracing is cheap, no compilation): once as is and once
    with the constant doubled; the tile attributes that change belong to the constant, and the
    tensor dim at that position bounds it.  Smallest values follow the alignment rules: a tile
    row is at least 32 bytes, a cube tile at least one 16x16 fractal, other dims 8.  Constants
    that set no tile size are left out.
    """
    from ..compiler.dynamic import CHUNK
    from ..frontend.dynamic import DYNAMIC
    try:
        specs = kernel._specs(args)
        # a pypto.DYNAMIC dim is traced at the rows of the chunk it is compiled for
        chunk = CHUNK if any(s.shape and s.shape[0] is DYNAMIC for s in specs) else None
        base = kernel._trace(specs, kernel._constants(consts), chunk=chunk)
    except Exception:          # noqa: BLE001 -- a heuristic: no bounds, the caller falls back
        return {}
    out: dict[str, tuple[int, int]] = {}
    for name, value in kernel.int_constants.items():
        v = consts.get(name, value)
        try:
            probe = kernel._trace(specs, kernel._constants({**consts, name: v * 2}), chunk=chunk)
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
    `simulate=False` compile only (the simulation tabs say so); of a dynamic kernel,
    `size=7` (or `N=7`, the size's symbol) the rows of its dynamic dim to start at (see the
    module docstring).
    """

    def __init__(self, kernel, args, machine="a2a3", consts=None, show=None, ranges=None,
                 simulate=True, dtype=None, size=None):
        try:
            self._setup(kernel, args, machine, consts, show, ranges, simulate, dtype, size)
        except PyptoError as e:      # at the user's pypto.explore line, no frame of ours
            raise located(e).with_traceback(None) from None

    def _setup(self, kernel, args, machine, consts, show, ranges, simulate, dtype, size):
        from ..frontend.dynamic import SIZE_NAME
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
                elif key == "size":
                    size = value
                else:
                    simulate = bool(value)
        dyn_params = kernel.dynamic_params(*args)
        if dyn_params and SIZE_NAME in consts and SIZE_NAME not in kernel.const_params:
            value = consts.pop(SIZE_NAME)        # the size by its symbol: pypto.explore(k, x, out, N=7)
            if size is not None and size != value:
                raise ExplorerOptionError(f"two sizes given: size={size!r} and {SIZE_NAME}={value!r}",
                                          expected="one of them", got=f"size={size!r}, {SIZE_NAME}={value!r}")
            size = value
        if size is not None:
            if not dyn_params:
                raise ExplorerOptionError(f"{kernel.name} has no pypto.DYNAMIC dim: size= does not apply",
                                          expected="no size", got=f"size={size!r}")
            size = check_size(size, SIZE_NAME)
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
        self._size_range = None
        for name, spec in (ranges or {}).items():
            if dyn_params and name in (SIZE_NAME, "size") and name not in kernel.int_constants:
                self._size_range = range_values(spec)       # the size slider's values
                continue
            if name not in kernel.int_constants:
                names = list(kernel.int_constants) + ([SIZE_NAME] if dyn_params else [])
                raise ExplorerOptionError(f"--range: {name} is not an int constant of {kernel.name}; "
                                 f"expected one of {', '.join(names) or 'none'}")
            self._ranges[name] = range_values(spec)
        # A default value outside a given range starts at the nearest value in range.
        for name, values in self._ranges.items():
            if name not in consts and kernel.int_constants[name] not in values:
                d = kernel.int_constants[name]
                consts[name] = min(values, key=lambda v: (abs(math.log2(v) - math.log2(max(d, 1))), v))
        self._cast_args: dict = {}
        self._sized: dict[tuple, tuple] = {}      # (dtype, size) -> arguments made at that size
        self._own_size: int | None = None         # the rows of the arguments' dynamic dim
        self._dyn_params: tuple = ()              # the parameters with the dynamic dim
        self._size: int | None = None             # the size on display (None: not dynamic)
        self._recompiled = True
        # compile configuration -> _Config (the compiled kernel and its runs per size)
        self._results: dict[tuple, _Config] = {}
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
            ck, res, n = self._compute(machine, dtype, consts, size, trace=True)
        except PyptoError as e:
            raise e.with_traceback(None) from None   # nothing to show yet: say why, briefly
        self._set_current(machine, dtype, ck, res, n)
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
        """The arguments the kernel on display was compiled and simulated with (of a dynamic
        kernel at a size other than the arrays' own: the arrays made at that size, `sized_args`)."""
        return self._args_at(self._dtype, self._size)

    @property
    def size(self) -> int | None:
        """The rows of the dynamic dim on display; None when the kernel has no pypto.DYNAMIC dim."""
        return self._size

    @property
    def size_name(self) -> str | None:
        """The keyword of the size in `update` and `text` (the dynamic dim's symbol, 'N'; 'size'
        when a constant of the kernel has the symbol's name); None when the kernel is not dynamic."""
        return self._size_words(self._ck.dynamic)[0]

    @property
    def size_label(self) -> str | None:
        """The size slider's label: 'N (rows of x, out)'; None when the kernel is not dynamic."""
        return self._size_words(self._ck.dynamic)[1]

    def _size_words(self, info) -> tuple:
        if info is None:
            return None, None
        name = info.symbol if info.symbol not in self.kernel.const_params else "size"
        return name, f"{name} (rows of {', '.join(info.params)})"

    @property
    def error(self) -> Exception | None:
        """The error of the last update, or None when it succeeded."""
        return self._error

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
        t = tab_title(title)
        self._render(t)
        return self.views[t].value + (self.graphs[t].svg if t in GRAPH_TABS else "")

    def text(self) -> str:
        """One deterministic line: configuration and result (what nbval compares)."""
        consts = "".join(f", {k}={v}" for k, v in self._consts.items())
        dtype = f", dtype={self._dtype}" if self._dtype else ""
        size = f", {self.size_name}={self._size}" if self._size is not None else ""
        head = f"Explorer({self._ck.name}, machine={self._ck.machine.name}{consts}{size}{dtype}): "
        res = self._res
        if res is None:
            program = self._program()
            line = head + (f"not simulated (compile only), {len(program)} instructions in "
                           f"{len(program.tasks)} tasks")
        else:
            verdict = {True: "OK", False: "MISMATCH", None: "not run yet"}[res.ok]
            data = f" on {self._data_text()}" if self._size is not None else ""
            line = head + f"{res.cycles} cycles, {res.time_us:.3f} us, check {verdict}{data}"
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
        from .static import png_picture_html, scroll_box, svg_picture_html
        from .timeline import timeline_png
        key = self._run_key()
        if self._static_cache and self._static_cache[0] == key:
            return self._static_cache[1]
        parts = [f"<div class='pypto-explorer-static'><div>{self._header_html()}</div>"]
        if self._res is not None:
            self._ensure_trace()
            parts.append(stats_html(self._res, self._size_rows()))
        else:
            parts.append(f"<p>{html.escape(_NO_SIM)}</p>")
        # pictures an untrusted notebook shows too (static.py); no kernel lines in the graph: the
        # snapshot stays the same when the kernel's cell gets another number
        svg = graphs.to_svg(graphs.tensor_graph(self._ck.tensor_graph, locations=False))
        parts.append("<h4 style='margin:6px 0 2px 0'>Tensor graph</h4>" + self._dynamic_note_html()
                     + scroll_box(svg_picture_html(svg, f"Tensor graph of {self._ck.name}"), 480))
        if self._res is not None:
            parts.append("<h4 style='margin:6px 0 2px 0'>Timeline</h4>" +
                         png_picture_html(timeline_png(self._res, dpi=TIMELINE_DPI), f"timeline of {self._ck.name}"))
        parts.append("</div>")
        out = "".join(parts)
        self._static_cache = (key, out)
        return out

    # --- compile, simulate, cache ----------------------------------------------------------
    @property
    def _machine_key(self):
        return self._cfg[0]

    def _key(self, machine=None, dtype=None, consts=None) -> tuple:
        """The key of a compile configuration (the one on display by default)."""
        if consts is None:
            machine, dtype, consts = self._machine_key, self._dtype, self._consts
        m = machine if isinstance(machine, str) else getattr(machine, "name", str(machine))
        return (m, dtype, tuple(sorted(consts.items())))

    def _run_key(self) -> tuple:
        """The key of the run on display: its compile configuration and the size (None: static)."""
        return self._key() + (self._size,)

    def _view_key(self, title) -> tuple:
        """What a tab's rendering depends on: the graph, PTO and Passes tabs show the compiled
        levels (the same for every size), the simulation tabs the run on display."""
        return self._run_key() if title in SIM_TABS else self._key()

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

    def _args_at(self, dtype, n):
        """The arguments of a run: `_args_for(dtype)` at the arrays' own size (or of a static
        kernel), else the arrays made at n rows (`sized_args`; the last few sizes cached)."""
        args = self._args_for(dtype)
        if n is None or n == self._own_size:
            return args
        hit = self._sized.get((dtype, n))
        if hit is None:
            while len(self._sized) >= 4:      # large arrays: keep a few
                del self._sized[next(iter(self._sized))]
            hit = self._sized[(dtype, n)] = sized_args(args, self.kernel.tensor_params, self._dyn_params, n)
        return hit

    def _resolve_size(self, ck, size) -> int | None:
        """The size of a run of `ck`: `size` checked (a positive int whose arrays can be made), the
        arrays' own rows when None; None for a kernel without a dynamic dim."""
        info = ck.dynamic
        if info is None:
            if size is not None:
                raise ExplorerOptionError(f"{ck.name} has no pypto.DYNAMIC dim: a size does not apply",
                                          expected="no size", got=f"size={size!r}")
            return None
        if self._own_size is None:
            from ..frontend.kernel import as_array
            self._dyn_params = info.params
            k = list(self.kernel.tensor_params).index(info.params[0])
            self._own_size = int(as_array(self._orig_args[k]).shape[0])
        if size is None:
            return self._own_size
        n = check_size(size, self._size_words(info)[1])
        if n != self._own_size:
            from ..frontend.kernel import as_array
            row_bytes = sum(as_array(a).nbytes // max(as_array(a).shape[0], 1)
                            for name, a in zip(self.kernel.tensor_params, self._orig_args) if name in info.params)
            if n * row_bytes > MAX_MADE_BYTES:
                name = self._size_words(info)[0]
                raise ExplorerOptionError(
                    f"{name}={n}: the arrays made for that many rows would take "
                    f"{n * row_bytes / 2 ** 30:.1f} GiB", expected=f"at most {MAX_MADE_BYTES // 2 ** 30} GiB, "
                    f"{name} <= {MAX_MADE_BYTES // max(row_bytes, 1)}", got=f"{name}={n}")
        return n

    def _timing_run(self, ck, n, trace):
        """The timing simulation of `ck` (of a dynamic kernel: of the call on n rows)."""
        if n is None:
            return ck.simulate(mode="timing", trace=trace)
        return ck.simulate(mode="timing", trace=trace, size=n)

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

    def _compute(self, machine, dtype, consts, size=None, trace=False, check_now=True):
        """Compile (cached per configuration) and time a run (cached per configuration and size;
        a dynamic kernel compiles once for every size); the run's numpy check runs now or, with
        `check_now=False`, later through `_check` (a slider release shows cycles first).
        Returns (compiled kernel, result, size)."""
        key = self._key(machine, dtype, consts)
        entry = self._results.get(key)
        # the cyclic GC paused: with a few configurations cached, every collection walks a
        # large heap (about 10% of a slider release)
        with gc_paused():
            t0 = time.perf_counter()
            if entry is None:
                ck = self.kernel.compile(*self._args_for(dtype), machine=machine, snapshots=True, **consts)
                entry = _Config(ck)
                self._results[key] = entry
                # The compiler fills in defaults: remember the full configuration under both keys.
                self._results[self._key(machine, dtype, ck.consts)] = entry
                while len(self._results) > 2 * MAX_CACHED_RESULTS:      # drop the oldest
                    del self._results[next(iter(self._results))]
                recompiled = True
            else:
                recompiled = False
            ck = entry.ck
            n = self._resolve_size(ck, size)
            run = entry.runs.get(n)
            t1 = time.perf_counter()
            if run is None:
                res = self._timing_run(ck, n, trace) if self.simulate else None
                run = entry.runs[n] = _Run(ck, res, dtype, n)
                while len(entry.runs) > MAX_CACHED_SIZES:
                    del entry.runs[next(iter(entry.runs))]
                self._timing = [t1 - t0 if recompiled else 0.0, time.perf_counter() - t1, 0.0]
                self._recompiled = recompiled
            else:
                self._timing = None
        self._last_run = run
        if check_now:
            self._check(run)
        return ck, run.res, n

    def _check(self, run) -> bool:
        """Run the functional simulation and the numpy check of a result that has none yet."""
        ck, res = run.ck, run.res
        if res is None or res.check is not None:
            return False
        args = self._args_at(run.dtype, run.size)
        with gc_paused():
            t0 = time.perf_counter()
            done = ck.simulate(*args, mode="functional", check=True)
            self._check_time = time.perf_counter() - t0
        res.outputs, res.check = done.outputs, done.check
        return True

    def _finish_check(self, hit):
        """The deferred check of the configuration on display: then its header and stats."""
        try:
            if not self._check(hit) or hit.res is not self._res:
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
        res.trace = self._timing_run(self._ck, self._size, trace=True).trace
        if self._timing is not None:
            self._timing[1] += time.perf_counter() - t0

    def _set_current(self, machine, dtype, ck, res, size=None):
        self._cfg = (machine, dtype)
        self._dtype = dtype
        self._ck, self._res, self._consts, self._size = ck, res, dict(ck.consts), size

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

    def _cfg_text(self, cfg) -> str:
        machine, dtype, consts, size = cfg
        text = ", ".join(f"{k}={v}" for k, v in consts.items()) or "no constants"
        if size is not None and self.size_name is not None:
            text += f", {self.size_name}={size}"
        if dtype:
            text += f", dtype={dtype}"
        m = machine if isinstance(machine, str) else getattr(machine, "name", str(machine))
        return text + ("" if m == self._machine_key else f", machine={m}")

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

    def largest_fitting(self, cfg, name: str) -> int | None:
        """The largest value of constant `name` below the one `cfg` asks for (among its slider's
        values) with which the kernel compiles, the other constants as in `cfg`; None when none
        does within `FIT_SEARCH_S` seconds."""
        machine, dtype, consts, size = cfg
        want = consts[name]
        values = sorted((v for _, v in self.sliders[name].options if v < want), reverse=True)
        t0 = time.perf_counter()
        for v in values:
            if time.perf_counter() - t0 > FIT_SEARCH_S:
                return None
            try:
                self.kernel.compile(*self._args_for(dtype), machine=machine, snapshots=True, **{**consts, name: v})
            except PyptoError:
                continue
            return v
        return None

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

    def _consts_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self._consts.items()) or "the previous configuration"

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
            self._render(title)
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
        self.header.value = self._header_html()
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
            value = svg if failed else self._graph_note_html(title, variant)
            self.graphs[title].svg = "" if failed else svg
        elif title == "Timeline":
            value = self._timeline_view()
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
            return self._dynamic_note_html() + pto_legend_html() + pto_html(ck.program.text(max_tasks=PTO_TASKS))
        if title == "Passes":
            return passes_html(ck)
        if res is None:
            return f"<p style='color:#555'>{html.escape(_NO_SIM)}</p>"
        if title == "Roofline":
            from .roofline import roofline_png
            return img_html(roofline_png(res, program=ck.program if res.program is None else res.program), alt="roofline")
        return stats_html(res, self._size_rows())

    def _timeline_view(self) -> str:
        """The Timeline tab: the interactive timeline (timeline_widget.py) of the run on display,
        every core and pipe; the HTML above it only says when there is nothing to draw."""
        res = self._res
        if res is None:
            self.timeline.layout.display = "none"
            return f"<p style='color:#555'>{html.escape(_NO_SIM)}</p>"
        self._ensure_trace()
        if self._timeline_of is not res:
            self.timeline.show([res])
            self._timeline_of = res
            self.timeline_info.value = ""
        self.timeline.layout.display = ""
        return ""

    def _on_timeline_select(self, change) -> None:
        """A click on a bar: its instruction in the PTO program and its kernel line, under the
        timeline."""
        try:
            self.timeline_info.value = self._instruction_html(change["new"])
        except Exception as e:          # noqa: BLE001 - a callback must not raise
            self._show_error(e)

    def _instruction_html(self, sel) -> str:
        if not sel or self._res is None:
            return ""
        program = self._res.program if self._res.program is not None else self._ck.program
        task = program.tasks[sel["task"]]
        ins = task.instrs[sel["index"]]
        from .static import pto_line_html
        rows = [f"<b>task {task.id} instruction {sel['index']}</b> on {html.escape(sel['core'])} "
                f"{html.escape(sel['pipe'])}, cycles {sel['start']}&ndash;{sel['end']}",
                f"<code style='white-space:pre'>{pto_line_html(ins.text())}</code>"]
        if ins.loc is not None:
            src = ins.loc.source_line().strip()
            rows.append(f"kernel line {html.escape(ins.loc.short())}"
                        + (f": <code>{html.escape(src)}</code>" if src else ""))
        return ("<div class='pypto-timeline-selected' style='margin-top:4px'>"
                + "".join(f"<div>{r}</div>" for r in rows) + "</div>")

    def _graph_note_html(self, title, expand) -> str:
        """What the HTML above a graph says (the graph itself is the tab's GraphWidget)."""
        from . import graphs
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
        return self._dynamic_note_html() + note_html

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

    def _header_html(self) -> str:
        ck, res = self._ck, self._res
        dtype = f" ({html.escape(self._dtype)})" if self._dtype else ""
        head = f"<b>{html.escape(ck.name)}</b>{dtype} on {html.escape(ck.machine.name)} &nbsp;|&nbsp; "
        if self._size is not None:      # the size on display and how the call runs it
            head += (f"<b>{html.escape(self.size_name)} = {self._size}</b> row{'s' if self._size != 1 else ''} "
                     f"<span style='color:#555'>({html.escape(pieces_text(ck, self._size))})</span>"
                     f" &nbsp;|&nbsp; ")
        if res is None:
            program = self._program()
            return head + (f"not simulated (compile only) &nbsp;|&nbsp; {len(program)} instructions in "
                           f"{len(program.tasks)} tasks")
        ok = res.ok
        verdict = ("<span style='color:#080'>check OK</span>" if ok else
                   "<span style='color:#c00'>check MISMATCH</span>" if ok is False else
                   "<span style='color:#888'>checking…</span>")
        if self._size is not None:      # which data the numpy check ran on
            verdict += f" <span style='color:#555'>on {html.escape(self._data_text())}</span>"
        bound = res.stats.get("bound")
        bound = f" &nbsp;|&nbsp; bound: {html.escape(bound)}" if bound else ""
        return (head + f"<b>{res.cycles}</b> cycles &nbsp;|&nbsp; {res.time_us:.3f} us{bound}"
                       f" &nbsp;|&nbsp; {verdict}")

    # --- a dynamic kernel's size ------------------------------------------------------------------
    def _program(self):
        """The program of the run on display (of a dynamic kernel: the call on its size)."""
        if self._size is None:
            return self._ck.program
        return self._ck.program_for(self._size)

    def _data_text(self) -> str:
        """The data the run on display simulated and checked (of a dynamic kernel)."""
        n, own = self._size, self._own_size
        if n == own:
            return f"your arrays ({own} rows)"
        if n < own:
            return f"rows 0:{n} of your arrays"
        return f"{n} rows made from your arrays: their {own}, then {n - own} drawn from them (seed {SIZE_SEED})"

    def _size_rows(self) -> list[tuple[str, str]]:
        """Rows of the Stats table of a dynamic kernel: the size, how the call runs, the data."""
        if self._size is None:
            return []
        return [(self.size_name, f"{self._size} rows ({pieces_text(self._ck, self._size)})"),
                ("data", self._data_text() + ("" if self._size == self._own_size else
                                              "; outputs not written to your arrays"))]

    def _dynamic_note_html(self) -> str:
        """The note of the compiled levels' tabs of a dynamic kernel (the same for every size)."""
        info = self._ck.dynamic
        if info is None:
            return ""
        note = (f"The levels of the program for {info.chunk} rows (the compiled chunk). {info.describe()}. "
                f"Timeline, Stats and Roofline show the call on the chosen {self.size_name}.")
        return f"<div class='pypto-dynamic-note' style='color:#555; font-size:11px'>{html.escape(note)}</div>"


class _Config:
    """A compile configuration: its compiled kernel and its runs (one per size of a dynamic kernel,
    the one run None of a static kernel)."""
    __slots__ = ("ck", "runs")

    def __init__(self, ck):
        self.ck = ck
        self.runs: dict = {}


class _Run:
    """A simulated run: the compiled kernel, its SimResult (None: compile only), the dtype its
    arguments are cast to and the size (None: not dynamic); the numpy check fills res later."""
    __slots__ = ("ck", "res", "dtype", "size")

    def __init__(self, ck, res, dtype, size):
        self.ck, self.res, self.dtype, self.size = ck, res, dtype, size


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


def stats_html(res, extra=()) -> str:
    """The stats of a SimResult as an HTML table (`extra` (label, text) rows first)."""
    rows = list(extra) + res.stats_rows()
    body = "".join(f"<tr><th style='text-align:left; padding-right:1em'>{html.escape(str(k))}</th>"
                   f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"

