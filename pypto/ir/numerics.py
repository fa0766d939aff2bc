"""Numeric semantics and the honest check: how far a correct result may be from the reference.

A kernel's result and the numpy reference (`tensor_eval.evaluate`, op by op in each value's
dtype) are two evaluations of the same math that round at different steps: the compiler
computes some fp16/bf16 steps in fp32 (autocast), accumulates sums and matmuls tile by tile in
another order, decomposes composites (softmax, gelu, layernorm, ...) into primitives.  Neither is
the exact value, so no fixed tolerance of the output's dtype fits every kernel: it cries wolf on
a correct fp16 GELU stored as fp32, and lets a wrong fp32 sum of a million terms pass.

Instead the check carries, next to every reference value, a bound on the error a correct
evaluation may have: first-order forward error analysis, step by step through the Tensor Graph.
Each step rounds its result to the step's dtype (unit roundoff u: 2^-24 fp32, 2^-11 fp16, 2^-8
bf16, 0 for integers); float sums and matmuls accumulate in fp32 at least (n terms: (n-1) u32
times the sum of magnitudes); a composite is bounded through its documented decomposition, every
inner step rounded to the composite's dtype (autocast can only round less).  The rules per op:

| op | error of the result (e: bound of an operand, y: the result), before its own rounding |
|---|---|
| add, sub | e_a + e_b |
| mul | abs(b) e_a + abs(a) e_b + e_a e_b |
| div | (e_a + abs(y) e_b) / (abs(b) - e_b); unbounded when the divisor's bound reaches 0 |
| exp | abs(y) (exp(e_a) - 1) |
| log | -log(1 - e_a / abs(a)); unbounded when e_a >= abs(a) |
| sqrt | e_a / (sqrt(a) + sqrt(max(a - e_a, 0))) |
| rsqrt, recip | 1 / sqrt(a), 1 / a through the rules above, rounded once |
| abs neg relu copy maximum minimum amax amin, layout ops | the largest operand bound (exact ops) |
| sum over n | sum of e + (n - 1) u32 sum(abs(x)) |
| matmul over K | by Cauchy-Schwarz on the rows of A and columns of B: norms of A, B and their bounds |
| cast | e + the rounding to the new dtype; to an integer, +1 when e > 0 (truncation may step) |

A result passes where abs(got - reference) <= 4 x bound (both evaluations are within the bound
of the exact value, and a factor of 2 covers the second-order terms the analysis drops), where
both are equal or both NaN, and where the bound is infinite or NaN (an intermediate overflowed
or lost all its digits: no claim is made).  Integer results without float steps have bound 0:
they must be equal.  So a reported mismatch is a real one.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .core import region_slices
from .ops import OPS, SAFETY, Builder
from .tensor import TensorGraph, TNode

UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
# the smallest subnormal: at least the absolute error of a rounding into the subnormal range
UNDERFLOW = {"fp32": 2.0 ** -149, "fp16": 2.0 ** -24, "bf16": 2.0 ** -133}
ACCUMULATOR_UNIT = 2.0 ** -24       # float sums and matmuls accumulate in fp32 at least
# (SAFETY, 4: two evaluations within the bound, and second-order terms; defined with the rules
# of the ops that jump, which use it too)

_F64 = np.float64


class Approx:
    """A value known up to an error: `v` (float64) and a bound `e >= 0` of its distance from
    the exact value (inf: unknown).

    The value of a sum, difference or product is worked out when it is first read (`v`): a
    step of the check keeps the reference's own value and only the bound of its rule (`_step`),
    and at millions of elements each value not made is a large array not allocated."""

    __slots__ = ("_v", "e", "_make", "_own")

    def __init__(self, v, e=None):
        # fp32 values stay fp32 (no copy): they only scale bounds, computed in float64
        self._v = _value(v)
        self.e = _ZERO if e is None else np.asarray(e, _F64)    # broadcasts to v; NaN: unknown too
        self._make = None
        self._own = False       # e made for this value alone (`_lazy`): nothing else reads it

    @property
    def v(self) -> np.ndarray:
        v = self._v
        if v is None:           # (made now: see the class; the same array it would have had)
            v = self._make()
            v = self._v = _value(v)
            self._make = None
        return v

    @property
    def full_e(self) -> np.ndarray:
        """The bound with v's shape (`e` may be a 0-d zero)."""
        return np.broadcast_to(self.e, self.v.shape)

    def rounded(self, dtype: dt.DType, into: np.ndarray | None = None) -> "Approx":
        """The value rounded to `dtype`: its bound grows by that rounding (the value is kept: it
        only scales bounds); where it lies beyond the dtype's largest finite value the rounding
        may give inf, and the bound is infinite.  `into`: an fp64 array that holds `e` and may
        receive the new bound (one nothing else reads), for large values."""
        u = UNIT_ROUNDOFF.get(dtype.name)
        if u is None:
            return self
        v = self.v
        top = float(np.finfo(dtype.np_dtype).max)
        k = _fused(v, self.e) if np.ndim(v) and v.shape == np.broadcast_shapes(v.shape, np.shape(self.e)) else None
        if k is not None:
            # (the in-place steps below, element by element: the same bits, no temporaries)
            if v.dtype == np.float32:
                e = k.rounded_bound_f32(v, self.e, np.float32(u), top, np.float32(UNDERFLOW[dtype.name]), out=into)
            else:
                e = k.rounded_bound_f64(v, self.e, u, top, UNDERFLOW[dtype.name], out=into)
            return _owned(v, e)
        mag = np.abs(v)
        over = False
        if not mag.size or not np.max(mag) <= top:      # (all finite and within range: one pass)
            if np.isinf(mag).any():         # an exact inf (the -inf of a causal mask) rounds to itself
                mag = np.where(np.isinf(mag), 0.0, mag)
            over = bool(np.any(mag > top))  # beyond the largest finite value: it may overflow
        beyond = mag > top if over else None
        if np.ndim(mag) and mag.shape == np.broadcast_shapes(mag.shape, np.shape(self.e)):
            e = np.multiply(mag, u, out=mag)            # in place: one array
            e += self.e
        else:
            e = mag * u + self.e
        e += UNDERFLOW[dtype.name]
        if over:                            # it may overflow: no claim
            e = np.where(beyond, np.inf, e)
        return Approx(v, e)

    def __add__(self, o):
        o = _approx(o)
        return _lazy(lambda: self.v + o.v, self.e + o.e)

    def __sub__(self, o):
        o = _approx(o)
        return _lazy(lambda: self.v - o.v, self.e + o.e)

    def __mul__(self, o):
        o = _approx(o)
        a, b = self.v, o.v
        k = _fused(a, self.e, b, o.e)
        e = None
        if k is not None:
            e = k.mul_bound(a, self.e, b, o.e)
        elif (o.e is _ZERO or self.e is _ZERO) and _c_order(a, b, self.e, o.e):
            # an exact factor (a number, an input): the terms of its zero bound add 0, or NaN where
            # the other factor's value or bound is not finite (0 x inf): one product is the sum,
            # when it has the whole rule's shape
            x, ex, y = (a, self.e, b) if o.e is _ZERO else (b, o.e, a)
            e = np.abs(y) * ex
            if (np.shape(e) != np.broadcast_shapes(np.shape(e), np.shape(x))
                    or not (np.isfinite(x).all() and np.isfinite(ex).all())):
                e = None
        if e is None:
            e = np.abs(b) * self.e + np.abs(a) * o.e + self.e * o.e
        return _lazy(lambda: a * b, e)

    def __truediv__(self, o):
        o = _approx(o)
        v = self.v / o.v
        k = _fused(self.e, v, o.v, o.e)
        if k is not None:
            return _owned(v, k.div_bound(self.e, v, o.v, o.e))
        den = np.abs(o.v) - o.e                 # the divisor's magnitude can shrink to this
        with np.errstate(all="ignore"):
            e = (self.e + np.abs(v) * o.e) / den
        return Approx(v, np.where(den > 0, e, np.inf))

    def exp(self):
        v = np.exp(self.v)
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.abs(v) * np.expm1(self.e)
            # exp(x) underflowed to 0 (x = -inf, as a causal mask gives): the value is at most
            # exp(x + e) away (0 for an exact -inf; NaN, no claim, for an unknown one); worked out
            # where it did only (elsewhere numpy's exp of the whole would be thrown away)
            zero = v == 0
            if zero.any():
                if np.ndim(e) == 0 or not _c_order(v, e, self.v, self.e):
                    e = np.where(zero, np.exp(self.v + self.e), e)
                else:                       # (e: a new array of the values' shape, as `where`'s)
                    at = np.nonzero(zero)
                    e[at] = np.exp(np.broadcast_to(self.v, e.shape)[at] + np.broadcast_to(self.e, e.shape)[at])
        return Approx(v, e)

    def log(self):
        with np.errstate(all="ignore"):
            r = self.e / np.abs(self.v)
            e = np.where(r < 1, -np.log1p(-np.minimum(r, 1.0)), np.inf)
        return Approx(np.log(self.v), np.where(self.e == 0, 0.0, e))

    def sqrt(self):
        v = np.sqrt(self.v)
        den = v + np.sqrt(np.maximum(self.v - self.e, 0.0))
        with np.errstate(all="ignore"):     # from 0, sqrt moves by at most sqrt(e)
            e = np.where(den > 0, self.e / den, np.sqrt(self.e))
        return Approx(v, np.where(self.e == 0, 0.0, e))

    def recip(self):
        return Approx(1.0) / self

    def sum(self, axis: int, keepdims: bool, float_acc: bool = True):
        n = self.v.shape[axis]
        e = self.full_e.sum(axis=axis, keepdims=keepdims)
        if float_acc and n > 1:
            e = e + (n - 1) * ACCUMULATOR_UNIT * np.abs(self.v).sum(axis=axis, keepdims=keepdims)
        return Approx(self.v.sum(axis=axis, keepdims=keepdims), e)

    def extreme(self, f, axis: int, keepdims: bool):
        return Approx(f(self.v, axis=axis, keepdims=keepdims), self.full_e.max(axis=axis, keepdims=keepdims))


