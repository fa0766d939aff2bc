"""pypto.grad: every differentiable op against central finite differences in float64, a few
kernels against gradients written out in numpy, def_gradient, the backward kernel as an ordinary
kernel, and the errors.

The finite differences run on the traced forward graph evaluated in float64 with the registry's
numpy references (`ref`), op by op: they share nothing with the gradient rules (the `grad`
column) nor with the compiler and simulator that run the backward kernel in fp32.
"""
from __future__ import annotations

import numpy as np
import pytest

import pypto
from pypto.errors import KernelSignatureError, PyptoError, UnsupportedError
from pypto.frontend.autodiff import def_gradient, del_gradient, grad, value_and_grad
from pypto.frontend.tracer import TraceContext
from pypto.ir.ops import OPS
from fuzz.grad import eval64   # the registry's references in float64, op by op

F32 = pypto.DT_FP32


def finite_diff(kernel, arrays: dict, wrt, dys: dict, eps=1e-6):
    """Central differences of sum(out * dy) over the outputs, in float64."""
    specs = kernel._specs(tuple(arrays.values()))
    g = kernel._trace(specs, kernel._constants({}))
    x64 = {k: (v.astype(np.float64) if np.issubdtype(v.dtype, np.floating) else v) for k, v in arrays.items()}

    def loss():
        outs = eval64(g, x64)
        return sum(float(np.sum(outs[o] * dys[o])) for o in dys)
    res = {}
    for name in wrt:
        a, d = x64[name], np.zeros(x64[name].shape)
        for i in np.ndindex(a.shape):
            keep = a[i]
            a[i] = keep + eps
            up = loss()
            a[i] = keep - eps
            down = loss()
            a[i] = keep
            d[i] = (up - down) / (2 * eps)
        res[name] = d
    return res


def out_shape(fn, *shapes):
    with TraceContext("probe") as ctx:
        xs = [ctx.input(f"a{i}", s, F32) for i, s in enumerate(shapes)]
        return tuple(fn(*xs).shape)


def unary_kernel(fn):
    @pypto.jit
    def k(x, out):
        out[:] = fn(x)
    return k


def binary_kernel(fn):
    @pypto.jit
    def k(x, y, out):
        out[:] = fn(x, y)
    return k


def close(got, want, rtol=2e-4):
    scale = max(1.0, float(np.max(np.abs(want))))
    err = float(np.max(np.abs(got.astype(np.float64) - want)))
    assert err <= rtol * scale, f"max error {err:.3g} against {scale:.3g}"


RNG = np.random.default_rng(7)


def data(shape, lo=-2.0, hi=2.0, away=0.0):
    """Uniform in [lo, hi], kept at least `away` from 0 (kinks and poles)."""
    x = RNG.uniform(lo, hi, shape)
    if away:
        x = np.where(np.abs(x) < away, np.sign(x + 1e-12) * away + x, x)
    return x.astype(np.float32)


