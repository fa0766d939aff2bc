"""What a kernel's author adds to pypto from Python: named ops (`register_op`), regions kept in
one fusion group (`fuse`) and implementations chosen by machine (`target_specific`).

A registered op is a Python function of pypto ops; calling it in a kernel adds one node of its
name to the Tensor Graph (kind "composite").  Its registry row (`OPS[name]`, added at run time)
traces the function on proxies of the arguments' shapes and dtypes and

- `shape`: is the shape of what the function returns;
- `ref`: evaluates the traced body with the registry's numpy references, floats in float64,
  rounded once to the op's dtype (as the built-in composites' references);
- `decompose`: replays the body's ops on any `Builder` (the compiler's decompose pass, the
  honest check's bounds, a gradient's builder), the op's `tile` (and `fuse`) on its parts.

Tensors are the function's arguments that are traced tensors; every other argument (a Python
number, bool, str, None, dtype or a tuple of them; a list becomes a tuple) is an attribute of the
node, by its parameter's name (`my_quantize(x, 8)` -> `my_quantize(%0) bits=8`).
"""
from __future__ import annotations

import functools
import inspect
import itertools
import numbers
import traceback
from dataclasses import dataclass

import numpy as np

from .. import dtypes as dt
from ..compiler.fusion import FuseRegion
from ..errors import KernelSignatureError, PyptoError, SourceLoc, UnsupportedError, caller_loc, in_package
from ..ir.ops import OPS, Op
from ..ir.tensor import TensorGraph
from .tracer import TILED_KINDS, Tensor, TraceContext, user_loc

# node attrs pypto sets itself: no parameter of a registered op may have these names
RESERVED = frozenset(("tile", "fuse", "from", "group", "materialize", "auto_tile", "cube_tile", "target",
                      "layout", "state"))
MAX_BODIES = 64                 # traced bodies kept per op (one per signature)

_REGISTERED: dict[str, "CustomOp"] = {}
_GENERATION = [0]               # bumped when a registered op is replaced or removed


def generation() -> int:
    """Changes when a registered op changes: part of a kernel's compile cache key."""
    return _GENERATION[0]


def registered() -> dict[str, "CustomOp"]:
    """The registered ops by name."""
    return dict(_REGISTERED)


@dataclass(frozen=True)
class _Body:
    """An op's function traced for one signature: its graph and the id of the value it returns."""
    graph: TensorGraph
    result: int
    shape: tuple
    dtype: dt.DType
    out_shape: tuple            # the result proxy's shape (a dynamic dim as its symbol)


class _MachineName:
    """The machine of a trace made for the compiler's decomposition: only its name is known."""

    def __init__(self, name: str):
        self.name = name


