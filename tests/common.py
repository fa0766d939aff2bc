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
