"""Shared fixtures of the core behaviour tests: a seeded rng and a kernel checker.

`check_kernel(kernel, args, expected, ...)` runs a kernel both ways a user would:

1. the call form `kernel(*args)` on copies of the arrays (fills the outputs in place);
2. `ck = kernel.compile(*args); res = ck.simulate(*args)`;

and asserts, for every output, that both results match the numpy `expected` array within the
given tolerance, and that pypto's own comparison with its reference (`res.check[name]['ok']`)
agrees.  Tolerances are the usual ones per dtype unless the test passes its own.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest


BF16 = np.dtype(ml_dtypes.bfloat16)

# (rtol, atol) per output dtype: what a correct kernel must meet against the numpy math.
TOL = {
    np.dtype(np.float32): (1e-5, 1e-6),
    np.dtype(np.float16): (2e-3, 1e-3),
    BF16: (2e-2, 1e-2),
    np.dtype(np.int32): (0, 0),
    np.dtype(np.int8): (0, 0),
}


@pytest.fixture
def rng():
    """A fresh, seeded generator per test: every test sees the same data on every run."""
    return np.random.default_rng(20240607)


def _assert_close(got, want, rtol, atol, what):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != expected {want.shape}"
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    ok = np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    if not ok:
        err = np.abs(g - w)
        bad = np.argwhere(~np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True))
        first = tuple(int(i) for i in bad[0]) if len(bad) else ()
        raise AssertionError(
            f"{what}: {len(bad)} of {g.size} elements differ (max abs err {np.nanmax(err):.3g}, "
            f"rtol {rtol}, atol {atol}); first at {first}: got {g[first]!r}, expected {w[first]!r}")


def run_and_check(kernel, args, expected, *, rtol=None, atol=None, machine=None,
                  **consts):
    """Run `kernel` in call form and through compile/simulate; compare outputs with `expected`.

    `expected` maps the index (int) or parameter name (str) of each output argument to its
    numpy result.  Returns the SimResult of the compiled run.
    """
    names = list(kernel.tensor_params)
    exp = {}
    for k, v in expected.items():
        name = names[k] if isinstance(k, int) else k
        exp[name] = np.asarray(v)

    def tol(name):
        dt = np.asarray(args[names.index(name)]).dtype
        r, a = TOL.get(dt, (1e-5, 1e-6))
        return (r if rtol is None else rtol), (a if atol is None else atol)

    mkw = {} if machine is None else {"machine": machine}
    # 1. call form: fills the output arrays in place
    call_args = [np.array(a, copy=True) for a in args]
    kernel(*call_args, **mkw, **consts)
    for name, want in exp.items():
        r, a = tol(name)
        _assert_close(call_args[names.index(name)], want, r, a, f"{kernel.name} call, output '{name}'")
    # inputs must not be modified by the call (unless they are also outputs)
    for name, (before, after) in zip(names, zip(args, call_args)):
        if name not in exp:
            assert np.array_equal(np.asarray(before), after, equal_nan=True), \
                f"{kernel.name} call modified its input '{name}'"
    # 2. compile + simulate
    sim_args = [np.array(a, copy=True) for a in args]
    ck = kernel.compile(*sim_args, **mkw, **consts)
    res = ck.simulate(*sim_args)
    for name, want in exp.items():
        r, a = tol(name)
        _assert_close(res.outputs[name], want, r, a, f"{kernel.name} simulate, output '{name}'")
    assert res.check is not None
    for name in exp:
        assert res.check[name]["ok"] is True, f"pypto's own check of '{name}' failed: {res.check[name]}"
    return res


@pytest.fixture
def check_kernel():
    """The `run_and_check` helper as a fixture (see the module docstring)."""
    return run_and_check
