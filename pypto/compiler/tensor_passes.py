"""Passes of the Tensor level: decomposition of composites, legalisation, simplification,
CSE, DCE (fusion is in fusion.py)."""
from __future__ import annotations

import math

import numpy as np

from ..dtypes import DType
from ..errors import SourceLoc
from ..ir.core import Attrs, broadcast_shapes
from ..ir.gm import GMBuffer, GMRef
from ..ir.ops import Builder
from ..ir.tensor import OPS, TensorGraph, TNode, infer_shape
from .pipeline import Pass, PassContext


class Rewriter(Builder):
    """Builds a new graph from an old one, node by node, renumbering ids densely; as a `Builder`
    (ir/ops.py) it is what registry decompositions write their ops with."""

    def __init__(self, g: TensorGraph):
        self.g = g
        self.nodes: list[TNode] = []
        self.map: dict[int, int] = {}
        self.loc: SourceLoc | None = None
        self.extra: dict = {}

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

    def graph(self) -> TensorGraph:
        return self.g.replace(self.nodes)


def _tile(tile):
    return {"tile": tile} if tile else {}


# attrs that follow an op into the nodes a pass rewrites it to: its `pypto.fuse()` region and,
# for the parts of a registered op (`pypto.register_op`), the op's name
CARRIED = ("fuse", "from")


def carried(n: TNode) -> dict:
    return {k: n.attrs[k] for k in CARRIED if k in n.attrs}


# ---------------------------------------------------------------------------------------
# decompose: composite ops -> primitives (each row's `decompose`, ir/ops.py), in the composite's
# dtype (the autocast pass decides which fp16/bf16 values compute in fp32)

def decompose(g: TensorGraph, ctx: PassContext | None = None) -> TensorGraph:
    rw = Rewriter(g)
    for n in g.nodes:
        row = OPS[n.op]
        if row.kind != "composite":
            rw.keep(n)
            continue
        rw.loc = n.loc
        t = n.attrs.get("tile")
        rw.extra = {**_tile(t), **carried(n)}
        if row.extra.get("registered"):         # a pypto.register_op: its parts name it
            rw.extra["from"] = n.attrs.get("from", n.op)
        out = row.decompose(rw, [rw.map[i] for i in n.inputs], n.attrs)
        out = rw.cast(out, n.dtype)
        if rw.shape(out) != n.shape:            # a reduction without keepdim of a keepdim result
            out = rw.reshape(out, n.shape)
        rw.map[n.id] = out
        rw.loc, rw.extra = None, {}
    return rw.graph()


# ---------------------------------------------------------------------------------------
# legalize: reductions keep their dim (a reshape drops it), a store of a GM view (a kernel
# input, or a reshape/transpose/slice) becomes a copy (fp16/bf16 sums accumulate in fp32: the
# autocast pass sees to that), and a 0-d value (a full reduction of a 1-D tensor without keepdim)
# becomes a [1] tensor: tiles have at least one dim, and [1] broadcasts as () does against any
# tensor of rank 1 or more (constants stay 0-d: they are scalar operands, not tiles)

def _read_elsewhere(g: TensorGraph, w, users) -> bool:
    """Whether another reader of the value a write updates reads elements the write changes
    (`v[1:n-1] = v[0:n-2] + v[2:n]`, or `old = v` read after `v[...] = ...`): written in place,
    that reader could see the new elements (tiles of one group run in any order across cores),
    so the write goes into a copy.  A reader of a disjoint region (`v[0:4] = a; y = v[0:4]; v[4:8]
    = b`) leaves the write in place."""
    from ..ir.gm import GMBuffer, GMRef
    base = g.node(w.inputs[0])
    whole = GMRef.whole(GMBuffer("v", base.shape, base.dtype, "scratch"))
    region = whole.window(w.attrs["offsets"], w.attrs["shape"], w.attrs.get("steps"))
    for u in users[base.id]:
        if u == w.id:
            continue
        r = g.node(u)
        if r.op != "view" or r.inputs[0] != base.id:
            return True
        if whole.window(r.attrs["offsets"], r.attrs["shape"], r.attrs.get("steps")).overlaps(region):
            return True
    return False


