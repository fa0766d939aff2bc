"""Level 1, the Tensor Graph: ops on whole tensors in global memory.

A node is one op on whole tensors; the graph is a list of nodes in topological order
(inputs always precede users).  Kernel parameters enter through `input` nodes and leave
through `store` nodes (a write of a value into a region of a parameter).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from ..dtypes import DType
from ..errors import SourceLoc, VerificationError
from .core import Attrs, TextForm, fmt_shape, region_text
from .ops import OPS


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
    """Result shape of `op` (its registry row's shape rule), or None when the inputs do not fit it."""
    rule = OPS[op].shape
    return None if rule is None else rule(in_shapes, attrs)


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
        return f"store {n.attrs['param']}{_region(n.attrs['offsets'], n.shape, n.attrs.get('steps'))} <- %{n.inputs[0]}{loc}"
    return f"%{n.id} = {rhs} : {n.dtype}{fmt_shape(n.shape)}{loc}"


def _region(offsets, shape, steps=None) -> str:
    return region_text(offsets, shape, steps)


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
            steps = n.attrs.get("steps") or (1,) * len(n.shape)
            for o, s, k, full in zip(n.attrs["offsets"], n.shape, steps, p.shape):
                if o < 0 or o + (s - 1) * k + 1 > full:
                    fail("store region out of bounds", expected=fmt_shape(p.shape),
                         got=_region(n.attrs["offsets"], n.shape, n.attrs.get("steps")))
        if spec.kind not in ("input", "const") and spec.arity != -1:
            want = infer_shape(n.op, [g.node(i).shape for i in n.inputs], n.attrs)
            if want != n.shape:
                fail("shape does not follow from the inputs", expected=want, got=n.shape)
        seen.add(n.id)
    if stores == 0:
        raise VerificationError(f"tensor graph {g.name}: the kernel writes no output")

