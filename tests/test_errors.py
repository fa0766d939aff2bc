"""Errors speak to the user: the right PyptoError subclass, the kernel's file and line, expected/got.

Lines are found through marker comments (`# <E:name>`) so that the tests do not depend on line
numbers.  After every error the same kernel object must still compile and run with good input.
"""
from __future__ import annotations

import os
import traceback

import numpy as np
import pytest

import pypto
from common import marker_line

THIS = os.path.abspath(__file__)
FILE = os.path.basename(THIS)
_SRC = open(THIS).read().splitlines()


def line_of(marker: str) -> int:
    return marker_line(THIS, f"# <E:{marker}>")


def kernel_lines(kernel) -> set[int]:
    """The decorator line and the `def` line of a kernel: where signature errors may point."""
    code = kernel.fn.__code__
    first = code.co_firstlineno
    lines = {first}
    for i in range(first, first + 5):
        lines.add(i)
        if _SRC[i - 1].lstrip().startswith("def "):
            break
    return lines


def assert_speaks(err: pypto.PyptoError, lines, *, expected_got=True):
    """The message names this file and one of `lines`; it says what was expected and what it got."""
    lines = {lines} if isinstance(lines, int) else set(lines)
    msg = str(err)
    assert err.loc is not None, f"no source location in: {msg}"
    assert os.path.abspath(err.loc.file) == THIS, f"location {err.loc.file} is not the kernel's file"
    assert err.loc.line in lines, f"points at line {err.loc.line}, expected one of {sorted(lines)}:\n{msg}"
    assert f"{FILE}:{err.loc.line}" in msg, msg
    # the offending source line is quoted
    assert _SRC[err.loc.line - 1].strip() in msg, msg
    if expected_got:
        assert "expected" in msg and "got" in msg, msg
        assert err.expected is not None and err.got is not None


def assert_no_compiler_frames(excinfo):
    """Errors raised on purpose carry no frames of the compiler or the ops (only the entry point)."""
    pkg = os.path.dirname(os.path.abspath(pypto.__file__))
    inside = [fs for fs in traceback.extract_tb(excinfo.tb) if os.path.abspath(fs.filename).startswith(pkg)]
    assert all(fs.filename.endswith(os.path.join("frontend", "jit.py")) for fs in inside), \
        [f"{fs.filename}:{fs.lineno}" for fs in inside]


# ---------------------------------------------------------------------------------------
# tile shapes

@pypto.jit
def add_one(x, out, *, TM: int = 8, TN: int = 100):
    pypto.set_vec_tile_shapes(TM, TN)   # <E:align-set>
    out[:] = x + 1.0   # <E:align-op>


@pytest.mark.parametrize("form", ["call", "compile"])
def test_tile_not_32_byte_aligned(form, rng):
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    out = np.zeros_like(x)
    k = add_one
    k.cache_clear()
    with pytest.raises(pypto.TileShapeError) as ei:
        if form == "call":
            k(x, out)                        # TN=100 fp32 = 400 bytes: not a multiple of 32
        else:
            k.compile(x, out)
    assert_speaks(ei.value, {line_of("align-set"), line_of("align-op")})
    assert "32" in str(ei.value)
    assert_no_compiler_frames(ei)
    assert k.cache_size == 0
    # the same kernel object works with an aligned tile
    k(x, out, TN=128)
    np.testing.assert_array_equal(out, x + 1.0)
    res = k.compile(x, out, TN=128).simulate(x, out)
    assert res.ok


def test_aligned_tile_wider_than_tensor_is_clipped(rng):
    """A last tile dim that is not aligned is fine when it covers the whole dim (no tail)."""
    x = rng.standard_normal((64, 100)).astype(np.float32)
    out = np.zeros_like(x)
    add_one(x, out, TN=100)
    np.testing.assert_array_equal(out, x + 1.0)


def test_tile_does_not_fit_ub(rng):
    big = pypto.Tensor([2048, 8192], pypto.DT_FP32)
    k = add_one
    k.cache_clear()
    with pytest.raises(pypto.TileShapeError) as ei:
        k.compile(big, big, TM=1024, TN=4096)    # 16 MiB per tile, UB is 192 KiB
    assert_speaks(ei.value, {line_of("align-set"), line_of("align-op")})
    assert "UB" in str(ei.value)
    assert_no_compiler_frames(ei)
    assert k.cache_size == 0
    # the call form with real arrays says the same
    xb = np.zeros((2048, 8192), np.float32)
    with pytest.raises(pypto.TileShapeError) as ei:
        k(xb, np.zeros_like(xb), TM=1024, TN=4096)
    assert_speaks(ei.value, {line_of("align-set"), line_of("align-op")})
    del xb
    # the same kernel still compiles for the big shape with a small tile, and runs a small input
    ck = k.compile(big, big, TM=16, TN=512)
    assert ck.program is not None
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    out = np.zeros_like(x)
    k(x, out, TM=16, TN=512)
    np.testing.assert_array_equal(out, x + 1.0)


