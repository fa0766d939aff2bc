"""Matmul + bias + ReLU epilogues fused onto the cube core: TMATMUL_BIAS from the bias table,
ReLU applied by the FIX pipe on the store."""
import re

import numpy as np
import pytest

import pypto
from pypto.ir.program import Program
from pypto.ir.pto_text import PTOSyntaxError

T, F16, F32 = pypto.Tensor, pypto.DT_FP16, pypto.DT_FP32


@pypto.jit
def mm_bias_relu(a, b, bias, c):
    pypto.set_cube_tile_shapes([64, 64], [32, 64], [64, 64])
    c[:] = pypto.relu(pypto.matmul(a, b) + bias)


@pypto.jit
def mm_bias(a, b, bias, c):
    pypto.set_cube_tile_shapes([64, 64], [32, 64], [64, 64])
    c[:] = pypto.matmul(a, b) + bias


@pypto.jit
def mm_relu(a, b, c):
    pypto.set_cube_tile_shapes([64, 64], [32, 64], [64, 64])
    c[:] = pypto.relu(pypto.matmul(a, b))


@pypto.jit
def relu_then_bias(a, b, bias, c):
    pypto.set_cube_tile_shapes([64, 64], [32, 64], [64, 64])
    c[:] = pypto.relu(pypto.matmul(a, b)) + bias


@pypto.jit
def mm_plus_matrix(a, b, d, c):
    pypto.set_cube_tile_shapes([64, 64], [32, 64], [64, 64])
    c[:] = pypto.matmul(a, b) + d


@pypto.jit
def mm_stored_and_relu(a, b, c, r):
    pypto.set_cube_tile_shapes([64, 64], [32, 64], [64, 64])
    m = pypto.matmul(a, b)
    c[:] = m
    r[:] = pypto.relu(m)


def _ops(ck):
    return [i.op for t in ck.program.tasks for i in t.instrs]


def _data(rng, m, k, n, dtype=np.float32):
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype)
    return a, b, bias


@pytest.mark.parametrize("m, k, n", [(128, 96, 128), (100, 70, 90)])       # whole tiles, and tails
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bias_and_relu_run_on_the_cube(rng, m, k, n, dtype):
    a, b, bias = _data(rng, m, k, n, dtype)
    c = np.zeros((m, n), dtype)
    ck = mm_bias_relu.compile(a, b, bias, c, machine="teach")
    tg = ck.levels["tensor"]
    mm = next(x for x in tg.nodes if x.op == "matmul")
    assert {x.op for x in tg.nodes if x.attrs.get("group") == mm.attrs["group"]} == {"matmul", "add", "relu"}
    assert {t.core_type for t in ck.program.tasks} == {"AIC"}          # no vector epilogue task
    ops = _ops(ck)
    n_tiles = -(-m // 64) * -(-n // 64)
    assert ops.count("TMATMUL_BIAS") == ops.count("TMOV") == n_tiles
    stores = [i for t in ck.program.tasks for i in t.instrs if i.op == "TSTORE"]
    assert len(stores) == n_tiles and all(i.attrs["act"] == "relu" and i.pipe == "FIX" for i in stores)
    want = np.maximum(a.astype(np.float32) @ b.astype(np.float32) + bias.astype(np.float32), 0)
    got = ck.simulate(a, b, bias, c).outputs["c"]
    tol = 1e-4 if dtype == np.float32 else 2e-2 * np.sqrt(k)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=tol, atol=tol)


def test_bias_alone_and_relu_alone(rng):
    a, b, bias = _data(rng, 128, 64, 128)
    c = np.zeros((128, 128), np.float32)
    ck = mm_bias.compile(a, b, bias, c, machine="teach")
    assert "TMATMUL_BIAS" in _ops(ck) and not any("act" in i.attrs for t in ck.program.tasks for i in t.instrs)
    np.testing.assert_allclose(ck.simulate(a, b, bias, c).outputs["c"], a @ b + bias, rtol=1e-4, atol=1e-4)
    ck = mm_relu.compile(a, b, c, machine="teach")
    assert "TMATMUL_BIAS" not in _ops(ck) and "TMOV" not in _ops(ck)
    assert {t.core_type for t in ck.program.tasks} == {"AIC"}
    np.testing.assert_allclose(ck.simulate(a, b, c).outputs["c"], np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)


def test_what_stays_a_vector_epilogue(rng):
    a, b, bias = _data(rng, 128, 64, 128)
    c = np.zeros((128, 128), np.float32)
    d = rng.standard_normal((128, 128)).astype(np.float32)
    cases = [
        # the FIX pipe's ReLU comes after the bias: a bias added after the ReLU is vector work
        (relu_then_bias, (a, b, bias, c), np.maximum(a @ b, 0) + bias, ["AIC", "AIV"]),
        # a whole matrix is not a bias row
        (mm_plus_matrix, (a, b, d, c), a @ b + d, ["AIC", "AIV"]),
    ]
    for kernel, args, want, cores in cases:
        ck = kernel.compile(*args, machine="teach")
        assert sorted({t.core_type for t in ck.program.tasks}) == cores, kernel.__name__
        assert "TMATMUL_BIAS" not in _ops(ck)
        np.testing.assert_allclose(ck.simulate(*args).outputs["c"], want, rtol=1e-4, atol=1e-4)
    # a matmul result that is also stored keeps its plain store; the ReLU reads it from GM
    r = np.zeros_like(c)
    ck = mm_stored_and_relu.compile(a, b, c, r, machine="teach")
    assert not any("act" in i.attrs for t in ck.program.tasks for i in t.instrs)
    out = ck.simulate(a, b, c, r).outputs
    np.testing.assert_allclose(out["r"], np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["c"], a @ b, rtol=1e-4, atol=1e-4)