class CustomOp:
    """An op made by `pypto.register_op`: call it in a kernel (one node named `name`), or outside
    one on numpy arrays (its body evaluated by the numpy reference, step by step as the kernel
    would).  `row` is its registry row, `fn` the function."""

    def __init__(self, fn, name: str):
        self.fn = fn
        self.name = self.__name__ = name
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self.signature = inspect.signature(fn)
        code = getattr(fn, "__code__", None)
        self.loc = SourceLoc(code.co_filename, code.co_firstlineno, name) if code is not None else None
        self._bodies: dict = {}

    @property
    def row(self) -> Op:
        return OPS[self.name]

    def __repr__(self):
        where = f" ({self.loc.short()})" if self.loc is not None else ""
        return f"<pypto registered op {self.name}{self.signature}{where}>"

    def __reduce__(self):
        # by reference when its module holds it (the module registers it on import), else its
        # function by value (a notebook's op sent with a kernel to a sweep's worker process),
        # registered again where it is loaded
        import sys
        module = sys.modules.get(getattr(self, "__module__", None) or "")
        qualname = getattr(self, "__qualname__", "")
        if module is not None and module.__name__ != "__main__" and "." not in qualname \
                and getattr(module, qualname, None) is self:
            return qualname
        return (_restored, (self.fn, self.name))

    # --- calling it ------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise KernelSignatureError(f"{self.name}: {e}", loc=user_loc(), expected=f"{self.name}{self.signature}",
                                       got=_call_text(args, kwargs)) from None
        bound.apply_defaults()
        values = bound.arguments
        traced = [v for v in values.values() if isinstance(v, Tensor) and v._node is not None]
        if traced:
            return self._call_traced(traced[0]._ctx, values)
        arrays = {k: v for k, v in values.items() if isinstance(v, np.ndarray) or _is_torch(v)}
        if TraceContext._stack or not arrays:
            raise UnsupportedError(f"{self.name} expects a tensor of the kernel", loc=user_loc(),
                                   expected="a traced tensor (in a kernel) or numpy arrays (outside one)",
                                   got=_call_text(args, kwargs))
        return self._call_eager(values, arrays)

    def _split(self, values: dict, is_tensor) -> tuple[list[str], dict]:
        """(the names of the tensor parameters, the attrs) of bound arguments."""
        names, attrs = [], {}
        for name, v in values.items():
            if is_tensor(v):
                names.append(name)
            else:
                attrs[name] = _attr(self.name, name, v)
        return names, attrs

    def _call_traced(self, ctx: TraceContext, values: dict) -> Tensor:
        call_loc = ctx.loc or user_loc()

        def is_tensor(v):
            if isinstance(v, Tensor) and v._node is None:
                raise UnsupportedError(f"{self.name}: pypto.Tensor(shape, dtype) describes an argument of a kernel",
                                       loc=call_loc, expected="a tensor of the kernel", got=repr(v))
            return isinstance(v, Tensor)
        names, attrs = self._split(values, is_tensor)
        tensors = [values[k] for k in names]
        if any(t._ctx is not ctx for t in tensors):
            raise UnsupportedError(f"{self.name}: its tensors come from different kernels", loc=call_loc,
                                   expected="tensors of the kernel being traced", got=_call_text(tensors, {}))
        sub = TraceContext(self.name, ctx.machine)
        sub.dynamic, sub.cube_tile = ctx.dynamic, ctx.cube_tile
        before = len(ctx.nodes)
        body = self._trace(sub, [(t.shape, t.dtype) for t in tensors], names, attrs, call_loc)
        if len(ctx.nodes) != before:
            del ctx.nodes[before:]
            raise UnsupportedError(
                f"the body of registered op '{self.name}' computes with a tensor that is not one of its arguments",
                loc=call_loc, expected="a body that uses only its arguments", got="a tensor of the calling kernel",
                hint=f"pass the tensor to {self.name} as one more argument")
        ctx.loop_steps.extend(sub.loop_steps)
        ctx.machine_used = ctx.machine_used or sub.machine_used
        node_attrs = dict(attrs)
        if sub.machine_used and ctx.machine is not None:
            node_attrs["target"] = ctx.machine.name
        if ctx.cube_tile is not None and any(n.op == "matmul" for n in body.graph.nodes):
            node_attrs["cube_tile"] = ctx.cube_tile
        return ctx.add(self.name, tensors, body.out_shape, body.dtype, **node_attrs)

    def _trace(self, sub: TraceContext, specs, names, attrs, call_loc=None) -> _Body:
        """The body traced in `sub` on proxies of `specs` ((shape, dtype) per tensor parameter
        `names`) with `attrs`; an error in it names the body's line (and, with `call_loc`, is
        located at the call)."""
        try:
            with sub:
                proxies = [sub.input(k, shape, dtype, self.loc) for k, (shape, dtype) in zip(names, specs)]
                given = dict(zip(names, proxies))
                args = self.signature.bind_partial()
                args.arguments = {p: given[p] if p in given else attrs[p] for p in self.signature.parameters
                                  if p in given or p in attrs}
                out = self.fn(*args.args, **args.kwargs)
        except PyptoError as e:
            raise self._located(e, call_loc) from None
        except Exception as e:
            body = _body_frame(e.__traceback__)
            raise PyptoError(f"{type(e).__name__} in the body of registered op '{self.name}'"
                             + (f" at {body.short()}" if body else "") + f": {e}",
                             loc=call_loc or body).with_traceback(None) from e
        where = call_loc or self.loc
        if not isinstance(out, Tensor) or out._ctx is not sub:
            what = "a tuple" if isinstance(out, tuple) else repr(out) if isinstance(out, Tensor) else type(out).__name__
            raise UnsupportedError(f"registered op '{self.name}' must return one tensor computed from its arguments",
                                   loc=where, expected="return <a tensor>", got=f"return {what}"[:80],
                                   hint="register one op per result" if isinstance(out, (tuple, list)) else None)
        store = next((n for n in sub.nodes if n.op == "store"), None)
        if store is not None:
            raise UnsupportedError(
                f"the body of registered op '{self.name}' writes into its argument '{store.attrs['param']}'"
                + (f" at {store.loc.short()}" if store.loc else ""), loc=where,
                expected="a body that returns its result", got=f"a write into {store.attrs['param']}",
                hint="return the value instead; the kernel writes it: out[:] = op(...)")
        g = sub.graph()
        return _Body(g, out._node, g.node(out._node).shape, out.dtype, tuple(out.shape))

    def _located(self, e: PyptoError, call_loc: SourceLoc | None) -> PyptoError:
        """Error `e` of the body, at the call, its message naming the body's line."""
        if call_loc is None:
            return e.with_traceback(None)
        body = e.loc
        inner = body is not None and body != call_loc
        msg = e.message + (f" (in the body of registered op '{self.name}' at {body.short()})" if inner else
                           f" (in registered op '{self.name}')")
        hint = e.hint
        if inner and body.source_line().strip():
            hint = (hint + "; " if hint else "") + f"the body's line {body.short()}: {body.source_line().strip()}"
        new = type(e).__new__(type(e))
        new.__dict__.update(e.__dict__)
        PyptoError.__init__(new, msg, loc=call_loc, expected=e.expected, got=e.got, hint=hint)
        new.body_loc = getattr(e, "body_loc", None) or body
        return new

    def _call_eager(self, values: dict, arrays: dict) -> np.ndarray:
        """The op on numpy arrays: its body evaluated by the numpy reference, op by op."""
        from ..ir.tensor_eval import evaluate
        names, attrs = self._split(values, lambda v: v is not None and not isinstance(v, (numbers.Number, str, tuple,
                                                                                          list, dt.DType)))
        data = {}
        for k in names:
            a = values[k]
            a = a.detach().numpy() if _is_torch(a) else a
            if not isinstance(a, np.ndarray) or dt.from_numpy(a.dtype) is None:
                raise KernelSignatureError(f"{self.name}: argument '{k}' is not an array of a supported dtype",
                                           loc=user_loc(), expected=dt.supported_names(), got=repr(a)[:80])
            data[k] = a
        body = self.body([(a.shape, dt.from_numpy(a.dtype)) for a in data.values()], attrs, names=names,
                         call_loc=user_loc())
        vals: dict = {}
        with np.errstate(all="ignore"):
            evaluate(body.graph, data, vals)
        return np.asarray(vals[body.result])

    # --- the registry row's columns ---------------------------------------------------------
    def body(self, specs, attrs: dict, *, names=None, target=None, cube_tile=None, call_loc=None) -> _Body:
        """The body traced for tensors of `specs` ((shape, dtype) each) and `attrs` (cached)."""
        names = names or self._tensor_names(attrs, len(specs))
        key = (tuple((tuple(s), d) for s, d in specs), tuple(sorted(attrs.items(), key=lambda kv: kv[0])),
               target, cube_tile)
        try:
            hit = self._bodies.get(key)
        except TypeError:                   # an attr that does not hash: traced every time
            hit, key = None, None
        if hit is None:
            sub = TraceContext(self.name, _MachineName(target) if target else None)
            sub.cube_tile = cube_tile
            hit = self._trace(sub, specs, names, attrs, call_loc)
            if key is not None:
                while len(self._bodies) >= MAX_BODIES:
                    self._bodies.pop(next(iter(self._bodies)))
                self._bodies[key] = hit
        return hit

    def _tensor_names(self, attrs: dict, count: int) -> list[str]:
        names = [p for p in self.signature.parameters if p not in attrs]
        if len(names) != count:
            raise PyptoError(f"registered op '{self.name}' takes {len(names)} tensors here, not {count}",
                             expected=f"tensors for {', '.join(names)}", got=f"{count} inputs")
        return names

    @staticmethod
    def _own(attrs) -> tuple[dict, str | None, object]:
        """(the function's attrs, the machine name, the cube tile) of a node's attrs."""
        own = {k: v for k, v in attrs.items() if k not in RESERVED}
        return own, attrs.get("target"), attrs.get("cube_tile")

    def _decompose(self, b, inputs, attrs):
        own, target, cube = self._own(attrs)
        body = self.body([(tuple(b.shape(v)), b.dtype(v)) for v in inputs], own, target=target, cube_tile=cube)
        return replay(body, b, list(inputs))

    def _loose(self, shapes, attrs, dtypes=None) -> _Body:
        """The body for these shapes (dtypes: known ones, None for "some float"): one traced
        before with fitting dtypes, else traced with fp32 for the floats."""
        own, target, cube = self._own(attrs)
        dtypes = dtypes or [None] * len(shapes)
        want = tuple(tuple(s) for s in shapes)
        items = tuple(sorted(own.items(), key=lambda kv: kv[0]))
        for (specs, a, t, c), body in reversed(list(self._bodies.items())):
            if a == items and t == target and c == cube and tuple(s for s, _ in specs) == want and all(
                    d == have or (d is None and have.is_float) for d, (_, have) in zip(dtypes, specs)):
                return body
        return self.body([(s, d or dt.DT_FP32) for s, d in zip(want, dtypes)], own, target=target, cube_tile=cube)

    def _shape(self, shapes, attrs):
        try:
            return tuple(self._loose(shapes, attrs).shape)
        except PyptoError:
            return None

    def _ref(self, args, attrs):
        arrays = [np.asarray(a) for a in args]
        known = [None if a.dtype.kind == "f" else dt.from_numpy(a.dtype) for a in arrays]
        body = self._loose([a.shape for a in arrays], attrs, known)
        return evaluate_wide(body, arrays)

    def make_row(self) -> Op:
        doc = (inspect.getdoc(self.fn) or "").strip().split("\n\n")[0].replace("\n", " ")
        where = f" ({self.loc.short()})" if self.loc is not None else ""
        return Op(self.name, "composite", -1, doc or f"registered op {self.name}{where}", shape=self._shape,
                  ref=self._ref, wide=True, precision="inexact", decompose=self._decompose, float_only=False,
                  extra={"registered": True})

    # --- a kernel of it ------------------------------------------------------------------------
    def kernel(self, tensors, out: str = "out"):
        """A @pypto.jit kernel writing this op's result into its last parameter `out`: the
        parameters named in `tensors` are the op's tensors, the others keyword-only constants
        (their defaults the function's)."""
        from .jit import JitKernel
        params = list(self.signature.parameters.values())
        unknown = [t for t in tensors if t not in self.signature.parameters]
        if unknown:
            raise KernelSignatureError(f"registered op '{self.name}' has no parameter {unknown[0]!r}",
                                       expected=", ".join(self.signature.parameters), got=", ".join(tensors))
        while out in self.signature.parameters:
            out = "_" + out
        op = self
        names = [p.name for p in params if p.name in tensors]

        def run(*arrays, **consts):
            *ins, result = arrays
            ctx = TraceContext.current()
            ctx.loc = op.loc            # its nodes are the op's: named by its def line
            result[:] = op(**dict(zip(names, ins)), **consts)
        sig = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in names]
        sig.append(inspect.Parameter(out, inspect.Parameter.POSITIONAL_OR_KEYWORD))
        sig += [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY,
                                  default=None if p.default is p.empty else p.default)
                for p in params if p.name not in tensors]
        run.__signature__ = inspect.Signature(sig)
        run.__name__ = run.__qualname__ = self.name
        run.__doc__ = f"registered op {self.name}, its result written into `{out}`"
        return JitKernel(run)

    def result_spec(self, specs, attrs, machine: str | None = None) -> Tensor:
        """The shape and dtype of the op's result for tensor specs (`pypto.Tensor`s, named by
        the op's parameters) and attrs, traced for `machine` (a name)."""
        names = [s.name for s in specs]
        own = {k: _attr(self.name, k, v) for k, v in attrs.items()}
        for p in self.signature.parameters.values():
            if p.name not in names and p.name not in own and p.default is not p.empty:
                own[p.name] = _attr(self.name, p.name, p.default)
        body = self.body([(s.shape, s.dtype) for s in specs], own, names=names, target=machine)
        return Tensor(body.shape, body.dtype)


