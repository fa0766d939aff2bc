"""The fuzzer's reference for the ops of gen_more.py (see reference.py): each op as the
decomposition its documentation gives, every step rounded to the op's dtype."""
from __future__ import annotations

import math

import numpy as np

from .reference import (V, _maxc, _minc, _relu, _slack, _squeeze, add, compare_mask, const, div, exp,
                        integral, lipschitz, log, monotone, mul, neg, reduce_ext, reduce_sum, select, sigmoid, sqrt,
                        tanh, unary2)

LN2, LN10 = math.log(2.0), math.log(10.0)
SELU_ALPHA, SELU_SCALE = 1.6732632423543772, 1.0507009873554805
_ERF = np.frompyfunc(math.erf, 1, 1)


def _abs(x, dt):
    return lipschitz(np.abs, [x], dt)


def _one(dt):
    return const(1.0, dt)


def _odd(x: V, f, dt) -> V:
    """f(|x|) with x's sign (asinh): where x's sign is not certain the result may be either
    +-f, a distance of 2|f| (f(|x|) is as small as |x| there)."""
    r = f(_abs(x, dt))
    with np.errstate(all="ignore"):
        v = np.where(np.signbit(x.v), -r.v, r.v)
        amb = np.isfinite(x.v) & (np.abs(x.v) <= _slack(x, dt))
        e = np.where(amb, r.e + 2 * np.abs(r.v), r.e)
    return V(v, e)


def erf(x: V, dt) -> V:
    """Within 3 fp32 ulps of the exact function (the documented accuracy of its polynomials),
    monotone: an input's error moves the result by at most the function's change over it."""
    f = lambda t: np.asarray(_ERF(t), dtype=np.float64)  # noqa: E731
    return monotone(f, x, dt, fp32_ulps=3.0)


def unary3(x: V, a: dict, dt) -> V:
    fn = a["fn"]
    if fn == "sinh":
        return mul(add(exp(x, dt), exp(neg(x, dt), dt), dt, sign=-1.0), const(0.5, dt), dt)
    if fn == "cosh":
        return mul(add(exp(x, dt), exp(neg(x, dt), dt), dt), const(0.5, dt), dt)
    if fn == "asinh":
        return _odd(x, lambda t: log(add(t, sqrt(add(mul(t, t, dt), _one(dt), dt), dt), dt), dt), dt)
    if fn == "acosh":
        inner = mul(add(x, _one(dt), dt, sign=-1.0), add(x, _one(dt), dt), dt)
        return log(add(x, sqrt(inner, dt), dt), dt)
    if fn == "atanh":
        q = div(add(x, _one(dt), dt), add(_one(dt), x, dt, sign=-1.0), dt)
        return mul(log(q, dt), const(0.5, dt), dt)
    if fn == "erf":
        return erf(x, dt)
    if fn == "exp2":
        return exp(mul(x, const(LN2, dt), dt), dt)
    if fn in ("log2", "log10"):
        return mul(log(x, dt), const(1.0 / (LN2 if fn == "log2" else LN10), dt), dt)
    if fn == "frac":
        return add(x, integral(x, np.trunc, dt), dt, sign=-1.0)
    if fn == "hardshrink":
        keep = compare_mask(_abs(x, dt), const(a["lambd"], dt), "gt", dt)
        return select(keep, x, const(0.0, dt))
    if fn == "softshrink":
        lam = a["lambd"]
        return add(x, _minc(_maxc(x, -lam, dt), lam, dt), dt, sign=-1.0)
    if fn == "softsign":
        return div(x, add(_abs(x, dt), _one(dt), dt), dt)
    if fn == "tanhshrink":
        return add(x, tanh(x, dt), dt, sign=-1.0)
    if fn in ("celu", "selu"):
        alpha = a["alpha"] if fn == "celu" else SELU_ALPHA
        neg_part = _minc(x, 0.0, dt)
        if fn == "celu" and alpha != 1.0:
            neg_part = mul(neg_part, const(1.0 / alpha, dt), dt)
        elu = mul(add(exp(neg_part, dt), _one(dt), dt, sign=-1.0), const(alpha, dt), dt)
        out = add(_relu(x, dt), elu, dt)
        return mul(out, const(SELU_SCALE, dt), dt) if fn == "selu" else out
    if fn == "mish":
        return mul(x, tanh(unary2(x, {"fn": "softplus"}, dt), dt), dt)
    if fn == "logsigmoid":
        soft = log(add(exp(neg(_abs(x, dt), dt), dt), _one(dt), dt), dt)
        return add(_minc(x, 0.0, dt), soft, dt, sign=-1.0)
    raise ValueError(fn)


