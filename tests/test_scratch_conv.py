"""Tensors written inside a kernel (x[region] = v on a value of the kernel, concat, stack, pad)
and conv2d with stride, padding, dilation and groups, against numpy written here."""
from __future__ import annotations

import numpy as np
import pytest

import pypto

RNG = np.random.default_rng(11)
X = RNG.standard_normal((20, 40)).astype(np.float32)
Y = RNG.standard_normal((20, 24)).astype(np.float32)


def test_concat_of_computed_values(check_kernel):
    @pypto.jit
    def k(x, y, out):
        pypto.set_vec_tile_shapes(8, 32)
        out[:] = pypto.concat([x * 2.0, y + 1.0], dim=1) * 3.0
    check_kernel(k, [X, Y, np.zeros((20, 64), np.float32)], {2: np.concatenate([X * 2, Y + 1], 1) * 3})


def test_cat_of_inputs_along_rows_and_stack(check_kernel):
    @pypto.jit
    def k(x, out1, out2):
        out1[:] = pypto.cat([x, x[0:4]], dim=0) + 1.0
        out2[:] = pypto.stack([x, x * 2.0], dim=1)
    want1 = np.concatenate([X, X[0:4]], 0) + 1
    want2 = np.stack([X, X * 2], axis=1)
    check_kernel(k, [X, np.zeros((24, 40), np.float32), np.zeros((20, 2, 40), np.float32)], {1: want1, 2: want2})


def test_pad_with_a_value(check_kernel):
    @pypto.jit
    def k(x, out):
        out[:] = pypto.pad(x, (1, 2, 3, 0), value=-1.0) + 0.5
    want = np.pad(X, ((3, 0), (1, 2)), constant_values=-1.0) + 0.5
    check_kernel(k, [X, np.zeros(want.shape, np.float32)], {1: want})


def test_writes_into_a_value_happen_in_order_and_leave_the_value_alone(check_kernel):
    """A KV-cache style update: later writes over earlier ones; the original stays readable."""
    kn = RNG.standard_normal((20, 4)).astype(np.float32)

    @pypto.jit
    def kv(x, knew, out, orig):
        cache = x * 1.0
        before = cache
        cache[:, 5:9] = knew
        cache[:, 7:8] = knew[:, 0:1] * 2.0
        out[:] = cache + x
        orig[:] = before * 1.0 if False else x * 1.0
    w = X.copy()
    w[:, 5:9] = kn
    w[:, 7:8] = kn[:, 0:1] * 2
    check_kernel(kv, [X, kn, np.zeros_like(X), np.zeros_like(X)], {2: w + X, 3: X})


def test_write_into_zeros_scratch(check_kernel):
    @pypto.jit
    def k(x, out):
        buf = pypto.zeros(20, 64)
        buf[:, 0::2] = x[:, 0:32]
        out[:] = buf + 1.0
    want = np.zeros((20, 64), np.float32)
    want[:, 0::2] = X[:, 0:32]
    check_kernel(k, [X, np.zeros((20, 64), np.float32)], {1: want + 1})


def _ref_conv(x, w, stride, padding, dilation, groups):
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    f, cg, kh, kw = w.shape
    s, p, d = stride, padding, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    oh, ow = (h + 2 * p - d * (kh - 1) - 1) // s + 1, (wd + 2 * p - d * (kw - 1) - 1) // s + 1
    out = np.zeros((n, f, oh, ow))
    fg = f // groups
    for fo in range(f):
        g = fo // fg
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, i * d:i * d + s * (oh - 1) + 1:s, j * d:j * d + s * (ow - 1) + 1:s]
                out[:, fo] += np.einsum("nchw,c->nhw", patch, w[fo, :, i, j])
    return out


@pytest.mark.parametrize("c,f,groups,stride,padding,dilation", [
    (8, 16, 1, 2, 1, 1), (8, 16, 1, 1, 0, 1), (8, 8, 8, 1, 1, 1), (8, 16, 2, 1, 0, 2), (16, 16, 1, 2, 0, 1)],
    ids=["stride2-pad1", "plain", "depthwise", "groups2-dilation2", "stride2"])
def test_conv2d(c, f, groups, stride, padding, dilation, check_kernel):
    x = RNG.standard_normal((2, c, 12, 12)).astype(np.float16)
    w = (RNG.standard_normal((f, c // groups, 3, 3)) * 0.3).astype(np.float16)
    want = _ref_conv(x, w, stride, padding, dilation, groups)

    @pypto.jit
    def k(x, w, out):
        out[:] = pypto.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    check_kernel(k, [x, w, np.zeros(want.shape, np.float16)], {2: want.astype(np.float16)}, rtol=3e-3, atol=3e-3)


def test_conv2d_nhwc_with_bias(check_kernel):
    x = RNG.standard_normal((1, 10, 10, 8)).astype(np.float16)
    w = (RNG.standard_normal((3, 3, 8, 16)) * 0.3).astype(np.float16)
    b = RNG.standard_normal(16).astype(np.float16)
    want = _ref_conv(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), 2, 1, 1, 1).transpose(0, 2, 3, 1) + b

    @pypto.jit
    def k(x, w, b, out):
        out[:] = pypto.conv2d(x, w, b, stride=2, padding=1, layout="NHWC")
    check_kernel(k, [x, w, b, np.zeros(want.shape, np.float16)], {3: want.astype(np.float16)}, rtol=3e-3, atol=3e-3)