def replay(body: _Body, b, inputs: list):
    """The ops of `body` emitted on Builder `b` over `inputs` (one per input node); returns the
    value of its result.  The builder's `extra` attrs join every op (its `tile` those that take
    a vector tile and set none); composites in it are decomposed in turn.  A `pypto.fuse()`
    region of the body becomes a region of this call (the call's own region, when it is in one)."""
    extra = dict(getattr(b, "extra", None) or {})
    tile = extra.pop("tile", None)
    regions: dict = {}
    # the body's regions are this call's: named by its inputs (ids of a graph's nodes), else numbered
    call = ("(" + ",".join(f"%{i}" for i in inputs) + ")" if all(isinstance(i, int) for i in inputs)
            else f"#{next(_REGION_IDS)}")
    vals: dict = {}
    k = 0
    for n in body.graph.nodes:
        if n.op == "input":
            vals[n.id] = inputs[k]
            k += 1
            continue
        ins = [vals[i] for i in n.inputs]
        if n.op == "const":
            vals[n.id] = b.emit("const", [], n.shape, n.dtype, {"value": n.attrs["value"]})
            continue
        row = OPS[n.op]
        attrs = {**extra, **dict(n.attrs)}
        if "fuse" in n.attrs:
            attrs["fuse"] = extra.get("fuse") or regions.setdefault(
                n.attrs["fuse"], FuseRegion(f"{body.graph.name}{call}.{n.attrs['fuse']}", n.attrs["fuse"].loc))
        if row.kind == "composite":
            saved = b.__dict__.get("extra", _MISSING) if hasattr(b, "__dict__") else _MISSING
            own_tile = n.attrs.get("tile", tile)
            b.extra = {**extra, **({"fuse": attrs["fuse"]} if "fuse" in attrs else {}),
                       **({"tile": own_tile} if own_tile is not None else {})}
            try:
                out = row.decompose(b, ins, n.attrs)
            finally:
                if saved is _MISSING:
                    del b.extra
                else:
                    b.extra = saved
            out = b.cast(out, n.dtype)
            if tuple(b.shape(out)) != tuple(n.shape):
                out = b.reshape(out, n.shape)
            vals[n.id] = out
            continue
        if tile is not None and row.kind in TILED_KINDS and "tile" not in attrs:
            attrs["tile"] = tile
        vals[n.id] = b.emit(n.op, ins, n.shape, n.dtype, attrs)
    return vals[body.result]


