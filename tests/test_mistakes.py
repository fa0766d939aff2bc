"""A catalogue of plausible user mistakes through the public API.

Each case asserts: a `pypto.PyptoError` (the right subclass) is raised; its text names this file
and the right line (found through a `# <M:name>` marker comment); the caret line sits under the
failing call (its column is checked against the call's column in the source line); expected
and got are there where they mean something; a hint where one exists; and afterwards the same
kernel compiles and runs correctly with good arguments (the cache is not broken).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import pypto
from common import marker_line
from pypto.compiler import OptimizationPass

THIS = os.path.abspath(__file__)
FILE = os.path.basename(THIS)
_SRC = open(THIS).read().splitlines()


def line_of(marker: str) -> int:
    return marker_line(THIS, f"# <M:{marker}>")


def check_located(err: pypto.PyptoError, marker: str, under: str):
    """`err` names this file and the marker's line, and its carets start under `under`."""
    line = line_of(marker)
    msg = str(err)
    assert err.loc is not None, f"no location:\n{msg}"
    assert os.path.abspath(err.loc.file) == THIS, err.loc.file
    assert err.loc.line == line, f"points at line {err.loc.line}, expected {line}:\n{msg}"
    assert f"{FILE}:{line}" in msg, msg
    stripped = _SRC[line - 1].strip()
    lines = msg.splitlines()
    at = [i for i, text in enumerate(lines) if text == "    " + stripped]
    assert at, f"source line not quoted:\n{msg}"
    caret = lines[at[0] + 1]
    assert set(caret.strip()) == {"^"}, f"no caret line under the source:\n{msg}"
    col = caret.index("^") - 4
    assert under in stripped, (under, stripped)
    assert col == stripped.index(under), f"caret at column {col}, call at {stripped.index(under)}:\n{msg}"
    width = len(caret.strip())
    assert 1 <= width <= len(stripped) - col


def rng():
    return np.random.default_rng(7)


X = rng().standard_normal((8, 64)).astype(np.float32)
Y = rng().standard_normal((8, 64)).astype(np.float32)
A16 = rng().standard_normal((32, 32)).astype(np.float16)
B16 = rng().standard_normal((32, 32)).astype(np.float16)


def zeros(*shape, dtype=np.float32):
    return np.zeros(shape, dtype)


# ---------------------------------------------------------------------------------------
# kernels (one mistake each, the good use in the recovery)

@pypto.jit
def vec_tiled(x, out, *, TM: int = 8, TN: int = 64):   # <M:vec-def>
    pypto.set_vec_tile_shapes(TM, TN)   # <M:vec-set>
    out[:] = x + 1.0   # <M:vec-op>


@pypto.jit
def vec_tiled3(x, out, *, TN: int = 64):
    pypto.set_vec_tile_shapes(1, 8, TN)   # <M:vec-set3>
    out[:] = x * 2.0


@pypto.jit
def cube_two(a, b, out, *, T: int = 16):
    pypto.set_cube_tile_shapes([T, T], [T, T])   # <M:cube-two>
    out[:] = a @ b


@pypto.jit
def cube_tiled(a, b, out, *, M: int = 32, M1: int = 32, K: int = 32, N: int = 32):
    pypto.set_cube_tile_shapes([M, M1], [K, K], [N, N])   # <M:cube-set>
    out[:] = a @ b   # <M:cube-op>


@pypto.jit
def add2(x, y, out):   # <M:def-add2>
    out[:] = x + y   # <M:add2>


@pypto.jit
def mm(a, b, out):
    out[:] = pypto.matmul(a, b)   # <M:mm>


@pypto.jit
def mm_mixed(a, b, out):
    out[:] = pypto.matmul(a, b, out_dtype=pypto.DT_FP32)   # <M:mm-mixed>


@pypto.jit
def exp_k(x, out):
    out[:] = pypto.exp(x)   # <M:exp>


@pypto.jit
def to_half(x, out):
    out[:] = pypto.cast(x, pypto.DT_FP16)   # <M:store-dtype>


@pypto.jit
def scaled(x, out, *, alpha: float):   # <M:def-scaled>
    out[:] = x * alpha


@pypto.jit
def writes_nothing(x, out):   # <M:def-nothing>
    y = x + 1.0  # noqa: F841


