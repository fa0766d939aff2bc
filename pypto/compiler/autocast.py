"""auto-cast: fp16/bf16 vector math computed in fp32 where precision needs it.

The one place of the compiler's precision policy.  Earlier passes (decompose, legalize) build
every op in the dtype the kernel asked for; this pass then chooses, op by op, which fp16/bf16
values are computed in fp32, and inserts the `cast` nodes at the borders of those fp32 regions:
a value enters a region through one cast up (fp16 -> fp32, exact) and leaves it through one
cast down (fp32 -> fp16, the only rounding), each shared by every reader.  Inside a region
values flow in fp32, so the pass never makes a cast pair (fp32 -> fp16 -> fp32 or
fp16 -> fp32 -> fp16 back to back).

Rule table (only vector ops whose result and tensor operands are all fp16, or all bf16, are
candidates; the rules are applied in this order):

| rule            | ops                                   | computed in fp32 when                              |
|-----------------|---------------------------------------|----------------------------------------------------|
| 1 accumulate    | sum (mean, var decompose into         | always: an fp16 accumulator loses log2(n) bits     |
|                 | sum * 1/n)                            | and overflows at 65504                             |
| 2 feeds an      | inexact: add sub mul div exp log      | its value reaches a sum, exp or log (ops that      |
|   amplifier     | sqrt rsqrt recip; exact ops (below)   | magnify their operand's rounding: a sum by n, exp  |
|                 | only when they pass on the rounding   | by abs(arg), log by 1/abs(log arg)), through ops   |
|                 | of a computed operand                 | of this row: x*x of rms_norm must not overflow, x -|
|                 |                                       | mean of layernorm must not cancel, x - max of      |
|                 |                                       | softmax and gelu's inner polynomial must not round |
|                 |                                       | before their exp                                   |
| 3 reads fp32    | every candidate                       | one of its operands is computed in fp32: a value   |
|                 |                                       | keeps its precision until it is stored (e / sum,   |
|                 |                                       | x * rsqrt(var + eps), * weight + bias)             |
| 4 exact on fp32 | maximum minimum relu neg abs copy     | its operands are cast up anyway (an fp32 op reads  |
|   copies        | amax amin                             | them) and an fp32 op reads its result: the amax    |
|                 |                                       | of softmax reads x32 instead of a second group     |
| 5 fine in fp16  | everything else: exact ops, and       | never: exact ops lose nothing; the others round    |
|                 | inexact ops that neither feed an      | once, as the numpy reference does op by op         |
|                 | amplifier nor read an fp32 value      | (relu(x * w + 1), sigmoid of an input, max)        |
| 6 declared dtype| cast, matmul, reshape, transpose,     | never: they read the value in its declared dtype   |
|                 | view, store                           | (the cube accumulates in fp32 anyway)              |

So a softmax (written with `pypto.softmax` or by hand) casts x up once and computes amax,
x - max, exp, sum and the division in fp32, then rounds its result once; layernorm and rms_norm
compute in fp32 from their input to their last scale and shift; gelu and tanh (exp of a
computed argument) compute in fp32, sigmoid of an input and plain fp16 elementwise chains stay
in fp16.  Constants read by an fp32 op become fp32 constants of the same value (the constant's
value in its declared dtype: an fp16 0.1 stays 0.0999755859375).  A cast up
sits right after the value it widens (after the kernel inputs for an input) with the tile
attribute of the ops that read it (one cast per value and tile); a cast down sits right after
the op that computed the value, with its tile attribute.

`ctx.options["autocast"] = False` turns the pass off: every op then computes in its declared
dtype (an fp16 sum accumulates in fp16), which shows what the pass buys.  Graphs without
fp16/bf16 arithmetic are returned unchanged (the same object).
"""
from __future__ import annotations

import numpy as np

from ..dtypes import DT_FP32
from ..ir.tensor import OPS, TensorGraph, TNode
from .pipeline import Pass, PassContext
from .tensor_passes import Rewriter

LOW_PRECISION = ("fp16", "bf16")
# the rule table's op lists, read from the registry's `precision` and `amplifies` columns
ACCUMULATE = tuple(op for op, r in OPS.items() if r.precision == "accumulate")
AMPLIFY = tuple(op for op, r in OPS.items() if r.amplifies and r.kind != "composite")
INEXACT = tuple(op for op, r in OPS.items() if r.precision == "inexact" and r.kind != "composite")
EXACT = tuple(op for op, r in OPS.items() if r.precision == "exact" and r.kind not in ("composite", "layout"))
DECLARED = tuple(op for op, r in OPS.items() if r.precision == "declared" and r.kind not in ("input", "const")) + \
    tuple(op for op, r in OPS.items() if r.kind == "layout")

# op -> the rule that applies to it in fp16/bf16 (the table above, as data)
RULES: dict[str, str] = {
    **{op: "fp32 when it feeds a sum, exp or log, or reads an fp32 value" for op in INEXACT},
    **{op: "fp16/bf16 unless it reads an fp32 value, or its operands are cast up anyway (exact)"
       for op in EXACT},
    **{op: "fp32 always (accumulator)" for op in ACCUMULATE},
    **{op: "declared dtype (its operand is cast back)" for op in DECLARED},
}


def _candidate(g: TensorGraph, n: TNode) -> bool:
    """May n be computed in fp32? A vector op in fp16/bf16 whose tensor operands share its dtype."""
    if n.dtype.name not in LOW_PRECISION or OPS[n.op].kind not in ("unary", "binary", "reduce"):
        return False
    return all(g.node(i).dtype == n.dtype for i in n.inputs if g.node(i).op != "const")


