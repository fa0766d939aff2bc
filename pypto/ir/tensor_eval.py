"""The executable spec of the Tensor level: evaluate a Tensor Graph with numpy, op by op.

This is the independent reference the simulator's tile-level results are checked against, and
the engine of eager (debug) execution.  Composite ops are evaluated directly here, not through
the compiler's decomposition, so that the two paths stay independent.
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from .tensor import TensorGraph, TNode

GELU_C = 0.7978845608028654  # sqrt(2 / pi)


def _as(x, like_dtype):
    return np.asarray(x).astype(like_dtype, copy=False)


UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: np.reciprocal(np.sqrt(x)), "recip": np.reciprocal,
    "abs": np.abs, "neg": np.negative, "relu": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    "copy": np.copy,
    "sigmoid": lambda x: np.reciprocal(np.exp(-x) + np.ones((), x.dtype)),
    "tanh": np.tanh,
    # 0.5 x (1 + tanh(z)) = x sigmoid(2z): the same function, without cancellation for z << 0
    "gelu": lambda x: x / (1.0 + np.exp(-2.0 * GELU_C * (x + 0.044715 * x * x * x))),
}
COMPOSED = ("rsqrt", "sigmoid", "tanh", "gelu")     # several numpy calls: float64, then rounded
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
          "maximum": np.maximum, "minimum": np.minimum}
REDUCE = {"sum": np.sum, "amax": np.max, "amin": np.min}


def acc_dtype(dtype):
    """The reference accumulates float sums in higher precision than the kernel's dtype."""
    if dtype == np.float32:
        return np.float64
    if np.issubdtype(dtype, np.integer):
        return None
    return np.float32


def eval_node(n: TNode, args: list, params: dict) -> np.ndarray:
    a = n.attrs
    if n.op == "input":
        return params[a["param"]]
    if n.op == "const":
        return np.asarray(a["value"], dtype=n.dtype.np_dtype)
    if n.op in UNARY:               # floats: computed in float64, rounded once (rsqrt, gelu, ...)
        x = args[0]                 # (fp32 ops of one numpy call: in fp32, within an ulp)
        wide = n.dtype.is_float and (n.op in COMPOSED or x.dtype != np.float32)
        return _as(UNARY[n.op](x.astype(np.float64) if wide else x), n.dtype.np_dtype)
    if n.op in BINARY:
        return _as(BINARY[n.op](args[0], args[1]), n.dtype.np_dtype)
    if n.op == "sum":
        return _as(np.sum(args[0], axis=a["dim"], keepdims=a["keepdim"], dtype=acc_dtype(args[0].dtype)),
                   n.dtype.np_dtype)
    if n.op in REDUCE:
        return _as(REDUCE[n.op](args[0], axis=a["dim"], keepdims=a["keepdim"]), n.dtype.np_dtype)
    if n.op == "mean":
        return _as(np.mean(args[0], axis=a["dim"], keepdims=a["keepdim"], dtype=np.float64), n.dtype.np_dtype)
    if n.op == "softmax":
        x = args[0].astype(np.float64)
        e = np.exp(x - x.max(axis=a["dim"], keepdims=True))
        return _as(e / e.sum(axis=a["dim"], keepdims=True), n.dtype.np_dtype)
    if n.op == "rms_norm":
        x = args[0].astype(np.float64)
        r = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + a["eps"])
        return _as(r * args[1].astype(np.float64), n.dtype.np_dtype)
    if n.op == "layernorm":
        x = args[0].astype(np.float64)
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        r = (x - mu) / np.sqrt(var + a["eps"])
        rest = list(args[1:])
        if a["has_weight"]:
            r = r * rest.pop(0).astype(np.float64)
        if a["has_bias"]:
            r = r + rest.pop(0).astype(np.float64)
        return _as(r, n.dtype.np_dtype)
    if n.op == "matmul":
        x, y = args
        if a["a_trans"]:
            x = np.swapaxes(x, -1, -2)
        if a["b_trans"]:
            y = np.swapaxes(y, -1, -2)
        acc = np.int32 if x.dtype == np.int8 else np.float64
        return _as(np.matmul(x.astype(acc), y.astype(acc)), n.dtype.np_dtype)
    if n.op == "cast":
        return _as(args[0], n.dtype.np_dtype)
    if n.op == "reshape":
        return np.reshape(args[0], a["shape"])
    if n.op == "transpose":
        return np.swapaxes(args[0], a["dim0"], a["dim1"])
    if n.op == "view":
        return args[0][tuple(slice(o, o + s) for o, s in zip(a["offsets"], a["shape"]))]
    raise UnsupportedError(f"no numpy rule for tensor op '{n.op}'", loc=n.loc)


def evaluate(g: TensorGraph, arrays: dict[str, np.ndarray], values: dict | None = None) -> dict[str, np.ndarray]:
    """Run the graph on numpy arrays; return the output parameters' new contents (copies).
    `values`, when given, receives every node's value (node id -> array)."""
    params = {k: np.asarray(v) for k, v in arrays.items()}
    outs = {name: params[name].copy() for name in g.output_names}
    vals: dict[int, np.ndarray] = {} if values is None else values
    for n in g.nodes:
        if n.op == "store":
            region = tuple(slice(o, o + s) for o, s in zip(n.attrs["offsets"], n.shape))
            outs[n.attrs["param"]][region] = vals[n.inputs[0]]
            continue
        vals[n.id] = eval_node(n, [vals[i] for i in n.inputs], params)
    return outs
