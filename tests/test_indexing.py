"""Indexing ops (gather, take_along_dim, index_select, embedding, scatter, scatter_add, index_add,
topk) against numpy written here: fp32 and fp16 values, tail tiles, duplicate indices, indices out
of range in checked mode, and a mixture-of-experts router (softmax, top-2, per-expert counts and
weights accumulated with scatter_add)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import pypto

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from kernels import moe_router  # noqa: E402  (softmax, top-2, scatter_add: the benchmarks' router)

RNG = np.random.default_rng(23)
DTYPES = [np.float32, np.float16]


def _x(shape, dtype):
    return RNG.standard_normal(shape).astype(dtype)


def _topk(x, k, largest=True):
    """numpy topk along the last dim, ties to the lowest index (as torch): a stable argsort."""
    order = np.argsort(-x if largest else x, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, order, -1), order.astype(np.int32)


# --- gathers

@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_along_rows_with_tail_tiles(check_kernel, dtype):
    x = _x((20, 40), dtype)
    idx = RNG.integers(0, 20, (13, 37)).astype(np.int32)      # smaller than x off dim 0 (torch allows it)

    @pypto.jit
    def k(x, idx, out):
        pypto.set_vec_tile_shapes(8, 16)
        out[:] = pypto.gather(x, 0, idx) * 2.0
    want = np.take_along_axis(x[:, :37], idx, 0) * 2
    check_kernel(k, [x, idx, np.zeros((13, 37), dtype)], {2: want})


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_along_the_last_dim_of_a_computed_value(check_kernel, dtype):
    x = _x((3, 10, 24), dtype)
    idx = RNG.integers(0, 24, (3, 10, 5)).astype(np.int32)

    @pypto.jit
    def k(x, idx, out):
        pypto.set_vec_tile_shapes(4, 16)
        y = pypto.exp(x)                       # in GM before the gather reads it
        out[:] = pypto.gather(y, -1, idx) + 1.0
    want = np.take_along_axis(np.exp(x.astype(np.float64)), idx, -1) + 1
    check_kernel(k, [x, idx, np.zeros((3, 10, 5), dtype)], {2: want.astype(dtype)})


def test_take_along_dim_broadcasts_the_index(check_kernel):
    x = _x((16, 30), np.float32)
    idx = RNG.integers(0, 30, (1, 4)).astype(np.int32)

    @pypto.jit
    def k(x, idx, out, flat):
        out[:] = pypto.take_along_dim(x, idx, 1)
        flat[:] = x.take_along_dim(idx)                 # (the tensor method)
    want = np.take_along_axis(x, np.broadcast_to(idx, (16, 4)), 1)
    check_kernel(k, [x, idx, np.zeros((16, 4), np.float32), np.zeros((4,), np.float32)],
                 {2: want, 3: x.reshape(-1)[idx.reshape(-1)]})


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_select_rows_and_columns(check_kernel, dtype):
    x = _x((33, 20), dtype)
    rows = np.array([5, 0, 32, 5, 17, 9, 9], np.int32)
    cols = RNG.integers(0, 20, 11).astype(np.int32)

    @pypto.jit
    def k(x, rows, cols, a, b):
        pypto.set_vec_tile_shapes(4, 16)
        a[:] = pypto.index_select(x, 0, rows)
        b[:] = x.index_select(1, cols) * 3.0
    check_kernel(k, [x, rows, cols, np.zeros((7, 20), dtype), np.zeros((33, 11), dtype)],
                 {3: x[rows], 4: x[:, cols] * 3})


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_lookup(check_kernel, dtype):
    weight = _x((50, 24), dtype)
    tokens = RNG.integers(0, 50, (2, 9)).astype(np.int32)

    @pypto.jit
    def k(tokens, weight, out):
        out[:] = pypto.embedding(tokens, weight)
    check_kernel(k, [tokens, weight, np.zeros((2, 9, 24), dtype)], {2: weight[tokens]})


# --- scatters

@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_add_accumulates_duplicates_across_tiles_and_tasks(check_kernel, dtype):
    x = _x((12, 40), dtype)
    src = _x((30, 40), dtype)
    idx = RNG.integers(0, 12, (30, 40)).astype(np.int32)       # many duplicates per target

    @pypto.jit
    def k(x, src, idx, out):
        pypto.set_vec_tile_shapes(8, 16)                        # 4 x 3 tiles: several tasks add into one row
        out[:] = pypto.scatter_add(x, 0, idx, src)
    want = x.astype(np.float64)
    np.add.at(want, (idx, np.arange(40)[None, :]), src.astype(np.float64))
    check_kernel(k, [x, src, idx, np.zeros_like(x)], {3: want.astype(dtype)},
                 **({"rtol": 1e-2, "atol": 2e-2} if dtype == np.float16 else {}))


def test_scatter_add_in_checked_mode_has_no_race(rng):
    x = np.zeros((6, 16), np.float32)
    src = rng.standard_normal((40, 16)).astype(np.float32)
    idx = rng.integers(0, 6, (40, 16)).astype(np.int32)

    @pypto.jit
    def k(x, src, idx, out):
        pypto.set_vec_tile_shapes(4, 16)
        out[:] = pypto.scatter_add(x, 0, idx, src)
    out = np.zeros_like(x)
    ck = k.compile(x, src, idx, out)
    assert sum(t.core_type == "AIV" for t in ck.program.tasks) > 2
    ops = {i.op for t in ck.program.tasks for i in t.instrs}
    assert "MSCATTER" in ops
    res = ck.simulate(x, src, idx, out, checked=True)
    want = x.copy()
    np.add.at(want, (idx, np.arange(16)[None, :]), src)
    np.testing.assert_allclose(res.outputs["out"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_writes_the_values(check_kernel, dtype):
    x = _x((10, 24), dtype)
    src = _x((6, 30), dtype)                                    # larger than the index: src[:6, :24] is read
    idx = np.stack([RNG.permutation(10)[:6] for _ in range(24)], 1).astype(np.int32)   # no duplicates

    @pypto.jit
    def k(x, src, idx, out, orig):
        y = x * 1.0
        out[:] = pypto.scatter(y, 0, idx, src)
        orig[:] = y + 0.0                                      # the scattered-into value stays as it was
    want = x.copy()
    np.put_along_axis(want, idx, src[:6, :24], 0)
    check_kernel(k, [x, src, idx, np.zeros_like(x), np.zeros_like(x)], {3: want, 4: x})


def test_scatter_of_a_number_and_chained_scatters(check_kernel):
    x = _x((8, 16), np.float32)
    idx = np.stack([RNG.permutation(16)[:3] for _ in range(8)]).astype(np.int32)
    idx2 = RNG.integers(0, 16, (8, 5)).astype(np.int32)
    v = _x((8, 5), np.float32)

    @pypto.jit
    def k(x, idx, idx2, v, out):
        y = pypto.scatter(x, 1, idx, value=-1.0)
        out[:] = y.scatter_add(1, idx2, v)
    want = x.copy()
    np.put_along_axis(want, idx, -1.0, 1)
    np.add.at(want, (np.arange(8)[:, None], idx2), v)
    check_kernel(k, [x, idx, idx2, v, np.zeros_like(x)], {4: want})


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_add_with_alpha(check_kernel, dtype):
    x = _x((9, 20), dtype)
    idx = np.array([3, 0, 3, 8, 3], np.int32)
    source = _x((9, 5), dtype)

    @pypto.jit
    def k(x, idx, source, out):
        pypto.set_vec_tile_shapes(4, 16)
        out[:] = pypto.index_add(x, 1, idx, source, alpha=0.5)
    want = x.astype(np.float64)
    np.add.at(want.T, idx, 0.5 * source.astype(np.float64).T)
    check_kernel(k, [x, idx, source, np.zeros_like(x)], {3: want.astype(dtype)},
                 **({"rtol": 5e-3, "atol": 5e-3} if dtype == np.float16 else {}))


def test_int_counts_with_scatter_add(check_kernel):
    idx = RNG.integers(0, 7, (1, 50)).astype(np.int32)

    @pypto.jit
    def k(idx, counts):
        counts[:] = pypto.reshape(pypto.scatter_add(pypto.zeros(1, 7, dtype=pypto.DT_INT32), 1, idx,
                                                    pypto.ones(1, 50, dtype=pypto.DT_INT32)), [7])
    check_kernel(k, [idx, np.zeros(7, np.int32)], {1: np.bincount(idx[0], minlength=7).astype(np.int32)})


# --- out of range, int64

def _oob_kernels():
    @pypto.jit
    def g(x, idx, out):
        out[:] = pypto.gather(x, 1, idx)            # OOB-GATHER

    @pypto.jit
    def s(x, idx, src, out):
        out[:] = pypto.scatter_add(x, 1, idx, src)  # OOB-SCATTER
    return g, s


def test_indices_out_of_range_checked_and_unchecked():
    g, s = _oob_kernels()
    x = _x((4, 10), np.float32)
    idx = np.array([[0, 3], [9, 10], [1, 2], [-1, 4]], np.int32)
    src = _x((4, 2), np.float32)
    out = np.zeros((4, 2), np.float32)
    ck = g.compile(x, idx, out)
    with pytest.raises(pypto.SimulationError, match="out of range") as e:
        ck.simulate(x, idx, out, checked=True)
    assert "OOB-GATHER" in e.value.loc.source_line()
    res = ck.simulate(x, idx, out)                  # unchecked: clipped into [0, n)
    np.testing.assert_array_equal(res.outputs["out"], np.take_along_axis(x, np.clip(idx, 0, 9), 1))
    assert res.check["out"]["ok"]

    out2 = np.zeros_like(x)
    ck = s.compile(x, idx, src, out2)
    with pytest.raises(pypto.SimulationError, match="out of range") as e:
        ck.simulate(x, idx, src, out2, checked=True)
    assert "OOB-SCATTER" in e.value.loc.source_line()
    res = ck.simulate(x, idx, src, out2)            # unchecked: those elements are dropped
    want = x.copy()
    ok = (idx >= 0) & (idx < 10)
    np.add.at(want, (np.broadcast_to(np.arange(4)[:, None], idx.shape)[ok], idx[ok]), src[ok])
    np.testing.assert_allclose(res.outputs["out"], want, rtol=1e-6)
    assert res.check["out"]["ok"]


def test_int64_indices_are_refused_with_a_hint():
    g, _ = _oob_kernels()
    x = _x((4, 10), np.float32)
    with pytest.raises(pypto.PyptoError) as e:
        g(x, np.zeros((4, 2), np.int64), np.zeros((4, 2), np.float32))
    assert e.value.hint


def test_float_index_is_refused():
    @pypto.jit
    def k(x, idx, out):
        out[:] = pypto.gather(x, 1, idx)
    with pytest.raises(pypto.DTypeError, match="int32"):
        k(_x((4, 10), np.float32), np.zeros((4, 2), np.float32), np.zeros((4, 2), np.float32))


# --- topk and the router

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("largest", [True, False])
def test_topk_with_ties_to_the_lowest_index(check_kernel, dtype, largest):
    x = np.round(_x((18, 24), np.float32) * 2).astype(dtype)    # many ties
    x[3] = 1.0                                                  # a row of equal values
    x[4, :5] = -np.inf if largest else np.inf

    @pypto.jit
    def k(x, vals, idx):
        pypto.set_vec_tile_shapes(8, 24)
        v, i = pypto.topk(x, 3, largest=largest)
        vals[:] = v
        idx[:] = i
    wv, wi = _topk(x, 3, largest)
    check_kernel(k, [x, np.zeros((18, 3), dtype), np.zeros((18, 3), np.int32)], {1: wv, 2: wi})


def test_topk_of_bf16(check_kernel):
    """(Found by the fuzzer.) The reference of topk's rounds took bf16 for an integer dtype
    (numpy counts it as neither) and raised a ValueError in the check."""
    import ml_dtypes
    x = np.round(_x((6, 16), np.float32) * 4).astype(ml_dtypes.bfloat16)     # ties too

    @pypto.jit
    def k(x, vals, idx):
        v, i = pypto.topk(x, 2)
        vals[:] = v
        idx[:] = i
    wv, wi = _topk(x.astype(np.float32), 2)
    check_kernel(k, [x, np.zeros((6, 2), ml_dtypes.bfloat16), np.zeros((6, 2), np.int32)],
                 {1: wv.astype(ml_dtypes.bfloat16), 2: wi})


@pytest.mark.parametrize("largest", [True, False])
def test_topk_ranks_a_nan_first_at_its_index(largest):
    """(Found by the fuzzer.) A round whose extreme was a NaN matched no element: its index was
    n, past the end of the dim (a gather with it read out of range).  A NaN now ranks first, the
    lowest index first, in range (torch ranks it first for largest=True)."""
    x = (np.arange(32, dtype=np.float32).reshape(4, 8) % 5)
    x[1, 6] = np.nan
    x[2, [2, 5]] = np.nan
    x[3, :] = np.nan

    @pypto.jit
    def k(x, vals, idx):
        v, i = pypto.topk(x, 3, largest=largest)
        vals[:] = v
        idx[:] = i
    vals, idx = np.zeros((4, 3), np.float32), np.zeros((4, 3), np.int32)
    res = k.compile(x, vals, idx).simulate(x, vals, idx)
    assert res.ok
    got = res.outputs["idx"].tolist()
    assert got[0] == ([4, 3, 2] if largest else [0, 5, 1])
    assert got[1] == ([6, 1, 0] if largest else [6, 2, 7])
    assert got[2] == ([2, 5, 3] if largest else [2, 5, 4])
    assert got[3] == [0, 1, 2]
    v = res.outputs["vals"]
    assert np.isnan(v[1, 0]) and np.isnan(v[2, :2]).all() and np.isnan(v[3]).all() and not np.isnan(v[0]).any()


def test_topk_along_dim_0_of_ints(check_kernel):
    x = RNG.integers(-5, 5, (12, 7)).astype(np.int32)

    @pypto.jit
    def k(x, vals, idx):
        v, i = pypto.topk(x, 4, dim=0)
        vals[:] = v
        idx[:] = i
    wv, wi = _topk(x.T, 4)
    check_kernel(k, [x, np.zeros((4, 7), np.int32), np.zeros((4, 7), np.int32)], {1: wv.T, 2: wi.T})


def _np_router(x, w, k=2):
    logits = x.astype(np.float64) @ w.astype(np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    vals, idx = _topk(p, k)
    vals = vals / vals.sum(-1, keepdims=True)
    weights = np.zeros(w.shape[1])
    np.add.at(weights, idx.reshape(-1), vals.reshape(-1))
    return weights, np.bincount(idx.reshape(-1), minlength=w.shape[1]).astype(np.int32)


def test_moe_router(check_kernel):
    x = _x((48, 32), np.float32)
    w = _x((32, 8), np.float32)
    wants = _np_router(x, w)
    res = check_kernel(moe_router, [x, w, np.zeros(8, np.float32), np.zeros(8, np.int32)], {2: wants[0], 3: wants[1]},
                       rtol=1e-4, atol=1e-5)
    assert res.ok
    assert int(wants[1].sum()) == 96


def test_moe_router_checked_and_timed():
    x = _x((40, 16), np.float32)
    w = _x((16, 6), np.float32)
    out = [np.zeros(6, np.float32), np.zeros(6, np.int32)]
    ck = moe_router.compile(x, w, *out)
    res = ck.simulate(x, w, *out, checked=True)
    wants = _np_router(x, w)
    np.testing.assert_allclose(res.outputs["weights"], wants[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(res.outputs["counts"], wants[1])
    assert res.cycles > 0
