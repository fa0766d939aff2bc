"""The fuzzer's own reference: each value in float64 together with a bound of its error.

Written from pypto's documented semantics, independently of its evaluator and compiler:

- every op's result is rounded to its tensor dtype (unit roundoff u: fp32 2^-24, fp16 2^-11,
  bf16 2^-8; fp16/bf16 math inside an op in fp32, so one more fp32 rounding); a Python number
  operand takes the tensor's dtype;
- composite ops are their documented decompositions (sigmoid = 1 / (1 + exp(-x)),
  tanh = 2 sigmoid(2x) - 1, gelu = x sigmoid(2c (x + 0.044715 x^3)), mean = sum * (1/n),
  softmax = exp(x - max) / sum, rms_norm = x rsqrt(mean(x^2) + eps) w, layernorm = (x - mean)
  rsqrt(var + eps) w + b), each step rounded to the op's dtype (an upper bound: pypto may keep
  fp16 steps in fp32, which only makes it more exact);
- sums accumulate in fp32 (ints exactly); matmul accumulates in fp32 (int8 in int32);
- casts to ints truncate (numpy's astype), `/` of ints is true division with an fp32 result.

A value is `V(v, e)`: v the exact float64 result of the computation on the (exact) inputs, e
a bound on |pypto's value - v|, propagated step by step (first order plus the second-order term
of products; monotone functions through their endpoints).  e = inf marks an element whose
result is not determined (a finite value that overflows its dtype, NaN into an int cast, an
operand whose error interval reaches a singularity): any result is accepted there.  Non-finite
v with a finite e must be reproduced exactly: NaN where numpy gives NaN, the same infinity.
"""
from __future__ import annotations

import math

import numpy as np

from .gen import INTS, MAXV, NP, Case

U = {"fp32": 2.0 ** -24, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "int8": 0.0, "int32": 0.0}
TINY = {"fp32": 1.2e-38, "fp16": 6.2e-5, "bf16": 1.2e-38, "int8": 0.0, "int32": 0.0}   # smallest normal
U32 = U["fp32"]
GELU_C = math.sqrt(2.0 / math.pi)


class V:
    __slots__ = ("v", "e")

    def __init__(self, v, e):
        self.v = np.asarray(v, dtype=np.float64)
        e = np.asarray(e, dtype=np.float64)
        self.e = np.broadcast_to(np.where(np.isnan(e), np.inf, e), self.v.shape)

    def map(self, f):
        return V(f(self.v), f(self.e))


def _rounded(x: V, dt: str, certain=None, fp32_ulps: float = 0.5) -> V:
    """The value rounded to dtype dt: its rounding error added to the bound; overflow of a
    finite value makes the element undetermined.  `fp32_ulps`: the error of the fp32 evaluation
    (0.5 ulp when correctly rounded; numpy's SIMD float32 exp and log are within 4 ulps)."""
    v, e = x.v, x.e
    with np.errstate(all="ignore"):
        a = np.abs(v)
        if dt in INTS:
            e = np.where(np.isfinite(v) & (a + e > MAXV[dt]), np.inf, e)
            return V(v, e)
        u32 = U32 * fp32_ulps / 0.5
        u = max(U[dt], u32) if dt == "fp32" else U[dt] + u32
        e = e + u * a + TINY[dt]
        e = np.where(np.isfinite(v) & (a + e > MAXV[dt] * 0.999), np.inf, e)
        if certain is not None:
            e = np.where(~np.isfinite(v) & certain, 0.0, e)
        return V(v, e)


def _nonfinite_certain(out_v, *ins: V):
    """A non-finite result is certain when the inputs are certain (finite bounds)."""
    ok = np.ones(np.shape(out_v), bool)
    for x in ins:
        ok &= np.broadcast_to(np.isfinite(x.e), np.shape(out_v))
    return ok


def const(value, dt: str) -> V:
    value = float(value)
    if dt in INTS or not math.isfinite(value):
        return V(value, 0.0)
    r = float(np.asarray(value, dtype=np.float64).astype(NP[dt]).astype(np.float64))
    return V(value, abs(r - value))


# ---------------------------------------------------------------------------------------
# primitive steps (result in dtype dt)

def add(a: V, b: V, dt, sign=1.0) -> V:
    with np.errstate(all="ignore"):
        v = a.v + sign * b.v
        e = a.e + b.e
    return _rounded(V(v, e), dt, _nonfinite_certain(v, a, b))


def mul(a: V, b: V, dt) -> V:
    with np.errstate(all="ignore"):
        v = a.v * b.v
        e = np.abs(a.v) * b.e + np.abs(b.v) * a.e + a.e * b.e
        cert = _nonfinite_certain(v, a, b)
        # inf * (an operand whose interval holds 0) may be inf or NaN
        zero_a = (np.abs(a.v) <= a.e) & (a.e > 0)
        zero_b = (np.abs(b.v) <= b.e) & (b.e > 0)
        cert &= ~((np.isinf(a.v) & zero_b) | (np.isinf(b.v) & zero_a))
        e = np.where(np.isfinite(a.v) & np.isfinite(b.v), e, np.where(cert, 0.0, np.inf))
    return _rounded(V(v, e), dt, cert)