_ZERO = np.zeros(())
_KEPT = (np.dtype(np.float32), np.dtype(np.float64))
# the bounds of a product, a quotient and a rounding of this many elements or more are worked out
# by fused kernels (`bound_kernels`: the same bits as the numpy expressions here, without their
# temporaries; a layernorm 1024x1024's check 55 -> 30 ms) once they are loaded in the process, and
# from FUSED_LOAD_MIN elements they are loaded (importing numba and the kernels a check uses costs
# 0.5-1 s once, what the fused kernels gain on one check of 8 M elements: a layernorm 8192x4096's bounds
# take 3.0 s in numpy, 0.7 s fused), when numba is installed
FUSED_MIN = 1 << 18
FUSED_LOAD_MIN = 1 << 23
_KERNELS: list = []         # [the bound_kernels module, or None without numba], once imported


def _kernels(size: int | None = None):
    """The fused bound kernels (`bound_kernels`) for an operation on `size` elements: loaded
    then when they are not and `size` is FUSED_LOAD_MIN or more (None: load them); None when
    they are not loaded or there is no numba."""
    if not _KERNELS:
        if size is not None and size < FUSED_LOAD_MIN:
            return None
        try:
            from . import bound_kernels
        except ImportError:
            bound_kernels = None
        _KERNELS.append(bound_kernels)
    return _KERNELS[0]


