"""Regressions found by the differential fuzzer grown to the registry's ops (tests/fuzz/gen_ops.py),
each checked against numpy written here."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pypto


def _run(kernel, *arrays, machine="teach"):
    res = kernel.compile(*arrays, machine=machine).simulate(*arrays)
    return res


@pypto.jit
def _write_after_mul(x0, out0):
    v1 = x0 * 1.0
    v1[1:2] = x0[1:2]
    out0[:] = v1


@pypto.jit
def _write_into_zeros(x0, out0):
    v1 = pypto.zeros_like(x0)
    v1[1:2] = x0[0:1] * 2.0
    out0[:] = v1


@pytest.mark.parametrize("n", [2, 3, 64])
def test_store_of_a_written_value_stores_the_buffer(n):
    """A value written into (buf[a:b] = v) and then stored whole: the store read the written
    value's tile (broadcast over the output) when it was fused into the write's group."""
    x = np.arange(1, n + 1).astype(np.float32)
    o = np.zeros(n, np.float32)
    res = _run(_write_after_mul, x, o)
    np.testing.assert_array_equal(res.outputs["out0"], x)
    want = np.zeros(n, np.float32)
    want[1] = 2 * x[0]
    res = _run(_write_into_zeros, x, o)
    np.testing.assert_array_equal(res.outputs["out0"], want)


@pypto.jit
def _pad3(x0, out0):
    out0[:] = pypto.pad(x0, (2, 2), value=3)


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_pad_of_a_last_dim_of_one(dtype):
    """pad(x [8, 8, 1], (2, 2)): the padded columns held x's element (the same bug: the store
    of the padded buffer fused into the write of x)."""
    x = np.arange(64).reshape(8, 8, 1).astype(dtype)
    o = np.zeros((8, 8, 5), dtype)
    res = _run(_pad3, x, o)
    np.testing.assert_array_equal(res.outputs["out0"], np.pad(x, [(0, 0), (0, 0), (2, 2)], constant_values=3))


@pypto.jit
def _amax_all_of_min(x0, out0):
    v1 = x0.sqrt()
    v2 = v1.T
    v3 = pypto.minimum(v2, 7.0)
    v4 = pypto.amin(v3, dim=-3, keepdim=False)
    v5 = pypto.amax(v4, dim=None, keepdim=True)
    out0[...] = v5.reshape([1])


def test_amax_over_all_dims_after_a_reduction():
    """(Seed 305: the fuzzer's own model took x.T of a 3-D tensor for x.mT; .T reverses every dim,
    as numpy's and torch's do, so the kernel was right and so was pypto's check.)"""
    rng = np.random.default_rng(8581)
    x = rng.uniform(1.0, 1.5, (8, 128, 128)).astype(ml_dtypes.bfloat16)
    o = np.zeros(1, ml_dtypes.bfloat16)
    res = _run(_amax_all_of_min, x, o)
    want = np.minimum(np.sqrt(x.astype(np.float64)).T, 7.0).min(0).max()
    assert abs(float(res.outputs["out0"][0]) - want) <= 0.02 * want


@pypto.jit
def _write_into_matmul_copy(x0, out0):
    v1 = pypto.matmul(x0, x0, a_trans=True)
    v2 = v1 * 1.0
    v5 = pypto.neg(v1[0:1, 0:1, 0:1].reshape([1, 1]))
    v2[0] = v5
    out0[:] = v2


def test_write_into_a_copy_of_a_matmul_result():
    """A group reading a cube result that a paired epilogue also reads: the dependency on the cube
    task was pruned as implied by the epilogue's (which runs alongside the cube task and implies
    no end): a race in checked mode."""
    x = np.random.default_rng(0).uniform(-2, 2, (48, 100, 1)).astype(np.float32)
    o = np.zeros((48, 1, 1), np.float32)
    ck = _write_into_matmul_copy.compile(x, o, machine="teach")
    want = np.matmul(x.astype(np.float64).swapaxes(-1, -2), x.astype(np.float64))
    want[0] = -want[0, 0:1, 0:1]
    np.testing.assert_allclose(ck.simulate(x, o).outputs["out0"], want, rtol=1e-5)
    ck.simulate(x, o, checked=True, check=False)


@pypto.jit
def _stored_then_overwritten(x0, out0, out1):
    v1 = pypto.amax(x0, dim=1)
    v2 = pypto.amax(x0, dim=1, keepdim=True)
    out0[:] = v2
    out0[:1] = pypto.neg(v2[:1])
    out1[:] = v1


def test_a_value_stored_then_overwritten_is_read_from_its_own_buffer():
    """(Fuzz seed 1200219.) A value lived where it was first stored (out0); a later store wrote
    over part of out0, and a read of the value (out1, through CSE the same amax) saw the new data."""
    x = np.array([[0.548], [-0.921], [-1.836]], np.float16)
    o0, o1 = np.zeros((3, 1), np.float16), np.zeros(3, np.float16)
    res = _stored_then_overwritten.compile(x, o0, o1, machine="teach").simulate(x, o0, o1)
    np.testing.assert_array_equal(res.outputs["out1"], x[:, 0])
    np.testing.assert_array_equal(res.outputs["out0"][:, 0], np.concatenate([-x[:1, 0], x[1:, 0]]))
    assert res.ok


@pypto.jit
def _remainder_var(x0, out0):
    v2 = pypto.leaky_relu(pypto.remainder(x0, 0.1), 0.2)
    out0[:] = pypto.var(v2, dim=-1, correction=0, keepdim=True)


def test_autocast_widens_a_constant_with_its_own_value():
    """(Fuzz seed 1500000 + k, caught by pypto's own check.) autocast computed an fp16 remainder
    in fp32 with the constant 0.1 instead of the fp16 constant's value 0.0999755859375: x mod 0.1
    differs, and the variance of five such values was 25% off."""
    x = np.random.default_rng(1).uniform(-20, 20, 5).astype(np.float16)
    o = np.zeros(1, np.float16)
    res = _remainder_var.compile(x, o).simulate(x, o)
    v = np.remainder(x.astype(np.float64), float(np.float16(0.1)))
    want = np.var(np.where(v >= 0, v, 0.2 * v))
    assert abs(float(res.outputs["out0"][0]) - want) <= 1e-3 * want + 1e-7
    assert res.ok


@pypto.jit
def _long_product(x0, out0):
    v = pypto.tanh(x0 + x0).reshape(9600)
    pypto.assemble(pypto.prod(v, dim=0, keepdim=True), [2], out0)


def test_a_product_that_ends_in_the_subnormals_is_not_a_false_alarm():
    """9600 factors of about 0.98: the product is a few subnormal steps (about 1e-44), where
    each rounding is absolute; the kernel multiplies tile by tile in another order than numpy
    and lands a few smallest subnormals away.  The check said MISMATCH (its bound was relative
    only); the result is right and the bound now allows the subnormal roundings."""
    rng = np.random.default_rng(2872)
    x = rng.uniform(1.0, 1.5, size=(100, 48, 2)).astype(np.float32)
    out = np.zeros(4, np.float32)
    res = _run(_long_product, x, out)
    want = np.prod(np.tanh(x.astype(np.float64) * 2))
    got = float(res.outputs["out0"][2])
    assert 0 < want < 1e-40 and abs(got - want) < 100 * 2.0 ** -149
    c = res.check["out0"]
    assert res.ok and c["max_err_ratio"] < 1
    # ... and the allowance stays tight: a product 1e-40 off (thousands of steps) would fail
    assert 0 < c["max_abs_err"] / c["max_err_ratio"] < 1e-40
