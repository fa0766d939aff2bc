"""The op registry: one row per Tensor-level op, read by every pass and engine.

A row (`Op`) holds all the compiler knows of an op:

- `kind` and `arity`: how the passes treat it (unary, binary, reduce, matmul, cast, layout,
  composite, ...) and how many tensor inputs it takes;
- `shape`: the shape rule (input shapes, attrs -> result shape, or None when they do not fit);
- `ref`: the numpy reference semantics (the reference evaluator `tensor_eval` calls it), and
  `wide`: whether the reference computes a float result in float64 and rounds once (several
  numpy steps) rather than in the value's dtype (one correctly rounded numpy call);
- `precision`: the autocast class ("inexact", "exact", "accumulate" or "declared", see
  `compiler/autocast.py`) and `amplifies`: whether the op magnifies its operand's rounding
  (a sum by n, exp by abs(x), log by 1/abs(log x));
- `bound`: the first-order error rule of the honest check (`numerics.py`): operand Approx
  values and attrs -> the result's Approx before its own rounding;
- algebra: `commutative`, `identity` (x op identity == x, on the right; on both sides when
  commutative), `involution` (f(f(x)) == x), `idempotent` (f(f(x)) == f(x)), `reassociates`
  ((x op c1) op c2 may become x op (c1 op c2));
- `tile`: the lowering, as the PTO math it applies (`target.isa.find(tile, form)` gives the
  opcode), or `decompose`: the op written in other ops on a `Builder` -- the compiler's
  decomposition pass and the honest check's bounds both run it;
- `float_only`, `doc`; room for what later work adds per op (`grad`, `quant`).

Adding an element-wise op is one row here (with a `decompose` when it is built from others, or
a `tile` naming the instruction that computes it, which is one entry in target/isa.py): the
frontend makes `pypto.<name>` from a row with a `signature` when it defines no function of that
name (an op with Python-number arguments, such as leaky_relu's slope, has its own function).  `tests/test_registry.py` fails
when a row lacks a column its kind needs, or names an instruction without semantics or cost.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .core import broadcast_shapes, region_slices

GELU_C = 0.7978845608028654         # sqrt(2 / pi)
LN2 = 0.6931471805599453
LN10 = 2.302585092994046


# ---------------------------------------------------------------------------------------
# the builder decompositions are written on

class Builder:
    """What a decomposition writes its ops with.  Subclasses define `emit(op, inputs, shape,
    dtype, attrs) -> value`, `shape(value)` and `dtype(value)`; the compiler's emits graph nodes,
    the honest check's computes values with their error bounds."""

    extra: dict = {}            # attrs added to every emitted op (the compiler's tile shape)

    def emit(self, op, inputs, shape, dtype, attrs=None):  # pragma: no cover - abstract
        raise NotImplementedError

    def shape(self, v):  # pragma: no cover - abstract
        raise NotImplementedError

    def dtype(self, v):  # pragma: no cover - abstract
        raise NotImplementedError

    def const(self, value, dtype):
        return self.emit("const", [], (), dtype, {"value": float(value) if dtype.is_float else int(value)})

    def un(self, op, a):
        return self.emit(op, [a], self.shape(a), self.dtype(a), dict(self.extra))

    def bin(self, op, a, b):
        return self.emit(op, [a, b], broadcast_shapes(self.shape(a), self.shape(b)), self.dtype(a), dict(self.extra))

    def bins(self, op, a, scalar):
        return self.bin(op, a, self.const(scalar, self.dtype(a)))

    def red(self, op, a, dim):
        s = list(self.shape(a))
        s[dim] = 1
        return self.emit(op, [a], s, self.dtype(a), {"dim": dim, "keepdim": True, **self.extra})

    def cmp(self, op, a, b):
        from ..dtypes import DT_BOOL
        return self.emit(op, [a, b], broadcast_shapes(self.shape(a), self.shape(b)), DT_BOOL, dict(self.extra))

    def cmps(self, op, a, scalar):
        return self.cmp(op, a, self.const(scalar, self.dtype(a)))

    def select(self, mask, a, b):
        shape = broadcast_shapes(broadcast_shapes(self.shape(mask), self.shape(a)), self.shape(b))
        return self.emit("where", [mask, a, b], shape, self.dtype(a), dict(self.extra))

    def cast(self, a, dtype):
        if self.dtype(a) == dtype:
            return a
        return self.emit("cast", [a], self.shape(a), dtype, {"to": dtype.name, **self.extra})

    def reshape(self, a, shape):
        shape = tuple(shape)
        return a if shape == tuple(self.shape(a)) else self.emit("reshape", [a], shape, self.dtype(a),
                                                                  {"shape": shape})

    def view(self, a, shape, offsets, steps=None):
        attrs = {"shape": tuple(shape), "offsets": tuple(offsets)}
        if steps is not None and any(k != 1 for k in steps):
            attrs["steps"] = tuple(steps)
        return self.emit("view", [a], tuple(shape), self.dtype(a), attrs)

    # --- what gradient rules write with (see "gradient rules" below)

    def zeros(self, shape, dtype):
        shape = tuple(shape)
        return self.emit("full", [], shape, dtype, {"shape": shape, "value": 0.0 if dtype.is_float else 0,
                                                    **self.extra})

    def scratch(self, shape, dtype):
        """A fresh tensor (zeros until written): the base of writes and scatters."""
        return self.emit("scratch", [], tuple(shape), dtype, {"shape": tuple(shape)})

    def write(self, dst, v, offsets, shape, steps=None):
        attrs = {"offsets": tuple(offsets), "shape": tuple(shape)}
        if steps is not None and any(k != 1 for k in steps):
            attrs["steps"] = tuple(steps)
        return self.emit("write", [dst, v], self.shape(dst), self.dtype(dst), attrs)

    def expand(self, a, shape):
        shape = tuple(shape)
        return a if tuple(self.shape(a)) == shape else self.emit("expand", [a], shape, self.dtype(a), {"shape": shape})

    def sum_to(self, a, shape):
        """a summed over the dims it was broadcast along to reach its shape from `shape`."""
        shape, s = tuple(shape), tuple(self.shape(a))
        if s == shape:
            return a
        lead = len(s) - len(shape)
        for d in range(len(s)):
            if s[d] != 1 and (d < lead or shape[d - lead] == 1):
                a = self.red("sum", a, d)
        return self.reshape(a, shape)

    def transpose(self, a, dim0, dim1):
        d0, d1 = sorted((dim0, dim1))
        s = list(self.shape(a))
        s[d0], s[d1] = s[d1], s[d0]
        return self.emit("transpose", [a], tuple(s), self.dtype(a), {"dim0": d0, "dim1": d1})

    def matmul(self, a, b, a_trans=False, b_trans=False, out_dtype=None):
        out_dtype = out_dtype or self.dtype(a)
        return self.emit("matmul", [a, b], matmul_shape(self.shape(a), self.shape(b), a_trans, b_trans), out_dtype,
                         {"a_trans": bool(a_trans), "b_trans": bool(b_trans), "out_dtype": out_dtype.name})


# ---------------------------------------------------------------------------------------
# the row

@dataclass(frozen=True)
class Op:
    name: str
    kind: str                       # input const unary binary reduce matmul cast layout composite store
    arity: int                      # tensor inputs (-1: variable)
    doc: str = ""
    shape: Callable | None = None   # (input shapes, attrs) -> result shape | None
    ref: Callable | None = None     # (numpy args, attrs) -> numpy result
    wide: bool = False              # the reference computes floats in float64, rounded once
    precision: str = "declared"     # inexact | exact | accumulate | declared
    amplifies: bool = False
    bound: Callable | None = None   # (operand Approx values, attrs) -> Approx before rounding
    commutative: bool = False
    identity: float | None = None
    involution: bool = False
    reassociates: bool = False      # (x op c1) op c2 -> x op (c1 op c2) is allowed
    idempotent: bool = False
    tile: str = ""                  # the PTO math of its lowering (target.isa.find(tile, form))
    combine: str = ""               # reduce: the binary op that joins partial results of tiles
    scalar_left: tuple = ()         # non-commutative binary: c op x = binary(unary(x), c)
    decompose: Callable | None = None   # (builder, inputs, attrs) -> value
    float_only: bool = False
    grad: Callable | None = None    # (builder, inputs, output, cotangent, attrs) -> input cotangents
    api: str = ""                   # its public name, when it differs (recip: pypto.reciprocal)
    signature: str = ""             # "x" / "a, b": the frontend makes pypto.<name> from the row
    #                                 itself when it defines none (an element-wise op of tensors)
    extra: dict = field(default_factory=dict)


def _same(shapes, attrs):
    return tuple(shapes[0])


def _bcast(shapes, attrs):
    return broadcast_shapes(tuple(shapes[0]), tuple(shapes[1]))


def _bcast_all(shapes):
    out = ()
    for s in shapes:
        out = broadcast_shapes(out, tuple(s))
        if out is None:
            return None
    return out


def _reduced(shapes, attrs):
    s, d = list(shapes[0]), attrs["dim"]
    if not 0 <= d < len(s):
        return None
    if attrs["keepdim"]:
        s[d] = 1
    else:
        del s[d]
    return tuple(s)


def _from_attr(shapes, attrs):
    return tuple(attrs["shape"])


def _transposed(shapes, attrs):
    s = list(shapes[0])
    a, b = attrs["dim0"], attrs["dim1"]
    s[a], s[b] = s[b], s[a]
    return tuple(s)


