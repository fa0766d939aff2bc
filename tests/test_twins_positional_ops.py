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

from common import unary_kernel

M, N = 2048, 64
F32 = pypto.DT_FP32


def _indexed(fn):
    """A kernel `out[:] = fn(x, i)` of 2-row tiles (`common.unary_kernel`, with an index operand)."""
    @pypto.jit
    def indexed(x, i, out):
        pypto.set_vec_tile_shapes(2, 64)
        out[:] = fn(x, i)
    return indexed


def _rows_times_iota(x):
    m = x.shape[0]
    return x * pypto.arange(m, dtype=F32).reshape(m, 1)


def _cases():
    rng = np.random.default_rng(0)
    x = rng.random((M, N), dtype=np.float32)
    rows = rng.integers(0, M, M).astype(np.int32)
    cols = rng.integers(0, N, (M, N)).astype(np.int32)
    labels = rng.integers(0, N, M).astype(np.int32)
    rows_of_2 = dict(TM=2, TN=64)
    return [
        ("tril", unary_kernel(pypto.tril), (x,), rows_of_2, np.tril(x)),
        ("triu", unary_kernel(lambda a: pypto.triu(a, 1)), (x,), rows_of_2, np.triu(x, 1)),
        ("iota columns", unary_kernel(lambda a: a + pypto.arange(N, dtype=F32).reshape(1, N)), (x,), rows_of_2,
         x + np.arange(N, dtype=np.float32)[None]),
        ("iota rows", unary_kernel(_rows_times_iota), (x,), dict(TM=4, TN=32),
         x * np.arange(M, dtype=np.float32)[:, None]),
        ("index_select", _indexed(lambda a, i: pypto.index_select(a, 0, i)), (x, rows), {}, x[rows]),
        ("embedding", _indexed(lambda a, i: pypto.embedding(i, a)), (x, rows), {}, x[rows]),
        ("gather", _indexed(lambda a, i: pypto.gather(a, 1, i)), (x, cols), {}, np.take_along_axis(x, cols, 1)),
        ("one_hot", unary_kernel(lambda a: pypto.one_hot(a, N)), (labels,), rows_of_2,
         np.eye(N, dtype=np.int32)[labels]),
    ]


CASES = _cases()


@pytest.mark.parametrize("name,kern,args,consts,want", CASES, ids=[c[0] for c in CASES])
def test_long_tasks_of_positional_ops_compute_numpys_values(name, kern, args, consts, want, monkeypatch):
    copies = []
    with_windows = schedule._Rep.with_windows
    monkeypatch.setattr(schedule._Rep, "with_windows", lambda self, gms: copies.append(1) or with_windows(self, gms))
    out = np.zeros_like(want)
    kern.cache_clear()
    ck = kern.compile(*args, out, machine="teach", snapshots=True, **consts)
    g = dict(ck.snapshots)["wavefronts"]
    loops = [p[0] for p in getattr(g.tiles, "parts", ()) if isinstance(p, LoopPart)]
    assert max(len(t.nodes) for t in g.tasks) >= schedule._Twins.MIN_OPS      # (long enough)
    assert copies or not all(loop.windows_only for loop in loops)       # copied, or may not be
    res = ck.simulate(*args, out, mode="functional")
    assert np.array_equal(res.outputs["out"], want)
    assert res.ok