def div(a: V, b: V, dt) -> V:
    with np.errstate(all="ignore"):
        v = a.v / b.v
        ab = np.abs(b.v)
        e = (a.e + np.abs(v) * b.e) / (ab - b.e)
        e = np.where(b.e >= 0.5 * ab, np.inf, e)
        cert = _nonfinite_certain(v, a, b) & ~((b.e >= ab) & (b.e > 0))
        cert &= ~((b.v == 0) & (np.abs(a.v) <= a.e) & (a.e > 0))     # the sign of x/0 is not known
        e = np.where(np.isfinite(a.v) & np.isfinite(b.v), e, np.where(cert, 0.0, np.inf))
        e = np.where(np.isfinite(v) | ~cert, e, 0.0)
    return _rounded(V(v, e), dt, cert)


def lipschitz(f, xs: list[V], dt, exact=True) -> V:
    """Ops with |f(x+d) - f(x)| <= max|d| (max, min, relu, abs, neg): the bound carries over."""
    with np.errstate(all="ignore"):
        v = f(*[x.v for x in xs])
        e = xs[0].e if len(xs) == 1 else np.maximum(xs[0].e, xs[1].e)
    out = V(v, np.broadcast_to(e, np.shape(v)))
    if exact:
        return V(out.v, np.where(np.isfinite(out.v), out.e, np.where(_nonfinite_certain(v, *xs), 0.0, out.e)))
    return _rounded(out, dt, _nonfinite_certain(v, *xs))


def monotone(f, x: V, dt, domain_lo=None, open_lo=False, fp32_ulps=0.5) -> V:
    """Monotone f: the error of f(x) is at most that of the interval's endpoints."""
    with np.errstate(all="ignore"):
        v = f(x.v)
        hi, lo = f(x.v + x.e), f(x.v - x.e)
        e = np.maximum(np.abs(hi - v), np.abs(v - lo))
        cert = np.isfinite(x.e)
        e = np.where(np.isfinite(v), e, np.where(cert, 0.0, np.inf))
        e = np.where(np.isfinite(x.v) | ~cert, e, 0.0)   # f(+-inf) and f(NaN) are exact
        if domain_lo is not None:                         # the interval reaches the domain's edge
            if open_lo:
                straddle = (x.v - x.e <= domain_lo) & (x.v + x.e > domain_lo)
            else:
                straddle = (x.v - x.e < domain_lo) & (x.v + x.e >= domain_lo)
            e = np.where(straddle & (x.e > 0), np.inf, e)
            cert = cert & ~(straddle & (x.e > 0))
    return _rounded(V(v, e), dt, cert, fp32_ulps)


def exp(x, dt):
    return monotone(np.exp, x, dt, fp32_ulps=4.0)


def log(x, dt):
    return monotone(np.log, x, dt, domain_lo=0.0, open_lo=True, fp32_ulps=4.0)


def sqrt(x, dt):
    return monotone(np.sqrt, x, dt, domain_lo=0.0)


def rsqrt(x, dt):
    return monotone(lambda t: 1.0 / np.sqrt(t), x, dt, domain_lo=0.0, open_lo=True)


def recip(x, dt):
    with np.errstate(all="ignore"):
        cross = (np.abs(x.v) <= x.e) & (x.e > 0)
    out = monotone(lambda t: 1.0 / t, x, dt)
    return V(out.v, np.where(cross, np.inf, out.e))


def neg(x, dt):
    return lipschitz(np.negative, [x], dt)


def sigmoid(x, dt):
    t = exp(neg(x, dt), dt)
    return recip(add(t, const(1.0, dt), dt), dt)


def tanh(x, dt):
    s = sigmoid(mul(x, const(2.0, dt), dt), dt)
    return add(mul(s, const(2.0, dt), dt), const(1.0, dt), dt, sign=-1.0)


def gelu(x, dt):
    x3 = mul(mul(x, x, dt), x, dt)
    inner = mul(add(x, mul(x3, const(0.044715, dt), dt), dt), const(2.0 * GELU_C, dt), dt)
    return mul(x, sigmoid(inner, dt), dt)


