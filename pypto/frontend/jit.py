"""`@pypto.jit`: trace a Python kernel, compile it through the five levels, cache, simulate."""
from __future__ import annotations

import ast
import contextlib
import hashlib
import inspect
import math
import numbers
import textwrap
import time
import traceback

import numpy as np

from .. import dtypes as dt
from ..errors import (DTypeError, KernelSignatureError, PyptoError, ShapeError, SourceLoc, TileShapeError,
                      UnsupportedError, caller_loc, in_package, located)
from ..target.machine import get_machine
from . import custom, profiling
from .dynamic import DYNAMIC, SymbolicScalar
from .tracer import Tensor, TraceContext


class JitKernel:
    """A kernel: tensor parameters (positional) and compile-time integer constants (keyword-only).
    `level`: "tensor" (ops on whole tensors, tiled by the compiler) or "tile" (pypto.tile
    instructions on tiles: the pipeline starts at the Tile Graph the kernel writes) or "block"
    (the same instructions in tasks written by hand, `pypto.block.task`)."""

    def __init__(self, fn, pipeline=None, debug: bool = False, level: str = "tensor"):
        self.fn = fn
        self.level = level
        self.__name__ = self.name = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self.pipeline = pipeline
        self.debug = debug
        sig = inspect.signature(fn)
        self.tensor_params: list[str] = []
        self.const_params: dict[str, object] = {}
        for p in sig.parameters.values():
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                self.tensor_params.append(p.name)
            elif p.kind == p.KEYWORD_ONLY:
                self.const_params[p.name] = None if p.default is p.empty else p.default
        self.loc = SourceLoc(fn.__code__.co_filename, fn.__code__.co_firstlineno, fn.__name__)
        self._def = None            # _DefInfo, parsed on the first error that needs it
        # parameters annotated with a pypto.Tensor spec: checked at every call; those with a
        # pypto.DYNAMIC dim make the kernel dynamic (one compile serves every size of the dim)
        self.annotations: dict[str, Tensor] = {}
        for p in sig.parameters.values():
            ann = p.annotation
            if isinstance(ann, str):
                try:
                    ann = eval(ann, getattr(fn, "__globals__", {}))     # noqa: S307 - the user's own annotation
                except Exception as e:  # noqa: BLE001 - not a spec, or one that cannot be read
                    if "DYNAMIC" in ann or "Tensor(" in ann:
                        raise KernelSignatureError(
                            f"the annotation of '{p.name}' of {fn.__name__} cannot be evaluated: "
                            f"{type(e).__name__}: {e}", loc=self.sig_loc(p.name),
                            expected="a pypto.Tensor spec made of names of the kernel's module",
                            got=repr(ann),
                            hint="with `from __future__ import annotations` an annotation is a string read "
                                 "in the module's globals: define its names at module level (or write "
                                 "pypto.DYNAMIC in full)") from None
                    continue
            if isinstance(ann, Tensor) and ann._node is None and p.name in self.tensor_params:
                self.annotations[p.name] = ann
        self._source_hash = _source_hash(fn)
        self._cache: dict = {}

    def _def_info(self) -> "_DefInfo":
        if self._def is None:
            self._def = _DefInfo.of(self.fn)
        return self._def

    def sig_loc(self, param: str | None = None) -> SourceLoc:
        """Where a signature error points: the `def` line, the carets under parameter `param`
        (under the whole parameter list without one)."""
        info = self._def_info()
        span = info.params.get(param) if param else None
        span = span or info.param_list
        if span is None:
            return self.loc
        line, col, end = span
        return SourceLoc(self.loc.file, line, self.loc.func, col, end)

    @property
    def int_constants(self) -> dict[str, int]:
        """Keyword-only integer constants with their defaults (the explorer's sliders)."""
        return {k: v for k, v in self.const_params.items() if isinstance(v, numbers.Integral)
                and not isinstance(v, bool)}

    def __repr__(self):
        return f"<pypto.jit kernel {self.name}({', '.join(self.tensor_params)})>"

    def dynamic_params(self, *args) -> tuple[str, ...]:
        """The parameters whose first dim is pypto.DYNAMIC for these arguments (annotated so, or a
        pypto.Tensor spec with it), without compiling; () when the arguments do not fit the kernel
        (its compile says why)."""
        try:
            specs = self._specs(args)
        except PyptoError:
            return ()
        return tuple(s.name for s in specs if s.shape and s.shape[0] is DYNAMIC)

    # --- compile ----------------------------------------------------------------------------
    def compile(self, *args, machine="a2a3", snapshots: bool = False, pipeline=None, options=None, **consts):
        """Compile for these argument shapes/dtypes and constants; cached.

        `pipeline` (a CompilerPipeline or Pipeline) overrides the kernel's own for this compile;
        `options` turn optimisations off, e.g. {"fusion": False, "double_buffer": False}; the names
        are those of `pypto.compiler.OPTIONS`."""
        try:
            return self._compile(args, machine, snapshots or self.debug, consts, pipeline, options)
        except PyptoError as e:
            raise located(e).with_traceback(None) from None

    def _compile(self, args, machine, snapshots, consts, pipeline=None, options=None):
        from ..compiler import Pipeline, PassContext, default_passes
        from ..compiler.pipeline import check_options
        from ..sim.timing import timed
        from .kernel import CompiledKernel
        by_name = [k for k in self.tensor_params if k in consts]
        if by_name:
            raise KernelSignatureError(
                f"tensor argument{'s' if len(by_name) > 1 else ''} {', '.join(map(repr, by_name))} of {self.name} "
                "given by keyword", loc=self.sig_loc(by_name[0]),
                expected=f"positional tensors: {self.name}({', '.join(self.tensor_params)})",
                got=", ".join(f"{k}=..." for k in by_name),
                hint=f"tensors are positional: {self.name}({', '.join(self.tensor_params)}); "
                     "keywords are for the constants")
        m = get_machine(machine)
        specs = self._specs(args)
        values = self._constants(consts)
        pipeline = pipeline or self.pipeline
        if pipeline is not None and not isinstance(pipeline, Pipeline):
            pipeline = pipeline.pipeline()          # a CompilerPipeline: its current passes
        passes = tuple(pipeline.passes) if pipeline is not None else None
        dynamic = tuple(s.name for s in specs if s.shape and s.shape[0] is DYNAMIC)
        key = (self._source_hash, tuple((s.shape, s.dtype.name) for s in specs),
               tuple(sorted(values.items())), m, snapshots, passes, tuple(sorted((options or {}).items())),
               custom.generation())
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        pipeline = pipeline or Pipeline(default_passes())
        check_options(options or {}, pipeline.passes)
        if self.level in ("tile", "block"):
            if dynamic:
                raise UnsupportedError(f"{self.name} is a tile-level kernel with a pypto.DYNAMIC dim",
                                       loc=self.sig_loc(dynamic[0]), expected="static shapes", got="pypto.DYNAMIC",
                                       hint="tile-level kernels are compiled per shape: call them with arrays")
            tiles: list = []
            traced = self._trace(specs, values, machine=m, tiles=tiles)
            tile_graph, trace = tiles
            pipeline = trace.pipeline(pipeline, tile_graph)
        elif dynamic:
            ck = self._compile_dynamic(specs, dynamic, values, m, pipeline, options, snapshots)
            self._cache[key] = ck
            return ck
        else:
            traced = self._trace(specs, values, machine=m)
        try:
            levels, log, snaps = pipeline.run(traced, PassContext(m, dict(options or {}), timing=timed),
                                              verify="each" if self.debug else "levels", snapshots=snapshots)
        except TileShapeError as e:
            if self.level in ("tile", "block") and not e.hint:
                raise TileShapeError(e.message, loc=e.loc, expected=e.expected, got=e.got,
                                     hint="load smaller views (fewer rows or columns per loop step)") from None
            if e.hint or "do not fit" not in e.message:
                raise
            hint = _fitting_tile_hint(traced, e, pipeline, m, options)
            if hint is None:
                raise
            err = TileShapeError(e.message, loc=e.loc, expected=e.expected, got=e.got, hint=hint)
            raise err from None
        ck = CompiledKernel(self.name, m, values, traced, levels["tensor"], levels["tile"], levels["block"],
                            levels["exec"], levels["pto"], log, snaps, kernel=self, options=dict(options or {}))
        self._cache[key] = ck
        return ck

    def _compile_dynamic(self, specs, dynamic, values, m, pipeline, options, snapshots):
        """Compile a kernel with pypto.DYNAMIC dims for one chunk of rows (`compiler.dynamic`)."""
        from ..compiler import PassContext, Pipeline
        from ..compiler.dynamic import CHUNK, MAX_CHUNK_INSTRS, DynamicInfo, chunk_for, ladder, row_axes
        from ..sim.timing import timed
        from .kernel import CompiledKernel
        traced = self._trace(specs, values, chunk=CHUNK, machine=m)
        chunk = max(chunk_for(traced, CHUNK), max(self._loop_steps, default=1))   # a loop's step divides it
        if chunk != CHUNK:
            traced = self._trace(specs, values, chunk=chunk, machine=m)
        verify = "each" if self.debug else "levels"
        # the rows of the dim kept apart: checked on the Tensor Graph the tensor passes make,
        # before the rest of the pipeline (a refusal costs milliseconds, not a whole compile)
        cut = next((i for i, p in enumerate(pipeline.passes) if p.level != "tensor"), len(pipeline.passes))
        head, _, _ = Pipeline(pipeline.passes[:cut]).run(traced, PassContext(m, dict(options or {})), verify=False)
        row_axes(head["tensor"], {name: 0 for name in dynamic})
        # the programs, smallest first; the chunk is the largest whose program stays within
        # MAX_CHUNK_INSTRS (estimated from the one before it: the instructions grow with the rows)
        programs, compiled = {}, None
        for rows in ladder(max(self._loop_steps, default=1), chunk):
            if compiled is not None and len(compiled[1]["pto"]) * rows > MAX_CHUNK_INSTRS * compiled[0]:
                break
            g = traced if rows == chunk else self._trace(specs, values, chunk=rows, machine=m)
            levels, log, snaps = _for_chunk(pipeline.run, rows, g, PassContext(m, dict(options or {}), timing=timed),
                                            verify=verify, snapshots=snapshots)
            programs[rows] = levels["pto"]
            compiled = (rows, levels, log, snaps, g)
        _, levels, log, snaps, traced = compiled
        return CompiledKernel(self.name, m, values, traced, levels["tensor"], levels["tile"], levels["block"],
                              levels["exec"], levels["pto"], log, snaps, kernel=self,
                              dynamic=DynamicInfo(dynamic, programs), options=dict(options or {}))

    def _specs(self, args) -> list[Tensor]:
        if len(args) != len(self.tensor_params):
            raise KernelSignatureError(
                f"{self.name} takes {len(self.tensor_params)} tensor arguments", loc=self.sig_loc(),
                expected=f"{len(self.tensor_params)}: ({', '.join(self.tensor_params)})", got=f"{len(args)} arguments",
                hint=("give every tensor parameter an array (outputs too: the kernel writes them in place)"
                      if len(args) < len(self.tensor_params) else
                      "constants are keyword-only: kernel(x, out, TM=64)"))
        specs = []
        for name, a in zip(self.tensor_params, args):
            loc = self.sig_loc(name)
            if isinstance(a, Tensor) and a._node is None:
                specs.append(self._annotated(name, Tensor(a.shape, a.dtype, name)))
                continue
            if isinstance(a, Tensor):
                raise KernelSignatureError(
                    f"argument '{name}' of {self.name} is a value of a kernel being traced",
                    loc=caller_loc() or loc,
                    expected="a numpy array or pypto.Tensor(shape, dtype)", got=repr(a),
                    hint="call a kernel from Python, not from inside another kernel")
            if hasattr(a, "detach") and hasattr(a, "numpy"):
                a = a.detach().numpy()
            if not isinstance(a, np.ndarray):
                hint = None
                if isinstance(a, (list, tuple)):
                    hint = "wrap it: np.asarray(value, dtype=np.float32)"
                elif isinstance(a, numbers.Number):
                    hint = "a scalar argument: make it a keyword-only constant (def k(x, out, *, alpha: float))"
                raise KernelSignatureError(
                    f"argument '{name}' of {self.name} is not a tensor", loc=loc,
                    expected="a numpy array (or torch tensor, or pypto.Tensor(shape, dtype))",
                    got=f"{type(a).__name__} {a!r}"[:80], hint=hint)
            d = dt.from_numpy(a.dtype)
            if d is None:
                raise DTypeError(f"argument '{name}' of {self.name} has an unsupported dtype", loc=loc,
                                 expected=dt.supported_names(), got=str(a.dtype), hint=_dtype_hint(a.dtype))
            if a.ndim == 0:
                raise KernelSignatureError(f"argument '{name}' of {self.name} is a 0-d array", loc=loc,
                                           expected="at least one dimension", got="shape ()",
                                           hint="np.reshape(value, (1,)) makes it a 1-element tensor")
            if 0 in a.shape:
                raise ShapeError(f"argument '{name}' of {self.name} is empty: empty tensors are not supported",
                                 loc=loc, expected="at least one element along every dim",
                                 got=f"shape {list(a.shape)}",
                                 hint="a kernel over no data has nothing to compute; skip the call")
            specs.append(self._annotated(name, Tensor(a.shape, d, name)))
        total = sum(s.size * s.dtype.itemsize for s in specs if DYNAMIC not in s.shape)
        if total > MAX_GM_BYTES:
            detail = ", ".join(f"{s.name} {s.dtype}{list(s.shape)} = {_bytes(s.size * s.dtype.itemsize)}"
                               for s in specs)
            raise ShapeError(f"the arguments of {self.name} do not fit the device memory", loc=self.sig_loc(),
                             expected=f"at most {_bytes(MAX_GM_BYTES)} of tensor arguments in GM",
                             got=f"{_bytes(total)} ({detail})"[:300],
                             hint="compile for a smaller shape: the tiles of a problem this size would take "
                                  "hours to compile and simulate")
        return specs

    def _annotated(self, name: str, spec: Tensor) -> Tensor:
        """The spec of argument `name` checked against the parameter's annotation (its dtype and
        static dims); a pypto.DYNAMIC dim of the annotation (or of the spec) becomes DYNAMIC."""
        ann = self.annotations.get(name)
        where = self.sig_loc(name)
        for d, size in enumerate(spec.shape if ann is None else ann.shape):
            if size is DYNAMIC and d != 0:
                raise ShapeError(f"parameter '{name}' of {self.name} has a pypto.DYNAMIC dim {d}", loc=where,
                                 expected="pypto.DYNAMIC as the first dim only", got=list(spec.shape if ann is None
                                                                                         else ann.shape),
                                 hint="a dynamic dim is the first one (rows, or batch x sequence flattened)")
        if ann is None:
            return spec
        if len(ann.shape) != len(spec.shape) or ann.dtype != spec.dtype or any(
                w is not DYNAMIC and w != g for w, g in zip(ann.shape, spec.shape)):
            raise KernelSignatureError(f"argument '{name}' of {self.name} does not fit its annotation", loc=where,
                                       expected=f"{ann.dtype}{_dims(ann.shape)}",
                                       got=f"{spec.dtype}{_dims(spec.shape)}")
        if DYNAMIC in ann.shape:
            return Tensor((DYNAMIC,) + tuple(spec.shape[1:]), spec.dtype, name)
        return spec

    def _constants(self, consts) -> dict:
        unknown = set(consts) - set(self.const_params)
        if unknown:
            hint = None
            if set(unknown) & set(self.tensor_params):
                hint = "tensors are positional: kernel(x, out), not kernel(x=x, out=out)"
            elif not self.const_params:
                hint = f"declare it keyword-only in the kernel: def {self.name}(..., *, {sorted(unknown)[0]}: int = ...)"
            else:
                close = [c for c in self.const_params if c.lower() in {u.lower() for u in unknown}]
                hint = f"did you mean {close[0]}?" if close else None
            raise KernelSignatureError(
                f"unknown constant(s) for {self.name}: {', '.join(sorted(unknown))}", loc=self.sig_loc(),
                expected=", ".join(self.const_params) or "no constants", got=", ".join(sorted(consts)),
                hint=hint)
        values = {}
        for k, default in self.const_params.items():
            v = consts.get(k, default)
            if v is None:
                raise KernelSignatureError(f"constant '{k}' of {self.name} has no value", loc=self.sig_loc(k),
                                           expected=f"{k}=<value>", got="nothing",
                                           hint=f"pass it, kernel(..., {k}=...), or give it a default in the def")
            if isinstance(default, numbers.Integral) and not isinstance(default, bool) and (
                    not isinstance(v, numbers.Integral) or isinstance(v, bool)):
                raise KernelSignatureError(f"constant '{k}' of {self.name} must be an integer", loc=self.sig_loc(k),
                                           expected="int", got=f"{type(v).__name__} {v!r}")
            values[k] = v
        return values

    def _trace(self, specs, values, chunk: int | None = None, machine=None, tiles: list | None = None):
        """The Tensor Graph of the kernel for these specs; with `chunk`, a pypto.DYNAMIC dim is a
        SymbolicScalar N standing for `chunk` rows; `machine`: the Machine compiled for (what
        `pypto.target_specific` chooses by).  A tile-level kernel appends its Tile Graph to
        `tiles` (and its Tensor Graph is the equivalent ops on the views it loads and stores)."""
        trace = None
        if self.level != "tensor":
            from .block import BlockTrace
            from .tile import TileTrace
            trace = {"tile": TileTrace, "block": BlockTrace}[self.level]
        with TraceContext(self.name, machine) as ctx, trace(ctx) if trace else contextlib.nullcontext() as tt:
            ctx.dynamic = chunk is not None
            proxies = [ctx.input(s.name, tuple(SymbolicScalar(chunk) if d is DYNAMIC else d for d in s.shape),
                                 s.dtype, self.loc) for s in specs]
            try:
                returned = self.fn(*proxies, **values)
            except PyptoError:
                raise
            except Exception as e:
                raise PyptoError(f"{type(e).__name__} while tracing {self.name}: {e}",
                                 loc=_user_frame(e.__traceback__) or self.loc) from e
        g = ctx.graph()
        self._loop_steps = tuple(ctx.loop_steps)
        writes = any(n.op == "store" for n in g.nodes)
        if returned is not None:
            outs = ", ".join(n for n in self.tensor_params[-1:])
            what = repr(returned) if isinstance(returned, Tensor) else type(returned).__name__
            raise KernelSignatureError(
                f"{self.name} returns a value: the return value of a kernel is ignored"
                + ("" if writes else ", and it writes no output"),
                loc=self._def_info().return_loc(self.loc) or self.sig_loc(),
                expected="no return value; outputs written in place into an argument",
                got=f"return {what}"[:80],
                hint=f"write the result into an output argument instead: {outs or 'out'}[:] = value")
        if not writes:
            raise KernelSignatureError(
                f"{self.name} writes no output", loc=self.sig_loc(),
                expected="a write such as out[:] = value or pypto.assemble(value, offsets, out)",
                got="no write to any argument",
                hint="kernels write their results in place into an output argument (out[:] = value)")
        _check_tile_ranks(g)
        if tt is not None:
            from ..compiler.tensor_passes import dce
            tt.check_tensor_ops(g)
            if tiles is not None:
                tiles.extend((tt.graph(g), tt))
            g = dce(g)          # (the views a tstore named)
        return g

    # --- run ----------------------------------------------------------------------------------
    def __call__(self, *args, machine="a2a3", **consts):
        """Compile (cached) and simulate functionally; write the results into the output arrays."""
        watched = profiling.collecting()      # inside a pypto.profile() block
        start = time.perf_counter() if watched else 0.0
        try:
            ck = self._compile(args, machine, self.debug, consts)
            with profiling.inner_runs(watched):
                res = ck.simulate(*args, mode="functional", check=False)
        except PyptoError as e:
            raise located(e).with_traceback(None) from None
        from .kernel import as_array
        for name, a in zip(self.tensor_params, args):
            if name in ck.traced.output_names:
                as_array(a)[...] = res.outputs[name]
        if watched:
            profiling.record(ck, "call", time.perf_counter() - start, args=args)

    def cache_clear(self):
        self._cache.clear()

    @property
    def cache_size(self) -> int:
        return len(self._cache)


