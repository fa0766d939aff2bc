"""The check's fused bound kernels (`pypto.ir.bound_kernels`, used from `numerics.FUSED_MIN`
elements) give the bounds numpy's expressions give, bit for bit (a NaN for a NaN: its payload
tells nothing); a value the check does not read is not made, and a rounding written into a bound
in place only writes into one made for it.  And a check of a few elements does not load them
(numba's import costs more than it saves there)."""
from __future__ import annotations

import numpy as np
import pytest

import pypto
from pypto import dtypes as dt
from pypto.ir import numerics
from pypto.ir.numerics import Approx, output_bounds
from pypto.ir.tensor_eval import evaluate

from common import layernorm, matmul_bias_gelu, softmax

F16, F32 = pypto.DT_FP16, pypto.DT_FP32
EDGE = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, -1e-40, 3.4e38, -3.4e38, 65504.0, 70000.0, 1e-30, 1.0,
        -2.5, 1e300, 5e-324]


def _array(rng, shape, dtype, positive=False):
    """Values over sixty decades, with the edge values scattered in."""
    with np.errstate(over="ignore"):
        x = (rng.standard_normal(shape) * np.exp(rng.uniform(-30, 30, shape))).astype(dtype)
        flat = x.reshape(-1)
        at = rng.choice(flat.size, size=min(4 * len(EDGE), flat.size), replace=False)
        edge = np.abs(EDGE) if positive else np.array(EDGE)
        flat[at] = np.resize(edge, len(at)).astype(dtype)
    return x


