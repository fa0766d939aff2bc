"""`pypto.tile`: the Tile tier, PTO-ISA tile instructions in lower case on tiles in named buffers.

A `@pypto.jit(level="tile")` kernel is traced twice at once: every tile op adds a tile node
(the kernel's Tile Graph, built here) and the equivalent Tensor-level op on the GM views (its
Tensor Graph: the levels view and the numpy reference the simulator is checked against).

The tile nodes form chains, each from its loads to its stores, that share no tile.  Isomorphic
chains (the same instructions on the same tensors, whatever their shapes) are the outer
iterations of one group, which `partition` splits into tasks; a group's tile shapes are the
largest its chains use, and a smaller chain (the tail of a loop) carries its own as `valid`.
The pipeline then runs from the first pass after `tiling` (`tile_pipeline`).

Vector chains work on UB tiles.  Cube chains stage operands explicitly: tload into L1,
textract into L0A / L0B, tmatmul / tmatmul_acc / tmatmul_bias into an L0C accumulator (a bias
row tmov'd into BT) and tstore from L0C (FIX); their Tensor-level twin is a matmul (a sum of
matmuls for an accumulation).  A chain with a matmul is a cube group (AIC tasks).

Masks and values made on chip: tcmp / tcmps (a bool tile), tsel / tsels, texpands (a fill) and
tci (an index sequence); their Tensor-level twins are the compare ops, where, full and iota.
A chain may load what another chain stored (a GM workspace the caller passes): the reference
reads the stored data, and the storing chain's group must come first (the `dependencies` pass
orders their tasks); a reload within one chain or one group is refused (use level="block").

`buffers(n)` sets the copies of the slots of the tiles traced after it (allocate's N-buffering);
`manual_sync()` makes the kernel's own `set_flag` / `wait_flag` the only flags of its program.
A flag belongs to the chain of the tile op traced before it (before any, the first one's): as
the compiler hands a loop's iterations to different cores, each iteration's sets and waits
should pair up within it.
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
# the math made from the table's rows (masks, selection, fills and TCI have functions of their own)
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
    _UNSIGNED: tuple[str, ...] = ()       # op attrs isomorphic chains may differ in (`_signature`)

    def __init__(self, ctx: TraceContext):
        self.ctx = ctx
        self.ops: list[_Op] = []
        self.parent: list[int] = []           # union-find over ops: the chains
        self.made: set[int] = set()           # tensor nodes made by tile ops
        self.consumed: dict[int, object] = {}  # tile accumulated into by tmatmul_acc -> that line
        self.nbuf: int | None = None          # buffers(n) in force
        self.manual = None                    # the line of manual_sync(), if called
        self.pending: list[int] = []          # flags traced before any tile op (the first one's chain)
        # GM round trips: the stores so far (op, window, stored value) per param, the reference's
        # contents of a param reloaded after stores, and the (load, store) pairs that overlap
        self.stores: dict[str, list] = {}
        self.contents: dict[str, Tensor] = {}
        self.folded: dict[str, int] = {}      # param -> stores already written into its contents
        self.round_trips: list[tuple[int, int]] = []

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
        if op == "TLOAD" and win[0] in self.stores:
            value = self._reloaded(k, win, dtype, loc)
        if self.nbuf is not None and space:
            attrs["buffers"] = self.nbuf
        self.ops.append(_Op(op, tuple(t.id for t in inputs), tuple(shape), dtype, space, attrs, loc, win))
        self.parent.append(k)
        for t in inputs:
            self._union(k, t.id)
        if op not in isa.SYNC_OPS:
            for f in self.pending:          # (flags before the first tile op)
                self._union(k, f)
            self.pending.clear()
        return None if value is None else Tile(self, k, tuple(shape), dtype, space, value)

    def tensor(self, op, inputs, shape, dtype, /, **attrs) -> Tensor:
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

    # --- GM round trips: a load of what the kernel stored reads it in the reference too ---------
    def reloads_refused(self, name: str) -> list:
        """The windows of `name` tload refuses to reload while tracing (a tile-level kernel's
        round trips are checked once its chains are known, in `graph`)."""
        return []

    def _reloaded(self, k: int, win, dtype, loc) -> Tensor:
        """The reference's view of a loaded window of a param the kernel has stored into: its
        contents after the stores so far (each store a `write` of the region it covers)."""
        name = win[0]
        ref = _probe(self, *win)
        stores = self.stores[name]
        self.round_trips += [(k, s) for s, w, _ in stores if ref.overlaps(_probe(self, *w))]
        for s, w, value in stores[self.folded.get(name, 0):]:
            attrs = self._region(w, self.ops[s].loc, "tstore")
            base = self.contents[name] if name in self.contents else self._param(name)
            self.contents[name] = self.tensor("write", [base, value], self._full(name), value.dtype, **attrs)
        self.folded[name] = len(stores)
        attrs = self._region(win, loc, "tload")
        return self.tensor("view", [self.contents[name]], attrs["shape"], dtype, **attrs)

    def _param(self, name: str) -> Tensor:
        node = next(n for n in self.ctx.nodes if n.op == "input" and n.attrs["param"] == name)
        return Tensor._proxy(self.ctx, node)

    def _full(self, name: str) -> tuple[int, ...]:
        return next(p for p in self.ctx.params if p.name == name).shape

    def _region(self, win, loc, what: str) -> dict:
        """The `offsets` / `shape` (/ `steps`) attrs of a window, as a view or write names it."""
        name, off, shape, strides = win
        full = self._full(name)
        if len(shape) != len(full):
            raise UnsupportedError(f"a {what} of '{name}' through a view that drops a dim, in a kernel that "
                                   "reloads what it stored", loc=loc,
                                   expected="a slice keeping every dim, e.g. x[i:i + 1, :]",
                                   got=f"a view of rank {len(shape)} of a tensor of rank {len(full)}")
        nat = natural_strides(full)
        attrs = {"offsets": _offsets(off, nat), "shape": tuple(shape)}
        steps = tuple(s // n for s, n in zip(strides, nat))
        if any(s != 1 for s in steps):
            attrs["steps"] = steps
        return attrs

    def _check_round_trips(self, group_of) -> None:
        """A chain that loads what another stored runs after it: the store's group comes first
        (the `dependencies` pass then orders their tasks by the GM windows).  A chain reloading
        its own store, or one of its own group's (the tasks of a group are not ordered), is an
        error at the load."""
        for k, s in self.round_trips:
            lo, so = self.ops[k], self.ops[s]
            where = f"the tstore of line {so.loc.line}" if so.loc else "an earlier tstore"
            if self._find(k) == self._find(s):
                raise UnsupportedError(f"tload of '{lo.win[0]}' where the same chain has already stored", loc=lo.loc,
                                       expected="loads of data another chain stored",
                                       got=f"a window overlapping {where}, in the chain of the load",
                                       hint="keep the tile on chip instead of storing and reloading it")
            if group_of[self._find(s)] >= group_of[self._find(k)]:
                raise UnsupportedError(f"tload of '{lo.win[0]}' where an iteration of the same loop has already stored", loc=lo.loc,
                                       expected="a chain reloading what an earlier, different chain stored "
                                                "(a later stage of the kernel)",
                                       got=f"a window overlapping {where}, in a chain of the same group",
                                       hint='iterations of one group are not ordered at the tile level; order them '
                                            'as tasks with @pypto.jit(level="block")')

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

    def pipeline(self, pipeline, tile_graph: TileGraph):
        """The pipeline this kernel's Tile Graph runs through (`tile_pipeline`)."""
        return tile_pipeline(pipeline, tile_graph)

    def graph(self, g: TensorGraph) -> TileGraph:
        """The Tile Graph of the traced tile ops: one group per class of isomorphic chains."""
        read = {i for o in self.ops for i in o.inputs}
        for k, o in enumerate(self.ops):
            if o.space in ("L1", "L0A", "L0B", "BT") and k not in read:
                raise UnsupportedError(f"a tile in {o.space} that nothing reads", loc=o.loc,
                                       expected="L1 -> textract / tmov -> tmatmul", got=f"an unused {o.space} tile",
                                       hint="L1 tiles feed the cube through pypto.tile.textract (L0A / L0B) or "
                                            'tmov(row, space="BT"); vector ops want tload(view, space="UB")')
            if o.op in isa.SYNC_OPS and self.manual is None:
                raise UnsupportedError(f"pypto.tile.{o.op.lower()} in a kernel the compiler synchronises", loc=o.loc,
                                       expected="pypto.tile.manual_sync() called in the kernel first",
                                       got=f"{o.op.lower()} without manual_sync()",
                                       hint="call pypto.tile.manual_sync() at the top of the kernel: the compiler "
                                            "then inserts no flags of its own")
        if self.pending:                    # a kernel of flags only
            raise UnsupportedError("a kernel with flags and no tile op", loc=self.ops[self.pending[0]].loc,
                                   expected="tile ops for the flags to order", got="only set_flag / wait_flag")
        stored = {o.win[0] for o in self.ops if o.op == "TSTORE"}
        loaded = {o.win[0] for o in self.ops if o.op == "TLOAD"}
        roles = {name: "inout" if name in loaded else "output" for name in stored}
        buffers = {p.name: GMBuffer(p.name, p.shape, p.dtype, roles.get(p.name, "input")) for p in g.params}
        chains: dict[int, list[int]] = {}
        for k in range(len(self.ops)):
            chains.setdefault(self._find(k), []).append(k)
        classes: dict[tuple, list[list[int]]] = {}
        for members in chains.values():
            classes.setdefault(self._signature(members), []).append(members)
        self._check_round_trips({c[0]: gid for gid, group in enumerate(classes.values()) for c in group})
        nodes: list[TileNode] = []
        infos = []
        for gid, group in enumerate(classes.values()):
            width = len(group[0])
            shapes = [tuple(map(max, *(self.ops[c[p]].shape for c in group))) if len(group) > 1
                      else self.ops[group[0][p]].shape for p in range(width)]
            cube = any(self.ops[k].op.startswith("TMATMUL") for k in group[0])
            self._check_flags(group[0], cube)
            for outer, members in enumerate(group):
                new_id = {}
                key_of = {}
                for p, k in enumerate(members):
                    o = self.ops[k]
                    # an accumulation writes its accumulator's tile: the same slot
                    key_of[k] = key_of[o.inputs[0]] if o.op == "TMATMUL_ACC" else f"t{p}"
                    attrs = {"key": key_of[k], **o.attrs}
                    if o.space:
                        attrs["rotate"] = True      # (memory.allocate)
                    if o.win is not None:
                        name, off, shape, strides = o.win
                        attrs["gm"] = GMRef(buffers[name], off, shape, strides)
                    new_id[k] = len(nodes)
                    store = o.op == "TSTORE"
                    nodes.append(TileNode._make(len(nodes), o.op, tuple(new_id[i] for i in o.inputs),
                                                () if store else shapes[p], () if store else o.shape, o.dtype,
                                                o.space, gid, outer, 0, Attrs.of(attrs), o.loc, outer))
            first = self.ops[group[0][0]]
            st = next((self.ops[k].win for k in group[0] if self.ops[k].op == "TSTORE"), None)
            if cube:
                domain, tile = self._cube_shape(group[0], shapes, buffers[st[0]].shape if st else None)
            else:
                tile = next((shapes[p] for p, k in enumerate(group[0]) if self.ops[k].op == "TLOAD"), shapes[0])
                domain = buffers[st[0]].shape if st else tile
            infos.append(GroupInfo(gid, "cube" if cube else "vector", tuple(domain), tuple(tile), len(group), 1,
                                   first.loc))
        out = TileGraph(g.name, tuple(buffers.values()), tuple(infos), tuple(nodes))
        if self.manual is not None:
            out.__dict__[MANUAL_SYNC] = True
        return out

    def _cube_shape(self, members: list[int], shapes, out_shape) -> tuple[tuple, tuple]:
        """(domain (1, M, K, N), tile (mL0, kL0, nL0, kL1)) of a cube chain: K the depth its
        matmuls add up, kL0 / kL1 the depth of its first L0A / L1 tile of A."""
        pos = {k: p for p, k in enumerate(members)}
        mms = [k for k in members if self.ops[k].op.startswith("TMATMUL")]
        a0 = self.ops[mms[0]].inputs[-2]
        l1 = self.ops[a0].inputs[0]
        m, n = shapes[pos[mms[0]]]
        k = sum(self.ops[self.ops[j].inputs[-2]].shape[1] for j in mms)
        M, N = out_shape[-2:] if out_shape else (m, n)
        return (1, M, k, N), (m, shapes[pos[a0]][1], n, shapes[pos[l1]][1])

    def _check_flags(self, members: list[int], cube: bool) -> None:
        """A chain's flags name pipes of the core that runs it."""
        pipes = ("MTE2", "MTE1", "M", "FIX") if cube else ("MTE2", "V", "MTE3")
        for k in members:
            o = self.ops[k]
            if o.op in isa.SYNC_OPS:
                bad = [p for p in (o.attrs["src"], o.attrs["dst"]) if p not in pipes]
                if bad:
                    raise UnsupportedError(f"{o.op.lower()} names the {bad[0]} pipe, which the "
                                           f"{'AIC' if cube else 'AIV'} running this chain does not have",
                                           loc=o.loc, expected=", ".join(pipes), got=bad[0])

    def _signature(self, members: list[int]) -> tuple:
        """What isomorphic chains share: per op its instruction, dtype, space, rank, attrs, the
        chain positions of its inputs and the tensor it loads or stores (not the shapes, nor the
        first value of a TCI: a loop's row index starts where its iteration does, as the
        compiler's own tiling makes it)."""
        pos = {k: p for p, k in enumerate(members)}
        out = []
        for k in members:
            o = self.ops[k]
            attrs = tuple(sorted((a, repr(v)) for a, v in o.attrs.items()
                                 if a not in self._UNSIGNED and not (a == "start" and o.op == "TCI")))
            out.append((o.op, o.dtype.name, o.space, len(o.shape), tuple(pos[i] for i in o.inputs),
                        attrs, o.win[0] if o.win else None))
        return tuple(out)


