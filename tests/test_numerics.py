"""The honest numeric check (pypto.ir.numerics): no false alarms on correct mixed-precision
kernels, a real mismatch or race reported; the error bound is sound; 0-d intermediates."""
import dataclasses

import ml_dtypes
import numpy as np
import pytest

import pypto
from pypto.frontend.kernel import compare
from pypto.dtypes import DT_BF16, DT_FP16, DT_FP32
from pypto.ir.numerics import Approx, UNIT_ROUNDOFF, within_bound

BF16 = np.dtype(ml_dtypes.bfloat16)


# --- correct mixed-precision kernels pass --------------------------------------------------------

@pypto.jit
def gelu_up(x, out):
    out[:] = pypto.cast(pypto.gelu(x), pypto.DT_FP32)


@pypto.jit
def mm_cast_mm(a, b, c, out):
    t = pypto.cast(pypto.matmul(a, b, out_dtype=pypto.DT_FP32), a.dtype)
    out[:] = pypto.matmul(t, c, out_dtype=pypto.DT_FP32)


@pypto.jit
def mlp(x, w1, w2, out):
    h = pypto.gelu(pypto.matmul(x, w1))
    out[:] = pypto.matmul(h, w2, out_dtype=pypto.DT_FP32)


@pypto.jit
def attention(q, k, v, out):
    s = pypto.matmul(q, k, b_trans=True, out_dtype=pypto.DT_FP32) * 0.125
    p = pypto.cast(pypto.softmax(s), q.dtype)
    out[:] = pypto.matmul(p, v, out_dtype=pypto.DT_FP32)


@pypto.jit
def exp_add(x, y, out):
    out[:] = pypto.exp(x) + y


def _cases(rng, dt):
    f = lambda *s: rng.standard_normal(s)                                     # noqa: E731
    return {
        "gelu_up": (gelu_up, (f(64, 128).astype(dt), np.zeros((64, 128), np.float32))),
        "mm_cast_mm": (mm_cast_mm, tuple(f(64, 64).astype(dt) for _ in range(3)) + (np.zeros((64, 64), np.float32),)),
        "mlp": (mlp, ((0.5 * f(128, 256)).astype(dt), (f(256, 512) / 16).astype(dt), (f(512, 256) / 22).astype(dt),
                      np.zeros((128, 256), np.float32))),
        "attention": (attention, (f(128, 64).astype(dt), f(256, 64).astype(dt), f(256, 64).astype(dt),
                                  np.zeros((128, 64), np.float32))),
    }


