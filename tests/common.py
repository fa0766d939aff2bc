"""Kernels and helpers shared by several test modules.

The kernels are the benchmarks' own (benchmarks/kernels.py), so the figures the tests pin are the
ones the benchmarks report."""
import inspect
import os
import sys

import pytest

import pypto

from pypto.ir.exec import TileRef
from pypto.ir.gm import GMRef

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from kernels import layernorm, matmul, matmul_auto, matmul_bias_gelu, softmax  # noqa: E402,F401


def byte_accesses(ins):
    """(space or GM buffer, lo, hi, is_write) of every operand of an instruction."""
    out = []
    for o, w in [(ins.dst, True)] + [(s, False) for s in ins.srcs]:
        if isinstance(o, TileRef):
            out.append((o.space, o.addr, o.addr + o.nbytes, w))
        elif isinstance(o, GMRef):
            lo, hi = o.span()
            out.append(("GM:" + o.buf.name, lo, hi, w))
    return out


def marker_line(path: str, tag: str) -> int:
    """The number of the one line of file `path` that ends with the comment `tag`
    (e.g. `# <M:vec-set>`): where a test expects an error to point."""
    with open(path) as f:
        hits = [i for i, text in enumerate(f.read().splitlines(), 1) if text.rstrip().endswith(tag)]
    assert len(hits) == 1, f"marker {tag} found {len(hits)} times"
    return hits[0]


def unary_kernel(fn):
    """A kernel `out[:] = fn(a)`, with the vector tile (TM, TN) as constants (0: pypto's default)."""
    import pypto

    @pypto.jit
    def unary(a, out, *, TM: int = 0, TN: int = 0):
        if TM:
            pypto.set_vec_tile_shapes(TM, TN)
        out[:] = fn(a)
    return unary


def tile_consts(tiles):
    """The constants of a (TM, TN) tile, or none for pypto's default tile."""
    return {} if tiles is None else {"TM": tiles[0], "TN": tiles[1]}


@pytest.fixture
def fresh_registry():
    """Every op a test registers (pypto.register_op) is removed after it: the registry is global,
    and docs/ops.md and tests/test_registry.py read it."""
    from pypto.frontend import custom
    before = set(custom.registered())
    yield
    for name in set(custom.registered()) - before:
        custom.unregister_op(name)


def line_of(fn, text: str) -> int:
    """The line number of the first line of `fn`'s source containing `text`."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(k for k, ln in enumerate(lines) if text in ln)


@pypto.jit(level="tile")
def tile_matmul(a, b, c, *, TM: int = 128, TN: int = 128, TK: int = 128, K0: int = 64):
    """C = A @ B: per output tile, K in 128-deep chunks staged in L1, each extracted to L0A /
    L0B in K0-deep slices and accumulated in L0C, stored through FIX (fp32 -> fp16)."""
    tl = pypto.tile
    M, K = a.shape
    N = b.shape[1]
    for i in range(0, M, TM):
        for j in range(0, N, TN):
            acc = None
            for k in range(0, K, TK):
                a1 = tl.tload(a[i:i + TM, k:k + TK], space="L1")
                b1 = tl.tload(b[k:k + TK, j:j + TN], space="L1")
                for k0 in range(0, TK, K0):
                    a0 = tl.textract(a1, "L0A", offsets=(0, k0), shape=(TM, K0))
                    b0 = tl.textract(b1, "L0B", offsets=(k0, 0), shape=(K0, TN))
                    acc = tl.tmatmul(a0, b0) if acc is None else tl.tmatmul_acc(acc, a0, b0)
            tl.tstore(c[i:i + TM, j:j + TN], acc)


class Tiled:
    """A kernel of benchmarks/kernels.py with its tile constants set: `compile` passes them."""

    def __init__(self, kernel, name: str, **consts):
        self.kernel, self.name, self.consts = kernel, name, consts

    def compile(self, *args, **kw):
        return self.kernel.compile(*args, **self.consts, **kw)


# kernels of fixed tiles (128x128 output tiles, 64-deep K chunks; 16x128 vector tiles) for the tests
# of the Block level's and select's fast paths, which compare them with the general paths
mm_128 = Tiled(matmul, "mm_128", KL1=128)
mm_bias_gelu_128 = Tiled(matmul_bias_gelu, "mm_bias_gelu_128", KL1=128)
softmax_16x128 = Tiled(softmax, "softmax_16x128", TM=16, TN=128)


@pypto.jit
def conv_relu_nhwc(x, w, y):
    pypto.set_cube_tile_shapes([32, 32], [16, 64], [32, 32])
    y[:] = pypto.relu(pypto.conv2d(x, w, layout="NHWC"))
