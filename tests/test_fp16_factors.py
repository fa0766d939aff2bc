"""TMATMUL's fp16 factors are widened to fp32 by bit pattern (a table of astype's own results) rather
than by astype: the same bits for every pattern and every layout the simulator's batching gives.
Held to numpy's astype and matmul."""
from __future__ import annotations

import numpy as np
import pytest

from pypto.target.semantics import _canonical, accumulate, product


def _every_pattern() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16)


def test_every_fp16_pattern_widens_as_astype_does():
    """Every bit pattern (signed zeros, subnormals, infinities, each NaN payload), in a strided
    view too: the bits astype gives, laid out contiguously."""
    x = _every_pattern().reshape(256, 256)
    for view in (x, x[:, ::3], x.T):
        got = _canonical(view, np.dtype(np.float32))
        assert got.flags.c_contiguous and got.dtype == np.float32
        assert np.array_equal(got.view(np.uint32), view.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "batched", "batch-permuted", "row"])
def test_fp16_products_are_those_of_astype_factors(layout):
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((4, 64, 96)) * 3).astype(np.float16)
    b = (rng.standard_normal((4, 96, 48)) * 3).astype(np.float16)
    a[0, 0, :8] = [0, -0.0, 6e-8, -6e-8, 65504, -65504, 1e-5, 3.0]     # zeros, subnormals, extremes
    if layout == "contiguous":
        a, b = a[0], b[0]
    elif layout == "transposed":
        a, b = np.ascontiguousarray(a[0].T).T, np.ascontiguousarray(b[0].T).T
    elif layout == "strided":
        a, b = a[0, ::2, :], b[0, :, ::2]
        b = b[: a.shape[1]] if b.shape[0] != a.shape[1] else b
    elif layout == "batch-permuted":
        a = np.ascontiguousarray(a.transpose(1, 0, 2)).transpose(1, 0, 2)
    elif layout == "row":
        a, b = a[0, :1], b[0]
    f32 = np.dtype(np.float32)
    got = product(f32)(a, b)
    want = np.matmul(np.ascontiguousarray(a.astype(np.float32)), np.ascontiguousarray(b.astype(np.float32)))
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    acc = rng.standard_normal(want.shape).astype(np.float32)
    assert np.array_equal(accumulate(f32)(acc, a, b), acc + want)
