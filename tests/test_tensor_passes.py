"""The Tensor-level passes `simplify` (algebraic identities, constant folding) and `cse`
(common subexpression elimination)."""
import collections

import numpy as np
import pytest

import pypto
from pypto.compiler.tensor_passes import TENSOR_PASSES, cse, dce, fold, simplify
from pypto.dtypes import DT_FP16, DT_FP32, DT_INT32
from pypto.ir.core import Attrs
from pypto.ir.tensor import Param, TensorGraph, TileSpec, TNode, verify
from pypto.ir.tensor_eval import evaluate

SHAPE = (64, 256)


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)


def _ops(g) -> collections.Counter:
    return collections.Counter(n.op for n in g.nodes)


def _run(kernel, *args, pipeline=None):
    """Compile, simulate (checked against the reference), return (compiled kernel, result)."""
    ck = kernel.compile(*args) if pipeline is None else pipeline.compile(kernel, *args)
    res = ck.simulate(*args)
    assert res.ok, res.check
    return ck, res


def _after(kernel, *args, name="dce"):
    """The Tensor Graph as pass `name` left it (fusion later normalises the tile attrs)."""
    ck = kernel.compile(*args, snapshots=True)
    return dict(ck.snapshots)[name]


def _record(ck, name):
    (rec,) = [r for r in ck.pass_log if r.name == name]
    return rec


def test_tensor_pass_order():
    assert [p.name for p in TENSOR_PASSES] == ["decompose", "legalize", "simplify", "cse", "dce"]


# --- cse -----------------------------------------------------------------------------------------
@pypto.jit
def double_exp(x, out):
    out[:] = pypto.exp(x) + pypto.exp(x)


def test_cse_merges_a_duplicated_exp_and_saves_cycles(x):
    out = np.zeros_like(x)
    ck, res = _run(double_exp, x, out)
    assert _ops(ck.traced)["exp"] == 2
    assert _ops(ck.tensor_graph)["exp"] == 1
    np.testing.assert_allclose(res.outputs["out"], 2 * np.exp(x), rtol=1e-5, atol=1e-6)
    rec = _record(ck, "cse")
    assert rec.nodes_before - rec.nodes_after == 1      # the second exp
    assert "simplify" in ck.pass_log.text(timing=False) and "cse" in ck.pass_log.text(timing=False)

    nocse, res2 = _run(double_exp, x, out, pipeline=pypto.CompilerPipeline().remove("cse"))
    assert "cse" not in [r.name for r in nocse.pass_log]
    assert _ops(nocse.tensor_graph)["exp"] == 2
    assert res.cycles < res2.cycles
    assert len(ck.program) < len(nocse.program)


@pypto.jit
def commuted(x, y, out):
    out[:] = pypto.exp(x) * y + y * pypto.exp(x)


def test_cse_ignores_the_operand_order_of_commutative_ops(x):
    y, out = x[::-1].copy(), np.zeros_like(x)
    ck, res = _run(commuted, x, y, out)
    assert _ops(ck.tensor_graph)["exp"] == 1 and _ops(ck.tensor_graph)["mul"] == 1
    np.testing.assert_allclose(res.outputs["out"], 2 * np.exp(x) * y, rtol=1e-5, atol=1e-6)


@pypto.jit
def two_tilings(x, out):
    pypto.set_vec_tile_shapes(32, 256)
    a = pypto.exp(x)
    pypto.set_vec_tile_shapes(32, 256)      # the same tile, set again on another line
    b = pypto.exp(x)
    pypto.set_vec_tile_shapes(16, 256)      # another tile: a different computation schedule
    c = pypto.exp(x)
    out[:] = a + b + c


def test_cse_compares_tiles_by_dims_not_location(x):
    out = np.zeros_like(x)
    ck, res = _run(two_tilings, x, out)
    exps = [n for n in ck.traced.nodes if n.op == "exp"]
    assert exps[0].attrs["tile"].loc != exps[1].attrs["tile"].loc
    assert _ops(ck.tensor_graph)["exp"] == 2
    np.testing.assert_allclose(res.outputs["out"], 3 * np.exp(x), rtol=1e-5, atol=1e-6)


def _graph(nodes, params=(("x", SHAPE, DT_FP32), ("out", SHAPE, DT_FP32))):
    """A hand-made graph from (op, inputs, shape, dtype, attrs) tuples, ids in order."""
    g = TensorGraph("k", tuple(Param(*p) for p in params),
                    tuple(TNode(i, op, tuple(ins), tuple(shape), dt, Attrs(attrs))
                          for i, (op, ins, shape, dt, attrs) in enumerate(nodes)))
    verify(g)
    return g


def _store(v, shape=SHAPE, param="out"):
    return ("store", [v], shape, DT_FP32, {"param": param, "offsets": (0,) * len(shape), "shape": shape})