def matmul_shape(a, b, a_trans=False, b_trans=False):
    if len(a) < 2 or len(b) < 2:
        return None
    m, k = (a[-1], a[-2]) if a_trans else (a[-2], a[-1])
    k2, n = (b[-1], b[-2]) if b_trans else (b[-2], b[-1])
    if k != k2:
        return None
    batch = broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    if batch is None:
        return None
    return tuple(batch) + (m, n)


# --- numpy reference helpers ---

def acc_dtype(dtype):
    """The reference accumulates float sums in higher precision than the kernel's dtype."""
    if dtype == np.float32:
        return np.float64
    if np.issubdtype(dtype, np.integer):
        return None
    return np.float32


def _np_reduce(f):
    return lambda args, a: f(args[0], axis=a["dim"], keepdims=a["keepdim"])


def _np_sum(args, a):
    return np.sum(args[0], axis=a["dim"], keepdims=a["keepdim"], dtype=acc_dtype(args[0].dtype))


def _np_matmul(args, a):
    x, y = args
    if a["a_trans"]:
        x = np.swapaxes(x, -1, -2)
    if a["b_trans"]:
        y = np.swapaxes(y, -1, -2)
    acc = np.int32 if x.dtype == np.int8 else np.float64
    return np.matmul(x.astype(acc), y.astype(acc))


def _np_write(args, a):
    out = np.array(args[0], copy=True)
    out[region_slices(a["offsets"], a["shape"], a.get("steps"))] = np.reshape(args[1], a["shape"])
    return out


def _write_bound(ins, a):
    state, v = ins
    region = region_slices(a["offsets"], a["shape"], a.get("steps"))
    val, err = np.array(state.v, dtype=np.float64, copy=True), np.array(state.full_e, copy=True)
    val[region] = np.reshape(v.v, a["shape"])
    err[region] = np.reshape(v.full_e, a["shape"])
    return state.__class__(val, err)


def _np_window(args, a):
    return args[0][region_slices(a["offsets"], a["shape"], a.get("steps"))]


def _np_softmax(args, a):
    x = args[0]
    e = np.exp(x - x.max(axis=a["dim"], keepdims=True))
    return e / e.sum(axis=a["dim"], keepdims=True)


def _np_log_softmax(args, a):
    x = args[0]
    s = x - x.max(axis=a["dim"], keepdims=True)
    return s - np.log(np.exp(s).sum(axis=a["dim"], keepdims=True))


def _np_logsumexp(args, a):
    x = args[0]
    m = x.max(axis=a["dim"], keepdims=True)
    r = m + np.log(np.exp(x - m).sum(axis=a["dim"], keepdims=True))
    return r if a["keepdim"] else np.squeeze(r, a["dim"])


def _np_var(args, a):
    return np.var(args[0], axis=a["dim"], keepdims=a["keepdim"], ddof=a["correction"])


def _np_rms_norm(args, a):
    x = args[0]
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + a["eps"]) * args[1]


def _np_layernorm(args, a):
    """(x - mean) / sqrt(var + eps) * w + b, var the mean of squared deviations.  (Each step into
    the one array of deviations where it keeps its dtype: a 32M-element reference makes one
    large temporary instead of five; the same operations, the same bits.)"""
    x = args[0]
    mu = x.mean(axis=-1, keepdims=True)
    d = x - mu
    var = np.square(d).mean(axis=-1, keepdims=True)
    r = np.true_divide(d, np.sqrt(var + a["eps"]), out=d if d.dtype == np.result_type(d, var) else None)
    rest = list(args[1:])
    for key in ("has_weight", "has_bias"):
        if a[key]:
            y = rest.pop(0)
            f = np.multiply if key == "has_weight" else np.add
            r = f(r, y, out=r if r.shape == np.broadcast_shapes(r.shape, np.shape(y))
                  and r.dtype == np.result_type(r, y) else None)
    return r


def _np_sigmoid(x):
    return np.reciprocal(np.exp(-x) + np.ones((), x.dtype))


def _np_gelu(x):  # 0.5 x (1 + tanh(z)) = x sigmoid(2z): the same function, without cancellation for z << 0
    return x / (1.0 + np.exp(-2.0 * GELU_C * (x + 0.044715 * x * x * x)))


def _np_halves(x, dim):
    n = x.shape[dim] // 2
    return np.take(x, range(n), axis=dim), np.take(x, range(n, 2 * n), axis=dim)


# --- error-bound helpers (operands are numerics.Approx values: .v, .e and their methods) ---

# The check (`numerics`) passes a result within SAFETY x its bound of the reference: the chip's
# value and the reference's are each within the bound of the exact one, and a factor of 2 covers
# the second-order terms the analysis drops.  So where a result jumps (a comparison, a rounding to
# an integer, a remainder), the chip may be on the other side of the jump whenever the reference
# is within SAFETY x the bound of it: there the rules make no claim.
SAFETY = 4.0

def _exact(ins, a):
    return ins[0].__class__(ins[0].v, ins[0].e)


def _known(e):
    """A bound with NaN (unknown: 0 x inf upstream) made infinite, for the rules that branch on
    whether a bound is 0 or small (a NaN compares False both ways and would read as exact)."""
    e = np.asarray(e, np.float64)
    return np.where(np.isnan(e), np.inf, e)


def _compare_bound(np_fn):
    """A comparison is exact where its operands are farther apart than SAFETY x their bounds;
    where the chip's may be on either side (or equal), the mask is unknown: an infinite bound (no
    claim).  So is
    it where a reference operand is NaN but may be a number on the chip (a bound above 0: the
    reference's 0 x inf is NaN, the chip's tiny x inf an inf, and NaN >= v is False, inf >= v
    True)."""
    def rule(ins, a):
        x, y = ins
        e = _known(x.e + y.e)
        with np.errstate(invalid="ignore"):
            d = np.abs(x.v - y.v)
            near = (e > 0) & ((d <= SAFETY * e) | np.isnan(d))
        return x.__class__(np_fn(x.v, y.v), np.where(near, np.inf, 0.0))
    return rule


def _select_bound(ins, a):
    m, x, y = ins
    e = np.where(np.asarray(m.v, bool), x.full_e if np.ndim(x.e) else x.e, y.full_e if np.ndim(y.e) else y.e)
    e = np.where(~(np.asarray(m.e) <= 0), np.inf, e)    # an unknown mask (bound > 0 or NaN) selects an unknown side
    return x.__class__(np.where(np.asarray(m.v, bool), x.v, y.v), e)


def _layout_bound(f):
    """A layout op moves values and their bounds alike."""
    return lambda ins, a: ins[0].__class__(f(ins[0].v, a), f(ins[0].full_e, a))


def _largest(f):
    return lambda ins, a: ins[0].__class__(f(ins[0].v, ins[1].v), np.maximum(ins[0].e, ins[1].e))


# ---------------------------------------------------------------------------------------
# decompositions: the op in other ops, on a Builder (every inner step in the op's dtype; the
# autocast pass then decides which fp16/bf16 steps compute in fp32)

def _sigmoid(b, x):
    e = b.un("exp", b.un("neg", x))
    return b.un("recip", b.bins("add", e, 1.0))


def _mean(b, x, dim):
    return b.bins("mul", b.red("sum", x, dim), 1.0 / b.shape(x)[dim])


def _drop(b, x, dim, keepdim):
    """A keepdim result with `dim` dropped unless keepdim."""
    if keepdim:
        return x
    s = list(b.shape(x))
    del s[dim]
    return b.reshape(x, s)


def _var(b, x, dim, correction=1):
    d = b.bin("sub", x, _mean(b, x, dim))
    n = b.shape(x)[dim]
    return b.bins("mul", b.red("sum", b.bin("mul", d, d), dim), 1.0 / max(n - correction, 0) if n > correction
                  else float("inf"))


def _log_softmax_keep(b, x, dim):
    s = b.bin("sub", x, b.red("amax", x, dim))
    return b.bin("sub", s, b.un("log", b.red("sum", b.un("exp", s), dim)))


def _softmax(b, ins, a):
    x, dim = ins[0], a["dim"]
    e = b.un("exp", b.bin("sub", x, b.red("amax", x, dim)))
    return b.bin("div", e, b.red("sum", e, dim))


def _logsumexp(b, ins, a):
    x, dim = ins[0], a["dim"]
    m = b.red("amax", x, dim)
    r = b.bin("add", m, b.un("log", b.red("sum", b.un("exp", b.bin("sub", x, m)), dim)))
    return _drop(b, r, dim, a["keepdim"])


def _gelu(b, ins, a):
    """0.5 x (1 + tanh(c (x + 0.044715 x^3))), computed as x * sigmoid(2c (x + 0.044715 x^3)):
    the same function (1 + tanh(z) = 2 sigmoid(2z)) in five fewer vector ops."""
    x = ins[0]
    x3 = b.bin("mul", b.bin("mul", x, x), x)
    inner2 = b.bins("mul", b.bin("add", x, b.bins("mul", x3, 0.044715)), 2.0 * GELU_C)
    return b.bin("mul", x, _sigmoid(b, inner2))


# erf(x) = x P(x^2) for |x| < 1; 1 - exp(-x^2) t Q(t), t = 1 / (1 + 0.3 |x|), above; odd.  The
# coefficients are this project's own weighted minimax fits (Lawson's iteration on 40-digit
# values): relative error 1.3e-9 on [0, 1], absolute error 1.1e-10 on [1, inf) in exact
# arithmetic, 2.6 fp32 ulps at most when evaluated in fp32.
ERF_SMALL = (1.1283791657274902, -0.376126258263075, 0.11283585164480886, -0.026853812457739185,
             0.005188328524412006, -0.0008010200100023596, 7.853880603271579e-05)