def _for_chunk(run, rows: int, *args, **kw):
    """`run(*args, **kw)` (a pipeline's) for a dynamic kernel's program of `rows` rows: an error
    says that the rows are those of a compiled chunk, not of the user's arrays."""
    try:
        return run(*args, **kw)
    except PyptoError as e:
        note = (f"the kernel is compiled for {rows} rows of its pypto.DYNAMIC dim (the programs a call "
                "runs in pieces); ")
        if e.hint and note in e.hint:
            raise
        err = type(e)(e.message, loc=e.loc, expected=e.expected, got=e.got,
                      hint=note + (e.hint or "a tile that fits a smaller number of rows may not fit these"))
        raise err.with_traceback(e.__traceback__) from None


def _dims(shape) -> str:
    return "[" + ", ".join("DYNAMIC" if d is DYNAMIC else str(d) for d in shape) + "]"


def _source_hash(fn) -> str:
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        src = repr(fn.__code__.co_code) + repr(fn.__code__.co_consts)
    return hashlib.sha1(src.encode()).hexdigest()


# Tensor arguments above this many bytes in GM are refused at the signature: no device of the
# class simulated has more HBM, and the tiles of such a problem take hours to compile.
MAX_GM_BYTES = 64 * 2 ** 30


def _bytes(n: int) -> str:
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} B"


