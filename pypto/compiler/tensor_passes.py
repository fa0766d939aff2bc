"""Passes of the Tensor level: decomposition of composites, legalisation, DCE, fusion."""
from __future__ import annotations

from ..dtypes import DT_FP32, DType
from ..errors import SourceLoc
from ..ir.core import Attrs, broadcast_shapes
from ..ir.tensor import OPS, TensorGraph, TNode
from ..ir.tensor_eval import GELU_C
from .pipeline import Pass, PassContext


class Rewriter:
    """Builds a new graph from an old one, node by node, renumbering ids densely."""

    def __init__(self, g: TensorGraph):
        self.g = g
        self.nodes: list[TNode] = []
        self.map: dict[int, int] = {}
        self.loc: SourceLoc | None = None

    def emit(self, op: str, inputs, shape, dtype: DType, attrs=None, loc=None) -> int:
        nid = len(self.nodes)
        self.nodes.append(TNode(nid, op, tuple(inputs), tuple(shape), dtype, Attrs(attrs or {}),
                                loc or self.loc))
        return nid

    def keep(self, n: TNode) -> int:
        nid = self.emit(n.op, [self.map[i] for i in n.inputs], n.shape, n.dtype, n.attrs, n.loc)
        self.map[n.id] = nid
        return nid

    def shape(self, i: int):
        return self.nodes[i].shape

    def dtype(self, i: int) -> DType:
        return self.nodes[i].dtype

    # small builders used by decompositions: each takes and returns new ids
    def const(self, v, dtype):
        return self.emit("const", [], (), dtype, {"value": float(v)})

    def bin(self, op, a, b, tile=None):
        return self.emit(op, [a, b], broadcast_shapes(self.shape(a), self.shape(b)), self.dtype(a),
                         _tile(tile))

    def bins(self, op, a, scalar, tile=None):
        return self.bin(op, a, self.const(scalar, self.dtype(a)), tile)

    def un(self, op, a, tile=None):
        return self.emit(op, [a], self.shape(a), self.dtype(a), _tile(tile))

    def red(self, op, a, dim, tile=None):
        s = list(self.shape(a))
        s[dim] = 1
        return self.emit(op, [a], s, self.dtype(a), {"dim": dim, "keepdim": True, **_tile(tile)})

    def cast(self, a, dtype: DType, tile=None):
        if self.dtype(a) == dtype:
            return a
        return self.emit("cast", [a], self.shape(a), dtype, {"to": dtype.name, **_tile(tile)})

    def graph(self) -> TensorGraph:
        return self.g.replace(self.nodes)


def _tile(tile):
    return {"tile": tile} if tile else {}


# ---------------------------------------------------------------------------------------
# decompose: composite ops -> primitives (fp16/bf16 composites compute in fp32)

def _sigmoid(rw, x, t):
    e = rw.un("exp", rw.un("neg", x, t), t)
    return rw.un("recip", rw.bins("add", e, 1.0, t), t)


def _tanh(rw, x, t):
    s = _sigmoid(rw, rw.bins("mul", x, 2.0, t), t)
    return rw.bins("sub", rw.bins("mul", s, 2.0, t), 1.0, t)


def _gelu(rw, x, t):
    x3 = rw.bin("mul", rw.bin("mul", x, x, t), x, t)
    inner = rw.bins("mul", rw.bin("add", x, rw.bins("mul", x3, 0.044715, t), t), GELU_C, t)
    u = rw.bins("add", _tanh(rw, inner, t), 1.0, t)
    return rw.bins("mul", rw.bin("mul", x, u, t), 0.5, t)


def _mean(rw, x, dim, t):
    n = rw.shape(x)[dim]
    return rw.bins("mul", rw.red("sum", x, dim, t), 1.0 / n, t)


def _softmax(rw, x, dim, t):
    m = rw.red("amax", x, dim, t)
    e = rw.un("exp", rw.bin("sub", x, m, t), t)
    return rw.bin("div", e, rw.red("sum", e, dim, t), t)


def _rms_norm(rw, x, w, eps, t):
    last = len(rw.shape(x)) - 1
    ms = _mean(rw, rw.bin("mul", x, x, t), last, t)
    r = rw.un("rsqrt", rw.bins("add", ms, eps, t), t)
    return rw.bin("mul", rw.bin("mul", x, r, t), w, t)


# composites whose fp16/bf16 forms compute in fp32 (they accumulate, or subtract close values)
FP32_COMPOSITES = ("softmax", "rms_norm", "layernorm", "mean")


