"""More ops grown through the registry (math composites, new instructions, creation ops),
against numpy written here: fp32 with tail tiles, fp16/bf16 for float ops, ints for int ops,
the call form, compile + simulate and pypto's own check (conftest.run_and_check)."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import pypto

from common import tile_consts, unary_kernel

BF16 = np.dtype(ml_dtypes.bfloat16)
M, N = 40, 300                        # tails for the tiles below
TILES = [(16, 128), None]
TILE_IDS = ["t16x128", "tdefault"]
SELU_A, SELU_S = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def _softplus(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


# name -> (pypto call, numpy reference on float64, input domain (lo, hi))
UNARY = {
    "mish": (pypto.mish, lambda x: x * np.tanh(_softplus(x)), (-6, 6)),
    "logsigmoid": (pypto.logsigmoid, lambda x: -_softplus(-x), (-12, 12)),
    "softsign": (pypto.softsign, lambda x: x / (1 + np.abs(x)), (-5, 5)),
    "celu": (lambda x: pypto.celu(x, 0.7), lambda x: np.where(x > 0, x, 0.7 * np.expm1(x / 0.7)), (-4, 4)),
    "selu": (pypto.selu, lambda x: SELU_S * np.where(x > 0, x, SELU_A * np.expm1(x)), (-4, 4)),
    "tanhshrink": (pypto.tanhshrink, lambda x: x - np.tanh(x), (-4, 4)),
    "hardshrink": (lambda x: pypto.hardshrink(x, 0.6), lambda x: np.where(np.abs(x) > 0.6, x, 0), (-2, 2)),
    "softshrink": (lambda x: pypto.softshrink(x, 0.6),
                   lambda x: np.where(x > 0.6, x - 0.6, np.where(x < -0.6, x + 0.6, 0)), (-2, 2)),
    "sinh": (pypto.sinh, np.sinh, (-5, 5)),
    "cosh": (pypto.cosh, np.cosh, (-5, 5)),
    "asinh": (pypto.asinh, np.arcsinh, (-20, 20)),
    "acosh": (pypto.acosh, np.arccosh, (1, 30)),
    "atanh": (pypto.atanh, np.arctanh, (-0.9, 0.9)),
    "rsub_number": (lambda x: pypto.rsub(x, 2.5), lambda x: 2.5 - x, (-3, 3)),
    "norm2": (lambda x: pypto.norm(x, keepdim=True), lambda x: np.sqrt(np.sum(x * x, -1, keepdims=True)), (-3, 3)),
    "norm1": (lambda x: pypto.norm(x, 1, keepdim=True), lambda x: np.sum(np.abs(x), -1, keepdims=True), (-3, 3)),
    "norm_inf": (lambda x: pypto.norm(x, float("inf"), 0, keepdim=True),
                 lambda x: np.max(np.abs(x), 0, keepdims=True), (-3, 3)),
    "asinh_method": (lambda x: x.asinh(), np.arcsinh, (-20, 20)),
    "sinh_method": (lambda x: x.sinh(), np.sinh, (-5, 5)),
    # torch's Tensor methods of registry ops (x.log2() was an AttributeError)
    "log2_method": (lambda x: x.log2(), np.log2, (0.1, 30)),
    "log10_method": (lambda x: x.log10(), np.log10, (0.1, 30)),
    "exp2_method": (lambda x: x.exp2(), np.exp2, (-6, 6)),
    "erf_method": (lambda x: x.erf(), np.vectorize(math.erf), (-3, 3)),
    "sign_method": (lambda x: x.sign(), np.sign, (-3, 3)),
    "isfinite_isinf_methods": (lambda x: pypto.where(x.isfinite() & ~x.isinf(), x * 2.0, 1.0), lambda x: 2 * x, (-3, 3)),
}


@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_fp32(op, tiles, rng, check_kernel):
    pfn, ref, (lo, hi) = UNARY[op]
    x = rng.uniform(lo, hi, (M, N)).astype(np.float32)
    want = ref(x.astype(np.float64)).astype(np.float32)
    res = check_kernel(unary_kernel(pfn), [x, np.zeros(want.shape, np.float32)], {1: want}, **tile_consts(tiles))
    assert res.ok


@pytest.mark.parametrize("dt", [np.float16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_low_precision(op, dt, rng, check_kernel):
    pfn, ref, (lo, hi) = UNARY[op]
    x = rng.uniform(lo, hi, (M, N)).astype(dt)
    if op.endswith("shrink"):           # the threshold compared in x's dtype, as torch does
        x[np.abs(x) == np.asarray(0.6, dt)] = 0
    want = ref(x.astype(np.float64))
    out = np.zeros(want.shape, dt)
    scale = np.maximum(np.abs(want), 1.0)
    tol = 2e-2 if dt == BF16 else 3e-3
    check_kernel(unary_kernel(pfn), [x, out], {1: want.astype(dt)}, rtol=tol, atol=float(np.max(scale)) * tol,
                 TM=16, TN=128)


# name -> (pypto call of (a, b, c), numpy reference, domain of a, of b, shape of b, of c)
MULTI = {
    "hypot": (lambda a, b, c: pypto.hypot(a, b), lambda a, b, c: np.hypot(a, b)),
    "logaddexp": (lambda a, b, c: pypto.logaddexp(a, b), lambda a, b, c: np.logaddexp(a, b)),
    "rsub": (lambda a, b, c: pypto.rsub(a, b), lambda a, b, c: b - a),
    "rsub_alpha": (lambda a, b, c: pypto.rsub(a, b, alpha=2), lambda a, b, c: b - 2 * a),
    "lerp_number": (lambda a, b, c: pypto.lerp(a, b, 0.3), lambda a, b, c: a + 0.3 * (b - a)),
    "lerp_tensor": (lambda a, b, c: pypto.lerp(a, b, c), lambda a, b, c: a + c * (b - a)),
    "lerp_method": (lambda a, b, c: a.lerp(b, c), lambda a, b, c: a + c * (b - a)),
    "addcmul": (lambda a, b, c: pypto.addcmul(a, b, c, value=0.5), lambda a, b, c: a + 0.5 * b * c),
    "addcdiv": (lambda a, b, c: pypto.addcdiv(a, b, c), lambda a, b, c: a + b / c),
    "hypot_row": (lambda a, b, c: pypto.hypot(a, c[0:1, :]), lambda a, b, c: np.hypot(a, c[0:1, :])),
}


def multi_kernel(fn):
    @pypto.jit
    def multi(a, b, c, out, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(TM, TN)
        out[:] = fn(a, b, c)
    return multi


@pytest.mark.parametrize("dt", [np.float32, np.float16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("op", list(MULTI))
def test_multi_input(op, tiles, dt, rng, check_kernel):
    if dt != np.float32 and tiles is None:
        pytest.skip("low precision: one tiling")
    pfn, ref = MULTI[op]
    a, b = (rng.uniform(-3, 3, (M, N)).astype(dt) for _ in range(2))
    c = rng.uniform(0.5, 3, (M, N)).astype(dt)            # (a divisor)
    want = ref(*(v.astype(np.float64) for v in (a, b, c)))
    kw = {}
    if dt != np.float32:
        tol = 2e-2 if dt == BF16 else 3e-3
        kw = {"rtol": tol, "atol": float(np.max(np.maximum(np.abs(want), 1.0))) * tol}
    check_kernel(multi_kernel(pfn), [a, b, c, np.zeros((M, N), dt)], {3: want.astype(dt)}, **kw, **tile_consts(tiles))


@pytest.mark.parametrize("shape, wshape", [((8, 24, 40), (24,)), ((40, 300), (300,)), ((40, 300), (1,))])
def test_prelu(shape, wshape, rng, check_kernel):
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.uniform(0.05, 0.5, wshape).astype(np.float32)
    wb = w.reshape((-1,) + (1,) * (len(shape) - 2)) if w.size > 1 else w
    want = np.where(x >= 0, x, wb * x)

    @pypto.jit
    def k(x_, w_, o):
        pypto.set_vec_tile_shapes(*([16, 128] if len(shape) == 2 else [1, 8, 32]))
        o[:] = pypto.prelu(x_, w_)
    check_kernel(k, [x, w, np.zeros_like(x)], {2: want})


def test_rsub_ints(check_kernel):
    x = (np.arange(M * 64).reshape(M, 64) % 23 - 11).astype(np.int32)

    @pypto.jit
    def k(a, o):
        o[:] = pypto.rsub(a, 7)
    check_kernel(k, [x, np.zeros_like(x)], {1: 7 - x})


def test_norm_drop_dim(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, o):
        pypto.set_vec_tile_shapes(16, 128)
        o[:] = pypto.norm(a, 2, -1)
    check_kernel(k, [x, np.zeros(M, np.float32)], {1: np.linalg.norm(x.astype(np.float64), axis=-1)})


# --- new instructions: TREM / TFMOD, TROWPROD / TCOLPROD, TCVT with a rounding mode

MOD = {
    "remainder": (lambda a, b: pypto.remainder(a, b), np.remainder),
    "mod_operator": (lambda a, b: a % b, np.remainder),
    "fmod": (lambda a, b: pypto.fmod(a, b), np.fmod),
    "fmod_method": (lambda a, b: a.fmod(b), np.fmod),
}


@pytest.mark.parametrize("dt", [np.float32, np.float16, BF16, np.int32], ids=["fp32", "fp16", "bf16", "int32"])
@pytest.mark.parametrize("op", list(MOD))
def test_mod(op, dt, rng, check_kernel):
    pfn, ref = MOD[op]
    if dt == np.int32:
        a = rng.integers(-50, 50, (M, N)).astype(dt)
        b = rng.integers(1, 9, (M, N)).astype(dt) * rng.choice([-1, 1], (M, N)).astype(dt)
    else:
        a = rng.uniform(-8, 8, (M, N)).astype(dt)
        b = (rng.uniform(0.5, 3, (M, N)) * rng.choice([-1, 1], (M, N))).astype(dt)
    want = ref(a, b)          # exact in the dtype (fmod) or one rounding (remainder), as numpy does

    @pypto.jit
    def k(a_, b_, o1, o2, o3):
        pypto.set_vec_tile_shapes(16, 128)
        o1[:] = pfn(a_, b_)
        o2[:] = pfn(a_, 3)               # TREMS / TFMODS
        o3[:] = (pypto.fmod if ref is np.fmod else pypto.remainder)(7, b_)
        # (a constant on the left: a TEXPANDS tile, then the tile-tile form)
    z = np.zeros((M, N), dt)
    check_kernel(k, [a, b, z, z, z], {2: want, 3: ref(a, np.asarray(3, dt)), 4: ref(np.asarray(7, dt), b)})


@pytest.mark.parametrize("keepdim", [True, False], ids=["keep", "drop"])
@pytest.mark.parametrize("dim", [-1, 0, (0, 1)], ids=["last", "first", "both"])
@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
def test_prod(dim, keepdim, tiles, rng, check_kernel):
    x = rng.uniform(0.97, 1.03, (M, N)).astype(np.float32) * rng.choice([-1, 1], (M, N)).astype(np.float32)
    want = np.asarray(np.prod(x.astype(np.float64), axis=dim, keepdims=keepdim)).astype(np.float32)
    out = np.zeros(want.shape or (1,), np.float32)

    @pypto.jit
    def k(a, o, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(TM, TN)
        r = pypto.prod(a, dim, keepdim) if dim != -1 else a.prod(dim, keepdim)
        o[:] = r if r.shape == o.shape else r.reshape(o.shape)
    check_kernel(k, [x, out], {1: want.reshape(out.shape)}, **tile_consts(tiles))


@pytest.mark.parametrize("dt", [np.float16, BF16, np.int32], ids=["fp16", "bf16", "int32"])
def test_prod_other_dtypes(dt, rng, check_kernel):
    if dt == np.int32:
        x = rng.integers(-3, 4, (M, 12)).astype(dt)
        want = np.prod(x, axis=-1, keepdims=True, dtype=np.int64).astype(np.int32)   # wraps as int32 does
        kw = {}
    else:
        x = rng.uniform(0.9, 1.1, (M, N)).astype(dt)
        want = np.prod(x.astype(np.float64), axis=-1, keepdims=True).astype(dt)
        kw = {"rtol": 2e-2 if dt == BF16 else 3e-3, "atol": 0}

    @pypto.jit
    def k(a, o):
        pypto.set_vec_tile_shapes(16, 128)
        o[:] = pypto.prod(a, -1, True)
    check_kernel(k, [x, np.zeros(want.shape, dt)], {1: want}, **kw)


ROUNDING = {
    "floor": (pypto.floor, np.floor), "ceil": (pypto.ceil, np.ceil), "round": (pypto.round, np.rint),
    "trunc": (pypto.trunc, np.trunc), "frac": (pypto.frac, lambda x: x - np.trunc(x)),
    "floor_method": (lambda x: x.floor(), np.floor), "round_method": (lambda x: x.round(), np.rint),
}


@pytest.mark.parametrize("dt", [np.float32, np.float16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("op", list(ROUNDING))
def test_rounding(op, tiles, dt, rng, check_kernel):
    pfn, ref = ROUNDING[op]
    x = rng.uniform(-6, 6, (M, N)).astype(dt)
    x[0, :8] = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.0, -0.0], dt)    # ties: to even, as torch
    want = ref(x)                # exact in the dtype
    check_kernel(unary_kernel(pfn), [x, np.zeros_like(x)], {1: want}, rtol=0, atol=0, **tile_consts(tiles))


def test_rounding_of_ints_is_the_identity(check_kernel):
    x = (np.arange(M * 64).reshape(M, 64) % 23 - 11).astype(np.int32)

    @pypto.jit
    def k(a, o1, o2):
        o1[:] = pypto.floor(a)
        o2[:] = pypto.round(a)
    check_kernel(k, [x, np.zeros_like(x), np.zeros_like(x)], {1: x, 2: x})


def test_round_mode_in_the_pto_text(rng):
    """TCVT prints its rounding mode (round=) and the PTO parser reads it back; an unknown mode is
    refused."""
    from pypto.ir.pto_text import parse_instr
    x = rng.uniform(-3, 3, (16, 64)).astype(np.float32)
    ck = unary_kernel(pypto.floor).compile(x, np.zeros_like(x))
    cvt = next(i for t in ck.program.tasks for i in t.instrs if i.op == "TCVT")
    text = cvt.text()
    assert "round=FLOOR" in text
    assert parse_instr(text, {}).attrs["round"] == "FLOOR"
    with pytest.raises(Exception, match="rounding mode"):
        parse_instr(text.replace("FLOOR", "SIDEWAYS"), {})


# --- creation ops (no tensor inputs: TEXPANDS / TCI in the group of their reader) and ops on them

@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
def test_creation_stored(tiles, check_kernel):
    """Values made from nothing, stored as they are (each a group of its own) or read by others."""
    @pypto.jit
    def k(a, o1, o2, o3, o4, o5, o6, o7, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(TM, TN)
        o1[:] = pypto.zeros(M, N)
        o2[:] = pypto.full((M, N), -2.5)
        o3[:] = pypto.ones_like(a) + a
        o4[:] = pypto.arange(N)
        o5[:] = pypto.arange(3, 3 + 2 * N, 2)
        o6[:] = pypto.eye(M, N)
        o7[:] = pypto.full_like(a, 7, dtype=pypto.DT_INT32)
    x = np.linspace(-1, 1, M * N, dtype=np.float32).reshape(M, N)
    zf, zi = np.zeros((M, N), np.float32), np.zeros(N, np.int32)
    check_kernel(k, [x, zf, zf, zf, zi, zi, zf, np.zeros((M, N), np.int32)],
                 {1: np.zeros((M, N)), 2: np.full((M, N), -2.5), 3: x + 1, 4: np.arange(N),
                  5: np.arange(3, 3 + 2 * N, 2), 6: np.eye(M, N), 7: np.full((M, N), 7)}, **tile_consts(tiles))


@pytest.mark.parametrize("dt", [np.float32, np.float16, BF16, np.int32], ids=["fp32", "fp16", "bf16", "int32"])
def test_creation_dtypes(dt, check_kernel):
    pdt = {np.dtype(np.float32): pypto.DT_FP32, np.dtype(np.float16): pypto.DT_FP16, BF16: pypto.DT_BF16,
           np.dtype(np.int32): pypto.DT_INT32}[np.dtype(dt)]

    @pypto.jit
    def k(a, o1, o2, o3):
        pypto.set_vec_tile_shapes(16, 128)
        o1[:] = a * pypto.full((M, N), 3, dtype=pdt)
        o2[:] = a + pypto.arange(N, dtype=pdt)           # a row, broadcast over the rows
        o3[:] = pypto.zeros_like(a) - a
    x = (np.arange(M * N).reshape(M, N) % 17 - 8).astype(dt)
    z = np.zeros((M, N), dt)
    seq = np.arange(N).astype(dt)                       # (bf16 rounds 257, ... once, as the kernel)
    check_kernel(k, [x, z, z, z], {1: x * np.asarray(3, dt), 2: x + seq, 3: -x})


def test_arange_float_step(check_kernel):
    @pypto.jit
    def k(o):
        pypto.set_vec_tile_shapes(128)
        o[:] = pypto.arange(-1.0, 2.0, 0.01)
    want = (-1.0 + 0.01 * np.arange(300)).astype(np.float32)
    check_kernel(k, [np.zeros(300, np.float32)], {0: want})


@pytest.mark.parametrize("diagonal", [0, 2, -3])
@pytest.mark.parametrize("dt", [np.float32, np.float16, np.int32], ids=["fp32", "fp16", "int32"])
@pytest.mark.parametrize("tiles", TILES, ids=TILE_IDS)
def test_tril_triu(diagonal, dt, tiles, rng, check_kernel):
    x = rng.uniform(-5, 5, (2, M, N)).astype(dt)

    @pypto.jit
    def k(a, o1, o2, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(1, TM, TN)
        o1[:] = pypto.tril(a, diagonal)
        o2[:] = a.triu(diagonal)
    z = np.zeros_like(x)
    check_kernel(k, [x, z, z], {1: np.tril(x, diagonal), 2: np.triu(x, diagonal)}, **tile_consts(tiles))


@pytest.mark.parametrize("tm", [16, 13])
def test_causal_mask_by_comparison_and_where(tm, rng, check_kernel):
    """Attention's causal mask: scores where col <= row, else -inf, then softmax (13 rows: a
    tail tile of one row, whose comparison expands both operands as the full tiles do)."""
    s = rng.standard_normal((M, M)).astype(np.float32)

    @pypto.jit
    def k(a, o):
        pypto.set_vec_tile_shapes(tm, 32)
        rows = pypto.arange(M).reshape(M, 1)
        cols = pypto.arange(M)
        o[:] = pypto.softmax(pypto.where(cols <= rows, a, float("-inf")))
    masked = np.where(np.tril(np.ones((M, M), bool)), s.astype(np.float64), -np.inf)
    e = np.exp(masked - masked.max(-1, keepdims=True))
    check_kernel(k, [s, np.zeros_like(s)], {1: (e / e.sum(-1, keepdims=True)).astype(np.float32)})


@pytest.mark.parametrize("classes", [5, 130])
def test_one_hot(classes, rng, check_kernel):
    idx = rng.integers(0, classes, (M, 24)).astype(np.int32)

    @pypto.jit
    def k(i, o):
        o[:] = pypto.one_hot(i, classes)
    want = (idx[..., None] == np.arange(classes)).astype(np.int32)
    check_kernel(k, [idx, np.zeros(want.shape, np.int32)], {1: want})


ARG = {"argmax": (pypto.argmax, np.argmax), "argmin": (pypto.argmin, np.argmin)}


@pytest.mark.parametrize("keepdim", [True, False], ids=["keep", "drop"])
@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("dt", [np.float32, np.float16, BF16, np.int32], ids=["fp32", "fp16", "bf16", "int32"])
@pytest.mark.parametrize("op", list(ARG))
def test_argmax_argmin(op, dt, dim, keepdim, rng, check_kernel):
    pfn, ref = ARG[op]
    x = rng.integers(-20, 20, (M, N)).astype(dt)          # ties: the first index wins, as torch
    if np.dtype(dt).kind == "f":
        x[5, 17] = x[9, 3] = x[9, 250] = np.nan             # a row or column with nan: its first nan
    want = np.asarray(ref(x, axis=dim))
    if keepdim:
        want = np.expand_dims(want, dim)

    @pypto.jit
    def k(a, o):
        pypto.set_vec_tile_shapes(16, 128)
        o[:] = pfn(a, dim, keepdim)
    check_kernel(k, [x, np.zeros(want.shape, np.int32)], {1: want.astype(np.int32)})


def test_argmax_all_and_method(rng, check_kernel):
    x = rng.standard_normal((M, N)).astype(np.float32)

    @pypto.jit
    def k(a, o1, o2):
        pypto.set_vec_tile_shapes(16, 128)
        o1[:] = pypto.argmax(a).reshape(1)
        o2[:] = a.argmin(1)
    check_kernel(k, [x, np.zeros(1, np.int32), np.zeros(M, np.int32)],
                 {1: np.array([np.argmax(x)]), 2: np.argmin(x, 1)})


def test_tci_starts_at_the_tile_offset(check_kernel):
    """Each TCI tile starts where its tile does (start + c * step), so tails and tiles compose."""
    @pypto.jit
    def k(o):
        pypto.set_vec_tile_shapes(64)
        o[:] = pypto.arange(10, 10 + 3 * 300, 3)
    ck = k.compile(np.zeros(300, np.int32))
    starts = sorted(i.attrs["start"] for t in ck.program.tasks for i in t.instrs if i.op == "TCI")
    assert starts == [10 + 3 * 64 * j for j in range(5)]
    check_kernel(k, [np.zeros(300, np.int32)], {0: np.arange(10, 10 + 3 * 300, 3)})


@pytest.mark.parametrize("tm", [16, 13])
def test_broadcast_operands_in_a_one_row_tail(tm, rng, check_kernel):
    """A comparison and a where of broadcast operands ([1, N] against [M, 1]) in a tail tile with
    one valid row: the operands are expanded as in the full tiles (the buffer plan of every
    iteration comes from one of them, so a tail that skipped an expansion overwrote an operand)."""
    m = rng.standard_normal((M, N)).astype(np.float32)
    a = rng.standard_normal((1, N)).astype(np.float32)
    b = rng.standard_normal((M, 1)).astype(np.float32)

    @pypto.jit
    def k(m_, a_, b_, o1, o2):
        pypto.set_vec_tile_shapes(tm, N)
        o1[:] = pypto.where(m_ > 0, a_ + 1, b_ + 1)
        o2[:] = pypto.cast(a_ >= b_, pypto.DT_FP32)
    z = np.zeros((M, N), np.float32)
    check_kernel(k, [m, a, b, z, z], {3: np.where(m > 0, a + 1, b + 1), 4: (a >= b).astype(np.float32)})
