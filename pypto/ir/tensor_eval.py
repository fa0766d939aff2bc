"""The executable spec of the Tensor level: evaluate a Tensor Graph with numpy, op by op.

This is the independent reference the simulator's tile-level results are checked against, and
the engine of eager (debug) execution.  Each op is evaluated by its registry row's numpy
reference (`ir/ops.py`, column `ref`), never through the compiler's decomposition, so that the
two paths stay independent.  A float result computed by several numpy steps (a composite, rsqrt,
or any op of fp16/bf16 values) is computed in float64 and rounded once to the value's dtype; a
single correctly rounded numpy call on fp32 values is made in fp32.
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from .core import region_slices
from .ops import OPS
from .tensor import TensorGraph, TNode


# numpy names of the float dtypes (names: bf16's numpy dtype comes with ml_dtypes, imported
# only when a kernel uses bf16)
_FLOATS = frozenset(("float32", "float16", "bfloat16", "float64"))


def _as(x, like_dtype):
    return np.asarray(x).astype(like_dtype, copy=False)


def eval_node(n: TNode, args: list, params: dict) -> np.ndarray:
    a = n.attrs
    if n.op == "input":
        return params[a["param"]]
    if n.op == "const":
        return np.asarray(a["value"], dtype=n.dtype.np_dtype)
    row = OPS.get(n.op)
    if row is None or row.ref is None:
        raise UnsupportedError(f"no numpy rule for tensor op '{n.op}'", loc=n.loc)
    floats = [i for i, x in enumerate(args) if np.asarray(x).dtype.name in _FLOATS]
    if n.dtype.is_float and (row.wide or any(args[i].dtype != np.float32 for i in floats)):
        args = [x.astype(np.float64) if i in floats else x for i, x in enumerate(args)]
    with np.errstate(all="ignore"):
        return _as(row.ref(args, a), n.dtype.np_dtype)


def evaluate(g: TensorGraph, arrays: dict[str, np.ndarray], values: dict | None = None) -> dict[str, np.ndarray]:
    """Run the graph on numpy arrays; return the output parameters' new contents (copies).
    `values`, when given, receives every node's value (node id -> array)."""
    params = {k: np.asarray(v) for k, v in arrays.items()}
    outs = {name: params[name].copy() for name in g.output_names}
    vals: dict[int, np.ndarray] = {} if values is None else values
    for n in g.nodes:
        if n.op == "store":
            region = region_slices(n.attrs["offsets"], n.shape, n.attrs.get("steps"))
            outs[n.attrs["param"]][region] = vals[n.inputs[0]]
            continue
        vals[n.id] = eval_node(n, [vals[i] for i in n.inputs], params)
    return outs