POS = dict(lo=0.3, hi=3.0)
UNARY = [
    ("exp", pypto.exp, {}), ("log", pypto.log, POS), ("sqrt", pypto.sqrt, POS), ("rsqrt", pypto.rsqrt, POS),
    ("reciprocal", pypto.reciprocal, dict(away=0.4)), ("abs", pypto.abs, dict(away=0.05)),
    ("neg", pypto.neg, {}), ("relu", pypto.relu, dict(away=0.05)), ("sigmoid", pypto.sigmoid, {}),
    ("tanh", pypto.tanh, {}), ("silu", pypto.silu, {}), ("softplus", pypto.softplus, {}),
    ("gelu", pypto.gelu, {}), ("hardsigmoid", pypto.hardsigmoid, dict(lo=-2.5, hi=2.5)),
    ("hardswish", pypto.hardswish, dict(lo=-2.5, hi=2.5)), ("square", pypto.square, {}),
    ("expm1", pypto.expm1, {}), ("log1p", pypto.log1p, POS), ("exp2", pypto.exp2, {}), ("log2", pypto.log2, POS),
    ("log10", pypto.log10, POS), ("mish", pypto.mish, {}), ("logsigmoid", pypto.logsigmoid, {}),
    ("softsign", pypto.softsign, dict(away=0.05)), ("selu", pypto.selu, dict(away=0.05)),
    ("celu", lambda x: pypto.celu(x, 0.7), dict(away=0.05)), ("elu", pypto.elu, dict(away=0.05)),
    ("leaky_relu", lambda x: pypto.leaky_relu(x, 0.1), dict(away=0.05)), ("tanhshrink", pypto.tanhshrink, {}),
    ("sinh", pypto.sinh, {}), ("cosh", pypto.cosh, {}), ("asinh", pypto.asinh, {}),
    ("acosh", pypto.acosh, dict(lo=1.3, hi=3.0)), ("atanh", pypto.atanh, dict(lo=-0.8, hi=0.8)),
    ("floor", pypto.floor, dict(away=0.05)), ("round", pypto.round, {}), ("frac", pypto.frac, dict(away=0.05)),
    ("clamp", lambda x: pypto.clamp(x, -1.0, 0.5), {}), ("pow 3", lambda x: pypto.pow(x, 3), {}),
    ("pow 0.5", lambda x: pypto.pow(x, 0.5), POS), ("pow -1.5", lambda x: pypto.pow(x, -1.5), POS),
    ("pow 1.7", lambda x: pypto.pow(x, 1.7), POS), ("hardshrink", pypto.hardshrink, {}),
    ("softshrink", pypto.softshrink, {}), ("sign", pypto.sign, dict(away=0.05)),
    ("scalar ops", lambda x: (2.0 - x) * 3.0 / 1.5 + 1.0 - 4.0 / (x * x + 1.0), {}),
    # reductions and normalisations
    ("sum", lambda x: pypto.sum(x, dim=-1), {}), ("sum dim 0", lambda x: pypto.sum(x, dim=0, keepdim=True), {}),
    ("amax", lambda x: pypto.amax(x, dim=-1), {}), ("amin", lambda x: pypto.amin(x, dim=0), {}),
    ("mean", lambda x: pypto.mean(x, dim=-1, keepdim=True), {}), ("var", lambda x: pypto.var(x, dim=-1), {}),
    ("std", lambda x: pypto.std(x, dim=0), {}), ("prod", lambda x: pypto.prod(x, dim=-1), dict(lo=0.5, hi=1.5)),
    ("logsumexp", lambda x: pypto.logsumexp(x, dim=-1), {}), ("norm 2", lambda x: pypto.norm(x, 2, dim=-1), {}),
    ("norm 1", lambda x: pypto.norm(x, 1, dim=-1), dict(away=0.05)),
    ("norm inf", lambda x: pypto.norm(x, float("inf"), dim=-1), {}),
    ("softmax", lambda x: pypto.softmax(x, dim=-1), {}), ("softmax dim 0", lambda x: pypto.softmax(x, dim=0), {}),
    ("log_softmax", lambda x: pypto.log_softmax(x, dim=-1), {}), ("swiglu", lambda x: pypto.swiglu(x, dim=-1), {}),
    ("layernorm", lambda x: pypto.layernorm(x), {}),
    # layout
    ("transpose", lambda x: pypto.transpose(x, 0, 1) * 2.0, {}), ("reshape", lambda x: x.reshape(3, 20) + 1.0, {}),
    ("slice", lambda x: x[1:5, 2:9] * 3.0, {}), ("stepped slice", lambda x: x[:, 1::2] * x[:, 0::2], {}),
    ("expand", lambda x: pypto.expand(x[:, 0:1], 6, 4) * 2.0, {}), ("concat", lambda x: pypto.concat(
        [x, x * 2.0], dim=1), {}), ("pad", lambda x: pypto.pad(x, (1, 2)) * 1.5, {}),
    ("permute", lambda x: pypto.permute(x.reshape(2, 3, 10), 2, 0, 1) * 1.0, {}),
    ("flatten squeeze", lambda x: pypto.squeeze(x.reshape(1, 60), 0) * 2.0, {}),
    ("repeat", lambda x: pypto.repeat(x, 2, 1) * 1.0, {}), ("tril", lambda x: pypto.tril(x), {}),
    ("where", lambda x: pypto.where(x > 0.3, x * x, -x), dict(away=0.05)),
    ("masked_fill", lambda x: pypto.masked_fill(x, x < -0.5, 2.0) * x, {}),
    ("gather", lambda x: pypto.gather(x, 1, pypto.argmax(x, dim=-1, keepdim=True)), {}),
    ("topk values", lambda x: pypto.topk(x, 3)[0] * 2.0, {}),
    ("cast round trip", lambda x: pypto.cast(pypto.cast(x, pypto.DT_FP16), F32) * 1.0, {}),
]