@pypto.jit
def mm_tiles(a, b, out, *, T: int = 256, K: int = 256):
    pypto.set_cube_tile_shapes([T, T], [K, K], [T, T])   # <E:cube-set>
    out[:] = a @ b   # <E:cube-op>


def test_cube_tile_does_not_fit_l0(rng):
    a = rng.standard_normal((256, 256)).astype(np.float32)
    out = np.zeros_like(a)
    with pytest.raises(pypto.TileShapeError) as ei:
        mm_tiles(a, a, out)                     # a 256x256 fp32 L0A tile is 256 KiB > 64 KiB
    assert_speaks(ei.value, {line_of("cube-set"), line_of("cube-op")})
    assert "L0" in str(ei.value)
    mm_tiles(a, a, out, T=64, K=64)
    np.testing.assert_allclose(out, a.astype(np.float64) @ a, rtol=1e-5, atol=1e-3)


def test_cube_tile_not_fractal_aligned(rng):
    a = rng.standard_normal((64, 64)).astype(np.float16)
    out = np.zeros_like(a)
    with pytest.raises(pypto.TileShapeError) as ei:
        mm_tiles(a, a, out, T=8, K=32)          # mL0 = 8 is not a multiple of 16
    assert_speaks(ei.value, {line_of("cube-set"), line_of("cube-op")})
    mm_tiles(a, a, out, T=32, K=32)
    np.testing.assert_allclose(out, a.astype(np.float64) @ a, rtol=2e-3, atol=1e-2)


@pypto.jit
def bad_tile_value(x, out):
    pypto.set_vec_tile_shapes(0, 64)   # <E:tile-zero>
    out[:] = x


def test_tile_dims_must_be_positive(rng):
    x = rng.standard_normal((8, 64)).astype(np.float32)
    with pytest.raises(pypto.TileShapeError) as ei:
        bad_tile_value(x, np.zeros_like(x))
    assert_speaks(ei.value, line_of("tile-zero"))


# ---------------------------------------------------------------------------------------
# shapes and dtypes

@pypto.jit
def add2(x, y, out):
    out[:] = x + y   # <E:add2>