def _dtype_hint(np_dtype) -> str | None:
    kind = np.dtype(np_dtype).kind
    if kind == "f":
        return "convert it: x.astype(np.float32) (or np.float16)"
    if kind == "c":
        return "complex numbers are not supported: pass the real and imaginary parts as two fp32 tensors"
    if kind in "iu":
        return "convert it: x.astype(np.int32) (or np.int8)"
    if kind == "O":
        return "an object array: build it with a numeric dtype, np.asarray(value, dtype=np.float32)"
    return None


def _check_tile_ranks(g) -> None:
    """A vector tile spec with more dims than every tensor it tiles is a mistake (its leading
    dims would be dropped silently)."""
    ranks: dict[int, tuple] = {}
    for n in g.nodes:
        spec = n.attrs.get("tile") if n.op != "matmul" else None
        if spec is not None and hasattr(spec, "dims"):
            rank = max([len(n.shape)] + [len(g.node(i).shape) for i in n.inputs])
            best = ranks.get(id(spec))
            ranks[id(spec)] = (spec, max(rank, best[1] if best else 0))
    for spec, rank in ranks.values():
        if len(spec.dims) > rank:
            raise TileShapeError(
                f"vector tile {list(spec.dims)} has more dims than the tensors it tiles", loc=spec.loc,
                expected=f"at most {rank} dims (the rank of the tensors of the ops that follow)",
                got=f"{len(spec.dims)} dims",
                hint=f"give the sizes of the last dims only, e.g. set_vec_tile_shapes"
                     f"({', '.join(str(d) for d in spec.dims[-rank:])})")


