"""The numpy functions behind the PTO instructions' math (the `semantics` column of the
instruction table).  Each takes arrays with any number of leading axes and an optional `out=`,
like a numpy ufunc; fp16/bf16 results of several numpy steps are computed in fp32 and rounded
once, as the hardware's single instruction does."""
from __future__ import annotations

import numpy as np

def wide(dtype):
    """The dtype a multi-step function computes in: fp32 for fp16/bf16 (rounded once, at the
    end), else the dtype itself."""
    return np.dtype(np.float32) if np.dtype(dtype).name in ("float16", "bfloat16") else dtype


def rounded(r, dtype, out):
    """A result computed in a wider dtype (or in fresh memory), rounded to `dtype` or into `out`."""
    if out is None:
        return r.astype(dtype, copy=False)
    out[...] = r
    return out


def rsqrt(x, out=None):
    """1 / sqrt(x); for fp16/bf16 computed in fp32 and rounded once."""
    w = wide(x.dtype)
    if w == x.dtype:
        return np.reciprocal(np.sqrt(x, out=out), out=out)
    return rounded(np.reciprocal(np.sqrt(x.astype(w))), x.dtype, out)


def negative(x, out=None):
    """np.negative, made in fresh memory and copied into `out`: numpy 2.x's SIMD loop for negative
    writes wrong elements into a strided output from an input strided by 4 (32-bit) or 8 (64-bit)
    elements (e.g. a column of [N, 1] windows run as one batch)."""
    return rounded(np.negative(np.ascontiguousarray(x)), x.dtype, out)


def relu(x, out=None):
    return np.maximum(x, np.zeros((), x.dtype), out=out)


def reduce_sum(x, axis, keepdims):
    """A sum of fp16/bf16 accumulated in fp32 and rounded once; others in their own dtype."""
    return np.sum(x, axis=axis, keepdims=keepdims, dtype=wide(x.dtype)).astype(x.dtype, copy=False)


def reduce_max(x, axis, keepdims):
    return np.max(x, axis=axis, keepdims=keepdims)


def reduce_min(x, axis, keepdims):
    return np.min(x, axis=axis, keepdims=keepdims)


def reduce_prod(x, axis, keepdims):
    """A product of fp16/bf16 accumulated in fp32 and rounded once; others in their own dtype."""
    return np.prod(x, axis=axis, keepdims=keepdims, dtype=wide(x.dtype)).astype(x.dtype, copy=False)


def round_half_away(x, out=None):
    """TCVT round=ROUND: to the nearest integral value, ties away from zero."""
    t = np.trunc(x)
    return rounded(np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t), x.dtype, out)


def iota(start, step, axis, out):
    """TCI: start + i * step along `axis` of `out` (i = 0, 1, ...; counted from the end, so
    leading task axes do not shift it), computed in float64 and converted once."""
    n = out.shape[axis]
    shape = [1] * (-axis)
    shape[0] = n
    out[...] = (start + step * np.arange(n, dtype=np.float64)).reshape(shape)
    return out


def product(dtype):
    """TMATMUL: both factors converted to the accumulator's dtype (an fp16/bf16 accumulator: the
    product computed in fp32 and rounded once).  A factor whose layout makes numpy pick another
    routine (a strided vector-shaped view, the valid part of a padded tile, sums in another order
    than the same values laid out contiguously) is copied first: the bits of a product must not
    depend on the layout the simulator's batching of tasks gives its factors (make fuzz found a
    one-ulp difference)."""
    w = wide(dtype)

    def f(a, b, out=None):
        p = np.matmul(_canonical(a, w), _canonical(b, w), out=out if w == dtype else None)
        return p if w == dtype else rounded(p, dtype, out)
    return f


def _canonical(x, w):
    """x in dtype w, contiguous where its layout could change numpy's choice of routine: a
    strided last dim, or a matrix of one row or one column (numpy's vector paths)."""
    x = widened(x, w)
    if x.flags.c_contiguous or (x.strides[-1] == x.itemsize and 1 not in x.shape[-2:]):
        return x
    return np.ascontiguousarray(x)


def widened(x, w):
    """x converted to dtype w (a matmul's factors to the dtype it multiplies in), x itself when
    it has that dtype."""
    if x.dtype == np.float16 and w == np.float32:
        # (looked up by bit pattern in astype's own table: the same values, half the time of
        # astype, which the factors of an fp16 matmul spend most of their simulation in)
        return _F16_AS_F32.take(x.view(np.uint16))
    return x.astype(w, copy=False)


# every fp16 bit pattern as astype gives it in fp32 (256 KiB: it stays in the CPU's caches)
_F16_AS_F32 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


def accumulate(dtype):
    """TMATMUL_ACC: the accumulator plus the product; TMATMUL_BIAS: the bias row plus the product
    (in fp32 for an fp16/bf16 accumulator, rounded once)."""
    w = wide(dtype)
    prod_ = product(w)

    def f(acc, a, b, out=None):
        if w == dtype:
            return np.add(acc, prod_(a, b), out=out)
        return rounded(np.add(acc.astype(w), prod_(a, b)), dtype, out)
    return f


def select(mask, a, b, out=None):
    """TSEL / TSELS: a where the mask is set, else b."""
    return rounded(np.where(mask, a, b), out.dtype if out is not None else np.result_type(a, b), out)


def fill(value, out=None):
    """TEXPANDS: every element of the tile the scalar."""
    if out is None:  # pragma: no cover - the simulators always pass the destination
        return np.asarray(value)
    out[...] = value
    return out


# what the FIX pipe applies to a tile on its way out of L0C (TSTORE act=)
ACTIVATIONS = {"relu": relu}


# --- indexed DMA (MGATHER / MSCATTER): the GM window spans the indexed axis whole; `index` (int32)
# broadcasts against the other axes.  Unchecked, an index out of range is clipped by a gather and
# dropped by a scatter (checked mode refuses it first: `index_errors`).

def index_errors(index, n: int) -> int:
    """How many indices lie outside [0, n)."""
    index = np.asarray(index)
    return int(np.count_nonzero((index < 0) | (index >= n)))


def gather(src, index, axis, out):
    """MGATHER: out[..., j, ...] = src[..., index[..., j, ...], ...] along `axis` (counted from
    the end); indices clipped into [0, n)."""
    idx = np.clip(index, 0, src.shape[axis] - 1)
    out[...] = np.take_along_axis(src, idx, axis)
    return out


def scatter_targets(dst, values, index, axis):
    """The fancy index of the GM elements each value goes to, and the values, without those whose
    index is out of range."""
    shape = values.shape
    idx = np.broadcast_to(index, shape)
    grids = [np.broadcast_to(g, shape) for g in np.ix_(*[np.arange(n) for n in shape])]
    grids[axis] = idx
    ok = (idx >= 0) & (idx < dst.shape[axis])
    if not ok.all():
        grids, values = [g[ok] for g in grids], values[ok]
    return tuple(grids), values


def scatter(dst, values, index, axis):
    """MSCATTER: dst[..., index[..., j, ...], ...] = values[..., j, ...] (duplicates: the last in
    order wins)."""
    t, v = scatter_targets(dst, values, index, axis)
    dst[t] = v
    return dst


def scatter_add(dst, values, index, axis):
    """MSCATTER atomic=ADD: dst[..., index[..., j, ...], ...] += values[..., j, ...], every
    duplicate accumulated in dst's dtype (np.add.at: an atomic add per element)."""
    t, v = scatter_targets(dst, values, index, axis)
    np.add.at(dst, t, v)
    return dst
