"""Custom ops (`register_op`) and fusion regions (`fuse`): a registered op is one named node of the
Tensor Graph, computes what its body computes (checked against numpy written independently),
decomposes on any Builder, and its errors name both the kernel's call and the body's line; a
`fuse` region is one group, or a located error naming the op that breaks it."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import pypto
from pypto.frontend import custom
from pypto.frontend.custom import fuse, register_op, unregister_op
from pypto.ir.ops import OPS, Builder
from pypto.ir.program import Program

from common import fresh_registry, line_of  # noqa: F401  (the fixture, used by every test)

pytestmark = pytest.mark.usefixtures("fresh_registry")




def quantize_op():
    @register_op
    def my_quantize(x, bits):
        scale = 2**bits - 1
        return pypto.round(x * scale) / scale
    return my_quantize


def np_quantize(x, bits):
    scale = np.asarray(2**bits - 1, x.dtype)
    return (np.round(x * scale) / scale).astype(x.dtype)


def groups(ck) -> int:
    return len({n.attrs["group"] for n in ck.tensor_graph.nodes if "group" in n.attrs})


# ---------------------------------------------------------------------------------------
# register_op

def test_the_seeds_quantize_example(rng):
    my_quantize = quantize_op()

    @pypto.jit
    def k(x, out):
        pypto.set_vec_tile_shapes(32, 256)
        out[:] = my_quantize(x, 8) * 2.0

    x = rng.random((64, 512)).astype(np.float32)
    out = np.zeros_like(x)
    ck = k.compile(x, out)
    res = ck.simulate(x, out)
    want = np_quantize(x, 8) * np.float32(2)
    np.testing.assert_array_equal(res.outputs["out"], want)
    assert res.ok
    k(x, out)
    np.testing.assert_array_equal(out, want)
    # one node of that name at the Tensor level, with its attribute; its parts name it after decompose
    named = [n for n in ck.traced.nodes if n.op == "my_quantize"]
    assert len(named) == 1 and named[0].attrs["bits"] == 8
    assert "my_quantize(%0) bits=8" in str(ck.traced)
    assert "from=my_quantize" in str(ck.tensor_graph)
    assert {n.op for n in ck.tensor_graph.nodes if n.attrs.get("from") == "my_quantize"} == {"mul", "round", "div"}
    assert OPS["my_quantize"].kind == "composite" and my_quantize.name == "my_quantize"
    assert my_quantize.row is OPS["my_quantize"]
    # the program text still parses back
    text = ck.program.text()
    assert Program.parse(text).text() == text


def test_quantize_in_fp16_is_checked_within_its_bound(rng):
    my_quantize = quantize_op()

    @pypto.jit
    def k(x, out):
        out[:] = my_quantize(x, 4)

    x = rng.random((32, 256)).astype(np.float16)
    out = np.zeros_like(x)
    res = k.compile(x, out).simulate(x, out)
    assert res.ok
    want = np.round(x.astype(np.float64) * 15) / 15          # steps may differ at exact halves
    assert np.abs(res.outputs["out"].astype(np.float64) - want).max() <= 1 / 15 + 1e-3


def test_a_dynamic_kernel_with_a_registered_op(rng):
    my_quantize = quantize_op()

    @pypto.jit
    def k(x: pypto.Tensor([pypto.DYNAMIC, 256], pypto.DT_FP32), out: pypto.Tensor([pypto.DYNAMIC, 256], pypto.DT_FP32)):
        out[:] = my_quantize(x, 4)

    for rows in (3, 100):
        x = rng.random((rows, 256)).astype(np.float32)
        out = np.zeros_like(x)
        k(x, out)
        np.testing.assert_array_equal(out, np_quantize(x, 4))
    assert k.cache_size == 1


def test_shape_and_dtype_come_from_the_body(rng):
    @register_op(name="sq_rows")
    def row_sumsq(x):
        """Sum of squares of each row, kept as a column, in fp16."""
        return pypto.cast(pypto.sum(x * x, dim=-1, keepdim=True), pypto.DT_FP16)

    @pypto.jit
    def k(x, out):
        out[:] = row_sumsq(x)

    x = rng.standard_normal((16, 100)).astype(np.float32)
    out = np.zeros((16, 1), np.float16)
    ck = k.compile(x, out)
    node = next(n for n in ck.traced.nodes if n.op == "sq_rows")
    assert node.shape == (16, 1) and node.dtype == pypto.DT_FP16
    assert OPS["sq_rows"].doc.startswith("Sum of squares")
    res = ck.simulate(x, out)
    want = (x.astype(np.float64) ** 2).sum(-1, keepdims=True)
    np.testing.assert_allclose(res.outputs["out"].astype(np.float64), want, rtol=2e-3)
    assert res.ok


def test_tensors_positional_and_attributes_by_keyword(rng):
    @register_op
    def scaled_add(a, b, *, alpha=1.0):
        return a + b * alpha

    @pypto.jit
    def k(x, y, out):
        out[:] = scaled_add(x, y, alpha=0.25) - scaled_add(x, y)

    x = rng.standard_normal((8, 64)).astype(np.float32)
    y = rng.standard_normal((64,)).astype(np.float32)          # broadcast over the rows
    out = np.zeros_like(x)
    ck = k.compile(x, y, out)
    assert [n.attrs["alpha"] for n in ck.traced.nodes if n.op == "scaled_add"] == [0.25, 1.0]
    res = ck.simulate(x, y, out)
    np.testing.assert_allclose(res.outputs["out"], (x + y * np.float32(0.25)) - (x + y), rtol=1e-6, atol=1e-6)
    assert res.ok


def test_bodies_with_builtin_composites_and_other_registered_ops(rng):
    my_quantize = quantize_op()

    @register_op
    def quantized_softmax(x, bits: int = 4):
        return my_quantize(pypto.softmax(x, dim=-1), bits)

    @pypto.jit
    def k(x, out):
        pypto.set_vec_tile_shapes(8, 128)
        out[:] = quantized_softmax(x)

    x = rng.standard_normal((16, 128)).astype(np.float32)
    out = np.zeros_like(x)
    res = k.compile(x, out).simulate(x, out)
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    want = np.round(e / e.sum(-1, keepdims=True) * 15) / 15
    assert np.abs(res.outputs["out"] - want).max() <= 1 / 15 + 1e-6     # a step at most, at exact halves
    assert np.mean(res.outputs["out"] == want.astype(np.float32)) > 0.99
    assert res.ok


class _Record(Builder):
    """A Builder of the test's own: values are (shape, dtype), the ops emitted are recorded."""

    def __init__(self):
        self.ops = []

    def emit(self, op, inputs, shape, dtype, attrs=None):
        self.ops.append((op, dict(attrs or {})))
        return (tuple(shape), dtype)

    def shape(self, v):
        return v[0]

    def dtype(self, v):
        return v[1]