def _fitting_tile_hint(traced, err, pipeline, machine, options) -> str | None:
    """For a tile that does not fit its on-chip buffer: the largest tile (halving the user's
    tile, leading dims first; for a cube tile its largest dim first) with which the tile level
    compiles, as the call that sets it.  None when the tile was not the user's or none fits."""
    from ..compiler import PassContext, Pipeline
    from ..ir.tensor import TileSpec
    from ..dtypes import DType
    spec = None
    for n in traced.nodes:
        t = n.attrs.get("tile")
        if isinstance(t, TileSpec) and n.loc == err.loc:
            spec, node = t, n
            break
    if spec is None:
        return None
    cube = node.op == "matmul"
    dtype: DType = traced.node(node.inputs[0]).dtype if node.inputs else node.dtype
    chain = _smaller_tiles(spec.dims, cube, dtype)
    if not chain:
        return None
    cut = next((i for i, p in enumerate(pipeline.passes) if p.level == "tile->block"), len(pipeline.passes))
    head = Pipeline(pipeline.passes[:cut])
    elements = max(n.shape and math.prod(n.shape) or 1 for n in traced.nodes)

    def fits(dims) -> bool:
        per_tile = math.prod(d[0] if cube else d for d in dims)
        if elements // max(per_tile, 1) > 50_000:       # too many tiles to try quickly
            return False
        new = TileSpec(dims, spec.loc)
        g = traced.replace([n.replace(attrs=n.attrs.replace(tile=new)) if n.attrs.get("tile") is spec else n
                            for n in traced.nodes])
        try:
            head.run(g, PassContext(machine, dict(options or {})), verify=False)
        except TileShapeError:
            return False
        except Exception:  # noqa: BLE001 - the hint is best effort
            return False
        return True
    lo, hi = 0, len(chain)          # binary search: chain is ordered largest first, fitting is monotone
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(chain[mid]):
            hi = mid
        else:
            lo = mid + 1
    if lo == len(chain):
        return None
    best = chain[lo]
    if cube:
        call = "set_cube_tile_shapes(" + ", ".join(f"[{a}, {b}]" for a, b in best) + ")"
    else:
        call = "set_vec_tile_shapes(" + ", ".join(str(d) for d in best) + ")"
    where = f" (the tile is set at line {spec.loc.line})" if spec.loc is not None and spec.loc != err.loc else ""
    return f"the largest tile that fits is {call}{where}"