def reduce_sum(x: V, dim: int, keepdim: bool, dt) -> V:
    with np.errstate(all="ignore"):
        n = x.v.shape[dim]
        v = np.sum(x.v, axis=dim, keepdims=keepdim)
        acc = 0.0 if dt in INTS else U32
        e = np.sum(x.e, axis=dim, keepdims=keepdim) + (n + 2) * acc * np.sum(np.abs(x.v), axis=dim, keepdims=keepdim)
        cert = np.all(np.isfinite(x.e), axis=dim, keepdims=keepdim)
        e = np.where(np.isfinite(v), e, np.where(cert, 0.0, np.inf))
    return _rounded(V(v, e), dt, cert)


def reduce_ext(x: V, dim, keepdim, fn, dt) -> V:
    with np.errstate(all="ignore"):
        v = fn(x.v, axis=dim, keepdims=keepdim)
        e = np.max(x.e, axis=dim, keepdims=keepdim)
        cert = np.isfinite(e)
        e = np.where(np.isfinite(v), e, np.where(cert, 0.0, np.inf))
        if dt not in INTS:
            # the max or min of a +0 and a -0 is either, by the order they are compared in (a
            # division by it then gives either infinity): its sign is not determined
            zeros = x.v == 0
            both = (np.any(zeros & np.signbit(x.v), axis=dim, keepdims=keepdim)
                    & np.any(zeros & ~np.signbit(x.v), axis=dim, keepdims=keepdim))
            e = np.where((v == 0) & both, np.maximum(e, TINY[dt]), e)
    return V(v, e)


def mean(x: V, dim, keepdim, dt) -> V:
    n = x.v.shape[dim]
    return mul(reduce_sum(x, dim, keepdim, dt), const(1.0 / n, dt), dt)


def softmax(x: V, dim, dt) -> V:
    m = reduce_ext(x, dim, True, np.max, dt)
    ex = exp(add(x, m, dt, sign=-1.0), dt)
    return div(ex, reduce_sum(ex, dim, True, dt), dt)


def rms_norm(x: V, w: V, eps, dt) -> V:
    ms = mean(mul(x, x, dt), -1, True, dt)
    r = rsqrt(add(ms, const(eps, dt), dt), dt)
    return mul(mul(x, r, dt), w, dt)


def layernorm(x: V, w, b, eps, dt) -> V:
    d = add(x, mean(x, -1, True, dt), dt, sign=-1.0)
    var = mean(mul(d, d, dt), -1, True, dt)
    out = mul(d, rsqrt(add(var, const(eps, dt), dt), dt), dt)
    if w is not None:
        out = mul(out, w, dt)
    if b is not None:
        out = add(out, b, dt)
    return out


def matmul(a: V, b: V, a_trans, b_trans, in_dt, out_dt) -> V:
    av, ae, bv, be = a.v, a.e, b.v, b.e
    if a_trans:
        av, ae = np.swapaxes(av, -1, -2), np.swapaxes(ae, -1, -2)
    if b_trans:
        bv, be = np.swapaxes(bv, -1, -2), np.swapaxes(be, -1, -2)
    k = av.shape[-1]
    with np.errstate(all="ignore"):
        v = np.matmul(av, bv)
        mag = np.matmul(np.abs(av), np.abs(bv))
        acc = 0.0 if in_dt in INTS else U32
        e = np.matmul(np.abs(av), be) + np.matmul(ae, np.abs(bv)) + np.matmul(ae, be) + (k + 2) * acc * mag
        fin = np.isfinite(av).all(-1)[..., :, None] & np.isfinite(bv).all(-2)[..., None, :]
        cert = np.isfinite(np.matmul(ae, np.ones_like(bv)) + np.matmul(np.ones_like(av), be))
        # inf times a factor whose interval holds 0 (it may round to 0): inf or NaN
        za, zb = ((np.abs(av) <= ae) & (ae > 0)).astype(float), ((np.abs(bv) <= be) & (be > 0)).astype(float)
        ia, ib = np.isinf(av).astype(float), np.isinf(bv).astype(float)
        cert &= (np.matmul(za, ib) + np.matmul(ia, zb)) == 0
        e = np.where(fin, e, np.where(cert & ~np.isfinite(v), 0.0, np.inf))
        e = np.where(np.isfinite(v) | ~cert, e, 0.0)
    if in_dt in INTS:
        e = np.where(np.abs(v) > 2**31 - 1, np.inf, e)
    return _rounded(V(v, e), out_dt, cert)


def cast(x: V, src, to) -> V:
    if to not in INTS:
        return _rounded(x, to, np.isfinite(x.e))
    if src in INTS:
        return _rounded(x, to)
    with np.errstate(all="ignore"):
        v = np.trunc(x.v)
        lo, hi = np.trunc(x.v - x.e), np.trunc(x.v + x.e)
        e = np.maximum(hi - v, v - lo)
        e = np.where(np.isfinite(x.v) & (np.abs(x.v) + x.e < MAXV[to]), e, np.inf)
    return V(v, e)


# ---------------------------------------------------------------------------------------
# a whole case