# TileGraph side table: the kernel called manual_sync() (its flags are the program's only ones)
MANUAL_SYNC = "_manual_sync"


def tile_pipeline(pipeline, tile_graph: TileGraph):
    """The passes of `pipeline` after its Tensor -> Tile lowering, behind a lowering that gives
    the kernel's own Tile Graph.  A manually synchronised kernel (`manual_sync`) keeps its
    instruction order (no list scheduling) and its own flags (insert_sync adds none)."""
    from ..compiler.pipeline import Pass, Pipeline
    cut = next((i for i, p in enumerate(pipeline.passes) if p.level == "tensor->tile"), None)
    if cut is None:
        raise PyptoError("a tile-level kernel needs a pipeline with a Tensor -> Tile lowering to start after",
                         expected="a pipeline with the 'tiling' pass", got=[p.name for p in pipeline.passes])
    given = Pass("tile_kernel", "tensor->tile", lambda g, ctx: tile_graph,
                 "the Tile Graph the tile-level kernel wrote (no automatic tiling or fusion)")
    rest = pipeline.passes[cut + 1:]
    if tile_graph.__dict__.get(MANUAL_SYNC):
        rest = [Pass("insert_sync", "exec", lambda g, ctx: g, "manual sync: the kernel's own SET_FLAG / WAIT_FLAG")
                if p.name == "insert_sync" else p for p in rest if p.name != "scheduling"]
    return Pipeline([given, *rest])


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
    refused = tr.reloads_refused(name)
    if refused:
        ref = _probe(tr, name, off, shape, strides)
        if any(ref.overlaps(_probe(tr, *w)) for w in refused):
            raise UnsupportedError(f"tload of '{name}' where the kernel has already stored", loc=loc,
                                   expected="loads of data the kernel has not written",
                                   got=f"a window of {name} overlapping an earlier tstore",
                                   hint="keep the tile on chip instead of storing and reloading it")
    _fits(tr, space, shape, view.dtype, loc, "load a smaller view (fewer rows per loop step)")
    return tr.add("TLOAD", [], shape, view.dtype, space, loc, value=view, win=(name, off, shape, strides))