@pytest.mark.parametrize("dt", [np.float16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("which", ["gelu_up", "mm_cast_mm", "mlp", "attention"])
def test_correct_mixed_precision_kernels_pass_the_check(which, dt, rng):
    kernel, args = _cases(rng, dt)[which]
    res = kernel.compile(*args).simulate(*args)
    assert res.ok, res.check
    c = res.check["out"]
    assert 0 <= c["max_err_ratio"] < 1 and c["worst"] is None
    assert "OK vs numpy" in res.summary() and "of its bound" in res.summary()


def test_a_wrong_element_is_a_mismatch_naming_it(rng):
    kernel, args = _cases(rng, np.float16)["mm_cast_mm"]
    ck = kernel.compile(*args)
    res = ck.simulate(*args)
    out = res.outputs["out"].copy()
    out[3, 5] += 0.05 * np.abs(out).max()
    c = compare({"out": out}, ck.bind(args), ck.traced)["out"]
    assert not c["ok"] and c["worst"] == (3, 5) and c["max_err_ratio"] > 1
    res.check = {"out": c}
    assert "MISMATCH vs numpy" in res.summary() and "at out[3, 5]" in res.summary()


def test_a_corrupted_instruction_is_a_mismatch(rng):
    x = rng.standard_normal((64, 256)).astype(np.float32)
    args = (x, x.copy(), np.zeros_like(x))
    ck = exp_add.compile(*args)
    text = ck.program.text()
    assert text.count("TADD ") >= 1
    bad = dataclasses.replace(ck, program=pypto.Program.parse(text.replace("TADD ", "TSUB ", 1)))
    assert ck.simulate(*args).ok
    res = bad.simulate(*args)
    assert res.ok is False and not res.check["out"]["ok"]


def test_a_removed_wait_is_a_race_and_not_ok(rng):
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    args = (x, x.copy(), np.zeros_like(x))
    ck = exp_add.compile(*args)
    res = ck.simulate(*args)
    assert res.ok and res.races == []
    lines = ck.program.text().splitlines()
    k = next(i for i, line in enumerate(lines) if "WAIT_FLAG" in line)
    bad = dataclasses.replace(ck, program=pypto.Program.parse("\n".join(lines[:k] + lines[k + 1:])))
    res = bad.simulate(*args)
    assert res.check["out"]["ok"]            # program order still gives the right values
    assert res.ok is False and res.races and "race in task" in res.races[0]
    assert "races" in res.summary()
    with pytest.raises(pypto.SimulationError, match="race"):
        bad.simulate(*args, checked=True)


# --- the bound is sound ---------------------------------------------------------------------------

def _round(v, dt):
    return v.astype(dt).astype(np.float64)


@pytest.mark.parametrize("dt", [np.float16, BF16, np.float32], ids=["fp16", "bf16", "fp32"])
def test_the_bound_covers_a_chain_rounded_at_every_step(dt, rng):
    """exp(a * b - c) / (sum(a) + 3), sqrt and log: evaluated with rounding after every step,
    the result lies within the bound of the exact (float64) value."""
    name = {np.float16: "fp16", BF16: "bf16", np.float32: "fp32"}[dt]
    d = {"fp16": DT_FP16, "bf16": DT_BF16, "fp32": DT_FP32}[name]
    a, b, c = (_round(rng.uniform(0.5, 2, (16, 300)), dt) for _ in range(3))
    A, B, C = Approx(a), Approx(b), Approx(c)
    s = A.sum(-1, True).rounded(d)
    y = ((A * B).rounded(d) - C).rounded(d).exp().rounded(d) / (s + 3.0).rounded(d)
    y = y.rounded(d).sqrt().rounded(d).log().rounded(d)
    lo = lambda v: _round(v, dt)                                              # noqa: E731
    acc = lambda v: v.astype(np.float32).sum(-1, keepdims=True, dtype=np.float32).astype(np.float64)  # noqa: E731
    steps = lo(np.log(lo(np.sqrt(lo(lo(np.exp(lo(lo(a * b) - c))) / lo(lo(acc(a)) + 3.0))))))
    exact = np.log(np.sqrt(np.exp(a * b - c) / (a.sum(-1, keepdims=True) + 3.0)))
    assert np.all(np.abs(steps - exact) <= y.e)
    assert y.e.max() < 64 * UNIT_ROUNDOFF[name] * np.abs(exact).max() + 1e-6   # and not vacuous


def test_within_bound_accepts_equal_infs_and_nans_and_rejects_a_nan_for_a_number():
    want = np.array([np.inf, np.nan, 1.0, 1.0], np.float32)
    bound = np.array([0.0, 0.0, 1e-7, 1e-7])
    assert within_bound(want.copy(), want, bound, DT_FP32)["ok"]
    got = want.copy()
    got[3] = np.nan
    c = within_bound(got, want, bound, DT_FP32)
    assert not c["ok"] and c["worst"] == (3,)


def test_integer_results_must_be_equal(rng):
    @pypto.jit
    def iadd(x, y, out):
        out[:] = x + y * 3
    x = rng.integers(-100, 100, (16, 64)).astype(np.int32)
    args = (x, x.copy(), np.zeros_like(x))
    ck = iadd.compile(*args)
    res = ck.simulate(*args)
    assert res.ok and res.check["out"]["max_abs_err"] == 0
    out = res.outputs["out"].copy()
    out[0, 0] += 1
    assert not compare({"out": out}, ck.bind(args), ck.traced)["out"]["ok"]


# --- rounding once ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", [np.float16, BF16], ids=["fp16", "bf16"])
def test_low_precision_rsqrt_rounds_once(dt):
    @pypto.jit
    def rs(x, out):
        out[:] = pypto.rsqrt(x)
    x = np.linspace(0.01, 300.0, 64 * 512).reshape(64, 512).astype(dt)
    out = np.zeros_like(x)
    rs(x, out)
    want = (1.0 / np.sqrt(x.astype(np.float32))).astype(dt)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))


# --- 0-d intermediates ------------------------------------------------------------------------------

@pypto.jit
def minus_total(x, out):
    s = pypto.sum(x, dim=0)
    out[:] = x - s


@pypto.jit
def scalar_chain(x, out):
    s = pypto.sum(x, dim=0)
    t = pypto.exp(s * 0.01) + s
    out[0] = t
    out[1:] = x[1:] * t


@pypto.jit
def max_of_max(x, out):
    out[:] = pypto.reshape(pypto.amax(pypto.amax(x, dim=0), dim=0), [1, 1])