# d/dx of element-wise ops, written out in numpy (float64): a second reference beside the differences
ANALYTIC = {
    "exp": np.exp, "log": lambda x: 1 / x, "sqrt": lambda x: 0.5 / np.sqrt(x), "rsqrt": lambda x: -0.5 * x ** -1.5,
    "reciprocal": lambda x: -1 / (x * x), "abs": np.sign, "neg": lambda x: -np.ones_like(x),
    "relu": lambda x: (x > 0).astype(float), "sigmoid": lambda x: _sig(x) * (1 - _sig(x)),
    "tanh": lambda x: 1 - np.tanh(x) ** 2, "silu": lambda x: _sig(x) * (1 + x * (1 - _sig(x))),
    "softplus": lambda x: _sig(x), "square": lambda x: 2 * x, "expm1": np.exp,
    "log1p": lambda x: 1 / (1 + x), "exp2": lambda x: np.log(2) * np.exp2(x), "log2": lambda x: 1 / (x * np.log(2)),
    "log10": lambda x: 1 / (x * np.log(10)), "softsign": lambda x: 1 / (1 + np.abs(x)) ** 2,
    "sinh": np.cosh, "cosh": np.sinh, "asinh": lambda x: 1 / np.sqrt(x * x + 1),
    "acosh": lambda x: 1 / np.sqrt(x * x - 1), "atanh": lambda x: 1 / (1 - x * x),
    "logsigmoid": lambda x: 1 - _sig(x), "tanhshrink": lambda x: np.tanh(x) ** 2,
    "elu": lambda x: np.where(x > 0, 1.0, np.exp(x)), "floor": np.zeros_like, "round": np.zeros_like,
    "frac": np.ones_like, "sign": np.zeros_like, "pow 3": lambda x: 3 * x * x, "pow 0.5": lambda x: 0.5 / np.sqrt(x),
    "pow -1.5": lambda x: -1.5 * x ** -2.5, "pow 1.7": lambda x: 1.7 * x ** 0.7,
    "clamp": lambda x: ((x > -1.0) & (x < 0.5)).astype(float),
    "leaky_relu": lambda x: np.where(x > 0, 1.0, 0.1),
}


def _sig(x):
    return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("name", sorted(ANALYTIC))
def test_elementwise_gradient_matches_its_derivative(name):
    fn, dom = next((f, d) for n, f, d in UNARY if n == name)
    x = data((6, 10), **{"lo": -2.0, "hi": 2.0, **dom})
    dy = RNG.standard_normal((6, 10)).astype(np.float32)
    got = grad(unary_kernel(fn), wrt="x")(x, np.zeros((6, 10), np.float32), cotangents={"out": dy})["x"]
    close(got, dy * ANALYTIC[name](x.astype(np.float64)))


@pytest.mark.parametrize("name,fn,dom", UNARY, ids=[u[0] for u in UNARY])
def test_op_gradient_matches_finite_differences(name, fn, dom):
    x = data((6, 10), **{"lo": -2.0, "hi": 2.0, **dom})
    k = unary_kernel(fn)
    out = np.zeros(out_shape(fn, x.shape), np.float32)
    dy = RNG.standard_normal(out.shape).astype(np.float32)
    got = grad(k, wrt="x")(x, out, cotangents={"out": dy})["x"]
    want = finite_diff(k, {"x": x, "out": out}, ["x"], {"out": dy})["x"]
    rtol = 3e-3 if name == "cast round trip" else 2e-4      # the forward rounds to fp16 there
    close(got, want, rtol)