def test_mismatched_shapes(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    y = rng.standard_normal((5, 8)).astype(np.float32)
    with pytest.raises(pypto.ShapeError) as ei:
        add2(x, y, np.zeros((4, 8), np.float32))
    assert_speaks(ei.value, line_of("add2"))
    assert "[4,8]" in str(ei.value).replace(" ", "") and "[5,8]" in str(ei.value).replace(" ", "")
    assert_no_compiler_frames(ei)
    out = np.zeros((4, 8), np.float32)
    y = y[:4].copy()
    add2(x, y, out)
    np.testing.assert_array_equal(out, x + y)


def test_output_region_shape_mismatch(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(pypto.ShapeError) as ei:
        add2(x, x, np.zeros((5, 8), np.float32))
    assert_speaks(ei.value, line_of("add2"))


@pypto.jit
def mm_plain(a, b, out):
    out[:] = pypto.matmul(a, b)   # <E:mm>


def test_matmul_inner_dims_mismatch(rng):
    a = rng.standard_normal((4, 8)).astype(np.float16)
    b = rng.standard_normal((9, 8)).astype(np.float16)
    with pytest.raises(pypto.ShapeError) as ei:
        mm_plain(a, b, np.zeros((4, 8), np.float16))
    assert_speaks(ei.value, line_of("mm"))
    b = rng.standard_normal((8, 16)).astype(np.float16)
    out = np.zeros((4, 16), np.float16)
    mm_plain(a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=2e-3, atol=1e-2)


@pypto.jit
def reduce_dim(x, out, *, D: int = 2):
    out[:] = pypto.sum(x, dim=D, keepdim=True)   # <E:dim>


def test_reduction_dim_out_of_range(rng):
    x = rng.uniform(0, 1, (8, 64)).astype(np.float32)
    with pytest.raises(pypto.ShapeError) as ei:
        reduce_dim(x, np.zeros((8, 1), np.float32))
    assert_speaks(ei.value, line_of("dim"))
    out = np.zeros((8, 1), np.float32)
    reduce_dim(x, out, D=1)
    np.testing.assert_allclose(out, x.sum(1, keepdims=True), rtol=1e-5)


def test_unsupported_input_dtype(rng):
    x = rng.standard_normal((4, 8))                 # float64
    with pytest.raises(pypto.DTypeError) as ei:
        add2(x, x, np.zeros((4, 8)))  # <E:call-f64>
    assert_speaks(ei.value, kernel_lines(add2) | {line_of("call-f64")})
    assert "float64" in str(ei.value)
    assert_no_compiler_frames(ei)
    x = x.astype(np.float32)
    out = np.zeros((4, 8), np.float32)
    add2(x, x, out)
    np.testing.assert_array_equal(out, x + x)


def test_mixed_dtypes(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(pypto.DTypeError) as ei:
        add2(x, x.astype(np.float16), np.zeros((4, 8), np.float32))
    assert_speaks(ei.value, line_of("add2"))
    assert "fp16" in str(ei.value)


@pypto.jit
def store_fp16_into_fp32(x, out):
    out[:] = pypto.cast(x, pypto.DT_FP16)   # <E:store-dtype>


def test_store_dtype_mismatch(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(pypto.DTypeError) as ei:
        store_fp16_into_fp32(x, np.zeros((4, 8), np.float32))
    assert_speaks(ei.value, line_of("store-dtype"))
    out = np.zeros((4, 8), np.float16)
    store_fp16_into_fp32(x, out)
    np.testing.assert_array_equal(out, x.astype(np.float16))


@pypto.jit
def exp_kernel(x, out):
    out[:] = pypto.exp(x)   # <E:exp-int>


def test_float_op_on_integers(rng):
    x = rng.integers(0, 5, (4, 8)).astype(np.int32)
    with pytest.raises(pypto.DTypeError) as ei:
        exp_kernel(x, np.zeros((4, 8), np.int32))
    assert_speaks(ei.value, line_of("exp-int"))


# ---------------------------------------------------------------------------------------
# kernel signature

@pypto.jit
def writes_nothing(x, out):
    y = x + 1.0   # noqa: F841
    return None


def test_kernel_writes_no_output(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(pypto.KernelSignatureError) as ei:
        writes_nothing(x, np.zeros_like(x))
    assert_speaks(ei.value, kernel_lines(writes_nothing))
    assert writes_nothing.cache_size == 0
    with pytest.raises(pypto.KernelSignatureError):     # still the same answer, nothing cached
        writes_nothing.compile(x, np.zeros_like(x))


def test_argument_not_a_tensor(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(pypto.KernelSignatureError) as ei:
        add2(x, 3, np.zeros_like(x))  # <E:call-int>
    assert_speaks(ei.value, kernel_lines(add2) | {line_of("call-int")})
    assert "int" in str(ei.value) and "'y'" in str(ei.value)
    assert_no_compiler_frames(ei)
    out = np.zeros_like(x)
    add2(x, x, out)
    np.testing.assert_array_equal(out, x + x)


@pytest.mark.parametrize("n", [2, 4])
def test_wrong_number_of_arguments(n, rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    args = [x, x, np.zeros_like(x), np.zeros_like(x)][:n]
    with pytest.raises(pypto.KernelSignatureError) as ei:
        add2(*args)  # <E:call-n>
    assert_speaks(ei.value, kernel_lines(add2) | {line_of("call-n")})
    assert "3" in str(ei.value) and str(n) in str(ei.value)
    out = np.zeros_like(x)
    add2(x, x, out)
    np.testing.assert_array_equal(out, x + x)


def test_unknown_constant(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(pypto.KernelSignatureError) as ei:
        add2(x, x, np.zeros_like(x), TM=32)  # <E:call-const>
    assert_speaks(ei.value, kernel_lines(add2) | {line_of("call-const")})
    assert "TM" in str(ei.value)


def test_constant_must_be_an_integer(rng):
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    with pytest.raises(pypto.KernelSignatureError) as ei:
        add_one.compile(x, np.zeros_like(x), TN=128.0)  # <E:call-float-const>
    assert_speaks(ei.value, kernel_lines(add_one) | {line_of("call-float-const")})


def test_zero_dim_array_argument():
    with pytest.raises(pypto.KernelSignatureError) as ei:
        add2(np.float32(1.0) * np.ones((), np.float32), np.ones((), np.float32), np.zeros((), np.float32))  # <E:call-0d>
    assert_speaks(ei.value, kernel_lines(add2) | {line_of("call-0d")})


def test_simulate_with_other_shapes_than_compiled(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    ck = add2.compile(x, x, np.zeros_like(x))
    y = rng.standard_normal((4, 16)).astype(np.float32)
    with pytest.raises(pypto.KernelSignatureError) as ei:
        ck.simulate(y, y, np.zeros_like(y))
    assert "expected" in str(ei.value) and "got" in str(ei.value)
    with pytest.raises(pypto.KernelSignatureError):
        ck.simulate(x, x)
    assert ck.simulate(x, x, np.zeros_like(x)).ok


# ---------------------------------------------------------------------------------------
# tracing: Python control flow on data, Python errors, reads after writes

@pypto.jit
def branch_on_data(x, out):
    if x:   # <E:if>
        out[:] = x


def test_truth_value_of_a_tensor(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(pypto.UnsupportedError) as ei:
        branch_on_data(x, np.zeros_like(x))
    assert_speaks(ei.value, line_of("if"))


@pypto.jit
def python_error(x, out, *, D: int = 0):
    out[:] = x * (1.0 / D)   # <E:zerodiv>


def test_python_exception_while_tracing(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(pypto.PyptoError) as ei:
        python_error(x, np.zeros_like(x))
    assert_speaks(ei.value, line_of("zerodiv"), expected_got=False)
    assert "ZeroDivisionError" in str(ei.value)
    out = np.zeros_like(x)
    python_error(x, out, D=2)
    np.testing.assert_array_equal(out, x * 0.5)


@pypto.jit
def read_after_write(x, out):
    out[:] = x * 2.0
    out[:] = out + 1.0   # <E:raw>


def test_read_of_an_output_after_writing_it(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(pypto.UnsupportedError) as ei:
        read_after_write(x, np.zeros_like(x))
    assert_speaks(ei.value, line_of("raw"))


def test_ops_outside_a_kernel():
    with pytest.raises(pypto.PyptoError):
        pypto.set_vec_tile_shapes(8, 64)
    with pytest.raises(pypto.PyptoError) as ei:
        pypto.exp(np.ones((4, 8), np.float32))  # <E:outside>
    assert ei.value.loc is not None and ei.value.loc.line == line_of("outside")


def test_unknown_machine_and_mode(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(pypto.PyptoError) as ei:
        add2.compile(x, x, np.zeros_like(x), machine="no-such-machine")
    assert "a2a3" in str(ei.value) and "teach" in str(ei.value)
    ck = add2.compile(x, x, np.zeros_like(x))
    with pytest.raises(pypto.PyptoError) as ei:
        ck.simulate(x, x, np.zeros_like(x), mode="fast")
    assert "timing" in str(ei.value)


def test_every_error_is_a_pypto_error():
    for cls in (pypto.KernelSignatureError, pypto.ShapeError, pypto.DTypeError, pypto.TileShapeError,
                pypto.UnsupportedError, pypto.VerificationError, pypto.SimulationError):
        assert issubclass(cls, pypto.PyptoError)


# ---------------------------------------------------------------------------------------
# the caret sits under the failing call, not under the start of the line

@pypto.jit
def caret_kernels(x, y, out):
    résultat = x * 2.0
    out[:] = résultat + pypto.matmul(x,   # <E:caret-multi>
                                     y)


def caret_of(msg: str, source: str) -> tuple[int, int]:
    lines = msg.splitlines()
    i = lines.index("    " + source.strip())
    caret = lines[i + 1]
    assert set(caret.strip()) == {"^"}, msg
    return caret.index("^") - 4, len(caret.strip())


def test_caret_under_the_operator_expression(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(pypto.ShapeError) as ei:
        add2(x, x[:2], np.zeros_like(x))
    src = _SRC[line_of("add2") - 1]
    col, width = caret_of(str(ei.value), src)
    assert (col, width) == (src.strip().index("x + y"), len("x + y"))
    assert ei.value.loc.col is not None and ei.value.loc == pypto.errors.SourceLoc(THIS, line_of("add2"), "add2")
    assert ei.value.loc.short() == f"{FILE}:{line_of('add2')}"


def test_caret_of_a_call_over_several_lines_after_non_ascii_names(rng):
    x = rng.standard_normal((8, 8)).astype(np.float16)
    y = rng.standard_normal((9, 8)).astype(np.float16)
    with pytest.raises(pypto.ShapeError) as ei:
        caret_kernels(x, y, np.zeros((8, 8), np.float16))
    src = _SRC[line_of("caret-multi") - 1]
    col, width = caret_of(str(ei.value), src)
    start = src.strip().index("pypto.matmul(")
    assert col == start                               # characters, not UTF-8 bytes (é is 2 bytes)
    assert width == len(src.strip()) - start          # to the end of the line: the call goes on


def test_hint_is_printed_after_expected_and_got():
    err = pypto.PyptoError("bad", expected="a", got="b", hint="do c")
    assert str(err) == "bad\n  expected: a\n  got:      b\n  hint:     do c"
    assert err.message == "bad" and err.hint == "do c"
