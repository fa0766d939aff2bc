"""`dependencies` reads a loop task's GM windows off its loop (`NodeLoop.windows`, no node made):
the dependencies it finds are those of the tasks' own loads, stores and indexed DMAs, worked out
here from the nodes the loop makes, pair by pair of tasks (no index, no shortcut)."""
from __future__ import annotations

import numpy as np
import pytest

import pypto
from pypto.ir.gm import Footprint
from pypto.ir.tile import LoopTileGraph
from pypto.target.isa import gm_access

from common import matmul_bias_gelu

F16, F32, I32 = pypto.DT_FP16, pypto.DT_FP32, pypto.DT_INT32
T = pypto.Tensor


@pypto.jit
def _rows_then_scale(x, out):
    pypto.set_vec_tile_shapes(8, 512)
    out[:] = pypto.softmax(x) * 2.0


@pypto.jit
def _gather_then_scatter(x, idx, out):
    pypto.set_vec_tile_shapes(4, 64)
    y = pypto.index_select(x, 0, idx) + 1.0
    out[:] = pypto.index_add(x, 0, idx, y)


def _footprints(g):
    """(reads, writes) per task from the nodes its loop makes (or the graph's own nodes)."""
    tiles = g.tiles
    parts = tiles.loop_tasks(g.tasks) if isinstance(tiles, LoopTileGraph) else [None] * len(g.tasks)
    by_id = tiles.plain_by_id() if isinstance(tiles, LoopTileGraph) else tiles.by_id()
    out = []
    for t, part in zip(g.tasks, parts):
        nodes = part.nodes(t.outer, gm_only=True, placed=False) if part is not None else [by_id[i] for i in t.nodes]
        r, w = Footprint(), Footprint()
        for n in nodes:
            a = {"TLOAD": "read", "TSTORE": "write"}.get(n.op) or gm_access(n.op)
            if a is not None:
                (w if a == "write" else r).add(n.attrs._dict["gm"])
        out.append((r, w))
    return out


CASES = [
    (matmul_bias_gelu, (T([900, 512], F16), T([512, 1000], F16), T([1000], F16), T([900, 1000], F16)),
     dict(VM=32, VN=64), {}),
    (_rows_then_scale, (T([4096, 512], F32), T([4096, 512], F32)), {}, {"fusion": False}),
    (_gather_then_scatter, (T([2048, 64], F32), T([2048], I32), T([2048, 64], F32)), {}, {}),
]


@pytest.mark.parametrize("kernel,specs,consts,options", CASES, ids=["mm_bias_gelu", "unfused_softmax", "gather"])
def test_dependencies_from_loop_windows_are_those_of_the_nodes(kernel, specs, consts, options):
    kernel.cache_clear()
    g = dict(kernel.compile(*specs, snapshots=True, options=options, **consts).snapshots)["dependencies"]
    kernel.cache_clear()
    assert len({t.group for t in g.tasks}) >= 2
    assert isinstance(g.tiles, LoopTileGraph) and any(p is not None for p in g.tiles.loop_tasks(g.tasks))
    feet = _footprints(g)
    found = 0
    for b in g.tasks:
        want = tuple(a for a in range(b.id) if g.tasks[a].group != b.group and (
            feet[a][1].overlaps(feet[b.id][0]) or feet[a][1].overlaps(feet[b.id][1])
            or feet[a][0].overlaps(feet[b.id][1])))
        assert b.deps == want, f"task {b.id}"
        found += len(want)
    assert found                        # (tasks that depend on others: something to compare)


def test_the_gather_kernel_computes_what_numpy_does():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, 64)).astype(np.float32)
    idx = rng.integers(0, 2048, 2048).astype(np.int32)
    res = _gather_then_scatter.compile(x, idx, np.zeros_like(x)).simulate(x, idx, np.zeros_like(x))
    want = x.astype(np.float64).copy()
    np.add.at(want, idx, x[idx].astype(np.float64) + 1.0)
    assert res.ok and np.allclose(res.outputs["out"], want, rtol=1e-5, atol=1e-4)


def _matmul_auto():
    from kernels import matmul_auto
    return matmul_auto


@pytest.mark.parametrize("kernel,specs,consts", [
    (matmul_bias_gelu, (T([900, 512], F16), T([512, 1000], F16), T([1000], F16), T([900, 1000], F16)), dict(VM=32, VN=64)),
    (None, (T([2048, 2048], F16), T([2048, 2048], F16), T([2048, 2048], F16)), {}),
], ids=["tails_and_bias", "serpentine_l1_reuse"])
def test_a_matmul_loops_windows_are_those_of_its_nodes(kernel, specs, consts):
    """A matmul loop's windows worked out without its nodes (`_tile_windows`: per row and column of
    tiles, ids counted) are those of the loads and stores its nodes have, in order, without the
    loads l1_reuse drops (K walked forward and back)."""
    kernel = kernel or _matmul_auto()
    kernel.cache_clear()
    g = dict(kernel.compile(*specs, snapshots=True, **consts).snapshots)["dependencies"]
    kernel.cache_clear()
    checked = fewer = 0
    for t, part in zip(g.tasks, g.tiles.loop_tasks(g.tasks)):
        if part is None or part[0]._windows is None:
            continue
        loop, _, _, drop = part
        nodes = part.nodes(t.outer, gm_only=True, placed=False)
        got = loop._windows(drop, t.outer)
        assert got == [(n.op, n.attrs._dict["gm"]) for n in nodes], f"task {t.id}"
        checked += 1
        fewer += len(got) < len(loop._windows(None, t.outer))
    assert checked and (fewer or kernel is matmul_bias_gelu)