BINARY = [
    ("add", pypto.add, {}), ("sub", pypto.sub, {}), ("mul", pypto.mul, {}), ("div", pypto.div, dict(away=0.4)),
    ("maximum", pypto.maximum, {}), ("minimum", pypto.minimum, {}),
    ("remainder", pypto.remainder, dict(lo=0.5, hi=2.0)), ("fmod", pypto.fmod, dict(lo=0.5, hi=2.0)),
    ("hypot", pypto.hypot, dict(away=0.1)), ("logaddexp", pypto.logaddexp, {}), ("rsub", pypto.rsub, {}),
    ("lerp", lambda a, b: pypto.lerp(a, b, 0.3), {}), ("addcmul", lambda a, b: pypto.addcmul(a, a, b, 0.5), {}),
    ("addcdiv", lambda a, b: pypto.addcdiv(a, a, b * b + 1.0, 2.0), {}),
    ("broadcast row", lambda a, b: a * b[0:1, :] + b[:, 3:4], {}),
    ("matmul", lambda a, b: pypto.matmul(a, b, b_trans=True), {}),
    ("matmul a_trans", lambda a, b: pypto.matmul(a, b, a_trans=True), {}),
    ("matmul both", lambda a, b: pypto.matmul(b, a, a_trans=True, b_trans=False) * 1.0, {}),
    ("batched matmul", lambda a, b: pypto.matmul(a.reshape(2, 3, 10), pypto.transpose(b, 0, 1)), {}),
    ("prelu-like", lambda a, b: pypto.where(a >= 0, a, a * b), dict(away=0.05)),
]


@pytest.mark.parametrize("name,fn,dom", BINARY, ids=[u[0] for u in BINARY])
def test_binary_gradient_matches_finite_differences(name, fn, dom):
    x, y = data((6, 10), **{"lo": -2.0, "hi": 2.0, **dom}), data((6, 10), **{"lo": -2.0, "hi": 2.0, **dom})
    if name in ("maximum", "minimum"):
        y = np.where(np.abs(x - y) < 0.05, y + 0.1, y).astype(np.float32)
    k = binary_kernel(fn)
    out = np.zeros(out_shape(fn, x.shape, y.shape), np.float32)
    dy = RNG.standard_normal(out.shape).astype(np.float32)
    got = grad(k, wrt=["x", "y"])(x, y, out, cotangents={"out": dy})
    want = finite_diff(k, {"x": x, "y": y, "out": out}, ["x", "y"], {"out": dy})
    close(got["x"], want["x"])
    close(got["y"], want["y"])


@pypto.jit
def mlp_loss(x, w1, b1, w2, target, loss):
    h = pypto.relu(pypto.matmul(x, w1) + b1)
    y = pypto.matmul(h, w2)
    d = y - target
    loss[:] = pypto.sum(pypto.sum(d * d, dim=-1, keepdim=True), dim=0) * (1.0 / d.shape[0])


def test_mlp_loss_against_numpy_backprop():
    x, t = data((16, 8)), data((16, 4))
    w1, b1, w2 = data((8, 32)) * 0.5, data((32,)) * 0.1, data((32, 4)) * 0.3
    loss = np.zeros((1,), np.float32)
    vals, g = value_and_grad(mlp_loss, wrt=["w1", "b1", "w2"])(x, w1, b1, w2, t, loss)
    # backprop written out in numpy (float64)
    z = x.astype(np.float64) @ w1 + b1
    h = np.maximum(z, 0)
    d = h @ w2 - t
    want_loss = (d * d).sum() / 16
    dd = 2 * d / 16
    dw2 = h.T @ dd
    dz = (dd @ w2.T) * (z > 0)
    np.testing.assert_allclose(vals["loss"], [want_loss], rtol=1e-5)
    np.testing.assert_allclose(loss, [want_loss], rtol=1e-5)          # written in place, as a call does
    close(g["w2"], dw2, 1e-5)
    close(g["w1"], x.T.astype(np.float64) @ dz, 1e-5)
    close(g["b1"], dz.sum(0), 1e-5)