def test_a_full_reduction_of_a_1d_tensor_is_usable(rng):
    x = rng.random(32).astype(np.float32)
    out = np.zeros_like(x)
    minus_total(x, out)
    np.testing.assert_allclose(out, x - x.astype(np.float64).sum(), rtol=1e-5)
    res = minus_total.compile(x, out).simulate(x, out)
    assert res.ok, res.check

    out = np.zeros_like(x)
    scalar_chain(x, out)
    s = x.astype(np.float64).sum()
    t = np.exp(s * 0.01) + s
    np.testing.assert_allclose(out, np.concatenate([[t], x[1:] * t]), rtol=1e-5)

    y = rng.random((16, 32)).astype(np.float32)
    o = np.zeros((1, 1), np.float32)
    max_of_max(y, o)
    assert o[0, 0] == y.max()


def test_an_intermediate_that_overflows_makes_no_false_alarm(rng):
    """gelu(-10.06) in fp32: exp(88.73) of its sigmoid overflows to inf, so the kernel gives -0.0
    where the exact value is -2.9e-38; a correct evaluation of the decomposition may do that."""
    @pypto.jit
    def gelu32(x, out):
        out[:] = pypto.gelu(x)
    x = rng.uniform(-20, 20, (64, 256)).astype(np.float32)
    x[0, 0] = -10.061262
    res = gelu32.compile(x, np.zeros_like(x)).simulate(x, np.zeros_like(x))
    assert res.outputs["out"][0, 0] == 0 and res.ok, res.check


def test_an_overflow_next_to_a_nan_makes_no_false_alarm():
    """fp16 sigmoid(-11.11): exp(11.11) overflows fp16, so 1 / (1 + inf) = 0 where the exact value
    is 1.5e-5, with a NaN elsewhere in the tensor (fuzz data seed 2177)."""
    @pypto.jit
    def sig(x, out):
        out[:] = pypto.sigmoid(x)
    x = np.linspace(-20, 20, 8 * 128).reshape(8, 128).astype(np.float16)
    x[0, 0], x[3, 5] = -11.11, np.nan
    res = sig.compile(x, np.zeros_like(x)).simulate(x, np.zeros_like(x))
    assert res.outputs["out"][0, 0] == 0 and np.isnan(res.outputs["out"][3, 5])
    assert res.ok, res.check


def test_an_unknown_bound_makes_comparisons_selects_and_int_casts_unknown():
    """(make fuzz, 2026-12-03.)  A layernorm of four fp16 values that round to one (var 0) has a
    NaN bound (0 x inf): `x > 0`, the `where` it drives and a cast to int must make no claim
    there, not a certain one (the check called a correct result a MISMATCH, 6.9 million times its
    bound)."""
    from pypto.ir.numerics import Approx, bound_node
    from pypto.ir.ops import OPS
    unknown = Approx(np.array([0.0, 1.0]), np.array([np.nan, 0.0]))
    gt = OPS["gt"].bound([unknown, Approx(np.array(0.0))], {})
    assert np.isinf(gt.e[0]) and gt.e[1] == 0
    sel = OPS["where"].bound([gt, Approx(np.array([5.0, 6.0])), Approx(np.array([7.0, 8.0]))], {})
    assert np.isinf(sel.full_e[0]) and sel.full_e[1] == 0
    # floor of gelu's -0 of a very negative x (NaN bound: x times an underflowed sigmoid) may be -1
    fl = OPS["floor"].bound([unknown], {})
    assert np.isinf(fl.full_e[0]) and fl.full_e[1] == 0
    rem = OPS["remainder"].bound([Approx(np.array([5.0, 5.0])), Approx(np.array([3.0, 3.0]), np.array([np.nan, 0]))], {})
    assert not (rem.full_e[0] <= 0) and rem.full_e[1] == 0
    from pypto.ir.tensor import TNode
    n = TNode(1, "cast", (0,), (2,), pypto.DT_INT32)
    c = bound_node(n, [unknown], np.array([0.0, 1.0]), in_dtypes=[pypto.DT_FP32])
    assert not (np.asarray(c.full_e)[0] <= 0) and c.full_e[1] == 0


def test_a_comparison_of_a_nan_that_may_be_a_number_is_unknown():
    """(make fuzz, 2026-12-05.)  A layernorm row of equal values is 0 in the reference but a tiny
    number on the chip; times an inf in the matmul after it, the reference has NaN (0 x inf), the
    chip inf.  `v >= w` is then False in the reference and True on the chip, so the comparison,
    and the `where` it drives, must make no claim there (the check called a correct result a
    MISMATCH).  A NaN the bound says is exact stays a certain False."""
    from pypto.ir.numerics import Approx
    from pypto.ir.ops import OPS
    nan = Approx(np.array([np.nan, np.nan, 1.0]), np.array([1.0, 0.0, 0.0]))
    ge = OPS["ge"].bound([nan, Approx(np.array(0.5))], {})
    assert np.isinf(ge.e[0]) and ge.e[1] == 0 and ge.e[2] == 0
    assert list(ge.v) == [False, False, True]