@pypto.jit
def mm_plus_a_later_row(a, b, x, c):
    pypto.set_cube_tile_shapes([64, 64], [32, 64], [64, 64])
    y = pypto.matmul(a, b)
    c[:] = pypto.sum(x, dim=0) + y         # the bias row is computed after the matmul


def test_a_bias_computed_after_the_matmul_is_not_the_cube_tasks(rng):
    """A bias row a later group computes cannot start the cube task's accumulator: the cube task
    would read it before it is written (a fuzzed `x.prod(1) + matmul(..)` on int32 added zeros:
    11,776 of 16,384 elements wrong).  The add stays vector work, after both."""
    a, b, _ = _data(rng, 128, 64, 128)
    x = rng.standard_normal((4, 128)).astype(np.float32)
    c = np.zeros((128, 128), np.float32)
    ck = mm_plus_a_later_row.compile(a, b, x, c, machine="teach")
    assert "TMATMUL_BIAS" not in _ops(ck)
    res = ck.simulate(a, b, x, c)
    assert res.ok
    np.testing.assert_allclose(res.outputs["c"], x.sum(0) + a @ b, rtol=1e-4, atol=1e-4)


def test_fusion_off_keeps_the_epilogue_on_the_vector_cores_and_is_slower():
    specs = (T([512, 512], F16), T([512, 512], F16), T([512], F16), T([512, 512], F16))
    on = mm_bias_relu.compile(*specs)
    off = mm_bias_relu.compile(*specs, options={"fusion": False})
    assert "TMATMUL_BIAS" in _ops(on) and "TMATMUL_BIAS" not in _ops(off)
    assert {t.core_type for t in off.program.tasks} == {"AIC", "AIV"}
    cycles = [pypto.sim.simulate(ck.program, machine=ck.machine, mode="timing", trace=False).cycles
              for ck in (on, off)]
    assert cycles[0] < cycles[1]


def test_epilogue_instructions_round_trip_and_bad_text(rng):
    a, b, bias = _data(rng, 64, 32, 64)
    ck = mm_bias_relu.compile(a, b, bias, np.zeros((64, 64), np.float32), machine="teach")
    text = ck.program.text()
    assert re.search(r"TMATMUL_BIAS +L0C\[0x0\]:fp32\[64,64\], BT\[0x0\]:fp32\[1,64\], L0A", text)
    assert re.search(r"TSTORE +GM:c\[0:64,0:64\], L0C\[0x0\]:fp32\[64,64\], act=relu", text)
    assert Program.parse(text).text() == text
    bad = {
        "act=relu": ("act=gelu", "unknown activation of a store"),
        "BT[0x0]:fp32[1,64], L0A": ("L1[0x0]:fp32[1,64], L0A", "wrong operands for TMATMUL_BIAS"),
    }
    for old, (new, message) in bad.items():
        with pytest.raises(PTOSyntaxError, match=re.escape(message)):
            Program.parse(text.replace(old, new, 1))


@pypto.jit
def int8_mm_plus_row(a, b, bias, c):
    c[:] = pypto.matmul(a, b, out_dtype=pypto.DT_FP32) + bias


@pypto.jit
def int8_mm_plus_int_row(a, b, bias, c):
    c[:] = pypto.matmul(a, b, out_dtype=pypto.DT_INT32) + bias


def test_a_float_bias_row_is_not_added_to_an_int8_accumulator(rng):
    """The cube sums int8 products in int32: a float bias row in the bias table would lose its
    fraction there (a fuzzed int8 matmul + fp32 bias came out whole numbers: 16 of 16 elements
    wrong).  It is added by a vector group, in fp32; an int32 bias row still joins the cube."""
    a = rng.integers(-4, 5, (64, 48)).astype(np.int8)
    b = rng.integers(-4, 5, (48, 32)).astype(np.int8)
    exact = a.astype(np.int32) @ b.astype(np.int32)
    bias = rng.uniform(-2, 2, (1, 32)).astype(np.float32)
    c = np.zeros((64, 32), np.float32)
    ck = int8_mm_plus_row.compile(a, b, bias, c, machine="teach")
    assert "TMATMUL_BIAS" not in _ops(ck)
    res = ck.simulate(a, b, bias, c)
    assert res.ok
    np.testing.assert_allclose(res.outputs["c"], exact + bias, rtol=1e-6, atol=1e-6)
    ibias = rng.integers(-9, 10, (1, 32)).astype(np.int32)
    ic = np.zeros((64, 32), np.int32)
    ck = int8_mm_plus_int_row.compile(a, b, ibias, ic, machine="teach")
    assert "TMATMUL_BIAS" in _ops(ck)
    res = ck.simulate(a, b, ibias, ic)
    assert res.ok and (res.outputs["c"] == exact + ibias).all()
