"""`pypto.tile`: the Tile tier, PTO-ISA tile instructions in lower case on tiles in named buffers.

A `@pypto.jit(level="tile")` kernel is traced twice at once: every tile op adds a tile node
(the kernel's Tile Graph, built here) and the equivalent Tensor-level op on the GM views (its
Tensor Graph: the levels view and the numpy reference the simulator is checked against).

The tile nodes form chains, each from its loads to its stores, that share no tile.  Isomorphic
chains (the same instructions on the same tensors, whatever their shapes) are the outer
iterations of one group, which `partition` splits into tasks; a group's tile shapes are the
largest its chains use, and a smaller chain (the tail of a loop) carries its own as `valid`.
The pipeline then runs from the first pass after `tiling` (`tile_pipeline`).

This slice covers loads, stores and the vector instructions on UB tiles; the cube path
(L1 / L0 staging, TMATMUL), explicit buffering and flags are not yet tile-level operations.
"""
from __future__ import annotations

import numbers

from .. import dtypes as dt
from ..errors import DTypeError, PyptoError, ShapeError, TileShapeError, UnsupportedError
from ..ir.core import Attrs, fmt_shape
from ..ir.gm import GMBuffer, GMRef, natural_strides
from ..ir.tensor import OPS, TensorGraph
from ..ir.tile import DATA_PATHS, ON_CHIP, GroupInfo, TileGraph, TileNode, tile_bytes
from ..target import isa
from .tracer import Tensor, TraceContext, user_loc

# the instruction kinds pypto.tile exposes, and the tensor-op kind each one's math is
_KINDS = {"unary": "unary", "cvt": "cast", "binary": "binary", "scalar": "binary",
          "expand_binary": "binary", "reduce": "reduce"}
# the math of this slice: arithmetic on numbers (masks and logic come with TCMP / TSEL)
_MATH = set(isa.UNARY_FNS) | set(isa.BINARY_FNS) | set(isa.REDUCE_FNS) | {"CVT"}


class Tile:
    """A tile of a tile-level kernel: its shape, dtype and on-chip space (`value` is the same
    data as a traced tensor, the numpy reference's)."""

    __slots__ = ("_trace", "id", "shape", "dtype", "space", "value")

    def __init__(self, trace, nid, shape, dtype, space, value):
        self._trace, self.id, self.shape, self.dtype, self.space, self.value = trace, nid, shape, dtype, space, value

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self):
        return f"<tile %{self.id}: {self.space} {self.dtype}{fmt_shape(self.shape)}>"

    def __bool__(self):
        raise UnsupportedError("a tile has no truth value (its data is not known while compiling)",
                               loc=user_loc(), expected="Python control flow on shapes or constants",
                               got="`if` / `while` on a tile")


class _Op:
    """One traced tile instruction (before grouping)."""

    __slots__ = ("op", "inputs", "shape", "dtype", "space", "attrs", "loc", "win")

    def __init__(self, op, inputs, shape, dtype, space, attrs, loc, win=None):
        self.op, self.inputs, self.shape, self.dtype, self.space = op, inputs, shape, dtype, space
        self.attrs, self.loc, self.win = attrs, loc, win      # win: (param, offset, shape, strides)


