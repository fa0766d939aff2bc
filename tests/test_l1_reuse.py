"""L1 reuse across output tiles: serpentine K, the ring of A-panel slots, the `l1_reuse` pass."""
import dataclasses

import numpy as np
import pytest

import pypto
from pypto.compiler.l1reuse import reused_loads
from pypto.errors import VerificationError
from pypto.ir import block
from pypto.ir.block import BlockGraph, Task
from pypto.target.machine import get_machine

T, F16 = pypto.Tensor, pypto.DT_FP16
# two cube cores: a 256 x 512 output in 128 x 128 tiles is one row of four tiles per task; the
# public cost rules, where every shape below is load-bound, so the loads the pass drops show in
# the cycles (under a2a3's calibrated loads, 264 cycles a DMA then 128 B/cycle, the 128 x 256
# tile of 512x1024x512 is cube-bound: the pass saves its bytes, not its time)
TWO_CORES = get_machine("a2a3").replace(name="a2a3-2", n_aic=2, n_aiv=4, cost_model="public")
OFF = {"l1_reuse": False}


@pypto.jit
def mm(a, b, c, *, ML0: int = 128, NL0: int = 128, KL1: int = 128):
    pypto.set_cube_tile_shapes([ML0, ML0], [64, KL1], [NL0, NL0])
    c[:] = pypto.matmul(a, b)


@pypto.jit
def mm_bias_relu(a, b, bias, c):
    pypto.set_cube_tile_shapes([128, 128], [64, 128], [128, 128])
    c[:] = pypto.relu(pypto.matmul(a, b) + bias)


def _loads(ck, task=None):
    tasks = ck.program.tasks if task is None else [ck.program.tasks[task]]
    return [i for t in tasks for i in t.instrs if i.op == "TLOAD"]


def _specs(m, k, n):
    return T([m, k], F16), T([k, n], F16), T([m, n], F16)


def test_a_row_of_tiles_loads_its_a_panel_once():
    # K = 512 is 4 chunks of 128; 32 KiB each, so the whole A panel stays in L1 (ring of 4)
    on = mm.compile(*_specs(256, 512, 512), machine=TWO_CORES)
    off = mm.compile(*_specs(256, 512, 512), machine=TWO_CORES, options=OFF)
    assert len(_loads(off)) == 2 * 4 * (4 + 4)            # per task: 4 tiles x (4 A + 4 B chunks)
    assert len(_loads(on)) == 2 * (4 + 4 * 4)             # A once per task, B for every tile
    a_windows = [i.srcs[0].offset for i in _loads(on, 0) if i.srcs[0].buf.name == "a"]
    assert a_windows == [0, 128, 256, 384]