UN = {"exp": exp, "log": log, "sqrt": sqrt, "rsqrt": rsqrt, "reciprocal": recip, "sigmoid": sigmoid,
      "tanh": tanh, "gelu": gelu}


def _operand(case_nodes, vals, a, dt):
    if isinstance(a, tuple):
        return const(a[1], dt)
    return vals[a]


def evaluate(case: Case, arrays) -> dict[str, V]:
    """The expected contents of every output parameter (as V) for the case's input arrays."""
    vals: dict[int, V] = {}
    by_name = dict(zip(case.params, arrays))
    for n in case.nodes:
        dt = n.dtype
        a = n.attrs
        if n.op == "input":
            vals[n.id] = V(np.asarray(by_name[a["param"]]).astype(np.float64), 0.0)
            continue
        ins = [_operand(case.nodes, vals, x, _arg_dtype(case, n, x)) for x in n.args]
        op = n.op
        r = evaluate_op(case, n, ins, vals)
        if r is not None:
            pass
        elif op == "bin":
            fn = a["fn"]
            x, y = ins
            if fn == "add":
                r = add(x, y, dt)
            elif fn == "sub":
                r = add(x, y, dt, sign=-1.0)
            elif fn == "mul":
                r = mul(x, y, dt)
            elif fn == "div":
                if dt == "fp32" and any(_arg_dtype(case, n, z) in INTS for z in n.args):
                    x, y = (cast(z, _arg_dtype(case, n, w), "fp32") for z, w in zip(ins, n.args))
                r = div(x, y, dt)
            elif fn == "maximum":
                r = lipschitz(np.maximum, [x, y], dt)
            else:
                r = lipschitz(np.minimum, [x, y], dt)
            if np.shape(r.v) != tuple(n.shape):
                r = V(np.broadcast_to(r.v, n.shape), np.broadcast_to(r.e, n.shape))
        elif op == "un":
            fn = a["fn"]
            x = ins[0]
            if fn == "abs":
                r = lipschitz(np.abs, [x], dt)
            elif fn == "neg":
                r = neg(x, dt)
            elif fn == "relu":
                r = lipschitz(lambda t: np.maximum(t, 0.0), [x], dt)
            else:
                r = UN[fn](x, dt)
        elif op == "red":
            fn, d, kd = a["fn"], a["dim"], a["keepdim"]
            x = ins[0]
            if fn == "sum":
                r = reduce_sum(x, d, kd, dt)
            elif fn == "mean":
                r = mean(x, d, kd, dt)
            else:
                r = reduce_ext(x, d, kd, np.max if fn == "amax" else np.min, dt)
        elif op == "softmax":
            r = softmax(ins[0], a["dim"], dt)
        elif op == "rms_norm":
            r = rms_norm(ins[0], ins[1], a["eps"], dt)
        elif op == "layernorm":
            rest = ins[1:]
            w = rest.pop(0) if a["has_weight"] else None
            b = rest.pop(0) if a["has_bias"] else None
            r = layernorm(ins[0], w, b, a["eps"], dt)
        elif op == "matmul":
            r = matmul(ins[0], ins[1], a["a_trans"], a["b_trans"], _arg_dtype(case, n, n.args[0]), dt)
        elif op == "cast":
            r = ins[0] if a.get("identity") else cast(ins[0], _arg_dtype(case, n, n.args[0]), a["to"])
        elif op == "transpose":
            r = ins[0].map(lambda t: np.swapaxes(t, a["d0"], a["d1"]))
        elif op == "reshape":
            r = ins[0].map(lambda t: np.reshape(t, a["shape"]))
        elif op == "view":
            key = window_key(a["offsets"], a["shape"], a.get("steps"))
            r = ins[0].map(lambda t: np.reshape(t[key], n.shape))
        else:
            raise ValueError(op)
        if dt in INTS:        # an int result out of its dtype's range is not determined
            r = _rounded(r, dt)
        vals[n.id] = r
    outs = {}
    for st, arr in zip(case.stores, arrays[len(case.inputs):]):
        outs.setdefault(st.out, V(np.asarray(arr).astype(np.float64), 0.0))
    for st in case.stores:
        o = outs[st.out]
        val = vals[st.node]
        region = tuple(slice(off, off + s) for off, s in
                       zip(st.offsets, ((1,) + tuple(case.nodes[st.node].shape)) if st.kind == "index"
                           else case.nodes[st.node].shape))
        o.v[region] = np.reshape(val.v, o.v[region].shape)
        o.e = np.array(o.e, copy=True) if o.e.shape == o.v.shape else np.broadcast_to(o.e, o.v.shape).copy()
        o.e[region] = np.reshape(np.broadcast_to(val.e, np.shape(val.v)), o.e[region].shape)
        if st.kind == "overlap":        # then out[:a] = -value[:a]
            a = st.index
            o.v[:a] = -np.asarray(val.v)[:a]
            o.e[:a] = np.broadcast_to(val.e, np.shape(val.v))[:a]
    return outs