def _approx(x) -> Approx:
    return x if isinstance(x, Approx) else Approx(x)


def _value(v) -> np.ndarray:
    """A value as Approx keeps it: fp32 and fp64 arrays as they are, anything else as fp64."""
    return v if isinstance(v, np.ndarray) and v.dtype in _KEPT else np.asarray(v, _F64)


def _lazy(make, e) -> Approx:
    """An Approx whose value `make()` gives when first read, of bound `e`, an array made for it."""
    out = object.__new__(Approx)
    out._v, out._make, out.e, out._own = None, make, np.asarray(e, _F64), True
    return out


def _owned(v, e) -> Approx:
    """Approx(v, e) of a bound `e` made for it."""
    out = Approx(v, e)
    out._own = True
    return out


def _fused(*operands):
    """The fused kernels (`bound_kernels`) when a bound of these operands (broadcast together) is
    worked out by them: from FUSED_MIN elements (see `_kernels`), with numba, the values fp32 or
    fp64, in C order (`_c_order`); else None."""
    size = max(map(np.size, operands))
    if size < FUSED_MIN or any(np.asarray(x).dtype not in _KEPT for x in operands) or not _c_order(*operands):
        return None
    return _kernels(size)


def _c_order(*arrays) -> bool:
    """Whether each of these is a number or an array in C order.  Then numpy's expressions and
    the fused kernels both give a bound in C order: a later sum over it (`sum`) adds its
    elements in the same order (numpy's pairwise sums follow the memory order: a transposed
    value's bound would be summed otherwise, to other last bits)."""
    return all(np.ndim(x) == 0 or x.flags.c_contiguous for x in arrays)