def test_k_runs_forward_then_backward():
    ck = mm.compile(*_specs(256, 512, 512), machine=TWO_CORES)
    b_rows = [i.srcs[0].offset // 512 for i in _loads(ck, 0) if i.srcs[0].buf.name == "b"]
    fwd = [0, 128, 256, 384]
    assert b_rows == fwd + fwd[::-1] + fwd + fwd[::-1]


def test_a_small_l1_keeps_only_the_chunks_that_fit():
    # 128 KiB of L1: two A and two B slots of 32 KiB, no spare: the last two A chunks of a tile
    # are the first two the next one needs
    small = TWO_CORES.replace(name="a2a3-2-small-l1", l1_kib=128)
    ck = mm.compile(*_specs(256, 512, 512), machine=small)
    assert len(_loads(ck)) == 2 * (4 + 3 * 2 + 4 * 4)


@pytest.mark.parametrize("m, k, n, tile", [
    (256, 512, 512, dict()),
    (200, 456, 520, dict()),                               # tails in M, N and K (K tail chunk first when backward)
    (512, 512, 128, dict()),                               # one column of tiles: the B panel is shared
    (512, 1024, 512, dict(ML0=128, NL0=256, KL1=256)),
])
def test_values_and_synchronisation_are_exact(m, k, n, tile):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    c = np.zeros((m, n), np.float16)
    on = mm.compile(*_specs(m, k, n), machine=TWO_CORES, **tile)
    off = mm.compile(*_specs(m, k, n), machine=TWO_CORES, options=OFF, **tile)
    assert len(_loads(on)) < len(_loads(off))
    res = on.simulate(a, b, c, checked=True)               # checked mode: races, stale reads
    assert res.check["c"]["ok"], res.check
    assert res.cycles < off.simulate(a, b, c).cycles


def test_one_column_of_tiles_shares_b():
    ck = mm.compile(*_specs(512, 512, 128), machine=TWO_CORES)
    names = [i.srcs[0].buf.name for i in _loads(ck, 0)]
    assert names.count("b") == 4 and names.count("a") == 2 * 4      # two tiles of one column


def test_bias_and_relu_start_the_backward_tiles():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((256, 512)).astype(np.float16)
    b = rng.standard_normal((512, 512)).astype(np.float16)
    bias = rng.standard_normal(512).astype(np.float16)
    c = np.zeros((256, 512), np.float16)
    ck = mm_bias_relu.compile(T([256, 512], F16), T([512, 512], F16), T([512], F16), T([256, 512], F16),
                              machine=TWO_CORES)
    ops = [i.op for i in ck.program.tasks[0].instrs if i.op.startswith("TMATMUL")]
    assert ops.count("TMATMUL_BIAS") == 4                  # the first product of every tile
    res = ck.simulate(a, b, bias, c, checked=True)
    assert res.check["c"]["ok"], res.check


def test_the_diff_of_the_pass_names_the_dropped_loads():
    ck = mm.compile(*_specs(256, 512, 512), machine=TWO_CORES, snapshots=True)
    d = ck.diff("l1_reuse")
    dropped = [r for r in d.removed if "] TLOAD(" in r]        # (and the extracts rewired to earlier loads)
    assert len(dropped) == 2 * 3 * 4                       # per task, the A chunks of tiles 2..4
    assert all("GM a[" in r for r in dropped)
    assert "120 tile ops" in d.text and "132 tile ops" in d.text


def test_pass_log_and_default_pipeline_name_the_pass():
    assert "l1_reuse" in pypto.compiler.PASSES
    assert pypto.compiler.PASSES["l1_reuse"].level == "block"
    ck = mm.compile(*_specs(256, 512, 512), machine=TWO_CORES)
    names = [r.name for r in ck.pass_log]
    assert names.index("partition") < names.index("l1_reuse") < names.index("dependencies")


def test_matmul_bias_gelu_on_a2a3_is_faster_with_reuse():
    from common import matmul_bias_gelu
    specs = (T([1024, 1024], F16), T([1024, 1024], F16), T([1024], F16), T([1024, 1024], F16))
    cyc = {}
    for name, opts in (("on", {}), ("off", OFF)):
        ck = matmul_bias_gelu.compile(*specs, options=opts)
        cyc[name] = pypto.sim.simulate(ck.program, machine=ck.machine, mode="timing", trace=False).cycles
    assert cyc == {"on": 21708, "off": 22424}


def test_a_task_reading_another_tasks_tile_fails_verification():
    ck = mm.compile(*_specs(256, 512, 512), machine=TWO_CORES, snapshots=True)
    g = next(s for name, s in ck.snapshots if name == "l1_reuse")
    assert isinstance(g, BlockGraph) and reused_loads(g) == {}      # nothing left to reuse
    t0 = g.tasks[0]
    per_tile = len(t0.nodes) // 4
    # split task 0 after its first tile: the second tile reads A chunks the first one loaded
    head = dataclasses.replace(t0, nodes=t0.nodes[:per_tile + 9], outer=t0.outer[:1])
    tail = Task(len(g.tasks), t0.group, t0.core_type, t0.outer[1:], t0.nodes[per_tile + 9:])
    with pytest.raises(VerificationError, match="of another task"):
        block.verify(g.replace([head, *g.tasks[1:], tail]))


@pypto.jit
def batched(a, b, c):
    pypto.set_cube_tile_shapes([64, 64], [64, 128], [64, 64])
    c[:] = pypto.matmul(a, b)


def test_a_weight_broadcast_over_the_batch_is_loaded_once_per_task():
    # one 64 x 64 tile per batch index, the same B for all: B is the shared panel (as a
    # convolution's weights are across output rows)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((8, 64, 256)).astype(np.float16)
    b = rng.standard_normal((256, 64)).astype(np.float16)
    c = np.zeros((8, 64, 64), np.float16)
    on = batched.compile(a, b, c, machine=TWO_CORES)
    off = batched.compile(a, b, c, machine=TWO_CORES, options=OFF)
    names = [i.srcs[0].buf.name for i in _loads(on, 0)]
    assert names.count("b") == 2 and names.count("a") == 4 * 2     # B's 2 K chunks once; A per tile
    assert len(_loads(off, 0)) == 4 * (2 + 2)
    res = on.simulate(a, b, c, checked=True)
    assert res.check["c"]["ok"], res.check
    assert res.cycles < off.simulate(a, b, c).cycles