ERF_LARGE = (0.14815733787184748, 0.36084570206865685, -0.5600178865469502, 1.5791698082987358,
             -1.4237033027860893, 0.8955316324327934)
ERF_T = 0.3


def _horner(b, x, coeffs):
    """c0 + x (c1 + x (c2 + ...)), the coefficients as constants of x's dtype."""
    out = b.bins("add", b.bins("mul", x, coeffs[-1]), coeffs[-2])
    for c in coeffs[-3::-1]:
        out = b.bins("add", b.bin("mul", out, x), c)
    return out


def _erf(b, x):
    def positive(a):
        s = b.bin("mul", a, a)
        small = b.bin("mul", a, _horner(b, s, ERF_SMALL))
        t = b.un("recip", b.bins("add", b.bins("mul", a, ERF_T), 1.0))
        tail = b.bin("mul", b.un("exp", b.un("neg", s)), b.bin("mul", _horner(b, t, ERF_LARGE), t))
        large = b.bin("sub", b.const(1.0, b.dtype(a)), tail)
        return b.select(b.cmps("lt", a, 1.0), small, large)
    return _odd(b, x, positive)


def _np_erf(x):
    import math
    return np.vectorize(math.erf, otypes=[np.float64])(np.asarray(x, np.float64))


def _rms_norm(b, ins, a):
    x, w = ins
    last = len(b.shape(x)) - 1
    r = b.un("rsqrt", b.bins("add", _mean(b, b.bin("mul", x, x), last), a["eps"]))
    return b.bin("mul", b.bin("mul", x, r), w)


def _layernorm(b, ins, a):
    x, rest = ins[0], list(ins[1:])
    last = len(b.shape(x)) - 1
    d = b.bin("sub", x, _mean(b, x, last))
    var = _mean(b, b.bin("mul", d, d), last)
    out = b.bin("mul", d, b.un("rsqrt", b.bins("add", var, a["eps"])))
    if a["has_weight"]:
        out = b.bin("mul", out, rest.pop(0))
    if a["has_bias"]:
        out = b.bin("add", out, rest.pop(0))
    return out


def _swiglu(b, ins, a):
    x, dim = ins[0], a["dim"]
    s = list(b.shape(x))
    n = s[dim] // 2
    s[dim] = n
    lo = b.view(x, s, [0] * len(s))
    hi = b.view(x, s, [n if d == dim else 0 for d in range(len(s))])
    return b.bin("mul", b.bin("mul", lo, _sigmoid(b, lo)), hi)


def _clamp(b, x, lo, hi):
    if lo is not None:
        x = b.bins("maximum", x, lo)
    if hi is not None:
        x = b.bins("minimum", x, hi)
    return x


def _sign(b, x):
    """(x > 0) - (x < 0), as a select of constants: -1, 0, 1 (and x itself where x is nan or 0)."""
    d = b.dtype(x)
    neg = b.select(b.cmps("lt", x, 0), b.const(-1, d), x)
    return b.select(b.cmps("gt", x, 0), b.const(1, d), neg)


def _pow(b, x, y):
    """x ** y for a Python number y."""
    if y == 0.5:
        return b.un("sqrt", x)
    if y == -0.5:
        return b.un("rsqrt", x)
    if float(y).is_integer() and abs(y) <= 16:
        k, out, base = int(abs(y)), None, x
        while k:                            # binary exponentiation: x^13 = x^8 x^4 x
            if k & 1:
                out = base if out is None else b.bin("mul", out, base)
            k >>= 1
            if k:
                base = b.bin("mul", base, base)
        if out is None:                     # x ** 0
            return b.bins("add", b.bins("mul", x, 0.0), 1.0)
        return b.un("recip", out) if y < 0 else out
    return b.un("exp", b.bins("mul", b.un("log", x), float(y)))


def _composite(name, arity, doc, ref, decompose, shape=_same, wide=True, float_only=True,
               precision_class="inexact", **kw) -> Op:
    return Op(name, "composite", arity, doc, shape, ref, wide, precision_class, decompose=decompose,
              float_only=float_only, **kw)


def _elementwise(name, doc, np_fn, decompose, **kw) -> Op:
    """A float element-wise op written in other ops: one row."""
    kw.setdefault("signature", "x")
    return _composite(name, 1, doc, lambda args, a: np_fn(args[0]), lambda b, ins, a: decompose(b, ins[0]), **kw)


def _unary(name, tile, doc, np_fn, precision, bound, float_only=True, wide=False, **kw) -> Op:
    kw.setdefault("signature", "x")
    return Op(name, "unary", 1, doc, _same, lambda args, a: np_fn(args[0]), wide, precision, bound=bound,
              tile=tile, float_only=float_only, **kw)


def _binary(name, tile, doc, np_fn, precision, bound, **kw) -> Op:
    kw.setdefault("signature", "a, b")
    return Op(name, "binary", 2, doc, _bcast, lambda args, a: np_fn(args[0], args[1]), False, precision,
              bound=bound, tile=tile, **kw)


def _reduce(name, tile, doc, ref, precision, bound, **kw) -> Op:
    return Op(name, "reduce", 1, doc, _reduced, ref, False, precision, bound=bound, tile=tile, **kw)


# --- math, reductions and creation (grown through the registry): decompositions

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _tanh(b, x):
    return b.bins("sub", b.bins("mul", _sigmoid(b, b.bins("mul", x, 2.0)), 2.0), 1.0)


def _softplus(b, x):
    return b.bin("add", b.un("relu", x), b.un("log", b.bins("add", b.un("exp", b.un("neg", b.un("abs", x))), 1.0)))


def _np_softplus(x):
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def _elu_neg(b, x, alpha, inner=1.0):
    """alpha (exp(min(x, 0) * inner) - 1): the negative branch of elu / celu / selu (0 for x >= 0)."""
    m = b.bins("minimum", x, 0.0)
    return b.bins("mul", b.bins("sub", b.un("exp", m if inner == 1.0 else b.bins("mul", m, inner)), 1.0), alpha)


def _odd(b, x, f):
    """f(|x|) with the sign of x (f(0) = 0): an odd function without cancellation for x < 0."""
    r = f(b.un("abs", x))
    return b.select(b.cmps("lt", x, 0), b.un("neg", r), r)


def _lerp(b, ins, a):
    x, y = ins[0], ins[1]
    d = b.bin("sub", y, x)
    return b.bin("add", x, b.bin("mul", d, ins[2]) if len(ins) > 2 else b.bins("mul", d, a["weight"]))


def _np_lerp(args, a):
    w = args[2] if len(args) > 2 else a["weight"]
    return args[0] + w * (args[1] - args[0])


def _norm(b, ins, a):
    x, dim, p = ins[0], a["dim"], a["p"]
    if p == 1:
        r = b.red("sum", b.un("abs", x), dim)
    elif p == float("inf"):
        r = b.red("amax", b.un("abs", x), dim)
    else:
        r = b.un("sqrt", b.red("sum", b.bin("mul", x, x), dim))
    return _drop(b, r, dim, a["keepdim"])


def _np_norm(args, a):
    x, p = np.abs(args[0]), a["p"]
    kw = {"axis": a["dim"], "keepdims": a["keepdim"]}
    if p == 1:
        return np.sum(x, **kw)
    if p == float("inf"):
        return np.max(x, **kw)
    return np.sqrt(np.sum(x * x, **kw))


def _mod_bound(f, floored):
    """a mod b: first order e_a + |q| e_b (q the quotient, floored or truncated); where the result
    may jump (it is within its bound of 0 or of |b|), no claim."""
    def rule(ins, a):
        x, y = ins
        with np.errstate(all="ignore"):
            v = f(x.v, y.v)
            q = np.abs((np.floor if floored else np.trunc)(np.asarray(x.v, np.float64) / y.v))
            ye = _known(y.e)
            e = _known(x.e) + np.where(ye > 0, (q + 1) * ye, 0.0)
            near = (e > 0) & ((np.abs(v) <= SAFETY * e) | (np.abs(np.abs(v) - np.abs(y.v)) <= SAFETY * e))
        return x.__class__(v, np.where(near, np.inf, e))
    return rule


def _prod_bound(ins, a):
    """prod(|x| + e) - prod(|x|) (the most the factors' errors move the product), plus n - 1
    roundings of the (fp32 at least) accumulator.  A rounding is relative (u32 |partial
    product|, carried to the end: u32 |product|) until the partial product is subnormal; there
    it is absolute, up to the smallest subnormal, and the factors that follow scale it: by at
    most the product of the factors above 1, in whatever order the tiles multiply (a long product
    of factors below 1 ends in the subnormals, where the two evaluations differ by a few of
    those)."""
    x, d = ins[0], a["dim"]
    m = np.abs(np.asarray(x.v, np.float64))
    kw = {"axis": d, "keepdims": a["keepdim"]}
    p = np.prod(m, **kw)
    big = m + x.full_e
    e = np.prod(big, **kw) - p
    n = m.shape[d]
    if a.get("float_acc", True) and n > 1:
        with np.errstate(over="ignore"):
            grow = np.prod(np.maximum(big, 1.0), **kw)
        e = e + (n - 1) * (2.0 ** -24 * p + 2.0 ** -149 * grow)
    return x.__class__(np.prod(x.v, **kw), e)


