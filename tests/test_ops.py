"""Every op of the public API against numpy, on several tile shapes, tails included.

Each case runs the kernel in call form (`kernel(x, out)` fills `out`) and through
`kernel.compile(...).simulate(...)`, compares both with the numpy math, and asserts that pypto's
own check against its reference agrees (see conftest.run_and_check).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pypto

from common import tile_consts, unary_kernel

BF16 = np.dtype(ml_dtypes.bfloat16)
M, N = 100, 300                       # tails for every tile shape below
# (TM, TN) vector tiles; None = pypto's default tile
TILES = [(32, 64), (64, 256), None]
TILE_IDS = ["t32x64", "t64x256", "tdefault"]
GELU_C = np.sqrt(2.0 / np.pi)


def binary_kernel(fn):
    @pypto.jit
    def binary(a, b, out, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(TM, TN)
        out[:] = fn(a, b)
    return binary


# ---------------------------------------------------------------------------------------
# binary ops with broadcasting

BINARY = {
    "add": (pypto.add, np.add),
    "sub": (pypto.sub, np.subtract),
    "mul": (pypto.mul, np.multiply),
    "div": (pypto.div, np.divide),
    "maximum": (pypto.maximum, np.maximum),
    "minimum": (pypto.minimum, np.minimum),
}
# operand shapes: [M,N] op [M,N], [M,N] op [M,1], [M,N] op [N], [M,1] op [M,N], [N] op [M,N],
# [1,N] op [M,N], [M,1] op [1,N] (outer)
BCAST = {
    "MN_MN": ((M, N), (M, N)),
    "MN_M1": ((M, N), (M, 1)),
    "MN_N": ((M, N), (N,)),
    "M1_MN": ((M, 1), (M, N)),
    "N_MN": ((N,), (M, N)),
    "1N_MN": ((1, N), (M, N)),
    "M1_1N": ((M, 1), (1, N)),
}


@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("bcast", list(BCAST))
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_broadcast(op, bcast, tiles, rng, check_kernel):
    pfn, nfn = BINARY[op]
    sa, sb = BCAST[bcast]
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.uniform(0.5, 1.5, sb).astype(np.float32) * rng.choice([-1, 1], sb).astype(np.float32)
    want = nfn(a, b)
    out = np.zeros(want.shape, np.float32)
    check_kernel(binary_kernel(pfn), [a, b, out], {2: want}, **tile_consts(tiles))


@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("op", list(BINARY))
def test_python_operators_match_functions(op, tiles, rng, check_kernel):
    """`a + b`, `a - b`, ... on traced tensors are the same ops as pypto.add, pypto.sub, ..."""
    ops = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "div": lambda a, b: a / b, "maximum": pypto.maximum, "minimum": pypto.minimum}
    a = rng.standard_normal((M, N)).astype(np.float32)
    b = rng.uniform(0.5, 2.0, (M, 1)).astype(np.float32)
    check_kernel(binary_kernel(ops[op]), [a, b, np.zeros((M, N), np.float32)], {2: BINARY[op][1](a, b)},
                 **tile_consts(tiles))


SCALAR = {
    "2-x": (lambda x: 2.0 - x, lambda x: 2.0 - x),
    "1/x": (lambda x: 1 / x, lambda x: 1 / x),
    "x-2": (lambda x: x - 2.0, lambda x: x - 2.0),
    "x/4": (lambda x: x / 4.0, lambda x: x / 4.0),
    "3*x": (lambda x: 3.0 * x, lambda x: 3.0 * x),
    "x*3": (lambda x: x * 3, lambda x: x * 3),
    "0.5+x": (lambda x: 0.5 + x, lambda x: 0.5 + x),
    "x+0.5": (lambda x: x + 0.5, lambda x: x + 0.5),
    "max(x,0.25)": (lambda x: pypto.maximum(x, 0.25), lambda x: np.maximum(x, np.float32(0.25))),
    "min(0.25,x)": (lambda x: pypto.minimum(0.25, x), lambda x: np.minimum(np.float32(0.25), x)),
    "x**2": (lambda x: x ** 2, lambda x: x * x),
    "2-x*3+1": (lambda x: 2.0 - x * 3 + 1, lambda x: 2.0 - x * 3 + 1),
    "np.float32(2)*x": (lambda x: np.float32(2.0) * x, lambda x: 2.0 * x),
}


@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("expr", list(SCALAR))
def test_scalar_operands(expr, tiles, rng, check_kernel):
    pfn, nfn = SCALAR[expr]
    x = rng.uniform(0.25, 2.0, (M, N)).astype(np.float32) * rng.choice([-1, 1], (M, N)).astype(np.float32)
    want = nfn(x.astype(np.float64))
    check_kernel(unary_kernel(pfn), [x, np.zeros((M, N), np.float32)], {1: want}, **tile_consts(tiles))


# ---------------------------------------------------------------------------------------
# unary ops

def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x ** 3)))


UNARY = {
    "exp": (pypto.exp, np.exp, "any"),
    "log": (pypto.log, np.log, "pos"),
    "sqrt": (pypto.sqrt, np.sqrt, "pos"),
    "rsqrt": (pypto.rsqrt, lambda x: 1.0 / np.sqrt(x), "pos"),
    "reciprocal": (pypto.reciprocal, lambda x: 1.0 / x, "pos"),
    "abs": (pypto.abs, np.abs, "any"),
    "builtin_abs": (lambda x: abs(x), np.abs, "any"),
    "neg": (pypto.neg, np.negative, "any"),
    "unary_minus": (lambda x: -x, np.negative, "any"),
    "relu": (pypto.relu, lambda x: np.maximum(x, 0.0), "any"),
    "sigmoid": (pypto.sigmoid, lambda x: 1.0 / (1.0 + np.exp(-x)), "any"),
    "tanh": (pypto.tanh, np.tanh, "any"),
    "gelu": (pypto.gelu, _gelu, "any"),
    "method_exp": (lambda x: x.exp(), np.exp, "any"),
    "x**0.5": (lambda x: x ** 0.5, np.sqrt, "pos"),
}


@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary(op, tiles, rng, check_kernel):
    pfn, nfn, domain = UNARY[op]
    if domain == "pos":
        x = rng.uniform(0.1, 4.0, (M, N)).astype(np.float32)
    else:
        x = (rng.standard_normal((M, N)) * 2).astype(np.float32)
    want = nfn(x.astype(np.float64))
    # transcendental results: a few ulps of fp32
    check_kernel(unary_kernel(pfn), [x, np.zeros((M, N), np.float32)], {1: want},
                 rtol=2e-6 if op not in ("abs", "builtin_abs", "neg", "unary_minus", "relu") else 0,
                 atol=1e-6, **tile_consts(tiles))


@pytest.mark.parametrize("dt", [np.float16, BF16], ids=["fp16", "bf16"])
def test_low_precision_elementwise(dt, rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(dt)
    w = rng.standard_normal((N,)).astype(dt)

    @pypto.jit
    def k(a, w, out):
        pypto.set_vec_tile_shapes(32, 128)
        out[:] = pypto.relu(a * w + 1.0) - a

    # numpy in the same precision, op by op (each op rounds to dt)
    one, zero = np.asarray(1.0, dt), np.asarray(0.0, dt)
    want = (np.maximum((x * w + one), zero) - x).astype(dt)
    rtol, atol = (2e-3, 1e-3) if dt == np.float16 else (2e-2, 1e-2)
    check_kernel(k, [x, w, np.zeros((M, N), dt)], {2: want}, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------
# reductions

RED = {"sum": (pypto.sum, np.sum), "amax": (pypto.amax, np.max), "amin": (pypto.amin, np.min),
       "mean": (pypto.mean, np.mean)}


def _reduce_cases():
    for op in RED:
        for dim in (-1, 0):
            for keepdim in (True, False):
                for tiles, tid in zip(TILES, TILE_IDS):
                    yield pytest.param(op, dim, keepdim, tiles,
                                       id=f"{op}-dim{dim}-keep{keepdim}-{tid}")


@pytest.mark.parametrize("op,dim,keepdim,tiles", list(_reduce_cases()))
def test_reduction_stored(op, dim, keepdim, tiles, rng, check_kernel):
    pfn, nfn = RED[op]

    @pypto.jit
    def k(a, out, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(TM, TN)
        out[:] = pfn(a, dim=dim, keepdim=keepdim)

    x = rng.uniform(-1.0, 3.0, (M, N)).astype(np.float32)   # sums without cancellation
    want = nfn(x.astype(np.float64), axis=dim, keepdims=keepdim)
    check_kernel(k, [x, np.zeros(want.shape, np.float32)], {1: want}, rtol=1e-5, atol=1e-5, **tile_consts(tiles))


@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("op", list(RED))
def test_reduction_keepdim_false_then_used(op, dim, tiles, rng, check_kernel):
    """keepdim=False gives the numpy shape; a value computed from it reaches the output."""
    pfn, nfn = RED[op]

    @pypto.jit
    def k(a, out, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(TM, TN)
        r = pfn(a, dim=dim, keepdim=False)
        assert r.shape == ((M,) if dim == -1 else (N,))
        out[:] = r * 2.0 + 1.0

    x = rng.uniform(-1.0, 3.0, (M, N)).astype(np.float32)   # sums without cancellation
    want = nfn(x.astype(np.float64), axis=dim) * 2.0 + 1.0
    check_kernel(k, [x, np.zeros(want.shape, np.float32)], {1: want}, rtol=1e-5, atol=1e-5, **tile_consts(tiles))


def test_reduction_3d_middle_dim(rng, check_kernel):
    x = rng.standard_normal((3, 20, 70)).astype(np.float32)

    @pypto.jit
    def k(a, out):
        pypto.set_vec_tile_shapes(8, 32)
        out[:] = a - pypto.sum(a, dim=1, keepdim=True)

    check_kernel(k, [x, np.zeros_like(x)], {1: x - x.astype(np.float64).sum(1, keepdims=True)},
                 rtol=1e-5, atol=1e-5)


def test_reduction_broadcast_back(rng, check_kernel):
    """x - max(x) per row and x / sum over columns: reduced values broadcast back over tiles."""
    x = rng.uniform(0.5, 1.5, (M, N)).astype(np.float32)

    @pypto.jit
    def k(a, o1, o2):
        pypto.set_vec_tile_shapes(32, 64)
        o1[:] = a - pypto.amax(a, dim=-1, keepdim=True)
        o2[:] = a / pypto.sum(a, dim=0, keepdim=True)

    xd = x.astype(np.float64)
    check_kernel(k, [x, np.zeros_like(x), np.zeros_like(x)],
                 {1: xd - xd.max(-1, keepdims=True), 2: xd / xd.sum(0, keepdims=True)})


def test_fp32_sum_with_cancellation_pypto_check(rng):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, out):
        out[:] = pypto.sum(a, dim=0, keepdim=True)     # default tiles: several row tiles combined

    out = np.zeros((1, N), np.float32)
    res = k.compile(x, out).simulate(x, out)
    xd = x.astype(np.float64)
    bound = M * np.finfo(np.float32).eps * np.abs(xd).sum(0, keepdims=True)
    assert np.all(np.abs(res.outputs["out"] - xd.sum(0, keepdims=True)) <= bound)    # the kernel is right
    assert res.check["out"]["ok"], res.check


@pytest.mark.parametrize("dt,op,n,tn", [(np.float16, "sum", 2048, 16), (BF16, "sum", N, 128),
                                        (BF16, "sum", N, 512), (BF16, "mean", N, 512)],
                         ids=["fp16-sum-128tiles", "bf16-sum-3tiles", "bf16-sum-1tile", "bf16-mean-1tile"])
def test_low_precision_reduction_accuracy(dt, op, n, tn, rng):
    x = rng.uniform(0.0, 2.0, (8, n)).astype(dt)                 # no cancellation: ulps are fair
    pfn, nfn = RED[op]

    @pypto.jit
    def k(a, out, *, TN: int = 128):
        pypto.set_vec_tile_shapes(8, TN)
        out[:] = pfn(a, dim=-1, keepdim=True)

    out = np.zeros((8, 1), dt)
    ck = k.compile(x, out, TN=tn)
    res = ck.simulate(x, out)
    exact = nfn(x.astype(np.float64), axis=-1, keepdims=True)
    ulp = np.spacing(np.abs(exact).astype(dt)).astype(np.float64)
    err = np.abs(res.outputs["out"].astype(np.float64) - exact)
    assert np.all(err <= 2 * ulp), f"max error {(err / ulp).max():.1f} ulp"
    assert res.check["out"]["ok"], res.check


# ---------------------------------------------------------------------------------------
# composites

SOFTMAX_TILES = [(32, 64), (64, 256), (8, 512), None]
SOFTMAX_IDS = ["t32x64", "t64x256", "t8x512_fullrow", "tdefault"]


def _softmax(x, dim=-1):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


@pytest.mark.parametrize("tiles", SOFTMAX_TILES, ids=SOFTMAX_IDS)
@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax(dim, tiles, rng, check_kernel):
    @pypto.jit
    def k(a, out, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(TM, TN)
        out[:] = pypto.softmax(a, dim=dim)

    x = (rng.standard_normal((M, N)) * 3).astype(np.float32)
    check_kernel(k, [x, np.zeros_like(x)], {1: _softmax(x.astype(np.float64), dim)}, **tile_consts(tiles))


@pytest.mark.parametrize("tiles", SOFTMAX_TILES, ids=SOFTMAX_IDS)
def test_softmax_written_out(tiles, rng, check_kernel):
    """The DESIGN's example kernel: amax, exp, sum written by hand."""
    @pypto.jit
    def k(x, out, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(TM, TN)
        m = pypto.amax(x, dim=-1, keepdim=True)
        e = pypto.exp(x - m)
        out[:] = e / pypto.sum(e, dim=-1, keepdim=True)

    x = rng.standard_normal((M, N)).astype(np.float32)
    check_kernel(k, [x, np.zeros_like(x)], {1: _softmax(x.astype(np.float64))}, **tile_consts(tiles))


def _layernorm(x, w=None, b=None, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    r = (x - mu) / np.sqrt(var + eps)
    if w is not None:
        r = r * w
    if b is not None:
        r = r + b
    return r


@pytest.mark.parametrize("tiles", SOFTMAX_TILES, ids=SOFTMAX_IDS)
@pytest.mark.parametrize("affine", ["plain", "weight", "weight_bias"])
def test_layernorm(affine, tiles, rng, check_kernel):
    x = (rng.standard_normal((M, N)) * 2 + 0.5).astype(np.float32)
    w = rng.standard_normal((N,)).astype(np.float32)
    b = rng.standard_normal((N,)).astype(np.float32)
    xd = x.astype(np.float64)
    if affine == "plain":
        @pypto.jit
        def k(a, out, *, TM: int = 0, TN: int = 0):
            if TM:
                pypto.set_vec_tile_shapes(TM, TN)
            out[:] = pypto.layernorm(a)
        args, want = [x, np.zeros_like(x)], {1: _layernorm(xd)}
    elif affine == "weight":
        @pypto.jit
        def k(a, w, out, *, TM: int = 0, TN: int = 0):
            if TM:
                pypto.set_vec_tile_shapes(TM, TN)
            out[:] = pypto.layer_norm(a, w)
        args, want = [x, w, np.zeros_like(x)], {2: _layernorm(xd, w)}
    else:
        @pypto.jit
        def k(a, w, b, out, *, TM: int = 0, TN: int = 0):
            if TM:
                pypto.set_vec_tile_shapes(TM, TN)
            out[:] = pypto.layernorm(a, w, b, eps=1e-5)
        args, want = [x, w, b, np.zeros_like(x)], {3: _layernorm(xd, w, b)}
    # normalisation divides by a std: allow a few fp32 ulps of the O(1) results
    check_kernel(k, args, want, rtol=1e-5, atol=1e-5, **tile_consts(tiles))


@pytest.mark.parametrize("tiles", SOFTMAX_TILES, ids=SOFTMAX_IDS)
def test_rms_norm(tiles, rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)
    w = rng.standard_normal((N,)).astype(np.float32)

    @pypto.jit
    def k(a, w, out, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(TM, TN)
        out[:] = pypto.rms_norm(a, w, 1e-6)

    xd = x.astype(np.float64)
    want = xd / np.sqrt((xd * xd).mean(-1, keepdims=True) + 1e-6) * w
    check_kernel(k, [x, w, np.zeros_like(x)], {2: want}, rtol=1e-5, atol=1e-5, **tile_consts(tiles))


@pytest.mark.parametrize("dt", [np.float16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("which", ["softmax", "layernorm", "rms_norm"])
def test_low_precision_composites(which, dt, rng, check_kernel):
    """fp16/bf16 composites compute in fp32 and round once: within the dtype's tolerance."""
    x = rng.standard_normal((M, N)).astype(dt)
    w = rng.standard_normal((N,)).astype(dt)
    xd, wd = x.astype(np.float64), w.astype(np.float64)

    @pypto.jit
    def k(a, w, out):
        pypto.set_vec_tile_shapes(32, 128)
        if which == "softmax":
            out[:] = pypto.softmax(a) * w
        elif which == "layernorm":
            out[:] = pypto.layernorm(a, w)
        else:
            out[:] = pypto.rms_norm(a, w)

    if which == "softmax":
        want = (_softmax(xd).astype(dt) * w).astype(np.float64)   # softmax rounds, then the mul
    elif which == "layernorm":
        want = _layernorm(xd, wd)
    else:
        want = xd / np.sqrt((xd * xd).mean(-1, keepdims=True) + 1e-6) * wd
    check_kernel(k, [x, w, np.zeros_like(x)], {2: want})


# ---------------------------------------------------------------------------------------
# matmul

CUBE_32 = ([32, 32], [32, 64], [32, 32])


def matmul_kernel(a_trans, b_trans, cube):
    @pypto.jit
    def mm(a, b, out):
        if cube:
            pypto.set_cube_tile_shapes(*cube)
        out[:] = pypto.matmul(a, b, a_trans=a_trans, b_trans=b_trans)
    return mm


def _mm_operands(rng, m, k, n, dt, a_trans, b_trans):
    a = rng.standard_normal((k, m) if a_trans else (m, k)).astype(dt)
    b = rng.standard_normal((n, k) if b_trans else (k, n)).astype(dt)
    A = a.astype(np.float64).T if a_trans else a.astype(np.float64)
    B = b.astype(np.float64).T if b_trans else b.astype(np.float64)
    return a, b, A, B


def _fp32_mm_atol(A, B):
    """fp32 accumulation error bound: K * eps * (|A| @ |B|) (the order of the K sum is free)."""
    k = A.shape[-1]
    return float(k * np.finfo(np.float32).eps * (np.abs(A) @ np.abs(B)).max())


@pytest.mark.parametrize("cube", [None, CUBE_32], ids=["cube_default", "cube32"])
@pytest.mark.parametrize("b_trans", [False, True], ids=["b", "bT"])
@pytest.mark.parametrize("a_trans", [False, True], ids=["a", "aT"])
@pytest.mark.parametrize("mkn", [(40, 50, 60), (64, 64, 64), (100, 130, 70), (1, 33, 17)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dt", [np.float16, np.float32], ids=["fp16", "fp32"])
def test_matmul_2d(dt, mkn, a_trans, b_trans, cube, rng, check_kernel):
    m, k, n = mkn
    a, b, A, B = _mm_operands(rng, m, k, n, dt, a_trans, b_trans)
    want = A @ B
    out = np.zeros((m, n), dt)
    if dt == np.float16:
        check_kernel(matmul_kernel(a_trans, b_trans, cube), [a, b, out], {2: want})
    else:
        check_kernel(matmul_kernel(a_trans, b_trans, cube), [a, b, out], {2: want},
                     rtol=1e-5, atol=_fp32_mm_atol(A, B))


def test_matmul_operator_and_cube_tiles_cover_k_loop(rng, check_kernel):
    """`a @ b` with K split over several kL1 and kL0 steps (K=200, kL0=32, kL1=64)."""
    a = rng.standard_normal((70, 200)).astype(np.float16)
    b = rng.standard_normal((200, 90)).astype(np.float16)

    @pypto.jit
    def k(a, b, out):
        pypto.set_cube_tile_shapes([32, 32], [32, 64], [32, 32])
        out[:] = a @ b

    res = check_kernel(k, [a, b, np.zeros((70, 90), np.float16)],
                       {2: a.astype(np.float64) @ b.astype(np.float64)})
    assert res.cycles > 0


def test_fp32_matmul_pypto_check(rng):
    a = rng.standard_normal((64, 64)).astype(np.float32)
    b = rng.standard_normal((64, 64)).astype(np.float32)
    out = np.zeros((64, 64), np.float32)
    k = matmul_kernel(False, False, CUBE_32)
    res = k.compile(a, b, out).simulate(a, b, out)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.allclose(res.outputs["out"], exact, rtol=1e-5, atol=_fp32_mm_atol(a.astype(np.float64),
                                                                                b.astype(np.float64)))
    assert res.check["out"]["ok"], res.check


@pytest.mark.parametrize("cube", [None, CUBE_32], ids=["cube_default", "cube32"])
@pytest.mark.parametrize("bshape", ["BKN", "KN"])
@pytest.mark.parametrize("dt", [np.float16, np.float32], ids=["fp16", "fp32"])
def test_batched_matmul(dt, bshape, cube, rng, check_kernel):
    a = rng.standard_normal((3, 40, 50)).astype(dt)
    b = rng.standard_normal((3, 50, 60) if bshape == "BKN" else (50, 60)).astype(dt)
    A, B = a.astype(np.float64), b.astype(np.float64)
    want = A @ B
    k = matmul_kernel(False, False, cube)
    out = np.zeros((3, 40, 60), dt)
    if dt == np.float16:
        check_kernel(k, [a, b, out], {2: want})
    else:
        check_kernel(k, [a, b, out], {2: want}, rtol=1e-5, atol=_fp32_mm_atol(A, B))


def test_batched_matmul_b_trans(rng, check_kernel):
    a = rng.standard_normal((2, 40, 50)).astype(np.float16)
    b = rng.standard_normal((60, 50)).astype(np.float16)
    check_kernel(matmul_kernel(False, True, None), [a, b, np.zeros((2, 40, 60), np.float16)],
                 {2: a.astype(np.float64) @ b.astype(np.float64).T})


@pytest.mark.parametrize("dt", [np.float16, np.float32], ids=["fp16", "fp32"])
def test_matmul_bias_relu_epilogue(dt, rng, check_kernel):
    a = rng.standard_normal((40, 50)).astype(dt)
    b = rng.standard_normal((50, 60)).astype(dt)
    bias = rng.standard_normal((60,)).astype(dt)

    @pypto.jit
    def k(a, b, bias, out):
        out[:] = pypto.relu(pypto.matmul(a, b) + bias)

    mm = a.astype(np.float64) @ b.astype(np.float64)
    if dt == np.float16:
        # the matmul result is rounded to fp16 before the bias is added (out_dtype fp16)
        want = np.maximum(mm.astype(np.float16) + bias, 0)
        check_kernel(k, [a, b, bias, np.zeros((40, 60), dt)], {3: want})
    else:
        want = np.maximum(mm + bias, 0)
        check_kernel(k, [a, b, bias, np.zeros((40, 60), dt)], {3: want}, rtol=1e-5,
                     atol=_fp32_mm_atol(a.astype(np.float64), b.astype(np.float64)))


@pytest.mark.parametrize("cube", [None, ([16, 16], [32, 32], [16, 16])], ids=["cube_default", "cube16"])
@pytest.mark.parametrize("mkn", [(40, 50, 60), (33, 45, 17), (64, 128, 32)], ids=lambda s: "x".join(map(str, s)))
def test_int8_matmul_int32(mkn, cube, rng, check_kernel):
    m, k, n = mkn
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    res = check_kernel(matmul_kernel(False, False, cube), [a, b, np.zeros((m, n), np.int32)],
                       {2: a.astype(np.int32) @ b.astype(np.int32)})
    assert res.outputs["out"].dtype == np.int32


@pytest.mark.parametrize("case", ["fp16->fp32", "fp32->fp16", "bf16", "int8->fp32"])
def test_matmul_dtypes_and_out_dtype(case, rng, check_kernel):
    if case == "int8->fp32":
        a = rng.integers(-128, 128, (40, 50)).astype(np.int8)
        b = rng.integers(-128, 128, (50, 60)).astype(np.int8)

        @pypto.jit
        def k(a, b, out):
            out[:] = pypto.cast(pypto.matmul(a, b), pypto.DT_FP32) * 0.5

        want = (a.astype(np.int64) @ b.astype(np.int64)) * 0.5
        check_kernel(k, [a, b, np.zeros((40, 60), np.float32)], {2: want}, rtol=0, atol=0)
        return
    src, dst, pdst = {"fp16->fp32": (np.float16, np.float32, pypto.DT_FP32),
                      "fp32->fp16": (np.float32, np.float16, pypto.DT_FP16),
                      "bf16": (BF16, BF16, None)}[case]
    a = rng.standard_normal((40, 50)).astype(src)
    b = rng.standard_normal((50, 60)).astype(src)

    @pypto.jit
    def k(a, b, out):
        out[:] = pypto.matmul(a, b, out_dtype=pdst)

    want = a.astype(np.float64) @ b.astype(np.float64)
    atol = 1e-5 if dst == np.float32 else None
    check_kernel(k, [a, b, np.zeros((40, 60), dst)], {2: want}, atol=atol)


def test_matmul_then_softmax(rng, check_kernel):
    """cube result feeding vector work: matmul (fp16) -> cast fp32 -> softmax."""
    a = rng.standard_normal((64, 96)).astype(np.float16)
    b = rng.standard_normal((96, 80)).astype(np.float16)

    @pypto.jit
    def k(a, b, out):
        out[:] = pypto.softmax(pypto.cast(pypto.matmul(a, b), pypto.DT_FP32))

    s = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16).astype(np.float64)
    check_kernel(k, [a, b, np.zeros((64, 80), np.float32)], {2: _softmax(s)}, rtol=1e-5, atol=1e-6)


def test_matmul_of_computed_operand(rng, check_kernel):
    a = rng.standard_normal((64, 96)).astype(np.float32)
    b = rng.standard_normal((96, 80)).astype(np.float16)

    @pypto.jit
    def k(a, b, out):
        out[:] = pypto.matmul(pypto.cast(a, pypto.DT_FP16) * 0.5, b)

    want = (a.astype(np.float16) * np.float16(0.5)).astype(np.float64) @ b.astype(np.float64)
    check_kernel(k, [a, b, np.zeros((64, 80), np.float16)], {2: want})


# ---------------------------------------------------------------------------------------
# casts

CASTS = [
    (np.float32, np.float16, pypto.DT_FP16),
    (np.float16, np.float32, pypto.DT_FP32),
    (np.float32, BF16, pypto.DT_BF16),
    (BF16, np.float32, pypto.DT_FP32),
]


@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("src,dst,pdt", CASTS, ids=["fp32-fp16", "fp16-fp32", "fp32-bf16", "bf16-fp32"])
def test_cast_exact(src, dst, pdt, tiles, rng, check_kernel):
    """A cast rounds to nearest like numpy's astype: bit-exact."""
    x = (rng.standard_normal((M, N)) * 10).astype(src)

    @pypto.jit
    def k(a, out, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(TM, TN)
        out[:] = pypto.cast(a, pdt)

    check_kernel(k, [x, np.zeros((M, N), dst)], {1: x.astype(dst)}, rtol=0, atol=0, **tile_consts(tiles))


def test_cast_method_and_same_dtype(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, out):
        out[:] = a.cast(pypto.DT_FP32).astype(pypto.DT_FP16) * 2.0

    check_kernel(k, [x, np.zeros((M, N), np.float16)], {1: (x.astype(np.float16) * np.float16(2))})


# ---------------------------------------------------------------------------------------
# layout: reshape, transpose, view / slicing

def test_reshape_input_then_op(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, out):
        out[:] = pypto.reshape(a, [300, 100]) + 1.0

    check_kernel(k, [x, np.zeros((300, 100), np.float32)], {1: x.reshape(300, 100) + 1.0})


def test_reshape_method_3d_to_2d(rng, check_kernel):
    x = rng.standard_normal((4, 30, 40)).astype(np.float32)

    @pypto.jit
    def k(a, out):
        out[:] = a.reshape(-1, 40) * 2.0

    check_kernel(k, [x, np.zeros((120, 40), np.float32)], {1: x.reshape(120, 40) * 2.0})


def test_reshape_of_reduction_then_broadcast(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, out):
        out[:] = a - pypto.reshape(pypto.amax(a, dim=-1), [M, 1])

    check_kernel(k, [x, np.zeros_like(x)], {1: x - x.max(-1, keepdims=True)})


def test_reshape_of_computed_stored(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, out):
        out[:] = pypto.reshape(a + 1.0, [300, 100])

    check_kernel(k, [x, np.zeros((300, 100), np.float32)], {1: (x + 1.0).reshape(300, 100)})


@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
def test_transpose_then_elementwise(tiles, rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, out, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(TM, TN)
        out[:] = a.T * 2.0 + pypto.transpose(a, 0, 1)

    check_kernel(k, [x, np.zeros((N, M), np.float32)], {1: x.T * 3.0}, rtol=1e-6, **tile_consts(tiles))


def test_transpose_copy_and_3d(rng, check_kernel):
    x = rng.standard_normal((4, 30, 40)).astype(np.float32)

    @pypto.jit
    def k(a, o1, o2):
        o1[:] = pypto.transpose(a, 0, 2) + 1.0
        o2[:] = a.transpose(1, 2)

    check_kernel(k, [x, np.zeros((40, 30, 4), np.float32), np.zeros((4, 40, 30), np.float32)],
                 {1: np.swapaxes(x, 0, 2) + 1.0, 2: np.swapaxes(x, 1, 2)})


def test_transpose_of_computed_stored(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, out):
        out[:] = pypto.transpose(a * 2.0, 0, 1)

    check_kernel(k, [x, np.zeros((N, M), np.float32)], {1: x.T * 2.0})


@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
def test_slicing_and_view(tiles, rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, o1, o2, o3, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(TM, TN)
        o1[:] = a[:, 0:128] + 1.0
        o2[:] = pypto.view(a, [50, 100], [10, 20]) * 3.0
        o3[:] = a[:, :150] - a[:, 150:]

    check_kernel(k, [x, np.zeros((M, 128), np.float32), np.zeros((50, 100), np.float32),
                     np.zeros((M, 150), np.float32)],
                 {1: x[:, :128] + 1.0, 2: x[10:60, 20:120] * 3.0, 3: x[:, :150] - x[:, 150:]},
                 **tile_consts(tiles))


def test_slice_of_computed_then_op(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, out):
        out[:] = (a * 2.0)[:, 0:128] + 1.0

    check_kernel(k, [x, np.zeros((M, 128), np.float32)], {1: x[:, :128] * 2.0 + 1.0})


def test_slice_of_computed_stored(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, out):
        out[:] = (a * 2.0)[:, 0:128]

    check_kernel(k, [x, np.zeros((M, 128), np.float32)], {1: x[:, :128] * 2.0})


def test_copy_of_input_and_input_slice(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)
    o2 = np.full((M, N), 7.0, np.float32)

    @pypto.jit
    def k(a, o1, o2):
        o1[:] = a
        o2[:, 0:128] = a[:, 128:256]

    want2 = o2.copy()
    want2[:, :128] = x[:, 128:256]
    check_kernel(k, [x, np.zeros_like(x), o2], {1: x, 2: want2})


# ---------------------------------------------------------------------------------------
# partial writes: assemble and slice assignment

def test_assemble(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, out):
        pypto.assemble(a[0:64, :] * 2.0, [0, 0], out)
        pypto.assemble(a[64:100, :] + 1.0, [64, 0], out)

    check_kernel(k, [x, np.zeros_like(x)], {1: np.concatenate([x[:64] * 2.0, x[64:] + 1.0])})


def test_assemble_into_offset_keeps_the_rest(rng, check_kernel):
    x = rng.standard_normal((40, 60)).astype(np.float32)
    out = np.full((M, N), -3.0, np.float32)

    @pypto.jit
    def k(a, out):
        pypto.assemble(pypto.exp(a), [30, 200], out)

    want = out.copy()
    want[30:70, 200:260] = np.exp(x.astype(np.float64))
    check_kernel(k, [x, out], {1: want}, rtol=2e-6)


def test_partial_slice_write_keeps_the_rest(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)
    out = np.full((M, N), 7.0, np.float32)

    @pypto.jit
    def k(a, out):
        out[0:64, :] = a[0:64, :] * 2.0

    want = out.copy()
    want[:64] = x[:64] * 2.0
    check_kernel(k, [x, out], {1: want})


def test_later_write_wins(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, out):
        out[:] = a + 1.0
        out[0:50, :] = a[0:50, :] * 2.0

    want = x + 1.0
    want[:50] = x[:50] * 2.0
    check_kernel(k, [x, np.zeros_like(x)], {1: want})


def test_integer_index_row_write(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)
    out = np.full((M, N), 7.0, np.float32)

    @pypto.jit
    def k(a, out):
        out[0, :] = a[3, :] + 1.0

    want = out.copy()
    want[0] = x[3] + 1.0
    check_kernel(k, [x, out], {1: want})


def test_two_outputs_and_same_value_twice(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, o1, o2, o3):
        y = pypto.exp(a)
        o1[:] = y
        o2[:] = y
        o3[:] = y + 1.0

    e = np.exp(x.astype(np.float64))
    check_kernel(k, [x, np.zeros_like(x), np.zeros_like(x), np.zeros_like(x)], {1: e, 2: e, 3: e + 1.0},
                 rtol=2e-6)


def test_in_place_update(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a):
        a[:] = a * 2.0 + 1.0

    check_kernel(k, [x], {0: x * 2.0 + 1.0})


# ---------------------------------------------------------------------------------------
# integers

@pytest.mark.parametrize("tiles", [(8, 64), None], ids=["t8x64", "tdefault"])
def test_int32_ops(tiles, rng, check_kernel):
    a = rng.integers(-1000, 1000, (40, 70)).astype(np.int32)
    b = rng.integers(-1000, 1000, (40, 70)).astype(np.int32)

    @pypto.jit
    def k(a, b, o1, o2, o3, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(TM, TN)
        o1[:] = a + b
        o2[:] = 2 - a * 3
        o3[:] = pypto.relu(pypto.abs(a) - b) + pypto.maximum(a, b)

    z = lambda: np.zeros((40, 70), np.int32)  # noqa: E731
    res = check_kernel(k, [a, b, z(), z(), z()],
                       {2: a + b, 3: 2 - a * 3, 4: np.maximum(np.abs(a) - b, 0) + np.maximum(a, b)},
                       **tile_consts(tiles))
    assert res.outputs["o1"].dtype == np.int32


# ---------------------------------------------------------------------------------------
# other ranks

def test_one_dimensional(rng, check_kernel):
    x = rng.standard_normal(300).astype(np.float32)

    @pypto.jit
    def k(a, out):
        pypto.set_vec_tile_shapes(64)
        out[:] = pypto.exp(a) + pypto.sum(a, dim=0, keepdim=True)

    check_kernel(k, [x, np.zeros_like(x)], {1: np.exp(x.astype(np.float64)) + x.astype(np.float64).sum()},
                 rtol=2e-6, atol=1e-5)


@pytest.mark.parametrize("tiles", [(1, 2, 8, 16), None], ids=["t1x2x8x16", "tdefault"])
def test_four_dimensional(tiles, rng, check_kernel):
    x = rng.standard_normal((2, 3, 10, 40)).astype(np.float32)

    @pypto.jit
    def k(a, out):
        if tiles:
            pypto.set_vec_tile_shapes(*tiles)
        out[:] = pypto.exp(a) - pypto.amax(a, dim=-1, keepdim=True) + pypto.sum(a, dim=1, keepdim=True)

    xd = x.astype(np.float64)
    check_kernel(k, [x, np.zeros_like(x)], {1: np.exp(xd) - xd.max(-1, keepdims=True) + xd.sum(1, keepdims=True)},
                 rtol=2e-6, atol=1e-5)


def test_long_rows_default_tiles(rng, check_kernel):
    """Rows longer than the default tile's 8 KiB: a softmax keeps a 5000-wide fp32 row whole
    (2 rows per tile, its group fits UB double-buffered: fusion.whole_row_plan); a row too wide
    for UB (50000 fp32, 195 KiB) is cut by the default (2 x 2048, the last piece a tail of 848
    columns) and the row reductions accumulate across tiles, in three groups."""
    x = rng.standard_normal((16, 5000)).astype(np.float32)

    @pypto.jit
    def k(a, out):
        out[:] = pypto.softmax(a)

    check_kernel(k, [x, np.zeros_like(x)], {1: _softmax(x.astype(np.float64))})
    assert [g.tile for g in k.compile(x, np.zeros_like(x)).tile_graph.groups] == [(2, 5000)]
    wide = rng.standard_normal((4, 50000)).astype(np.float32)
    check_kernel(k, [wide, np.zeros_like(wide)], {1: _softmax(wide.astype(np.float64))})
    assert [g.tile for g in k.compile(wide, np.zeros_like(wide)).tile_graph.groups] == [(2, 2048)] * 3