def binary3(ins: list, a: dict, dt) -> V:
    fn = a["fn"]
    x = ins[0]
    if fn == "hypot":
        y = ins[1]
        return sqrt(add(mul(x, x, dt), mul(y, y, dt), dt), dt)
    if fn == "logaddexp":
        y = ins[1]
        gap = neg(_abs(add(x, y, dt, sign=-1.0), dt), dt)
        return add(lipschitz(np.maximum, [x, y], dt), log(add(exp(gap, dt), _one(dt), dt), dt), dt)
    if fn == "rsub":            # other - alpha * x
        alpha = a["alpha"]
        scaled = x if alpha == 1 else mul(x, const(alpha, dt), dt)
        return add(ins[1], scaled, dt, sign=-1.0)
    if fn == "lerp":            # start + weight (end - start)
        w = ins[2] if len(ins) > 2 else const(a["weight"], dt)
        return add(x, mul(w, add(ins[1], x, dt, sign=-1.0), dt), dt)
    if fn in ("addcmul", "addcdiv"):
        t = mul(ins[1], ins[2], dt) if fn == "addcmul" else div(ins[1], ins[2], dt)
        return add(x, mul(t, const(a["value"], dt), dt), dt)
    if fn == "prelu":           # x where x >= 0, else weight x (weight along dim 1)
        w = ins[1]
        if a["channels"] and x.v.ndim > 2:
            shape = (-1,) + (1,) * (x.v.ndim - 2)
            w = w.map(lambda t: np.reshape(np.broadcast_to(t, ins[1].v.shape), shape))
        return select(compare_mask(x, const(0.0, dt), "ge", dt), x, mul(w, x, dt))
    raise ValueError(fn)


def _half(x: V, d: int, k: int) -> V:
    h = x.v.shape[d] // 2
    key = tuple(slice(k * h, (k + 1) * h) if i == d else slice(None) for i in range(x.v.ndim))
    return V(x.v[key], np.broadcast_to(x.e, x.v.shape)[key])


def rowop2(x: V, a: dict, dt) -> V:
    fn = a["fn"]
    if fn == "expand":          # moves values exactly
        return x.map(lambda t: np.broadcast_to(np.broadcast_to(t, x.v.shape), a["shape"]))
    if fn == "repeat":          # torch's repeat: numpy's tile
        return x.map(lambda t: np.tile(np.broadcast_to(t, x.v.shape), a["counts"]))
    d = a["dim"]
    if fn == "log_softmax":     # x - max - log(sum(exp(x - max)))
        shifted = add(x, reduce_ext(x, d, True, np.max, dt), dt, sign=-1.0)
        return add(shifted, log(reduce_sum(exp(shifted, dt), d, True, dt), dt), dt, sign=-1.0)
    if fn == "swiglu":          # silu(first half) * second half
        lo, hi = _half(x, d, 0), _half(x, d, 1)
        return mul(mul(lo, sigmoid(lo, dt), dt), hi, dt)
    p, kd = a["p"], a["keepdim"]
    if p == 2:
        out = sqrt(reduce_sum(mul(x, x, dt), d, True, dt), dt)
    elif p == 1:
        out = reduce_sum(_abs(x, dt), d, True, dt)
    else:
        out = reduce_ext(_abs(x, dt), d, True, np.max, dt)
    return _squeeze(out, (d,), kd)


def evaluate_more(case, n, ins, vals):
    """The value of node `n` of an op of gen_more.py, else None."""
    op, a, dt = n.op, n.attrs, n.dtype
    if op == "un3":
        r = unary3(ins[0], a, dt)
    elif op == "bin3":
        r = binary3(ins, a, dt)
    elif op == "rowop2":
        return rowop2(ins[0], a, dt)
    elif op == "isinf":
        x = ins[0]
        return V(np.isinf(x.v).astype(np.float64), np.where(np.isfinite(x.e), 0.0, np.inf))
    else:
        return None
    if np.shape(r.v) != tuple(n.shape):
        r = V(np.broadcast_to(r.v, n.shape), np.broadcast_to(r.e, n.shape))
    return r

