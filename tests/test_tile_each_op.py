"""Every math instruction of `pypto.tile` in isolation, in a one-line Tile-level kernel, against a
numpy formula written here (not the registry's references): element-wise, tile-scalar, row and
column reductions and broadcasts, conversion; a tail tile in each."""
from __future__ import annotations

import numpy as np
import pytest

import pypto

T = pypto.tile
ROWS, COLS, TM = 20, 32, 8        # 20 rows in tiles of 8: a tail of 4

UNARY = {"texp": np.exp, "tlog": np.log, "tsqrt": np.sqrt, "trsqrt": lambda x: 1 / np.sqrt(x),
         "tabs": np.abs, "tneg": np.negative, "trelu": lambda x: np.maximum(x, 0), "trecip": lambda x: 1 / x}
BINARY = {"tadd": np.add, "tsub": np.subtract, "tmul": np.multiply, "tdiv": np.divide, "tmax": np.maximum,
          "tmin": np.minimum, "trem": np.remainder, "tfmod": np.fmod}
ROW = {"trowsum": np.sum, "trowmax": np.max, "trowmin": np.min, "trowprod": np.prod}
COL = {"tcolsum": np.sum, "tcolmax": np.max, "tcolmin": np.min, "tcolprod": np.prod}
POSITIVE = {"tlog", "tsqrt", "trsqrt", "trecip", "tdiv", "trem", "tfmod", "trowprod", "tcolprod"}


def data(name, rng, shape=(ROWS, COLS)):
    if name in POSITIVE or name.endswith(("div", "rem", "fmod", "prod")):
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def run(kernel, *arrays):
    ck = kernel.compile(*arrays, machine="teach")
    res = ck.simulate(*arrays)
    assert res.ok, res.check
    return res.outputs


def every(kind: dict):
    assert set(kind) <= set(T.OPERATIONS)
    return sorted(kind)


@pytest.mark.parametrize("name", every(UNARY))
def test_unary(name, rng):
    @pypto.jit(level="tile")
    def k(x, out):
        for i in range(0, ROWS, TM):
            T.tstore(out[i:i + TM, :], getattr(T, name)(T.tload(x[i:i + TM, :])))
    x = data(name, rng)
    got = run(k, x, np.zeros_like(x))["out"]
    np.testing.assert_allclose(got, UNARY[name](x.astype(np.float64)), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("name", every(BINARY))
def test_tile_tile_and_tile_scalar(name, rng):
    @pypto.jit(level="tile")
    def k(x, y, out, outs):
        for i in range(0, ROWS, TM):
            a, b = T.tload(x[i:i + TM, :]), T.tload(y[i:i + TM, :])
            T.tstore(out[i:i + TM, :], getattr(T, name)(a, b))
            T.tstore(outs[i:i + TM, :], getattr(T, name + "s")(a, 0.75))
    x, y = data(name, rng), data(name, rng)
    got = run(k, x, y, np.zeros_like(x), np.zeros_like(x))
    f = BINARY[name]
    np.testing.assert_allclose(got["out"], f(x.astype(np.float64), y.astype(np.float64)), rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(got["outs"], f(x.astype(np.float64), 0.75), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("name", every(ROW))
def test_row_reduction_and_broadcasts(name, rng):
    @pypto.jit(level="tile")
    def k(x, r, out):
        for i in range(0, ROWS, TM):
            t = T.tload(x[i:i + TM, :])
            m = getattr(T, name)(t)
            T.tstore(r[i:i + TM, :], m)
            T.tstore(out[i:i + TM, :], T.trowexpandsub(T.trowexpandmul(t, m), m))
    x = data(name, rng)
    got = run(k, x, np.zeros((ROWS, 1), np.float32), np.zeros_like(x))
    want = ROW[name](x.astype(np.float64), axis=1, keepdims=True)
    np.testing.assert_allclose(got["r"], want, rtol=2e-5)
    np.testing.assert_allclose(got["out"], x * want - want, rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("name", every(COL))
def test_column_reduction_and_broadcasts(name, rng):
    @pypto.jit(level="tile")
    def k(x, c, out):
        t = T.tload(x[0:TM, :])
        m = getattr(T, name)(t)
        T.tstore(c[0:1, :], m)
        T.tstore(out[0:TM, :], T.tcolexpanddiv(T.tcolexpandadd(t, m), m))
    x = data(name, rng, (TM, COLS))
    got = run(k, x, np.zeros((1, COLS), np.float32), np.zeros_like(x))
    want = COL[name](x.astype(np.float64), axis=0, keepdims=True)
    np.testing.assert_allclose(got["c"], want, rtol=2e-5)
    np.testing.assert_allclose(got["out"], (x + want) / want, rtol=2e-5, atol=1e-5)


def test_conversion(rng):
    @pypto.jit(level="tile")
    def k(x, out):
        for i in range(0, ROWS, TM):
            T.tstore(out[i:i + TM, :], T.tcvt(T.tload(x[i:i + TM, :]), pypto.DT_FP16))
    x = data("tcvt", rng)
    got = run(k, x, np.zeros(x.shape, np.float16))["out"]
    np.testing.assert_array_equal(got, x.astype(np.float16))
