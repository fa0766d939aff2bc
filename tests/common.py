"""Kernels and helpers shared by several test modules."""
import pypto
from pypto.ir.exec import TileRef
from pypto.ir.gm import GMRef


@pypto.jit
def softmax(x, out, *, TM: int = 64, TN: int = 256):
    """The tutorial softmax (DESIGN.md section 5)."""
    pypto.set_vec_tile_shapes(TM, TN)
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)


@pypto.jit
def layernorm(x, w, b, out, *, TM: int = 64, TN: int = 256):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = pypto.layernorm(x, w, b)


@pypto.jit
def matmul(a, b, c, *, ML0: int = 128, NL0: int = 128, KL0: int = 64, KL1: int = 256):
    """The benchmark matmul (benchmarks/passes.py): cube tile mL0/kL0-kL1/nL0."""
    pypto.set_cube_tile_shapes([ML0, ML0], [KL0, KL1], [NL0, NL0])
    c[:] = pypto.matmul(a, b)


@pypto.jit
def matmul_bias_gelu(a, b, bias, c, *, ML0: int = 128, NL0: int = 128, KL0: int = 64, KL1: int = 256,
                     VM: int = 32, VN: int = 128):
    pypto.set_cube_tile_shapes([ML0, ML0], [KL0, KL1], [NL0, NL0])
    pypto.set_vec_tile_shapes(VM, VN)
    c[:] = pypto.gelu(pypto.matmul(a, b) + bias)


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