def _smaller_tiles(dims, cube: bool, dtype) -> list:
    """Ever smaller tiles from `dims` (excluded), each half the previous one: a vector tile's
    leading dims first, then its last dim down to 32 bytes; a cube tile's largest L0 dim (and
    its L1 alongside) down to the fractal."""
    out = []
    if cube:
        cur = [list(p) for p in dims]
        align = [16, 32 // dtype.itemsize, 16]
        while True:
            order = sorted(range(3), key=lambda i: -cur[i][0])
            i = next((i for i in order if cur[i][0] // 2 >= align[i] and (cur[i][0] // 2) % align[i] == 0), None)
            if i is None:
                return out
            ratio = max(cur[i][1] // cur[i][0], 1)
            cur[i] = [cur[i][0] // 2, cur[i][0] // 2 * ratio]
            out.append(tuple(tuple(p) for p in cur))
    cur = list(dims)
    align = max(32 // dtype.itemsize, 1)
    while True:
        i = next((i for i in range(len(cur) - 1) if cur[i] > 1), None)
        if i is not None:
            cur[i] //= 2
        elif cur[-1] // 2 >= align and (cur[-1] // 2) % align == 0:
            cur[-1] //= 2
        else:
            return out
        out.append(tuple(cur))


class _DefInfo:
    """Columns in the kernel's source: the `def` line's parameters and the `return` statements
    that return a value (for errors that point at the signature or at a return)."""

    def __init__(self):
        self.params: dict[str, tuple[int, int, int | None]] = {}
        self.param_list: tuple[int, int, int | None] | None = None
        self.returns: list[tuple[int, int, int | None]] = []

    @classmethod
    def of(cls, fn) -> "_DefInfo":
        info = cls()
        try:
            lines, first = inspect.getsourcelines(fn)
            src = "".join(lines)
            dedented = textwrap.dedent(src)
            shift = len(lines[0]) - len(dedented.splitlines(True)[0])
            tree = ast.parse(dedented)
        except Exception:  # noqa: BLE001 - no source (exec'd code): errors fall back to the def line
            return info
        node = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == fn.__name__), None)
        if node is None:
            return info

        def span(n):
            line = first + n.lineno - 1
            end = n.end_col_offset + shift if n.end_lineno == n.lineno else None
            return (line, n.col_offset + shift, end)
        a = node.args
        args = [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs,
                *([a.kwarg] if a.kwarg else [])]
        for arg in args:
            info.params[arg.arg] = span(arg)
        if args:
            lo, hi = span(args[0]), span(args[-1])
            info.param_list = (lo[0], lo[1], hi[2] if hi[0] == lo[0] else None)
        else:
            info.param_list = (first + node.lineno - 1, node.col_offset + shift, None)
        todo = list(node.body)
        while todo:
            n = todo.pop(0)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(n, ast.Return) and n.value is not None and not (
                    isinstance(n.value, ast.Constant) and n.value.value is None):
                info.returns.append(span(n))
            todo.extend(ast.iter_child_nodes(n))
        info.returns.sort()
        return info

    def return_loc(self, kernel_loc: SourceLoc) -> SourceLoc | None:
        if not self.returns:
            return None
        line, col, end = self.returns[0]
        return SourceLoc(kernel_loc.file, line, kernel_loc.func, col, end)


def _user_frame(tb) -> SourceLoc | None:
    """The innermost frame of the user's code in traceback `tb`, with the failing expression's
    columns."""
    loc = None
    for fs in traceback.extract_tb(tb):
        if not in_package(fs.filename):
            col, end = getattr(fs, "colno", None), getattr(fs, "end_colno", None)
            if getattr(fs, "end_lineno", fs.lineno) != fs.lineno:
                end = None
            loc = SourceLoc(fs.filename, fs.lineno, fs.name, col, end)
    return loc


LEVELS = ("tensor", "tile", "block")


def jit(fn=None, *, pipeline=None, debug: bool = False, level: str = "tensor"):
    """Decorator: `@pypto.jit`, `@pypto.jit(debug=True)`; `@pypto.jit(level="tile")` for a kernel
    written with `pypto.tile` instructions (it enters the pipeline at the Tile Graph);
    `@pypto.jit(level="block")` for one whose tile instructions are grouped into tasks by hand
    (`pypto.block.task`: it enters the pipeline at the Block Graph)."""
    if level not in LEVELS:
        raise located(UnsupportedError(f"no kernel level {level!r}", expected=" or ".join(map(repr, LEVELS)),
                                       got=repr(level)))
    if fn is None:
        return lambda f: JitKernel(f, pipeline=pipeline, debug=debug, level=level)
    return JitKernel(fn, pipeline=pipeline, debug=debug, level=level)