def _matmul_bound(a: Approx, b: Approx, y: np.ndarray, float_acc: bool) -> np.ndarray:
    """|A| e_B + e_A |B| + e_A e_B + (K - 1) u32 |A||B|, each product of magnitudes bounded by
    the norms of A's rows and B's columns (Cauchy-Schwarz): no second K-long product."""
    def rows(m):        # norms over K of A's rows: [..., M, 1]
        return np.sqrt(np.square(m).sum(axis=-1, keepdims=True))

    def cols(m):        # norms over K of B's columns: [..., 1, N]
        return np.sqrt(np.square(m).sum(axis=-2, keepdims=True))
    na, ea, nb, eb = rows(a.v), rows(a.e), cols(b.v), cols(b.e)
    k = a.v.shape[-1]
    e = na * eb + ea * nb + ea * eb
    if float_acc and k > 1:
        e = e + (k - 1) * ACCUMULATOR_UNIT * na * nb
    return np.broadcast_to(e, y.shape)


class _Bounds(Builder):
    """A `Builder` on Approx values: a composite's decomposition (its registry row's, the one the
    compiler runs) evaluated with every step rounded to its dtype."""

    def __init__(self, values, dtypes):
        self._dtypes = {id(v): d for v, d in zip(values, dtypes)}
        self._keep = list(values)           # ids stay unique while the values live

    def emit(self, op, inputs, shape, dtype, attrs=None):
        attrs = attrs or {}
        if op == "const":
            v = attrs["value"]
            exact = not dtype.is_float or float(np.asarray(v, dtype.np_dtype)) == v
            out = Approx(v) if exact else Approx(v).rounded(dtype)
        else:
            with np.errstate(all="ignore"):
                y = OPS[op].ref([x.v for x in inputs], attrs)
            y = np.asarray(y, _F64) if np.asarray(y).dtype != np.bool_ else np.asarray(y)
            out = _step(op, dtype, attrs, inputs, y)
        self._dtypes[id(out)] = dtype
        self._keep.append(out)
        return out

    def shape(self, v):
        return np.shape(v.v)

    def dtype(self, v):
        return self._dtypes[id(v)]


def _step(op: str, d: dt.DType, a, ins: list[Approx], y: np.ndarray, float_acc: bool = True,
          in_dtypes=None) -> Approx:
    """One op's result `y` with its bound: the row's rule, then the op's own rounding."""
    row = OPS[op]
    if op == "input" or (not ins and row.bound is None and row.kind != "composite"):
        return Approx(y)                     # a kernel input, or made from nothing (scratch, full, iota): exact
    if op == "const":
        return Approx(y).rounded(d) if d.is_float else Approx(y)
    x = ins[0] if ins else None
    if op == "matmul":
        av, ae, bv, be = x.v, x.full_e, ins[1].v, ins[1].full_e
        if a["a_trans"]:
            av, ae = np.swapaxes(av, -1, -2), np.swapaxes(ae, -1, -2)
        if a["b_trans"]:
            bv, be = np.swapaxes(bv, -1, -2), np.swapaxes(be, -1, -2)
        out = Approx(y, _matmul_bound(Approx(av, ae), Approx(bv, be), y, float_acc))
    elif op == "cast":
        e = x.e
        if not d.is_float and np.any(e != 0):       # truncation to an integer may step by one (NaN: unknown)
            e = np.where(e == 0, 0.0, np.ceil(e) + 1.0)
        out = Approx(y, e)
    elif row.kind == "composite" and row.bound is None:     # (a row's own rule, if it has one)
        b = _Bounds(ins, in_dtypes or [d] * len(ins))
        out = row.decompose(b, ins, a)
        if np.shape(out.v) != np.shape(y):          # a keepdim result of a reduction without keepdim
            out = Approx(np.reshape(out.v, np.shape(y)), np.reshape(out.full_e, np.shape(y)))
    elif row.bound is not None:
        out = row.bound(ins, {**a, "float_acc": float_acc} if row.kind == "reduce" else a)
    else:
        raise KeyError(op)
    e = out.e
    # (a bound the rule made for itself, of the result's shape: the rounding may write into it)
    into = e if (getattr(out, "_own", False) and all(out is not x for x in ins) and isinstance(e, np.ndarray)
                 and e.shape == np.shape(y) and e.flags.writeable and e.flags.c_contiguous) else None
    out = Approx(y, np.broadcast_to(e, np.shape(y)))
    if row.precision == "exact" or row.kind == "composite":
        return out                           # exact, or rounded by its last step already
    return out.rounded(d, into) if d.is_float else out


def bound_node(n: TNode, ins: list[Approx], y: np.ndarray, float_acc: bool = True, in_dtypes=None) -> Approx:
    """The reference value `y` of node n (float64) with its error bound, from its operands'
    (of dtypes `in_dtypes`); `float_acc`: a matmul's operands are floats (int8 products
    accumulate exactly)."""
    return _step(n.op, n.dtype, n.attrs, ins, y, float_acc, in_dtypes)