def decompose(g: TensorGraph, ctx: PassContext | None = None) -> TensorGraph:
    rw = Rewriter(g)
    for n in g.nodes:
        if OPS[n.op].kind != "composite":
            rw.keep(n)
            continue
        rw.loc = n.loc
        t = n.attrs.get("tile")
        ins = [rw.map[i] for i in n.inputs]
        work = DT_FP32 if n.dtype.name in ("fp16", "bf16") and n.op in FP32_COMPOSITES else n.dtype
        ins = [rw.cast(i, work, t) for i in ins]
        x = ins[0]
        if n.op == "mean":
            out = _mean(rw, x, n.attrs["dim"], t)
        elif n.op == "sigmoid":
            out = _sigmoid(rw, x, t)
        elif n.op == "tanh":
            out = _tanh(rw, x, t)
        elif n.op == "gelu":
            out = _gelu(rw, x, t)
        elif n.op == "softmax":
            out = _softmax(rw, x, n.attrs["dim"], t)
        elif n.op == "rms_norm":
            out = _rms_norm(rw, x, ins[1], n.attrs["eps"], t)
        elif n.op == "layernorm":
            last = len(rw.shape(x)) - 1
            d = rw.bin("sub", x, _mean(rw, x, last, t), t)
            var = _mean(rw, rw.bin("mul", d, d, t), last, t)
            out = rw.bin("mul", d, rw.un("rsqrt", rw.bins("add", var, n.attrs["eps"], t), t), t)
            rest = ins[1:]
            if n.attrs["has_weight"]:
                out = rw.bin("mul", out, rest.pop(0), t)
            if n.attrs["has_bias"]:
                out = rw.bin("add", out, rest.pop(0), t)
        else:  # pragma: no cover - every composite of OPS is handled above
            raise NotImplementedError(n.op)
        out = rw.cast(out, n.dtype, t)
        if n.op == "mean" and not n.attrs["keepdim"]:
            out = rw.emit("reshape", [out], n.shape, n.dtype, {"shape": n.shape})
        rw.map[n.id] = out
        rw.loc = None
    return rw.graph()


# ---------------------------------------------------------------------------------------
# legalize: reductions keep their dim (a reshape drops it), fp16/bf16 sums accumulate in fp32,
# and a store of a GM view (a kernel input, or a reshape/transpose/slice) becomes a copy

def legalize(g: TensorGraph, ctx: PassContext | None = None) -> TensorGraph:
    rw = Rewriter(g)
    for n in g.nodes:
        rw.loc = n.loc
        if OPS[n.op].kind == "reduce" and (not n.attrs["keepdim"] or _needs_fp32_sum(n)):
            x, t = rw.map[n.inputs[0]], n.attrs.get("tile")
            if _needs_fp32_sum(n):
                r = rw.cast(rw.red("sum", rw.cast(x, DT_FP32, t), n.attrs["dim"], t), n.dtype, t)
            else:
                r = rw.red(n.op, x, n.attrs["dim"], t)
            if not n.attrs["keepdim"]:
                r = rw.emit("reshape", [r], n.shape, n.dtype, {"shape": n.shape})
            rw.map[n.id] = r
        elif n.op == "store" and OPS[rw.nodes[rw.map[n.inputs[0]]].op].kind in ("layout", "input"):
            src = rw.map[n.inputs[0]]
            c = rw.emit("copy", [src], rw.shape(src), rw.dtype(src))
            rw.map[n.id] = rw.emit("store", [c], n.shape, n.dtype, n.attrs)
        else:
            rw.keep(n)
        rw.loc = None
    return rw.graph()


def _needs_fp32_sum(n) -> bool:
    """A sum of fp16/bf16 values loses precision when it accumulates in its own dtype."""
    return n.op == "sum" and n.dtype.name in ("fp16", "bf16")


# ---------------------------------------------------------------------------------------
# dce: drop values nothing uses

def dce(g: TensorGraph, ctx: PassContext | None = None) -> TensorGraph:
    live: set[int] = set()
    for n in reversed(g.nodes):
        if n.op == "store" or n.id in live:
            live.add(n.id)
            live.update(n.inputs)
    rw = Rewriter(g)
    for n in g.nodes:
        if n.id in live or n.op == "input":
            rw.keep(n)
    return rw.graph()


TENSOR_PASSES = [
    Pass("decompose", "tensor", decompose, "composite ops (softmax, layernorm, rms_norm, gelu, ...) -> primitives"),
    Pass("legalize", "tensor", legalize,
         "reductions keep their dim, fp16/bf16 sums accumulate in fp32, stores of GM views become copies"),
    Pass("dce", "tensor", dce, "remove values no output depends on"),
]
