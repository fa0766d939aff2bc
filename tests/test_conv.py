"""conv2d: NCHW and NHWC, on the cube as one matmul per kernel position, against numpy."""
import numpy as np
import pytest

import pypto

from common import conv_relu_nhwc


def conv_nhwc(x, w):
    """Reference: x [N,H,W,C], w [KH,KW,C,F], stride 1, no padding."""
    kh_, kw_, _, f = w.shape
    n, h, wd, _ = x.shape
    out = np.zeros((n, h - kh_ + 1, wd - kw_ + 1, f), np.float64)
    for kh in range(kh_):
        for kw in range(kw_):
            out += np.einsum("nhwc,cf->nhwf", x[:, kh:kh + out.shape[1], kw:kw + out.shape[2]].astype(np.float64),
                             w[kh, kw].astype(np.float64))
    return out


@pypto.jit
def conv_nchw(x, w, y):
    pypto.set_cube_tile_shapes([32, 32], [16, 64], [32, 32])
    y[:] = pypto.conv2d(x, w)


@pypto.jit
def two_convs_nchw(x, w1, w2, y):
    pypto.set_cube_tile_shapes([32, 32], [16, 64], [32, 32])
    y[:] = pypto.conv2d(pypto.conv2d(x, w1), w2)


def test_conv_relu_nhwc(rng):
    x = rng.standard_normal((2, 10, 36, 16)).astype(np.float32)
    w = rng.standard_normal((3, 3, 16, 32)).astype(np.float32)
    y = np.zeros((2, 8, 34, 32), np.float32)
    ck = conv_relu_nhwc.compile(x, w, y, machine="teach")
    assert sum(n.op == "matmul" for n in ck.tensor_graph.nodes) == 9
    # the seeds' Conv+ReLU: one cube group, the 9 kernel positions accumulate in L0C and the FIX
    # pipe applies the ReLU on the way out; no vector core takes part
    assert [g.kind for g in ck.tile_graph.groups] == ["cube"]
    assert ck.tile_graph.groups[0].n_inner == 9
    ops = [i for t in ck.program.tasks for i in t.instrs]
    assert {t.core_type for t in ck.program.tasks} == {"AIC"}
    assert all(i.attrs.get("act") == "relu" for i in ops if i.op == "TSTORE")
    res = ck.simulate(x, w, y, checked=True)
    np.testing.assert_allclose(res.outputs["y"], np.maximum(conv_nhwc(x, w), 0), rtol=1e-4, atol=1e-3)
    unfused = conv_relu_nhwc.compile(x, w, y, machine="teach", options={"fusion": False})
    assert len(unfused.tile_graph.groups) == 9 + 8 + 1          # matmuls, the adds, the ReLU
    assert res.cycles < unfused.simulate(x, w, y).cycles


@pypto.jit
def two_matmuls(a, b, c, d, out):
    pypto.set_cube_tile_shapes([64, 64], [64, 128], [64, 64])
    out[:] = pypto.matmul(a, b) + pypto.matmul(c, d)


@pytest.mark.parametrize("k2, groups", [(128, ["cube"]), (192, ["cube", "cube", "vector"])])
def test_a_sum_of_matmuls_accumulates_in_l0c_when_k_matches(rng, k2, groups):
    a = rng.standard_normal((128, 128)).astype(np.float32)
    b = rng.standard_normal((128, 96)).astype(np.float32)
    c = rng.standard_normal((128, k2)).astype(np.float32)
    d = rng.standard_normal((k2, 96)).astype(np.float32)
    out = np.zeros((128, 96), np.float32)
    ck = two_matmuls.compile(a, b, c, d, out, machine="teach")
    assert [g.kind for g in ck.tile_graph.groups] == groups
    res = ck.simulate(a, b, c, d, out, checked=True)
    np.testing.assert_allclose(res.outputs["out"], a.astype(np.float64) @ b + c.astype(np.float64) @ d,
                               rtol=1e-4, atol=1e-3)