def legalize(g: TensorGraph, ctx: PassContext | None = None) -> TensorGraph:
    rw = Rewriter(g)
    users = g.users()
    for n in g.nodes:
        rw.loc = n.loc
        if OPS[n.op].kind == "reduce" and not n.attrs["keepdim"]:
            rw.extra = {**_tile(n.attrs.get("tile")), **carried(n)}     # (Builder.red adds them)
            r = rw.red(n.op, rw.map[n.inputs[0]], n.attrs["dim"])
            rw.extra = {}
            shape = n.shape or (1,)
            rw.map[n.id] = rw.emit("reshape", [r], shape, n.dtype, {"shape": shape})
        elif n.op == "store":
            store_value(rw, n)
        elif OPS[n.op].kind == "write" and (OPS[rw.nodes[rw.map[n.inputs[0]]].op].kind not in ("scratch", "write")
                                            or (n.op != "write" and len(users[n.inputs[0]]) > 1)
                                            or (n.op == "write" and _read_elsewhere(g, n, users))):
            # the first write into a value: into a copy of it (a buffer of its own, so that other
            # readers of the value still see it unwritten); `state` keeps the copy from merging
            base = rw.map[n.inputs[0]]
            c = rw.emit("copy", [base], rw.shape(base), rw.dtype(base), {"state": n.id})
            # (a scatter is a write too: its region given by indices)
            rw.map[n.id] = rw.emit(n.op, [c, *(rw.map[i] for i in n.inputs[1:])], n.shape, n.dtype, n.attrs, n.loc)
        elif n.op == "reshape" and not _gm_layout(rw, rw.map[n.inputs[0]]).is_contiguous():
            # a reshape of a strided view (a transpose, a slice): its elements are copied into
            # a contiguous tensor first (a vector group, costed and shown like any other)
            src = rw.map[n.inputs[0]]
            c = rw.emit("copy", [src], rw.shape(src), rw.dtype(src))
            rw.map[n.id] = rw.emit("reshape", [c], n.shape, n.dtype, n.attrs, n.loc)
        elif n.op not in ("const", "input") and (not n.shape or any(
                len(rw.shape(rw.map[i])) != len(g.node(i).shape) for i in n.inputs)):
            rw.map[n.id] = _promoted(rw, n)
        else:
            rw.keep(n)
        rw.loc = None
    return rw.graph()


def _gm_layout(rw: Rewriter, i: int) -> GMRef:
    """How new value i lies in GM: a window over its source's (layout ops), else a fresh
    contiguous tensor (a kernel input, or a computed value materialised)."""
    n = rw.nodes[i]
    if OPS[n.op].kind != "layout":
        return GMRef.whole(GMBuffer("v", tuple(n.shape) or (1,), n.dtype, "workspace"))
    src = _gm_layout(rw, n.inputs[0])
    if n.op == "view":
        return src.window(n.attrs["offsets"], n.attrs["shape"], n.attrs.get("steps"))
    if n.op == "transpose":
        return src.transpose(n.attrs["dim0"], n.attrs["dim1"])
    out = src.reshape(n.attrs["shape"])
    return out if out is not None else GMRef.whole(GMBuffer("v", tuple(n.shape), n.dtype, "workspace"))


def _promoted(rw: Rewriter, n: TNode) -> int:
    """Node n over inputs of which some 0-d values became [1]: its shape follows again from the
    inputs (a reshape to () reshapes to [1])."""
    ins = [rw.map[i] for i in n.inputs]
    attrs = dict(n.attrs)
    if n.op == "reshape" and not attrs["shape"]:
        attrs["shape"] = (1,)
    shape = infer_shape(n.op, [rw.shape(i) for i in ins], attrs) if ins else n.shape
    if shape is None:   # pragma: no cover - every op of a 0-d value is elementwise or a reshape
        raise NotImplementedError(f"{n.op} of a 0-d value")
    nid = rw.emit(n.op, ins, shape, n.dtype, attrs, n.loc)
    rw.map[n.id] = nid
    return nid


def store_value(rw: Rewriter, n: TNode, tile=None) -> int:
    """Emit store `n` of its (mapped) value; a GM view (a kernel input, or a reshape/transpose/
    slice) is not a computed value, so it is first copied (with tile attr `tile`, if any)."""
    src = rw.map[n.inputs[0]]
    if OPS[rw.nodes[src].op].kind in ("layout", "input", "write", "scratch"):   # in GM, not a tile op
        src = rw.emit("copy", [src], rw.shape(src), rw.dtype(src), _tile(tile))
    rw.map[n.id] = rw.emit("store", [src], n.shape, n.dtype, n.attrs, n.loc)
    return rw.map[n.id]