def tstore(view, tile: Tile) -> None:
    """TSTORE: a UB tile (MTE3) or an L0C accumulator (FIX, converting to the view's dtype) into
    a view of a kernel tensor (`out[i:i + TM, :]`) of its shape."""
    tr = TileTrace.current("tstore")
    loc = user_loc()
    name, off, shape, strides = tr.window(view, "tstore")
    _tiles(tr, "tstore", [tile])
    if tile.space not in ("UB", "L0C"):
        raise UnsupportedError(f"tstore of a tile in {tile.space}", loc=loc, expected="UB -> GM (or L0C -> GM)",
                               got=f"{tile.space} -> GM")
    if tuple(shape) != tile.shape:
        raise ShapeError("tstore: the view and the tile differ in shape", loc=loc,
                         expected=fmt_shape(tile.shape), got=f"view {fmt_shape(shape)}")
    value = tile.value
    if tile.space == "L0C" and view.dtype != tile.dtype:
        if view.dtype.is_float != tile.dtype.is_float:
            raise DTypeError(f"tstore of a {tile.dtype} accumulator into {view.dtype} '{name}'", loc=loc,
                             expected="a floating-point view for a floating-point accumulator" if tile.dtype.is_float
                             else "an integer view", got=str(view.dtype))
        value = tr.tensor("cast", [value], tile.shape, view.dtype, to=view.dtype.name)    # FIX converts
    elif view.dtype != tile.dtype:
        raise DTypeError(f"tstore of a {tile.dtype} tile into {view.dtype} '{name}'", loc=loc,
                         expected=str(view.dtype), got=str(tile.dtype), hint="convert it first: pypto.tile.tcvt")
    full = tr._full(name)
    if len(shape) != len(full):
        raise UnsupportedError("tstore into a view that drops a dim", loc=loc,
                               expected="a slice keeping every dim, e.g. out[i:i + 1, :]",
                               got=f"view {fmt_shape(shape)} of {fmt_shape(full)}")
    win = (name, off, shape, strides)
    tr.tensor("store", [value], tuple(shape), view.dtype, param=name, **tr._region(win, loc, "tstore"))
    tr.add("TSTORE", [tile], (), view.dtype, "", loc, win=win)
    tr.stores.setdefault(name, []).append((len(tr.ops) - 1, win, value))


