"""The compiler: the five levels, the pass log, and what each pass must do."""
from __future__ import annotations

import collections
import math

import numpy as np
import pytest

import pypto
from pypto.ir.tile import tile_bytes
from common import byte_accesses

PASS_ORDER = ["decompose", "legalize", "simplify", "cse", "dce", "fusion", "tiling", "assign_spaces", "eliminate_redundant_loads",
              "allocate", "partition", "dependencies", "prune_dependencies", "wavefronts", "select", "scheduling",
              "insert_sync", "codegen"]


@pypto.jit
def softmax(x, out, *, TM: int = 32, TN: int = 256):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = pypto.softmax(x)


@pypto.jit
def add_one(x, out, *, TM: int = 32, TN: int = 64):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = x + 1.0


@pypto.jit
def mm_abs(a, b, out):
    pypto.set_cube_tile_shapes([32, 32], [32, 64], [32, 32])
    out[:] = pypto.abs(pypto.matmul(a, b))     # a vector epilogue (a ReLU would join the cube)


def _x(rng, shape=(64, 256)):
    return rng.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------------------
# levels and pass log

def test_five_levels_exist_and_print(rng):
    x = _x(rng)
    ck = softmax.compile(x, np.zeros_like(x))
    levels = [ck.tensor_graph, ck.tile_graph, ck.block_graph, ck.exec_graph, ck.program]
    assert [lv.level for lv in levels] == ["tensor", "tile", "block", "exec", "pto"]
    assert list(ck.levels) == ["tensor", "tile", "block", "exec", "pto"]
    texts = [str(lv) for lv in levels]
    for head, text in zip(["tensor_graph softmax", "tile_graph softmax", "block_graph softmax",
                           "exec_graph softmax", "PTO program softmax"], texts):
        assert text.startswith(head) or head in text.splitlines()[0], text[:200]
    assert "amax" in texts[0] and "exp" in texts[0]
    assert "TLOAD" in texts[1] and "TSTORE" in texts[1] and "UB" in texts[1]
    assert "task 0" in texts[2] and "AIV" in texts[2]
    assert "launch task 0" in texts[3]
    assert "TLOAD" in texts[4] and "SET_FLAG" in texts[4] and "WAIT_FLAG" in texts[4]
    # every level is non-empty; the program has one block per task
    assert all(len(lv) > 0 for lv in levels)
    assert texts[4].count(".task ") == len(ck.program.tasks) == len(ck.block_graph.tasks)
    # the IR keeps the kernel's source line
    assert "test_compiler.py:" in texts[0] and "test_compiler.py:" in texts[4]
    assert "CompiledKernel" in repr(ck)


def test_pass_log_order_and_node_counts(rng):
    x = _x(rng)
    ck = softmax.compile(x, np.zeros_like(x), TN=64)
    names = [r.name for r in ck.pass_log]
    it = iter(names)
    assert all(p in it for p in PASS_ORDER), f"passes out of order: {names}"
    levels = {r.name: r.level for r in ck.pass_log}
    assert levels["decompose"] == "tensor" and levels["tiling"] == "tensor->tile"
    assert levels["partition"] == "tile->block" and levels["select"] == "block->exec"
    assert levels["codegen"] == "exec->pto"
    for r in ck.pass_log:
        assert isinstance(r.nodes_before, int) and isinstance(r.nodes_after, int)
        assert r.nodes_before > 0 and r.nodes_after > 0 and r.ms >= 0
    # counts chain: each pass starts from what the previous one produced
    for a, b in zip(ck.pass_log, ck.pass_log[1:]):
        assert a.nodes_after == b.nodes_before, (a, b)
    # final counts are the sizes of the levels
    rec = {r.name: r for r in ck.pass_log}
    assert rec["codegen"].nodes_after == len(ck.program)
    assert rec["partition"].nodes_after == len(ck.block_graph.tasks)
    assert rec["tiling"].nodes_after == len(ck.tile_graph) or rec["allocate"].nodes_after == len(ck.tile_graph)
    assert rec["decompose"].nodes_before == len(ck.traced)
    text = str(ck.pass_log)
    for p in PASS_ORDER:
        assert p in text


