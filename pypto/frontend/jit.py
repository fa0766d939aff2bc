"""`@pypto.jit`: trace a Python kernel, compile it through the five levels, cache, simulate."""
from __future__ import annotations

import hashlib
import inspect
import numbers
import traceback

import numpy as np

from .. import dtypes as dt
from ..errors import DTypeError, KernelSignatureError, PyptoError, SourceLoc
from ..sim.machine import get_machine
from .tracer import Tensor, TraceContext, _PKG_DIR


class JitKernel:
    """A kernel: tensor parameters (positional) and compile-time integer constants (keyword-only)."""

    def __init__(self, fn, pipeline=None, debug: bool = False):
        self.fn = fn
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
        self._source_hash = _source_hash(fn)
        self._cache: dict = {}

    @property
    def int_constants(self) -> dict[str, int]:
        """Keyword-only integer constants with their defaults (the explorer's sliders)."""
        return {k: v for k, v in self.const_params.items() if isinstance(v, numbers.Integral)
                and not isinstance(v, bool)}

    def __repr__(self):
        return f"<pypto.jit kernel {self.name}({', '.join(self.tensor_params)})>"

    # --- compile ----------------------------------------------------------------------------
    def compile(self, *args, machine="a2a3", snapshots: bool = False, pipeline=None, options=None, **consts):
        """Compile for these argument shapes/dtypes and constants; cached.

        `pipeline` (a CompilerPipeline or Pipeline) overrides the kernel's own for this compile;
        `options` turn optimisations off, e.g. {"fusion": False, "double_buffer": False}; the names
        are those of `pypto.compiler.OPTIONS`."""
        try:
            return self._compile(args, machine, snapshots or self.debug, consts, pipeline, options)
        except PyptoError as e:
            raise e.with_traceback(None) from None

    def _compile(self, args, machine, snapshots, consts, pipeline=None, options=None):
        from ..compiler import Pipeline, PassContext, default_passes
        from ..compiler.pipeline import check_options
        from ..compiler.kernel import CompiledKernel
        m = get_machine(machine)
        specs = self._specs(args)
        values = self._constants(consts)
        pipeline = pipeline or self.pipeline
        if pipeline is not None and not isinstance(pipeline, Pipeline):
            pipeline = pipeline.pipeline()          # a CompilerPipeline: its current passes
        passes = tuple(pipeline.passes) if pipeline is not None else None
        key = (self._source_hash, tuple((s.shape, s.dtype.name) for s in specs),
               tuple(sorted(values.items())), m, snapshots, passes, tuple(sorted((options or {}).items())))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        pipeline = pipeline or Pipeline(default_passes())
        check_options(options or {}, pipeline.passes)
        traced = self._trace(specs, values)
        levels, log, snaps = pipeline.run(traced, PassContext(m, dict(options or {})), verify="each" if self.debug else "levels",
                                          snapshots=snapshots)
        ck = CompiledKernel(self.name, m, values, traced, levels["tensor"], levels["tile"], levels["block"],
                            levels["exec"], levels["pto"], log, snaps, kernel=self)
        self._cache[key] = ck
        return ck

    def _specs(self, args) -> list[Tensor]:
        if len(args) != len(self.tensor_params):
            raise KernelSignatureError(
                f"{self.name} takes {len(self.tensor_params)} tensor arguments", loc=self.loc,
                expected=f"({', '.join(self.tensor_params)})", got=f"{len(args)} arguments")
        specs = []
        for name, a in zip(self.tensor_params, args):
            if isinstance(a, Tensor) and a._node is None:
                specs.append(Tensor(a.shape, a.dtype, name))
                continue
            if hasattr(a, "detach") and hasattr(a, "numpy"):
                a = a.detach().numpy()
            if not isinstance(a, np.ndarray):
                raise KernelSignatureError(
                    f"argument '{name}' of {self.name} is not a tensor", loc=self.loc,
                    expected="a numpy array (or torch tensor, or pypto.Tensor(shape, dtype))",
                    got=f"{type(a).__name__} {a!r}"[:80])
            d = dt.from_numpy(a.dtype)
            if d is None:
                raise DTypeError(f"argument '{name}' of {self.name} has an unsupported dtype", loc=self.loc,
                                 expected=dt.supported_names(), got=str(a.dtype))
            if a.ndim == 0:
                raise KernelSignatureError(f"argument '{name}' of {self.name} is a 0-d array", loc=self.loc,
                                           expected="at least one dimension", got="shape ()")
            specs.append(Tensor(a.shape, d, name))
        return specs

    def _constants(self, consts) -> dict:
        unknown = set(consts) - set(self.const_params)
        if unknown:
            raise KernelSignatureError(
                f"unknown constant(s) for {self.name}: {', '.join(sorted(unknown))}", loc=self.loc,
                expected=", ".join(self.const_params) or "no constants", got=", ".join(sorted(consts)))
        values = {}
        for k, default in self.const_params.items():
            v = consts.get(k, default)
            if v is None:
                raise KernelSignatureError(f"constant '{k}' of {self.name} has no value", loc=self.loc,
                                           expected=f"{k}=<value>", got="nothing")
            if isinstance(default, numbers.Integral) and not isinstance(default, bool) and (
                    not isinstance(v, numbers.Integral) or isinstance(v, bool)):
                raise KernelSignatureError(f"constant '{k}' of {self.name} must be an integer", loc=self.loc,
                                           expected="int", got=f"{type(v).__name__} {v!r}")
            values[k] = v
        return values

    def _trace(self, specs, values):
        with TraceContext(self.name) as ctx:
            proxies = [ctx.input(s.name, s.shape, s.dtype, self.loc) for s in specs]
            try:
                self.fn(*proxies, **values)
            except PyptoError:
                raise
            except Exception as e:
                raise PyptoError(f"{type(e).__name__} while tracing {self.name}: {e}",
                                 loc=_user_frame(e.__traceback__) or self.loc) from e
        g = ctx.graph()
        if not any(n.op == "store" for n in g.nodes):
            raise KernelSignatureError(
                f"{self.name} writes no output", loc=self.loc,
                expected="a write such as out[:] = value or pypto.assemble(value, offsets, out)",
                got="no write to any argument")
        return g

    # --- run ----------------------------------------------------------------------------------
    def __call__(self, *args, machine="a2a3", **consts):
        """Compile (cached) and simulate functionally; write the results into the output arrays."""
        try:
            ck = self._compile(args, machine, self.debug, consts)
            res = ck.simulate(*args, mode="functional", check=False)
        except PyptoError as e:
            raise e.with_traceback(None) from None
        from ..compiler.kernel import as_array
        for name, a in zip(self.tensor_params, args):
            if name in ck.traced.output_names:
                as_array(a)[...] = res.outputs[name]

    def cache_clear(self):
        self._cache.clear()

    @property
    def cache_size(self) -> int:
        return len(self._cache)


def _source_hash(fn) -> str:
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        src = repr(fn.__code__.co_code) + repr(fn.__code__.co_consts)
    return hashlib.sha1(src.encode()).hexdigest()


def _user_frame(tb) -> SourceLoc | None:
    loc = None
    for fs in traceback.extract_tb(tb):
        if not fs.filename.startswith(_PKG_DIR):
            loc = SourceLoc(fs.filename, fs.lineno, fs.name)
    return loc


def jit(fn=None, *, pipeline=None, debug: bool = False):
    """Decorator: `@pypto.jit` or `@pypto.jit(debug=True)`."""
    if fn is None:
        return lambda f: JitKernel(f, pipeline=pipeline, debug=debug)
    return JitKernel(fn, pipeline=pipeline, debug=debug)