class _Numpy(Builder):
    """A Builder computing with numpy through the registry's references."""

    def __init__(self, dtypes):
        self.dtypes = dtypes

    def emit(self, op, inputs, shape, dtype, attrs=None):
        v = np.asarray(attrs["value"]) if op == "const" else np.asarray(OPS[op].ref(list(inputs), attrs or {}))
        v = v.astype(dtype.np_dtype)
        self.dtypes[id(v)] = dtype
        return v

    def shape(self, v):
        return v.shape

    def dtype(self, v):
        return self.dtypes[id(v)]


def test_decompose_runs_on_any_builder_and_ref_evaluates_the_body(rng):
    my_quantize = quantize_op()
    row = OPS[my_quantize.name]
    rec = _Record()
    rec.extra = {"tile": "T"}
    out = row.decompose(rec, [((4, 8), pypto.DT_FP32)], {"bits": 3})
    assert out == ((4, 8), pypto.DT_FP32)
    assert [op for op, _ in rec.ops if op != "const"] == ["mul", "round", "div"]
    assert all(a.get("tile") == "T" for op, a in rec.ops if op != "const")
    x = rng.random((4, 8)).astype(np.float32)
    b = _Numpy({id(x): pypto.DT_FP32})
    np.testing.assert_array_equal(row.decompose(b, [x], {"bits": 3}), np_quantize(x, 3))
    np.testing.assert_allclose(row.ref([x.astype(np.float64)], {"bits": 3}),
                               np.round(x.astype(np.float64) * 7) / 7)
    assert row.shape([(4, 8)], {"bits": 3}) == (4, 8)
    # outside a kernel, on numpy arrays: the body step by step as a kernel computes it
    np.testing.assert_array_equal(my_quantize(x, 3), np_quantize(x, 3))