class TileTrace:
    """The tile ops of one kernel trace (entered inside its TraceContext)."""

    _stack: list["TileTrace"] = []

    def __init__(self, ctx: TraceContext):
        self.ctx = ctx
        self.ops: list[_Op] = []
        self.parent: list[int] = []           # union-find over ops: the chains
        self.made: set[int] = set()           # tensor nodes made by tile ops
        self.loaded: dict[str, list] = {}     # param -> windows loaded
        self.stored: dict[str, list] = {}     # param -> windows stored

    def __enter__(self):
        TileTrace._stack.append(self)
        return self

    def __exit__(self, *exc):
        TileTrace._stack.pop()

    @classmethod
    def current(cls, what: str) -> "TileTrace":
        if not cls._stack:
            raise UnsupportedError(f"pypto.tile.{what} works only inside a @pypto.jit(level=\"tile\") kernel",
                                   loc=user_loc(), expected='@pypto.jit(level="tile")',
                                   got="a Tensor-level kernel" if TraceContext._stack else "no kernel",
                                   hint="decorate the kernel with @pypto.jit(level=\"tile\")")
        return cls._stack[-1]

    # --- recording ---------------------------------------------------------------------------
    def add(self, op, inputs, shape, dtype, space, loc, value=None, win=None, **attrs):
        k = len(self.ops)
        self.ops.append(_Op(op, tuple(t.id for t in inputs), tuple(shape), dtype, space, attrs, loc, win))
        self.parent.append(k)
        for t in inputs:
            self._union(k, t.id)
        return None if value is None else Tile(self, k, tuple(shape), dtype, space, value)

    def tensor(self, op, inputs, shape, dtype, **attrs) -> Tensor:
        t = self.ctx.add(op, inputs, shape, dtype, **attrs)
        self.made.add(t._node)
        return t

    def _find(self, k):
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def _union(self, a, b):
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    # --- GM windows ----------------------------------------------------------------------------
    def window(self, view, what: str):
        """(param, offset, shape, strides) of a view of a kernel tensor (slices of a parameter)."""
        if isinstance(view, Tile):
            raise UnsupportedError(f"pypto.tile.{what} takes a view of a kernel tensor, not a tile", loc=user_loc(),
                                   expected="a slice of a tensor argument, e.g. x[i:i + TM, :]", got=repr(view))
        if not isinstance(view, Tensor) or view._ctx is not self.ctx:
            raise UnsupportedError(f"pypto.tile.{what} takes a view of a kernel tensor", loc=user_loc(),
                                   expected="a slice of a tensor argument, e.g. x[i:i + TM, :]",
                                   got=f"{type(view).__name__} {view!r}"[:80])
        win = self._window_of(view._node)
        if win is None:
            raise UnsupportedError(f"pypto.tile.{what} takes a view of a kernel tensor", loc=user_loc(),
                                   expected="a slice of a tensor argument, e.g. x[i:i + TM, :]",
                                   got=f"a value computed by {self.ctx.nodes[view._node].op}",
                                   hint="tile-level kernels compute with pypto.tile ops on tiles")
        return win

    def _window_of(self, nid):
        n = self.ctx.nodes[nid]
        if n.op == "input":
            return (n.attrs["param"], 0, n.shape, natural_strides(n.shape))
        base = self._window_of(n.inputs[0]) if n.op in ("view", "reshape") else None
        if base is None:
            return None
        name, off, shape, strides = base
        if n.op == "view":
            for o, s in zip(n.attrs["offsets"], strides):
                off += o * s
            steps = n.attrs.get("steps") or (1,) * len(shape)
            return (name, off, tuple(n.attrs["shape"]), tuple(s * k for s, k in zip(strides, steps)))
        kept = [(d, s) for d, s in zip(shape, strides) if d != 1]     # an integer index drops a dim
        if [d for d, _ in kept] != [d for d in n.shape if d != 1]:
            return None
        it = iter(kept)
        return (name, off, tuple(n.shape), tuple(1 if d == 1 else next(it)[1] for d in n.shape))

    # --- the Tile Graph ------------------------------------------------------------------------
    def check_tensor_ops(self, g: TensorGraph) -> None:
        """Every value of the traced graph comes from a tile op (or is a view for one)."""
        for n in g.nodes:
            if n.op not in ("input", "view", "reshape") and n.id not in self.made:
                what = "a Tensor-level write (out[...] = value)" if n.op == "store" else f"pypto.{n.op}"
                raise UnsupportedError(
                    f"{what} is a Tensor-level op, and this kernel is a tile-level one", loc=n.loc,
                    expected="pypto.tile operations on tiles", got=f"{what} on a tensor",
                    hint="load the data with pypto.tile.tload and use the tile instructions "
                         "(texp, tadd, trowsum, ...), or write the kernel at the Tensor level (@pypto.jit)")

    def graph(self, g: TensorGraph) -> TileGraph:
        """The Tile Graph of the traced tile ops: one group per class of isomorphic chains."""
        for k, o in enumerate(self.ops):
            if o.space == "L1" and not any(k in p.inputs for p in self.ops):
                raise UnsupportedError("an L1 tile feeds the cube (tmatmul), which tile-level kernels do not have yet",
                                       loc=o.loc, expected='a tile in UB: tload(view, space="UB")',
                                       got="a tile loaded into L1 that nothing reads")
        roles = {}
        for p in g.params:
            st, ld = p.name in self.stored, p.name in self.loaded
            roles[p.name] = "inout" if st and ld else "output" if st else "input"
        buffers = {p.name: GMBuffer(p.name, p.shape, p.dtype, roles[p.name]) for p in g.params}
        chains: dict[int, list[int]] = {}
        for k in range(len(self.ops)):
            chains.setdefault(self._find(k), []).append(k)
        classes: dict[tuple, list[list[int]]] = {}
        for members in chains.values():
            classes.setdefault(self._signature(members), []).append(members)
        nodes: list[TileNode] = []
        infos = []
        for gid, group in enumerate(classes.values()):
            width = len(group[0])
            shapes = [tuple(map(max, *(self.ops[c[p]].shape for c in group))) if len(group) > 1
                      else self.ops[group[0][p]].shape for p in range(width)]
            for outer, members in enumerate(group):
                new_id = {}
                for p, k in enumerate(members):
                    o = self.ops[k]
                    attrs = {"key": f"t{p}", "par": outer, **o.attrs}
                    if o.win is not None:
                        name, off, shape, strides = o.win
                        attrs["gm"] = GMRef(buffers[name], off, shape, strides)
                    new_id[k] = len(nodes)
                    store = o.op == "TSTORE"
                    nodes.append(TileNode._make(len(nodes), o.op, tuple(new_id[i] for i in o.inputs),
                                                () if store else shapes[p], () if store else o.shape, o.dtype,
                                                o.space, gid, outer, 0, Attrs.of(attrs), o.loc))
            first = self.ops[group[0][0]]
            tile = next((shapes[p] for p, k in enumerate(group[0]) if self.ops[k].op == "TLOAD"), shapes[0])
            st = next((self.ops[k].win for k in group[0] if self.ops[k].op == "TSTORE"), None)
            domain = buffers[st[0]].shape if st else tile
            infos.append(GroupInfo(gid, "vector", tuple(domain), tuple(tile), len(group), 1, first.loc))
        return TileGraph(g.name, tuple(buffers.values()), tuple(infos), tuple(nodes))

    def _signature(self, members: list[int]) -> tuple:
        """What isomorphic chains share: per op its instruction, dtype, space, rank, attrs, the
        chain positions of its inputs and the tensor it loads or stores (not the shapes)."""
        pos = {k: p for p, k in enumerate(members)}
        out = []
        for k in members:
            o = self.ops[k]
            out.append((o.op, o.dtype.name, o.space, len(o.shape), tuple(pos[i] for i in o.inputs),
                        tuple(sorted((a, repr(v)) for a, v in o.attrs.items())), o.win[0] if o.win else None))
        return tuple(out)