def bounds(g: TensorGraph, values: dict[int, np.ndarray]) -> dict[int, Approx]:
    """Every node's reference value (from `values`, the reference evaluator's) with its bound."""
    out: dict[int, Approx] = {}
    for n in g.nodes:
        if n.op == "store":
            continue
        y = np.asarray(values[n.id])
        ins = [out[i] for i in n.inputs]
        float_acc = n.op != "matmul" or g.node(n.inputs[0]).dtype.is_float
        out[n.id] = bound_node(n, ins, y, float_acc, [g.node(i).dtype for i in n.inputs])
    return out


def output_bounds(g: TensorGraph, values: dict[int, np.ndarray],
                  initial: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The error bound of every element of every output parameter: 0 where the kernel does not
    write (the initial contents stay), the stored value's bound where it does."""
    per_node = bounds(g, values)
    out = {name: np.zeros(np.shape(initial[name]), _F64) for name in g.output_names}
    for n in g.nodes:
        if n.op == "store":
            region = region_slices(n.attrs["offsets"], n.shape, n.attrs.get("steps"))
            out[n.attrs["param"]][region] = per_node[n.inputs[0]].full_e.reshape(n.shape)
    return out


def within_bound(got: np.ndarray, want: np.ndarray, bound: np.ndarray, dtype: dt.DType) -> dict:
    """Compare one output with its reference and bound: {'ok', 'max_abs_err', 'max_err_ratio',
    'worst'}: the largest error, the largest error over its allowance (below 1 when ok), and
    for a mismatch the index of the worst element."""
    got, want, bound = np.asarray(got), np.asarray(want), np.asarray(bound)
    k = _kernels(got.size) if got.size >= FUSED_MIN else None
    if (k is not None and got.dtype in _KEPT and want.dtype in _KEPT and got.shape == want.shape == np.shape(bound)
            and got.flags.c_contiguous and want.flags.c_contiguous and bound.flags.c_contiguous
            and bound.dtype == _F64):
        # one pass for the usual verdict (every element within its allowance): the maxima are
        # the same in any order; a mismatch is looked at below, as always
        largest, outside, ratio = k.compare_errors(got.reshape(-1), want.reshape(-1), bound.reshape(-1), SAFETY)
        if not outside:
            return {"ok": True, "max_abs_err": largest, "max_err_ratio": ratio if np.isfinite(ratio) else 0.0,
                    "worst": None}
    with np.errstate(all="ignore"):
        err = np.abs(np.subtract(got, want, dtype=_F64))
        allowed = np.multiply(bound, SAFETY, dtype=_F64)
        ok = err <= allowed                 # NaN errors and bounds fail here: looked at below
        max_err = float(np.max(err, initial=0.0))
        if not np.isfinite(max_err):
            finite = err[np.isfinite(err)]
            max_err = float(finite.max()) if finite.size else 0.0
        bad = np.flatnonzero(~ok)
        if bad.size:                        # the rare elements: equal infs, NaN, no claim, overflow
            gb = np.asarray(got).flat[bad].astype(_F64)
            wb = np.asarray(want).flat[bad].astype(_F64)
            ab = allowed.flat[bad]
            fine = (gb == wb) | (np.isnan(gb) & np.isnan(wb)) | ~np.isfinite(ab)
            if dtype.is_float:              # one side overflowed to inf, the other is near the top
                top = float(np.finfo(dtype.np_dtype).max) * (1 - 2 * UNIT_ROUNDOFF[dtype.name])
                finite = np.where(np.isinf(gb), wb, gb)
                fine |= ((np.isinf(gb) ^ np.isinf(wb)) & (np.sign(gb) == np.sign(wb))
                         & (np.abs(finite) + ab >= top))
            bad = bad[~fine]
        if bad.size:
            eb, ab = err.flat[bad], allowed.flat[bad]
            ratio = np.where(ab > 0, eb / np.where(ab > 0, ab, 1.0), np.inf)
            ratio = np.where(np.isnan(ratio), np.inf, ratio)
            k = int(np.argmax(ratio))
            worst = tuple(int(i) for i in np.unravel_index(int(bad[k]), err.shape))
            return {"ok": False, "max_abs_err": max_err, "max_err_ratio": float(ratio[k]), "worst": worst}
        err /= allowed                      # NaN where both are 0 or inf: not counted
        ratio = float(np.nanmax(err, initial=0.0)) if err.size else 0.0
    return {"ok": True, "max_abs_err": max_err, "max_err_ratio": ratio if np.isfinite(ratio) else 0.0, "worst": None}