def test_cse_merges_equal_consts_but_not_inputs_stores_or_signed_zeros():
    g = _graph([("input", [], SHAPE, DT_FP32, {"param": "x"}),
                ("input", [], SHAPE, DT_FP32, {"param": "x"}),        # same param: still two inputs
                ("input", [], SHAPE, DT_FP32, {"param": "out"}),
                ("const", [], (), DT_FP32, {"value": 2.0}),
                ("const", [], (), DT_FP32, {"value": 2.0}),
                ("const", [], (), DT_FP16, {"value": 2.0}),           # another dtype
                ("const", [], (), DT_FP32, {"value": 0.0}),
                ("const", [], (), DT_FP32, {"value": -0.0}),
                ("mul", [0, 3], SHAPE, DT_FP32, {}),
                ("mul", [0, 4], SHAPE, DT_FP32, {}),                  # = %8 once the consts merge
                ("add", [8, 6], SHAPE, DT_FP32, {}),
                ("add", [9, 7], SHAPE, DT_FP32, {}),                  # x*2 + -0.0 is not x*2 + 0.0
                _store(10), _store(11)])
    out = cse(g)
    verify(out)
    c = _ops(out)
    assert (c["input"], c["const"], c["mul"], c["add"], c["store"]) == (3, 4, 1, 2, 2)
    xv = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    arrays = {"x": xv, "out": np.zeros_like(xv)}
    np.testing.assert_array_equal(evaluate(out, arrays)["out"], evaluate(g, arrays)["out"])


# --- simplify ------------------------------------------------------------------------------------
@pypto.jit
def identities(x, out):
    out[:] = (x * 1.0) + 0.0


def test_identities_fold_to_a_copy_of_the_input(x):
    out = np.zeros_like(x)
    ck, res = _run(identities, x, out)
    assert _ops(ck.tensor_graph) == {"input": 2, "copy": 1, "store": 1}
    np.testing.assert_array_equal(res.outputs["out"], x)
    simp, d = _record(ck, "simplify"), _record(ck, "dce")
    assert (simp.nodes_before, simp.nodes_after) == (7, 6)   # mul, add gone, a copy added
    assert d.nodes_after == 4                                # the two consts were dead


@pypto.jit
def more_identities(x, out):
    pypto.set_vec_tile_shapes(32, 128)
    y = pypto.exp(x)
    out[:] = -(-(y / 1.0 - 0.0)) * 1.0


def test_identities_on_computed_values_keep_their_tile_and_loc(x):
    out = np.zeros_like(x)
    ck, res = _run(more_identities, x, out)
    assert _ops(ck.tensor_graph) == {"input": 2, "exp": 1, "store": 1}
    (e,) = [n for n in _after(more_identities, x, out).nodes if n.op == "exp"]
    (te,) = [n for n in ck.traced.nodes if n.op == "exp"]
    assert e.loc == te.loc and e.loc is not None and e.attrs["tile"] == TileSpec((32, 128))
    np.testing.assert_allclose(res.outputs["out"], np.exp(x), rtol=1e-6)


@pypto.jit
def scaled(x, out):
    pypto.set_vec_tile_shapes(32, 256)
    out[:] = x * 2.0 * 3.0


def test_a_chain_of_scalings_becomes_one_mul(x):
    out = np.zeros_like(x)
    ck, res = _run(scaled, x, out)
    g = ck.tensor_graph
    assert _ops(g)["mul"] == 1
    (m,) = [n for n in g.nodes if n.op == "mul"]
    assert g.node(m.inputs[1]).attrs["value"] == 6.0
    second = [n for n in ck.traced.nodes if n.op == "mul"][1]
    (m,) = [n for n in _after(scaled, x, out).nodes if n.op == "mul"]
    assert m.loc == second.loc and m.attrs["tile"] == TileSpec((32, 256))
    np.testing.assert_allclose(res.outputs["out"], x * 6.0, rtol=1e-6)


@pypto.jit
def shared_scaling(x, out, out2):
    t = x * 2.0
    out[:] = t * 3.0
    out2[:] = t


def test_a_scaling_read_elsewhere_is_not_merged(x):
    out, out2 = np.zeros_like(x), np.zeros_like(x)
    ck, res = _run(shared_scaling, x, out, out2)
    g = ck.tensor_graph
    assert _ops(g)["mul"] == 2
    outer = [n for n in g.nodes if n.op == "mul"][1]
    assert g.node(outer.inputs[0]).op == "mul"        # still (x * 2) * 3: no new x * 6 beside x * 2
    np.testing.assert_allclose(res.outputs["out"], x * 6.0, rtol=1e-6)
    np.testing.assert_allclose(res.outputs["out2"], x * 2.0, rtol=1e-6)