# ---------------------------------------------------------------------------------------
# simplify: algebraic identities and constant folding

# (narrow, wide): a cast narrow -> wide -> narrow gives back every value (wide -> narrow -> wide
# does not, so fp32 -> fp16 -> fp32 is left alone)
EXACT_WIDENING = {("fp16", "fp32"), ("bf16", "fp32"), ("int8", "int32")}


def _cval(rw: Rewriter, i: int):
    """The value of new node i if it is a const, else None."""
    n = rw.nodes[i]
    return n.attrs["value"] if n.op == "const" else None


def fold(op: str, a, b, dtype: DType):
    """`a op b` computed by numpy in `dtype` (as the reference does), as a Python number; None
    when it should not be folded (an integer division, or a value that does not fit)."""
    if op == "div" and not dtype.is_float:
        return None
    try:
        with np.errstate(all="ignore"):
            r = np.asarray(OPS[op].ref([np.asarray(a, dtype.np_dtype), np.asarray(b, dtype.np_dtype)], {}))
            r = r.astype(dtype.np_dtype)
    except (OverflowError, ValueError, TypeError):
        return None
    return float(r) if dtype.is_float else int(r)


def _simplified(rw: Rewriter, n: TNode, users, origin) -> int | None:
    """The new id that computes old node n more simply, or None to keep n as it is."""
    ins = [rw.map[i] for i in n.inputs]

    def same(i):  # may n be replaced by new value i? (broadcasting must not change the result)
        return rw.shape(i) == n.shape and rw.dtype(i) == n.dtype

    kind = OPS[n.op].kind
    if n.op == "copy" and same(ins[0]) and "state" not in n.attrs and \
            OPS[rw.nodes[ins[0]].op].kind not in ("input", "layout", "const"):
        return ins[0]       # a copy of a computed value is that value (layout may have made one)
    if kind == "binary":
        a, b = ins
        ca, cb = _cval(rw, a), _cval(rw, b)
        if ca is not None and cb is not None:
            v = fold(n.op, ca, cb, n.dtype)
            if v is not None:
                return rw.emit("const", [], n.shape, n.dtype, {"value": v}, n.loc)
        row = OPS[n.op]
        if cb is not None and same(a) and row.identity is not None and cb == row.identity:
            return a
        if ca is not None and same(b) and row.commutative and row.identity is not None and ca == row.identity:
            return b
        if row.reassociates:  # (x * c1) * c2 -> x * (c1 * c2), when nothing else reads x * c1
            for k in (0, 1):
                c2, inner_id = _cval(rw, ins[1 - k]), ins[k]
                inner = rw.nodes[inner_id]
                if (c2 is None or inner.op != n.op or origin.get(inner_id) != n.inputs[k]
                        or len(users[n.inputs[k]]) != 1):
                    continue
                for j in (0, 1):
                    c1, x = _cval(rw, inner.inputs[1 - j]), inner.inputs[j]
                    v = None if c1 is None or not same(x) else fold(n.op, c1, c2, n.dtype)
                    if v is not None:
                        c = rw.emit("const", [], (), n.dtype, {"value": v}, n.loc)
                        return rw.emit(n.op, [x, c], n.shape, n.dtype, n.attrs, n.loc)
        return None
    if not ins:
        return None
    inner = rw.nodes[ins[0]]
    if OPS[n.op].involution and inner.op == n.op:
        return inner.inputs[0]
    if OPS[n.op].idempotent and OPS[n.op].kind == "unary" and inner.op == n.op and n.op != "copy":
        return inner.id
    if n.op == "cast":
        if inner.dtype == n.dtype:
            return inner.id
        if inner.op == "cast" and rw.dtype(inner.inputs[0]) == n.dtype \
                and (n.dtype.name, inner.dtype.name) in EXACT_WIDENING:
            return inner.inputs[0]
    if n.op == "reshape":
        base = inner.inputs[0] if inner.op == "reshape" else inner.id
        if rw.shape(base) == n.shape:
            return base
        if base != inner.id:
            return rw.emit("reshape", [base], n.shape, n.dtype, n.attrs, n.loc)
    if n.op == "transpose" and inner.op == "transpose" and \
            (inner.attrs["dim0"], inner.attrs["dim1"]) == (n.attrs["dim0"], n.attrs["dim1"]):
        return inner.inputs[0]
    return None


