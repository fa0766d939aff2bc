"""Binary ops of operands of different ranks and broadcast dims, against numpy (float64)."""
import numpy as np
import pytest

import pypto

SHAPES = [((8, 1), (32,)), ((32,), (8, 1)), ((8, 1), (1, 32)), ((1, 32), (8, 1)), ((3, 8, 1), (32,)),
          ((8, 1), (3, 1, 32)), ((2, 8, 1), (2, 1, 32)), ((5, 1), (1,)), ((17, 1), (100,)), ((4, 1, 1), (1, 5, 1))]


@pypto.jit
def sub(x, y, out):
    out[:] = x - y


@pypto.jit
def div_tiled(x, y, out, *, T: int = 4):
    pypto.set_vec_tile_shapes(T, 16)
    out[:] = x / y


@pytest.mark.parametrize("sa,sb", SHAPES, ids=[f"{a}-{b}" for a, b in SHAPES])
def test_operands_of_other_ranks_broadcast_as_numpy(sa, sb, rng):
    x = rng.random(sa).astype(np.float32) + 0.5
    y = rng.random(sb).astype(np.float32) + 0.5
    for kernel, want in ((sub, x.astype(np.float64) - y), (div_tiled, x.astype(np.float64) / y)):
        out = np.zeros(want.shape, np.float32)
        kernel(x, y, out)
        np.testing.assert_allclose(out, want, rtol=1e-6)
        assert kernel.compile(x, y, out).simulate(x, y, out).ok