def test_const_op_const_folds_in_the_node_dtype():
    g = _graph([("input", [], SHAPE, DT_FP32, {"param": "x"}),
                ("input", [], SHAPE, DT_FP32, {"param": "out"}),
                ("const", [], (), DT_FP32, {"value": 2.0}),
                ("const", [], (), DT_FP32, {"value": 3.0}),
                ("mul", [2, 3], (), DT_FP32, {}),
                ("sub", [4, 2], (), DT_FP32, {}),                   # (2*3) - 2 = 4
                ("add", [0, 5], SHAPE, DT_FP32, {}),
                _store(6)])
    out = dce(simplify(g))
    verify(out)
    assert _ops(out) == {"input": 2, "const": 1, "add": 1, "store": 1}
    assert [n.attrs["value"] for n in out.nodes if n.op == "const"] == [4.0]
    xv = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    np.testing.assert_array_equal(evaluate(out, {"x": xv, "out": xv})["out"], xv + 4.0)
    # numpy in the node's dtype: fp16 rounds, integer division is not folded
    assert fold("mul", 0.1, 3.0, DT_FP16) == float(np.float16(0.1) * np.float16(3.0)) != 0.1 * 3.0
    assert fold("add", 7, 5, DT_INT32) == 12 and fold("div", 7, 2, DT_INT32) is None


def test_broadcasting_identity_is_not_folded():
    """x[1, 256] + 0 is x only if the zero does not widen the result."""
    row = (1, SHAPE[1])
    g = _graph([("input", [], row, DT_FP32, {"param": "x"}),
                ("input", [], SHAPE, DT_FP32, {"param": "out"}),
                ("const", [], SHAPE, DT_FP32, {"value": 0.0}),      # a (hand-made) wide zero
                ("add", [0, 2], SHAPE, DT_FP32, {}),
                _store(3)], params=(("x", row, DT_FP32), ("out", SHAPE, DT_FP32)))
    out = simplify(g)
    verify(out)
    assert _ops(out)["add"] == 1


@pypto.jit
def not_identities(x, zero, out, out2, out3):
    out[:] = x + zero                                          # a zero-valued tensor, not a const
    out2[:] = x * 0.0                                          # inf * 0 is nan
    out3[:] = pypto.cast(pypto.cast(x, pypto.DT_FP16), pypto.DT_FP32)  # rounds to fp16


def test_what_must_not_be_simplified(x):
    x = x.copy()
    x[0, :3] = [np.inf, -np.inf, np.nan]
    zero, outs = np.zeros_like(x), [np.zeros_like(x) for _ in range(3)]
    ck, res = _run(not_identities, x, zero, *outs)
    c = _ops(ck.tensor_graph)
    assert (c["add"], c["mul"], c["cast"]) == (1, 1, 2)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(res.outputs["out2"], x * np.float32(0.0))
    assert np.isnan(res.outputs["out2"][0, :3]).all()
    np.testing.assert_array_equal(res.outputs["out3"], x.astype(np.float16).astype(np.float32))


@pypto.jit
def round_trip(x, out):
    out[:] = pypto.cast(pypto.cast(x, pypto.DT_FP32), pypto.DT_FP16)


def test_a_lossless_cast_round_trip_folds(x):
    x16 = x.astype(np.float16)
    ck, res = _run(round_trip, x16, np.zeros_like(x16))
    assert _ops(ck.tensor_graph) == {"input": 2, "copy": 1, "store": 1}
    np.testing.assert_array_equal(res.outputs["out"], x16)


@pypto.jit
def reshapes(x, out, out2):
    out[:] = x.reshape(128, 128).reshape(256, 64).reshape(SHAPE[0], SHAPE[1])
    out2[:] = pypto.exp(x.reshape(128, 128).reshape(32, 512))


@pypto.jit
def transposes(x, out):
    out[:] = pypto.exp(x.transpose(0, 1).transpose(1, 0))


def test_layout_chains_collapse(x):
    out, out2 = np.zeros_like(x), np.zeros((32, 512), np.float32)
    ck, res = _run(reshapes, x, out, out2)
    assert _ops(ck.traced)["reshape"] == 5
    assert _ops(ck.tensor_graph)["reshape"] == 1                # out: none at all; out2: one
    (r,) = [n for n in ck.tensor_graph.nodes if n.op == "reshape"]
    assert r.shape == (32, 512) and ck.tensor_graph.node(r.inputs[0]).op == "input"
    np.testing.assert_array_equal(res.outputs["out"], x)
    np.testing.assert_allclose(res.outputs["out2"], np.exp(x).reshape(32, 512), rtol=1e-6)

    ck, res = _run(transposes, x, np.zeros_like(x))
    assert _ops(ck.traced)["transpose"] == 2 and _ops(ck.tensor_graph)["transpose"] == 0
    np.testing.assert_allclose(res.outputs["out"], np.exp(x), rtol=1e-6)


@pypto.jit
def layernorm(x, w, b, out):
    pypto.set_vec_tile_shapes(16, 256)
    out[:] = pypto.layernorm(x, w, b)


def test_decomposed_layernorm_shares_its_one_over_n(x):
    w, b, out = x[0].copy(), x[1].copy(), np.zeros_like(x)
    ck, res = _run(layernorm, x, w, b, out)
    consts = [n.attrs["value"] for n in ck.tensor_graph.nodes if n.op == "const"]
    assert consts.count(1.0 / SHAPE[1]) == 1
    rec = _record(ck, "cse")
    assert rec.nodes_before - rec.nodes_after == 1