def test_decomposition_removes_composites(rng):
    w = rng.standard_normal(256).astype(np.float32)
    x = _x(rng)

    @pypto.jit
    def k(x, w, out):
        y = pypto.softmax(x) + pypto.layernorm(x, w) + pypto.rms_norm(x, w)
        out[:] = pypto.gelu(y) + pypto.sigmoid(y) + pypto.tanh(y) + pypto.mean(y, dim=-1, keepdim=True)

    ck = k.compile(x, w, np.zeros_like(x))
    traced = {n.op for n in ck.traced.nodes}
    assert {"softmax", "layernorm", "rms_norm", "gelu", "sigmoid", "tanh", "mean"} <= traced
    ops = collections.Counter(n.op for n in ck.tensor_graph.nodes)
    for comp in ("softmax", "layernorm", "rms_norm", "gelu", "sigmoid", "tanh", "mean"):
        assert ops[comp] == 0, f"{comp} left after decomposition"
    assert ops["amax"] >= 1 and ops["exp"] >= 1 and ops["sum"] >= 1 and ops["rsqrt"] >= 1
    rec = {r.name: r for r in ck.pass_log}
    assert rec["decompose"].nodes_after > rec["decompose"].nodes_before
    assert "softmax" not in str(ck.tensor_graph)


def test_dce_removes_unused_value(rng):
    x = _x(rng)

    @pypto.jit
    def k(x, out):
        unused = pypto.exp(x) * 3.0   # noqa: F841
        out[:] = x + 1.0

    ck = k.compile(x, np.zeros_like(x))
    assert "exp" in {n.op for n in ck.traced.nodes}
    assert "exp" not in {n.op for n in ck.tensor_graph.nodes}
    assert "mul" not in {n.op for n in ck.tensor_graph.nodes}
    rec = {r.name: r for r in ck.pass_log}
    assert rec["dce"].nodes_after < rec["dce"].nodes_before
    assert not any(i.op == "TEXP" for t in ck.program.tasks for i in t.instrs)


def _groups(ck):
    return sorted({n.attrs["group"] for n in ck.tensor_graph.nodes if "group" in n.attrs})


def test_fusion_full_row_softmax_is_one_group(rng):
    x = _x(rng, (64, 256))
    ck = softmax.compile(x, np.zeros_like(x), TM=32, TN=256)      # TN >= N: a tile covers a row
    assert len(_groups(ck)) == 1
    assert len(ck.tile_graph.groups) == 1
    # nothing goes through a GM workspace
    assert not [b for b in ck.tile_graph.buffers if b.role == "workspace"]
    ck_wide = softmax.compile(x, np.zeros_like(x), TM=32, TN=512)  # wider than the row: clipped
    assert len(_groups(ck_wide)) == 1


