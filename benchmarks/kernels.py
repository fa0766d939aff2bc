"""The kernels the benchmarks measure."""
import pypto


@pypto.jit
def softmax(x, out, *, TM: int = 64, TN: int = 256):
    """The tutorial softmax (DESIGN.md section 5)."""
    pypto.set_vec_tile_shapes(TM, TN)
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)