def _same(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(((a.view(np.int64) == b.view(np.int64)) | (np.isnan(a) & np.isnan(b))).all())


def _both(monkeypatch, fn):
    """fn() with numpy's expressions, then with the fused kernels (for every size)."""
    assert numerics._kernels() is not None          # (loaded; numba is a dependency)
    monkeypatch.setattr(numerics, "FUSED_MIN", 1 << 62)
    plain = fn()
    monkeypatch.setattr(numerics, "FUSED_MIN", 1)
    return plain, fn()


SHAPES = [((64, 512), (64, 512)), ((64, 512), (64, 1)), ((64, 512), ()), ((64, 1), (64, 512)), ((8, 64, 512), (512,))]


@pytest.mark.parametrize("v_shape,e_shape", SHAPES)
@pytest.mark.parametrize("a_dtype,b_dtype", [(np.float32, np.float32), (np.float32, np.float64),
                                             (np.float64, np.float32), (np.float64, np.float64)])
def test_fused_bounds_are_numpys_bit_for_bit(monkeypatch, v_shape, e_shape, a_dtype, b_dtype):
    rng = np.random.default_rng(hash((v_shape, e_shape, a_dtype, b_dtype)) % 2 ** 32)
    a = Approx(_array(rng, v_shape, a_dtype), _array(rng, e_shape, np.float64, True) if e_shape else 3e-7)
    b = Approx(_array(rng, v_shape, b_dtype), _array(rng, v_shape, np.float64, True))
    rules = {"mul": lambda: (a * b).e, "mul, swapped": lambda: (b * a).e, "div": lambda: (a / b).e,
             "div, swapped": lambda: (b / a).e, "exp": lambda: a.exp().e}
    for d in (dt.DT_FP32, dt.DT_FP16, dt.DT_BF16):
        rules[f"rounded to {d.name}"] = lambda d=d: a.rounded(d).e
    for name, rule in rules.items():
        with np.errstate(all="ignore"):
            plain, fused = _both(monkeypatch, rule)
        assert _same(plain, fused), name


@pytest.fixture(scope="module")
def kernels():
    @pypto.jit
    def ratio(x, y, out):
        pypto.set_vec_tile_shapes(8, 256)
        out[:] = pypto.exp(x) / (y * y + 1.0) - pypto.sqrt(pypto.abs(y))

    @pypto.jit
    def masked_softmax(x, out):                # exp of -inf: the bound where exp underflowed to 0
        pypto.set_vec_tile_shapes(8, 256)
        out[:] = pypto.softmax(pypto.where(x > 1.0, float("-inf"), x))

    @pypto.jit
    def columns_softmax(x, out):              # a transposed value: its bounds summed down columns
        out[:] = pypto.softmax(pypto.transpose(x, -2, -1), dim=0)

    rng = np.random.default_rng(7)
    x = rng.standard_normal((256, 256)).astype(np.float32)
    y = rng.standard_normal((256, 256)).astype(np.float32)
    w = rng.standard_normal(256).astype(np.float32)
    a16 = rng.standard_normal((256, 128)).astype(np.float16)
    b16 = rng.standard_normal((128, 256)).astype(np.float16)
    bias = rng.standard_normal(256).astype(np.float16)
    z = np.zeros_like(x)
    x16 = np.random.default_rng(0).uniform(-2.0, 2.0, (2, 17)).astype(np.float16)   # (the fuzzer's case)
    return [(ratio, (x, y, z), {}), (masked_softmax, (x, z), {}), (softmax, (x, z), dict(TM=64, TN=256)),
            (columns_softmax, (x16, np.zeros((17, 2), np.float16)), {}),
            (layernorm, (x, w, w, z), {}),
            (matmul_bias_gelu, (a16, b16, bias, np.zeros((256, 256), np.float16)), {})]


def test_the_bounds_of_kernels_are_the_same_both_ways(monkeypatch, kernels):
    for kern, args, consts in kernels:
        ck = kern.compile(*args, **consts)
        arrays = ck.bind(args)
        values: dict = {}
        with np.errstate(all="ignore"):
            want = evaluate(ck.traced, arrays, values)
            plain, fused = _both(monkeypatch, lambda: output_bounds(ck.traced, values, want))
        for name in plain:
            assert _same(plain[name], fused[name]), (kern.__name__, name)
        assert ck.simulate(*args, mode="functional").ok


def test_a_value_not_read_is_made_when_read_and_is_what_it_would_have_been():
    rng = np.random.default_rng(3)
    a = Approx(rng.standard_normal((4, 5)).astype(np.float32), 1e-7)
    b = Approx(rng.standard_normal((4, 5)).astype(np.float32), rng.random((4, 5)) * 1e-7)
    for got, want in [(a * b, a.v * b.v), (a + b, a.v + b.v), (a - b, a.v - b.v),
                      (a * 2.0, a.v * Approx(2.0).v)]:      # (a number: a 0-d fp64 value)
        assert got._v is None                          # (not made yet)
        assert got.v.dtype == want.dtype and np.array_equal(got.v, want)
        assert got.full_e.shape == want.shape


def test_a_rounding_writes_in_place_only_into_a_bound_made_for_it(monkeypatch):
    """A product's bound is made for it: the rounding of the step writes into it; a cast's bound is
    its operand's own (the rounding to fp16 adds to it): not written."""
    assert numerics._kernels() is not None
    monkeypatch.setattr(numerics, "FUSED_MIN", 1)
    rng = np.random.default_rng(5)
    x = Approx(rng.standard_normal((32, 64)).astype(np.float32), rng.random((32, 64)) * 1e-6)
    y = Approx(rng.standard_normal((32, 64)).astype(np.float32), rng.random((32, 64)) * 1e-6)
    xe, ye = x.e.copy(), y.e.copy()
    prod = numerics._step("mul", dt.DT_FP32, {}, [x, y], (x.v * y.v).astype(np.float64))
    assert np.array_equal(x.e, xe) and np.array_equal(y.e, ye)       # the operands' bounds untouched
    monkeypatch.setattr(numerics, "FUSED_MIN", 1 << 62)
    again = numerics._step("mul", dt.DT_FP32, {}, [x, y], (x.v * y.v).astype(np.float64))
    assert _same(prod.e, again.e)
    plain = numerics._step("cast", dt.DT_FP16, {}, [x], x.v.astype(np.float16).astype(np.float64))
    monkeypatch.setattr(numerics, "FUSED_MIN", 1)
    cast = numerics._step("cast", dt.DT_FP16, {}, [x], x.v.astype(np.float16).astype(np.float64))
    assert np.array_equal(x.e, xe) and _same(cast.e, plain.e) and (cast.e > xe).all()


def test_a_small_check_does_not_load_the_kernels():
    """(In a fresh process: this one may have loaded them.)"""
    import subprocess
    import sys
    code = ("import numpy as np, sys, pypto\n"
            "from pypto.ir import numerics\n"
            "@pypto.jit\n"
            "def k(x, out):\n"
            "    out[:] = pypto.softmax(x * 2.0)\n"
            "x = np.ones((512, 512), np.float32)\n"
            "assert k.compile(x, x).simulate(x, np.zeros_like(x)).ok\n"
            "print(bool(numerics._KERNELS), 'numba' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_fused_comparison_gives_numpys_verdict(monkeypatch):
    """`within_bound`'s one pass (fp32 / fp64 outputs, every element within its allowance) gives
    the same largest error and ratio as numpy's; a mismatch (specials scattered in) the same
    verdict too, worked out by numpy."""
    from pypto.ir.numerics import within_bound
    rng = np.random.default_rng(11)
    verdicts = set()
    for _ in range(150):
        n = int(rng.integers(1, 3000))
        for dtype in (np.float32, np.float64):
            want = rng.standard_normal(n).astype(dtype)
            got = (want + rng.standard_normal(n) * rng.choice([0, 1e-7, 1e-3])).astype(dtype)
            bound = np.abs(rng.standard_normal(n)) * rng.choice([0, 1e-7, 1e-3, 1])
            for a in (got, want, bound):
                k = int(rng.integers(0, 3))
                a[rng.integers(0, n, k)] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0], k)
            bound = np.abs(bound)
            plain, fused = _both(monkeypatch, lambda: within_bound(got, want, bound, dt.DT_FP32))
            assert plain == fused
            verdicts.add(plain["ok"])
    assert verdicts == {True, False}


def test_a_product_with_an_exact_factor_bounds_as_the_whole_rule():
    """With one factor exact (its bound the 0-d zero: a number, an input) the product's bound is one
    product, NaN where the rule's 0 x inf would be: the whole rule's array, shape and values."""
    rng = np.random.default_rng(2)
    shapes = [(64, 512), (512,), (64, 1), (1, 512), ()]
    for _ in range(120):
        sa, sb, se = (shapes[int(rng.integers(0, k))] for k in (4, 5, 5))
        for dtype in (np.float32, np.float64):
            av = (rng.standard_normal(sa) * 10).astype(dtype)
            bv = (rng.standard_normal(sb) * 10).astype(dtype)
            ea = np.abs(rng.standard_normal(se)) * 1e-6
            if av.ndim and rng.random() < 0.3:
                av.flat[int(rng.integers(0, av.size))] = rng.choice([np.inf, np.nan])
            if ea.ndim and rng.random() < 0.2:
                ea.flat[0] = np.inf
            a, b = Approx(av, ea), Approx(bv)
            for x, y in ((a, b), (b, a)):
                with np.errstate(all="ignore"):
                    got = (x * y).e
                    want = np.abs(y.v) * x.e + np.abs(x.v) * y.e + x.e * y.e
                assert _same(got, want)
