"""Ops whose result depends on where a tile is (tril / triu, iota by rows and by columns) or that
read GM by index (index_select, embedding, gather, one_hot), in tasks long enough for `select` and
`l1_reuse` to copy tasks and tiles from alike ones (teach's 4 AIV cores, tiles of 2 rows): the values
numpy gives.  The fuzzer generates none of these ops; `select` once copied an iota loop's tasks, each
copy running its representative's rows.  Each kernel either copies (its twins are used) or its loop
says its iterations move more than GM windows (`NodeLoop.windows_only`) and copies nothing."""
from __future__ import annotations

import numpy as np
import pytest

import pypto
from pypto.compiler import schedule
from pypto.ir.tile import LoopPart

M, N = 2048, 64
F32, I32 = pypto.DT_FP32, pypto.DT_INT32


@pypto.jit
def _tril(x, out):
    pypto.set_vec_tile_shapes(2, 64)
    out[:] = pypto.tril(x)


@pypto.jit
def _triu(x, out):
    pypto.set_vec_tile_shapes(2, 64)
    out[:] = pypto.triu(x, 1)


@pypto.jit
def _iota_columns(x, out):
    pypto.set_vec_tile_shapes(2, 64)
    out[:] = x + pypto.arange(64, dtype=F32).reshape(1, 64)


@pypto.jit
def _iota_rows(x, out):
    m, _ = x.shape
    pypto.set_vec_tile_shapes(4, 32)
    out[:] = x * pypto.arange(m, dtype=F32).reshape(m, 1)


@pypto.jit
def _index_select(x, i, out):
    pypto.set_vec_tile_shapes(2, 64)
    out[:] = pypto.index_select(x, 0, i)


@pypto.jit
def _embedding(x, i, out):
    pypto.set_vec_tile_shapes(2, 64)
    out[:] = pypto.embedding(i, x)


@pypto.jit
def _gather(x, i, out):
    pypto.set_vec_tile_shapes(2, 64)
    out[:] = pypto.gather(x, 1, i)


@pypto.jit
def _one_hot(i, out):
    pypto.set_vec_tile_shapes(2, 64)
    out[:] = pypto.one_hot(i, 64)


def _cases():
    rng = np.random.default_rng(0)
    x = rng.random((M, N), dtype=np.float32)
    rows = rng.integers(0, M, M).astype(np.int32)
    cols = rng.integers(0, N, (M, N)).astype(np.int32)
    labels = rng.integers(0, N, M).astype(np.int32)
    return [
        ("tril", _tril, (x,), np.tril(x)),
        ("triu", _triu, (x,), np.triu(x, 1)),
        ("iota columns", _iota_columns, (x,), x + np.arange(N, dtype=np.float32)[None]),
        ("iota rows", _iota_rows, (x,), x * np.arange(M, dtype=np.float32)[:, None]),
        ("index_select", _index_select, (x, rows), x[rows]),
        ("embedding", _embedding, (x, rows), x[rows]),
        ("gather", _gather, (x, cols), np.take_along_axis(x, cols, 1)),
        ("one_hot", _one_hot, (labels,), np.eye(N, dtype=np.int32)[labels]),
    ]


CASES = _cases()


@pytest.mark.parametrize("name,kern,args,want", CASES, ids=[c[0] for c in CASES])
def test_long_tasks_of_positional_ops_compute_numpys_values(name, kern, args, want, monkeypatch):
    copies = []
    with_windows = schedule._Rep.with_windows
    monkeypatch.setattr(schedule._Rep, "with_windows", lambda self, gms: copies.append(1) or with_windows(self, gms))
    out = np.zeros_like(want)
    kern.cache_clear()
    ck = kern.compile(*args, out, machine="teach", snapshots=True)
    g = dict(ck.snapshots)["wavefronts"]
    loops = [p[0] for p in getattr(g.tiles, "parts", ()) if isinstance(p, LoopPart)]
    assert max(len(t.nodes) for t in g.tasks) >= schedule._Twins.MIN_OPS      # (long enough)
    assert copies or not all(loop.windows_only for loop in loops)       # copied, or may not be
    res = ck.simulate(*args, out, mode="functional")
    assert np.array_equal(res.outputs["out"], want)
    assert res.ok
