"""The ops grown through the registry, against numpy written here (not the registry's own
reference): every float dtype, tiles with tails, the call form, compile + simulate (functional
and timing) and pypto's own check (see conftest.run_and_check).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pypto

from common import tile_consts, unary_kernel

BF16 = np.dtype(ml_dtypes.bfloat16)
M, N = 40, 300                        # tails for the tiles below
TILES = [(16, 128), None]
TILE_IDS = ["t16x128", "tdefault"]


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# name -> (pypto call, numpy reference on float64, input domain (lo, hi))
UNARY = {
    "silu": (pypto.silu, lambda x: x * _sigmoid(x), (-8, 8)),
    "softplus": (pypto.softplus, lambda x: np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0), (-20, 20)),
    "hardsigmoid": (pypto.hardsigmoid, lambda x: np.clip(x / 6 + 0.5, 0, 1), (-5, 5)),
    "hardswish": (pypto.hardswish, lambda x: x * np.clip(x + 3, 0, 6) / 6, (-5, 5)),
    "square": (pypto.square, lambda x: x * x, (-4, 4)),
    "expm1": (pypto.expm1, np.expm1, (-3, 3)),
    "log1p": (pypto.log1p, np.log1p, (0.5, 9)),
    "exp2": (pypto.exp2, np.exp2, (-6, 6)),
    "log2": (pypto.log2, np.log2, (0.1, 50)),
    "log10": (pypto.log10, np.log10, (0.1, 50)),
    "leaky_relu": (lambda x: pypto.leaky_relu(x, 0.1), lambda x: np.where(x >= 0, x, 0.1 * x), (-4, 4)),
    "elu": (lambda x: pypto.elu(x, 0.5), lambda x: np.where(x > 0, x, 0.5 * (np.exp(x) - 1)), (-4, 4)),
    "clamp": (lambda x: pypto.clamp(x, -0.5, 1.25), lambda x: np.minimum(np.maximum(x, -0.5), 1.25), (-3, 3)),
    "clamp_min": (lambda x: pypto.clamp(x, min=0.25), lambda x: np.maximum(x, 0.25), (-3, 3)),
    "relu6": (pypto.relu6, lambda x: np.minimum(np.maximum(x, 0), 6), (-9, 9)),
    "hardtanh": (pypto.hardtanh, lambda x: np.clip(x, -1, 1), (-3, 3)),
    "pow3": (lambda x: pypto.pow(x, 3), lambda x: x ** 3, (-3, 3)),
    "pow-2": (lambda x: x ** -2, lambda x: x ** -2.0, (0.5, 3)),
    "pow0.5": (lambda x: x ** 0.5, np.sqrt, (0.1, 9)),
    "pow1.7": (lambda x: pypto.pow(x, 1.7), lambda x: x ** 1.7, (0.1, 9)),
    "tanh_method": (lambda x: x.tanh(), np.tanh, (-4, 4)),
    "sigmoid_method": (lambda x: x.sigmoid(), _sigmoid, (-8, 8)),
    "clip_method": (lambda x: x.clip(-1, 1), lambda x: np.clip(x, -1, 1), (-3, 3)),
}


@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_fp32(op, tiles, rng, check_kernel):
    pfn, ref, (lo, hi) = UNARY[op]
    x = rng.uniform(lo, hi, (M, N)).astype(np.float32)
    want = ref(x.astype(np.float64)).astype(np.float32)
    res = check_kernel(unary_kernel(pfn), [x, np.zeros_like(x)], {1: want}, **tile_consts(tiles))
    assert res.ok


@pytest.mark.parametrize("dt", [np.float16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_low_precision(op, dt, rng, check_kernel):
    pfn, ref, (lo, hi) = UNARY[op]
    x = rng.uniform(lo, hi, (M, N)).astype(dt)
    want = ref(x.astype(np.float64))
    out = np.zeros(x.shape, dt)
    scale = np.maximum(np.abs(want), 1.0)           # relative to the result, for exp2/pow at the top
    check_kernel(unary_kernel(pfn), [x, out], {1: want.astype(dt)}, rtol=2e-2 if dt == BF16 else 3e-3,
                 atol=float(np.max(scale)) * (2e-2 if dt == BF16 else 3e-3), TM=16, TN=128)


def test_unary_timing_is_deterministic_and_counts_the_decomposition(rng):
    """Timing mode runs the decomposed ops: silu is neg, exp, add, recip, mul per tile."""
    x = rng.standard_normal((M, N)).astype(np.float32)
    ck = unary_kernel(pypto.silu).compile(x, np.zeros_like(x), TM=16, TN=128)
    ops = [i.op for t in ck.program.tasks for i in t.instrs]
    assert {"TNEG", "TEXP", "TADDS", "TRECIP", "TMUL"} <= set(ops)
    a, b = ck.simulate(x, np.zeros_like(x), mode="timing"), ck.simulate(x, np.zeros_like(x), mode="timing")
    assert a.cycles == b.cycles > 0


# name -> (pypto call (x, dim, keepdim), numpy reference)
REDUCE = {
    "var": (lambda x, d, k: pypto.var(x, d, k), lambda x, d, k: np.var(x, axis=d, keepdims=k, ddof=1)),
    "var_pop": (lambda x, d, k: pypto.var(x, d, k, correction=0), lambda x, d, k: np.var(x, axis=d, keepdims=k)),
    "std": (lambda x, d, k: pypto.std(x, d, k), lambda x, d, k: np.std(x, axis=d, keepdims=k, ddof=1)),
    "std_unbiased_false": (lambda x, d, k: x.std(d, k, correction=0), lambda x, d, k: np.std(x, axis=d, keepdims=k)),
    "logsumexp": (lambda x, d, k: pypto.logsumexp(x, d, k),
                  lambda x, d, k: np.log(np.sum(np.exp(x), axis=d, keepdims=k))),
    "sum_all": (lambda x, d, k: pypto.sum(x, None, k), lambda x, d, k: np.sum(x, keepdims=k)),
    "mean_01": (lambda x, d, k: x.mean((0, 1), k), lambda x, d, k: np.mean(x, axis=(0, 1), keepdims=k)),
    "amax_all": (lambda x, d, k: pypto.amax(x, None, k), lambda x, d, k: np.max(x, keepdims=k)),
}


@pytest.mark.parametrize("keepdim", [True, False], ids=["keep", "drop"])
@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("op", list(REDUCE))
def test_reductions(op, dim, keepdim, rng, check_kernel):
    pfn, ref = REDUCE[op]
    x = rng.standard_normal((M, N)).astype(np.float32)
    want = np.asarray(ref(x.astype(np.float64), dim, keepdim)).astype(np.float32)
    out = np.zeros(want.shape if want.shape else (1,), np.float32)

    @pypto.jit
    def red(a, o):
        pypto.set_vec_tile_shapes(16, 128)
        r = pfn(a, dim, keepdim)
        o[:] = r if r.shape == o.shape else r.reshape(o.shape)
    check_kernel(red, [x, out], {1: want.reshape(out.shape)})


@pytest.mark.parametrize("dim", [-1, 0])
def test_log_softmax(dim, rng, check_kernel):
    x = (rng.standard_normal((M, N)) * 4).astype(np.float32)
    x64 = x.astype(np.float64)
    want = x64 - np.log(np.sum(np.exp(x64), axis=dim, keepdims=True))

    @pypto.jit
    def ls(a, o):
        pypto.set_vec_tile_shapes(16, 128)
        o[:] = pypto.log_softmax(a, dim)
    check_kernel(ls, [x, np.zeros_like(x)], {1: want.astype(np.float32)})


@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_swiglu(dt, rng, check_kernel):
    x = rng.standard_normal((M, 2 * 96)).astype(dt)
    a, b = x[:, :96].astype(np.float64), x[:, 96:].astype(np.float64)
    want = (a * _sigmoid(a) * b).astype(dt)

    @pypto.jit
    def sw(x_, o):
        pypto.set_vec_tile_shapes(16, 64)
        o[:] = pypto.swiglu(x_)
    check_kernel(sw, [x, np.zeros((M, 96), dt)], {1: want})


def test_int_clamp_and_square_are_exact(check_kernel):
    x = (np.arange(M * 64).reshape(M, 64) % 23 - 11).astype(np.int32)

    @pypto.jit
    def k(a, o1, o2):
        o1[:] = pypto.clamp(a, -3, 5)
        o2[:] = a.square()
    check_kernel(k, [x, np.zeros_like(x), np.zeros_like(x)], {1: np.clip(x, -3, 5), 2: x * x})
