"""pypto: write tile kernels in Python, compile them through five IR levels, simulate them.

Importing pypto loads only numpy-based code; notebook pieces (IPython, ipywidgets,
matplotlib, graphviz) are imported lazily by `pypto.viz` and `pypto.magics`.
"""
from .dtypes import DT_BF16, DT_BOOL, DT_FP16, DT_FP32, DT_INT8, DT_INT32, DType
from .errors import (DTypeError, KernelSignatureError, MagicUsageError, PyptoError, ShapeError,
                     SimulationError, TileShapeError, UnsupportedError, VerificationError)
from .compiler.api import CompilerPipeline
from .frontend.dynamic import DYNAMIC, SymbolicScalar, cond, loop
from .frontend.jit import JitKernel, jit
from .frontend.autodiff import def_gradient, grad, value_and_grad
from .frontend.custom import fuse, register_op, target_specific, unregister_op
from .frontend.graph_check import check_graph
from .frontend import ops as _ops
from .frontend.ops import *  # noqa: F401,F403  (the ops: pypto.add, pypto.where, ...)
from .frontend.tracer import Tensor
from .frontend import tile  # noqa: F401  (pypto.tile: the Tile tier, PTO instructions in lower case)
from .frontend import block  # noqa: F401  (pypto.block: the Block tier, tasks written by hand)
from .frontend.tile_forms import merge_tiles, tile_conv2d  # noqa: F401  (the seeds' forms over pypto.tile)
from .ir.program import Program
from . import nn, optim  # noqa: F401  (pypto.nn: torch.nn-style modules written with pypto ops; pypto.optim)

__version__ = "0.1.0"


def explore(kernel, *args, machine="a2a3", **consts):
    """An ipywidgets explorer of a kernel: a tab per IR level, timeline, stats, a slider per constant."""
    from .viz.explorer import Explorer
    return Explorer(kernel, args, machine=machine, consts=consts)


def compare(ck_a, ck_b, *args, **kw):
    """Two compiled kernels side by side: cycles, bound, timelines on one time axis, PTO diff."""
    from .viz.compare import compare as _compare
    return _compare(ck_a, ck_b, *args, **kw)


def tune(kernel, space, *args, machine="a2a3", executor=None, options=None, cache: bool = True):
    """Time every configuration of `space` ({"TM": [32, 64], "double_buffer": [True, False],
    "machine": ["a2a3", "a5"]}) for these arguments, in this process or on `executor` (a
    concurrent.futures.Executor or a dask.distributed.Client); a `pypto.tuning.TuneResult`.
    In a notebook a progress bar shows while it runs (and leaves the cell's output as it was)."""
    from .tuning import tune as _tune
    from .viz.busy import first_render
    with first_render(f"tuning {getattr(kernel, 'name', 'kernel')}"):
        return _tune(kernel, space, *args, machine=machine, executor=executor, options=options, cache=cache)


def advise(ck, *args, executor=None, **kw):
    """What bounds a compiled kernel, with the changes that make it faster, each re-simulated
    (`pypto.tuning.advisor.advise`); only the changes that measurably help are suggested."""
    from .tuning.advisor import advise as _advise
    from .viz.busy import first_render
    with first_render(f"advising {getattr(ck, 'name', 'kernel')}"):
        return _advise(ck, *args, executor=executor, **kw)


def report(ck, path, *args, **kw) -> str:
    """Write one self-contained HTML file with every level, the timeline and the stats of `ck`."""
    from .viz.report import write_report
    return write_report(ck, path, *args, **kw)


def profile(timing: bool = True):
    """`with pypto.profile() as prof:` collects every kernel call and ck.simulate in the block;
    prof.rows, print(prof), or a table in a notebook (kernel calls are timed once per compiled
    kernel in timing mode; timing=False leaves their cycles None)."""
    from .viz.profile import Profile
    return Profile(timing=timing)


def load_ipython_extension(ipython):
    """`%load_ext pypto`: registers the %%pypto cell magic."""
    from .magics import load_ipython_extension as _load
    _load(ipython)


def unload_ipython_extension(ipython):
    """`%unload_ext pypto`."""
    from .magics import unload_ipython_extension as _unload
    _unload(ipython)


__all__ = sorted({
    "CompilerPipeline", "DYNAMIC", "SymbolicScalar", "cond", "loop", "DT_BF16", "DT_BOOL", "DT_FP16", "DT_FP32", "DT_INT8", "DT_INT32", "DType", "DTypeError",
    "JitKernel", "KernelSignatureError", "def_gradient", "grad", "value_and_grad",
    "check_graph", "fuse", "nn", "optim", "profile", "register_op", "target_specific", "unregister_op", "MagicUsageError", "Program", "PyptoError", "ShapeError", "SimulationError",
    "Tensor", "TileShapeError", "UnsupportedError", "VerificationError", "advise", "compare", "explore", "jit", "report",
    "tune",
    *_ops.__all__})
