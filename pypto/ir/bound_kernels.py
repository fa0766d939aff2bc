"""Fused element-wise kernels of the error bounds (`numerics.Approx`), for large arrays.

numpy evaluates a bound rule one operation at a time: mul's |b| e_a + |a| e_b + e_a e_b makes five
temporaries as large as the value, rounding's |v| u + e + the smallest subnormal three.  On
millions of elements those temporaries are most of the check's time (a fresh 256 MiB array costs
35-600 ms of page faults on this project's machine, by the state of the process's memory, before a
byte is computed, against 13 ms for a product into a touched one), and the check is most of
`ck.simulate()` (a layernorm 8192x4096: 3 s of bounds against 0.08 s of simulation).  These kernels (numba ufuncs) compute the same expressions element by element: the
same operations on the same operands in the same order and precision (an fp32 rounding bound is
summed in fp32, as numpy's in-place sum does), so they give the very bits numpy gives, NaN and
infinities included (`tests/test_bound_kernels.py` holds them to numpy on edge values).  No
transcendental function is fused: those stay numpy's own (`exp`, `expm1`, `log1p`).

`numerics` imports this module (importing numba: about 0.3 s) for an operation of FUSED_LOAD_MIN
elements or more, and calls the kernels from FUSED_MIN elements once it is loaded.  Each kernel is
made when first used (module `__getattr__`): numba compiles it, or loads it from its on-disk cache,
0.05-0.4 s a kernel by its signatures; a matmul's check needs only the rounding and the comparison,
not the product's and the quotient's four signatures each.
"""
from __future__ import annotations

import numpy as np
from numba import njit, vectorize

_F32, _F64 = "float32", "float64"


def _mul_bound(av, ae, bv, be):
    """`Approx.__mul__`'s bound: |b| e_a + |a| e_b + e_a e_b (numpy's order: left to right)."""
    return abs(bv) * ae + abs(av) * be + ae * be


def _rounded_bound_f32(v, e, u, top, underflow):
    """`Approx.rounded`'s bound of an fp32 value whose shape is the bound's: |v| u in fp32, then e
    added (in fp64, stored in fp32), then the smallest subnormal (fp32), as numpy's in-place steps
    on the fp32 array of |v| do; infinite where |v| is beyond the dtype's largest finite `top` (an
    exact infinity counts as 0: it rounds to itself)."""
    m = abs(v)
    if m == np.inf:
        m = np.float32(0.0)
    if m > top:
        return np.inf
    t = m * u
    t = np.float32(np.float64(t) + e)
    return np.float64(t + underflow)


def _rounded_bound_f64(v, e, u, top, underflow):
    """`rounded_bound_f32` of an fp64 value: every step in fp64."""
    m = abs(v)
    if m == np.inf:
        m = 0.0
    if m > top:
        return np.inf
    return (m * u + e) + underflow


def _div_bound(ae, v, bv, be):
    """`Approx.__truediv__`'s bound of v = a / b: (e_a + |v| e_b) / (|b| - e_b), infinite where the
    divisor's magnitude may reach 0 (or is NaN)."""
    den = np.float64(abs(bv)) - be
    if den > 0:
        return (ae + abs(v) * be) / den
    return np.inf


@njit(cache=True, error_model="numpy")
def compare_errors(got, want, bound, safety):
    """`numerics.within_bound`'s pass over the elements (flat arrays of one size): (the largest
    finite |got - want|, how many elements are not within `safety` x their bound, the largest
    error over its allowance among those where that is not NaN).  Maxima: the same whatever the
    order of the elements, and each error and ratio is numpy's own expression."""
    largest = 0.0
    outside = 0
    ratio = 0.0
    for k in range(got.size):
        err = abs(np.float64(got[k]) - np.float64(want[k]))
        allowed = bound[k] * safety
        if not err <= allowed:
            outside += 1
        if err > largest and err != np.inf:
            largest = err
        r = err / allowed
        if r > ratio:
            ratio = r
    return largest, outside, ratio


# name -> (the element function, its signatures): made into a ufunc when first used
_UFUNCS = {
    "mul_bound": (_mul_bound, [f"float64({a}, float64, {b}, float64)" for a in (_F32, _F64) for b in (_F32, _F64)]),
    "rounded_bound_f32": (_rounded_bound_f32, ["float64(float32, float64, float32, float64, float32)"]),
    "rounded_bound_f64": (_rounded_bound_f64, ["float64(float64, float64, float64, float64, float64)"]),
    "div_bound": (_div_bound, [f"float64(float64, {v}, {b}, float64)" for v in (_F32, _F64) for b in (_F32, _F64)]),
}


def __getattr__(name: str):
    """A kernel of `_UFUNCS`, made (compiled, or loaded from numba's cache) on first use."""
    spec = _UFUNCS.get(name)
    if spec is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    f, signatures = spec
    ufunc = globals()[name] = vectorize(signatures, cache=True)(f)
    return ufunc