# --- the cube path -----------------------------------------------------------------------------

def _fits(tr: TileTrace, space: str, shape, dtype, loc, hint: str) -> None:
    caps = _machine_caps(tr)
    nbytes = tile_bytes(tuple(shape), dtype)
    if caps is not None and nbytes > caps[space]:
        raise TileShapeError(f"the tile does not fit {space}", loc=loc,
                             expected=f"at most {caps[space] / 1024:g} KiB of {space}",
                             got=f"{dtype}{fmt_shape(shape)} = {nbytes / 1024:.1f} KiB", hint=hint)


def _in_space(t: Tile, spaces: tuple[str, ...], what: str, loc, hint: str | None = None) -> None:
    if t.space not in spaces:
        raise UnsupportedError(f"{what} takes a tile in {' or '.join(spaces)}", loc=loc,
                               expected="a tile in " + " or ".join(spaces), got=f"a tile in {t.space}", hint=hint)


def textract(tile: Tile, space: str, offsets=(0, 0), shape=None) -> Tile:
    """TEXTRACT (MTE1): the window `shape` at `offsets` of an L1 tile (the whole tile by default)
    into L0A (a matmul's left operand) or L0B (its right one)."""
    tr, loc = TileTrace.current("textract"), user_loc()
    _tiles(tr, "textract", [tile])
    _in_space(tile, ("L1",), "textract", loc, hint='stage it in L1 first: tload(view, space="L1")')
    if space not in ("L0A", "L0B"):
        raise UnsupportedError(f"textract into {space!r}", loc=loc, expected="L0A or L0B",
                               got=f"L1 -> {space}", hint='a bias row goes to BT with tmov(row, space="BT")')
    if tile.ndim != 2:
        raise ShapeError(f"textract of a tile of rank {tile.ndim}", loc=loc, expected="a 2-D L1 tile",
                         got=fmt_shape(tile.shape))
    offsets = tuple(int(o) for o in offsets)
    shape = tuple(int(d) for d in (shape if shape is not None else
                                   (a - o for a, o in zip(tile.shape, offsets))))
    if len(offsets) != 2 or len(shape) != 2 or any(o < 0 or d <= 0 or o + d > a
                                                   for o, d, a in zip(offsets, shape, tile.shape)):
        raise ShapeError("textract: the window is not inside the L1 tile", loc=loc,
                         expected=f"offsets + shape within {fmt_shape(tile.shape)}",
                         got=f"offsets {offsets}, shape {fmt_shape(shape)}")
    _fits(tr, space, shape, tile.dtype, loc, "extract a smaller window (shape=...) and accumulate over K")
    value = tile.value[offsets[0]:offsets[0] + shape[0], offsets[1]:offsets[1] + shape[1]]
    return tr.add("TEXTRACT", [tile], shape, tile.dtype, space, loc, value=value, offsets=offsets)