def _integral_bound(half):
    """floor / ceil / trunc / round: exact, unless the operand's bound reaches a point where the
    result jumps (an integer; a half-integer for round): there no claim."""
    def rule(ins, a):
        x = ins[0]
        t = np.asarray(x.v, np.float64) + (0.5 if half else 0.0)
        e = _known(x.full_e)
        with np.errstate(invalid="ignore"):
            near = (e > 0) & (np.abs(t - np.round(t)) <= SAFETY * e)
        return x.__class__(x.v, np.where(near, np.inf, 0.0))
    return rule


def _integral(name, mode, doc, np_fn) -> Op:
    """A rounding to an integral value: TCVT with a rounding mode, in the operand's dtype."""
    return Op(name, "unary", 1, doc, _same, lambda args, a: np_fn(args[0]), False, "exact",
              bound=_integral_bound(mode == "RINT"), tile="CVT", idempotent=True, extra={"round": mode}, grad=_g_zero)


class _NoError:
    """The bound of a value made from nothing (before its own rounding): exact."""
    e = np.zeros(())


def _np_iota(a):
    """start + i * step along dim `dim` of `shape` (i = 0, 1, ...), broadcast over the other dims."""
    shape, d = tuple(a["shape"]), a["dim"]
    col = a["start"] + a["step"] * np.arange(shape[d], dtype=np.float64)
    return np.broadcast_to(col.reshape([-1 if k == d else 1 for k in range(len(shape))]), shape)


def _iota(b, shape, dim, dtype, start=0, step=1):
    """An iota of `shape` (1 except along dim, as a broadcast operand) in a decomposition."""
    s = [1] * len(shape)
    s[dim] = shape[dim]
    return b.emit("iota", [], tuple(s), dtype, {"shape": tuple(s), "dim": dim, "start": start, "step": step,
                                                **b.extra})


def _tri_mask(b, shape, diagonal, lower):
    """col - row <= diagonal (tril) or >= diagonal (triu), over the last two dims of `shape`."""
    from ..dtypes import DT_INT32
    r = len(shape)
    rows = _iota(b, shape, r - 2, DT_INT32, start=diagonal)        # row + diagonal
    cols = _iota(b, shape, r - 1, DT_INT32)
    return b.cmp("le" if lower else "ge", cols, rows)


def _arg_extreme(b, ins, a, red, cmp_nan):
    """argmax / argmin: the smallest index where x equals its max (min) along dim, or where x is
    nan (the first nan, as torch): amin(where(x == m or x != x, index, n))."""
    from ..dtypes import DT_INT32
    x, dim = ins[0], a["dim"]
    n = b.shape(x)[dim]
    hit = b.cmp("eq", x, b.red(red, x, dim))
    if cmp_nan:
        hit = b.bin("logical_or", hit, b.cmp("ne", x, x))
    idx = b.select(hit, _iota(b, b.shape(x), dim, DT_INT32), b.const(n, DT_INT32))
    return _drop(b, b.red("amin", idx, dim), dim, a["keepdim"])


def _np_arg(f):
    def ref(args, a):
        r = f(args[0], axis=a["dim"])          # numpy: the first nan's index too
        return np.expand_dims(r, a["dim"]) if a["keepdim"] else r
    return ref


def _one_hot(b, ins, a):
    from ..dtypes import DT_INT32
    idx, c = ins[0], a["num_classes"]
    s = tuple(b.shape(idx)) + (1,)
    col = b.reshape(idx, s)
    hit = b.cmp("eq", col, _iota(b, s[:-1] + (c,), len(s) - 1, DT_INT32))
    return b.cast(hit, DT_INT32)


# --- indexing: gather, scatter, topk (the rows' helpers; the rows end _ROWS)
# Index tensors are int32.  An index broadcasts against the values it indexes along the other
# dims (index_select's [L] becomes [1, .., L, .., 1]).  Out of range, unchecked: a gather clips the
# index into [0, n), a scatter drops the element (the simulators and this reference alike);
# checked mode refuses it at the kernel's line.

_UNIT = {"fp32": 2.0 ** -24, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}


def _gather_window(x, shape, dim):
    """x cut to the result's extents off `dim` (torch's gather reads x[:s0, :, :s2] there)."""
    return x[tuple(slice(None) if k == dim else slice(0, s) for k, s in enumerate(shape))]


def _gather_index(idx, shape, dim, n):
    return np.clip(np.broadcast_to(np.asarray(idx).astype(np.int64), tuple(shape)), 0, n - 1)


def _np_gather(args, a):
    x, idx = args
    d = a["dim"]
    return np.take_along_axis(_gather_window(x, a["shape"], d), _gather_index(idx, a["shape"], d, x.shape[d]), d)


def _gather_bound(ins, a):
    """The gathered elements' bounds.  Indices are exact ints: one computed from floats (topk,
    argmax) is taken as the reference computes it, so a near tie the kernel breaks the other way
    shows as a mismatch (it is one: another element was picked)."""
    x, idx = ins
    d, shape = a["dim"], tuple(a["shape"])
    i = _gather_index(idx.v, shape, d, np.shape(x.v)[d])
    v = np.take_along_axis(_gather_window(np.asarray(x.v), shape, d), i, d)
    e = np.take_along_axis(_gather_window(np.asarray(x.full_e), shape, d), i, d)
    return x.__class__(v, e)


def _np_scatter(add):
    def ref(args, a):
        from ..target.semantics import scatter_targets
        x, src, idx = args
        out = np.array(x, copy=True)
        t, v = scatter_targets(out, np.asarray(src), np.asarray(idx).astype(np.int64), a["dim"])
        if add:
            np.add.at(out, t, v.astype(out.dtype, copy=False))
        else:
            out[t] = v
        return out
    return ref


def _scatter_bound(add):
    """scatter: the written values' bounds where they land, x's elsewhere; scatter_add: the sum
    rule per target element, each of its k atomic adds (in the tensor's dtype, attr `acc`)
    rounding a partial sum of at most |x| + sum |src|: e_x + sum e_src + k u (|x| + sum |src|)."""
    def rule(ins, a):
        from ..target.semantics import scatter_targets
        x, src, idx = ins
        val = np.array(x.v, dtype=np.float64, copy=True)
        err = np.array(x.full_e, dtype=np.float64, copy=True)
        i = np.asarray(idx.v).astype(np.int64)
        sv = np.broadcast_to(np.asarray(src.v, np.float64), np.broadcast_shapes(np.shape(src.v), i.shape))
        t, v = scatter_targets(val, sv, i, a["dim"])
        _, e = scatter_targets(val, np.broadcast_to(src.full_e, sv.shape), i, a["dim"])
        if add:
            mag, count = np.abs(val), np.zeros(val.shape)
            np.add.at(val, t, v)
            np.add.at(err, t, e)
            np.add.at(mag, t, np.abs(v))
            np.add.at(count, t, 1.0)
            err += count * _UNIT.get(a.get("acc"), 0.0) * mag
        else:
            val[t] = v
            err[t] = e
        return x.__class__(val, err)                 # (indices are exact: see _gather_bound)
    return rule


def _indexed_like(b, idx, rank, dim):
    """A 1-D index [L] as [1, .., L, .., 1] along `dim` of a rank-`rank` tensor."""
    s = [1] * rank
    s[dim] = b.shape(idx)[0]
    return b.reshape(idx, s)


def _selected_shape(shape, dim, n):
    return tuple(n if k == dim else s for k, s in enumerate(shape))


def _index_select(b, x, idx, dim):
    shape = _selected_shape(b.shape(x), dim, b.shape(idx)[0])
    return b.emit("gather", [x, _indexed_like(b, idx, len(shape), dim)], shape, b.dtype(x),
                  {"dim": dim, "shape": shape, **b.extra})


def _np_index_select(args, a):
    return np.take(args[0], np.clip(np.asarray(args[1]).astype(np.int64), 0, args[0].shape[a["dim"]] - 1),
                   axis=a["dim"])


def _embedding(b, ins, a):
    idx, w = ins
    n = int(np.prod(b.shape(idx)))
    rows = _index_select(b, w, b.reshape(idx, (n,)), 0)
    return b.reshape(rows, tuple(b.shape(idx)) + (b.shape(w)[1],))


def _index_add(b, ins, a):
    x, idx, src = ins
    if a["alpha"] != 1:
        src = b.bins("mul", src, a["alpha"])
    return b.emit("scatter_add", [x, src, _indexed_like(b, idx, len(b.shape(x)), a["dim"])], b.shape(x), b.dtype(x),
                  {"dim": a["dim"], "acc": a.get("acc"), **b.extra})


def _top_index(b, ins, a):
    """The first index along dim whose element is the extreme (amax / amin) of those not taken
    yet: amin(where(x == extreme and not taken, index, n)) (topk's round).  A NaN is the extreme
    while one is left (amax and amin propagate it) and equal to nothing: a float's NaNs are hits
    too, so that the round's index is its first NaN's, not n."""
    from ..dtypes import DT_INT32
    x, taken, dim = ins[0], ins[1], a["dim"]
    n = b.shape(x)[dim]
    same = b.cmp("eq", x, b.red("amax" if a["largest"] else "amin", x, dim))
    if b.dtype(x).is_float:
        same = b.bin("logical_or", same, b.cmp("ne", x, x))
    hit = b.bin("logical_and", same, b.un("logical_not", taken))
    return b.red("amin", b.select(hit, _iota(b, b.shape(x), dim, DT_INT32), b.const(n, DT_INT32)), dim)