def test_fusion_split_row_softmax_has_several_groups(rng):
    x = _x(rng, (64, 256))
    ck = softmax.compile(x, np.zeros_like(x), TM=32, TN=64)       # TN < N: row reductions span tiles
    assert len(_groups(ck)) > 1
    assert [b for b in ck.tile_graph.buffers if b.role == "workspace"]
    # still correct
    res = ck.simulate(x, np.zeros_like(x))
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(res.outputs["out"], e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_fusion_elementwise_chain_is_one_group(rng):
    x = _x(rng)

    @pypto.jit
    def k(x, out):
        pypto.set_vec_tile_shapes(32, 64)
        out[:] = pypto.relu(pypto.exp(x) * 2.0 - x) + 1.0

    ck = k.compile(x, np.zeros_like(x))
    assert len(_groups(ck)) == 1
    assert not [b for b in ck.tile_graph.buffers if b.role == "workspace"]


# ---------------------------------------------------------------------------------------
# tiling

@pytest.mark.parametrize("tiles", [(32, 64), (64, 256), (16, 128)])
def test_tiling_ceil_div_tiles_with_tails(tiles, rng):
    M, N = 100, 300
    x = _x(rng, (M, N))
    TM, TN = tiles
    ck = add_one.compile(x, np.zeros_like(x), TM=TM, TN=TN)
    (info,) = ck.tile_graph.groups
    n_tiles = math.ceil(M / TM) * math.ceil(N / TN)
    assert info.n_outer * info.n_inner == n_tiles
    assert tuple(info.tile) == (TM, TN)
    loads = [n for n in ck.tile_graph.nodes if n.op == "TLOAD"]
    stores = [n for n in ck.tile_graph.nodes if n.op == "TSTORE"]
    assert len(loads) == len(stores) == n_tiles
    want = collections.Counter()
    for i in range(math.ceil(M / TM)):
        for j in range(math.ceil(N / TN)):
            want[(min(TM, M - i * TM), min(TN, N - j * TN))] += 1
    assert collections.Counter(n.valid for n in loads) == want
    assert all(n.shape == (TM, TN) for n in loads)                 # tails: full buffer, smaller valid
    # every element is loaded exactly once
    covered = np.zeros((M, N), int)
    for n in loads:
        g = n.attrs["gm"]
        r0, c0 = divmod(g.offset, N)
        covered[r0:r0 + n.valid[0], c0:c0 + n.valid[1]] += 1
    assert (covered == 1).all()


def test_tiling_reduction_inner_loop(rng):
    x = _x(rng, (100, 300))
    ck = softmax.compile(x, np.zeros_like(x), TM=32, TN=64)
    inner = [g for g in ck.tile_graph.groups if g.n_inner > 1]
    assert inner and all(g.n_inner == math.ceil(300 / 64) for g in inner)
    assert all(g.n_outer == math.ceil(100 / 32) for g in inner)


def test_tiling_matmul_cube_tiles(rng):
    a = rng.standard_normal((100, 130)).astype(np.float16)
    b = rng.standard_normal((130, 70)).astype(np.float16)
    ck = mm_abs.compile(a, b, np.zeros((100, 70), np.float16))
    cube = [g for g in ck.tile_graph.groups if g.kind == "cube"]
    assert len(cube) == 1
    assert cube[0].n_outer == math.ceil(100 / 32) * math.ceil(70 / 32)
    assert cube[0].n_inner == math.ceil(130 / 64)
    mms = [n for n in ck.tile_graph.nodes if n.op.startswith("TMATMUL")]
    # one matmul per (m tile, n tile, kL0 step)
    assert len(mms) == math.ceil(100 / 32) * math.ceil(70 / 32) * math.ceil(130 / 32)
    assert {n.space for n in ck.tile_graph.nodes if n.op == "TEXTRACT"} == {"L0A", "L0B"}
    assert {n.space for n in mms} == {"L0C"}
    assert all(n.dtype == pypto.DT_FP32 for n in mms)              # fp16 accumulates in fp32


# ---------------------------------------------------------------------------------------
# memory

def test_allocation_double_buffers_loads(rng):
    x = _x(rng, (256, 256))
    ck = add_one.compile(x, np.zeros_like(x), TM=32, TN=64)
    loads = [n for n in ck.tile_graph.nodes if n.op == "TLOAD"]
    by_key = collections.defaultdict(list)
    for n in loads:
        by_key[(n.group, n.key)].append(n)
    for key, ns in by_key.items():
        addrs = [n.attrs["buf"] for n in ns]
        assert len(set(addrs)) == 2, f"{key}: addresses {sorted(set(addrs))}"
        assert all(a != b for a, b in zip(addrs, addrs[1:])), f"{key}: consecutive loads share a buffer"
        assert addrs[0::2] == [addrs[0]] * len(addrs[0::2]) and addrs[1::2] == [addrs[1]] * len(addrs[1::2])
        assert all(n.attrs["nbuf"] == 2 for n in ns)
        size = tile_bytes(ns[0].shape, ns[0].dtype)
        assert abs(addrs[0] - addrs[1]) >= size                      # the two copies do not overlap


def test_allocation_falls_back_to_single_buffer(rng):
    """Two 64 KiB tiles x 2 buffers do not fit 192 KiB of UB: single buffering, still correct."""
    x = _x(rng, (128, 512))
    ck = add_one.compile(x, np.zeros_like(x), TM=64, TN=256)
    nbufs = {n.attrs["nbuf"] for n in ck.tile_graph.nodes if n.space == "UB"}
    assert nbufs == {1}
    res = ck.simulate(x, np.zeros_like(x))
    np.testing.assert_array_equal(res.outputs["out"], x + 1.0)


@pytest.mark.parametrize("machine", ["a2a3", "teach"])
def test_every_tile_fits_its_space(machine, rng):
    x = _x(rng, (100, 300))
    kernels = [
        (softmax, (x, np.zeros_like(x)), {"TM": 32, "TN": 64}),
        (softmax, (x, np.zeros_like(x)), {"TM": 64, "TN": 512}),
        (mm_abs, (rng.standard_normal((100, 130)).astype(np.float16),
                   rng.standard_normal((130, 70)).astype(np.float16), np.zeros((100, 70), np.float16)), {}),
    ]
    for k, args, c in kernels:
        ck = k.compile(*args, machine=machine, **c)
        caps = ck.machine.capacities()
        for n in ck.tile_graph.nodes:
            if n.space in caps:
                assert 0 <= n.attrs["buf"] and n.attrs["buf"] + tile_bytes(n.shape, n.dtype) <= caps[n.space], n
        for t in ck.program.tasks:
            for ins in t.instrs:
                for o in (ins.dst, *ins.srcs):
                    if hasattr(o, "space") and o.space in caps:
                        assert o.addr + o.nbytes <= caps[o.space]


def test_memory_spaces_follow_data_paths(rng):
    a = rng.standard_normal((64, 64)).astype(np.float16)
    ck = mm_abs.compile(a, a, np.zeros_like(a))
    for n in ck.tile_graph.nodes:
        if n.op == "TLOAD":
            assert n.space in ("UB", "L1")
            if n.group == 0:
                assert n.space == "L1"
        elif n.op.startswith("T") and n.op not in ("TSTORE", "TEXTRACT") and not n.op.startswith("TMATMUL"):
            assert n.space == "UB"


# ---------------------------------------------------------------------------------------
# block level: partitioning, core types, dependencies

def test_tasks_core_types_and_dependencies(rng):
    a = rng.standard_normal((100, 130)).astype(np.float16)
    b = rng.standard_normal((130, 70)).astype(np.float16)
    ck = mm_abs.compile(a, b, np.zeros((100, 70), np.float16))
    kinds = {g.id: g.kind for g in ck.tile_graph.groups}
    assert sorted(kinds.values()) == ["cube", "vector"]
    tasks = ck.block_graph.tasks
    for t in tasks:
        assert t.core_type == ("AIC" if kinds[t.group] == "cube" else "AIV")
    aic = [t for t in tasks if t.core_type == "AIC"]
    aiv = [t for t in tasks if t.core_type == "AIV"]
    assert aic and aiv
    assert all(not t.deps for t in aic)
    # every vector task reads matmul results: it depends on at least one cube task
    aic_ids = {t.id for t in aic}
    assert all(set(t.deps) & aic_ids for t in aiv)
    assert all(t.level > 0 for t in aiv) and all(t.level == 0 for t in aic)
    # matmul instructions only on AIC tasks, vector instructions only on AIV tasks
    for t in ck.program.tasks:
        ops = {i.op for i in t.instrs}
        if t.core_type == "AIC":
            assert "TMATMUL" in ops and "TABS" not in ops
            assert {i.pipe for i in t.instrs} <= {"MTE2", "MTE1", "M", "FIX", "S"}
        else:
            assert "TABS" in ops and not any(o.startswith("TMATMUL") for o in ops)
            assert {i.pipe for i in t.instrs} <= {"MTE2", "V", "MTE3", "S"}
    # results
    res = ck.simulate(a, b, np.zeros((100, 70), np.float16))
    want = np.abs(a.astype(np.float64) @ b.astype(np.float64))
    np.testing.assert_allclose(res.outputs["out"], want, rtol=2e-3, atol=1e-2)


def test_dependencies_follow_producer_consumer(rng):
    x = _x(rng, (128, 256))
    ck = softmax.compile(x, np.zeros_like(x), TM=32, TN=64)
    tiles = ck.tile_graph.by_id()
    reads, writes = {}, {}
    for t in ck.block_graph.tasks:
        reads[t.id] = [tiles[i].attrs["gm"] for i in t.nodes if tiles[i].op == "TLOAD"]
        writes[t.id] = [tiles[i].attrs["gm"] for i in t.nodes if tiles[i].op == "TSTORE"]
    n_deps = 0
    for b in ck.block_graph.tasks:
        for a in ck.block_graph.tasks[:b.id]:
            raw = any(w.overlaps(r) for w in writes[a.id] for r in reads[b.id])
            if raw:                                        # b reads what a wrote: b must wait for a
                assert a.id in b.deps, f"task {b.id} reads what task {a.id} writes but does not depend on it"
        n_deps += len(b.deps)
        assert all(d < b.id for d in b.deps)
        assert b.level == 1 + max((ck.block_graph.tasks[d].level for d in b.deps), default=-1)
    assert n_deps > 0
    # tasks of the first group depend on nothing
    first = min(t.group for t in ck.block_graph.tasks)
    assert all(not t.deps for t in ck.block_graph.tasks if t.group == first)


def test_partition_uses_at_most_one_task_per_core(rng):
    x = _x(rng, (512, 256))
    for machine, n_aiv in (("a2a3", 48), ("teach", 4)):
        ck = add_one.compile(x, np.zeros_like(x), TM=8, TN=256, machine=machine)
        tasks = ck.block_graph.tasks
        assert len(tasks) == min(n_aiv, 512 // 8)
        outer = sorted(o for t in tasks for o in t.outer)
        assert outer == list(range(512 // 8))                       # every iteration exactly once


# ---------------------------------------------------------------------------------------
# execution level: sync

@pytest.mark.parametrize("which", ["softmax", "mm_abs"])
def test_set_wait_flags_pair_up(which, rng):
    if which == "softmax":
        x = _x(rng, (100, 300))
        ck = softmax.compile(x, np.zeros_like(x), TM=32, TN=64, machine="teach")
    else:
        a = rng.standard_normal((100, 130)).astype(np.float16)
        ck = mm_abs.compile(a, a.T.copy(), np.zeros((100, 100), np.float16), machine="teach")
    total = 0
    for t in ck.program.tasks:
        sets, waits = collections.Counter(), collections.Counter()
        for i in t.instrs:
            if i.op in ("SET_FLAG", "WAIT_FLAG"):
                key = (i.attrs["src"], i.attrs["dst"], i.attrs["event"])
                assert 0 <= key[2] < 8
                assert key[0] != key[1]
                if i.op == "SET_FLAG":
                    assert i.pipe == key[0]
                    sets[key] += 1
                else:
                    assert i.pipe == key[1]
                    waits[key] += 1
        assert sets == waits, f"task {t.id}: unmatched flags {sets - waits} / {waits - sets}"
        total += sum(sets.values())
        # a wait never comes before the first matching set has been issued in program order
        seen = collections.Counter()
        for i in t.instrs:
            if i.op == "SET_FLAG":
                seen[(i.attrs["src"], i.attrs["dst"], i.attrs["event"])] += 1
        assert seen == sets
    assert total > 0


def _happens_before(instrs):
    """Per instruction, a bitset of the instructions that must finish before it starts: program
    order on one pipe, plus the n-th SET_FLAG(src->dst, ev) before the n-th matching WAIT_FLAG."""
    preds = [[] for _ in instrs]
    last_on_pipe = {}
    sets = collections.defaultdict(list)
    waits = collections.defaultdict(list)
    for k, ins in enumerate(instrs):
        if ins.pipe in last_on_pipe:
            preds[k].append(last_on_pipe[ins.pipe])
        last_on_pipe[ins.pipe] = k
        if ins.op in ("SET_FLAG", "WAIT_FLAG"):
            key = (ins.attrs["src"], ins.attrs["dst"], ins.attrs["event"])
            (sets if ins.op == "SET_FLAG" else waits)[key].append(k)
    for key, ws in waits.items():
        for s, w in zip(sets[key], ws):
            assert s < w, f"WAIT_FLAG {key} at {w} comes before its SET_FLAG at {s}"
            preds[w].append(s)
    anc = []
    for k in range(len(instrs)):
        bits = 0
        for p in preds[k]:
            bits |= anc[p] | (1 << p)
        anc.append(bits)
    return anc


@pytest.mark.parametrize("which", ["softmax_split", "softmax_row", "layernorm", "mm_abs"])
def test_sync_orders_every_hazard(which, rng):
    """Within a task, two instructions that touch the same bytes (one writing) are ordered: either
    on the same pipe, or through a chain of SET_FLAG/WAIT_FLAG pairs (checked as happens-before)."""
    x = _x(rng, (100, 300))
    if which == "softmax_split":
        ck = softmax.compile(x, np.zeros_like(x), TM=32, TN=64, machine="teach")
    elif which == "softmax_row":
        ck = softmax.compile(x, np.zeros_like(x), TM=8, TN=512, machine="teach")
    elif which == "layernorm":
        w = rng.standard_normal(300).astype(np.float32)

        @pypto.jit
        def ln(x, w, b, out):
            pypto.set_vec_tile_shapes(16, 128)
            out[:] = pypto.layernorm(x, w, b)
        ck = ln.compile(x, w, w, np.zeros_like(x), machine="teach")
    else:
        a = rng.standard_normal((100, 130)).astype(np.float16)
        ck = mm_abs.compile(a, a.T.copy(), np.zeros((100, 100), np.float16), machine="teach")
    checked = 0
    for t in ck.program.tasks:
        instrs = t.instrs
        anc = _happens_before(instrs)
        accs = [byte_accesses(i) for i in instrs]
        for j in range(len(instrs)):
            for i in range(j):
                if instrs[i].pipe == instrs[j].pipe:
                    continue
                hazard = any(k1 == k2 and l1 < h2 and l2 < h1 and (w1 or w2)
                             for k1, l1, h1, w1 in accs[i] for k2, l2, h2, w2 in accs[j])
                if hazard:
                    checked += 1
                    assert anc[j] >> i & 1, (f"task {t.id}: {instrs[i].op}@{i} ({instrs[i].pipe}) and "
                                             f"{instrs[j].op}@{j} ({instrs[j].pipe}) race")
    assert checked > 0


# ---------------------------------------------------------------------------------------
# compile cache

def test_compile_cache(rng):
    @pypto.jit
    def k(x, out, *, TM: int = 32, TN: int = 64):
        pypto.set_vec_tile_shapes(TM, TN)
        out[:] = x * 2.0

    x = _x(rng, (64, 128))
    ck1 = k.compile(x, np.zeros_like(x))
    assert k.cache_size == 1
    assert k.compile(x, np.zeros_like(x)) is ck1                          # same shapes and constants
    assert k.compile(x.copy(), np.ones_like(x), TM=32) is ck1             # data and explicit default
    ck2 = k.compile(x, np.zeros_like(x), TM=16)
    assert ck2 is not ck1 and k.cache_size == 2
    assert ck2.consts["TM"] == 16 and ck1.consts["TM"] == 32
    y = _x(rng, (32, 128))
    assert k.compile(y, np.zeros_like(y)) is not ck1                      # other shapes
    assert k.compile(x.astype(np.float16), np.zeros_like(x, np.float16)) is not ck1   # other dtypes
    assert k.compile(x, np.zeros_like(x), machine="teach") is not ck1     # other machine
    n = k.cache_size
    out = np.zeros_like(x)
    k(x, out)                                                             # the call form uses the cache
    assert k.cache_size == n
    np.testing.assert_array_equal(out, x * 2.0)
    k.cache_clear()
    assert k.cache_size == 0
    assert k.compile(x, np.zeros_like(x)) is not ck1


def test_failed_compile_leaves_cache_untouched(rng):
    @pypto.jit
    def k(x, out, *, TM: int = 32, TN: int = 64):
        pypto.set_vec_tile_shapes(TM, TN)
        out[:] = x * 2.0

    x = _x(rng, (64, 1024))
    good = k.compile(x, np.zeros_like(x))
    assert k.cache_size == 1
    with pytest.raises(pypto.TileShapeError):
        k.compile(x, np.zeros_like(x), TN=100)
    assert k.cache_size == 1
    with pytest.raises(pypto.TileShapeError):
        k(x, np.zeros_like(x), TM=2048, TN=1024)          # 64 rows x 1024: 256 KiB > UB
    assert k.cache_size == 1
    assert k.compile(x, np.zeros_like(x)) is good
    ck = k.compile(x, np.zeros_like(x), TN=128)
    assert k.cache_size == 2
    res = ck.simulate(x, np.zeros_like(x))
    np.testing.assert_array_equal(res.outputs["out"], x * 2.0)
    assert res.ok


def test_compile_from_tensor_specs(rng):
    spec = pypto.Tensor([64, 128], pypto.DT_FP32)
    ck = add_one.compile(spec, spec)
    x = _x(rng, (64, 128))
    res = ck.simulate(x, np.zeros_like(x))
    np.testing.assert_array_equal(res.outputs["out"], x + 1.0)
    assert add_one.compile(x, np.zeros_like(x)) is ck                    # same shapes: same entry


def test_pipeline_verifies_each_level(rng):
    """A custom pipeline with a pass that breaks the tensor level is caught and named."""
    from pypto.compiler import Pass, default_passes
    from pypto.ir.tensor import TNode

    def break_graph(g, ctx):
        n = g.nodes[-1]
        return g.replace(list(g.nodes[:-1]) + [TNode(n.id, n.op, (999,), n.shape, n.dtype, n.attrs, n.loc)])

    passes = default_passes()
    passes.insert(1, Pass("breaker", "tensor", break_graph))
    from pypto.compiler import Pipeline

    @pypto.jit(pipeline=Pipeline(passes))
    def k(x, out):
        out[:] = x + 1.0

    x = _x(rng, (8, 64))
    with pytest.raises(pypto.VerificationError) as ei:
        k.compile(x, np.zeros_like(x))
    assert "breaker" in str(ei.value)


def test_snapshots_after_every_pass(rng):
    x = _x(rng, (64, 256))
    ck = softmax.compile(x, np.zeros_like(x), TN=64, snapshots=True)
    assert ck.snapshots is not None
    names = [name for name, _ in ck.snapshots]
    assert names == [r.name for r in ck.pass_log]
    for (name, graph), rec in zip(ck.snapshots, ck.pass_log):
        assert len(graph) == rec.nodes_after
        assert graph.level == rec.level.split("->")[-1]
    assert ck.snapshots[-1][1] is ck.program or ck.snapshots[-1][1].text() == ck.program.text()
    # without snapshots nothing is kept, and the cache tells the two apart
    plain = softmax.compile(x, np.zeros_like(x), TN=64)
    assert plain is not ck and plain.snapshots is None