@pypto.jit
def returns_value(x, out):
    return x + 1.0   # <M:return>


@pypto.jit
def returns_and_writes(x, out, *, RET: int = 1):
    out[:] = x + 1.0
    if RET:
        return out   # <M:return-write>


@pypto.jit
def read_after_write(x, out, *, BAD: int = 1):
    out[:] = x * 2.0
    if BAD:
        out[:] = out + 1.0   # <M:raw>


@pypto.jit
def while_loop(x, out, *, BAD: int = 1):
    y = x
    if BAD:
        while y > 0:   # <M:while>
            y = y - 1.0
    out[:] = y


@pypto.jit
def compare(x, out, *, BAD: int = 1):
    if BAD:
        out[:] = pypto.where(x, x, 0.5)   # <M:compare>
    else:
        out[:] = pypto.maximum(x, x * 0.5)


@pypto.jit
def branch(x, out, *, BAD: int = 1):
    if BAD:
        if x:   # <M:if>
            pass
    out[:] = x


@pypto.jit
def tensor_power(x, out, *, BAD: int = 1):
    out[:] = x ** (x if BAD else 3)   # <M:pow>


@pypto.jit
def tensor_index(x, out, *, BAD: int = 1):
    if BAD:
        out[:] = x[x]   # <M:tensor-index>
    else:
        out[:] = x[0:8]


@pypto.jit
def stepped(x, out, *, STEP: int = -1):
    out[0:4] = x[3::STEP][:4]   # <M:step>
    out[4:8] = x[0:4]


@pypto.jit
def reduce_dim(x, out, *, D: int = 2):
    out[:] = pypto.sum(x, dim=D, keepdim=True)   # <M:sum-dim>


@pypto.jit
def reduce_dims(x, out, *, BAD: int = 1):
    out[:] = pypto.var(x, dim=(0, 1) if BAD else 1, keepdim=True)   # <M:sum-dims>


@pypto.jit
def transpose_dim(x, out, *, D: int = 2):
    out[:] = pypto.transpose(x, 0, D)   # <M:transpose>


@pypto.jit
def reshape_k(x, out, *, R: int = 7):
    out[:] = x.reshape(-1, R).reshape(8, 64)   # <M:reshape>


@pypto.jit
def view_k(x, out, *, OFF: int = 40):
    out[:] = pypto.view(x, [8, 32], [0, OFF])   # <M:view>


@pypto.jit
def index_k(x, out, *, I: int = 8):
    out[0:1] = x[0:1] * 1.0
    out[1:2] = x[I]   # <M:index>
    out[2:8] = x[2:8]


@pypto.jit
def too_many_idx(x, out, *, BAD: int = 1):
    if BAD:
        out[:] = x[0, 0, 0]   # <M:too-many>
    else:
        out[:] = x[:, :]


@pypto.jit
def int_plus_half(x, out, *, BAD: int = 1):
    out[:] = x + (0.5 if BAD else 1)   # <M:int-half>


@pypto.jit
def complex_const(x, out, *, BAD: int = 1):
    out[:] = x * (1j if BAD else 2.0)   # <M:complex>


@pypto.jit
def numpy_inside(x, y, out, *, BAD: int = 1):
    out[:] = x + (np.ones((8, 64), np.float32) if BAD else y)   # <M:numpy-inside>


@pypto.jit
def outer(x, out, *, BAD: int = 1):
    if BAD:
        vec_tiled(x, out)   # <M:nested>
    out[:] = x + 1.0


@pypto.jit
def rms(x, w, out):
    out[:] = pypto.rms_norm(x, w)   # <M:rms>


@pypto.jit
def int_div(x, y, out):
    out[:] = x / y


@pypto.jit
def rdiv(x, out):
    out[:] = 2 / x


@pypto.jit
def numerics(x, out):
    out[:] = pypto.exp(x) + x * 2.0 - pypto.sqrt(pypto.abs(x))


@pypto.jit
def row_max(x, out):
    out[:] = pypto.amax(x, dim=-1, keepdim=True)


class BrokenPass(OptimizationPass):
    level = "tensor"

    def apply(self, graph):
        raise ValueError("my pass is broken")   # <M:pass-raises>