def tile_pipeline(pipeline, tile_graph: TileGraph):
    """The passes of `pipeline` after its Tensor -> Tile lowering, behind a lowering that gives
    the kernel's own Tile Graph."""
    from ..compiler.pipeline import Pass, Pipeline
    cut = next((i for i, p in enumerate(pipeline.passes) if p.level == "tensor->tile"), None)
    if cut is None:
        raise PyptoError("a tile-level kernel needs a pipeline with a Tensor -> Tile lowering to start after",
                         expected="a pipeline with the 'tiling' pass", got=[p.name for p in pipeline.passes])
    given = Pass("tile_kernel", "tensor->tile", lambda g, ctx: tile_graph,
                 "the Tile Graph the tile-level kernel wrote (no automatic tiling or fusion)")
    return Pipeline([given, *pipeline.passes[cut + 1:]])


# ---------------------------------------------------------------------------------------------
# the operations

def _machine_caps(trace: TileTrace) -> dict[str, int] | None:
    m = trace.ctx.machine
    return m.capacities() if m is not None else None


def tload(view, space: str = "UB") -> Tile:
    """TLOAD: a view of a kernel tensor (`x[i:i + TM, :]`) into a tile in `space` (UB; L1 feeds the cube)."""
    tr = TileTrace.current("tload")
    loc = user_loc()
    name, off, shape, strides = tr.window(view, "tload")
    if space not in ON_CHIP:
        raise UnsupportedError(f"tload into an unknown buffer {space!r}", loc=loc, expected=", ".join(ON_CHIP),
                               got=repr(space))
    if space not in DATA_PATHS["GM"]:
        raise UnsupportedError(f"tload cannot load GM into {space}", loc=loc,
                               expected="GM -> " + "/".join(DATA_PATHS["GM"]), got=f"GM -> {space}",
                               hint=f"{space} is filled from L1 (textract), not from GM" if space.startswith("L0")
                               else None)
    ref = _probe(tr, name, off, shape, strides)
    for w in tr.stored.get(name, ()):
        if ref.overlaps(_probe(tr, *w)):
            raise UnsupportedError(f"tload of '{name}' where the kernel has already stored", loc=loc,
                                   expected="loads of data the kernel has not written",
                                   got=f"a window of {name} overlapping an earlier tstore",
                                   hint="keep the tile on chip instead of storing and reloading it")
    caps = _machine_caps(tr)
    nbytes = tile_bytes(tuple(shape), view.dtype)
    if caps is not None and nbytes > caps[space]:
        raise TileShapeError(f"the tile does not fit {space}", loc=loc,
                             expected=f"at most {caps[space] // 1024} KiB of {space}",
                             got=f"{view.dtype}{fmt_shape(shape)} = {nbytes / 1024:.1f} KiB",
                             hint="load a smaller view (fewer rows per loop step)")
    tr.loaded.setdefault(name, []).append((name, off, shape, strides))
    return tr.add("TLOAD", [], shape, view.dtype, space, loc, value=view, win=(name, off, shape, strides))