def _arg_dtype(case: Case, n, x) -> str:
    """The dtype an operand takes: a Python number takes its tensor partner's dtype."""
    if isinstance(x, tuple):
        if n.op == "where":
            return n.dtype
        other = next(y for y in n.args if not isinstance(y, tuple))
        d = case.nodes[other].dtype
        return "fp32" if d in INTS and isinstance(x[1], float) else d
    return case.nodes[x].dtype


# ---------------------------------------------------------------------------------------
# the comparison

def ulp(dt: str, a):
    if dt in INTS:
        return 0.0
    return np.maximum(np.abs(a), TINY[dt]) * 2.0 * U[dt]


def compare(expected: V, got: np.ndarray, dt: str, factor: float = 2.0):
    """(ok, report): every determined element within factor * bound + 2 ulps of the result."""
    g = np.asarray(got).astype(np.float64)
    v, e = expected.v, np.broadcast_to(expected.e, expected.v.shape)
    if g.shape != v.shape:
        return False, f"shape {g.shape}, expected {v.shape}"
    det = np.isfinite(e)
    with np.errstate(all="ignore"):
        tol = factor * e + 2 * ulp(dt, v) + (TINY[dt] if dt not in INTS else 0.0)
        nan_exp = np.isnan(v) & det
        inf_exp = np.isinf(v) & det
        fin = np.isfinite(v) & det
        bad = (nan_exp & ~np.isnan(g)) | (inf_exp & (g != v)) | (fin & ~(np.abs(g - v) <= tol))
    nbad = int(bad.sum())
    if not nbad:
        return True, f"ok ({int(det.sum())} of {v.size} elements determined)"
    idx = np.argwhere(bad)
    first = tuple(int(i) for i in idx[0])
    rows = sorted({tuple(int(j) for j in i[:-1]) for i in idx[:2000]}) if v.ndim > 1 else []
    with np.errstate(all="ignore"):
        err = np.where(bad, np.abs(g - v), 0)
    worst = tuple(int(i) for i in np.unravel_index(np.nanargmax(np.where(np.isnan(err), np.inf, err)), v.shape))
    msg = (f"{nbad} of {v.size} elements wrong; first at {list(first)}: got {g[first]!r}, expected "
           f"{v[first]!r} +- {tol[first]:.3g}; worst at {list(worst)}: got {g[worst]!r}, expected "
           f"{v[worst]!r} +- {tol[worst]:.3g}")
    if rows:
        msg += f"; {len(rows)} rows affected, first {rows[:4]}"
    return False, msg


# ---------------------------------------------------------------------------------------
# the ops of the registry (gen_ops.py), from their documented semantics

def _slack(x: V, dt):
    """How far pypto's value may be from x.v where it is inexact and still pass compare()."""
    with np.errstate(all="ignore"):
        s = 2 * x.e + 2 * ulp(dt, x.v) + (TINY[dt] if dt not in INTS else 0.0)
        return np.where(x.e > 0, s, 0.0)


_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
        "ge": np.greater_equal}


def compare_mask(a: V, b: V, fn, dt) -> V:
    """A mask (0 / 1) with e = inf where the comparison may go either way."""
    with np.errstate(all="ignore"):
        v = _CMP[fn](a.v, b.v).astype(np.float64)
        s = _slack(a, dt) + _slack(b, dt)
        amb = np.isfinite(a.v) & np.isfinite(b.v) & (s > 0) & (np.abs(a.v - b.v) <= s)
        und = amb | ~(np.isfinite(a.e) & np.isfinite(b.e))
    return V(v, np.where(und, np.inf, 0.0))


def mask_of(x: V, fn) -> V:
    v = (np.isnan(x.v) if fn == "isnan" else np.isfinite(x.v)).astype(np.float64)
    return V(v, np.where(np.isfinite(x.e), 0.0, np.inf))


def logic(fn, a: V, b: V | None = None) -> V:
    ka = np.isfinite(a.e)
    ta = a.v > 0.5
    if fn == "logical_not":
        return V((~ta).astype(np.float64), np.where(ka, 0.0, np.inf))
    kb = np.isfinite(b.e)
    tb = b.v > 0.5
    if fn == "logical_and":
        v, known = ta & tb, (ka & kb) | (ka & ~ta) | (kb & ~tb)
    elif fn == "logical_or":
        v, known = ta | tb, (ka & kb) | (ka & ta) | (kb & tb)
    else:
        v, known = ta ^ tb, ka & kb
    return V(v.astype(np.float64), np.where(known, 0.0, np.inf))