_REGION_IDS = itertools.count(1)
_MISSING = object()


def evaluate_wide(body: _Body, arrays: list) -> np.ndarray:
    """The body's result on numpy `arrays` by the registry's references, floats in float64
    (rounded once, by the caller, to the op's dtype)."""
    vals: dict = {}
    k = 0
    with np.errstate(all="ignore"):
        for n in body.graph.nodes:
            if n.op == "input":
                a = np.asarray(arrays[k])
                k += 1
                vals[n.id] = a.astype(np.float64) if a.dtype.kind == "f" else a
                continue
            if n.op == "const":
                vals[n.id] = np.asarray(n.attrs["value"], np.float64 if n.dtype.is_float else n.dtype.np_dtype)
                continue
            row = OPS[n.op]
            if row.ref is None:
                raise UnsupportedError(f"no numpy rule for tensor op '{n.op}'", loc=n.loc)
            y = np.asarray(row.ref([vals[i] for i in n.inputs], n.attrs))
            vals[n.id] = y.astype(np.float64) if n.dtype.is_float else y.astype(n.dtype.np_dtype, copy=False)
    return vals[body.result]


# ---------------------------------------------------------------------------------------
# registering

def register_op(fn=None, *, name: str | None = None, replace: bool = False):
    """Decorator: `@pypto.register_op` or `@pypto.register_op(name="my_op")` makes a Python
    function of pypto ops one named op (see the module's doc); returns the `CustomOp`.

    Registering a name again: the same function gives the same op; a redefinition of it (the
    same module and qualified name: a notebook cell run again, a module reloaded) or
    `replace=True` replaces it (kernels compiled with the old one recompile); any other function
    is an error, as is the name of a built-in op."""
    if fn is None:
        return lambda f: register_op(f, name=name, replace=replace)
    loc = caller_loc()
    if not callable(fn) or isinstance(fn, CustomOp):
        raise PyptoError("pypto.register_op registers a Python function", loc=loc,
                         expected="@pypto.register_op above a def", got=type(fn).__name__)
    name = name if name is not None else getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise PyptoError("the name of a registered op must be an identifier", loc=loc,
                         expected='e.g. name="my_quantize"', got=repr(name))
    existing = _REGISTERED.get(name)
    if existing is None and name in OPS:
        raise PyptoError(f"'{name}' is a built-in op", loc=loc, expected="a name of no built-in op", got=name,
                         hint=f'register it under another name: @pypto.register_op(name="my_{name}")')
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise PyptoError(f"the signature of '{name}' cannot be read", loc=loc, expected="a Python function",
                         got=repr(fn)[:80]) from None
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise PyptoError(f"registered op '{name}' takes *{p.name}", loc=loc,
                             expected="named parameters (tensors and attributes)",
                             got=f"{'*' if p.kind == p.VAR_POSITIONAL else '**'}{p.name}",
                             hint="an op's node names its attributes: give every argument a parameter")
        if p.name in RESERVED:
            raise PyptoError(f"registered op '{name}' has a parameter named '{p.name}', an attribute pypto sets",
                             loc=loc, expected="a name other than " + ", ".join(sorted(RESERVED)), got=p.name)
    if existing is not None:
        if existing.fn is fn:
            return existing
        if not (replace or _redefinition(existing.fn, fn)):
            was = f" at {existing.loc.short()}" if existing.loc is not None else ""
            raise PyptoError(f"an op named '{name}' is already registered{was}", loc=loc,
                             expected="a new name, or the same function", got=_qualname(fn),
                             hint=f'register it under another name (@pypto.register_op(name="...")), or pass '
                                  f"replace=True to replace '{name}'")
        _GENERATION[0] += 1
    op = CustomOp(fn, name)
    OPS[name] = op.make_row()
    _REGISTERED[name] = op
    functools.update_wrapper(op, fn, assigned=("__module__", "__qualname__"), updated=())
    return op


