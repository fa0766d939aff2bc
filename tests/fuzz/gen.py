"""Random pypto kernels: a small DAG IR, its Python source text, and its input data.

Every decision goes through a `Chooser` (`int(lo, hi)`, shrinking towards `lo`), so the same
generator runs on `random.Random` (campaigns, explicit seeds) and on hypothesis' `data.draw`
(shrinking: option 0 of every choice is the simplest one).

The generator keeps a model of each value: shape, dtype (as pypto documents its promotion;
`/` of integers gives fp32 like torch) and an interval of its finite values, which keeps ops
inside their domain most of the time (log of positive values, no fp16 overflow, no int8 wrap).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from .gen_index import IndexSteps
from .gen_more import MoreSteps
from .gen_ops import FLOATS, INTS, PY_DT, OpSteps
NP = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16),
      "int8": np.dtype(np.int8), "int32": np.dtype(np.int32)}
MAXV = {"fp32": 3.0e38, "fp16": 6.0e4, "bf16": 3.0e38, "int8": 127, "int32": 2**31 - 1}
SAFE = {"fp32": 1e30, "fp16": 3e4, "bf16": 1e30, "int8": 100, "int32": 2**30}   # generator keeps below
DIMS = (1, 3, 17, 100, 257, 1000, 8, 16, 32, 64, 128, 256, 2, 5, 48)
MAX_ELEMS = 1 << 18          # per value; a whole kernel stays well under 16 MiB


# ---------------------------------------------------------------------------------------
# choices

class Chooser:
    def int(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def pick(self, seq):
        seq = list(seq)
        return seq[self.int(0, len(seq) - 1)]

    def chance(self, p: float) -> bool:
        """True with probability p; shrinks towards False."""
        return self.int(0, 999) >= round(1000 * (1 - p))

    def weighted(self, pairs):
        """pairs: [(weight, value)], the first the simplest."""
        total = sum(w for w, _ in pairs)
        k = self.int(0, total - 1)
        for w, v in pairs:
            if k < w:
                return v
            k -= w
        return pairs[-1][1]


class RandomChooser(Chooser):
    def __init__(self, seed):
        self.rng = random.Random(seed)

    def int(self, lo, hi):
        return self.rng.randint(lo, hi)


class DataChooser(Chooser):
    """hypothesis: `st.data()` draws."""

    def __init__(self, data):
        from hypothesis import strategies as st
        self.data, self.st = data, st

    def int(self, lo, hi):
        return self.data.draw(self.st.integers(lo, hi)) if hi > lo else lo


# ---------------------------------------------------------------------------------------
# the IR of a case

@dataclass
class Node:
    id: int
    op: str                    # input | bin | un | red | softmax | rms_norm | layernorm | matmul | cast
                               # | transpose | reshape | view
    args: list                 # node ids, or ("c", number) for a Python number operand
    attrs: dict
    shape: tuple
    dtype: str
    lo: float = -1.0           # interval of the finite values (special values injected aside)
    hi: float = 1.0
    text: str = ""             # the source expression

    @property
    def name(self):
        return self.attrs.get("param") or self.attrs.get("alias") or f"v{self.id}"

    @property
    def size(self):
        return math.prod(self.shape)


@dataclass
class InputSpec:
    name: str
    shape: tuple
    dtype: str
    lo: float
    hi: float
    specials: int = 0          # how many NaN / inf / -inf / 0 values are injected


@dataclass
class Store:
    out: str                   # output parameter name
    node: int                  # the stored value
    kind: str                  # full | ellipsis | assemble | offset | split | index
    out_shape: tuple
    dtype: str
    offsets: tuple = ()
    index: int = 0             # for kind 'index': out[index] = value; 'split': split point
    lines: list = field(default_factory=list)


@dataclass
class Case:
    machine: str
    inputs: list               # [InputSpec]
    nodes: list                # [Node], inputs first
    lines: list                # kernel body lines (without indentation)
    stores: list               # [Store]
    data_seed: int
    expect_error: str = ""     # a construct that must end in a located PyptoError
    label: str = ""

    @property
    def params(self):
        return [i.name for i in self.inputs] + [s.out for s in self.stores]

    def source(self) -> str:
        body = "\n".join("    " + ln for ln in self.lines) or "    pass"
        return ("import math\n\nimport numpy as np\nimport pypto\n\n\n@pypto.jit\n"
                f"def fuzz_kernel({', '.join(self.params)}):\n{body}\n")

    def nbytes(self) -> int:
        b = sum(math.prod(i.shape) * NP[i.dtype].itemsize for i in self.inputs)
        return b + sum(math.prod(s.out_shape) * NP[s.dtype].itemsize for s in self.stores)

    def describe(self) -> str:
        parts = [f"{i.name}: {i.dtype}{list(i.shape)} in [{i.lo:g}, {i.hi:g}]"
                 + (f" + {i.specials} NaN/inf/0" if i.specials else "") for i in self.inputs]
        parts += [f"{s.out}: {s.dtype}{list(s.out_shape)}" for s in self.stores]
        return f"machine {self.machine}, data seed {self.data_seed}; " + ", ".join(parts)

    def arrays(self):
        """Inputs then outputs (outputs start with random contents: a region the kernel does
        not write must keep them)."""
        rng = np.random.default_rng(self.data_seed)
        arrs = [make_data(rng, i.shape, i.dtype, i.lo, i.hi, i.specials) for i in self.inputs]
        arrs += [make_data(rng, s.out_shape, s.dtype, -3, 3, 0) for s in self.stores]
        return arrs

    def repro(self, dynamic: dict | None = None) -> str:
        """A self-contained script: the kernel, its inputs, the compile and simulate calls.
        `dynamic` ({"params", "rows", "sizes"}, the runner's dynamic stage): then also the compile
        with pypto.DYNAMIC first dims for those parameters and, per size N, the simulation on the
        arrays' rows taken to N rows (rows 0..R-1, then rows drawn at random, as the runner's
        `worker.row_map`), the program of the call run on its own, and how far the outputs are
        from the static kernel's rows taken the same way."""
        args = ", ".join(self.params)
        mk = []
        for i in self.inputs:
            mk.append(f"{i.name} = make_data(rng, {tuple(i.shape)}, {i.dtype!r}, {i.lo!r}, {i.hi!r}, {i.specials})")
        for s in self.stores:
            mk.append(f"{s.out} = make_data(rng, {tuple(s.out_shape)}, {s.dtype!r}, -3, 3, 0)")
        text = (self.source() + "\n\n" + DATA_SRC + "\n\nif __name__ == '__main__':\n"
                f"    rng = np.random.default_rng({self.data_seed})\n"
                + "".join(f"    {m}\n" for m in mk)
                + f"    ck = fuzz_kernel.compile({args}, machine={self.machine!r})\n"
                + f"    res = ck.simulate({args})\n"
                + "    print(res.cycles, res.ok, {k: v.ravel()[:8] for k, v in res.outputs.items()})\n")
        if dynamic:
            text += self._dynamic_repro(dynamic)
        return text

    def _dynamic_repro(self, dynamic: dict) -> str:
        dyn = list(dynamic["params"])
        shapes = {i.name: (tuple(i.shape), i.dtype) for i in self.inputs}
        shapes.update({s.out: (tuple(s.out_shape), s.dtype) for s in self.stores})
        specs = []
        for p in self.params:
            shape, dt = shapes[p]
            specs.append(f"pypto.Tensor([pypto.DYNAMIC{''.join(f', {d}' for d in shape[1:])}], {PY_DT[dt]})"
                         if p in dyn else p)
        rows = dynamic["rows"]
        lines = [
            f"# the dynamic stage: pypto.DYNAMIC first dims for {', '.join(dyn)}; row i of a call on N rows is",
            f"# row idx[i] of the case: rows 0..{rows - 1}, then rows drawn at random",
            "from pypto.sim.run import simulate as run_program",
            "static = {k: np.asarray(v) for k, v in res.outputs.items()}",
            f"ckd = fuzz_kernel.compile({', '.join(specs)}, machine={self.machine!r})",
            f"dyn = {dyn!r}",
        ]
        if dynamic.get("sizes"):
            lines += [
                f"for n in {list(dynamic['sizes'])!r}:",
                f"    idx = np.random.default_rng([{dynamic['seed']}, n]).integers(0, {rows}, n)",
                f"    idx[:min(n, {rows})] = np.arange(min(n, {rows}))",
                f"    args = [{', '.join(f'{p}[idx]' if p in dyn else f'{p}.copy()' for p in self.params)}]",
                "    r = ckd.simulate(*args)",
                "    alone = run_program(ckd.program_for(n), ckd._padded(ckd.bind(args), n), machine=ckd.machine,",
                "                        mode='functional').outputs",
                "    for k, v in r.outputs.items():",
                "        v = np.asarray(v)",
                "        a = np.asarray(alone[k])[:n] if k in dyn else np.asarray(alone[k])",
                "        want = static[k][idx] if k in dyn else static[k]",
                "        with np.errstate(all='ignore'):",
                "            d = np.abs(v.astype(np.float64) - want.astype(np.float64))",
                "            far = np.nanmax(d) if v.size else 0.0",
                "        same = np.array_equal(a, v, equal_nan=True)",
                "        print(f'N={n} {k}: res.ok {r.ok}, program alone identical {same}, '",
                "              f'max |dynamic - static[idx]| {far:.3g}; first values {v.ravel()[:8]}')",
            ]
        return "".join(f"    {ln}\n" for ln in lines)


