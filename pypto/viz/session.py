"""The explorer's session: a kernel, its arguments and the configurations tried, compiled and
simulated, with no widgets (testable alone; the explorer, explorer.py, is a session with controls).

A configuration is (machine, dtype, constants, size): `_compute` compiles it (cached per
configuration; a dynamic kernel compiles once for every size) and times a run (cached per
configuration and size); `_check` runs the functional simulation and the numpy check later, so a
change shows its cycles first.  The helpers of the sliders' values (`range_values`,
`tiled_dims`) and of a dynamic dim's size (`size_values`, `sized_args`) live here too.
"""
from __future__ import annotations

import contextlib
import math
import time

import numpy as np

from ..errors import PyptoError, located
from ..gcpause import gc_paused
from .views import TAB_NAMES, pieces_text, tab_title


class ExplorerOptionError(PyptoError, ValueError):
    """A bad option of `pypto.explore` / `Explorer` (an unknown view or dtype, a bad range);
    also a ValueError."""


FLOAT_DTYPES = ("fp32", "fp16", "bf16")
SLIDER_VALUES = tuple(2 ** k for k in range(3, 13))     # 8 .. 4096, when a constant's dim is unknown
MAX_CACHED_RESULTS = 48
FIT_SEARCH_S = 3.0         # a constant that does not compile: how long to look for the largest that does
OPTION_KEYS = ("ranges", "show", "dtype", "simulate", "size")  # explorer options passed with the constants
SIZE_MAX = 8192            # the size slider's powers of two go up to max(SIZE_MAX, the arrays' rows)
SIZE_SEED = 0              # the rows drawn for a size above the arrays' own (see `sized_args`)
MAX_MADE_BYTES = 2 ** 30   # arrays made for a size: at most this many bytes in all
MAX_CACHED_SIZES = 16      # simulated sizes kept per compiled configuration


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




class Session:
    """A kernel and its arguments, compiled and simulated per configuration (see the module
    docstring); `Explorer` adds the widgets.

    Options (also accepted among the constants of `pypto.explore(kernel, *args, **consts)`):
    `ranges={"TM": (16, 256)}` slider values per constant (see `range_values`), `show=["tile"]`
    views rendered first and on every change, `dtype="fp16"` cast the float arguments,
    `simulate=False` compile only (the simulation tabs say so); of a dynamic kernel,
    `size=7` (or `N=7`, the size's symbol) the rows of its dynamic dim to start at (see the
    explorer's module docstring).
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
        self._error: Exception | None = None
        self._timing = None
        self._check_time = 0.0
        self._cfg = (machine, dtype)
        try:
            # The first view may be shown statically (nbconvert): simulate with the trace once.
            with self._first_compute(kernel.name):
                ck, res, n = self._compute(machine, dtype, consts, size, trace=True)
        except PyptoError as e:
            raise e.with_traceback(None) from None   # nothing to show yet: say why, briefly
        self._set_current(machine, dtype, ck, res, n)
        self._dims = tiled_dims(kernel, self._args_for(dtype), self._consts) \
            if set(kernel.int_constants) - set(self._ranges) else {}
        self._ready()

    def _ready(self) -> None:
        """The first configuration is compiled and simulated (the explorer builds its widgets)."""

    def _first_compute(self, name: str):
        """The context of the first compile and simulation (the explorer shows a busy bar)."""
        return contextlib.nullcontext()

    @property
    def ck(self):
        """The CompiledKernel on display."""
        return self._ck

    @property
    def res(self):
        """The SimResult on display (None when compiled only), its numpy check done."""
        self._settle()
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


    def text(self) -> str:
        """One deterministic line: configuration and result (what nbval compares)."""
        self._settle()
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
        got = self._check_values(run)
        if got is None:
            return False
        self._store_check(run, got)
        return True

    def _check_values(self, run):
        """(the functional simulation with its check, seconds) of a run that has none yet, else
        None; stores nothing (the explorer runs it in a worker thread: `_store_check` then)."""
        ck, res = run.ck, run.res
        if res is None or res.check is not None:
            return None
        args = self._args_at(run.dtype, run.size)
        with gc_paused():
            t0 = time.perf_counter()
            done = ck.simulate(*args, mode="functional", check=True)
            return done, time.perf_counter() - t0

    def _store_check(self, run, got) -> None:
        done, self._check_time = got
        run.res.outputs, run.res.check = done.outputs, done.check

    def _settle(self) -> None:
        """Wait for a check still running (the explorer's, in a worker thread) and show it: what
        the public readers report includes it."""


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


    def _cfg_text(self, cfg) -> str:
        machine, dtype, consts, size = cfg
        text = ", ".join(f"{k}={v}" for k, v in consts.items()) or "no constants"
        if size is not None and self.size_name is not None:
            text += f", {self.size_name}={size}"
        if dtype:
            text += f", dtype={dtype}"
        m = machine if isinstance(machine, str) else getattr(machine, "name", str(machine))
        return text + ("" if m == self._machine_key else f", machine={m}")


    def advice(self, compute: bool = True):
        """The advisor's findings (`pypto.tuning.advisor.advise`) for the configuration on
        display, computed once per configuration (`compute=False`: None when not yet computed)."""
        from ..tuning.advisor import advise
        key = ("advice", self._key())
        cache = self.__dict__.setdefault("_advice", {})
        if key not in cache and not compute:
            return None
        if key not in cache:
            res = self._res if self._res is not None and self._res.cycles is not None else None
            cache[key] = advise(self._ck, res=res)
        return cache[key]

    def applicable(self, suggestion) -> bool:
        """Whether a suggestion is a change of constants the session's sliders can make."""
        sliders = getattr(self, "sliders", None)
        return bool(sliders) and suggestion.kind in ("constant", "constants") and \
            all(k in sliders for k, v in suggestion.consts.items() if self._consts.get(k) != v)

    def largest_fitting(self, cfg, name: str) -> int | None:
        """The largest value of constant `name` below the one `cfg` asks for (among `_fit_values`:
        its slider's values in the explorer) with which the kernel compiles, the other constants
        as in `cfg`; None when none does within `FIT_SEARCH_S` seconds."""
        machine, dtype, consts, size = cfg
        want = consts[name]
        values = sorted((v for v in self._fit_values(name) if v < want), reverse=True)
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


    def _fit_values(self, name: str) -> list[int]:
        """The values `largest_fitting` tries for constant `name` (the explorer: its slider's)."""
        return list(SLIDER_VALUES)

    def _consts_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self._consts.items()) or "the previous configuration"

    # --- debounce ------------------------------------------------------------------------------

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