@pypto.jit
def attention(q, k, v, out):
    p = pypto.softmax(pypto.matmul(q, k, b_trans=True) * 0.25, dim=-1)
    out[:] = pypto.matmul(p, v)


def test_attention_against_numpy_backprop():
    q, k, v = data((8, 16)), data((8, 16)), data((8, 16))
    out = np.zeros((8, 16), np.float32)
    dy = data((8, 16))
    g = grad(attention, wrt=["q", "k", "v"])(q, k, v, out, cotangents={"out": dy})
    s = q.astype(np.float64) @ k.T * 0.25
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = dy @ v.T
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * 0.25
    close(g["v"], p.T @ dy, 1e-5)
    close(g["q"], ds @ k, 1e-5)
    close(g["k"], ds.T @ q, 1e-5)


@pypto.jit
def norm_kernel(x, w, b, out):
    out[:] = pypto.layernorm(x, w, b) + pypto.rms_norm(x, w)


def test_layernorm_and_rms_norm_weights():
    x, w, b = data((4, 16)), data((16,)), data((16,))
    out = np.zeros((4, 16), np.float32)
    dy = data((4, 16))
    got = grad(norm_kernel, wrt=["x", "w", "b"])(x, w, b, out, cotangents={"out": dy})
    want = finite_diff(norm_kernel, {"x": x, "w": w, "b": b, "out": out}, ["x", "w", "b"], {"out": dy})
    for n in "xwb":
        close(got[n], want[n])


@pypto.jit
def half_kernel(x, w, out):
    out[:] = pypto.matmul(x, w, out_dtype=pypto.DT_FP32)


def test_fp16_matmul_gradients_in_fp16():
    x, w = data((16, 32)).astype(np.float16), data((32, 16)).astype(np.float16)
    out = np.zeros((16, 16), np.float32)
    dy = data((16, 16))
    g = grad(half_kernel, wrt=["x", "w"])(x, w, out, cotangents={"out": dy})
    assert g["x"].dtype == np.float16 and g["w"].dtype == np.float16
    dy16 = dy.astype(np.float16).astype(np.float64)       # the cotangent meets the fp16 operands in fp16
    np.testing.assert_allclose(g["x"], dy16 @ w.T.astype(np.float64), rtol=2e-3, atol=2e-2)
    np.testing.assert_allclose(g["w"], x.T.astype(np.float64) @ dy16, rtol=2e-3, atol=2e-2)


@pypto.jit
def scatter_kernel(x, src, idx, out, picked):
    out[:] = pypto.scatter_add(x * 2.0, 1, idx, src * src)
    picked[:] = pypto.index_select(x, 1, idx[0, :]) * 3.0


def test_scatter_add_and_gather_gradients_of_two_outputs():
    x, src = data((3, 8)), data((3, 4))
    idx = np.array([[0, 2, 2, 7], [1, 1, 5, 6], [3, 0, 4, 4]], np.int32)
    out, picked = np.zeros((3, 8), np.float32), np.zeros((3, 4), np.float32)
    dy, dp = data((3, 8)), data((3, 4))
    got = grad(scatter_kernel, wrt=["x", "src"])(x, src, idx, out, picked, cotangents={"out": dy, "picked": dp})
    want_x = 2.0 * dy.astype(np.float64)
    np.add.at(want_x, (slice(None), idx[0].astype(np.int64)), 3.0 * dp)      # duplicates accumulate
    close(got["x"], want_x)
    close(got["src"], 2.0 * src * np.take_along_axis(dy, idx.astype(np.int64), 1))
    only = grad(scatter_kernel, wrt=["x"])(x, src, idx, out, picked, cotangents={"picked": dp})["x"]
    close(only, want_x - 2.0 * dy)


