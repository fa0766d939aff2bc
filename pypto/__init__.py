"""pypto: write tile kernels in Python, compile them through five IR levels, simulate them.

Importing pypto loads only numpy-based code; notebook pieces (IPython, ipywidgets,
matplotlib, graphviz) are imported lazily by `pypto.viz` and `pypto.magics`.
"""
from .dtypes import DT_BF16, DT_FP16, DT_FP32, DT_INT8, DT_INT32, DType
from .errors import (DTypeError, KernelSignatureError, MagicUsageError, PyptoError, ShapeError,
                     SimulationError, TileShapeError, UnsupportedError, VerificationError)
from .compiler.api import CompilerPipeline
from .frontend.jit import JitKernel, jit
from .frontend.ops import (abs, add, amax, amin, assemble, cast, clamp, clip, conv2d, div, elu, exp, exp2,
                           expm1, gelu, hardsigmoid, hardswish, hardtanh, layer_norm, layernorm, leaky_relu,
                           log, log10, log1p, log2, log_softmax, logsumexp, loop, matmul, maximum, mean,
                           minimum, mul, neg, pow, reciprocal, relu, relu6, reshape, rms_norm, rsqrt,
                           set_cube_tile_shapes, set_vec_tile_shapes, sigmoid, silu, softmax, softplus, sqrt,
                           square, std, sub, sum, swiglu, tanh, transpose, var, view)
from .frontend.tracer import Tensor
from .ir.program import Program

__version__ = "0.1.0"


def explore(kernel, *args, machine="a2a3", **consts):
    """An ipywidgets explorer of a kernel: a tab per IR level, timeline, stats, a slider per constant."""
    from .viz.explorer import Explorer
    return Explorer(kernel, args, machine=machine, consts=consts)


def compare(ck_a, ck_b, *args, **kw):
    """Two compiled kernels side by side: cycles, bound, timelines on one time axis, PTO diff."""
    from .viz.compare import compare as _compare
    return _compare(ck_a, ck_b, *args, **kw)


def report(ck, path, *args, **kw) -> str:
    """Write one self-contained HTML file with every level, the timeline and the stats of `ck`."""
    from .viz.report import write_report
    return write_report(ck, path, *args, **kw)


def load_ipython_extension(ipython):
    """`%load_ext pypto`: registers the %%pypto cell magic."""
    from .magics import load_ipython_extension as _load
    _load(ipython)


def unload_ipython_extension(ipython):
    """`%unload_ext pypto`."""
    from .magics import unload_ipython_extension as _unload
    _unload(ipython)


__all__ = [
    "CompilerPipeline", "DT_BF16", "DT_FP16", "DT_FP32", "DT_INT32", "DT_INT8", "DType", "DTypeError",
    "JitKernel", "KernelSignatureError", "MagicUsageError", "Program", "PyptoError", "ShapeError",
    "SimulationError", "Tensor", "TileShapeError", "UnsupportedError", "VerificationError", "abs", "add",
    "amax", "amin", "assemble", "cast", "clamp", "clip", "compare", "conv2d", "div", "elu", "exp", "exp2",
    "explore", "expm1", "gelu", "hardsigmoid", "hardswish", "hardtanh", "jit", "layer_norm", "layernorm",
    "leaky_relu", "log", "log10", "log1p", "log2", "log_softmax", "logsumexp", "loop", "matmul", "maximum",
    "mean", "minimum", "mul", "neg", "pow", "reciprocal", "relu", "relu6", "report", "reshape", "rms_norm",
    "rsqrt", "set_cube_tile_shapes", "set_vec_tile_shapes", "sigmoid", "silu", "softmax", "softplus", "sqrt",
    "square", "std", "sub", "sum", "swiglu", "tanh", "transpose", "var", "view",
]
