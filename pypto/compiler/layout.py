"""layout: data layouts of the Tensor Graph, and removal of redundant transposes.

1. Transpose chains fold.  A `transpose` node swaps two dims; a chain of them is one
   permutation of its source, which the pass re-emits as the fewest swaps that make it
   (rank - number of cycles): transpose(transpose(x, a, b), a, b) is x itself, any chain on a
   2-D tensor is at most one transpose, swaps (0,1),(1,2),(0,1) of a 3-D tensor are one swap
   (0,2).  A chain that is already minimal is kept as it is.

2. A transpose of the last two dims that feeds a matmul folds into the matmul's `a_trans` /
   `b_trans` flag (flipping it), so the cube reads the untransposed operand; the numbers do
   not change (the tile lowering reads the operand through a transposed GM window either way).

3. Cube operand layout.  Every matmul gets `layout="NZ"`: the cube unit reads its operands
   from L1 / L0A / L0B in the fractal "NZ" layout (16 x 16 blocks, rows of blocks in N order,
   each block row-major in Z order), while tensors in GM are row-major ("ND").  The ND -> NZ
   conversion is done by the GM -> L1 load (TLOAD on MTE2 with its ND2NZ mode, as on Ascend),
   so no conversion node is inserted and no cycles are added; NZ -> ND of the result happens
   in the L0C -> GM store (FIX pipe).  The attribute records the layout for readers of the IR.

NHWC / NCHW: `pypto.conv2d` reads an NCHW tensor channels-last through transposed views and
transposes its result back, so NHWC <-> NCHW conversions are transpose chains; between two
stacked NCHW convolutions they cancel (folded here, or by simplify's transpose-pair rule).

`ctx.options["layout"] = False` turns the pass off.  Dead transposes left behind are removed
by dce.
"""
from __future__ import annotations

from ..ir.tensor import OPS, TensorGraph
from .pipeline import Pass, PassContext
from .tensor_passes import Rewriter

CUBE_LAYOUT = "NZ"


def compose(perm: tuple[int, ...], d0: int, d1: int) -> tuple[int, ...]:
    """The permutation of `swapaxes(transpose(x, perm), d0, d1)` (axis k of the result is axis
    perm'[k] of x)."""
    p = list(perm)
    p[d0], p[d1] = p[d1], p[d0]
    return tuple(p)


def swaps(perm: tuple[int, ...]) -> list[tuple[int, int]]:
    """The fewest (dim0 < dim1) swaps that, applied in order to x, give transpose(x, perm)."""
    cur, out = list(range(len(perm))), []
    for k in range(len(perm)):
        if cur[k] != perm[k]:
            j = cur.index(perm[k], k + 1)
            cur[k], cur[j] = cur[j], cur[k]
            out.append((k, j))
    return out


def transpose_source(g: TensorGraph, i: int) -> tuple[int, tuple[int, ...]]:
    """The value a chain of transposes ending in value i reads, and the permutation it applies:
    axis k of i is axis perm[k] of the source (i itself and the identity when i is no transpose)."""
    n = g.node(i)
    perm = tuple(range(len(n.shape)))
    while n.op == "transpose":
        a, b = n.attrs["dim0"], n.attrs["dim1"]
        perm = tuple(b if d == a else a if d == b else d for d in perm)
        n = g.node(n.inputs[0])
    return n.id, perm


def layout(g: TensorGraph, ctx: PassContext | None = None) -> TensorGraph:
    """Fold transpose chains, fold transposes into matmul flags, mark cube operands NZ."""
    if ctx is not None and not ctx.options.get("layout", True):
        return g
    if not any(n.op in ("transpose", "matmul") for n in g.nodes):
        return g
    rw = Rewriter(g)
    chain: dict[int, tuple[int, tuple[int, ...], int]] = {}   # new id -> (source, permutation, length)
    for n in g.nodes:
        rw.loc = n.loc
        if n.op == "transpose":
            src = rw.map[n.inputs[0]]
            base, perm, length = chain.get(src, (src, tuple(range(len(n.shape))), 0))
            perm = compose(perm, n.attrs["dim0"], n.attrs["dim1"])
            steps = swaps(perm)
            if len(steps) < length + 1:       # shorter from the chain's source: re-emit
                out = base
                for a, b in steps:
                    shape = list(rw.shape(out))
                    shape[a], shape[b] = shape[b], shape[a]
                    out = rw.emit("transpose", [out], shape, n.dtype, {"dim0": a, "dim1": b}, n.loc)
                length = len(steps)
            else:
                out = rw.keep(n)
                length += 1
            rw.map[n.id] = out
            if out != base:
                chain[out] = (base, perm, length)
        elif _sinks(n, rw, chain):
            # the elementwise op reads the matmul result untransposed (and can join it on the
            # cube core); its transposes follow it and may meet the next chain
            base, perm, _ = chain[rw.map[n.inputs[0]]]
            out = src = rw.emit(n.op, [base], rw.shape(base), n.dtype, n.attrs, n.loc)
            steps = swaps(perm)
            for a, b in steps:
                shape = list(rw.shape(out))
                shape[a], shape[b] = shape[b], shape[a]
                out = rw.emit("transpose", [out], shape, n.dtype, {"dim0": a, "dim1": b}, n.loc)
            rw.map[n.id] = out
            chain[out] = (src, perm, len(steps))
        elif n.op == "matmul":
            ins, attrs = [rw.map[i] for i in n.inputs], dict(n.attrs)
            for k, flag in ((0, "a_trans"), (1, "b_trans")):
                src = rw.nodes[ins[k]]
                last = len(src.shape) - 1
                if src.op == "transpose" and (src.attrs["dim0"], src.attrs["dim1"]) == (last - 1, last):
                    ins[k] = src.inputs[0]
                    attrs[flag] = not attrs[flag]
            attrs["layout"] = CUBE_LAYOUT
            rw.map[n.id] = rw.emit("matmul", ins, n.shape, n.dtype, attrs, n.loc)
        else:
            rw.keep(n)
        rw.loc = None
    return rw.graph()


def _sinks(n, rw, chain) -> bool:
    """Whether a transpose chain n reads sinks below it: n is elementwise (not a copy, which
    legalize made to materialise a view for a store) and the chain's source is a cube result —
    a matmul, a sum of matmuls, or an elementwise op over one whose chain sank already.  From
    any other source the op keeps reading the strided view: moving the transposes below it
    would cost a copy at the store."""
    if OPS[n.op].kind not in ("unary", "cast") or n.op == "copy" or rw.map[n.inputs[0]] not in chain:
        return False
    i = chain[rw.map[n.inputs[0]]][0]
    while True:
        src = rw.nodes[i]
        if src.op == "matmul":
            return True
        if src.op == "add":
            return all(rw.nodes[j].op in ("matmul", "add") for j in src.inputs)
        if OPS[src.op].kind not in ("unary", "cast") or src.op == "copy":
            return False
        i = src.inputs[0]


LAYOUT = Pass("layout", "tensor", layout,
              "fold transpose chains and transposes into matmul flags; cube operands in NZ (converted by the load)")
LAYOUT_PASSES = [LAYOUT]
