"""Tile-level kernels (`@pypto.jit(level="tile")`, `pypto.tile`): PTO instructions in lower case on
tiles in named buffers, entering the pipeline at the Tile Graph.  Results against numpy on both
machines (with tails), the hand-written softmax's cycles against the Tensor-level one, located
errors, the program text round trip and the levels of the compiled kernel."""
from __future__ import annotations

import os

import numpy as np
import pytest

import pypto
from pypto.ir.program import Program
from pypto.ir.tensor import verify as verify_tensor
from common import marker_line

T = pypto.tile
THIS = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    return marker_line(THIS, f"# <T:{marker}>")


# ---------------------------------------------------------------------------------------
# kernels

@pypto.jit(level="tile")
def exp_k(x, out, *, TM: int = 16):
    for i in range(0, x.shape[0], TM):
        t = pypto.tile.tload(x[i:i + TM, :], space="UB")
        pypto.tile.tstore(out[i:i + TM, :], pypto.tile.texp(t))


@pypto.jit(level="tile")
def softmax_tile(x, out, *, TM: int = 16):
    for i in range(0, x.shape[0], TM):
        t = T.tload(x[i:i + TM, :])
        e = T.texp(T.trowexpandsub(t, T.trowmax(t)))
        T.tstore(out[i:i + TM, :], T.trowexpanddiv(e, T.trowsum(e)))


@pypto.jit
def softmax_tensor(x, out, *, TM: int = 16):
    pypto.set_vec_tile_shapes(TM, x.shape[1])
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)


@pypto.jit(level="tile")
def mixed(x, y, out, colsum, *, TM: int = 8):
    """Several instruction forms: scalar, tile-tile, unary, conversion, column reduction."""
    for i in range(0, x.shape[0], TM):
        a = T.tload(x[i:i + TM, :])
        b = T.tload(y[i:i + TM, :])
        c = T.tmax(T.tmuls(T.tadds(a, 1.5), 0.5), T.tabs(b))
        d = T.tsqrt(T.tadd(T.tmul(c, c), T.trelu(T.tsub(b, T.tneg(a)))))
        T.tstore(out[i:i + TM, :], T.tcvt(T.tdiv(d, T.tadds(T.tabs(a), 1.0)), pypto.DT_FP16))
    t = T.tload(x[0:TM, :])
    T.tstore(colsum[0:1, :], T.tcolsum(T.texp(t)))