def _restored(fn, name: str) -> CustomOp:
    existing = _REGISTERED.get(name)
    if existing is not None and existing.fn is fn:
        return existing
    return register_op(fn, name=name, replace=True)


def unregister_op(op) -> None:
    """Remove a registered op (by its `CustomOp` or name) from the registry."""
    name = op.name if isinstance(op, CustomOp) else op
    if name not in _REGISTERED:
        raise PyptoError(f"no registered op named {name!r}", loc=caller_loc(),
                         expected=", ".join(sorted(_REGISTERED)) or "no registered op", got=repr(name))
    del _REGISTERED[name]
    OPS.pop(name, None)
    _GENERATION[0] += 1


def _redefinition(old, new) -> bool:
    return (getattr(old, "__module__", None), getattr(old, "__qualname__", None)) == \
        (getattr(new, "__module__", None), getattr(new, "__qualname__", None))


def _qualname(fn) -> str:
    code = getattr(fn, "__code__", None)
    where = f" ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})" if code is not None else ""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}{where}"


def _attr(op: str, name: str, v):
    """An argument as a node attribute (a hashable Python value)."""
    if isinstance(v, list):
        v = tuple(v)
    if isinstance(v, tuple):
        for x in v:
            _attr(op, name, x)
        return v
    if v is None or isinstance(v, (numbers.Number, str, dt.DType)) and not isinstance(v, complex):
        if isinstance(v, np.generic):
            return v.item()
        return v
    hint = None
    if isinstance(v, np.ndarray) or isinstance(v, Tensor):
        hint = "data reaches a kernel through its arguments: pass the array to the kernel as one more tensor"
    raise UnsupportedError(f"{op}: argument '{name}' is neither a tensor of the kernel nor an attribute",
                           loc=user_loc(), expected="a tensor, or a Python number, bool, str, None or dtype",
                           got=f"{type(v).__name__} {v!r}"[:80], hint=hint)