def simplify(g: TensorGraph, ctx: PassContext | None = None) -> TensorGraph:
    """Algebraic simplification and constant folding.

    x*1, x/1, x+0, x-0 -> x (only when x already has the result's shape and dtype; x*0 stays,
    it is NaN for inf/NaN x); neg(neg(x)) -> x; a cast to x's own dtype, or a lossless round
    trip (fp16 -> fp32 -> fp16) -> x; const op const -> one const (numpy, in the node's dtype);
    (x*c1)*c2 -> x*(c1*c2) when nothing else reads x*c1; reshape(reshape(x)) -> one reshape
    (none if the shape is x's); transpose(transpose(x)) of the same dims -> x; copy(x) -> x when
    x is a computed value (not an input or a view).  A store whose
    value becomes a kernel input or GM view stores a copy of it (as legalize does).  Replaced
    nodes may leave dead values behind: dce removes them.
    """
    users = g.users()
    rw = Rewriter(g)
    origin: dict[int, int] = {}   # new id -> the old node it computes (when it computes exactly one)
    for n in g.nodes:
        rw.loc = n.loc
        if n.op == "store":
            store_value(rw, n, g.node(n.inputs[0]).attrs.get("tile"))
        else:
            start = len(rw.nodes)
            r = _simplified(rw, n, users, origin)
            if r is None:
                r = rw.keep(n)
            if r >= start:          # a node made for n alone (not an existing value n reduces to)
                origin[r] = n.id
            rw.map[n.id] = r
        rw.loc = None
    return rw.graph()


# ---------------------------------------------------------------------------------------
# cse: one node per distinct computation

def cse(g: TensorGraph, ctx: PassContext | None = None) -> TensorGraph:
    """Common subexpression elimination: nodes with the same op, the same (already merged)
    inputs, equal attrs (a `tile` TileSpec compares without its location), shape and dtype are
    one node, the first; commutative ops (the registry's column) ignore their operand order.  Consts of equal
    value and dtype merge (0.0 and -0.0 do not); inputs and stores never do."""
    rw = Rewriter(g)
    seen: dict = {}
    for n in g.nodes:
        if n.op in ("input", "store") or OPS[n.op].kind == "scratch":     # (two scratch buffers stay two)
            rw.keep(n)
            continue
        ins = tuple(rw.map[i] for i in n.inputs)
        if OPS[n.op].commutative:
            ins = tuple(sorted(ins))
        v = n.attrs.get("value")
        sign = math.copysign(1.0, v) if n.op == "const" and isinstance(v, float) else None
        key = (n.op, ins, n.attrs, n.shape, n.dtype, sign)
        try:
            hit = seen.get(key)
        except TypeError:   # an attr value that cannot be hashed: never merged
            hit = key = None
        if hit is not None:
            rw.map[n.id] = hit
        else:
            nid = rw.keep(n)
            if key is not None:
                seen[key] = nid
    return rw.graph()


# ---------------------------------------------------------------------------------------
# dce: drop values nothing uses

def live_values(g: TensorGraph) -> set[int]:
    """The ids of the nodes some store depends on (the stores included)."""
    live: set[int] = set()
    for n in reversed(g.nodes):
        if n.op == "store" or n.id in live:
            live.add(n.id)
            live.update(n.inputs)
    return live


def dce(g: TensorGraph, ctx: PassContext | None = None) -> TensorGraph:
    live = live_values(g)
    rw = Rewriter(g)
    for n in g.nodes:
        if n.id in live or n.op == "input":
            rw.keep(n)
    return rw.graph()


TENSOR_PASSES = [
    Pass("decompose", "tensor", decompose, "composite ops (softmax, layernorm, rms_norm, gelu, ...) -> primitives"),
    Pass("legalize", "tensor", legalize,
         "reductions keep their dim, stores of GM views become copies"),
    Pass("simplify", "tensor", simplify,
         "algebraic identities (x*1, x+0, neg(neg(x)), reshape of reshape, ...) and constant folding"),
    Pass("cse", "tensor", cse, "merge nodes that compute the same value (common subexpressions)"),
    Pass("dce", "tensor", dce, "remove values no output depends on"),
]