def softmax_ref(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ---------------------------------------------------------------------------------------
# results

@pytest.mark.parametrize("machine", ["a2a3", "teach"])
def test_example_kernel_with_tail(machine, rng):
    x = rng.standard_normal((100, 96)).astype(np.float32)       # 100 rows: a tail of 4
    out = np.zeros_like(x)
    ck = exp_k.compile(x, out, machine=machine)
    res = ck.simulate(x, out)
    assert res.ok, res.check
    np.testing.assert_allclose(res.outputs["out"], np.exp(x), rtol=1e-6)
    info, = ck.tile_graph.groups
    assert (info.kind, info.tile, info.n_outer, info.n_inner) == ("vector", (16, 96), 7, 1)
    tail = [n for n in ck.tile_graph.nodes if n.outer == 6 and n.op != "TSTORE"]
    assert all(n.shape == (16, 96) and n.valid == (4, 96) for n in tail)
    exp_k(x, out, machine=machine)           # the call form fills `out`
    np.testing.assert_allclose(out, np.exp(x), rtol=1e-6)


@pytest.mark.parametrize("machine", ["a2a3", "teach"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax_against_numpy(machine, dtype, rng):
    x = (3 * rng.standard_normal((250, 256))).astype(dtype)     # 250 = 15 x 16 + 10
    out = np.zeros_like(x)
    res = softmax_tile.compile(x, out, machine=machine).simulate(x, out)
    assert res.ok, res.check
    tol = 1e-5 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(res.outputs["out"].astype(np.float64), softmax_ref(x), atol=tol, rtol=tol * 10)


def test_instruction_forms_and_two_groups(rng):
    x = rng.standard_normal((44, 64)).astype(np.float32)
    y = rng.standard_normal((44, 64)).astype(np.float32)
    out, colsum = np.zeros((44, 64), np.float16), np.zeros((1, 64), np.float32)
    ck = mixed.compile(x, y, out, colsum)
    assert [g.n_outer for g in ck.tile_graph.groups] == [6, 1]    # the loop's chains, then one more
    res = ck.simulate(x, y, out, colsum)
    assert res.ok, res.check
    c = np.maximum((x + 1.5) * 0.5, np.abs(y))
    want = np.sqrt(c * c + np.maximum(y + x, 0)) / (np.abs(x) + 1.0)
    np.testing.assert_allclose(res.outputs["out"].astype(np.float32), want, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(res.outputs["colsum"], np.exp(x[:8]).sum(0, keepdims=True), rtol=1e-5)


def test_softmax_cycles_against_the_tensor_level(rng):
    """The same instructions on the same tiles: the tile level takes the Tensor level's cycles
    in fp32; in fp16 it is faster, as it computes in fp16 where the Tensor level's autocast
    computes in fp32 (with it off, the two are the same program again)."""
    for dtype in (np.float32, np.float16):
        x = rng.standard_normal((1000, 512)).astype(dtype)
        out = np.zeros_like(x)
        tile = softmax_tile.compile(x, out, TM=16).simulate(x, out, mode="timing").cycles
        tensor = softmax_tensor.compile(x, out, TM=16).simulate(x, out, mode="timing").cycles
        plain = softmax_tensor.compile(x, out, TM=16, options={"autocast": False}).simulate(
            x, out, mode="timing").cycles
        print(f"softmax {np.dtype(dtype).name} [1000, 512] TM=16 on a2a3: tile level {tile} cycles, "
              f"tensor level {tensor} (autocast off: {plain}), ratio {tile / tensor:.3f}")
        assert tile <= 1.05 * tensor
        assert tile <= 1.05 * plain


# ---------------------------------------------------------------------------------------
# levels and text

def test_every_level_and_the_program_text_round_trip(rng):
    x = rng.standard_normal((40, 128)).astype(np.float32)
    out = np.zeros_like(x)
    ck = softmax_tile.compile(x, out, machine="teach", snapshots=True)
    assert set(ck.levels) == {"tensor", "tile", "block", "exec", "pto"}
    assert all(v is not None and len(v) for v in ck.levels.values())
    verify_tensor(ck.tensor_graph)
    assert ck.tensor_graph is ck.traced and ck.traced.output_names == ("out",)
    assert {n.op for n in ck.tensor_graph.nodes} >= {"amax", "sub", "exp", "sum", "div", "store"}
    assert [r.name for r in ck.pass_log][:2] == ["tile_kernel", "assign_spaces"]
    assert "tiling" not in [r.name for r in ck.pass_log] and "fusion" not in [r.name for r in ck.pass_log]
    assert ck.diff("tile_kernel").is_lowering
    ops = [n.op for n in ck.tile_graph.nodes if n.outer == 0]
    assert ops == ["TLOAD", "TROWMAX", "TROWEXPANDSUB", "TEXP", "TROWSUM", "TROWEXPANDDIV", "TSTORE"]
    assert all(n.loc is not None and os.path.abspath(n.loc.file) == THIS for n in ck.tile_graph.nodes)
    assert len(ck.block_graph) == 3                              # 3 row blocks (the last a tail), 3 tasks
    text = ck.program.text()
    assert Program.parse(text).text() == text
    again = Program.parse(text, machine="teach")
    from pypto.sim.run import simulate
    got = simulate(again, {"x": x, "out": out}, machine="teach", mode="functional").outputs["out"]
    np.testing.assert_array_equal(got, ck.simulate(x, out, mode="functional").outputs["out"])


def test_generated_names_follow_the_instruction_table():
    from pypto.target.isa import INSTRUCTIONS
    names = ("tload tstore tadd tsub tmul tdiv tmax tmin tadds tmuls texp tlog tsqrt trsqrt trecip tabs tneg trelu "
             "tcvt trowsum trowmax trowmin tcolsum tcolmax trowexpandadd trowexpandsub trowexpandmul "
             "trowexpanddiv").split()
    for name in names:
        assert callable(getattr(pypto.tile, name)), name
        assert name.upper() in INSTRUCTIONS
    assert "TROWEXPANDSUB" in pypto.tile.trowexpandsub.__doc__


# ---------------------------------------------------------------------------------------
# errors at the user's line

@pypto.jit(level="tile")
def wrong_space(x, out):
    t = T.tload(x[0:16, :], space="L1")
    T.tstore(out[0:16, :], T.texp(t))   # <T:space>


@pypto.jit(level="tile")
def wrong_path(x, out):
    t = T.tload(x[0:16, :], space="L0A")   # <T:path>
    T.tstore(out[0:16, :], t)


@pypto.jit(level="tile")
def too_big(x, out, *, TM: int = 16):
    for i in range(0, x.shape[0], TM):
        t = T.tload(x[i:i + TM, :])   # <T:big>
        T.tstore(out[i:i + TM, :], T.texp(t))


@pypto.jit(level="tile")
def group_too_big(x, out, *, TM: int = 16):
    t = T.tload(x[0:TM, :])   # <T:group>
    a = T.texp(t)
    T.tstore(out[0:TM, :], T.tadd(T.tadd(a, t), T.tmul(a, t)))


@pypto.jit(level="tile")
def bad_shapes(x, out):
    a = T.tload(x[0:16, :])
    T.tstore(out[0:16, :], T.trowexpandsub(a, a))   # <T:expand>


@pypto.jit(level="tile")
def bad_binary(x, out):
    a = T.tload(x[0:16, :])
    b = T.tload(x[16:24, :])
    T.tstore(out[0:16, :], T.tadd(a, b))   # <T:binary>


@pypto.jit(level="tile")
def bad_store(x, out):
    a = T.tload(x[0:16, :])
    T.tstore(out[0:8, :], a)   # <T:store>


@pypto.jit(level="tile")
def tensor_op(x, out):
    a = T.tload(x[0:16, :])
    y = pypto.exp(x[0:16, :])   # <T:tensor-op>
    T.tstore(out[0:16, :], T.tadd(a, T.tload(x[16:32, :])))
    out[16:32, :] = y


@pypto.jit(level="tile")
def tensor_write(x, out):
    T.tstore(out[0:16, :], T.tload(x[0:16, :]))
    out[16:32, :] = x[16:32, :]   # <T:tensor-write>


@pypto.jit(level="tile")
def store_tensor(x, out):
    T.tstore(out[0:16, :], x[0:16, :])   # <T:not-a-tile>


@pypto.jit(level="tile")
def reload(x, out):
    """A chain reloading its own store (another chain's, of an earlier group, is a GM round trip:
    tests/test_tile_ops_more.py)."""
    t = T.texp(T.tload(x[0:16, :]))
    T.tstore(x[0:16, :], t)
    T.tstore(out[0:16, :], T.tadd(t, T.tload(x[0:16, :])))   # <T:reload>


@pypto.jit
def tensor_level_uses_tile_op(x, out):
    out[:] = x
    T.texp(x)   # <T:outside>


CASES = [
    (wrong_space, "space", pypto.UnsupportedError, "UB", (64, 64)),
    (wrong_path, "path", pypto.UnsupportedError, "GM -> L0A", (64, 64)),
    (too_big, "big", pypto.TileShapeError, "does not fit UB", (64, 4096)),     # 16 x 4096 fp32 = 256 KiB
    (group_too_big, "group", pypto.TileShapeError, "do not fit UB", (64, 1024)),   # 4 x 64 KiB live
    (bad_shapes, "expand", pypto.ShapeError, "[16,1]", (64, 64)),
    (bad_binary, "binary", pypto.ShapeError, "[8,64]", (64, 64)),
    (bad_store, "store", pypto.ShapeError, "[16,64]", (64, 64)),
    (tensor_op, "tensor-op", pypto.UnsupportedError, "Tensor-level", (64, 64)),
    (tensor_write, "tensor-write", pypto.UnsupportedError, "Tensor-level write", (64, 64)),
    (store_tensor, "not-a-tile", pypto.UnsupportedError, "tload", (64, 64)),
    (reload, "reload", pypto.UnsupportedError, "already stored", (64, 64)),
    (tensor_level_uses_tile_op, "outside", pypto.UnsupportedError, 'level="tile"', (64, 64)),
]


@pytest.mark.parametrize("kernel, marker, cls, says, shape", CASES, ids=[c[1] for c in CASES])
def test_errors_point_at_the_users_line(kernel, marker, cls, says, shape):
    x = np.ones(shape, np.float32)
    with pytest.raises(cls) as ei:
        kernel.compile(x, np.zeros_like(x))
    err = ei.value
    assert err.loc is not None and os.path.abspath(err.loc.file) == THIS, str(err)
    assert err.loc.line == line_of(marker), str(err)
    assert says in str(err), str(err)
    assert err.expected is not None and err.got is not None


def test_unknown_level():
    with pytest.raises(pypto.UnsupportedError, match="no kernel level"):
        pypto.jit(level="exec")


@pypto.jit(level="tile")
def tiles_2d(x, out, *, TM: int = 16, TN: int = 64):
    for i in range(0, x.shape[0], TM):
        for j in range(0, x.shape[1], TN):
            a = T.tload(x[i:i + TM, j:j + TN])
            T.tstore(out[i:i + TM, j:j + TN], T.tsub(T.texp(a), a))


def test_two_dim_loops_with_tails_in_both_dims_and_the_tools(rng):
    x = rng.standard_normal((50, 200)).astype(np.float16)        # tails of 2 rows and 8 columns
    out = np.zeros_like(x)
    ck = tiles_2d.compile(x, out)
    info, = ck.tile_graph.groups
    assert (info.tile, info.n_outer) == ((16, 64), 16)
    assert {n.valid for n in ck.tile_graph.nodes if n.op == "TLOAD"} == {(16, 64), (16, 8), (2, 64), (2, 8)}
    res = ck.simulate(x, out)
    assert res.ok, res.check
    assert "no findings" in str(pypto.check_graph(tiles_2d, x, out))
    tuned = pypto.tune(tiles_2d, {"TM": [8, 16]}, x, out)
    assert len(tuned.ok_rows) == 2