def test_scalar_loss_needs_no_cotangent_and_unused_input_gets_zeros():
    @pypto.jit
    def k(x, y, loss):
        loss[:] = pypto.sum(pypto.sum(x * x, dim=-1), dim=0, keepdim=True)
    x, y = data((3, 4)), data((3, 4))
    g = grad(k, wrt=["x", "y"])(x, y, np.zeros((1,), np.float32))
    close(g["x"], 2.0 * x)
    assert not g["y"].any()


def test_backward_kernel_is_an_ordinary_kernel_at_the_forward_lines():
    G = grad(attention, wrt=["q"])
    q, k, v, out = data((8, 16)), data((8, 16)), data((8, 16)), np.zeros((8, 16), np.float32)
    G(q, k, v, out, cotangents={"out": np.ones((8, 16), np.float32)})
    jk = G.backward_kernel
    assert jk.tensor_params == ["q", "k", "v", "out", "d_out", "grad_q"]
    ck = jk.compile(*G.backward_args)
    res = ck.simulate(*G.backward_args)
    assert res.ok and res.cycles > 0
    src_lines = {n.loc.line for n in ck.traced.nodes if n.loc is not None}
    fwd_lines = {n.loc.line for n in attention._trace(attention._specs((q, k, v, out)), {}).nodes if n.loc}
    assert src_lines <= fwd_lines | {attention.sig_loc().line}   # every node names a line of the forward kernel
    assert not any(n.op == "const" and not n.dtype.is_float for n in ck.traced.nodes)
    assert sum(n.op == "matmul" for n in ck.traced.nodes) == 3       # S = Q K^T, dP = dO V^T, dQ = dS K
    assert "matmul" in ck.program.text() or "TMATMUL" in ck.program.text()


def test_def_gradient_replaces_a_rule_and_sees_the_op_arguments():
    seen = {}

    @def_gradient(pypto.exp)
    def exp_grad(x, dy):
        seen["called"] = True
        return dy * 3.0
    try:
        k = unary_kernel(pypto.exp)
        x = data((2, 4))
        g = grad(k, wrt="x")(x, np.zeros((2, 4), np.float32), cotangents={"out": np.ones((2, 4), np.float32)})
        close(g["x"], np.full((2, 4), 3.0))
        assert seen["called"]
    finally:
        del_gradient("exp")
    g = grad(k, wrt="x")(x, np.zeros((2, 4), np.float32), cotangents={"out": np.ones((2, 4), np.float32)})
    close(g["x"], np.exp(x.astype(np.float64)))


def test_def_gradient_on_a_composite_with_attributes():
    @def_gradient("leaky_relu")
    def lrelu_grad(x, dy, negative_slope):
        return pypto.where(x > 0, dy, dy * negative_slope)
    try:
        k = unary_kernel(lambda x: pypto.leaky_relu(x, 0.25))
        x = data((3, 5), away=0.05)
        g = grad(k, wrt="x")(x, np.zeros((3, 5), np.float32), cotangents={"out": np.ones((3, 5), np.float32)})
        close(g["x"], np.where(x > 0, 1.0, 0.25))
    finally:
        del_gradient("leaky_relu")


def test_gradient_through_argmax_only_is_a_located_error():
    @pypto.jit
    def k(x, out):
        i = pypto.argmax(x, dim=-1, keepdim=True)
        out[:] = pypto.cast(i, F32)
    x = data((3, 5))
    with pytest.raises(UnsupportedError) as e:
        grad(k, wrt="x")(x, np.zeros((3, 1), np.float32), cotangents={"out": np.ones((3, 1), np.float32)})
    assert "argmax" in e.value.message and "no gradient" in e.value.message
    assert e.value.loc is not None and e.value.loc.line == k.loc.line + 2


def test_gradient_through_a_comparison_only_is_a_located_error():
    @pypto.jit
    def k(x, out):
        out[:] = pypto.cast(x > 0.5, F32) * 2.0
    with pytest.raises(UnsupportedError, match="only through gt") as e:
        grad(k, wrt="x")(data((2, 3)), np.zeros((2, 3), np.float32), cotangents={"out": np.ones((2, 3), np.float32)})
    assert e.value.loc.line == k.loc.line + 2


