"""The Tile tier's cube path, buffering and flags (issue #15): a hand-written matmul with explicit
L1 staging and L0 extraction against numpy and against the Tensor-level matmul's cycles, a bias
through the bias table, located errors, `pypto.tile.buffers(n)` (double buffering) and
`pypto.tile.manual_sync()` with the kernel's own set_flag / wait_flag (a missing wait is a race)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import pypto
from pypto.ir.program import Program
from common import marker_line, tile_matmul

T = pypto.tile
THIS = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    return marker_line(THIS, f"# <C:{marker}>")


# ---------------------------------------------------------------------------------------
# the cube path

mm_tile = tile_matmul       # (tests/common.py: test_shared_attrs takes it too)


@pypto.jit
def mm_tensor(a, b, c):
    pypto.set_cube_tile_shapes([128, 128], [64, 128], [128, 128])
    c[:] = pypto.matmul(a, b)


@pypto.jit(level="tile")
def mm_bias(a, b, bias, c, *, TM: int = 32):
    """C = A @ B + bias (fp32 out), whole tiles extracted, the bias row through L1 -> BT."""
    for i in range(0, a.shape[0], TM):
        row = T.tmov(T.tload(bias[0:1, :], space="L1"), space="BT")
        a0 = T.textract(T.tload(a[i:i + TM, :], space="L1"), "L0A")
        b0 = T.textract(T.tload(b[:, :], space="L1"), "L0B")
        T.tstore(c[i:i + TM, :], T.tmatmul_bias(row, a0, b0))


def test_matmul_256_against_numpy_and_the_tensor_level(rng):
    a = rng.standard_normal((256, 256)).astype(np.float16)
    b = rng.standard_normal((256, 256)).astype(np.float16)
    c = np.zeros((256, 256), np.float16)
    ck = mm_tile.compile(a, b, c)
    info, = ck.tile_graph.groups
    assert (info.kind, info.core_type, info.n_outer) == ("cube", "AIC", 4)
    assert (info.domain, info.tile) == ((1, 256, 256, 256), (128, 64, 128, 128))
    ops = [n.op for n in ck.tile_graph.nodes if n.outer == 0]
    assert ops.count("TLOAD") == 4 and ops.count("TEXTRACT") == 8 and ops[-1] == "TSTORE"
    assert ops.count("TMATMUL") == 1 and ops.count("TMATMUL_ACC") == 3
    first = [n for n in ck.tile_graph.nodes if n.outer == 0]
    assert {n.space for n in first if n.op == "TLOAD"} == {"L1"}
    assert {n.space for n in first if n.op.startswith("TMATMUL")} == {"L0C"}
    assert len({n.attrs["buf"] for n in first if n.op.startswith("TMATMUL")}) == 1   # accumulates in place
    assert {t.core_type for t in ck.program.tasks} == {"AIC"}
    res = ck.simulate(a, b, c)
    assert res.ok, res.check
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(res.outputs["c"].astype(np.float64), want, rtol=2e-2, atol=0.1)
    tensor = mm_tensor.compile(a, b, c).simulate(a, b, c)
    assert tensor.ok, tensor.check
    print(f"matmul fp16 256x256x256, tiles [128, 128] x K 128 (L0 K 64) on a2a3: "
          f"tile level {res.cycles} cycles, tensor level {tensor.cycles}, ratio {res.cycles / tensor.cycles:.3f}")
    assert res.cycles <= 1.1 * tensor.cycles
    text = ck.program.text()
    assert "TMATMUL_ACC" in text and Program.parse(text).text() == text


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_matmul_with_bias_and_tails(dtype, rng):
    a = rng.standard_normal((72, 48)).astype(dtype)          # 72 rows: a tail of 8
    b = rng.standard_normal((48, 64)).astype(dtype)
    bias = rng.standard_normal((1, 64)).astype(np.float32)
    c = np.zeros((72, 64), np.float32)
    ck = mm_bias.compile(a, b, bias, c, machine="teach")
    assert {n.op for n in ck.tile_graph.nodes} >= {"TMOV", "TMATMUL_BIAS"}
    res = ck.simulate(a, b, bias, c)
    assert res.ok, res.check
    want = a.astype(np.float64) @ b.astype(np.float64) + bias
    np.testing.assert_allclose(res.outputs["c"], want, rtol=1e-3, atol=1e-2)


# ---------------------------------------------------------------------------------------
# errors at the user's line

@pypto.jit(level="tile")
def not_l0(a, b, c):
    a1 = T.tload(a[:, :], space="L1")
    b0 = T.textract(T.tload(b[:, :], space="L1"), "L0B")
    T.tstore(c[:, :], T.tmatmul(a1, b0))   # <C:not-l0>


@pypto.jit(level="tile")
def k_mismatch(a, b, c):
    a0 = T.textract(T.tload(a[:, :], space="L1"), "L0A", shape=(64, 32))
    b0 = T.textract(T.tload(b[:, :], space="L1"), "L0B")
    T.tstore(c[:, :], T.tmatmul(a0, b0))   # <C:k>


@pypto.jit(level="tile")
def big_l0a(a, b, c):
    a1 = T.tload(a[:, :], space="L1")
    a0 = T.textract(a1, "L0A")   # <C:l0a>
    T.tstore(c[:, :], T.tmatmul(a0, T.textract(T.tload(b[:, :], space="L1"), "L0B")))


@pypto.jit(level="tile")
def big_l1(a, b, c):
    a1 = T.tload(a[:, :], space="L1")   # <C:l1>
    T.tstore(c[:, :], T.tmatmul(T.textract(a1, "L0A"), T.textract(T.tload(b[:, :], space="L1"), "L0B")))


@pypto.jit(level="tile")
def big_l0c(a, b, c):
    a0 = T.textract(T.tload(a[:, :], space="L1"), "L0A")
    b0 = T.textract(T.tload(b[:, :], space="L1"), "L0B")
    T.tstore(c[:, :], T.tmatmul(a0, b0))   # <C:l0c>


@pypto.jit(level="tile")
def stale_acc(a, b, c):
    a0 = T.textract(T.tload(a[:, :], space="L1"), "L0A")
    b0 = T.textract(T.tload(b[:, :], space="L1"), "L0B")
    acc = T.tmatmul(a0, b0)
    T.tmatmul_acc(acc, a0, b0)
    T.tstore(c[:, :], acc)   # <C:stale>


@pypto.jit(level="tile")
def to_ub(a, b, c):
    acc = T.tmatmul(T.textract(T.tload(a[:, :], space="L1"), "L0A"), T.textract(T.tload(b[:, :], space="L1"), "L0B"))
    T.tstore(c[:, :], T.tmov(acc, space="UB"))   # <C:to-ub>


@pypto.jit(level="tile")
def vector_on_l0c(a, b, c):
    acc = T.tmatmul(T.textract(T.tload(a[:, :], space="L1"), "L0A"), T.textract(T.tload(b[:, :], space="L1"), "L0B"))
    T.tstore(c[:, :], T.texp(acc))   # <C:vec>


CASES = [
    (not_l0, "not-l0", pypto.UnsupportedError, "left operand is in L1", (64, 64), (64, 64), np.float16),
    (k_mismatch, "k", pypto.ShapeError, "K differs", (64, 64), (64, 64), np.float16),
    (big_l0a, "l0a", pypto.TileShapeError, "does not fit L0A", (128, 512), (512, 16), np.float16),    # 128 KiB
    (big_l1, "l1", pypto.TileShapeError, "does not fit L1", (512, 1024), (1024, 16), np.float16),    # 1 MiB
    (big_l0c, "l0c", pypto.TileShapeError, "does not fit L0C", (256, 16), (16, 256), np.float16),    # 256 KiB
    (stale_acc, "stale", pypto.UnsupportedError, "tmatmul_acc", (64, 64), (64, 64), np.float16),
    (to_ub, "to-ub", pypto.UnsupportedError, "L0C -> UB", (64, 64), (64, 64), np.float16),
    (vector_on_l0c, "vec", pypto.UnsupportedError, "UB tiles", (64, 64), (64, 64), np.float16),
]


@pytest.mark.parametrize("kernel, marker, cls, says, sa, sb, dtype", CASES, ids=[c[1] for c in CASES])
def test_cube_errors_point_at_the_users_line(kernel, marker, cls, says, sa, sb, dtype):
    a, b = np.ones(sa, dtype), np.ones(sb, dtype)
    with pytest.raises(cls) as ei:
        kernel.compile(a, b, np.zeros((sa[0], sb[1]), np.float32))
    err = ei.value
    assert err.loc is not None and os.path.abspath(err.loc.file) == THIS, str(err)
    assert err.loc.line == line_of(marker), str(err)
    assert says in str(err), str(err)
    assert err.expected is not None and err.got is not None


# ---------------------------------------------------------------------------------------
# buffers(n)

@pypto.jit(level="tile")
def streamed(x, out, *, TM: int = 16, NB: int = 2):
    with T.buffers(NB):
        for i in range(0, x.shape[0], TM):
            t = T.tload(x[i:i + TM, :])
            T.tstore(out[i:i + TM, :], T.tsqrt(T.tabs(t)))


def test_double_buffering_overlaps_the_loads(rng):
    x = rng.standard_normal((1024, 512)).astype(np.float32)
    out = np.zeros_like(x)
    runs = {}
    for nb in (1, 2):
        ck = streamed.compile(x, out, NB=nb, machine="teach")
        assert {n.attrs["nbuf"] for n in ck.tile_graph.nodes if n.space} == {nb}
        runs[nb] = ck.simulate(x, out)
        assert runs[nb].ok, runs[nb].check
    print(f"load-bound loop [1024, 512] fp32, TM=16 on teach: 1 buffer {runs[1].cycles} cycles, "
          f"2 buffers {runs[2].cycles}")
    assert runs[2].cycles < 0.8 * runs[1].cycles
    np.testing.assert_array_equal(runs[1].outputs["out"], runs[2].outputs["out"])
    np.testing.assert_allclose(runs[2].outputs["out"], np.sqrt(np.abs(x)), rtol=1e-6)


@pypto.jit(level="tile")
def too_many_buffers(x, out):
    T.buffers(4)
    t = T.tload(x[0:16, :])   # <C:buffers>
    T.tstore(out[0:16, :], T.texp(t))


@pypto.jit(level="tile")
def bad_count(x, out):
    T.buffers(0)   # <C:count>
    T.tstore(out[0:16, :], T.tload(x[0:16, :]))


def test_buffers_errors():
    x = np.ones((16, 1024), np.float32)          # 64 KiB tiles: 2 x 4 copies do not fit 192 KiB
    with pytest.raises(pypto.TileShapeError, match="fewer buffers") as ei:
        too_many_buffers.compile(x, np.zeros_like(x))
    assert ei.value.loc.line == line_of("buffers")
    with pytest.raises(pypto.UnsupportedError, match="count of buffers") as ei:
        bad_count.compile(x, np.zeros_like(x))
    assert ei.value.loc.line == line_of("count")


# ---------------------------------------------------------------------------------------
# manual sync

@pypto.jit(level="tile")
def synced(x, out, *, TM: int = 16, forget: bool = False):
    T.manual_sync()
    for i in range(0, x.shape[0], TM):
        t = T.tload(x[i:i + TM, :])
        T.set_flag("MTE2", "V", 0)
        T.wait_flag("MTE2", "V", 0)
        e = T.texp(t)   # <C:texp>
        T.set_flag("V", "MTE3", 1)
        if not forget:
            T.wait_flag("V", "MTE3", 1)
        T.tstore(out[i:i + TM, :], e)   # <C:tstore>
        T.set_flag("MTE3", "MTE2", 2)           # this iteration's buffers are free again
        T.wait_flag("MTE3", "MTE2", 2)


def test_manual_sync_keeps_the_kernels_flags(rng):
    x = rng.standard_normal((128, 256)).astype(np.float32)
    out = np.zeros_like(x)
    ck = synced.compile(x, out, machine="teach")
    names = [r.name for r in ck.pass_log]
    assert "scheduling" not in names and "insert_sync" in names
    assert len(ck.tile_graph.groups) == 1                  # the flags join their iterations' chains
    flags = [(i.op, i.attrs["src"], i.attrs["dst"], i.attrs["event"]) for t in ck.exec_graph.tasks
             for i in t.instrs if i.op in ("SET_FLAG", "WAIT_FLAG")]
    assert len(flags) == 6 * 128 // 16 and {f[3] for f in flags} == {0, 1, 2}
    res = ck.simulate(x, out)
    assert res.ok and not res.races, (res.check, res.races)
    np.testing.assert_allclose(res.outputs["out"], np.exp(x), rtol=1e-6)
    text = ck.program.text()
    assert Program.parse(text).text() == text


def test_a_forgotten_wait_is_a_race_naming_both_lines(rng):
    x = rng.standard_normal((128, 256)).astype(np.float32)
    out = np.zeros_like(x)
    ck = synced.compile(x, out, machine="teach", forget=True)
    res = ck.simulate(x, out)
    assert not res.ok and res.races
    race = res.races[0]
    assert "TSTORE" in race and "TEXP" in race, race
    assert f"test_tile_cube.py:{line_of('tstore')}" in race and f"test_tile_cube.py:{line_of('texp')}" in race, race
    with pytest.raises(pypto.SimulationError, match=f"test_tile_cube.py:{line_of('texp') + 1}"):
        ck.simulate(x, out, checked=True)                # the V -> MTE3 set is never waited for


@pypto.jit(level="tile")
def flag_without_manual(x, out):
    t = T.tload(x[0:16, :])
    T.set_flag("MTE2", "V", 0)   # <C:no-manual>
    T.wait_flag("MTE2", "V", 0)
    T.tstore(out[0:16, :], T.texp(t))


@pypto.jit(level="tile")
def cube_pipe_on_aiv(x, out):
    T.manual_sync()
    t = T.tload(x[0:16, :])
    T.set_flag("MTE2", "M", 0)   # <C:pipe>
    T.tstore(out[0:16, :], T.texp(t))


@pypto.jit(level="tile")
def bad_event(x, out):
    T.manual_sync()
    t = T.tload(x[0:16, :])
    T.set_flag("MTE2", "V", 8)   # <C:event>
    T.tstore(out[0:16, :], T.texp(t))


@pytest.mark.parametrize("kernel, marker, says", [(flag_without_manual, "no-manual", "manual_sync"),
                                                 (cube_pipe_on_aiv, "pipe", "the M pipe"),
                                                 (bad_event, "event", "event id")])
def test_flag_errors(kernel, marker, says):
    x = np.ones((16, 64), np.float32)
    with pytest.raises(pypto.UnsupportedError, match=says) as ei:
        kernel.compile(x, np.zeros_like(x))
    assert ei.value.loc.line == line_of(marker), str(ei.value)
    assert ei.value.expected is not None and ei.value.got is not None