def tstore(view, tile: Tile) -> None:
    """TSTORE: a UB tile into a view of a kernel tensor (`out[i:i + TM, :]`) of its shape."""
    tr = TileTrace.current("tstore")
    loc = user_loc()
    name, off, shape, strides = tr.window(view, "tstore")
    _tiles(tr, "tstore", [tile])
    if tile.space != "UB":
        raise UnsupportedError(f"tstore of a tile in {tile.space}", loc=loc, expected="UB -> GM (or L0C -> GM)",
                               got=f"{tile.space} -> GM")
    if tuple(shape) != tile.shape:
        raise ShapeError("tstore: the view and the tile differ in shape", loc=loc,
                         expected=fmt_shape(tile.shape), got=f"view {fmt_shape(shape)}")
    if view.dtype != tile.dtype:
        raise DTypeError(f"tstore of a {tile.dtype} tile into {view.dtype} '{name}'", loc=loc,
                         expected=str(view.dtype), got=str(tile.dtype), hint="convert it first: pypto.tile.tcvt")
    base = tr.ctx.nodes[view._node]
    while base.op != "input":
        base = tr.ctx.nodes[base.inputs[0]]
    full = base.shape
    offsets = _offsets(off, natural_strides(full))
    if len(shape) != len(full):
        raise UnsupportedError("tstore into a view that drops a dim", loc=loc,
                               expected="a slice keeping every dim, e.g. out[i:i + 1, :]",
                               got=f"view {fmt_shape(shape)} of {fmt_shape(full)}")
    steps = tuple(s // n_ for s, n_ in zip(strides, natural_strides(full)))
    attrs = {"param": name, "offsets": offsets, "shape": tuple(shape)}
    if any(k != 1 for k in steps):
        attrs["steps"] = steps
    tr.made.add(tr.ctx.add("store", [tile.value], tuple(shape), tile.dtype, **attrs)._node)
    tr.stored.setdefault(name, []).append((name, off, shape, strides))
    tr.add("TSTORE", [tile], (), tile.dtype, "", loc, win=(name, off, shape, strides))


def _offsets(off: int, strides) -> tuple[int, ...]:
    out = []
    for s in strides:
        i, off = divmod(off, s)
        out.append(i)
    return tuple(out)


def _probe(tr: TileTrace, name, off, shape, strides) -> GMRef:
    p = next(p for p in tr.ctx.params if p.name == name)
    return GMRef(GMBuffer(name, p.shape, p.dtype, "inout"), off, tuple(shape), tuple(strides))


def _tiles(tr: TileTrace, name: str, tiles) -> None:
    for t in tiles:
        if not isinstance(t, Tile) or t._trace is not tr:
            raise UnsupportedError(f"pypto.tile.{name} takes tiles", loc=user_loc(),
                                   expected="a tile (from pypto.tile.tload or another tile op)",
                                   got=f"{type(t).__name__} {t!r}"[:80],
                                   hint="load a view first: t = pypto.tile.tload(x[i:i + TM, :])"
                                   if isinstance(t, Tensor) else None)


def _tensor_op(kind: str, fn: str) -> str:
    return next(name for name, r in OPS.items() if r.kind == kind and r.tile == fn)


def _make(ins: isa.Instruction):
    """The pypto.tile function of one instruction row (its name in lower case)."""
    name = ins.name.lower()
    kind = ins.kind
    op = _tensor_op(_KINDS[kind], ins.fn) if kind != "cvt" else "cast"
    float_only = OPS[op].float_only

    def check(tr, tiles, loc):
        _tiles(tr, name, tiles)
        for t in tiles:
            if t.space != "UB":
                raise UnsupportedError(f"{name} works on UB tiles (the vector unit's buffer)", loc=loc,
                                       expected="tiles in UB", got=f"a tile in {t.space}",
                                       hint='load it with pypto.tile.tload(view, space="UB")')
        if float_only and not tiles[0].dtype.is_float:
            raise DTypeError(f"{name} needs a floating-point tile", loc=loc, expected="fp32, fp16 or bf16",
                             got=str(tiles[0].dtype))
        if len(tiles) == 2 and tiles[0].dtype != tiles[1].dtype:
            raise DTypeError(f"{name}: the tiles differ in dtype", loc=loc, expected=f"two {tiles[0].dtype} tiles",
                             got=f"{tiles[0].dtype} and {tiles[1].dtype}", hint="convert one with pypto.tile.tcvt")

    def emit(tr, tiles, shape, dtype, value, loc, **attrs):
        return tr.add(ins.name, tiles, shape, dtype, "UB", loc, value=value, **attrs)

    if kind == "unary":
        def f(t):
            tr, loc = TileTrace.current(name), user_loc()
            check(tr, [t], loc)
            return emit(tr, [t], t.shape, t.dtype, tr.tensor(op, [t.value], t.shape, t.dtype), loc)
    elif kind == "cvt":
        def f(t, dtype):
            tr, loc = TileTrace.current(name), user_loc()
            check(tr, [t], loc)
            to = dt.parse(dtype) if isinstance(dtype, str) and dtype in dt.BY_NAME else dtype
            if not isinstance(to, dt.DType):
                raise DTypeError("tcvt: unsupported dtype", loc=loc, expected=dt.supported_names(), got=repr(dtype))
            value = tr.tensor("cast", [t.value], t.shape, to, to=to.name)
            return emit(tr, [t], t.shape, to, value, loc, to=to.name)
    elif kind == "scalar":
        def f(t, scalar):
            tr, loc = TileTrace.current(name), user_loc()
            check(tr, [t], loc)
            if isinstance(scalar, bool) or not isinstance(scalar, numbers.Real):
                raise DTypeError(f"{name}: the scalar must be a Python number", loc=loc, expected="an int or a float",
                                 got=repr(scalar)[:60])
            v = float(scalar) if t.dtype.is_float else int(scalar)
            c = tr.tensor("const", [], (), t.dtype, value=v)
            return emit(tr, [t], t.shape, t.dtype, tr.tensor(op, [t.value, c], t.shape, t.dtype), loc, scalar=v)
    elif kind == "reduce":
        row_form = ins.form == "ROW"

        def f(t):
            tr, loc = TileTrace.current(name), user_loc()
            check(tr, [t], loc)
            if t.ndim < (1 if row_form else 2):
                raise ShapeError(f"{name} of a tile of rank {t.ndim}", loc=loc, expected="a 2-D tile",
                                 got=fmt_shape(t.shape))
            d = t.ndim - (1 if row_form else 2)
            shape = tuple(1 if k == d else s for k, s in enumerate(t.shape))
            value = tr.tensor(op, [t.value], shape, t.dtype, dim=d, keepdim=True)
            return emit(tr, [t], shape, t.dtype, value, loc, dim=d)
    else:                                   # binary, expand_binary
        form = ins.form

        def f(a, b):
            tr, loc = TileTrace.current(name), user_loc()
            check(tr, [a, b], loc)
            if form == "ROWEXPAND":
                want = (*a.shape[:-1], 1)
            elif form == "COLEXPAND":
                want = (*a.shape[:-2], 1, a.shape[-1]) if a.ndim >= 2 else None
            else:
                want = a.shape
            if b.shape != want:
                what = {"ROWEXPAND": "one value per row of the first", "COLEXPAND": "one value per column of the first"}
                raise ShapeError(f"{name}: the tiles' shapes do not fit", loc=loc,
                                 expected=f"{fmt_shape(want) if want else 'a 2-D first tile'}"
                                          f" ({what.get(form, 'the same shape')})",
                                 got=f"{fmt_shape(a.shape)} and {fmt_shape(b.shape)}",
                                 hint="a row vector [M, 1] from trowsum / trowmax goes with trowexpand<op>"
                                 if not form and b.shape == (*a.shape[:-1], 1) else None)
            return emit(tr, [a, b], a.shape, a.dtype, tr.tensor(op, [a.value, b.value], a.shape, a.dtype), loc)
    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"{ins.name}: {ins.doc} (on UB tiles)."
    return f


OPERATIONS: dict[str, object] = {"tload": tload, "tstore": tstore}
for _ins in isa.INSTRUCTIONS.values():
    if _ins.kind in _KINDS and _ins.fn in _MATH and _ins.form in ("", "S", "ROW", "COL", "ROWEXPAND", "COLEXPAND"):
        OPERATIONS[_ins.name.lower()] = globals()[_ins.name.lower()] = _make(_ins)
del _ins

__all__ = ["Tile", *OPERATIONS]