def select(cond: V, a: V, b: V) -> V:
    with np.errstate(all="ignore"):
        c = cond.v > 0.5
        shape = np.broadcast_shapes(c.shape, a.v.shape, b.v.shape)
        v = np.broadcast_to(np.where(c, a.v, b.v), shape)
        e = np.where(c, a.e, b.e)
        same = (a.v == b.v) & (a.e == 0) & (b.e == 0)
        e = np.where(np.isfinite(cond.e), e, np.where(same, 0.0, np.inf))
    return V(np.array(v), np.broadcast_to(e, shape))


def _relu(x, dt):
    return lipschitz(lambda t: np.maximum(t, 0.0), [x], dt)


def _minc(x, c, dt):
    return lipschitz(np.minimum, [x, const(c, dt)], dt)


def _maxc(x, c, dt):
    return lipschitz(np.maximum, [x, const(c, dt)], dt)


def integral(x: V, f, dt) -> V:
    """floor / ceil / round / trunc: exact unless the value may cross the point where f jumps."""
    with np.errstate(all="ignore"):
        v = f(x.v)
        if dt in INTS:
            return V(v, x.e)
        s = _slack(x, dt)
        same = f(x.v - s) == f(x.v + s)
        e = np.where(same | ~np.isfinite(x.v), 0.0, np.inf)
        e = np.where(np.isfinite(x.e), e, np.inf)
    return V(v, e)


def sign(x: V, dt) -> V:
    with np.errstate(all="ignore"):
        v = np.sign(x.v)
        s = _slack(x, dt)
        amb = np.isfinite(x.v) & (s > 0) & (np.abs(x.v) <= s)
        e = np.where(amb | ~np.isfinite(x.e), np.inf, 0.0)
    return V(v, e)


def power(x: V, p, dt) -> V:
    """The documented lowering: 0.5 / -0.5 by sqrt / rsqrt, small integers by products (a
    reciprocal for negative ones), others as exp(p log x)."""
    if p == 0.5:
        return sqrt(x, dt)
    if p == -0.5:
        return rsqrt(x, dt)
    if float(p).is_integer():
        out = x
        for _ in range(int(abs(p)) - 1):
            out = mul(out, x, dt)
        return recip(out, dt) if p < 0 else out
    return exp(mul(log(x, dt), const(p, dt), dt), dt)


def unary2(x: V, a: dict, dt) -> V:
    fn = a["fn"]
    one = lambda: const(1.0, dt)  # noqa: E731
    if fn == "silu":
        return mul(x, sigmoid(x, dt), dt)
    if fn == "softplus":
        return add(_relu(x, dt), log(add(exp(neg(lipschitz(np.abs, [x], dt), dt), dt), one(), dt), dt), dt)
    if fn == "hardswish":
        return mul(x, mul(_minc(_relu(add(x, const(3.0, dt), dt), dt), 6.0, dt), const(1 / 6, dt), dt), dt)
    if fn == "hardsigmoid":
        return _minc(_relu(add(mul(x, const(1 / 6, dt), dt), const(0.5, dt), dt), dt), 1.0, dt)
    if fn == "square":
        return mul(x, x, dt)
    if fn == "expm1":
        return add(exp(x, dt), one(), dt, sign=-1.0)
    if fn == "log1p":
        return log(add(x, one(), dt), dt)
    if fn == "leaky_relu":
        return add(_relu(x, dt), mul(_minc(x, 0.0, dt), const(a["slope"], dt), dt), dt)
    if fn == "elu":
        return add(_relu(x, dt), mul(add(exp(_minc(x, 0.0, dt), dt), one(), dt, sign=-1.0),
                                     const(a["alpha"], dt), dt), dt)
    if fn == "clamp":
        out = x
        if a["min"] is not None:
            out = _maxc(out, a["min"], dt)
        if a["max"] is not None:
            out = _minc(out, a["max"], dt)
        return out
    if fn == "pow":
        return power(x, a["exponent"], dt)
    if fn in ("floor", "ceil", "round", "trunc"):
        return integral(x, {"floor": np.floor, "ceil": np.ceil, "round": np.rint, "trunc": np.trunc}[fn], dt)
    if fn == "sign":
        return sign(x, dt)
    raise ValueError(fn)


def modulo(a: V, b: V, floored: bool, dt) -> V:
    """remainder (the sign of b) / fmod (the sign of a): first order e_a + (|q| + 1) e_b; where the
    result may jump (near 0 or near |b|), no claim."""
    f = np.remainder if floored else np.fmod
    with np.errstate(all="ignore"):
        v = f(a.v, b.v)
        cert = _nonfinite_certain(v, a, b)
        if dt in INTS:      # exact on exact operands; an integer known only to +-e has any residue
            exact = np.broadcast_to((a.e == 0) & (b.e == 0), np.shape(v))
            return V(v, np.where(cert & exact, 0.0, np.inf))
        q = np.abs((np.floor if floored else np.trunc)(a.v / b.v))
        e = a.e + (q + 1) * b.e
        s = 2 * e + 2 * ulp(dt, a.v) + 2 * ulp(dt, b.v)
        jump = (e > 0) & ((np.abs(v) <= s) | (np.abs(np.abs(v) - np.abs(b.v)) <= s))
        e = np.where(jump, np.inf, e)
        e = np.where(np.isfinite(a.v) & np.isfinite(b.v), e, np.where(cert, 0.0, np.inf))
    return _rounded(V(v, e), dt, cert)