def _np_top_index(args, a):
    x, taken = args
    d = a["dim"]
    worst = -np.inf if a["largest"] else np.inf
    if np.issubdtype(x.dtype, np.integer):      # (bf16 is neither numpy's floating nor its integer)
        info = np.iinfo(x.dtype)
        worst = info.min if a["largest"] else info.max
        x = x.astype(np.float64)
    y = np.where(taken, worst, x)
    m = (np.max if a["largest"] else np.min)(y, axis=d, keepdims=True)
    hit = ((y == m) | np.isnan(y)) & ~taken          # (a NaN is the extreme while one is left)
    n = x.shape[d]
    pos = np.arange(n).reshape([-1 if k == d else 1 for k in range(x.ndim)])
    return np.min(np.where(hit, pos, n), axis=d, keepdims=True).astype(np.int32)


def _np_index_add(args, a):
    x, idx, src = args
    out = np.array(x, copy=True)
    idx = np.asarray(idx).astype(np.int64)
    ok = (idx >= 0) & (idx < x.shape[a["dim"]])
    sel = np.compress(ok, src, axis=a["dim"])
    np.add.at(np.moveaxis(out, a["dim"], 0), idx[ok], np.moveaxis(sel * a["alpha"] if a["alpha"] != 1 else sel,
                                                                   a["dim"], 0).astype(out.dtype, copy=False))
    return out



# ---------------------------------------------------------------------------------------
# gradient rules (the `grad` column): (builder, inputs, output, cotangent, attrs) -> one
# cotangent per input (None: no gradient flows there), each of its input's shape; the
# cotangent has the output's shape and dtype.  `pypto.grad` emits them on its builder while it
# writes the backward kernel; a composite without a rule is differentiated through its
# decomposition.  Ops whose result is not a float (comparisons, masks, indices) take no rule:
# no gradient reaches them.

def _g_unary(f):
    """d/dx of an element-wise op: f(b, x, y, ct) -> the input's cotangent."""
    return lambda b, ins, out, ct, a: (f(b, ins[0], out, ct),)


def _g_zero(b, ins, out, ct, a):
    """A piecewise-constant op (floor, round, ...): zero almost everywhere, as torch has it."""
    return (b.zeros(b.shape(ins[0]), b.dtype(ct)),)


def _keep(b, v, x_shape, a):
    """A reduction's result or cotangent with its reduced dim kept (size 1)."""
    s = list(x_shape)
    s[a["dim"]] = 1
    return b.reshape(v, s)


def _g_sum(b, ins, out, ct, a):
    return (b.expand(_keep(b, ct, b.shape(ins[0]), a), b.shape(ins[0])),)


def _g_extreme(b, ins, out, ct, a):
    """amax / amin: the cotangent shared equally by the elements equal to the extreme (torch's
    rule for amax, amin)."""
    x = ins[0]
    hit = b.cmp("eq", x, _keep(b, out, b.shape(x), a))
    count = b.red("sum", b.cast(hit, b.dtype(ct)), a["dim"])
    return (b.select(hit, b.bin("div", _keep(b, ct, b.shape(x), a), count), b.const(0.0, b.dtype(ct))),)


def _g_prod(b, ins, out, ct, a):
    x = ins[0]
    return (b.bin("div", b.bin("mul", _keep(b, ct, b.shape(x), a), _keep(b, out, b.shape(x), a)), x),)


def _g_add(b, ins, out, ct, a):
    return b.sum_to(ct, b.shape(ins[0])), b.sum_to(ct, b.shape(ins[1]))


def _g_sub(b, ins, out, ct, a):
    return b.sum_to(ct, b.shape(ins[0])), b.sum_to(b.un("neg", ct), b.shape(ins[1]))


def _g_mul(b, ins, out, ct, a):
    x, y = ins
    return b.sum_to(b.bin("mul", ct, y), b.shape(x)), b.sum_to(b.bin("mul", ct, x), b.shape(y))


def _g_div(b, ins, out, ct, a):
    x, y = ins
    return (b.sum_to(b.bin("div", ct, y), b.shape(x)),
            b.sum_to(b.un("neg", b.bin("div", b.bin("mul", ct, out), y)), b.shape(y)))


def _g_pick(wins):
    """maximum / minimum: the cotangent to the operand that wins, half to each on a tie (torch)."""
    def rule(b, ins, out, ct, a):
        x, y = ins
        zero = b.const(0.0, b.dtype(ct))
        to_x = b.select(b.cmp(wins, x, y), ct, b.select(b.cmp("eq", x, y), b.bins("mul", ct, 0.5), zero))
        return b.sum_to(to_x, b.shape(x)), b.sum_to(b.bin("sub", ct, to_x), b.shape(y))
    return rule


def _g_mod(rounding):
    """remainder / fmod: a - b * rounding(a / b); d/da = 1, d/db = -rounding(a / b)."""
    def rule(b, ins, out, ct, a):
        x, y = ins
        q = b.un(rounding, b.bin("div", x, y))
        return b.sum_to(ct, b.shape(x)), b.sum_to(b.un("neg", b.bin("mul", ct, q)), b.shape(y))
    return rule


def _g_where(b, ins, out, ct, a):
    m, x, y = ins
    zero = b.const(0.0, b.dtype(ct))
    return (None, b.sum_to(b.select(m, ct, zero), b.shape(x)), b.sum_to(b.select(m, zero, ct), b.shape(y)))


def _g_matmul(b, ins, out, ct, a):
    """C = op(A) op(B): d op(A) = dC op(B)^T, d op(B) = op(A)^T dC, in the operands' dtype with an
    accumulator of the result's; batch dims an operand was broadcast along are summed."""
    x, y = ins
    at, bt = a["a_trans"], a["b_trans"]
    acc = b.dtype(ct)
    g = b.cast(ct, b.dtype(x))
    dx = b.matmul(y, g, a_trans=bt, b_trans=True, out_dtype=acc) if at else \
        b.matmul(g, y, b_trans=not bt, out_dtype=acc)
    dy = b.matmul(g, x, a_trans=True, b_trans=at, out_dtype=acc) if bt else \
        b.matmul(x, g, a_trans=not at, out_dtype=acc)
    return b.sum_to(dx, b.shape(x)), b.sum_to(dy, b.shape(y))


def _g_cast(b, ins, out, ct, a):
    return (b.cast(ct, b.dtype(ins[0])) if b.dtype(ins[0]).is_float else None,)


def _g_view(b, ins, out, ct, a):
    x = ins[0]
    return (b.write(b.scratch(b.shape(x), b.dtype(ct)), ct, a["offsets"], a["shape"], a.get("steps")),)


def _g_write(b, ins, out, ct, a):
    """dst with `v` written into a region: the region's cotangent goes to v, the rest to dst."""
    dst, v = ins
    shape, steps = tuple(a["shape"]), a.get("steps")
    to_v = b.view(ct, shape, a["offsets"], steps)
    if tuple(b.shape(v)) != shape:
        to_v = b.reshape(to_v, b.shape(v)) if int(np.prod(shape)) == int(np.prod(b.shape(v))) else b.sum_to(to_v, b.shape(v))
    return b.write(ct, b.zeros(shape, b.dtype(ct)), a["offsets"], shape, steps), to_v


def _g_gather(b, ins, out, ct, a):
    x, idx = ins
    into = b.scratch(b.shape(x), b.dtype(ct))
    return b.emit("scatter_add", [into, ct, idx], b.shape(x), b.dtype(ct), {"dim": a["dim"], "acc": b.dtype(ct).name}), None


def _g_scatter(add):
    def rule(b, ins, out, ct, a):
        x, src, idx = ins
        shape = tuple(b.shape(src))
        picked = b.emit("gather", [ct, idx], shape, b.dtype(ct), {"dim": a["dim"], "shape": shape})
        if add:
            return ct, picked, None
        cleared = b.emit("scatter", [ct, b.zeros(shape, b.dtype(ct)), idx], b.shape(x), b.dtype(ct),
                         {"dim": a["dim"]})
        return cleared, picked, None
    return rule


def _g_softmax(b, ins, out, ct, a):
    d = a["dim"]
    return (b.bin("mul", out, b.bin("sub", ct, b.red("sum", b.bin("mul", ct, out), d))),)


def _g_log_softmax(b, ins, out, ct, a):
    d = a["dim"]
    return (b.bin("sub", ct, b.bin("mul", b.un("exp", out), b.red("sum", ct, d))),)


