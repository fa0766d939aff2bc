"""The kernels the benchmarks measure: each with tile-shape constants, and an `_auto` twin that
sets no tile shapes (for automatic tiling)."""
import pypto


@pypto.jit
def softmax(x, out, *, TM: int = 64, TN: int = 256):
    """The tutorial softmax (DESIGN.md section 5)."""
    pypto.set_vec_tile_shapes(TM, TN)
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)


@pypto.jit
def softmax_auto(x, out):
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)


@pypto.jit
def layernorm(x, w, b, out, *, TM: int = 64, TN: int = 256):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = pypto.layernorm(x, w, b)


@pypto.jit
def layernorm_auto(x, w, b, out):
    out[:] = pypto.layernorm(x, w, b)


@pypto.jit
def matmul(a, b, c, *, ML0: int = 128, NL0: int = 128, KL0: int = 64, KL1: int = 256):
    pypto.set_cube_tile_shapes([ML0, ML0], [KL0, KL1], [NL0, NL0])
    c[:] = pypto.matmul(a, b)


@pypto.jit
def matmul_auto(a, b, c):
    c[:] = pypto.matmul(a, b)


@pypto.jit
def matmul_bias_gelu(a, b, bias, c, *, ML0: int = 128, NL0: int = 128, KL0: int = 64, KL1: int = 256,
                     VM: int = 32, VN: int = 128):
    pypto.set_cube_tile_shapes([ML0, ML0], [KL0, KL1], [NL0, NL0])
    pypto.set_vec_tile_shapes(VM, VN)
    c[:] = pypto.gelu(pypto.matmul(a, b) + bias)


@pypto.jit
def matmul_bias_gelu_auto(a, b, bias, c):
    c[:] = pypto.gelu(pypto.matmul(a, b) + bias)