def test_registering_a_name_again():
    def f(x):
        return x * 2.0

    def g(x):
        return x * 3.0
    op = register_op(f, name="twice")
    assert register_op(f, name="twice") is op                    # the same function: the same op
    with pytest.raises(pypto.PyptoError, match="already registered") as info:
        register_op(g, name="twice")                             # line A
    assert info.value.loc.line == line_of(test_registering_a_name_again, "# line A")
    assert OPS["twice"] is op.row
    new = register_op(g, name="twice", replace=True)
    assert new.fn is g and OPS["twice"] is new.row
    with pytest.raises(pypto.PyptoError, match="built-in op"):
        register_op(f, name="softmax")
    with pytest.raises(pypto.PyptoError, match="identifier"):
        register_op(f, name="not a name")

    def h(x, tile):
        return x
    with pytest.raises(pypto.PyptoError, match="attribute pypto sets"):
        register_op(h)


def test_a_redefinition_replaces_and_kernels_recompile(rng):
    current = []

    @pypto.jit
    def kern(x, out):
        out[:] = current[-1](x)

    x = rng.random((8, 32)).astype(np.float32)
    out = np.zeros_like(x)
    for k in (2.0, 3.0):                     # the same definition run twice (a notebook cell again)
        @register_op
        def scale(x):
            return x * k
        current.append(scale)
        kern(x, out)
        np.testing.assert_array_equal(out, x * np.float32(k))
    assert OPS["scale"] is current[-1].row and kern.cache_size == 2


def test_a_pickled_op_registers_itself_where_it_is_loaded(rng):
    cloudpickle = pytest.importorskip("cloudpickle")
    my_quantize = quantize_op()
    data = cloudpickle.dumps(my_quantize)
    unregister_op(my_quantize)
    assert "my_quantize" not in OPS
    op = cloudpickle.loads(data)

    @pypto.jit
    def k(x, out):
        out[:] = op(x, 4)
    x = rng.random((8, 32)).astype(np.float32)
    out = np.zeros_like(x)
    k(x, out)
    np.testing.assert_array_equal(out, np_quantize(x, 4))


def test_an_error_in_the_body_names_the_call_and_the_body_line():
    @register_op
    def bad_add(x, y):
        z = x * 2.0
        return z + y                                 # the body's line

    @pypto.jit
    def k(x, y, out):
        out[:] = bad_add(x, y) + 1.0                 # the call

    x, y = np.zeros((8, 16), np.float32), np.zeros((8, 8), np.float32)
    with pytest.raises(pypto.ShapeError) as info:
        k.compile(x, y, np.zeros_like(x))
    e = info.value
    assert e.loc.line == line_of(k.fn, "# the call")
    assert e.body_loc.line == line_of(bad_add.fn, "# the body's line")
    assert f"in the body of registered op 'bad_add' at test_custom_ops.py:{e.body_loc.line}" in str(e)
    assert "return z + y" in str(e)


def test_other_mistakes_in_a_body_are_located():
    @register_op
    def typo(x):
        return x.exq()

    @register_op
    def two(x):
        return x, x

    @register_op
    def writes(x):
        x[:] = x * 2.0
        return x

    @pypto.jit
    def k1(x, out):
        out[:] = typo(x)                              # call 1

    @pypto.jit
    def k2(x, out):
        out[:] = two(x)                               # call 2

    @pypto.jit
    def k3(x, out):
        out[:] = writes(x)                            # call 3

    x = np.zeros((8, 16), np.float32)
    for kern, mark, words in ((k1, "# call 1", "AttributeError in the body of registered op 'typo'"),
                              (k2, "# call 2", "must return one tensor"),
                              (k3, "# call 3", "writes into its argument 'x'")):
        with pytest.raises(pypto.PyptoError, match=words) as info:
            kern.compile(x, np.zeros_like(x))
        assert info.value.loc.line == line_of(kern.fn, mark)

    @register_op
    def uses_closure(x):
        return x + captured[0]

    captured = []

    @pypto.jit
    def k4(x, y, out):
        captured[:] = [y]
        out[:] = uses_closure(x)                      # call 4
    with pytest.raises(pypto.UnsupportedError, match="a tensor of another trace") as info:
        k4.compile(x, x, np.zeros_like(x))
    assert info.value.loc.line == line_of(k4.fn, "# call 4")
    with pytest.raises(pypto.PyptoError, match="missing a required argument") as info:
        @pypto.jit
        def k5(x, out):
            out[:] = typo()                           # call 5
        k5.compile(x, np.zeros_like(x))
    assert info.value.loc.line == line_of(test_other_mistakes_in_a_body_are_located, "# call 5")


# ---------------------------------------------------------------------------------------
# fuse