def _squeeze(x: V, dims, keepdim) -> V:
    if keepdim:
        return x
    shape = tuple(s for d, s in enumerate(x.v.shape) if d not in dims)
    return x.map(lambda t: np.reshape(np.broadcast_to(t, x.v.shape), shape))


def variance(x: V, d, keepdim, corr, dt, std=False) -> V:
    n = x.v.shape[d]
    m = mul(reduce_sum(x, d, True, dt), const(1.0 / n, dt), dt)
    dev = add(x, m, dt, sign=-1.0)
    ss = reduce_sum(mul(dev, dev, dt), d, True, dt)
    if n - corr > 0:
        r = mul(ss, const(1.0 / (n - corr), dt), dt)
    else:       # torch: the variance of one element with Bessel's correction is nan
        r = V(np.full(ss.v.shape, np.nan), np.where(np.isfinite(ss.e), 0.0, np.inf))
    if std:
        r = sqrt(r, dt)
    return _squeeze(r, (d,), keepdim)


def reduce_prod(x: V, d, keepdim, dt) -> V:
    with np.errstate(all="ignore"):
        v = np.prod(x.v, axis=d, keepdims=True)
        m = np.abs(x.v)
        n = x.v.shape[d]
        p = np.prod(m, axis=d, keepdims=True)
        e = np.prod(m + x.e, axis=d, keepdims=True) - p
        if dt not in INTS:
            e = e + (n + 1) * U32 * p
        cert = np.all(np.isfinite(x.e), axis=d, keepdims=True)
        zero = np.any((m <= x.e) & (x.e > 0), axis=d, keepdims=True)
        inf = np.any(np.isinf(x.v), axis=d, keepdims=True)
        cert &= ~(zero & inf)
        if dt not in INTS:
            # in the order pypto multiplies (unknown here), a partial product of the small
            # finite values may underflow to 0, then times an inf gives NaN; of the large ones
            # overflow to inf, then times a 0 gives NaN: such a row is not determined
            finite = np.isfinite(m)
            small = np.prod(np.where(finite & (m < 1), m, 1.0), axis=d, keepdims=True)
            large = np.prod(np.where(finite & (m > 1), m, 1.0), axis=d, keepdims=True)
            lost = (inf & (small < TINY[dt])) | (np.any(m == 0, axis=d, keepdims=True) & (large > MAXV[dt]))
            cert &= ~lost
        else:
            lost = np.zeros_like(cert)
        fin = np.all(np.isfinite(x.v), axis=d, keepdims=True)
        e = np.where(fin, e, np.where(cert, 0.0, np.inf))
        e = np.where(np.isfinite(v) | ~cert, e, 0.0)
        e = np.where(lost, np.inf, e)
    return _squeeze(_rounded(V(v, e), dt, cert), (d,), keepdim)


def logsumexp(x: V, d, keepdim, dt) -> V:
    m = reduce_ext(x, d, True, np.max, dt)
    s = reduce_sum(exp(add(x, m, dt, sign=-1.0), dt), d, True, dt)
    return _squeeze(add(log(s, dt), m, dt), (d,), keepdim)


def arg_extreme(x: V, d, keepdim, largest: bool, dt) -> V:
    """The index of the first largest (smallest) element; a row with a nan: its first nan's.
    Undetermined where another element may be as large within the bounds."""
    with np.errstate(all="ignore"):
        v0 = x.v if largest else -x.v
        s = np.where(np.isfinite(v0), _slack(x, dt), 0.0)
        lo, hi = v0 - s, v0 + s
        nan = np.isnan(v0)
        best_lo = np.max(np.where(nan, -np.inf, lo), axis=d, keepdims=True)
        cand = (hi >= best_lo) & ~nan
        ncand = np.sum(cand, axis=d, keepdims=True)
        vals = np.where(cand, v0, np.nan)
        exact_tie = np.all(~cand | ((x.e == 0) & (v0 == np.nanmax(np.where(cand, v0, -np.inf), axis=d,
                                                                        keepdims=True))), axis=d, keepdims=True)
        del vals
        idx = np.argmax(np.where(nan, np.inf, np.where(cand, v0, -np.inf)), axis=d)
        idx = np.expand_dims(idx, d)
        first_nan = np.expand_dims(np.argmax(nan, axis=d), d)
        has_nan = np.any(nan, axis=d, keepdims=True)
        # among exact ties, argmax of the masked row gives the first candidate with the max value
        r = np.where(has_nan, first_nan, idx).astype(np.float64)
        ok = has_nan | (ncand == 1) | exact_tie
        ok &= np.all(np.isfinite(x.e), axis=d, keepdims=True)
    return _squeeze(V(r, np.where(ok, 0.0, np.inf)), (d,), keepdim)