def tmov(tile: Tile, space: str) -> Tile:
    """TMOV (MTE1): a bias row [1, N] of an L1 tile into the bias table (space="BT")."""
    tr, loc = TileTrace.current("tmov"), user_loc()
    _tiles(tr, "tmov", [tile])
    if tile.space == "L0C" and space == "UB":
        raise UnsupportedError("tmov L0C -> UB is not an instruction of this machine's table yet", loc=loc,
                               expected='tmov(l1_row, space="BT")', got="L0C -> UB",
                               hint="tstore the accumulator to GM, then tload it into UB in a vector chain")
    _in_space(tile, ("L1",), "tmov", loc)
    if space != "BT":
        raise UnsupportedError(f"tmov into {space!r}", loc=loc, expected="L1 -> BT (a bias row)",
                               got=f"{tile.space} -> {space}", hint="L0A / L0B are filled by textract")
    if tile.ndim != 2 or tile.shape[0] != 1:
        raise ShapeError("tmov: a bias row is one row", loc=loc, expected="[1, N]", got=fmt_shape(tile.shape))
    _fits(tr, "BT", tile.shape, tile.dtype, loc, "a narrower bias row (fewer columns per output tile)")
    return tr.add("TMOV", [tile], tile.shape, tile.dtype, "BT", loc, value=tile.value)


def _acc_dtype(dtype: dt.DType) -> dt.DType:
    return dt.DT_INT32 if dtype == dt.DT_INT8 else dt.DT_FP32


def _product(tr: TileTrace, name: str, a: Tile, b: Tile, loc) -> tuple[tuple[int, int], dt.DType, Tensor]:
    """The checks of a matmul's operands; its shape, accumulator dtype and Tensor-level product."""
    _tiles(tr, name, [a, b])
    for t, want, which in ((a, "L0A", "left"), (b, "L0B", "right")):
        if t.space != want:
            raise UnsupportedError(f"{name}: the {which} operand is in {t.space}", loc=loc,
                                   expected=f"the {which} operand in {want}", got=f"a tile in {t.space}",
                                   hint=f'extract it: pypto.tile.textract(l1_tile, space="{want}")')
    if a.dtype != b.dtype:
        raise DTypeError(f"{name}: the operands differ in dtype", loc=loc, expected=f"{a.dtype} x {a.dtype}",
                         got=f"{a.dtype} x {b.dtype}")
    if a.dtype not in (dt.DT_FP16, dt.DT_BF16, dt.DT_FP32, dt.DT_INT8):
        raise DTypeError(f"{name}: the cube does not multiply {a.dtype}", loc=loc, expected="fp16, bf16, fp32 or int8",
                         got=str(a.dtype))
    if a.shape[1] != b.shape[0]:
        raise ShapeError(f"{name}: K differs", loc=loc, expected=f"[M, K] x [K, N] with K = {a.shape[1]}",
                         got=f"{fmt_shape(a.shape)} x {fmt_shape(b.shape)}")
    shape, acc = (a.shape[0], b.shape[1]), _acc_dtype(a.dtype)
    _fits(tr, "L0C", shape, acc, loc, "a smaller output tile (fewer rows of A or columns of B)")
    value = tr.tensor("matmul", [a.value, b.value], shape, acc, a_trans=False, b_trans=False, out_dtype=acc.name)
    return shape, acc, value


def tmatmul(a: Tile, b: Tile) -> Tile:
    """TMATMUL (M): L0A [M, K] x L0B [K, N] -> a new L0C accumulator [M, N] (fp32; int32 for int8)."""
    tr, loc = TileTrace.current("tmatmul"), user_loc()
    shape, acc, value = _product(tr, "tmatmul", a, b, loc)
    return tr.add("TMATMUL", [a, b], shape, acc, "L0C", loc, value=value)


def tmatmul_acc(acc: Tile, a: Tile, b: Tile) -> Tile:
    """TMATMUL_ACC (M): acc += a x b, in place; use the tile it returns (acc is overwritten)."""
    tr, loc = TileTrace.current("tmatmul_acc"), user_loc()
    _tiles(tr, "tmatmul_acc", [acc])
    shape, dtype, value = _product(tr, "tmatmul_acc", a, b, loc)
    _in_space(acc, ("L0C",), "tmatmul_acc (its accumulator)", loc, hint="start it with pypto.tile.tmatmul(a, b)")
    if acc.shape != shape or acc.dtype != dtype:
        raise ShapeError("tmatmul_acc: the accumulator does not match the product", loc=loc,
                         expected=f"{dtype}{fmt_shape(shape)}", got=f"{acc.dtype}{fmt_shape(acc.shape)}")
    tr.consumed[acc.id] = loc
    return tr.add("TMATMUL_ACC", [acc, a, b], shape, dtype, "L0C", loc,
                  value=tr.tensor("add", [acc.value, value], shape, dtype))