def test_conv_nchw_reads_channels_last_through_views(rng):
    x = rng.standard_normal((1, 16, 12, 20)).astype(np.float32)        # N, C, H, W
    w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)         # F, C, KH, KW
    y = np.zeros((1, 24, 10, 18), np.float32)
    ck = conv_nchw.compile(x, w, y, machine="teach")
    # the NCHW input is never copied to NHWC: the matmuls load strided windows of x
    assert not any(n.op == "copy" and n.inputs and ck.tensor_graph.node(n.inputs[0]).op == "input"
                   for n in ck.tensor_graph.nodes)
    want = conv_nhwc(x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(ck.simulate(x, w, y).outputs["y"], want, rtol=1e-4, atol=1e-3)


def test_stacked_nchw_convs_drop_the_transposes_between_them(rng):
    x = rng.standard_normal((1, 8, 10, 12)).astype(np.float32)
    w1 = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
    y = np.zeros((1, 8, 6, 8), np.float32)
    ck = two_convs_nchw.compile(x, w1, w2, y, machine="teach")

    def transposes(g):
        return sum(n.op == "transpose" for n in g.nodes)
    # traced: per conv 2 transposes of the input, 3 of the weight, 2 of the result; the result's
    # NHWC -> NCHW after the first conv and the NCHW -> NHWC before the second cancel out
    assert transposes(ck.traced) == 14 and transposes(ck.tensor_graph) == 10
    mid = conv_nhwc(x.transpose(0, 2, 3, 1), w1.transpose(2, 3, 1, 0))
    want = conv_nhwc(mid, w2.transpose(2, 3, 1, 0)).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(ck.simulate(x, w1, w2, y).outputs["y"], want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("wshape, message", [((3, 3, 8, 4), "weight does not fit the input"),
                                             ((3, 3, 16), "input and weight must be 4-D")])
def test_conv_errors_name_the_line(rng, wshape, message):
    x = np.zeros((1, 6, 6, 16), np.float32)
    w = np.zeros(wshape, np.float32)

    @pypto.jit
    def k(x, w, y):
        y[:] = pypto.conv2d(x, w, layout="NHWC")

    with pytest.raises(pypto.ShapeError, match=message) as e:
        k.compile(x, w, np.zeros((1, 4, 4, 4), np.float32))
    assert "pypto.conv2d(x, w" in str(e.value)


@pypto.jit
def conv_relu_conv_nchw(x, w1, w2, y):
    pypto.set_cube_tile_shapes([32, 32], [16, 64], [32, 32])
    y[:] = pypto.conv2d(pypto.relu(pypto.conv2d(x, w1)), w2)


def test_nchw_conv_relu_conv_keeps_the_relu_on_the_cube(rng):
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    w1 = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((16, 32, 3, 3)).astype(np.float32)
    y = np.zeros((1, 16, 8, 8), np.float32)
    ck = conv_relu_conv_nchw.compile(x, w1, w2, y, machine="teach")
    # the ReLU reads the first conv channels-last (its transposes sink below it and cancel with
    # the second conv's): it joins the first cube group, and only the NCHW result is copied
    assert [g.kind for g in ck.tile_graph.groups] == ["cube", "cube", "vector"]
    first = ck.tile_graph.nodes
    assert any(n.op == "TSTORE" and n.attrs.get("act") == "relu" for n in first if n.group == 0)
    res = ck.simulate(x, w1, w2, y, checked=True)
    nhwc = x.transpose(0, 2, 3, 1)
    mid = np.maximum(conv_nhwc(nhwc, w1.transpose(2, 3, 1, 0)), 0)
    want = conv_nhwc(mid, w2.transpose(2, 3, 1, 0)).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(res.outputs["y"], want, rtol=1e-4, atol=1e-2)



@pypto.jit
def conv_relu_nchw(x, w, y):
    y[:] = pypto.relu(pypto.conv2d(x, w))


def test_the_nchw_result_is_written_back_tile_by_tile_next_to_the_cube(rng):
    x = rng.standard_normal((2, 64, 18, 18)).astype(np.float16)
    w = (0.1 * rng.standard_normal((128, 64, 3, 3))).astype(np.float16)
    y = np.zeros((2, 128, 16, 16), np.float16)
    ck = conv_relu_nchw.compile(x, w, y, machine="teach")
    cube, copy = ck.tile_graph.groups
    # the copy back to NCHW reads the cube's channels-last tiles through transposed views: its
    # tile nests in the cube tile (16 output columns x 128 channels -> 64 channels x 16 columns)
    assert cube.tile[0] == 16 and cube.tile[2] == 128 and copy.tile == (1, 64, 1, 16)
    vec = [t for t in ck.program.tasks if t.core_type == "AIV"]
    assert vec and all(t.pair is not None for t in vec)                 # paired with the cube tasks
    assert any(i.op == "CROSS_WAIT_FLAG" for t in vec for i in t.instrs)    # and streamed per tile
    res = ck.simulate(x, w, y, checked=True)
    want = np.maximum(conv_nhwc(x.transpose(0, 2, 3, 1).astype(np.float32),
                                w.transpose(2, 3, 1, 0).astype(np.float32)), 0).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(res.outputs["y"].astype(np.float32), want, rtol=2e-2, atol=2e-2)
    unpaired = conv_relu_nchw.compile(x, w, y, machine="teach", options={"pairing": False})
    assert res.cycles < 0.9 * unpaired.simulate(x, w, y).cycles        # 25700 vs 29374 cycles