# The data generator is source text so that a printed reproducer carries it verbatim.
DATA_SRC = '''\
def make_data(rng, shape, dtype, lo, hi, specials):
    import ml_dtypes
    npdt = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16,
            "int8": np.int8, "int32": np.int32}[dtype]
    if dtype in ("int8", "int32"):
        return rng.integers(int(lo), int(hi) + 1, size=shape).astype(npdt)
    a = rng.uniform(lo, hi, size=shape)
    flat = a.reshape(-1)
    for k in range(specials):
        flat[rng.integers(0, flat.size)] = (np.nan, np.inf, -np.inf, 0.0, -0.0)[k % 5]
    return a.astype(npdt)'''
_ns: dict = {"np": np}
exec(DATA_SRC, _ns)
make_data = _ns["make_data"]


# ---------------------------------------------------------------------------------------
# shapes

def broadcast(a: tuple, b: tuple):
    r = max(len(a), len(b))
    a, b = (1,) * (r - len(a)) + tuple(a), (1,) * (r - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            return None
        out.append(max(x, y))
    return tuple(out)


def _shape_text(s) -> str:
    return "[" + ", ".join(str(d) for d in s) + "]"


def _num(v) -> str:
    return repr(v)


UNARY_FLOAT = ("exp", "log", "sqrt", "rsqrt", "reciprocal", "abs", "neg", "relu", "sigmoid", "tanh", "gelu")
UNARY_INT = ("abs", "neg", "relu")
BIN = ("add", "sub", "mul", "div", "maximum", "minimum")
OPER = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


class Generator(OpSteps, MoreSteps, IndexSteps):
    def __init__(self, c: Chooser, max_ops: int = 7):
        self.c = c
        self.max_ops = max_ops
        self.nodes: list[Node] = []
        self.inputs: list[InputSpec] = []
        self.lines: list[str] = []
        self.expect_error = ""

    # --- values ----------------------------------------------------------------------------
    def add(self, op, args, attrs, shape, dtype, lo, hi, text) -> Node:
        n = Node(len(self.nodes), op, list(args), dict(attrs), tuple(shape), dtype, float(lo), float(hi), text)
        self.nodes.append(n)
        if op != "input":
            self.lines.append(f"{n.name} = {text}")
        return n

    def new_input(self, shape, dtype, kind=None) -> Node | None:
        if len(self.inputs) >= 3 or math.prod(shape) > MAX_ELEMS:
            return None
        c = self.c
        if dtype in INTS:
            lo, hi = c.pick([(-4, 4), (0, 5), (-100, 100) if dtype == "int32" else (-9, 9), (1, 3)])
        else:
            lo, hi = kind or c.pick([(-2.0, 2.0), (0.25, 4.0), (-0.05, 0.05), (-20.0, 20.0), (1.0, 1.5)])
        specials = c.weighted([(12, 0), (1, 1), (1, 3), (1, 7)]) if dtype in FLOATS else 0
        name = f"x{len(self.inputs)}"
        self.inputs.append(InputSpec(name, tuple(shape), dtype, lo, hi, specials))
        return self.add("input", [], {"param": name}, shape, dtype, lo, hi, name)

    def pick_value(self, ok=lambda n: True, masks=False) -> Node | None:
        """A value of the pool, most recent first (shrinks towards the most recent); masks
        (bool values) only when asked for, never a value overwritten by a later write."""
        cands = [n for n in reversed(self.nodes) if ok(n) and not n.attrs.get("dead")
                 and (n.dtype == "bool") == masks]
        if not cands:
            return None
        if len(cands) == 1 or not self.c.chance(0.35):
            return cands[0]                       # mostly chains: the newest value
        return cands[self.c.int(1, len(cands) - 1)]

    def const(self, dtype) -> float | int:
        c = self.c
        if dtype in INTS:
            return c.pick([2, 1, -3, 0, 5])
        return c.pick([2.0, 0.5, -1.5, 3, 1e-3, 0.1, -0.25, 7.0])

    def fits(self, dtype, lo, hi) -> bool:
        return max(abs(lo), abs(hi)) <= SAFE[dtype] and math.isfinite(lo) and math.isfinite(hi)

    # --- domain fixes: a value kept away from zero / below exp overflow ---------------------
    def positive(self, x: Node) -> Node:
        if x.lo >= 0.1:
            return x
        a = self.unary(x, "abs", form="fn")
        return self.binary(a, ("c", 0.5 if x.dtype in FLOATS else 1), "add", form="op")

    # --- ops -------------------------------------------------------------------------------
    def unary(self, x: Node, fn: str, form: str | None = None) -> Node:
        lo, hi = x.lo, x.hi
        if fn == "exp":
            lo, hi = math.exp(lo), math.exp(hi)
        elif fn == "log":
            lo, hi = math.log(lo), math.log(hi)
        elif fn == "sqrt":
            lo, hi = math.sqrt(lo), math.sqrt(hi)
        elif fn == "rsqrt":
            lo, hi = 1 / math.sqrt(hi), 1 / math.sqrt(lo)
        elif fn == "reciprocal":
            lo, hi = 1 / hi, 1 / lo
        elif fn == "abs":
            lo, hi = (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
        elif fn == "neg":
            lo, hi = -hi, -lo
        elif fn == "relu":
            lo, hi = max(lo, 0.0), max(hi, 0.0)
        elif fn in ("sigmoid",):
            lo, hi = 0.0, 1.0
        elif fn == "tanh":
            lo, hi = -1.0, 1.0
        elif fn == "gelu":
            lo, hi = min(-0.2, lo), max(hi, 0.0)
        form = form or self.c.pick(["fn", "alt"])
        if form == "alt" and fn in ("exp", "log", "sqrt"):
            text = f"{x.name}.{fn}()"
        elif form == "alt" and fn == "neg":
            text = f"-{x.name}"
        elif form == "alt" and fn == "abs":
            text = f"abs({x.name})"
        else:
            text = f"pypto.{fn}({x.name})"
        return self.add("un", [x.id], {"fn": fn}, x.shape, x.dtype, lo, hi, text)

    def binary(self, a: Node, b, fn: str, swap=False, form: str | None = None) -> Node:
        """a fn b (b a node or ("c", number)); swap: the number (or b) on the left."""
        def iv(v):
            return (v[1], v[1]) if isinstance(v, tuple) else (v.lo, v.hi)
        (alo, ahi), (blo, bhi) = iv(a), iv(b)
        if swap:
            (alo, ahi), (blo, bhi) = (blo, bhi), (alo, ahi)
        if fn == "add":
            lo, hi = alo + blo, ahi + bhi
        elif fn == "sub":
            lo, hi = alo - bhi, ahi - blo
        elif fn == "mul":
            p = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
            lo, hi = min(p), max(p)
        elif fn == "div":
            p = (alo / blo, alo / bhi, ahi / blo, ahi / bhi)
            lo, hi = min(p), max(p)
        elif fn == "maximum":
            lo, hi = max(alo, blo), max(ahi, bhi)
        else:
            lo, hi = min(alo, blo), min(ahi, bhi)
        dtype = a.dtype
        const_float_on_int = isinstance(b, tuple) and dtype in INTS and isinstance(b[1], float)
        if (fn == "div" and dtype in INTS) or const_float_on_int:
            dtype = "fp32"              # torch's promotion: true division, a float scalar
        bshape = () if isinstance(b, tuple) else b.shape
        shape = broadcast(a.shape, bshape)
        an = a.name
        bn = _num(b[1]) if isinstance(b, tuple) else b.name
        left, right = (bn, an) if swap else (an, bn)
        form = form or self.c.pick(["op", "fn"])
        if form == "op" and fn in OPER:
            text = f"{left} {OPER[fn]} {right}"
        else:
            text = f"pypto.{fn}({left}, {right})"
        args = [a.id, b if isinstance(b, tuple) else b.id]
        if swap:
            args.reverse()
        n = self.add("bin", args, {"fn": fn}, shape, dtype, lo, hi, text)
        if dtype != a.dtype:
            # the model's dtype is fp32; a cast to it is the identity when pypto agrees
            n = self.add("cast", [n.id], {"to": "fp32", "identity": True}, shape, "fp32", lo, hi,
                         f"pypto.cast({n.name}, pypto.DT_FP32)")
        return n

    def reduce(self, x: Node, fn: str, dim: int, keepdim: bool) -> Node:
        d = dim % len(x.shape)
        n = x.shape[d]
        lo, hi = x.lo, x.hi
        if fn == "sum":
            lo, hi = min(lo * n, lo), max(hi * n, hi)
        shape = list(x.shape)
        if keepdim:
            shape[d] = 1
        else:
            del shape[d]
        kw = f", dim={dim}" + (f", keepdim={keepdim}" if keepdim or self.c.chance(0.3) else "")
        text = (f"{x.name}.{fn}({kw[2:]})" if self.c.chance(0.25) else f"pypto.{fn}({x.name}{kw})")
        return self.add("red", [x.id], {"fn": fn, "dim": d, "keepdim": keepdim}, shape, x.dtype, lo, hi, text)

    def cast(self, x: Node, to: str) -> Node:
        lo, hi = x.lo, x.hi
        if to in INTS:
            lo, hi = math.trunc(lo), math.trunc(hi)
        text = f"pypto.cast({x.name}, {PY_DT[to]})" if self.c.chance(0.7) else f"{x.name}.cast({PY_DT[to]})"
        return self.add("cast", [x.id], {"to": to}, x.shape, to, lo, hi, text)

    # --- one random step -------------------------------------------------------------------
    def step(self):
        c = self.c
        x = self.pick_value()
        isf = x.dtype in FLOATS
        r = len(x.shape)
        kinds = [(30, "bin"), (22, "un"), (12, "red"), (6, "view"), (5, "reshape"), (5, "transpose"),
                 (5, "cast"), (8, "matmul"), (5, "tile"), (3, "softmax"), (3, "rms_norm"), (3, "layernorm"),
                 (1, "misuse"), (8, "rowop"),
                 # the ops of the registry (tests/fuzz/gen_ops.py): about a quarter of the steps
                 (7, "select"), (8, "un2"), (3, "mod"), (6, "red2"), (2, "stepview"), (2, "concat"),
                 (2, "pad"), (2, "write"), (3, "layout2"),
                 # more of the registry (gen_more.py: math composites; gen_index.py: gathers,
                 # scatters, one-hot, triangles)
                 (5, "un3"), (4, "bin3"), (2, "rowop2"), (4, "index")]
        kind = c.weighted(kinds)
        if kind in ("red2", "stepview", "concat", "pad", "write", "layout2", "rowop2", "index") and r == 0:
            kind = "un2"
        if kind in ("softmax", "rms_norm", "layernorm") and not isf:
            kind = "cast"
        if kind == "rowop" and r == 0:
            kind = "bin"
        if r == 0 and kind not in ("bin", "un", "cast", "reshape"):
            kind = "reshape"
        getattr(self, "s_" + kind)(x)

    def s_un(self, x):
        c = self.c
        if x.dtype not in FLOATS:
            return self.unary(x, c.pick(UNARY_INT))
        fn = c.pick(UNARY_FLOAT)
        if fn in ("log", "sqrt", "rsqrt", "reciprocal"):
            x = self.positive(x) if x.lo < 0.1 else x
            if fn == "reciprocal" and x.hi > 1e4:
                fn = "log"
        if fn == "exp" and x.hi > (8 if x.dtype == "fp16" else 30):
            fn = "tanh"
        if fn == "gelu" and x.dtype == "fp16" and max(abs(x.lo), abs(x.hi)) > 25:
            fn = "relu"
        return self.unary(x, fn)

    def s_bin(self, x):
        c = self.c
        fn = c.pick(BIN)
        swap = c.chance(0.3)
        how = c.pick(["node", "const", "input"])
        b = None
        if how == "node":
            b = self.pick_value(lambda n: n.dtype == x.dtype and broadcast(x.shape, n.shape) is not None
                                and math.prod(broadcast(x.shape, n.shape)) <= MAX_ELEMS)
        elif how == "input":
            b = self.new_input(self.bcast_partner(x.shape), x.dtype)
        if b is not None and not isinstance(b, tuple) and math.prod(broadcast(x.shape, b.shape) or ()) > MAX_ELEMS:
            b = None                    # a partner that would broadcast x beyond the size limit
        if b is None:
            v = self.const(x.dtype)
            if x.dtype in INTS and c.chance(0.05):
                v = 0.5                         # a float scalar on an int tensor
            b = ("c", v)
        bl, bh = (b[1], b[1]) if isinstance(b, tuple) else (b.lo, b.hi)
        if fn == "div":
            if isinstance(b, tuple) or swap:
                # the divisor must stay away from 0
                if swap:
                    x = self.positive(x)
                elif b[1] == 0:
                    b = ("c", 2)
            elif bl < 0.1:
                b = self.positive(b)
        n = self.binary(x, b, fn, swap=swap)
        if not self.fits(n.dtype, n.lo, n.hi):      # out of the safe range: use the other way
            self.lines.pop()
            self.nodes.pop()
            if n.op == "cast":
                self.lines.pop()
                self.nodes.pop()
            return self.binary(x, b, "maximum", swap=swap)
        return n

    def bcast_partner(self, s):
        """A shape that broadcasts against s (same, 1s, lower rank, new dims where s has 1s)."""
        c = self.c
        s = list(s)
        if not s:
            return (c.pick(DIMS[:6]),)
        v = c.pick(["same", "ones", "suffix", "grow", "prefix", "vector"])
        if v == "vector":           # [N] against [..., M, 1] (or [..., N]): a lower rank
            return (s[-1] if s[-1] != 1 else c.pick(DIMS[:6]),)
        if v == "ones" and s:
            return tuple(1 if c.chance(0.5) else d for d in s)
        if v == "suffix" and s:
            k = c.int(1, len(s))
            t = s[-k:]
            return tuple(1 if c.chance(0.3) else d for d in t)
        if v == "grow" and 1 in s:
            return tuple(c.pick(DIMS[:6]) if d == 1 else d for d in s)
        if v == "prefix" and len(s) < 3:
            return tuple([c.pick((2, 3, 1))] + s)
        return tuple(s)

    def s_red(self, x):
        c = self.c
        fn = c.pick(("sum", "amax", "amin", "mean"))
        if fn == "mean" and x.dtype in INTS and not c.chance(0.1):
            fn = "sum"
        if fn == "sum" and x.dtype in INTS:
            n = x.shape[-1]
            if not self.fits(x.dtype, x.lo * max(x.shape), x.hi * max(x.shape)):
                if x.dtype == "int8":
                    x = self.cast(x, "int32")
                if not self.fits(x.dtype, x.lo * max(x.shape), x.hi * max(x.shape)):
                    fn = "amax"
        if fn == "sum" and x.dtype == "fp16" and max(abs(x.lo), abs(x.hi)) * max(x.shape) > 3e4:
            fn = "mean"
        r = len(x.shape)
        dim = c.int(-r, r - 1)
        keepdim = c.chance(0.5)
        return self.reduce(x, fn, dim, keepdim)

    def s_rowop(self, x):
        """x fn reduce(x, dim, keepdim=True): a reduced value broadcast back over x (row or
        column expansion), or against a vector of a lower rank."""
        c = self.c
        red = self.s_red(x)
        if len(red.shape) == len(x.shape) or not red.shape:
            other = x
        else:
            other = self.pick_value(lambda n: n.dtype == red.dtype and n.id != red.id
                                    and broadcast(red.shape, n.shape) is not None
                                    and math.prod(broadcast(red.shape, n.shape)) <= MAX_ELEMS) or x
            if broadcast(red.shape, other.shape) is None:
                return red
        fn = c.pick(("sub", "add", "mul", "maximum", "div", "minimum"))
        if fn == "div" and red.lo < 0.1:
            fn = "sub"
        n = self.binary(other, red, fn)
        if not self.fits(n.dtype, n.lo, n.hi):
            self.lines.pop()
            self.nodes.pop()
            if n.op == "cast":
                self.lines.pop()
                self.nodes.pop()
            return red
        return n

    def s_cast(self, x):
        c = self.c
        if x.dtype in FLOATS:
            to = c.pick([d for d in FLOATS if d != x.dtype] + ["int32", "int8"])
            if to in INTS and not (max(abs(x.lo), abs(x.hi)) < SAFE[to]):
                to = "fp32" if x.dtype != "fp32" else "fp16"
            if to == "fp16" and max(abs(x.lo), abs(x.hi)) > SAFE["fp16"]:
                to = "bf16"
        else:
            to = c.pick(["fp32", "fp16", "bf16", "int32" if x.dtype == "int8" else "int8"])
            if to == "int8" and not self.fits("int8", x.lo, x.hi):
                to = "fp32"
        return self.cast(x, to)

    def s_transpose(self, x):
        c = self.c
        r = len(x.shape)
        if r < 2:
            return self.s_reshape(x)
        d0, d1 = c.int(-r, r - 1), c.int(-r, r - 1)
        if d0 % r == d1 % r:
            d0, d1 = -2, -1
        s = list(x.shape)
        a, b = d0 % r, d1 % r
        s[a], s[b] = s[b], s[a]
        form = c.pick(["fn", "method", "T"])
        if form == "T":                     # .T of a matrix; .mT of a batch of them (.T reverses all dims)
            d0, d1 = -2, -1
            s = list(x.shape)
            s[-1], s[-2] = s[-2], s[-1]
            text = f"{x.name}.T" if r == 2 else f"{x.name}.mT"
        elif form == "method":
            text = f"{x.name}.transpose({d0}, {d1})"
        else:
            text = f"pypto.transpose({x.name}, {d0}, {d1})"
        return self.add("transpose", [x.id], {"d0": d0 % r, "d1": d1 % r}, s, x.dtype, x.lo, x.hi, text)

    def s_reshape(self, x):
        c = self.c
        s = list(x.shape)
        size = math.prod(s)
        v = c.pick(["flat", "merge", "split", "unsqueeze", "squeeze"])
        if v == "merge" and len(s) >= 2:
            i = c.int(0, len(s) - 2)
            t = s[:i] + [s[i] * s[i + 1]] + s[i + 2:]
        elif v == "split" and s and len(s) < 3:
            i = c.int(0, len(s) - 1)
            f = next((f for f in (2, 4, 8, 16, 3, 5) if s[i] % f == 0 and s[i] > f), None)
            t = s[:i] + [f, s[i] // f] + s[i + 1:] if f else s[:i] + [1, s[i]] + s[i + 1:]
        elif v == "unsqueeze" and len(s) < 3:
            i = c.int(0, len(s))
            t = s[:i] + [1] + s[i:]
        elif v == "squeeze" and 1 in s:
            t = [d for d in s if d != 1] or [1]
        else:
            t = [size]
        shown = list(t)
        if len(t) > 1 and c.chance(0.3):
            shown[c.int(0, len(t) - 1)] = -1
        form = c.pick(["fn", "method", "args"])
        if form == "method":
            text = f"{x.name}.reshape({_shape_text(shown)})"
        elif form == "args" and shown:
            text = f"{x.name}.reshape({', '.join(map(str, shown))})"
        else:
            text = f"pypto.reshape({x.name}, {_shape_text(shown)})"
        return self.add("reshape", [x.id], {"shape": tuple(t)}, t, x.dtype, x.lo, x.hi, text)

    def s_view(self, x):
        c = self.c
        s = x.shape
        r = len(s)
        shape, offs = [], []
        for d in s:
            n = d if c.chance(0.4) else c.int(1, d)
            o = c.int(0, d - n)
            shape.append(n)
            offs.append(o)
        form = c.pick(["view", "slice", "index", "neg"])
        if form == "view":
            text = f"pypto.view({x.name}, {_shape_text(shape)}, {_shape_text(offs)})"
            return self.add("view", [x.id], {"shape": tuple(shape), "offsets": tuple(offs), "drop": ()},
                            shape, x.dtype, x.lo, x.hi, text)
        keys, drop = [], []
        for i, (d, n, o) in enumerate(zip(s, shape, offs)):
            if form == "index" and i == 0 and r >= 2:
                keys.append(str(o))
                shape[i] = 1
                drop.append(i)
            elif n == d and o == 0:
                keys.append(":")
            elif form == "neg" and o + n == d:
                keys.append(f"-{n}:")
            else:
                keys.append(f"{o}:{o + n}")
        if form == "neg" and r >= 2 and keys[0] == ":":
            keys = ["..."] + keys[1:]
        else:
            while len(keys) > 1 and keys[-1] == ":":
                keys.pop()
        text = f"{x.name}[{', '.join(keys)}]"
        out = tuple(n for i, n in enumerate(shape) if i not in drop)
        return self.add("view", [x.id], {"shape": tuple(shape), "offsets": tuple(offs), "drop": tuple(drop)},
                        out, x.dtype, x.lo, x.hi, text)

    def s_matmul(self, a):
        c = self.c
        if len(a.shape) < 2:
            if len(a.shape) == 1 and a.shape[0] * 16 <= MAX_ELEMS:
                a = self.add("reshape", [a.id], {"shape": (1, a.shape[0])}, (1, a.shape[0]), a.dtype, a.lo, a.hi,
                             f"pypto.reshape({a.name}, [1, {a.shape[0]}])")
            else:
                return self.s_un(a)
        if a.dtype == "int32":
            if not self.fits("int8", a.lo, a.hi):
                return self.s_un(a)
            a = self.cast(a, "int8")
        a_trans, b_trans = c.chance(0.25), c.chance(0.25)
        m, k = (a.shape[-1], a.shape[-2]) if a_trans else (a.shape[-2], a.shape[-1])
        batch = a.shape[:-2]
        n = c.pick((16, 3, 17, 100, 64, 257, 1, 128, 32))
        bs = (n, k) if b_trans else (k, n)
        bb = c.pick([(), batch, (1,) * len(batch)] + ([(2,)] if not batch else []))
        b = self.pick_value(lambda v: v.dtype == a.dtype and v.shape == tuple(bb) + bs and v.id != a.id)
        if b is None:
            b = self.new_input(tuple(bb) + bs, a.dtype, kind=(-1.0, 1.0))
        if b is None:
            if a.shape[-1] == a.shape[-2] or True:
                # a @ a^T (or a^T @ a): the only partner without a new input
                b, b_trans = a, not a_trans
                n = m
        out_dtype = None
        mag = max(abs(a.lo), abs(a.hi)) * max(abs(b.lo), abs(b.hi)) * k
        if a.dtype in ("fp16", "bf16") and c.chance(0.3):
            out_dtype = "fp32"
        elif a.dtype == "fp32" and c.chance(0.1) and mag < 1e4:
            out_dtype = "fp16"
        elif a.dtype == "int8" and c.chance(0.2):
            out_dtype = "fp32"
        res_dt = out_dtype or ("int32" if a.dtype == "int8" else a.dtype)
        if not self.fits(res_dt, -mag, mag):
            if res_dt == "fp16":
                out_dtype = res_dt = "fp32"
            else:
                return self.s_un(a) if a.dtype in FLOATS else self.unary(a, "abs")
        bbatch = b.shape[:-2]
        shape = tuple(broadcast(batch, bbatch)) + (m, n)
        if math.prod(shape) > MAX_ELEMS:
            return self.unary(a, "neg")
        kw = ""
        if out_dtype:
            kw += f", out_dtype={PY_DT[out_dtype]}"
        if a_trans:
            kw += ", a_trans=True"
        if b_trans:
            kw += ", b_trans=True"
        text = f"{a.name} @ {b.name}" if not kw and c.chance(0.3) else f"pypto.matmul({a.name}, {b.name}{kw})"
        return self.add("matmul", [a.id, b.id], {"a_trans": a_trans, "b_trans": b_trans, "k": k},
                        shape, res_dt, -mag, mag, text)

    def row_vector(self, x: Node) -> Node:
        """A value of shape x.shape[-1:] and x's dtype: from the pool, a new input, or x itself."""
        want = x.shape[-1:]
        w = self.pick_value(lambda v: v.shape == want and v.dtype == x.dtype)
        if w is None:
            w = self.new_input(want, x.dtype, kind=self.c.pick([(0.5, 1.5), (-2.0, 2.0)]))
        if w is None:
            w = x
            while len(w.shape) > 1:
                w = self.s_view_index0(w)
        return w

    def s_view_index0(self, x):
        shape = (1,) + x.shape[1:]
        return self.add("view", [x.id], {"shape": shape, "offsets": (0,) * len(x.shape), "drop": (0,)},
                        x.shape[1:], x.dtype, x.lo, x.hi, f"{x.name}[0]")

    def s_softmax(self, x):
        r = len(x.shape)
        dim = self.c.int(-r, r - 1)
        text = f"pypto.softmax({x.name}, dim={dim})" if dim != -1 or self.c.chance(0.5) else f"pypto.softmax({x.name})"
        return self.add("softmax", [x.id], {"dim": dim % r}, x.shape, x.dtype, 0.0, 1.0, text)

    def s_rms_norm(self, x):
        w = self.row_vector(x)
        eps = self.c.pick([1e-6, 1e-5, 1e-3])
        n = x.shape[-1]
        mw = max(abs(w.lo), abs(w.hi))
        bound = math.sqrt(n) * mw
        text = f"pypto.rms_norm({x.name}, {w.name}" + (f", eps={eps!r})" if eps != 1e-6 else ")")
        return self.add("rms_norm", [x.id, w.id], {"eps": eps}, x.shape, x.dtype, -bound, bound, text)

    def s_layernorm(self, x):
        c = self.c
        args, kws = [x.id], []
        n = x.shape[-1]
        bound = math.sqrt(n)
        hw = c.chance(0.6)
        hb = c.chance(0.5)
        if hw:
            w = self.row_vector(x)
            args.append(w.id)
            kws.append(f"{w.name}" if c.chance(0.5) else f"weight={w.name}")
            bound *= max(abs(w.lo), abs(w.hi))
        if hb:
            b = self.row_vector(x)
            args.append(b.id)
            kws.append(f"bias={b.name}")
            bound += max(abs(b.lo), abs(b.hi))
        eps = c.pick([1e-5, 1e-6, 1e-2])
        if eps != 1e-5:
            kws.append(f"eps={eps!r}")
        fn = c.pick(["layernorm", "layer_norm"])
        text = f"pypto.{fn}({', '.join([x.name] + kws)})"
        return self.add("layernorm", args, {"eps": eps, "has_weight": hw, "has_bias": hb},
                        x.shape, x.dtype, -bound, bound, text)

    def s_tile(self, x):
        c = self.c
        if c.chance(0.3):
            opts = [64, 128, 16, 32, 256, [64, 128], [32, 64], [128, 256], [16, 32], 512, [48, 64], 1]
            dims = [c.pick(opts) for _ in range(3)]
            self.lines.append(f"pypto.set_cube_tile_shapes({', '.join(map(str, dims))})")
            return
        self.lines.append(f"pypto.set_vec_tile_shapes({', '.join(map(str, self.vec_tile(x.shape)))})")

    def vec_tile(self, shape):
        c = self.c
        r = max(len(shape), 1)
        arity = c.weighted([(8, r), (1, r - 1), (1, r + 1)]) or 1
        dims = list(shape[-arity:]) if arity <= len(shape) else [8] * (arity - len(shape)) + list(shape)
        out = []
        for i, d in enumerate(dims):
            if i == len(dims) - 1:      # the last dim: mostly 32-byte aligned for every dtype
                out.append(c.weighted([(3, 64), (3, 128), (2, 256), (2, 32), (1, 512), (2, d), (1, d + 5),
                                       (1, 3), (1, 17), (1, 2048)]))
            else:
                out.append(c.pick([d, 8, 16, 32, 64, 1, 128, max(d // 2, 1), d + 5, 3, 17, 2048]))
        return out

    def s_misuse(self, x):
        c = self.c
        opts = [f"{{}} = {x.name} ** {x.name}", f"if {x.name}:\n        pass", f"{{}} = {x.name}[::-1]",
                f"{{}} = {x.name}[None]", f"{{}} = math.exp({x.name})", f"{{}} = {x.name}.softmax(dim={len(x.shape) + 1})",
                f"{{}} = pypto.sum({x.name}, dim=(0, 0))", f"{{}} = pypto.cast({x.name}, 'fp16')",
                f"{{}} = pypto.reshape({x.name}, [{x.size + 1}])",
                f"{{}} = pypto.exp({x.name}, {x.name})", f"{{}} = float({x.name})",
                f"{{}} = pypto.view({x.name}, {_shape_text([d + 1 for d in x.shape])})"]
        opts += self.misuse_ops(x)
        k = c.int(0, len(opts) - 1)
        stmt = opts[k].format(f"bad{len(self.lines)}")
        self.lines.append(stmt)
        self.expect_error = self.expect_error or stmt.splitlines()[0]

    # --- stores ------------------------------------------------------------------------------
    def stores(self) -> list[Store]:
        c = self.c
        computed = [n for n in self.nodes if n.op != "input"]
        last = computed[-1] if computed else self.unary(self.nodes[0], "neg", form="alt")
        outs = [last]
        used = {a for n in self.nodes for a in n.args if not isinstance(a, tuple)}
        sinks = [n for n in computed[:-1] if n.id not in used and n.dtype != "bool" and n.shape and n.size <= MAX_ELEMS]
        if sinks and c.chance(0.6):
            outs.append(sinks[-1] if len(sinks) == 1 or not c.chance(0.5) else c.pick(sinks))
        res = []
        for k, v in enumerate(outs):
            if not v.shape:
                v = self.add("reshape", [v.id], {"shape": (1,)}, (1,), v.dtype, v.lo, v.hi,
                             f"pypto.reshape({v.name}, [1])")
            res.append(self.store(f"out{k}", v))
        return res

    def store(self, out: str, v: Node) -> Store:
        c = self.c
        s, r = v.shape, len(v.shape)
        kind = c.pick(["full", "ellipsis", "assemble", "offset", "split", "index", "overlap"])
        if kind == "full":
            st = Store(out, v.id, kind, s, v.dtype, (0,) * r)
            st.lines = [f"{out}[:] = {v.name}"]
        elif kind == "ellipsis":
            st = Store(out, v.id, kind, s, v.dtype, (0,) * r)
            st.lines = [f"{out}[...] = {v.name}"]
        elif kind == "assemble" or kind == "offset":
            grow = [0] * r
            if kind == "offset":
                grow[c.int(0, r - 1)] = c.pick([3, 1, 16])
            big = tuple(d + g for d, g in zip(s, grow))
            offs = tuple(c.int(0, g) for g in grow)
            if math.prod(big) > MAX_ELEMS * 2:
                big, offs = s, (0,) * r
            st = Store(out, v.id, "assemble", big, v.dtype, offs)
            st.lines = [f"pypto.assemble({v.name}, {_shape_text(offs)}, {out})"]
        elif kind == "split" and s[0] >= 2:
            a = c.int(1, s[0] - 1)
            st = Store(out, v.id, kind, s, v.dtype, (0,) * r, index=a)
            st.lines = [f"{out}[:{a}] = {v.name}[:{a}]", f"{out}[{a}:] = {v.name}[{a}:]"]
        elif kind == "overlap" and s[0] >= 2:
            # two writes into one output, the second over part of the first (the later one wins)
            a = c.int(1, s[0] - 1)
            st = Store(out, v.id, kind, s, v.dtype, (0,) * r, index=a)
            st.lines = [f"{out}[:] = {v.name}", f"{out}[:{a}] = pypto.neg({v.name}[:{a}])"]
        elif kind == "index" and v.size * 2 <= MAX_ELEMS:
            i = c.int(0, 1)
            st = Store(out, v.id, kind, (2,) + s, v.dtype, (i,) + (0,) * r, index=i)
            st.lines = [f"{out}[{i}] = {v.name}"]
        else:
            st = Store(out, v.id, "full", s, v.dtype, (0,) * r)
            st.lines = [f"{out}[:] = {v.name}"]
        return st

    # --- the whole case --------------------------------------------------------------------
    def case(self) -> Case:
        c = self.c
        machine = c.pick(["teach", "a2a3"])
        dtype = c.weighted([(10, "fp32"), (5, "fp16"), (4, "bf16"), (3, "int32"), (2, "int8")])
        rank = c.weighted([(6, 2), (3, 1), (3, 3)])
        shape = []
        for i in range(rank):
            shape.append(c.pick(DIMS))
        while math.prod(shape) > MAX_ELEMS:
            shape[shape.index(max(shape))] //= 4
        if c.chance(0.5):
            self.lines.append(f"pypto.set_vec_tile_shapes({', '.join(map(str, self.vec_tile(shape)))})")
        self.new_input(tuple(shape), dtype)
        for _ in range(c.int(1, self.max_ops)):
            self.step()
            if len(self.nodes) > 4 * self.max_ops:
                break
        stores = self.stores()
        for st in stores:
            self.lines.extend(st.lines)
        return Case(machine, self.inputs, self.nodes, self.lines, stores, c.int(0, 2**16),
                    self.expect_error)


def generate(c: Chooser, max_ops: int = 7) -> Case:
    return Generator(c, max_ops).case()


def from_seed(seed: int, max_ops: int = 7) -> Case:
    case = generate(RandomChooser(seed), max_ops)
    case.label = f"seed {seed}"
    return case
