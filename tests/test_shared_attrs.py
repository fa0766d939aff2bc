"""Tile nodes share their attribute maps: the nodes that tiling, `allocate` and
`eliminate_redundant_loads` make with equal maps get one `Attrs` object (a large matmul's tile
graph holds hundreds of thousands of nodes, a few thousand distinct maps).  The passes find the
map to share by the identity of the node's old one: given nodes that share maps, they must make
exactly what they make of nodes that each have their own."""
import numpy as np
import pytest

import pypto
from pypto.compiler import Pipeline, default_passes
from pypto.compiler.memory import allocate
from pypto.compiler.pipeline import PassContext
from pypto.compiler.reuse import eliminate_redundant_loads
from pypto.ir.core import Attrs
from pypto.target.machine import get_machine

from common import tile_matmul

F16 = pypto.DT_FP16
T = pypto.Tensor


@pypto.jit
def mm(a, b, c):
    c[:] = pypto.matmul(a, b)


@pypto.jit
def mm_bias_relu(a, b, bias, c):
    c[:] = pypto.relu(pypto.matmul(a, b) + bias)


def _softmax(x, out):
    pypto.set_vec_tile_shapes(32, 256)          # 4 column tiles per row: a row maximum reloaded
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)


softmax_all_loads = pypto.jit(_softmax, pipeline=Pipeline([p for p in default_passes()
                                                           if p.name != "eliminate_redundant_loads"]))


def _unallocated(n) -> dict:
    return {k: v for k, v in n.attrs.items() if k not in ("buf", "nbuf")}


def _own_maps(g, strip=False):
    """g with a map of its own for every node (nothing shared); `strip`: without their slots
    (as before `allocate`)."""
    return g.replace([n.with_field("attrs", Attrs(_unallocated(n) if strip else n.attrs._dict))
                      for n in g.nodes])


def _one_map_each(g, strip=False):
    """g with one map object for every distinct map (as shared as maps can be)."""
    seen: dict[Attrs, Attrs] = {}
    return g.replace([n.with_field("attrs", seen.setdefault(a, a))
                      for n in g.nodes for a in [Attrs(_unallocated(n)) if strip else n.attrs]])


def _same_nodes(a, b):
    assert len(a.nodes) == len(b.nodes)
    for x, y in zip(a.nodes, b.nodes):
        assert x == y and list(x.attrs.items()) == list(y.attrs.items()), (x, y)


def _graphs():
    rng = np.random.default_rng(3)
    a, b = rng.random((256, 256)).astype(np.float16), rng.random((256, 128)).astype(np.float16)
    yield mm.compile(T([512, 384], F16), T([384, 640], F16), T([512, 640], F16)).tile_graph    # tails, L1 ring
    yield mm_bias_relu.compile(T([300, 1024], F16), T([1024, 520], F16), T([1, 520], F16),
                               T([300, 520], F16)).tile_graph                             # persistent bias
    yield tile_matmul.compile(a, b, np.zeros((256, 128), np.float32), TM=64, TN=64).tile_graph    # rotate (pypto.tile)
    x = np.random.default_rng(7).random((256, 1024)).astype(np.float32)
    yield softmax_all_loads.compile(x, np.zeros_like(x)).tile_graph                    # vector groups


@pytest.mark.parametrize("g", list(_graphs()), ids=["matmul", "bias_relu", "tile_kernel", "softmax"])
def test_allocate_makes_of_shared_maps_what_it_makes_of_own_ones(g):
    ctx = PassContext(get_machine("a2a3"))
    plain = allocate(_own_maps(g, strip=True), ctx)
    _same_nodes(plain, g)                           # (allocate worked out the same slots)
    _same_nodes(allocate(_one_map_each(g, strip=True), ctx), plain)
    _same_nodes(allocate(_one_map_each(g), ctx), plain)
    _same_nodes(allocate(g, ctx), plain)


def test_eliminate_makes_of_shared_maps_what_it_makes_of_own_ones():
    x = np.random.default_rng(7).random((256, 1024)).astype(np.float32)
    g = softmax_all_loads.compile(x, np.zeros_like(x)).tile_graph
    ctx = PassContext(get_machine("a2a3"))
    plain = eliminate_redundant_loads(_own_maps(g), ctx)
    assert len(plain) < len(g) and any(n.attrs.get("persistent") and n.op == "TLOAD" for n in plain.nodes)
    _same_nodes(eliminate_redundant_loads(_one_map_each(g), ctx), plain)
    _same_nodes(eliminate_redundant_loads(g, ctx), plain)


@pytest.mark.parametrize("g", list(_graphs())[:2], ids=["matmul", "bias_relu"])
def test_a_matmul_tile_graph_has_one_map_per_distinct_map(g):
    maps = {id(n.attrs): n.attrs for n in g.nodes}
    distinct = set(maps.values())
    # equal maps are one object, but for the per-output-tile bias loads (a map each, made by
    # `emit`: one node per output tile)
    bias = sum(n.attrs["key"] in ("bias1", "bt") for n in g.nodes)
    assert len(distinct) <= len(maps) <= len(distinct) + bias
    assert len(maps) < len(g.nodes) // 4
    # the iteration bookkeeping lives on the node, not in its map
    assert not any("par" in a for a in distinct)
    assert {n.par for n in g.nodes if n.op == "TEXTRACT"} == set(range(sum(n.op == "TEXTRACT" for n in g.nodes) // 2))