def tmatmul_bias(bias: Tile, a: Tile, b: Tile) -> Tile:
    """TMATMUL_BIAS (M): a new L0C accumulator = the BT bias row [1, N] + a x b."""
    tr, loc = TileTrace.current("tmatmul_bias"), user_loc()
    _tiles(tr, "tmatmul_bias", [bias])
    shape, dtype, value = _product(tr, "tmatmul_bias", a, b, loc)
    _in_space(bias, ("BT",), "tmatmul_bias (its bias)", loc, hint='move the row: tmov(l1_row, space="BT")')
    if bias.shape != (1, shape[1]):
        raise ShapeError("tmatmul_bias: the bias row does not match the product", loc=loc,
                         expected=fmt_shape((1, shape[1])), got=fmt_shape(bias.shape))
    row = bias.value if bias.dtype == dtype else tr.tensor("cast", [bias.value], bias.shape, dtype, to=dtype.name)
    return tr.add("TMATMUL_BIAS", [bias, a, b], shape, dtype, "L0C", loc,
                  value=tr.tensor("add", [value, row], shape, dtype))


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
        if t.id in tr.consumed:
            line = tr.consumed[t.id]
            raise UnsupportedError(f"pypto.tile.{name} of an accumulator tmatmul_acc has since added to",
                                   loc=user_loc(), expected="the tile tmatmul_acc returned",
                                   got="the tile before the tmatmul_acc" + (f" of line {line.line}" if line else ""),
                                   hint="acc = pypto.tile.tmatmul_acc(acc, a, b)")


def _tensor_op(kind: str, fn: str) -> str:
    return next(name for name, r in OPS.items() if r.kind == kind and r.tile == fn)


def _make(ins: isa.Instruction):
    """The pypto.tile function of one instruction row (its name in lower case)."""
    name = ins.name.lower()
    kind = ins.kind
    op = _tensor_op(_KINDS[kind], ins.fn) if kind != "cvt" else "cast"
    float_only = OPS[op].float_only

    def check(tr, tiles, loc):
        _vector_tiles(tr, name, tiles, loc)
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
            to = _dtype(name, dtype, loc)
            value = tr.tensor("cast", [t.value], t.shape, to, to=to.name)
            return emit(tr, [t], t.shape, to, value, loc, to=to.name)
    elif kind == "scalar":
        def f(t, scalar):
            tr, loc = TileTrace.current(name), user_loc()
            check(tr, [t], loc)
            _number(name, "the scalar", scalar, loc)
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


# --- masks, selection and values made from nothing (TCMP / TCMPS, TSEL / TSELS, TEXPANDS, TCI) --

def _vector_tiles(tr: TileTrace, name: str, tiles, loc) -> None:
    _tiles(tr, name, tiles)
    for t in tiles:
        if t.space != "UB":
            raise UnsupportedError(f"{name} works on UB tiles (the vector unit's buffer)", loc=loc,
                                   expected="tiles in UB", got=f"a tile in {t.space}",
                                   hint='load it with pypto.tile.tload(view, space="UB")')


def _cmp_mode(name: str, cmp, loc) -> str:
    mode = cmp.upper() if isinstance(cmp, str) else cmp
    if mode not in isa.COMPARE_MODES:
        raise UnsupportedError(f"{name}: unknown comparison {cmp!r}", loc=loc,
                               expected=" ".join(isa.COMPARE_MODES), got=repr(cmp))
    return mode


def _number(name: str, what: str, v, loc) -> None:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise DTypeError(f"{name}: {what} must be a Python number", loc=loc, expected="an int or a float",
                         got=repr(v)[:60])


def _scalar_of(tr: TileTrace, name: str, v, dtype: dt.DType, loc):
    """A Python number as a value of `dtype` (refused when an integer dtype would truncate it)."""
    _number(name, "the scalar", v, loc)
    if not dtype.is_float and v != int(v):
        raise DTypeError(f"{name}: the scalar {v!r} would be truncated to {dtype}", loc=loc,
                         expected=f"an integer for a {dtype} tile", got=repr(v))
    v = float(v) if dtype.is_float else int(v)
    return v, tr.tensor("const", [], (), dtype, value=v)


def tcmp(a: Tile, b: Tile, cmp: str = "GT") -> Tile:
    """TCMP: a mask tile (bool) of `a <cmp> b`, element-wise on two UB tiles of one shape and
    dtype (cmp: EQ NE LT LE GT GE)."""
    tr, loc = TileTrace.current("tcmp"), user_loc()
    _vector_tiles(tr, "tcmp", [a, b], loc)
    mode = _cmp_mode("tcmp", cmp, loc)
    if a.dtype != b.dtype:
        raise DTypeError("tcmp: the tiles differ in dtype", loc=loc, expected=f"two {a.dtype} tiles",
                         got=f"{a.dtype} and {b.dtype}", hint="convert one with pypto.tile.tcvt")
    if a.shape != b.shape:
        raise ShapeError("tcmp: the tiles differ in shape", loc=loc, expected=fmt_shape(a.shape),
                         got=f"{fmt_shape(a.shape)} and {fmt_shape(b.shape)}",
                         hint="broadcast a row vector first: pypto.tile.trowexpand")
    value = tr.tensor(mode.lower(), [a.value, b.value], a.shape, dt.DT_BOOL)
    return tr.add("TCMP", [a, b], a.shape, dt.DT_BOOL, "UB", loc, value=value, cmp=mode)