@pypto.jit
def _ln_matmul_mask(x0, x1, x2, out0):
    pypto.set_vec_tile_shapes(1, 8, 32)
    v1 = x0.sum(dim=2, keepdim=True)
    v2 = pypto.minimum(x0, v1)
    pypto.set_vec_tile_shapes(8, 8, 256)
    v6 = pypto.matmul(pypto.layer_norm(v2, weight=x1), x2)
    out0[...] = 7.0 / (pypto.abs(pypto.where(v6 >= v1, v6, 0.0)) + 0.5)


def test_a_nan_against_an_inf_after_a_layernorm_is_no_false_alarm():
    """The fuzz kernel (data seed 8132) behind the rule above, end to end."""
    rng = np.random.default_rng(8132)
    x0 = rng.uniform(-2, 2, (64, 17, 64)).astype(np.float32)
    x1 = rng.uniform(0.5, 1.5, (64,)).astype(np.float32)
    x2 = rng.uniform(-1, 1, (64, 17))
    for k in range(3):
        x2.reshape(-1)[rng.integers(0, x2.size)] = (np.nan, np.inf, -np.inf)[k]
    x2 = x2.astype(np.float32)
    out0 = np.zeros((64, 17, 17), np.float32)
    res = _ln_matmul_mask.compile(x0, x1, x2, out0).simulate(x0, x1, x2, out0)
    assert res.ok, res.check


def test_a_jump_within_safety_times_the_bound_is_unknown():
    """(make fuzz, 2026-12-05, data seed 2754.)  The chip's value and the reference's are each
    within the bound e of the exact one, so they may be 2e apart (4e with the second-order terms
    the check allows, SAFETY): a bf16 `x - sum(x)` one ulp (2.4e-4) from the value it is compared
    with, its bound 1.9e-4, compared equal on the chip and not in the reference, and the check
    called the correct result a MISMATCH.  Comparisons, roundings to an integer and remainders make
    no claim within SAFETY x the bound of their jump."""
    from pypto.ir.numerics import Approx
    from pypto.ir.ops import OPS, SAFETY
    assert SAFETY == 4
    y, e = 0.0314941, 1.9e-4
    x = Approx(y + np.array([2.44e-4, 3.9 * e, 4.1 * e]), np.full(3, e))   # 1.3, 3.9 and 4.1 bounds away
    eq = OPS["eq"].bound([x, Approx(np.array(y))], {})
    assert list(np.isinf(eq.e)) == [True, True, False] and not eq.v.any()
    fl = OPS["floor"].bound([Approx(np.array([2.003, 2.005]), np.array([1e-3, 1e-3]))], {})
    assert np.isinf(fl.full_e[0]) and fl.full_e[1] == 0


@pypto.jit
def _sum_eq_mask(x0, x2, out0):
    v6 = -pypto.sub(x0, pypto.sum(x0, dim=1, keepdim=True))
    v7 = pypto.eq(v6, x2) * v6
    out0[1] = pypto.masked_fill(v7, pypto.le(v7, -1.62), float("nan"))


def test_an_equality_one_ulp_off_in_bf16_is_no_false_alarm():
    """The fuzz kernel behind the rule above, end to end (its data as the fuzzer made it)."""
    import ml_dtypes
    rng = np.random.default_rng(2754)
    x0 = rng.uniform(-0.05, 0.05, (64, 64, 32)).astype(ml_dtypes.bfloat16)
    rng.uniform(-1.0, 1.0, (32, 100))                   # (an input the kernel does not read)
    x2 = rng.uniform(-0.05, 0.05, (32,)).astype(ml_dtypes.bfloat16)
    out0 = rng.uniform(-3, 3, (2, 64, 64, 32)).astype(ml_dtypes.bfloat16)
    res = _sum_eq_mask.compile(x0, x2, out0).simulate(x0, x2, out0)
    assert res.ok, res.check


@pypto.jit
def _ln_then_mask(x, y, out):
    v = pypto.layernorm(x - y, eps=1e-06)
    out[:] = pypto.where(pypto.lt(0.0, v), v, 0.0)


def test_an_ill_conditioned_layernorm_is_not_a_false_alarm():
    # the four values of a row differ by less than an fp16 ulp of 20: the reference rounds them to
    # one (layernorm 0), autocast keeps them apart in fp32 (layernorm up to 1.64): both are right
    x = np.array([[[0.0, 0.0, 0.0, 0.006886]]], np.float16)
    y = np.array([[[19.95]]], np.float16)
    out = np.zeros((1, 1, 4), np.float16)
    res = _ln_then_mask.compile(x, y, out).simulate(x, y, out)
    assert res.outputs["out"][0, 0, 3] > 1.5 and res.ok