def _carries_rounding(g: TensorGraph, n: TNode, cand: set[int]) -> bool:
    """Does n's value carry low-precision rounding: it rounds (an inexact op), or passes on the
    rounding of a computed operand (an exact op of one)?"""
    return n.op in INEXACT or (n.op in EXACT and any(i in cand for i in n.inputs))


def plan(g: TensorGraph) -> set[int]:
    """The ids of the nodes of `g` that the rule table computes in fp32."""
    cand = {n.id for n in g.nodes if _candidate(g, n)}
    users = g.users()
    wide = {n.id for n in g.nodes if n.id in cand and n.op in ACCUMULATE}
    stack = [n.id for n in g.nodes if n.id in cand and n.op in AMPLIFY]
    while stack:                                   # feeds a sum, exp or log: back through the chain
        for i in g.node(stack.pop()).inputs:
            if i in cand and i not in wide and _carries_rounding(g, g.node(i), cand):
                wide.add(i)
                stack.append(i)
    changed = True
    while changed:                                 # reads fp32 / exact on fp32 copies: to a fixpoint
        changed = False
        needed = {i for w in wide for i in g.node(w).inputs}     # values some fp32 op reads
        for n in g.nodes:
            if n.id not in cand or n.id in wide:
                continue
            ins = [i for i in n.inputs if g.node(i).op != "const"]
            if any(i in wide for i in ins) or (
                    n.op in EXACT and ins and all(i in needed for i in ins)
                    and any(u in wide for u in users[n.id])):
                wide.add(n.id)
                needed.update(ins)
                changed = True
    return wide


def autocast(g: TensorGraph, ctx: PassContext | None = None) -> TensorGraph:
    """Compute fp16/bf16 ops in fp32 where the rule table says precision needs it."""
    if ctx is not None and not ctx.options.get("autocast", True):
        return g
    wide = plan(g)
    if not wide:
        return g
    users = g.users()
    ups: dict[int, list] = {}    # old id of a value fp32 ops read in fp16 -> [(tile, reader)], one per tile
    for n in g.nodes:
        if n.id in wide:
            for i in n.inputs:
                if i not in wide and g.node(i).op != "const":
                    tiles = ups.setdefault(i, [])
                    if all(t != n.attrs.get("tile") for t, _ in tiles):
                        tiles.append((n.attrs.get("tile"), n))
    rw = Rewriter(g)
    up: dict = {}      # (old id, tile) -> new id of its fp32 value (a cast up, or an fp32 const)
    down: dict = {}    # old id of a wide node -> new id of its cast down
    pending: list[int] = []   # kernel inputs whose casts up wait for the first computed node

    def cast_up(i: int) -> None:
        """Cast value i up once per tile of its fp32 readers, right where it is defined."""
        for t, reader in ups.get(i, ()):
            up[(i, t)] = rw.emit("cast", [rw.map[i]], g.node(i).shape, DT_FP32,
                                 {"to": DT_FP32.name, **({"tile": t} if t else {})}, reader.loc)

    def fp32_of(i: int, reader: TNode) -> int:
        if i in wide:
            return rw.map[i]
        n = g.node(i)
        if n.op == "const":
            if (i, None) not in up:
                # the constant's value in its own dtype (an fp16 0.1 is 0.0999755859375), exactly
                # in fp32: widening the op must not change what it computes with
                value = float(np.asarray(n.attrs["value"], n.dtype.np_dtype).astype(np.float64))
                up[(i, None)] = rw.emit("const", [], n.shape, DT_FP32, n.attrs.replace(value=value), n.loc)
            return up[(i, None)]
        return up[(i, reader.attrs.get("tile"))]

    for n in g.nodes:
        if n.op == "input":
            rw.map[n.id] = rw.keep(n)
            pending.append(n.id)
            continue
        for i in pending:
            cast_up(i)
        pending = []
        if n.id in wide:
            ins = [fp32_of(i, n) for i in n.inputs]
            rw.map[n.id] = rw.emit(n.op, ins, n.shape, DT_FP32, n.attrs, n.loc)
            if any(u not in wide for u in users[n.id]):   # read in its declared dtype: round once, here
                t = n.attrs.get("tile")
                down[n.id] = rw.emit("cast", [rw.map[n.id]], n.shape, n.dtype,
                                     {"to": n.dtype.name, **({"tile": t} if t else {})}, n.loc)
        elif n.op == "matmul" and n.id in ups and all(u in wide for u in users[n.id]):
            # only fp32 ops read it: the cube's fp32 accumulator is stored as it is (no rounding
            # to fp16 and back), and a bias add can then join the cube (fusion.py)
            rw.map[n.id] = rw.emit(n.op, [rw.map[i] for i in n.inputs], n.shape, DT_FP32,
                                   {**n.attrs, "out_dtype": DT_FP32.name}, n.loc)
            for t, _ in ups[n.id]:
                up[(n.id, t)] = rw.map[n.id]
        else:
            rw.map[n.id] = rw.emit(n.op, [down.get(i, rw.map[i]) for i in n.inputs], n.shape, n.dtype,
                                   n.attrs, n.loc)
            cast_up(n.id)
    return rw.graph()


AUTOCAST = Pass("autocast", "tensor", autocast,
                "fp16/bf16 sums, exp/log of computed values, their operand chains and readers compute in fp32")
AUTOCAST_PASSES = [AUTOCAST]