_ROWS = [
    Op("input", "input", 0, "a kernel parameter"),
    Op("const", "const", 0, "a Python number used as an operand"),
    Op("store", "store", 1, "write a value into a region of an output parameter", _from_attr),
    # --- element-wise primitives: one PTO instruction each
    _unary("exp", "EXP", "e^x", np.exp, "inexact", lambda i, a: i[0].exp(), amplifies=True,
           grad=_g_unary(lambda b, x, y, ct: b.bin("mul", ct, y))),
    _unary("log", "LOG", "natural logarithm", np.log, "inexact", lambda i, a: i[0].log(), amplifies=True,
           grad=_g_unary(lambda b, x, y, ct: b.bin("div", ct, x))),
    _unary("sqrt", "SQRT", "square root", np.sqrt, "inexact", lambda i, a: i[0].sqrt(),
           grad=_g_unary(lambda b, x, y, ct: b.bin("div", ct, b.bins("mul", y, 2.0)))),
    _unary("rsqrt", "RSQRT", "1 / sqrt(x)", lambda x: np.reciprocal(np.sqrt(x)), "inexact",
           lambda i, a: i[0].sqrt().recip(), wide=True,
           grad=_g_unary(lambda b, x, y, ct: b.bins("mul", b.bin("mul", ct, b.bin("mul", y, b.bin("mul", y, y))), -0.5))),
    _unary("recip", "RECIP", "1 / x", np.reciprocal, "inexact", lambda i, a: i[0].recip(), api="reciprocal",
           grad=_g_unary(lambda b, x, y, ct: b.un("neg", b.bin("mul", ct, b.bin("mul", y, y))))),
    _unary("abs", "ABS", "|x|", np.abs, "exact", _exact, float_only=False, idempotent=True,
           grad=_g_unary(lambda b, x, y, ct: b.bin("mul", ct, b.emit("sign", [x], b.shape(x), b.dtype(x), {})))),
    _unary("neg", "NEG", "-x", np.negative, "exact", _exact, float_only=False, involution=True,
           grad=_g_unary(lambda b, x, y, ct: b.un("neg", ct))),
    _unary("relu", "RELU", "max(x, 0)", lambda x: np.maximum(x, np.zeros((), x.dtype)), "exact", _exact,
           float_only=False, idempotent=True,
           grad=_g_unary(lambda b, x, y, ct: b.select(b.cmps("gt", x, 0.0), ct, b.const(0.0, b.dtype(ct))))),
    _unary("copy", "", "the same values in a new tile (a GM view materialised)", np.copy, "exact", _exact,
           float_only=False, idempotent=True, signature="",
           grad=_g_unary(lambda b, x, y, ct: ct)),
    _binary("add", "ADD", "a + b", np.add, "inexact", lambda i, a: i[0] + i[1], commutative=True, identity=0,
           grad=_g_add),
    _binary("sub", "SUB", "a - b", np.subtract, "inexact", lambda i, a: i[0] - i[1], identity=0,
            scalar_left=("neg", "add"),
           grad=_g_sub),
    _binary("mul", "MUL", "a * b", np.multiply, "inexact", lambda i, a: i[0] * i[1], commutative=True, identity=1,
            reassociates=True,
           grad=_g_mul),
    _binary("div", "DIV", "a / b (true division)", np.divide, "inexact", lambda i, a: i[0] / i[1], identity=1,
            scalar_left=("recip", "mul"),
           grad=_g_div),
    _binary("maximum", "MAX", "the larger of a and b", np.maximum, "exact", _largest(np.maximum),
            commutative=True, idempotent=True,
           grad=_g_pick("gt")),
    _binary("minimum", "MIN", "the smaller of a and b", np.minimum, "exact", _largest(np.minimum),
            commutative=True, idempotent=True,
           grad=_g_pick("lt")),
    # --- comparisons (a mask: dtype bool), selection and logic
    *[Op(name, "compare", 2, doc, _bcast, (lambda f: lambda args, a: f(args[0], args[1]))(f), precision="declared",
         bound=_compare_bound(f), tile="CMP", commutative=name in ("eq", "ne"), extra={"cmp": name.upper()})
      for name, f, doc in (("eq", np.equal, "a == b"), ("ne", np.not_equal, "a != b"), ("lt", np.less, "a < b"),
                           ("le", np.less_equal, "a <= b"), ("gt", np.greater, "a > b"),
                           ("ge", np.greater_equal, "a >= b"))],
    Op("where", "select", 3, "cond ? a : b, element-wise with broadcasting (cond a mask)",
       lambda s, a: _bcast_all(s),
       lambda args, a: np.where(args[0], args[1], args[2]), precision="declared", bound=_select_bound, tile="SEL",
           grad=_g_where),
    _binary("logical_and", "AND", "a and b (masks)", np.logical_and, "exact", _largest(np.logical_and),
            commutative=True, idempotent=True),
    _binary("logical_or", "OR", "a or b (masks)", np.logical_or, "exact", _largest(np.logical_or),
            commutative=True, idempotent=True),
    _binary("logical_xor", "XOR", "a xor b (masks)", np.logical_xor, "exact", _largest(np.logical_xor),
            commutative=True),
    _unary("logical_not", "NOT", "not a (a mask)", np.logical_not, "exact", _exact, float_only=False,
           involution=True),
    # --- reductions over one dim
    _reduce("sum", "SUM", "sum over one dim (floats accumulate in fp32 at least)", _np_sum, "accumulate",
            lambda i, a: i[0].sum(a["dim"], a["keepdim"], a.get("float_acc", True)), amplifies=True,
            combine="add",
           grad=_g_sum),
    _reduce("amax", "MAX", "maximum over one dim", _np_reduce(np.max), "exact",
            lambda i, a: i[0].extreme(np.max, a["dim"], a["keepdim"]), combine="maximum",
           grad=_g_extreme),
    _reduce("amin", "MIN", "minimum over one dim", _np_reduce(np.min), "exact",
            lambda i, a: i[0].extreme(np.min, a["dim"], a["keepdim"]), combine="minimum",
           grad=_g_extreme),
    # --- cube, dtype, layout
    Op("matmul", "matmul", 2, "(batched) matrix product on the cube unit",
       lambda s, a: matmul_shape(s[0], s[1], a["a_trans"], a["b_trans"]), _np_matmul,
           grad=_g_matmul),
    Op("cast", "cast", 1, "dtype conversion", _same, lambda args, a: args[0],
           grad=_g_cast),
    Op("reshape", "layout", 1, "new shape, same elements", _from_attr, lambda args, a: np.reshape(args[0], a["shape"]),
       precision="exact", bound=_layout_bound(lambda x, a: np.reshape(x, a["shape"])),
           grad=lambda b, ins, out, ct, a: (b.reshape(ct, b.shape(ins[0])),)),
    Op("transpose", "layout", 1, "swap two dims", _transposed,
       lambda args, a: np.swapaxes(args[0], a["dim0"], a["dim1"]), precision="exact",
       bound=_layout_bound(lambda x, a: np.swapaxes(x, a["dim0"], a["dim1"])),
           grad=lambda b, ins, out, ct, a: (b.transpose(ct, a["dim0"], a["dim1"]),)),
    Op("view", "layout", 1, "a rectangular window", _from_attr, _np_window, precision="exact",
       bound=_layout_bound(lambda x, a: _np_window([x], a)),
           grad=_g_view),
    Op("expand", "broadcast", 1, "x broadcast to a larger shape (torch's expand / broadcast_to)", _from_attr,
       lambda args, a: np.broadcast_to(args[0], a["shape"]), precision="exact",
       bound=lambda ins, a: ins[0].__class__(np.broadcast_to(ins[0].v, a["shape"]),
                                             np.broadcast_to(ins[0].full_e, a["shape"])),
           grad=lambda b, ins, out, ct, a: (b.sum_to(ct, b.shape(ins[0])),)),
    # --- tensors written in place: a scratch buffer and writes into regions of one (functional
    # in the graph: a write gives the new contents; the compiler writes one buffer in order)
    Op("scratch", "scratch", 0, "a fresh tensor of the kernel (a GM workspace), zeros until written", _from_attr,
       lambda args, a: np.zeros(a["shape"]), precision="exact"),
    Op("write", "write", 2, "the tensor with `value` written into a region (x[region] = value on a tensor of "
       "the kernel, assemble)", _same, _np_write, precision="declared", bound=_write_bound,
           grad=_g_write),
    # --- composites: written in the ops above
    _composite("mean", 1, "sum / n over one dim", lambda args, a: np.mean(args[0], axis=a["dim"], keepdims=a["keepdim"]),
               lambda b, ins, a: _drop(b, _mean(b, ins[0], a["dim"]), a["dim"], a["keepdim"]), shape=_reduced),
    _composite("var", 1, "variance over one dim (correction: 1 is Bessel's, 0 the population's)", _np_var,
               lambda b, ins, a: _drop(b, _var(b, ins[0], a["dim"], a["correction"]), a["dim"], a["keepdim"]),
               shape=_reduced),
    _composite("std", 1, "standard deviation over one dim: sqrt(var)",
               lambda args, a: np.sqrt(_np_var(args, a)),
               lambda b, ins, a: _drop(b, b.un("sqrt", _var(b, ins[0], a["dim"], a["correction"])), a["dim"],
                                       a["keepdim"]), shape=_reduced),
    _composite("logsumexp", 1, "log(sum(exp(x))) over one dim, computed stably", _np_logsumexp, _logsumexp,
               shape=_reduced),
    _composite("softmax", 1, "exp(x - max) / sum", _np_softmax, _softmax,
           grad=_g_softmax),
    _composite("log_softmax", 1, "x - logsumexp(x), stably", _np_log_softmax,
               lambda b, ins, a: _log_softmax_keep(b, ins[0], a["dim"]),
           grad=_g_log_softmax),
    _composite("layernorm", -1, "normalise over the last dim, then scale and shift", _np_layernorm, _layernorm),
    _composite("rms_norm", 2, "x * rsqrt(mean(x^2) + eps) * weight", _np_rms_norm, _rms_norm),
    _composite("swiglu", 1, "silu(first half) * second half, halves along dim",
               lambda args, a: (lambda lo, hi: lo * _np_sigmoid(lo) * hi)(*_np_halves(args[0], a["dim"])), _swiglu,
               shape=lambda s, a: tuple(n // 2 if d == a["dim"] else n for d, n in enumerate(s[0]))),
    _elementwise("sigmoid", "1 / (1 + exp(-x))", _np_sigmoid, _sigmoid),
    _elementwise("tanh", "2 * sigmoid(2x) - 1", np.tanh,
                 lambda b, x: b.bins("sub", b.bins("mul", _sigmoid(b, b.bins("mul", x, 2.0)), 2.0), 1.0)),
    _composite("gelu", 1, "tanh approximation of GELU", lambda args, a: _np_gelu(args[0]), _gelu),
    _elementwise("silu", "x * sigmoid(x) (swish)", lambda x: x * _np_sigmoid(x), lambda b, x: b.bin("mul", x, _sigmoid(b, x))),
    _elementwise("softplus", "log(1 + exp(x)), as max(x, 0) + log(1 + exp(-|x|))", lambda x: np.logaddexp(0.0, x),
                 lambda b, x: b.bin("add", b.un("relu", x),
                                    b.un("log", b.bins("add", b.un("exp", b.un("neg", b.un("abs", x))), 1.0)))),
    _elementwise("hardsigmoid", "min(max(x / 6 + 1/2, 0), 1)", lambda x: np.clip(x / 6.0 + 0.5, 0.0, 1.0),
                 lambda b, x: b.bins("minimum", b.un("relu", b.bins("add", b.bins("mul", x, 1 / 6), 0.5)), 1.0)),
    _elementwise("hardswish", "x * min(max(x + 3, 0), 6) / 6", lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
                 lambda b, x: b.bin("mul", x, b.bins("mul", b.bins("minimum", b.un("relu", b.bins("add", x, 3.0)), 6.0),
                                                     1 / 6))),
    _elementwise("square", "x * x", np.square, lambda b, x: b.bin("mul", x, x), float_only=False),
    _elementwise("expm1", "exp(x) - 1", np.expm1, lambda b, x: b.bins("sub", b.un("exp", x), 1.0)),
    _elementwise("log1p", "log(1 + x)", np.log1p, lambda b, x: b.un("log", b.bins("add", x, 1.0))),
    _elementwise("exp2", "2^x, as exp(x ln 2)", np.exp2, lambda b, x: b.un("exp", b.bins("mul", x, LN2))),
    _elementwise("log2", "log(x) / ln 2", np.log2, lambda b, x: b.bins("mul", b.un("log", x), 1 / LN2)),
    _elementwise("log10", "log(x) / ln 10", np.log10, lambda b, x: b.bins("mul", b.un("log", x), 1 / LN10)),
    _composite("leaky_relu", 1, "x where x >= 0, else negative_slope * x",
               lambda args, a: np.where(args[0] >= 0, args[0], args[0] * a["negative_slope"]),
               lambda b, ins, a: b.bin("add", b.un("relu", ins[0]),
                                       b.bins("mul", b.bins("minimum", ins[0], 0.0), a["negative_slope"]))),
    _composite("elu", 1, "x where x > 0, else alpha (exp(x) - 1)",
               lambda args, a: np.where(args[0] > 0, args[0], a["alpha"] * np.expm1(args[0])),
               lambda b, ins, a: b.bin("add", b.un("relu", ins[0]), b.bins(
                   "mul", b.bins("sub", b.un("exp", b.bins("minimum", ins[0], 0.0)), 1.0), a["alpha"]))),
    _composite("clamp", 1, "min(max(x, min), max); either bound may be None", lambda args, a: np.clip(
        args[0], a["min"], a["max"]), lambda b, ins, a: _clamp(b, ins[0], a["min"], a["max"]), wide=False,
               float_only=False, precision_class="exact"),
    _composite("isnan", 1, "x != x", lambda args, a: np.isnan(args[0]),
               lambda b, ins, a: b.cmp("ne", ins[0], ins[0]), wide=False),
    _composite("isinf", 1, "|x| == inf", lambda args, a: np.isinf(args[0]),
               lambda b, ins, a: b.cmps("eq", b.un("abs", ins[0]), float("inf")), wide=False),
    _composite("isfinite", 1, "|x| < inf (false for nan)", lambda args, a: np.isfinite(args[0]),
               lambda b, ins, a: b.cmps("lt", b.un("abs", ins[0]), float("inf")), wide=False),
    _composite("sign", 1, "-1, 0 or 1 (nan for nan)", lambda args, a: np.sign(args[0]),
               lambda b, ins, a: _sign(b, ins[0]), wide=False, float_only=False, precision_class="exact"),
    _composite("masked_fill", 2, "value where mask, else x", lambda args, a: np.where(args[1], a["value"], args[0]),
               lambda b, ins, a: b.select(ins[1], b.const(a["value"], b.dtype(ins[0])), ins[0]),
               shape=_bcast, wide=False, float_only=False, precision_class="exact"),
    _composite("pow", 1, "x ** exponent (a Python number): small integer powers by multiplication, 0.5 and -0.5 "
               "by sqrt and rsqrt, others as exp(exponent * log(x))",
               lambda args, a: np.power(args[0], a["exponent"]), lambda b, ins, a: _pow(b, ins[0], a["exponent"])),
    _elementwise("erf", "the error function: x P(x^2) for abs(x) < 1, else 1 - exp(-x^2) Q(t), "
                 "t = 1 / (1 + 0.3 abs(x)) (odd; fp32 within 3 ulps)", _np_erf, _erf,
                 grad=_g_unary(lambda b, x, y, ct: b.bin("mul", ct, b.bins(
                     "mul", b.un("exp", b.un("neg", b.bin("mul", x, x))), 1.1283791670955126)))),   # 2/sqrt(pi)
    # --- math, reductions and creation (grown through the registry)
    _elementwise("mish", "x * tanh(softplus(x))", lambda x: x * np.tanh(_np_softplus(x)),
                 lambda b, x: b.bin("mul", x, _tanh(b, _softplus(b, x)))),
    _elementwise("logsigmoid", "log(sigmoid(x)), as min(x, 0) - log(1 + exp(-|x|))",
                 lambda x: np.minimum(x, 0.0) - np.log1p(np.exp(-np.abs(x))),
                 lambda b, x: b.bin("sub", b.bins("minimum", x, 0.0), b.un(
                     "log", b.bins("add", b.un("exp", b.un("neg", b.un("abs", x))), 1.0)))),
    _elementwise("softsign", "x / (1 + |x|)", lambda x: x / (1.0 + np.abs(x)),
                 lambda b, x: b.bin("div", x, b.bins("add", b.un("abs", x), 1.0))),
    _composite("celu", 1, "max(x, 0) + min(0, alpha (exp(x / alpha) - 1))",
               lambda args, a: np.where(args[0] > 0, args[0], a["alpha"] * np.expm1(args[0] / a["alpha"])),
               lambda b, ins, a: b.bin("add", b.un("relu", ins[0]), _elu_neg(b, ins[0], a["alpha"], 1.0 / a["alpha"]))),
    _elementwise("selu", "scale (max(x, 0) + min(0, alpha (exp(x) - 1))), the self-normalising constants",
                 lambda x: SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(x)),
                 lambda b, x: b.bins("mul", b.bin("add", b.un("relu", x), _elu_neg(b, x, SELU_ALPHA)), SELU_SCALE)),
    _elementwise("tanhshrink", "x - tanh(x)", lambda x: x - np.tanh(x), lambda b, x: b.bin("sub", x, _tanh(b, x))),
    _composite("hardshrink", 1, "x where |x| > lambd, else 0",
               lambda args, a: np.where(np.abs(args[0]) > a["lambd"], args[0], 0.0).astype(args[0].dtype),
               lambda b, ins, a: b.select(b.cmps("gt", b.un("abs", ins[0]), a["lambd"]), ins[0],
                                          b.const(0.0, b.dtype(ins[0]))), wide=False, precision_class="exact"),
    _composite("softshrink", 1, "x - lambd where x > lambd, x + lambd where x < -lambd, else 0: x - clamp(x, "
               "-lambd, lambd)",
               lambda args, a: np.where(args[0] > a["lambd"], args[0] - a["lambd"],
                                        np.where(args[0] < -a["lambd"], args[0] + a["lambd"], 0.0)),
               lambda b, ins, a: b.bin("sub", ins[0], _clamp(b, ins[0], -a["lambd"], a["lambd"]))),
    _composite("prelu", 2, "x where x >= 0, else weight * x (weight broadcast along dim 1, or one element)",
               lambda args, a: np.where(args[0] >= 0, args[0], args[1] * args[0]),
               lambda b, ins, a: b.select(b.cmps("ge", ins[0], 0), ins[0], b.bin("mul", ins[1], ins[0])),
               shape=_bcast),
    _composite("lerp", -1, "start + weight (end - start); weight a number (attr) or a third tensor", _np_lerp,
               _lerp, shape=lambda s, a: _bcast_all(s)),
    _composite("hypot", 2, "sqrt(a^2 + b^2)", lambda args, a: np.sqrt(args[0] * args[0] + args[1] * args[1]),
               lambda b, ins, a: b.un("sqrt", b.bin("add", b.bin("mul", ins[0], ins[0]), b.bin("mul", ins[1], ins[1]))),
               shape=_bcast),
    _composite("logaddexp", 2, "log(exp(a) + exp(b)), as max(a, b) + log(1 + exp(-|a - b|))",
               lambda args, a: np.maximum(args[0], args[1]) + np.log1p(np.exp(-np.abs(args[0] - args[1]))),
               lambda b, ins, a: b.bin("add", b.bin("maximum", ins[0], ins[1]), b.un("log", b.bins("add", b.un(
                   "exp", b.un("neg", b.un("abs", b.bin("sub", ins[0], ins[1])))), 1.0))), shape=_bcast),
    _composite("addcmul", 3, "x + value * t1 * t2", lambda args, a: args[0] + a["value"] * args[1] * args[2],
               lambda b, ins, a: b.bin("add", ins[0], b.bins("mul", b.bin("mul", ins[1], ins[2]), a["value"])),
               shape=lambda s, a: _bcast_all(s)),
    _composite("addcdiv", 3, "x + value * t1 / t2", lambda args, a: args[0] + a["value"] * args[1] / args[2],
               lambda b, ins, a: b.bin("add", ins[0], b.bins("mul", b.bin("div", ins[1], ins[2]), a["value"])),
               shape=lambda s, a: _bcast_all(s)),
    _elementwise("sinh", "(exp(x) - exp(-x)) / 2", np.sinh,
                 lambda b, x: b.bins("mul", b.bin("sub", b.un("exp", x), b.un("exp", b.un("neg", x))), 0.5)),
    _elementwise("cosh", "(exp(x) + exp(-x)) / 2", np.cosh,
                 lambda b, x: b.bins("mul", b.bin("add", b.un("exp", x), b.un("exp", b.un("neg", x))), 0.5)),
    _elementwise("asinh", "sign(x) log(|x| + sqrt(x^2 + 1)) (odd: no cancellation for x < 0)", np.arcsinh,
                 lambda b, x: _odd(b, x, lambda a: b.un("log", b.bin("add", a, b.un("sqrt", b.bins(
                     "add", b.bin("mul", a, a), 1.0)))))),
    _elementwise("acosh", "log(x + sqrt((x - 1)(x + 1)))", np.arccosh,
                 lambda b, x: b.un("log", b.bin("add", x, b.un("sqrt", b.bin(
                     "mul", b.bins("sub", x, 1.0), b.bins("add", x, 1.0)))))),
    _elementwise("atanh", "log((1 + x) / (1 - x)) / 2", np.arctanh,
                 lambda b, x: b.bins("mul", b.un("log", b.bin("div", b.bins("add", x, 1.0),
                                                              b.bin("sub", b.const(1.0, b.dtype(x)), x))), 0.5)),
    _composite("rsub", 2, "b - a (torch's rsub)", lambda args, a: np.subtract(args[1], args[0]),
               lambda b, ins, a: b.bin("sub", ins[1], ins[0]), shape=_bcast, wide=False, float_only=False),
    _composite("norm", 1, "the p-norm over one dim: p = 2 sqrt(sum(x^2)), 1 sum(|x|), inf max(|x|)", _np_norm,
               _norm, shape=_reduced),
    _binary("remainder", "REM", "a mod b with the sign of b (torch's remainder, Python's %)", np.remainder,
            "inexact", _mod_bound(np.remainder, True),
           grad=_g_mod("floor")),
    _binary("fmod", "FMOD", "a mod b with the sign of a (C's fmod)", np.fmod, "exact", _mod_bound(np.fmod, False),
           grad=_g_mod("trunc")),
    _reduce("prod", "PROD", "product over one dim (floats accumulate in fp32 at least)",
            lambda args, a: np.prod(args[0], axis=a["dim"], keepdims=a["keepdim"], dtype=acc_dtype(args[0].dtype)),
            "accumulate", _prod_bound, combine="mul",
           grad=_g_prod),
    _integral("floor", "FLOOR", "the largest integral value <= x", np.floor),
    _integral("ceil", "CEIL", "the smallest integral value >= x", np.ceil),
    _integral("round", "RINT", "the nearest integral value, ties to even (as torch.round)", np.rint),
    _integral("trunc", "TRUNC", "the integral part of x (rounded towards 0)", np.trunc),
    _composite("frac", 1, "x - trunc(x): the fractional part, with x's sign", lambda args, a: args[0] - np.trunc(args[0]),
               lambda b, ins, a: b.bin("sub", ins[0], b.un("trunc", ins[0])), wide=False),
    # values made from nothing: a fill (TEXPANDS) and an arithmetic sequence (TCI)
    Op("full", "fill", 0, "every element `value` (a tensor of shape `shape` and dtype)", _from_attr,
       lambda args, a: np.full(tuple(a["shape"]), a["value"]), precision="inexact", tile="FILL"),
    Op("iota", "iota", 0, "start + i * step along dim `dim` of `shape` (arange, the index of a dim)", _from_attr,
       lambda args, a: _np_iota(a), precision="inexact", tile="CI"),
    _composite("tril", 1, "x on and below the diagonal (col - row <= diagonal) of the last two dims, else 0",
               lambda args, a: np.tril(args[0], a["diagonal"]),
               lambda b, ins, a: b.select(_tri_mask(b, b.shape(ins[0]), a["diagonal"], True), ins[0],
                                          b.const(0, b.dtype(ins[0]))),
               wide=False, float_only=False, precision_class="exact"),
    _composite("triu", 1, "x on and above the diagonal (col - row >= diagonal) of the last two dims, else 0",
               lambda args, a: np.triu(args[0], a["diagonal"]),
               lambda b, ins, a: b.select(_tri_mask(b, b.shape(ins[0]), a["diagonal"], False), ins[0],
                                          b.const(0, b.dtype(ins[0]))),
               wide=False, float_only=False, precision_class="exact"),
    _composite("argmax", 1, "the index of the largest element along dim (the first one; the first nan's, as torch)",
               _np_arg(np.argmax), lambda b, ins, a: _arg_extreme(b, ins, a, "amax", b.dtype(ins[0]).is_float),
               shape=_reduced, wide=False, float_only=False, precision_class="exact"),
    _composite("argmin", 1, "the index of the smallest element along dim (the first one; the first nan's, as torch)",
               _np_arg(np.argmin), lambda b, ins, a: _arg_extreme(b, ins, a, "amin", b.dtype(ins[0]).is_float),
               shape=_reduced, wide=False, float_only=False, precision_class="exact"),
    _composite("one_hot", 1, "int32 [..., num_classes]: 1 at the class of each index, else 0",
               lambda args, a: (args[0][..., None] == np.arange(a["num_classes"])).astype(np.int32), _one_hot,
               shape=lambda s, a: tuple(s[0]) + (a["num_classes"],), wide=False, float_only=False,
               precision_class="exact"),
    # --- indexing: gather, scatter, topk (MGATHER / MSCATTER; topk is the frontend's, on amax,
    # compare, where, iota and amin)
    Op("gather", "gather", 2, "x[.., index[.., j, ..], ..] along dim (torch.gather; int32 index, broadcast to "
       "the result's shape `shape`): x stays in GM, MGATHER reads its elements", _from_attr, _np_gather,
       precision="exact", bound=_gather_bound, tile="GATHER",
           grad=_g_gather),
    Op("scatter", "write", 3, "x with src[.., j, ..] written at x[.., index[.., j, ..], ..] along dim "
       "(torch.scatter; inputs x, src, index; duplicates: the last wins): MSCATTER into x's buffer", _same,
       _np_scatter(False), precision="exact", bound=_scatter_bound(False), tile="SCATTER",
           grad=_g_scatter(False)),
    Op("scatter_add", "write", 3, "x with src[.., j, ..] added at x[.., index[.., j, ..], ..] along dim "
       "(torch.scatter_add; duplicates accumulate): MSCATTER atomic=ADD", _same, _np_scatter(True),
       precision="declared", bound=_scatter_bound(True), tile="SCATTER", extra={"atomic": "ADD"},
           grad=_g_scatter(True)),
    _composite("index_select", 2, "the slices x[.., index[j], ..] along dim (a gather of a broadcast index)",
               _np_index_select, lambda b, ins, a: _index_select(b, ins[0], ins[1], a["dim"]),
               shape=lambda s, a: _selected_shape(s[0], a["dim"], s[1][0]), wide=False, float_only=False,
               precision_class="exact"),
    _composite("embedding", 2, "weight[index]: the rows of weight [V, D] at index (an index_select of rows)",
               lambda args, a: args[1][np.clip(np.asarray(args[0]).astype(np.int64), 0, args[1].shape[0] - 1)],
               _embedding, shape=lambda s, a: tuple(s[0]) + (s[1][1],), wide=False, float_only=False,
               precision_class="exact"),
    _composite("top_index", 2, "topk's round: the first index along dim (keepdim) of the extreme of x among the "
               "elements not taken (a mask); int32, exact (the index is the reference's: see gather)",
               _np_top_index, _top_index, shape=lambda s, a: tuple(1 if k == a["dim"] else n for k, n in enumerate(s[0])),
               wide=False, float_only=False, precision_class="exact", bound=lambda ins, a: _NoError()),
    _composite("index_add", 3, "x with alpha * source[.., j, ..] added at x[.., index[j], ..] along dim "
               "(a scatter_add of a broadcast index)", _np_index_add, _index_add, wide=False, float_only=False,
               precision_class="exact"),
]

OPS: dict[str, Op] = {op.name: op for op in _ROWS}


def op(name: str) -> Op:
    """The row of a tensor op; KeyError naming the known ops for an unknown one."""
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown tensor op {name!r}; known: {', '.join(sorted(OPS))}") from None