def tcmps(a: Tile, scalar, cmp: str = "GT") -> Tile:
    """TCMPS: a mask tile (bool) of `a <cmp> scalar` (cmp: EQ NE LT LE GT GE)."""
    tr, loc = TileTrace.current("tcmps"), user_loc()
    _vector_tiles(tr, "tcmps", [a], loc)
    mode = _cmp_mode("tcmps", cmp, loc)
    v, c = _scalar_of(tr, "tcmps", scalar, a.dtype, loc)
    value = tr.tensor(mode.lower(), [a.value, c], a.shape, dt.DT_BOOL)
    return tr.add("TCMPS", [a], a.shape, dt.DT_BOOL, "UB", loc, value=value, cmp=mode, scalar=v)


def _mask(name: str, mask: Tile, a: Tile, loc) -> None:
    if mask.dtype != dt.DT_BOOL:
        raise DTypeError(f"{name}: the first tile is not a mask", loc=loc, expected="a bool tile (from tcmp / tcmps)",
                         got=str(mask.dtype), hint="make one with pypto.tile.tcmp(a, b, cmp=...)")
    if mask.shape != a.shape:
        raise ShapeError(f"{name}: the mask and the values differ in shape", loc=loc, expected=fmt_shape(a.shape),
                         got=f"mask {fmt_shape(mask.shape)}, values {fmt_shape(a.shape)}")


def tsel(mask: Tile, a: Tile, b: Tile) -> Tile:
    """TSEL: `a` where the mask is set, else `b` (three UB tiles of one shape)."""
    tr, loc = TileTrace.current("tsel"), user_loc()
    _vector_tiles(tr, "tsel", [mask, a, b], loc)
    _mask("tsel", mask, a, loc)
    if a.dtype != b.dtype or a.shape != b.shape:
        raise DTypeError("tsel: the two values differ", loc=loc, expected=f"two {a.dtype}{fmt_shape(a.shape)} tiles",
                         got=f"{a.dtype}{fmt_shape(a.shape)} and {b.dtype}{fmt_shape(b.shape)}")
    value = tr.tensor("where", [mask.value, a.value, b.value], a.shape, a.dtype)
    return tr.add("TSEL", [mask, a, b], a.shape, a.dtype, "UB", loc, value=value)


def tsels(mask: Tile, a: Tile, scalar) -> Tile:
    """TSELS: `a` where the mask is set, else the scalar."""
    tr, loc = TileTrace.current("tsels"), user_loc()
    _vector_tiles(tr, "tsels", [mask, a], loc)
    _mask("tsels", mask, a, loc)
    v, c = _scalar_of(tr, "tsels", scalar, a.dtype, loc)
    value = tr.tensor("where", [mask.value, a.value, c], a.shape, a.dtype)
    return tr.add("TSELS", [mask, a], a.shape, a.dtype, "UB", loc, value=value, scalar=v)


def _new_tile(name: str, shape, dtype, space, loc) -> tuple[tuple[int, ...], dt.DType]:
    if space != "UB":
        raise UnsupportedError(f"{name} makes a UB tile", loc=loc, expected='space="UB"', got=repr(space))
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    try:
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise ShapeError(f"{name}: a tile shape is a tuple of positive ints", loc=loc, expected="e.g. (64, 64)",
                         got=repr(shape))
    return shape, _dtype(name, dtype, loc)


def _dtype(name: str, dtype, loc) -> dt.DType:
    """A pypto dtype, or its name ("fp16")."""
    to = dt.parse(dtype) if isinstance(dtype, str) and dtype in dt.BY_NAME else dtype
    if not isinstance(to, dt.DType):
        raise DTypeError(f"{name}: unsupported dtype", loc=loc, expected=dt.supported_names(), got=repr(dtype))
    return to


def texpands(shape, value, dtype=dt.DT_FP32, space: str = "UB") -> Tile:
    """TEXPANDS: a new UB tile of `shape` and `dtype`, every element `value` (a fill)."""
    tr, loc = TileTrace.current("texpands"), user_loc()
    shape, to = _new_tile("texpands", shape, dtype, space, loc)
    _fits(tr, "UB", shape, to, loc, "a smaller tile")
    v, _ = _scalar_of(tr, "texpands", value, to, loc)
    value_t = tr.tensor("full", [], shape, to, shape=shape, value=v)
    return tr.add("TEXPANDS", [], shape, to, "UB", loc, value=value_t, scalar=v)