def test_a_mask_times_x_is_differentiable_as_in_torch():
    k = unary_kernel(lambda x: pypto.cast(x > 0, F32) * x)
    x = data((3, 5), away=0.05)
    g = grad(k, wrt="x")(x, np.zeros((3, 5), np.float32), cotangents={"out": np.ones((3, 5), np.float32)})
    close(g["x"], (x > 0).astype(np.float64))


def test_errors_name_the_kernel_and_what_was_expected():
    k = unary_kernel(pypto.exp)
    x = data((2, 3))
    with pytest.raises(KernelSignatureError, match="no tensor parameter 'z'"):
        grad(k, wrt=["z"])
    with pytest.raises(KernelSignatureError, match="is not read"):
        grad(k, wrt=["out"])(x, np.zeros((2, 3), np.float32), cotangents={"out": x})
    with pytest.raises(KernelSignatureError, match="cotangent is needed"):
        grad(k, wrt="x")(x, np.zeros((2, 3), np.float32))
    with pytest.raises(KernelSignatureError, match="another shape"):
        grad(k, wrt="x")(x, np.zeros((2, 3), np.float32), cotangents={"out": np.ones((3, 2), np.float32)})
    with pytest.raises(KernelSignatureError, match="not an output"):
        grad(k, wrt="x")(x, np.zeros((2, 3), np.float32), cotangents={"x": x})

    @pypto.jit
    def ik(i, out):
        out[:] = pypto.cast(i, F32) * 2.0
    with pytest.raises(KernelSignatureError, match="not differentiable"):
        grad(ik, wrt="i")(np.ones((2, 2), np.int32), np.zeros((2, 2), np.float32),
                          cotangents={"out": np.ones((2, 2), np.float32)})
    with pytest.raises(PyptoError, match="def_gradient: no op named"):
        def_gradient("no_such_op")


# ops that produce no float from float inputs, or take no tensor input: no gradient to define
NO_GRADIENT = {"input", "const", "store", "scratch", "full", "iota", "eq", "ne", "lt", "le", "gt", "ge",
               "logical_and", "logical_or", "logical_xor", "logical_not"}


def test_every_registry_op_has_a_gradient_or_is_declared_without_one():
    """A new op gets a rule (the `grad` column), a decomposition (differentiated through), or a
    place in NO_GRADIENT here; public names are exported."""
    missing = [n for n, row in OPS.items() if row.grad is None and row.decompose is None and n not in NO_GRADIENT]
    assert not missing, f"ops without a gradient rule or decomposition: {missing}"
    assert pypto.grad is grad and pypto.value_and_grad is value_and_grad and pypto.def_gradient is def_gradient


@pypto.jit
def lookup(idx, w, x, a, out, y):
    out[:] = pypto.embedding(idx, w) * 2.0
    y[:] = pypto.prelu(x, a) + pypto.index_add(x, 1, idx, x[:, 0:5], alpha=0.5)


def test_embedding_prelu_and_index_add_gradients():
    idx = np.array([3, 0, 3, 5, 1], np.int32)            # a repeated row accumulates
    w, x, a = data((6, 4)), data((4, 6), away=0.05), data((6,))
    out, y = np.zeros((5, 4), np.float32), np.zeros((4, 6), np.float32)
    dy, dz = data((5, 4)), data((4, 6))
    got = grad(lookup, wrt=["w", "x", "a"])(idx, w, x, a, out, y, cotangents={"out": dy, "y": dz})
    want = finite_diff(lookup, {"idx": idx, "w": w, "x": x, "a": a, "out": out, "y": y}, ["w", "x", "a"],
                       {"out": dy, "y": dz})
    dw = np.zeros((6, 4))
    np.add.at(dw, idx.astype(np.int64), 2.0 * dy)
    close(got["w"], dw)
    for n in "wxa":
        close(got[n], want[n])