def _is_torch(v) -> bool:
    return hasattr(v, "detach") and hasattr(v, "numpy") and not isinstance(v, Tensor)


def _call_text(args, kwargs) -> str:
    parts = [repr(a)[:40] for a in args] + [f"{k}={v!r}"[:40] for k, v in kwargs.items()]
    return "(" + ", ".join(parts) + ")"


def _body_frame(tb) -> SourceLoc | None:
    """The innermost frame of the user's code in traceback `tb`."""
    loc = None
    for fs in traceback.extract_tb(tb):
        if not in_package(fs.filename):
            loc = SourceLoc(fs.filename, fs.lineno, fs.name, getattr(fs, "colno", None), None)
    return loc


# ---------------------------------------------------------------------------------------
# fusion regions

class fuse:
    """A region of a kernel that the fusion pass keeps in one group (or says, at the op that
    breaks it, why it cannot):

        with pypto.fuse():
            e = pypto.exp(x - m)
            out[:] = e * scale

    or, on a helper function of the kernel, `@pypto.fuse` (each call is a region).  A region
    inside a region is the outer one.  Compile options {"fusion": False} leave regions unkept."""

    def __init__(self, fn=None):
        self.fn = fn
        self._open: list = []
        if fn is not None:
            functools.update_wrapper(self, fn)

    def __enter__(self) -> FuseRegion:
        ctx = TraceContext.current("pypto.fuse()")
        self._open.append((ctx, ctx.fuse))
        if ctx.fuse is None:
            ctx.fuse_count += 1
            ctx.fuse = FuseRegion(ctx.fuse_count, user_loc())
        return ctx.fuse

    def __exit__(self, *exc):
        ctx, saved = self._open.pop()
        ctx.fuse = saved

    def __call__(self, *args, **kwargs):
        if self.fn is None:
            raise PyptoError("pypto.fuse() is a region: use it in a `with` statement", loc=user_loc(),
                             expected="with pypto.fuse(): ...  (or @pypto.fuse above a helper function)",
                             got="pypto.fuse()(...)")
        with fuse():
            return self.fn(*args, **kwargs)


