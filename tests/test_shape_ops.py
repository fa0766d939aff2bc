"""Shape and layout ops against numpy: stepped slices (read and written), n-D permutes, squeeze /
unsqueeze / flatten, split / chunk / narrow / unbind / select, and reshapes of strided views
(materialised by a copy that shows up in the program)."""
from __future__ import annotations

import numpy as np
import pytest

import pypto


def one_out(fn, tile=(8, 32)):
    @pypto.jit
    def k(x, out):
        if tile:
            pypto.set_vec_tile_shapes(*tile)
        r = fn(x)
        out[:] = r if r.shape == out.shape else r.reshape(out.shape)
    return k


X3 = np.arange(6 * 10 * 24, dtype=np.float32).reshape(6, 10, 24) / 7.0
CASES = {
    "step-last": (lambda x: x[:, :, 1::2] * 2.0, lambda x: x[:, :, 1::2] * 2.0),
    "step-3": (lambda x: x[:, 1:9:3, ::3] + 1.0, lambda x: x[:, 1:9:3, ::3] + 1.0),
    "step-first": (lambda x: x[::2] - x[1::2], lambda x: x[::2] - x[1::2]),
    "permute": (lambda x: pypto.permute(x, 2, 0, 1) * 1.5, lambda x: np.transpose(x, (2, 0, 1)) * 1.5),
    "permute-method": (lambda x: x.permute(1, 2, 0) + 0.5, lambda x: np.transpose(x, (1, 2, 0)) + 0.5),
    "movedim": (lambda x: pypto.movedim(x, 0, -1) * 3.0, lambda x: np.moveaxis(x, 0, -1) * 3.0),
    "T": (lambda x: x.T + 1.0, lambda x: x.T + 1.0),
    "mT": (lambda x: x.mT + 1.0, lambda x: np.swapaxes(x, -1, -2) + 1.0),
    "unsqueeze-squeeze": (lambda x: pypto.squeeze(pypto.unsqueeze(x, 1) * 2.0, 1),
                          lambda x: x * 2.0),
    "flatten": (lambda x: pypto.flatten(x, 1) * 2.0, lambda x: x.reshape(6, 240) * 2.0),
    "unflatten": (lambda x: pypto.unflatten(x, 2, (4, -1)) * 2.0, lambda x: x.reshape(6, 10, 4, 6) * 2.0),
    "narrow": (lambda x: pypto.narrow(x, 1, 3, 4) + 1.0, lambda x: x[:, 3:7] + 1.0),
    "select": (lambda x: pypto.select(x, 2, 5) * 2.0, lambda x: x[:, :, 5] * 2.0),
    "split": (lambda x: pypto.split(x, [4, 6], dim=1)[1] * 2.0, lambda x: x[:, 4:] * 2.0),
    "chunk": (lambda x: x.chunk(3, dim=2)[2] - x.chunk(3, dim=2)[0], lambda x: x[:, :, 16:] - x[:, :, :8]),
    "unbind": (lambda x: pypto.unbind(x, 0)[4] * 2.0, lambda x: x[4] * 2.0),
    "reshape-of-transpose": (lambda x: pypto.transpose(x, 0, 1).reshape(10, 144) * 2.0,
                             lambda x: np.swapaxes(x, 0, 1).reshape(10, 144) * 2.0),
    "reshape-of-slice": (lambda x: x[:, :, 4:20].reshape(6, 160) + 1.0, lambda x: x[:, :, 4:20].reshape(6, 160) + 1.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_shape_op(case, check_kernel):
    pfn, nfn = CASES[case]
    want = nfn(X3.astype(np.float64)).astype(np.float32)
    out = np.zeros(want.shape, np.float32)
    check_kernel(one_out(pfn), [X3, out], {1: want})


def test_reshape_of_a_transpose_is_a_copy_in_the_program():
    """merge-heads: [B, H, S, D] -> [B, S, H*D] after a transpose copies once (a vector group
    storing into a workspace), then reads it contiguously."""
    x = np.arange(2 * 4 * 16 * 32, dtype=np.float32).reshape(2, 4, 16, 32)

    @pypto.jit
    def merge_heads(x, out):
        b, h, s, d = x.shape
        out[:] = pypto.transpose(x, 1, 2).reshape(b, s, h * d)
    out = np.zeros((2, 16, 128), np.float32)
    ck = merge_heads.compile(x, out)
    res = ck.simulate(x, out)
    np.testing.assert_array_equal(res.outputs["out"], x.transpose(0, 2, 1, 3).reshape(2, 16, 128))
    assert res.ok
    text = ck.tensor_graph.text() if hasattr(ck, "tensor_graph") else ck.graph("tensor").text()
    assert "copy(" in text


def test_stepped_store_interleaves(check_kernel):
    """Interleaved RoPE: even and odd columns read and written with step 2."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 128)).astype(np.float32)
    c, s = (rng.standard_normal((40, 64)).astype(np.float32) for _ in range(2))

    @pypto.jit
    def rope(x, cos, sin, out):
        pypto.set_vec_tile_shapes(16, 32)
        a, b = x[:, 0::2], x[:, 1::2]
        out[:, 0::2] = a * cos - b * sin
        out[:, 1::2] = a * sin + b * cos
    want = np.empty_like(x)
    want[:, 0::2] = x[:, 0::2] * c - x[:, 1::2] * s
    want[:, 1::2] = x[:, 0::2] * s + x[:, 1::2] * c
    check_kernel(rope, [x, c, s, np.zeros_like(x)], {3: want})


def test_negative_step_is_refused_at_the_line():
    @pypto.jit
    def rev(x, out):
        out[:] = x[:, ::-1]
    with pytest.raises(pypto.UnsupportedError, match="negative step"):
        rev.compile(X3[0], np.zeros((10, 24), np.float32))


def test_expand_broadcast_to_and_repeat(check_kernel):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((20, 1)).astype(np.float32)
    y = rng.standard_normal((1, 40)).astype(np.float32)

    @pypto.jit
    def k(x, y, o1, o2, o3, o4):
        pypto.set_vec_tile_shapes(8, 16)
        o1[:] = x.expand(20, 40)
        o2[:] = pypto.broadcast_to(y, (3, 20, 40)) * 2.0
        o3[:] = y.repeat(2, 3)
        o4[:] = x.expand(-1, 7) + y[:, 0:7]
    outs = [np.zeros(s, np.float32) for s in ((20, 40), (3, 20, 40), (2, 120), (20, 7))]
    check_kernel(k, [x, y, *outs], {2: np.broadcast_to(x, (20, 40)), 3: np.broadcast_to(y, (3, 20, 40)) * 2,
                                    4: np.tile(y, (2, 3)), 5: x + y[:, 0:7]})