def tci(shape, dim: int = -1, start=0, step=1, dtype=dt.DT_INT32) -> Tile:
    """TCI: a new UB tile of `shape` whose element is start + i * step, i its index along `dim`
    (the same along the other dims): a row or column index, e.g. for a causal mask."""
    tr, loc = TileTrace.current("tci"), user_loc()
    shape, to = _new_tile("tci", shape, dtype, "UB", loc)
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or not -len(shape) <= dim < len(shape):
        raise ShapeError("tci: dim out of range", loc=loc, expected=f"-{len(shape)} .. {len(shape) - 1}",
                         got=repr(dim))
    d = int(dim) % len(shape)
    for v, what in ((start, "start"), (step, "step")):
        _number("tci", what, v, loc)
    if not to.is_float and (start != int(start) or step != int(step)):
        raise DTypeError("tci: a float start or step for an integer tile", loc=loc, expected="ints",
                         got=f"start={start!r}, step={step!r}", hint="dtype=pypto.DT_FP32 for a float sequence")
    start, step = (float(start), float(step)) if to.is_float else (int(start), int(step))
    _fits(tr, "UB", shape, to, loc, "a smaller tile")
    value = tr.tensor("iota", [], shape, to, shape=shape, dim=d, start=start, step=step)
    return tr.add("TCI", [], shape, to, "UB", loc, value=value, dim=d, start=start, step=step)


# --- buffering and flags -------------------------------------------------------------------------

class _Buffers:
    """What `buffers(n)` returns: as a context manager, it restores the count before it on exit."""

    def __init__(self, tr: TileTrace, before):
        self._tr, self._before = tr, before

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._tr.nbuf = self._before


def buffers(n: int) -> _Buffers:
    """The copies of every slot of the tiles traced from here on (2: double buffering, the next
    iteration's loads overlap this one's compute; 1: none); `with pypto.tile.buffers(n):` for a
    block of the kernel only.  Without it the compiler's default (2 where it fits) holds."""
    tr, loc = TileTrace.current("buffers"), user_loc()
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= n <= 8:
        raise UnsupportedError("pypto.tile.buffers takes a count of buffers", loc=loc, expected="an int from 1 to 8",
                               got=repr(n)[:60])
    before, tr.nbuf = tr.nbuf, int(n)
    return _Buffers(tr, before)


def manual_sync() -> None:
    """The kernel synchronises its pipes itself with set_flag / wait_flag: the compiler keeps its
    instruction order and inserts no flags (a missing wait is a race checked simulation reports)."""
    TileTrace.current("manual_sync").manual = user_loc()


PIPES = ("MTE2", "V", "MTE3", "MTE1", "M", "FIX")


def _flag(op: str, src_pipe: str, dst_pipe: str, event_id: int) -> None:
    from ..ir.exec import EVENTS_PER_PIPE_PAIR
    tr, loc = TileTrace.current(op.lower()), user_loc()
    for p in (src_pipe, dst_pipe):
        if p not in PIPES:
            raise UnsupportedError(f"{op.lower()}: unknown pipe {p!r}", loc=loc, expected=", ".join(PIPES), got=repr(p))
    if src_pipe == dst_pipe:
        raise UnsupportedError(f"{op.lower()} from a pipe to itself", loc=loc, expected="two different pipes",
                               got=f"{src_pipe} -> {dst_pipe}", hint="a pipe runs its instructions in order")
    if isinstance(event_id, bool) or not isinstance(event_id, numbers.Integral) or \
            not 0 <= event_id < EVENTS_PER_PIPE_PAIR:
        raise UnsupportedError(f"{op.lower()}: event id out of range", loc=loc,
                               expected=f"0 .. {EVENTS_PER_PIPE_PAIR - 1}", got=repr(event_id))
    tr.add(op, [], (), dt.DT_INT32, "", loc, src=src_pipe, dst=dst_pipe, event=int(event_id))
    k = len(tr.ops) - 1
    last = next((j for j in range(k - 1, -1, -1) if tr.ops[j].op not in isa.SYNC_OPS), None)
    if last is None:
        tr.pending.append(k)            # before any tile op: the first one's chain
    else:
        tr._union(last, k)


def set_flag(src_pipe: str, dst_pipe: str, event_id: int) -> None:
    """SET_FLAG: `src_pipe` signals event `event_id` to `dst_pipe` once its instructions so far
    are done (needs manual_sync())."""
    _flag("SET_FLAG", src_pipe, dst_pipe, event_id)


def wait_flag(src_pipe: str, dst_pipe: str, event_id: int) -> None:
    """WAIT_FLAG: `dst_pipe` waits for event `event_id` from `src_pipe` (needs manual_sync())."""
    _flag("WAIT_FLAG", src_pipe, dst_pipe, event_id)


OPERATIONS: dict[str, object] = {"tload": tload, "tstore": tstore, "textract": textract, "tmov": tmov,
                                 "tmatmul": tmatmul, "tmatmul_acc": tmatmul_acc, "tmatmul_bias": tmatmul_bias,
                                 "tcmp": tcmp, "tcmps": tcmps, "tsel": tsel, "tsels": tsels,
                                 "texpands": texpands, "tci": tci}
for _ins in isa.INSTRUCTIONS.values():
    if _ins.kind in _KINDS and _ins.fn in _MATH and _ins.form in ("", "S", "ROW", "COL", "ROWEXPAND", "COLEXPAND"):
        OPERATIONS[_ins.name.lower()] = globals()[_ins.name.lower()] = _make(_ins)
del _ins

__all__ = ["PIPES", "Tile", "buffers", "manual_sync", "set_flag", "wait_flag", *OPERATIONS]