# ---------------------------------------------------------------------------------------
# implementations by machine

class TargetSpecific:
    """Implementations by machine name (`pypto.target_specific`): calling it in a kernel calls
    the one of the machine being compiled for, else the one under "default"."""

    def __init__(self, impls):
        loc = caller_loc()
        if not isinstance(impls, dict) or not impls:
            raise PyptoError("pypto.target_specific takes a dict of implementations by machine name", loc=loc,
                             expected='{"a2a3": f, "a5": g, "default": h}', got=repr(impls)[:80])
        for k, f in impls.items():
            if not isinstance(k, str):
                raise PyptoError("pypto.target_specific: a key is not a machine name", loc=loc,
                                 expected='machine names ("a2a3", "a5", "teach", ...) or "default"', got=repr(k))
            if not callable(f):
                raise PyptoError(f"pypto.target_specific: the implementation for {k!r} is not callable", loc=loc,
                                 expected="a function", got=f"{type(f).__name__} {f!r}"[:80])
        self.impls = dict(impls)

    def choose(self, machine: str | None):
        """The implementation for machine `machine` (a name), or None."""
        return self.impls.get(machine) if machine is not None and machine in self.impls else self.impls.get("default")

    def __call__(self, *args, **kwargs):
        ctx = TraceContext.current("pypto.target_specific(...)")
        name = getattr(ctx.machine, "name", None)
        ctx.machine_used = True
        impl = self.choose(name)
        if impl is None:
            keys = ", ".join(repr(k) for k in self.impls)
            raise UnsupportedError(
                f"pypto.target_specific has no implementation for machine {name!r}" if name else
                "pypto.target_specific: the machine is not known in this trace, and there is no 'default'",
                loc=user_loc(), expected=f"one of the keys {keys}, or a 'default' key", got=repr(name),
                hint=f'add "{name}": <function> or "default": <function> to the dict' if name else
                'add "default": <function> to the dict')
        return impl(*args, **kwargs)

    def __repr__(self):
        return f"<pypto.target_specific {', '.join(self.impls)}>"


def target_specific(impls: dict) -> TargetSpecific:
    """`pypto.target_specific({"a2a3": f, "a5": g, "default": h})(*args)`: inside a kernel, calls
    the implementation of the machine the kernel is compiled for (by its name), else "default";
    neither is a located error listing the keys."""
    return TargetSpecific(impls)
