"""The seeds' forms over the Tile tier: `x.to_tile(shape=...)` / `x.to_tile(auto_shape=True)`,
`pypto.merge_tiles` and `pypto.tile_conv2d`, against numpy, with tails, in tile- and block-level
kernels, and their errors at the user's line."""
from __future__ import annotations

import os

import numpy as np
import pytest

import pypto
from common import marker_line

T = pypto.tile
THIS = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    return marker_line(THIS, f"# <F:{marker}>")


@pypto.jit(level="tile")
def exp_tiles(x, out, *, TM: int = 16, TN: int = 64):
    pypto.merge_tiles([(idx, T.texp(t)) for idx, t in x.to_tile(shape=(TM, TN))], out)


@pypto.jit(level="tile")
def double_auto(x, out):
    for idx, t in x.to_tile(auto_shape=True):
        pypto.merge_tiles({idx: T.tmuls(t, 2.0)}, out)


@pypto.jit(level="tile")
def conv(x, w, out, *, TM: int = 8):
    kh = w.shape[0]
    for idx, view in out.to_tile(shape=(TM, out.shape[1]), load=False):
        i, rows = idx[0], view.shape[0]
        T.tstore(view, pypto.tile_conv2d(x[i:i + rows + kh - 1, :], w))


@pypto.jit(level="block")
def block_softmax(x, out, *, TM: int = 16):
    """A block-level kernel with the forms: one task per tile."""
    for idx, view in x.to_tile(shape=(TM, x.shape[1]), load=False):
        with pypto.block.task("AIV"):
            t = T.tload(view)
            e = T.texp(T.trowexpandsub(t, T.trowmax(t)))
            pypto.merge_tiles([(idx, T.trowexpanddiv(e, T.trowsum(e)))], out)


def test_to_tile_and_merge_with_tails_in_both_dims(rng):
    x = rng.standard_normal((50, 200)).astype(np.float32)
    out = np.zeros_like(x)
    ck = exp_tiles.compile(x, out)
    res = ck.simulate(x, out)
    assert res.ok, res.check
    np.testing.assert_allclose(res.outputs["out"], np.exp(x), rtol=1e-6)
    info, = ck.tile_graph.groups
    assert (info.tile, info.n_outer) == ((16, 64), 16)
    assert {n.valid for n in ck.tile_graph.nodes if n.op == "TLOAD"} == {(16, 64), (16, 8), (2, 64), (2, 8)}


def test_auto_shape_full_rows_that_fit_ub_double_buffered(rng):
    x = rng.standard_normal((1000, 512)).astype(np.float32)
    out = np.zeros_like(x)
    ck = double_auto.compile(x, out)
    res = ck.simulate(x, out)
    assert res.ok, res.check
    np.testing.assert_array_equal(res.outputs["out"], 2 * x)
    info, = ck.tile_graph.groups
    # 192 KiB / (2 buffers x 2 live tiles) = 48 KiB: 24 rows of 2 KiB, a power of two: 16
    assert info.tile == (16, 512) and info.n_outer == 63
    small = np.ones((5, 64), np.float32)
    assert double_auto.compile(small, np.zeros_like(small)).tile_graph.groups[0].tile == (5, 64)
    wide = np.ones((4, 65536), np.float32)                 # one row is 256 KiB: part of a row
    assert double_auto.compile(wide, np.zeros_like(wide)).tile_graph.groups[0].tile == (1, 8192)


def test_tile_conv2d_against_numpy(rng):
    x = rng.standard_normal((20, 34)).astype(np.float32)
    w = rng.standard_normal((3, 3)).astype(np.float32)
    out = np.zeros((18, 32), np.float32)
    ck = conv.compile(x, w, out)
    res = ck.simulate(x, w, out)
    assert res.ok, res.check
    want = sum(x[a:a + 18, b:b + 32].astype(np.float64) * w[a, b] for a in range(3) for b in range(3))
    np.testing.assert_allclose(res.outputs["out"], want, rtol=1e-5, atol=1e-5)
    ops = [n.op for n in ck.tile_graph.nodes if n.outer == 0]
    assert ops.count("TROWEXPANDMUL") == 9 and ops.count("TADD") == 8


def test_tile_conv2d_keeps_an_infinity_where_it_lands(rng):
    """An inf in x spreads only to the outputs whose window holds it (the weight columns were
    once made as rowmax(x) * 0: nan for a row with an inf, and every output of the row nan)."""
    x = rng.standard_normal((20, 34)).astype(np.float32)
    x[5, 10] = np.inf
    w = np.abs(rng.standard_normal((3, 3))).astype(np.float32) + 0.1     # positive: inf * w stays +inf
    out = np.zeros((18, 32), np.float32)
    got = conv.compile(x, w, out).simulate(x, w, out).outputs["out"]
    with np.errstate(invalid="ignore"):
        want = sum(x[a:a + 18, b:b + 32].astype(np.float64) * w[a, b] for a in range(3) for b in range(3))
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_forms_in_a_block_level_kernel(rng):
    x = rng.standard_normal((40, 128)).astype(np.float32)
    out = np.zeros_like(x)
    ck = block_softmax.compile(x, out)
    res = ck.simulate(x, out)
    assert res.ok, res.check
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(res.outputs["out"], e / e.sum(1, keepdims=True), rtol=1e-5)
    assert len(ck.block_graph) == 3 and {t.core_type for t in ck.block_graph.tasks} == {"AIV"}


@pypto.jit(level="tile")
def no_shape(x, out):
    for idx, t in x.to_tile():   # <F:no-shape>
        T.tstore(out[0:1, :], t)


@pypto.jit(level="tile")
def conv_of_tile(x, w, out):
    t = T.tload(x[0:10, :])
    T.tstore(out[0:8, :], pypto.tile_conv2d(t, w))   # <F:conv-tile>


@pypto.jit(level="tile")
def merge_tensor(x, out):
    pypto.merge_tiles([((0, 0), x[0:16, :])], out)   # <F:merge>


@pypto.jit
def tensor_level(x, out):
    out[:] = x
    x.to_tile(shape=(16, 16))   # <F:tensor-level>


CASES = [(no_shape, "no-shape", "auto_shape"), (conv_of_tile, "conv-tile", "not a tile"),
         (merge_tensor, "merge", "(offsets, tile) pairs"), (tensor_level, "tensor-level", 'level="tile"')]


@pytest.mark.parametrize("kernel, marker, says", CASES, ids=[c[1] for c in CASES])
def test_errors_point_at_the_users_line(kernel, marker, says):
    x = np.ones((64, 64), np.float32)
    args = [x, np.ones((3, 3), np.float32)] if kernel is conv_of_tile else [x]
    with pytest.raises(pypto.UnsupportedError) as ei:
        kernel.compile(*args, np.zeros_like(x))
    err = ei.value
    assert err.loc is not None and os.path.abspath(err.loc.file) == THIS, str(err)
    assert err.loc.line == line_of(marker), str(err)
    assert says in str(err), str(err)