def _exp_log(x, y, out):
    a = pypto.exp(x)
    b = pypto.log(y)
    out[:] = a * b


def test_a_fuse_region_is_one_group(rng):
    @pypto.jit
    def plain(x, y, out):
        pypto.set_vec_tile_shapes(16, 256)
        _exp_log(x, y, out)

    @pypto.jit
    def fused(x, y, out):
        pypto.set_vec_tile_shapes(16, 256)
        with fuse():
            _exp_log(x, y, out)

    @pypto.jit
    def decorated(x, y, out):
        pypto.set_vec_tile_shapes(16, 256)
        fuse(_exp_log)(x, y, out)

    x = rng.random((64, 512)).astype(np.float32)
    y = x + np.float32(1)
    out = np.zeros_like(x)
    base = plain.compile(x, y, out)
    assert groups(base) == 2                 # exp(x) and log(y) start groups of their own
    for kern in (fused, decorated):
        ck = kern.compile(x, y, out)
        assert groups(ck) == 1 and len(ck.block_graph.tasks) == len(base.block_graph.tasks) // 2
        assert "fuse=1" in str(ck.traced)
        res = ck.simulate(x, y, out)
        np.testing.assert_allclose(res.outputs["out"], np.exp(x) * np.log(y), rtol=1e-5)
        assert res.ok


def test_a_region_fusion_cannot_keep_is_a_located_error(rng):
    @pypto.jit
    def softmax(x, out, *, TN: int = 128):
        pypto.set_vec_tile_shapes(16, TN)
        with fuse():
            out[:] = pypto.softmax(x)                # the softmax

    x = rng.random((64, 512)).astype(np.float32)
    out = np.zeros_like(x)
    assert groups(softmax.compile(x, out, TN=512)) == 1      # whole rows: the reductions end in the tile
    with pytest.raises(pypto.UnsupportedError) as info:
        softmax.compile(x, out, TN=128)
    e = info.value
    assert e.loc.line == line_of(softmax.fn, "# the softmax")
    assert "'sub' cannot join the group of 'amax'" in e.message and "spans 4 tiles" in e.message
    assert "set_vec_tile_shapes" in e.hint
    # the compile option that turns fusion off leaves regions unkept
    softmax.compile(x, out, TN=128, options={"fusion": False})

    @pypto.jit
    def mm(a, b, out):
        with fuse():
            c = pypto.matmul(a, b)
            out[:] = pypto.exp(c)                    # the exp

    a = rng.random((64, 64)).astype(np.float16)
    with pytest.raises(pypto.UnsupportedError, match="cube core") as info:
        mm.compile(a, a, np.zeros((64, 64), np.float16))
    assert info.value.loc.line == line_of(mm.fn, "# the exp") and "'exp'" in info.value.message

    @pypto.jit
    def mm_relu(a, b, out):
        with fuse():
            out[:] = pypto.relu(pypto.matmul(a, b))  # a ReLU joins the cube group
    ck = mm_relu.compile(a, a, np.zeros((64, 64), np.float16))
    assert groups(ck) == 1


def test_fuse_outside_a_kernel_is_an_error():
    with pytest.raises(pypto.PyptoError, match="inside a @pypto.jit kernel") as info:
        with fuse():                                 # outside
            pass
    assert info.value.loc.line == line_of(test_fuse_outside_a_kernel_is_an_error, "# outside")


def test_a_region_in_a_registered_op_is_one_group_per_call(rng):
    @register_op
    def exp_log(x, y):
        with fuse():
            return pypto.exp(x) * pypto.log(y)

    @pypto.jit
    def k(x, y, out):
        pypto.set_vec_tile_shapes(16, 256)
        out[:] = exp_log(x, y) + exp_log(y, x)

    x = rng.random((64, 512)).astype(np.float32) + np.float32(0.5)
    y = rng.random((64, 512)).astype(np.float32) + np.float32(0.5)
    ck = k.compile(x, y, np.zeros_like(x))
    by_region = {}
    for n in ck.tensor_graph.nodes:
        if "fuse" in n.attrs:
            by_region.setdefault(str(n.attrs["fuse"]), set()).add(n.attrs["group"])
    assert len(by_region) == 2 and all(len(g) == 1 for g in by_region.values())
    res = ck.simulate(x, y, np.zeros_like(x))
    np.testing.assert_allclose(res.outputs["out"], np.exp(x) * np.log(y) + np.exp(y) * np.log(x), rtol=1e-5)