@pypto.jit
def encoder_layer(x, wqkv, wo, w1, w2, g1, b1, out):
    """Two-head self-attention with its residual and layernorm, then a gelu feed-forward."""
    s, d = x.shape
    h, hd = 2, d // 2
    qkv = pypto.matmul(x, wqkv)
    q, k, v = (pypto.transpose(qkv[:, i * d:(i + 1) * d].reshape(s, h, hd), 0, 1) for i in range(3))
    att = pypto.softmax(pypto.matmul(q, k, b_trans=True) * (1.0 / hd ** 0.5), dim=-1)
    o = pypto.transpose(pypto.matmul(att, v), 0, 1).reshape(s, d)
    y = pypto.layernorm(x + pypto.matmul(o, wo), g1, b1)
    out[:] = y + pypto.matmul(pypto.gelu(pypto.matmul(y, w1)), w2)


def test_a_transformer_layer_against_finite_differences():
    args = dict(x=data((4, 8)), wqkv=data((8, 24)) * 0.3, wo=data((8, 8)) * 0.3, w1=data((8, 16)) * 0.3,
                w2=data((16, 8)) * 0.3, g1=data((8,)), b1=data((8,)), out=np.zeros((4, 8), np.float32))
    dy = data((4, 8))
    wrt = ["x", "wqkv", "wo", "w1", "w2", "g1", "b1"]
    got = grad(encoder_layer, wrt=wrt)(*args.values(), cotangents={"out": dy})
    want = finite_diff(encoder_layer, args, wrt, {"out": dy})
    for n in wrt:
        close(got[n], want[n])


def test_def_gradient_of_a_registered_op_in_the_seeds_form():
    """The seeds' example: a quantizer has no useful derivative (a staircase), so its gradient is
    given by hand: dy where x > 0 (a straight-through estimator)."""
    @pypto.register_op
    def my_quantize(x, bits):
        scale = 2 ** bits - 1
        return pypto.round(x * scale) / scale

    @pypto.jit
    def k(x, out):
        out[:] = my_quantize(x, 4) * x
    x = data((4, 6), away=0.05)
    out, dy = np.zeros((4, 6), np.float32), np.ones((4, 6), np.float32)
    try:
        q = np.round(x.astype(np.float64) * 15) / 15
        g = grad(k, wrt="x")
        close(g(x, out, cotangents={"out": dy})["x"], q)       # through its body: d round = 0
        seen = []

        @pypto.def_gradient(my_quantize)
        def my_quantize_grad(x, bits, dy):
            seen.append(bits)
            return dy * (x > 0), None
        close(g(x, out, cotangents={"out": dy})["x"], q + x * (x > 0))      # the same GradFn writes anew
        assert seen == [4]
    finally:
        del_gradient("my_quantize")
        pypto.unregister_op(my_quantize)


@pypto.jit
def wide_tiles(x, y, out, *, TM: int = 8):
    pypto.set_vec_tile_shapes(TM, 2048)         # 64 KiB tiles: the forward's group fits UB
    out[:] = pypto.exp(x) * pypto.sigmoid(y)


def test_a_backward_group_that_does_not_fit_the_forward_tiles_gets_automatic_ones():
    """The backward kernel's groups hold more tiles than the forward's (the replayed forward and
    the cotangents): with 64 KiB tiles they do not fit UB, so the backward kernel is written again
    with automatic tiles; with small tiles it keeps the forward's."""
    x = data((64, 2048))
    y = np.ascontiguousarray(x[::-1])
    out = np.zeros_like(x)
    assert wide_tiles.compile(x, y, out).simulate(x, y, out).ok
    g = grad(wide_tiles, wrt=["x", "y"])
    got = g(x, y, out, cotangents={"out": np.ones_like(x)})
    assert g.backward_kernel.auto_tiles
    s = 1 / (1 + np.exp(-y.astype(np.float64)))
    close(got["x"], np.exp(x) * s)
    close(got["y"], np.exp(x) * s * (1 - s))
    g(x, y, out, cotangents={"out": np.ones_like(x)}, TM=1)
    assert not g.backward_kernel.auto_tiles