def reduce_dims(x: V, fn, dims, keepdim, dt) -> V:
    """sum / amax / mean over several dims: the one-dim reduction over each in turn (dims kept),
    a mean then scaled by 1 / (the number of elements), then the dims dropped."""
    out = x
    for d in sorted(dims):
        out = reduce_ext(out, d, True, np.max, dt) if fn == "mamax" else reduce_sum(out, d, True, dt)
    if fn == "mmean":
        out = mul(out, const(1.0 / math.prod(x.v.shape[d] for d in dims), dt), dt)
    return _squeeze(out, tuple(dims), keepdim)


def window_key(offsets, shape, steps=None):
    steps = steps or (1,) * len(shape)
    return tuple(slice(o, o + (s - 1) * k + 1, k) for o, s, k in zip(offsets, shape, steps))


def evaluate_op(case: Case, n, ins, vals) -> V:
    """The new ops' nodes (None for the others)."""
    op, a, dt = n.op, n.attrs, n.dtype
    if op == "cmp":
        return compare_mask(ins[0], ins[1], a["fn"], _arg_dtype(case, n, n.args[0]))
    if op == "isx":
        return mask_of(ins[0], a["fn"])
    if op == "logic":
        return logic(a["fn"], *ins)
    if op == "where":
        return select(*ins)
    if op == "mfill":
        x, m = ins
        r = select(m, const(a["value"], dt), x)
        return V(np.broadcast_to(r.v, n.shape), np.broadcast_to(r.e, n.shape))
    if op == "mcast":
        return ins[0]
    if op == "mmul":
        r = mul(ins[0], ins[1], dt)
        return V(np.broadcast_to(r.v, n.shape), np.broadcast_to(r.e, n.shape))
    if op == "un2":
        return unary2(ins[0], a, dt)
    if op == "mod":
        r = modulo(ins[0], ins[1], a["fn"] == "remainder", dt)
        return V(np.broadcast_to(r.v, n.shape), np.broadcast_to(r.e, n.shape))
    if op == "red2":
        fn, dims, kd = a["fn"], a["dims"], a["keepdim"]
        x = ins[0]
        if fn in ("argmax", "argmin"):
            src_dt = _arg_dtype(case, n, n.args[0])
            if a.get("all"):
                x = x.map(lambda t: np.reshape(np.broadcast_to(t, x.v.shape), (-1,)))
                return arg_extreme(x, 0, False, fn == "argmax", src_dt)
            return arg_extreme(x, dims[0], kd, fn == "argmax", src_dt)
        if fn in ("var", "std"):
            return variance(x, dims[0], kd, a["correction"], dt, std=fn == "std")
        if fn == "prod":
            return reduce_prod(x, dims[0], kd, dt)
        if fn == "logsumexp":
            return logsumexp(x, dims[0], kd, dt)
        return reduce_dims(x, fn, dims, kd, dt)
    if op == "concat":
        return V(np.concatenate([np.broadcast_to(x.v, x.v.shape) for x in ins], axis=a["dim"]),
                 np.concatenate([np.broadcast_to(x.e, x.v.shape) for x in ins], axis=a["dim"]))
    if op == "pad":
        x = ins[0]
        r = len(n.shape)
        width = [(0, 0)] * r
        p = a["pads"]
        for j in range(len(p) // 2):
            width[r - 1 - j] = (p[2 * j], p[2 * j + 1])
        cv = const(a["value"], dt)
        return V(np.pad(x.v, width, constant_values=float(cv.v)),
                 np.pad(np.broadcast_to(x.e, x.v.shape), width, constant_values=float(cv.e)))
    if op == "zeros":
        return V(np.zeros(n.shape), 0.0)
    if op == "write":
        buf, val = ins
        key = window_key(a["offsets"], a["shape"], a["steps"])
        v, e = np.array(buf.v, copy=True), np.array(np.broadcast_to(buf.e, buf.v.shape), copy=True)
        v[key] = np.reshape(val.v, v[key].shape)
        e[key] = np.reshape(np.broadcast_to(val.e, val.v.shape), e[key].shape)
        return V(v, e)
    if op == "permute":
        return ins[0].map(lambda t: np.transpose(np.broadcast_to(t, ins[0].v.shape), a["perm"]))
    from .ref_index import evaluate_index
    from .ref_more import evaluate_more
    r = evaluate_more(case, n, ins, vals)
    return r if r is not None else evaluate_index(case, n, ins, vals)
