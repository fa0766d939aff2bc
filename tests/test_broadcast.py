"""Binary ops of operands of different ranks and broadcast dims, against numpy (float64)."""
import numpy as np
import pytest

import pypto

SHAPES = [((8, 1), (32,)), ((32,), (8, 1)), ((8, 1), (1, 32)), ((1, 32), (8, 1)), ((3, 8, 1), (32,)),
          ((8, 1), (3, 1, 32)), ((2, 8, 1), (2, 1, 32)), ((5, 1), (1,)), ((17, 1), (100,)), ((4, 1, 1), (1, 5, 1))]


@pypto.jit
def sub(x, y, out):
    out[:] = x - y


@pypto.jit
def div_tiled(x, y, out, *, T: int = 4):
    pypto.set_vec_tile_shapes(T, 16)
    out[:] = x / y


@pytest.mark.parametrize("sa,sb", SHAPES, ids=[f"{a}-{b}" for a, b in SHAPES])
def test_operands_of_other_ranks_broadcast_as_numpy(sa, sb, rng):
    x = rng.random(sa).astype(np.float32) + 0.5
    y = rng.random(sb).astype(np.float32) + 0.5
    for kernel, want in ((sub, x.astype(np.float64) - y), (div_tiled, x.astype(np.float64) / y)):
        out = np.zeros(want.shape, np.float32)
        kernel(x, y, out)
        np.testing.assert_allclose(out, want, rtol=1e-6)
        assert kernel.compile(x, y, out).simulate(x, y, out).ok


@pypto.jit
def _expand_then_mul(x, c, out):
    s = pypto.sum(x, dim=1, keepdim=True)                       # its own group, in GM
    out[:] = pypto.expand(c.reshape(1, 48), 256, 48) * s


def test_an_expand_in_a_one_row_tail_tile_keeps_its_source_alive():
    """Found by differentiating random kernels (the gradient of x * sum(x) has this shape): tiles
    of 85 rows leave a tail of 1 row, where the [1, 48] expand used to be skipped; the allocator
    gives every iteration the first one's slots, where the expand's source was dead by the time
    the sum's tile was loaded, so the load overwrote c[0] in the tail (out[255, 0] was 3823, not
    11.8).  Now the tail expands as the full tiles do."""
    rng = np.random.default_rng(0)
    x = rng.uniform(1, 1.5, (256, 48)).astype(np.float32)
    c = rng.standard_normal(48).astype(np.float32)
    out = np.zeros((256, 48), np.float32)
    ck = _expand_then_mul.compile(x, c, out)
    assert {n.attrs.get("tile") for n in ck.tensor_graph.nodes if n.op == "expand"} == {(85, 48)}
    res = ck.simulate(x, c, out)
    assert res.ok, res.check
    np.testing.assert_allclose(res.outputs["out"], c[None] * x.astype(np.float64).sum(1, keepdims=True), rtol=1e-5)


# (found by the fuzzer's expand step) an expand to more dims is its source's tile as it is; a
# reduction of it counted its dim in the expanded dims, so it reduced another dim of the source
# (wrong values) or one the source lacks (a crash in the simulator)
EXPAND_REDUCE = [((5, 64), (3, 5, 64), 0, None), ((5, 64), (3, 5, 64), 0, (2, 8, 32)),
                 ((5, 64), (7, 5, 64), 0, (4, 8, 32)), ((5, 64), (3, 5, 64), 1, (2, 2, 32)),
                 ((5, 64), (3, 5, 64), -1, None), ((64,), (6, 64), 0, (4, 64))]
REDUCERS = {"amax": np.max, "amin": np.min, "sum": np.sum, "mean": np.mean, "prod": np.prod}


@pytest.mark.parametrize("fn", list(REDUCERS) + ["softmax", "argmax"])
@pytest.mark.parametrize("src,sizes,dim,tiles", EXPAND_REDUCE, ids=[f"{a}-{b}-d{d}-t{t}" for a, b, d, t in EXPAND_REDUCE])
def test_a_reduction_of_an_expand_to_more_dims(src, sizes, dim, tiles, fn, rng):
    @pypto.jit
    def k(x, out):
        if tiles:
            pypto.set_vec_tile_shapes(*tiles)
        v = x.expand(*sizes)
        if fn == "softmax":
            out[:] = pypto.softmax(v, dim)
        elif fn == "argmax":
            out[:] = pypto.argmax(v, dim, keepdim=True)
        else:
            out[:] = getattr(pypto, fn)(v, dim=dim, keepdim=True)
    x = rng.uniform(0.5, 1.5, src).astype(np.float32)
    full = np.broadcast_to(x.astype(np.float64), sizes)
    if fn == "softmax":
        e = np.exp(full - full.max(dim, keepdims=True))
        want = e / e.sum(dim, keepdims=True)
    elif fn == "argmax":
        want = np.expand_dims(np.argmax(full, dim), dim)
    else:
        want = REDUCERS[fn](full, axis=dim, keepdims=True)
    out = np.zeros(want.shape, np.int32 if fn == "argmax" else np.float32)
    res = k.compile(x, out).simulate(x, out)
    np.testing.assert_allclose(res.outputs["out"], want, rtol=2e-6)
    assert res.ok


