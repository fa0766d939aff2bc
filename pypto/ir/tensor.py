"""Level 1, the Tensor Graph: ops on whole tensors in global memory.

A node is one op on whole tensors; the graph is a list of nodes in topological order
(inputs always precede users).  Kernel parameters enter through `input` nodes and leave
through `store` nodes (a write of a value into a region of a parameter).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from ..dtypes import DType
from ..errors import SourceLoc, VerificationError
from .core import Attrs, TextForm, broadcast_shapes, fmt_shape


@dataclass(frozen=True)
class OpSpec:
    kind: str       # input | const | unary | binary | reduce | matmul | cast | layout | composite | store
    arity: int      # number of tensor inputs (-1: variable)
    doc: str = ""


UNARY = ("exp", "log", "sqrt", "rsqrt", "abs", "neg", "relu", "recip", "copy")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")
REDUCE = ("sum", "amax", "amin")

OPS: dict[str, OpSpec] = {
    "input": OpSpec("input", 0, "a kernel parameter"),
    "const": OpSpec("const", 0, "a Python number used as an operand"),
    **{op: OpSpec("unary", 1, f"elementwise {op}") for op in UNARY},
    **{op: OpSpec("binary", 2, f"elementwise {op} with broadcasting") for op in BINARY},
    **{op: OpSpec("reduce", 1, f"{op} over one dim") for op in REDUCE},
    "matmul": OpSpec("matmul", 2, "(batched) matrix product on the cube unit"),
    "cast": OpSpec("cast", 1, "dtype conversion"),
    "reshape": OpSpec("layout", 1, "new shape, same elements"),
    "transpose": OpSpec("layout", 1, "swap two dims"),
    "view": OpSpec("layout", 1, "a rectangular window"),
    "mean": OpSpec("composite", 1, "sum / n"),
    "sigmoid": OpSpec("composite", 1, "1 / (1 + exp(-x))"),
    "tanh": OpSpec("composite", 1, "2 * sigmoid(2x) - 1"),
    "gelu": OpSpec("composite", 1, "tanh approximation of GELU"),
    "softmax": OpSpec("composite", 1, "exp(x - max) / sum"),
    "layernorm": OpSpec("composite", -1, "normalise over the last dim, then scale and shift"),
    "rms_norm": OpSpec("composite", 2, "x * rsqrt(mean(x^2) + eps) * weight"),
    "store": OpSpec("store", 1, "write a value into a region of an output parameter"),
}


@dataclass(frozen=True)
class TileSpec:
    """A tile shape as set by set_vec_tile_shapes / set_cube_tile_shapes, with where it was set.

    Equality ignores the location: two calls with the same dims mean the same tiling.
    """
    dims: tuple
    loc: SourceLoc | None = field(default=None, compare=False, hash=False)

    def __str__(self):
        return "[" + ",".join(str(d) for d in self.dims) + "]"


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]
    dtype: DType


@dataclass(frozen=True)
class TNode:
    id: int
    op: str
    inputs: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: DType
    attrs: Attrs = field(default_factory=Attrs)
    loc: SourceLoc | None = None

    def replace(self, **changes) -> "TNode":
        d = dict(id=self.id, op=self.op, inputs=self.inputs, shape=self.shape,
                 dtype=self.dtype, attrs=self.attrs, loc=self.loc)
        d.update(changes)
        return TNode(**d)


def infer_shape(op: str, in_shapes: list[tuple[int, ...]], attrs) -> tuple[int, ...] | None:
    """Result shape of `op`, or None when the inputs do not fit it."""
    kind = OPS[op].kind
    if kind in ("unary", "cast") or op in ("sigmoid", "tanh", "gelu", "softmax", "layernorm", "rms_norm"):
        return tuple(in_shapes[0])
    if kind == "binary":
        return broadcast_shapes(in_shapes[0], in_shapes[1])
    if kind == "reduce" or op == "mean":
        s, d = list(in_shapes[0]), attrs["dim"]
        if not 0 <= d < len(s):
            return None
        if attrs["keepdim"]:
            s[d] = 1
        else:
            del s[d]
        return tuple(s)
    if op == "matmul":
        return matmul_shape(in_shapes[0], in_shapes[1], attrs["a_trans"], attrs["b_trans"])
    if op == "reshape":
        return tuple(attrs["shape"])
    if op == "transpose":
        s = list(in_shapes[0])
        a, b = attrs["dim0"], attrs["dim1"]
        s[a], s[b] = s[b], s[a]
        return tuple(s)
    if op in ("view", "store"):
        return tuple(attrs["shape"])
    if op in ("input", "const"):
        return None
    raise KeyError(op)


def matmul_shape(a, b, a_trans=False, b_trans=False):
    if len(a) < 2 or len(b) < 2:
        return None
    m, k = (a[-1], a[-2]) if a_trans else (a[-2], a[-1])
    k2, n = (b[-1], b[-2]) if b_trans else (b[-2], b[-1])
    if k != k2:
        return None
    batch = broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    if batch is None:
        return None
    return tuple(batch) + (m, n)


@dataclass(frozen=True)
class TensorGraph(TextForm):
    name: str
    params: tuple[Param, ...]
    nodes: tuple[TNode, ...]

    level = "tensor"

    def node(self, i: int) -> TNode:
        return self.nodes[self._index[i]]

    @property
    def _index(self) -> dict[int, int]:
        cache = self.__dict__.get("_idx")
        if cache is None:
            cache = {n.id: k for k, n in enumerate(self.nodes)}
            object.__setattr__(self, "_idx", cache)
        return cache

    def users(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                out[i].append(n.id)
        return out

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def output_names(self) -> tuple[str, ...]:
        seen = []
        for n in self.nodes:
            if n.op == "store" and n.attrs["param"] not in seen:
                seen.append(n.attrs["param"])
        return tuple(seen)

    def replace(self, nodes) -> "TensorGraph":
        return TensorGraph(self.name, self.params, tuple(nodes))

    def __len__(self):
        return len(self.nodes)

    def text(self) -> str:
        return print_graph(self)



def node_text(n: TNode) -> str:
    args = ", ".join(f"%{i}" for i in n.inputs)
    attrs = n.attrs.text()
    rhs = f"{n.op}({args})" + (f" {attrs}" if attrs else "")
    loc = f"  @{n.loc.short()}" if n.loc else ""
    if n.op == "store":
        return f"store {n.attrs['param']}{_region(n.attrs['offsets'], n.shape)} <- %{n.inputs[0]}{loc}"
    return f"%{n.id} = {rhs} : {n.dtype}{fmt_shape(n.shape)}{loc}"


def _region(offsets, shape) -> str:
    return "[" + ",".join(f"{o}:{o + s}" for o, s in zip(offsets, shape)) + "]"


def print_graph(g: TensorGraph) -> str:
    params = ", ".join(f"{p.name}: {p.dtype}{fmt_shape(p.shape)}" for p in g.params)
    lines = [f"tensor_graph {g.name}({params}) {{"]
    group = None
    for n in g.nodes:
        ng = n.attrs.get("group")
        if ng is not None and ng != group:
            lines.append(f"  // group {ng}")
            group = ng
        lines.append("  " + node_text(n))
    lines.append("}")
    return "\n".join(lines)


def verify(g: TensorGraph) -> None:
    """Check the invariants of the level; raise VerificationError naming the node."""
    seen: set[int] = set()
    params = {p.name: p for p in g.params}
    stores = 0
    for n in g.nodes:
        def fail(msg, expected=None, got=None):
            raise VerificationError(f"tensor graph node %{n.id} ({n.op}): {msg}", loc=n.loc,
                                    expected=expected, got=got)
        if n.id in seen:
            fail("duplicate id")
        if n.op not in OPS:
            fail("unknown op", expected="one of " + ", ".join(sorted(OPS)), got=n.op)
        spec = OPS[n.op]
        if spec.arity >= 0 and len(n.inputs) != spec.arity:
            fail("wrong number of inputs", expected=spec.arity, got=len(n.inputs))
        for i in n.inputs:
            if i not in seen:
                fail(f"input %{i} is not defined before use")
        if n.op == "input" and n.attrs["param"] not in params:
            fail("input of an unknown parameter", got=n.attrs["param"])
        if n.op == "store":
            stores += 1
            p = params.get(n.attrs["param"])
            if p is None:
                fail("store to an unknown parameter", got=n.attrs["param"])
            for o, s, full in zip(n.attrs["offsets"], n.shape, p.shape):
                if o < 0 or o + s > full:
                    fail("store region out of bounds", expected=fmt_shape(p.shape),
                         got=_region(n.attrs["offsets"], n.shape))
        if spec.kind not in ("input", "const") and spec.arity != -1:
            want = infer_shape(n.op, [g.node(i).shape for i in n.inputs], n.attrs)
            if want != n.shape:
                fail("shape does not follow from the inputs", expected=want, got=n.shape)
        seen.add(n.id)
    if stores == 0:
        raise VerificationError(f"tensor graph {g.name}: the kernel writes no output")