class ForgetfulPass(OptimizationPass):
    level = "tensor"

    def apply(self, graph):   # <M:pass-none>
        graph.nodes  # noqa: B018 - forgets `return graph`


class TilePass(OptimizationPass):
    level = "tile"

    def apply(self, graph):
        return graph


# ---------------------------------------------------------------------------------------
# calls outside kernels (the call line is the failing call)

def call_unknown_machine():
    add2.compile(X, Y, zeros(8, 64), machine="a2a4")   # <M:machine>


def call_bad_toml(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('base = "a2a3"\nub_kib = = 256\n')
    add2.compile(X, Y, zeros(8, 64), machine=str(path))   # <M:toml-syntax>


def call_toml_field(tmp_path):
    path = tmp_path / "field.toml"
    path.write_text('base = "a2a3"\nub_kb = 256\n')
    pypto.sim.load_machine(str(path))   # <M:toml-field>


def call_toml_value(tmp_path):
    path = tmp_path / "value.toml"
    path.write_text('base = "a2a3"\nub_kib = -1\n')
    add2(X, Y, zeros(8, 64), machine=str(path))   # <M:toml-value>


def call_bad_pto():
    text = add2.compile(X, Y, zeros(8, 64)).program.text().replace("TADD ", "TADDX ", 1)
    pypto.Program.parse(text)   # <M:pto>


def call_unknown_option():
    add2.compile(X, Y, zeros(8, 64), options={"fuson": False})   # <M:option>


def call_pass_raises():
    pypto.CompilerPipeline([("broken", BrokenPass())]).compile(add2, X, Y, zeros(8, 64))


def call_pass_none():
    pypto.CompilerPipeline([("forgetful", ForgetfulPass())]).compile(add2, X, Y, zeros(8, 64))


def call_pass_level():
    pypto.CompilerPipeline().insert_before("fusion", "tile_pass", TilePass())   # <M:pass-level>


def call_pass_class():
    pypto.CompilerPipeline([("tile_pass", TilePass)])   # <M:pass-class>


def call_tensor_none():
    pypto.Tensor([None, 1024])   # <M:tensor-none>


def call_tensor_str():
    pypto.Tensor(["a", 1024])   # <M:tensor-str>


def call_tensor_negative():
    pypto.Tensor([-8, 64])   # <M:tensor-neg>


def call_tensor_zero():
    pypto.Tensor([0, 64])   # <M:tensor-zero>


def call_tensor_dtype():
    pypto.Tensor([8, 64], "fp64")   # <M:tensor-dtype>


def call_outside_kernel():
    pypto.exp(X)   # <M:outside>


# ---------------------------------------------------------------------------------------
# recoveries: the same kernel, good arguments, the right answer

def ok_vec_tiled():
    out = zeros(8, 64)
    vec_tiled(X, out)
    np.testing.assert_array_equal(out, X + 1.0)
    out = zeros(8, 64)
    vec_tiled.compile(X, out, TM=4, TN=32).simulate(X, out)


def ok_add2():
    out = zeros(8, 64)
    add2(X, Y, out)
    np.testing.assert_array_equal(out, X + Y)


def ok_mm(kernel=mm, out_dtype=np.float16, **consts):
    def run():
        out = zeros(32, 32, dtype=out_dtype)
        kernel(A16, B16, out, **consts)
        np.testing.assert_allclose(out.astype(np.float64), A16.astype(np.float64) @ B16, rtol=2e-2, atol=5e-2)
    return run


def ok_unary(kernel, ref, dtype=np.float32, x=X, **consts):
    def run():
        out = np.zeros(ref(x).shape, dtype)
        kernel(x, out, **consts)
        np.testing.assert_allclose(out, ref(x).astype(dtype), rtol=1e-5, atol=1e-5)
    return run


XI = (np.arange(8 * 64).reshape(8, 64) % 7 - 3).astype(np.int32)


@dataclass
class Case:
    id: str
    run: Callable               # raises
    error: type
    marker: str                 # the line it must point at
    under: str                  # the call the caret must sit under
    recover: Callable | None    # the same kernel, good arguments
    hint: str | None = None     # a substring of the hint
    expected_got: bool = True
    needles: tuple = ()


T3 = pypto.Tensor([2 ** 20, 2 ** 20])

CASES = [
    # tile shapes
    Case("vec-tile-misaligned", lambda: vec_tiled(X, zeros(8, 64), TN=20), pypto.TileShapeError, "vec-set",
         "pypto.set_vec_tile_shapes", ok_vec_tiled, hint="16 or 24", needles=("32",)),
    Case("vec-tiles-too-many", lambda: vec_tiled.compile(pypto.Tensor([8192, 8192]), pypto.Tensor([8192, 8192]),
                                                         TM=1, TN=8),
         pypto.ShapeError, "vec-op", "x + 1.0", ok_vec_tiled, hint="larger tiles", needles=("8,388,608 tiles",)),
    Case("vec-tile-zero", lambda: vec_tiled(X, zeros(8, 64), TM=0), pypto.TileShapeError, "vec-set",
         "pypto.set_vec_tile_shapes", ok_vec_tiled, hint="positive", needles=("(0, 64)",)),
    Case("vec-tile-negative", lambda: vec_tiled(X, zeros(8, 64), TN=-64), pypto.TileShapeError, "vec-set",
         "pypto.set_vec_tile_shapes", ok_vec_tiled, needles=("-64",)),
    Case("vec-tile-too-big", lambda: vec_tiled.compile(pypto.Tensor([256, 4096]), pypto.Tensor([256, 4096]),
                                                       TM=256, TN=4096),
         pypto.TileShapeError, "vec-op", "x + 1.0", ok_vec_tiled, hint="set_vec_tile_shapes(", needles=("UB",)),
    Case("vec-tile-too-many-dims", lambda: vec_tiled3(X, zeros(8, 64)), pypto.TileShapeError, "vec-set3",
         "pypto.set_vec_tile_shapes",
         ok_unary(vec_tiled3, lambda x: x * 2.0, x=X[None].repeat(2, 0)), hint="set_vec_tile_shapes(8, 64)"),
    Case("cube-tile-two-args", lambda: cube_two(A16, B16, zeros(32, 32, dtype=np.float16)), pypto.TileShapeError,
         "cube-two", "pypto.set_cube_tile_shapes", None, hint="[mL0, mL1], [kL0, kL1], [nL0, nL1]",
         needles=("3 arguments", "2 arguments")),
    Case("cube-tile-l1-not-multiple", lambda: cube_tiled(A16, B16, zeros(32, 32, dtype=np.float16), M1=48),
         pypto.TileShapeError, "cube-set", "pypto.set_cube_tile_shapes", ok_mm(cube_tiled), hint="[mL0, mL1]"),
    Case("cube-tile-zero", lambda: cube_tiled(A16, B16, zeros(32, 32, dtype=np.float16), K=0),
         pypto.TileShapeError, "cube-set", "pypto.set_cube_tile_shapes", ok_mm(cube_tiled)),
    Case("cube-tile-misaligned", lambda: cube_tiled(A16, B16, zeros(32, 32, dtype=np.float16), M=8, M1=8),
         pypto.TileShapeError, "cube-set", "pypto.set_cube_tile_shapes", ok_mm(cube_tiled), hint="mL0=16",
         needles=("16",)),
    Case("cube-tile-too-big", lambda: cube_tiled.compile(pypto.Tensor([512, 512], pypto.DT_FP16),
                                                         pypto.Tensor([512, 512], pypto.DT_FP16),
                                                         pypto.Tensor([512, 512], pypto.DT_FP16),
                                                         M=512, M1=512, K=512, N=512),
         pypto.TileShapeError, "cube-op", "a @ b", ok_mm(cube_tiled), hint="set_cube_tile_shapes(",
         needles=("L0",)),
    # shapes and dtypes of operands
    Case("add-shape-mismatch", lambda: add2(X, Y[:4], zeros(8, 64)), pypto.ShapeError, "add2", "x + y", ok_add2,
         needles=("[8,64]", "[4,64]")),
    Case("matmul-inner-mismatch", lambda: mm(A16, B16[:16], zeros(32, 32, dtype=np.float16)), pypto.ShapeError,
         "mm", "pypto.matmul", ok_mm()),
    Case("matmul-1d", lambda: mm(A16[0], B16, zeros(32, dtype=np.float16)), pypto.ShapeError, "mm",
         "pypto.matmul", ok_mm()),
    Case("add-dtype-mismatch", lambda: add2(X, Y.astype(np.float16), zeros(8, 64)), pypto.DTypeError, "add2",
         "x + y", ok_add2, needles=("fp16",)),
    Case("matmul-dtype-mismatch", lambda: mm(A16, B16.astype(np.float32), zeros(32, 32, dtype=np.float16)),
         pypto.DTypeError, "mm", "pypto.matmul", ok_mm()),
    Case("matmul-int32", lambda: mm(A16.astype(np.int32), B16.astype(np.int32), zeros(32, 32, dtype=np.int32)),
         pypto.DTypeError, "mm", "pypto.matmul", ok_mm()),
    Case("exp-of-int", lambda: exp_k(XI, zeros(8, 64, dtype=np.int32)), pypto.DTypeError, "exp", "pypto.exp",
         ok_unary(exp_k, np.exp)),
    Case("store-dtype-mismatch", lambda: to_half(X, zeros(8, 64)), pypto.DTypeError, "store-dtype", "out[:]",
         ok_unary(to_half, lambda x: x.astype(np.float16), dtype=np.float16)),
    Case("matmul-fp32-out-into-fp16", lambda: mm_mixed(A16, B16, zeros(32, 32, dtype=np.float16)),
         pypto.DTypeError, "mm-mixed", "out[:]", ok_mm(mm_mixed, np.float32)),
    Case("output-wrong-shape", lambda: add2(X, Y, zeros(64, 8)), pypto.ShapeError, "add2", "out[:]", ok_add2),
    Case("rms-weight-mismatch", lambda: rms(X, np.ones(32, np.float32), zeros(8, 64)), pypto.ShapeError, "rms",
         "pypto.rms_norm", None),
    Case("int-plus-half", lambda: int_plus_half(XI, zeros(8, 64, dtype=np.int32)), pypto.DTypeError, "int-half",
         "x + (0.5", ok_unary(int_plus_half, lambda x: x + 1, dtype=np.int32, x=XI, BAD=0), hint="pypto.cast"),
    Case("complex-constant", lambda: complex_const(X, zeros(8, 64)), pypto.DTypeError, "complex", "x * (1j",
         ok_unary(complex_const, lambda x: x * 2.0, BAD=0)),
    # arguments
    Case("float64-input", lambda: add2(X.astype(np.float64), Y, zeros(8, 64)), pypto.DTypeError, "def-add2",
         "x", ok_add2, hint="astype(np.float32)", needles=("float64",)),
    Case("int16-input", lambda: add2(X.astype(np.int16), Y, zeros(8, 64)), pypto.DTypeError, "def-add2", "x",
         ok_add2, hint="np.int32", needles=("int16",)),
    Case("complex-input", lambda: add2(X, Y.astype(np.complex64), zeros(8, 64)), pypto.DTypeError, "def-add2",
         "y", ok_add2, hint="complex", needles=("complex64",)),
    Case("list-input", lambda: add2(X, Y.tolist(), zeros(8, 64)), pypto.KernelSignatureError, "def-add2", "y",
         ok_add2, hint="np.asarray", needles=("list",)),
    Case("scalar-input", lambda: add2(X, 2.0, zeros(8, 64)), pypto.KernelSignatureError, "def-add2", "y",
         ok_add2, hint="keyword-only constant"),
    Case("empty-input", lambda: add2(X[:0], Y[:0], zeros(0, 64)), pypto.ShapeError, "def-add2", "x", ok_add2,
         needles=("[0, 64]",)),
    Case("missing-output", lambda: add2(X, Y), pypto.KernelSignatureError, "def-add2", "x, y, out", ok_add2,
         hint="outputs too", needles=("3", "2 arguments")),
    Case("extra-argument", lambda: add2(X, Y, zeros(8, 64), zeros(8, 64)), pypto.KernelSignatureError,
         "def-add2", "x, y, out", ok_add2, needles=("4 arguments",)),
    Case("tensors-as-keywords", lambda: add2(x=X, y=Y, out=zeros(8, 64)), pypto.KernelSignatureError,
         "def-add2", "x, y", ok_add2, hint="positional"),
    Case("unknown-constant", lambda: vec_tiled(X, zeros(8, 64), tm=8), pypto.KernelSignatureError, "vec-def",
         "x, out", ok_vec_tiled, hint="did you mean TM"),
    Case("missing-constant", lambda: scaled(X, zeros(8, 64)), pypto.KernelSignatureError, "def-scaled", "alpha",
         ok_unary(scaled, lambda x: x * 0.5, alpha=0.5), hint="alpha="),
    Case("float-for-int-constant", lambda: vec_tiled(X, zeros(8, 64), TN=64.0), pypto.KernelSignatureError,
         "vec-def", "TN", ok_vec_tiled),
    Case("kernel-inside-kernel", lambda: outer(X, zeros(8, 64)), pypto.KernelSignatureError, "nested",
         "vec_tiled(x, out)", ok_unary(outer, lambda x: x + 1.0, BAD=0), hint="from Python"),
    Case("too-large-for-memory", lambda: vec_tiled.compile(T3, T3), pypto.ShapeError, "vec-def", "x, out",
         ok_vec_tiled, hint="smaller shape", needles=("64 GiB", "4 TiB")),
    # what a kernel writes and returns
    Case("writes-nothing", lambda: writes_nothing(X, zeros(8, 64)), pypto.KernelSignatureError, "def-nothing",
         "x, out", None, hint="out[:] = value"),
    Case("returns-a-value", lambda: returns_value(X, zeros(8, 64)), pypto.KernelSignatureError, "return",
         "return x + 1.0", None, hint="out[:] = value", needles=("ignored",)),
    Case("returns-and-writes", lambda: returns_and_writes(X, zeros(8, 64)), pypto.KernelSignatureError,
         "return-write", "return out", ok_unary(returns_and_writes, lambda x: x + 1.0, RET=0), needles=("ignored",)),
    Case("write-then-read", lambda: read_after_write(X, zeros(8, 64)), pypto.UnsupportedError, "raw", "out + 1.0",
         ok_unary(read_after_write, lambda x: x * 2.0, BAD=0)),
    # Python on tensors
    Case("while-on-tensor", lambda: while_loop(X, zeros(8, 64)), pypto.UnsupportedError, "while", "y > 0",
         ok_unary(while_loop, lambda x: x, BAD=0), hint="pypto.where", needles=("while",)),
    Case("where-without-mask", lambda: compare(X, zeros(8, 64)), pypto.DTypeError, "compare", "pypto.where",
         ok_unary(compare, lambda x: np.maximum(x, x * 0.5), BAD=0), hint="compare first"),
    Case("if-on-tensor", lambda: branch(X, zeros(8, 64)), pypto.UnsupportedError, "if", "if x",
         ok_unary(branch, lambda x: x, BAD=0)),
    Case("power-of-tensor", lambda: tensor_power(X, zeros(8, 64)), pypto.UnsupportedError, "pow",
         "x ** (x if BAD else 3)", ok_unary(tensor_power, lambda x: x * x * x, BAD=0), hint="pypto.exp",
         needles=("x ** Tensor",)),
    Case("index-with-tensor", lambda: tensor_index(X, zeros(8, 64)), pypto.UnsupportedError, "tensor-index", "x[x]",
         ok_unary(tensor_index, lambda x: x, BAD=0)),
    Case("negative-step", lambda: stepped(X, zeros(8, 64)), pypto.UnsupportedError, "step", "x[3::STEP]",
         ok_unary(stepped, lambda x: np.concatenate([x[3:7], x[0:4]]), STEP=1), hint="index forwards"),
    Case("reduce-dim-out-of-range", lambda: reduce_dim(X, zeros(8, 1)), pypto.ShapeError, "sum-dim", "pypto.sum",
         ok_unary(reduce_dim, lambda x: x.sum(1, keepdims=True), D=1)),
    Case("reduce-several-dims", lambda: reduce_dims(X, zeros(1, 1)), pypto.UnsupportedError, "sum-dims",
         "pypto.var", ok_unary(reduce_dims, lambda x: x.var(1, keepdims=True, ddof=1), BAD=0), hint="reshape"),
    Case("transpose-dim", lambda: transpose_dim(X, zeros(64, 8)), pypto.ShapeError, "transpose",
         "pypto.transpose", ok_unary(transpose_dim, lambda x: x.T, D=1)),
    Case("reshape-elements", lambda: reshape_k(X, zeros(8, 64)), pypto.ShapeError, "reshape", "x.reshape(-1, R)",
         ok_unary(reshape_k, lambda x: x, R=8), needles=("512",)),
    Case("view-outside", lambda: view_k(X, zeros(8, 32)), pypto.ShapeError, "view", "pypto.view",
         ok_unary(view_k, lambda x: x[:, 32:], OFF=32)),
    Case("index-out-of-range", lambda: index_k(X[:, :8].copy(), zeros(8, 8)), pypto.ShapeError, "index",
         "x[I]", ok_unary(index_k, lambda x: np.concatenate([x[0:1], x[1:2], x[2:8]]), x=X[:, :8].copy(), I=1)),
    Case("too-many-indices", lambda: too_many_idx(X, zeros(8, 64)), pypto.ShapeError, "too-many", "x[0, 0, 0]",
         ok_unary(too_many_idx, lambda x: x, BAD=0)),
    Case("numpy-array-inside", lambda: numpy_inside(X, Y, zeros(8, 64)), pypto.UnsupportedError, "numpy-inside",
         "x + (np.ones", None, hint="argument"),
    Case("op-outside-kernel", call_outside_kernel, pypto.PyptoError, "outside", "pypto.exp(X)", ok_add2,
         expected_got=False),
    # pypto.Tensor specs
    Case("tensor-none-dim", call_tensor_none, pypto.ShapeError, "tensor-none", "pypto.Tensor", ok_add2,
         needles=("None",)),
    Case("tensor-str-dim", call_tensor_str, pypto.ShapeError, "tensor-str", "pypto.Tensor", ok_add2,
         needles=("'a'",)),
    Case("tensor-negative-dim", call_tensor_negative, pypto.ShapeError, "tensor-neg", "pypto.Tensor", ok_add2),
    Case("tensor-zero-dim", call_tensor_zero, pypto.ShapeError, "tensor-zero", "pypto.Tensor", ok_add2,
         needles=("empty",)),
    Case("tensor-bad-dtype", call_tensor_dtype, pypto.DTypeError, "tensor-dtype", "pypto.Tensor", ok_add2,
         needles=("fp64",)),
    # machines, options, passes, program text
    Case("unknown-machine", call_unknown_machine, pypto.PyptoError, "machine", "add2.compile", ok_add2,
         hint="did you mean 'a2a3'", needles=("teach",)),
    Case("toml-syntax", "call_bad_toml", pypto.PyptoError, "toml-syntax", "add2.compile", ok_add2,
         needles=("bad.toml", "not valid TOML")),
    Case("toml-unknown-field", "call_toml_field", pypto.PyptoError, "toml-field", "pypto.sim.load_machine",
         ok_add2, hint="did you mean 'ub_kib'"),
    Case("toml-bad-value", "call_toml_value", pypto.PyptoError, "toml-value", "add2(X, Y", ok_add2,
         needles=("ub_kib", "-1")),
    Case("pto-text", call_bad_pto, pypto.PyptoError, "pto", "pypto.Program.parse", ok_add2, needles=("TADDX",)),
    Case("unknown-option", call_unknown_option, pypto.PyptoError, "option", "add2.compile", ok_add2,
         hint="did you mean 'fusion'"),
    Case("pass-raises", call_pass_raises, pypto.PyptoError, "pass-raises", "raise ValueError", ok_add2,
         expected_got=False, needles=("broken", "my pass is broken")),
    Case("pass-returns-none", call_pass_none, pypto.PyptoError, "pass-none", "def apply", ok_add2,
         hint="return graph", needles=("forgetful", "None")),
    Case("pass-wrong-level", call_pass_level, pypto.PyptoError, "pass-level", "pypto.CompilerPipeline()",
         ok_add2, needles=("tile level",)),
    Case("pass-class-not-instance", call_pass_class, pypto.PyptoError, "pass-class", "pypto.CompilerPipeline",
         ok_add2, hint="TilePass()"),
]


def test_catalogue_is_large_enough():
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_mistake(case: Case, tmp_path):
    run = case.run
    if isinstance(run, str):                  # needs tmp_path
        fn = globals()[run]
        run = lambda: fn(tmp_path)  # noqa: E731
    with pytest.raises(pypto.PyptoError) as ei:
        run()
    err = ei.value
    assert isinstance(err, case.error), f"{type(err).__name__} is not a {case.error.__name__}:\n{err}"
    msg = str(err)
    check_located(err, case.marker, case.under)
    if case.expected_got:
        assert "expected:" in msg and "got:" in msg, msg
        assert err.expected is not None and err.got is not None
    if case.hint is not None:
        assert err.hint and case.hint in err.hint, msg
        assert "hint:" in msg
    for needle in case.needles:
        assert needle in msg, (needle, msg)
    assert "Traceback" not in msg
    if case.recover is not None:
        case.recover()


def test_errors_carry_no_compiler_frames():
    """What the user sees in a traceback ends at the entry point (no pass or op frames)."""
    import traceback
    pkg = os.path.dirname(os.path.abspath(pypto.__file__))
    for run in (lambda: add2(X, Y[:4], zeros(8, 64)), call_unknown_machine, call_unknown_option,
                lambda: vec_tiled(X, zeros(8, 64), TN=20)):
        with pytest.raises(pypto.PyptoError) as ei:
            run()
        inside = [fs for fs in traceback.extract_tb(ei.tb) if os.path.abspath(fs.filename).startswith(pkg)]
        assert len(inside) <= 1, [f"{fs.filename}:{fs.lineno}" for fs in inside]


def test_non_contiguous_and_fortran_outputs_are_written():
    """Not a mistake: an output that is a strided view or Fortran-ordered gets the values."""
    big = zeros(8, 128)
    view = big[:, ::2]
    add2(X, Y, view)
    np.testing.assert_array_equal(view, X + Y)
    assert (big[:, 1::2] == 0).all()
    f = np.asfortranarray(zeros(8, 64))
    add2(X, Y, f)
    np.testing.assert_array_equal(f, X + Y)


def test_nan_and_inf_inputs_compute_as_numpy():
    x = X.copy()
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    x[1, 0] = np.nan
    out = zeros(8, 64)
    with np.errstate(all="ignore"):
        numerics(x, out)
        ref = np.exp(x) + x * 2.0 - np.sqrt(np.abs(x))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert np.isnan(out[0, 0]) and np.isnan(out[0, 1]) and out[0, 2] == -np.inf   # inf - inf is nan
    res = numerics.compile(x, out).simulate(x, out)
    assert res.ok
    mx = zeros(8, 1)
    row_max(x, mx)
    np.testing.assert_array_equal(mx, x.max(-1, keepdims=True))
    assert np.isnan(mx[0, 0]) and np.isnan(mx[1, 0])


@pytest.mark.parametrize("dtype", [np.int32, np.int8])
def test_integer_division_is_true_division_in_fp32(dtype):
    x = (np.arange(8 * 64).reshape(8, 64) % 11 - 5).astype(dtype)
    y = (np.arange(8 * 64).reshape(8, 64) % 5 - 2).astype(dtype)       # zeros among them
    out = zeros(8, 64)
    with np.errstate(all="ignore"):
        ref = x.astype(np.float32) / y.astype(np.float32)
        int_div(x, y, out)
        np.testing.assert_array_equal(out, ref)
        assert np.isinf(out).any() and np.isnan(out).any()
        rdiv(x, out)
        np.testing.assert_allclose(out, np.float32(2) / x.astype(np.float32), rtol=1e-6)
        assert np.isinf(out).any()
    two = np.full((8, 64), 2, dtype)
    rdiv(two, out)
    np.testing.assert_array_equal(out, np.ones((8, 64), np.float32))      # 2 / 2 is 1, not 0
    with pytest.raises(pypto.DTypeError):
        rdiv(two, zeros(8, 64, dtype=dtype))                              # the result is fp32


def test_signature_error_caret_sits_under_the_parameter():
    with pytest.raises(pypto.KernelSignatureError) as ei:
        add2(X, [1, 2], zeros(8, 64))
    text = str(ei.value)
    src = _SRC[line_of("def-add2") - 1].strip()
    lines = text.splitlines()
    i = lines.index("    " + src)
    assert lines[i + 1] == "    " + " " * src.index("y") + "^"
