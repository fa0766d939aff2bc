"""Writes that overlap keep the kernel's program order (found by the gallery's Jacobi notebook):
a later store to an overlapping region of an output runs after the earlier one even when its
value is computed first, and a write into a value whose right side reads shifted windows of it
goes into a copy, not in place."""
import numpy as np
import pytest

import pypto

rng = np.random.default_rng(3)


def run(kernel, *args):
    ck = kernel.compile(*args)
    res = ck.simulate(*args)
    return ck, res, ck.reference(*args)


def test_a_later_store_over_an_earlier_one_wins():
    @pypto.jit
    def k(x, out):
        new = x[0:8, 0:8] + 1.0
        out[:] = x
        out[0:8, 0:8] = new

    x = rng.standard_normal((16, 16)).astype(np.float32)
    o = np.zeros_like(x)
    ck, res, ref = run(k, x, o)
    want = x.copy()
    want[0:8, 0:8] += 1.0
    np.testing.assert_array_equal(ref["out"], want)
    np.testing.assert_array_equal(res.outputs["out"], want)
    assert res.ok
    # the copy's group runs first now: the interior store's task depends on it
    first = {t.group for t in ck.program.tasks if not t.deps}
    store_group = ck.tensor_graph.node(next(n.inputs[0] for n in ck.tensor_graph.nodes
                                            if n.op == "store" and n.shape == (8, 8))).attrs["group"]
    assert store_group not in first


def test_stores_already_in_order_keep_their_groups():
    @pypto.jit
    def k(x, out):
        out[:] = x
        out[0:8, 0:8] = x[0:8, 0:8] * 2.0

    x = rng.standard_normal((16, 16)).astype(np.float32)
    o = np.zeros_like(x)
    ck, res, ref = run(k, x, o)
    assert res.ok
    groups = [n.attrs["group"] for n in ck.tensor_graph.nodes if "group" in n.attrs]
    assert groups == sorted(groups)                  # numbered in program order, as before


def test_a_second_shifted_update_of_a_value_reads_the_old_value():
    @pypto.jit
    def smooth_twice(x, out):
        pypto.set_vec_tile_shapes(8, 64)
        n = x.shape[0]
        v = x * 2.0
        v[1:n - 1, :] = v[0:n - 2, :] + v[2:n, :]
        v[1:n - 1, :] = v[0:n - 2, :] + v[2:n, :]
        out[:] = v

    x = rng.standard_normal((64, 64)).astype(np.float32)
    o = np.zeros_like(x)
    _, res, ref = run(smooth_twice, x, o)
    v = x * 2.0
    for _ in range(2):
        v2 = v.copy()
        v2[1:-1] = v[:-2] + v[2:]
        v = v2
    np.testing.assert_allclose(ref["out"], v, rtol=1e-6)
    np.testing.assert_allclose(res.outputs["out"], v, rtol=1e-6)
    assert res.ok


def test_disjoint_writes_stay_in_place():
    @pypto.jit
    def halves(x, out):
        v = x * 1.0
        v[0:8, :] = x[0:8, :] + 1.0
        top = v[0:8, :] * 3.0
        v[8:16, :] = top
        out[:] = v

    x = rng.standard_normal((16, 32)).astype(np.float32)
    o = np.zeros_like(x)
    ck, res, ref = run(halves, x, o)
    assert res.ok
    copies = [n for n in ck.tensor_graph.nodes if n.op == "copy" and "state" in n.attrs]
    assert len(copies) == 1          # the first write's copy only: the second writes rows nobody else reads


def test_an_order_that_cannot_exist_is_refused_at_the_store():
    @pypto.jit
    def k(x, w, out):
        b = x + 1.0                  # a vector group: the matmul reads it, so it runs first
        a = pypto.matmul(b, w)
        out[:] = a
        out[:] = b                   # stored after a, but made (and stored) by the group before
    x = rng.standard_normal((64, 64)).astype(np.float16)
    o = np.zeros_like(x)
    with pytest.raises(pypto.UnsupportedError, match="writes over a region an earlier store writes") as e:
        k.compile(x, x, o)
    assert e.value.loc.line == k.fn.__code__.co_firstlineno + 5
    assert "write the regions in the other order" in e.value.hint