EXPAND_STORE = [((2, 50), (3, 2, 50), (128, 16, 64), np.float32), ((50,), (5, 50), (8, 64), np.int32),
                ((4, 1, 8), (2, 3, 4, 5, 8), (2, 2, 2, 8, 8), np.float16), ((2, 50), (7, 2, 50), (4, 2, 64), np.float32)]


@pytest.mark.parametrize("src,sizes,tiles,dt", EXPAND_STORE, ids=[f"{a}-{b}" for a, b, _, _ in EXPAND_STORE])
def test_an_expand_to_more_dims_stored_as_it_is(src, sizes, tiles, dt, rng):
    """(Found by the fuzzer.) A tile spanning copies along new dims was stored from its source's
    tile, fewer elements than its window: the simulator broadcast it, the program's text did
    not parse.  The copies are made before the store (and keep a -0.0)."""
    @pypto.jit
    def k(x, out):
        pypto.set_vec_tile_shapes(*tiles)
        out[...] = x.expand(*sizes)
    x = rng.uniform(-3, 3, src).astype(dt)
    x.flat[0] = -0.0 if dt != np.int32 else 0
    out = np.zeros(sizes, dt)
    ck = k.compile(x, out)
    res = ck.simulate(x, out)
    np.testing.assert_array_equal(res.outputs["out"], np.broadcast_to(x, sizes))
    assert dt == np.int32 or np.signbit(res.outputs["out"].flat[0])
    parsed = pypto.Program.parse(ck.program.text(), machine=ck.machine)
    assert parsed.text() == ck.program.text()


# what reads an expand to more dims: each against numpy, in three tilings (before the fixes above:
# wrong sums over two dims, variances and argmaxes, a raw AxisError in layer_norm, and programs
# whose text did not parse wherever a tile spanned copies)
EXPANDED = {
    "transpose": (lambda v: pypto.transpose(v, 0, 1), lambda b: np.swapaxes(b, 0, 1)),
    "permute": (lambda v: pypto.permute(v, (2, 0, 1)), lambda b: np.transpose(b, (2, 0, 1))),
    "concat": (lambda v: pypto.concat([v, v * 2.0], 0), lambda b: np.concatenate([b, b * 2], 0)),
    "stepped_view": (lambda v: v[::2, 1:, ::3], lambda b: b[::2, 1:, ::3]),
    "pad": (lambda v: pypto.pad(v, (1, 2)), lambda b: np.pad(b, [(0, 0), (0, 0), (1, 2)])),
    "where": (lambda v: pypto.where(v > 1.0, v, 0.0), lambda b: np.where(b > 1, b, 0)),
    "reshape": (lambda v: pypto.reshape(v, [15, 64]), lambda b: b.reshape(15, 64)),
    "gather": (lambda v: pypto.gather(v, 0, pypto.zeros([2, 5, 64], dtype=pypto.DT_INT32) + 1), lambda b: b[1:3]),
    "sum_two_dims": (lambda v: pypto.sum(v, dim=(0, 2), keepdim=True), lambda b: b.sum((0, 2), keepdims=True)),
    "logsumexp": (lambda v: pypto.logsumexp(v, 0), lambda b: np.log(np.exp(b).sum(0))),
    "var": (lambda v: pypto.var(v, 0), lambda b: b.var(0, ddof=1)),
    "argmax": (lambda v: pypto.argmax(v, 0), lambda b: np.argmax(b, 0)),
    "norm": (lambda v: pypto.norm(v, 2, 0), lambda b: np.sqrt((b * b).sum(0))),
    "layer_norm": (lambda v: pypto.layer_norm(v),
                   lambda b: (b - b.mean(-1, keepdims=True)) / np.sqrt(b.var(-1, keepdims=True) + 1e-5)),
}


@pytest.mark.parametrize("tiles", [None, (2, 8, 32), (1, 5, 64)], ids=["auto", "2x8x32", "1x5x64"])
@pytest.mark.parametrize("what", list(EXPANDED))
def test_what_reads_an_expand_to_more_dims(what, tiles, rng):
    f, ref = EXPANDED[what]
    x = rng.uniform(0.5, 1.5, (5, 64)).astype(np.float32)
    want = ref(np.broadcast_to(x.astype(np.float64), (3, 5, 64)))

    @pypto.jit
    def k(x, out):
        if tiles:
            pypto.set_vec_tile_shapes(*tiles)
        out[...] = f(x.expand(3, 5, 64))
    out = np.zeros(want.shape, np.int32 if what == "argmax" else np.float32)
    ck = k.compile(x, out)
    res = ck.simulate(x, out)
    np.testing.assert_allclose(res.outputs["out"], want, rtol=1e-5, atol=1e-6)
    assert res.ok
    assert pypto.Program.parse(ck.program.text(), machine=ck.machine).text() == ck.program.text()
