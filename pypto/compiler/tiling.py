"""Lowering Tensor Graph -> Tile Graph: each fusion group becomes a loop over tiles.

Values that live in GM get a *home* window: kernel inputs their parameter, stored values the
output region they are stored to, other materialised values a workspace buffer.  A vector group
loads the tiles of its GM inputs into UB, runs its ops tile by tile (reductions across several
tiles accumulate in a persistent tile) and stores the tiles that must reach GM; the first
iteration of each shape (tail tiles or not) is lowered op by op, the others replay its nodes at
their own offsets (`_Plan`); a group whose outer iterations are alike and apart (as many nodes
each, no input from an earlier one, no GM window loaded twice) stays a loop (`NodeLoop`), whose
iterations replay the plans when a pass reads them.  A matmul group
walks output tiles; for each it streams K through L1 (kL1) and L0A/L0B (kL0) into L0C, its
first product starting from the bias row in the bias table when the group has a bias epilogue,
and stores the tile through the FIX pipe (which applies a ReLU epilogue on the way).
"""
from __future__ import annotations

import functools
import itertools
import operator

from ..dtypes import DT_FP32, DT_INT32
from ..errors import ShapeError, UnsupportedError
from ..ir.core import Attrs, ceil_div, prod
from ..ir.gm import GMBuffer, GMRef
from ..ir.tensor import OPS, TensorGraph
from ..ir.tile import GroupInfo, LoopPart, LoopTileGraph, NodeLoop, TileGraph, TileNode
from ..target.isa import ATTRS, find, opcodes
from ..target.isa import row as isa_row
from .pipeline import PassContext
from .layout import transpose_source
from .tileshape import cube_nest, matmul_cube_tile, shared_panel

# Every tile is unrolled into the program: beyond this many tile ops a compile takes minutes and
# gigabytes, so it is refused up front with the tile count and a hint (larger tiles)
MAX_TILE_OPS = 2_000_000


_make_node = TileNode._make
_new = object.__new__


class _At:
    """An attribute value that depends on where the iteration's tile starts (a GM window, an
    iota's first value): `fn(start)`.  `emit` gives its node `fn(em.start)`; a recorded
    `_Plan` keeps fn, to give the nodes of later iterations of the same shape their own."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn


class _Emitter:
    """Appends tile nodes for one group, tracking the current iteration (`start`: where its
    tile starts in the domain, a vector group's).  While `recorded` is a list, `emit` also
    appends to it what a `_Plan` of the iteration needs of each node."""

    def __init__(self, nodes: list[TileNode], group: int):
        self.nodes, self.group = nodes, group
        self.outer = self.inner = self.lin = 0
        self.start = None
        self.recorded = None
        # the group's iteration with the most nodes (the first such): (how many, first position,
        # end), for the graph's "groups" fact (TileGraph.facts); `distinct_loads`: the group's
        # outer iterations load no GM window twice (as far as its lowering knows)
        self.longest = (0, len(nodes), len(nodes))
        self.distinct_loads = False

    def iteration_done(self, first: int) -> None:
        """Note an iteration, whose nodes are those from position `first` on."""
        if len(self.nodes) - first > self.longest[0]:
            self.longest = (len(self.nodes) - first, first, len(self.nodes))

    def emit(self, op, inputs, shape, valid, dtype, space, key, loc, persistent=False, **attrs) -> int:
        """Append a node; its `par` is the outer index if `persistent` (one tile per outer
        iteration), else the linear one."""
        nodes = self.nodes
        nid = len(nodes)
        attrs["key"] = key
        if persistent:
            attrs["persistent"] = True
        varying = [(k, v.fn) for k, v in attrs.items() if type(v) is _At]
        for k, fn in varying:
            attrs[k] = fn(self.start)
        node = _make_node(nid, op, tuple(inputs), tuple(shape), tuple(valid), dtype, space, self.group,
                          self.outer, self.inner, Attrs.of(attrs), loc, self.outer if persistent else self.lin)
        nodes.append(node)
        if self.recorded is not None:
            self.recorded.append((node, varying, persistent))
        return nid

    def node(self, i) -> TileNode:
        return self.nodes[i]


class _Plan:
    """The tile nodes one iteration of a vector group appends, worked out once (by the lowering
    itself, `emit` recording them) and replayed for every later iteration of the same shape
    (`_lower_vector`: the same last tiles, hence tile extents, and first inner step or not make
    the same decisions).  A replayed node differs from its recorded twin only in what depends on the
    iteration: its id and inputs (the iteration's own nodes, at the same places after its first
    id; the accumulator of a reduction, the one `acc` holds then), its `outer`/`inner`, its
    `par` (the outer index if persistent, else the linear one) and its `_At` attributes.  The
    nodes and their attributes come out exactly as the lowering would make them, in its order;
    a node without `_At` attributes shares its recorded twin's attribute map.
    """

    __slots__ = ("steps", "acc_out", "gm")

    @staticmethod
    def of(recorded: list, base: int, acc_before: dict[int, int], acc: dict[int, int]) -> "_Plan | None":
        """The plan of an iteration whose nodes (from id `base`) `emit` recorded, `acc` the
        accumulators before and after it; None when it cannot be replayed (an input from an
        earlier iteration that is no accumulator)."""
        acc_of = {nid: mid for mid, nid in acc_before.items()}     # earlier node -> its reduction
        steps = []
        for n, varying, persistent in recorded:
            rel, from_acc = [], []
            for pos, i in enumerate(n.inputs):
                if i >= base:
                    rel.append(i - base)
                elif i in acc_of:
                    rel.append(0)           # (a place holder: replay puts the accumulator there)
                    from_acc.append((pos, acc_of[i]))
                else:
                    return None
            steps.append((n.op, tuple(rel), tuple(from_acc), n.shape, n.valid, n.dtype, n.space,
                          n.attrs, tuple(varying), persistent, n.loc))
        p = _Plan()
        p.steps = steps
        p.gm = None
        p.acc_out = [(mid, nid - base) for mid, nid in acc.items() if nid >= base]
        return p

    def replay(self, em: _Emitter, start: tuple, acc: dict[int, int]) -> None:
        """Append the nodes of the current iteration of `em` (tile at `start`)."""
        self.made(em.nodes, len(em.nodes), em.group, em.outer, em.inner, em.lin, start, acc, None, None, None, False)

    def made(self, out: list, base: int, group: int, outer: int, inner: int, lin: int, start: tuple, acc: dict,
             spaces, place, dropped, gm_only: bool) -> int:
        """The nodes of an iteration (its tile at `start`, its counters `outer`, `inner`, `lin`,
        `acc` the accumulators of its reductions) appended to `out` with ids from `base`; the id
        after them returned.  For a loop's `make` (`_VectorLoop`, see `NodeLoop.make`): the
        spaces `spaces` gives the nodes still in "?", the maps `place` gives the nodes with a
        space, the loads in `dropped` left out (their readers read the load it names), only the
        nodes with a GM window if `gm_only`.  A node's map is placed as its recorded twin's
        (placements are per map: the recorded one's is worked out once), then its `_At` values
        put in."""
        append = out.append
        q = "?"
        steps = self.steps
        for j in (self._gm_steps() if gm_only else range(len(steps))):
            nid = base + j
            if dropped is not None and nid in dropped:
                continue
            op, rel, from_acc, shape, valid, dtype, space, attrs, varying, persistent, loc = steps[j]
            inputs = tuple([base + r for r in rel])
            if from_acc:
                ins = list(inputs)
                for pos, mid in from_acc:
                    ins[pos] = acc[mid]
                inputs = tuple(ins)
            if dropped is not None and inputs:
                inputs = tuple([dropped.get(i, i) for i in inputs])
            if space == q and spaces is not None:
                space = spaces.get((op, attrs._dict["key"]), q)
            par = outer if persistent else lin
            a = place(attrs, par) if place is not None and space and space != q else attrs
            if varying:
                d = a._dict.copy()          # (its keys in the recorded order: values replaced in place)
                for k, fn in varying:
                    d[k] = fn(start)
                a = _new(Attrs)
                a._dict, a._sorted = d, None
            append(_make_node(nid, op, inputs, shape, valid, dtype, space, group, outer, inner, a, loc, par))
        for mid, r in self.acc_out:
            acc[mid] = base + r
        return base + len(steps)

    def windows(self, out: list, base: int, start: tuple, dropped) -> int:
        """(op, GM window) of each node `made(..., gm_only=True)` would append, in order, without
        the nodes (a twin task's windows, `NodeLoop.windows`); the id after them."""
        steps = self.steps
        for j in self._gm_steps():
            if dropped is not None and base + j in dropped:
                continue
            st = steps[j]
            gm = st[7]._dict["gm"]
            for k, fn in st[8]:
                if k == "gm":
                    gm = fn(start)
            out.append((st[0], gm))
        return base + len(steps)

    def _gm_steps(self) -> list[int]:
        """The positions of the steps that move data between GM and the chip (a GM window)."""
        if self.gm is None:
            self.gm = [j for j, st in enumerate(self.steps) if st[8] and "gm" in st[7]._dict]
        return self.gm


def lower_to_tiles(g: TensorGraph, ctx: PassContext) -> TileGraph:
    homes, extra_stores, buffers = _assign_homes(g)
    members: dict[int, list] = {}
    for n in g.nodes:
        if "group" in n.attrs:
            members.setdefault(n.attrs["group"], []).append(n)
    nodes: list[TileNode] = []
    infos = []
    cube_tile_of: dict[int, tuple[int, int]] = {}     # value a cube group stores -> its (mL0, nL0)
    spans: dict[int, tuple[int, int, int, int]] = {}  # the "groups" fact (TileGraph.facts)
    loops: dict[int, NodeLoop] = {}     # group -> its loop (a matmul's: made when first read)
    distinct = True
    for gid in sorted(members):
        ms = members[gid]
        start = len(nodes)
        if ms[0].op == "matmul":
            info, loop = _lower_matmul(g, ms, homes, extra_stores, start, gid, ctx.machine,
                                       ctx.options.get("l1_reuse", True))
            cube_tile_of[ms[-1].id] = (info.tile[0], info.tile[2])
            loops[gid] = loop
            nodes.extend(itertools.repeat(None, loop.count))    # (its ids: made when read)
            spans[gid] = (start, len(nodes), *loop.longest)
            distinct = distinct and loop.distinct_loads
        else:
            v = _VectorSetup(g, ms, homes, _epilogue_order(g, ms, cube_tile_of))
            got = _vector_loop(g, gid, ms, homes, extra_stores, v, start)
            if got is not None:
                info, loop = got
                loops[gid] = loop
                nodes.extend(itertools.repeat(None, loop.count))
                spans[gid] = (start, len(nodes), *loop.longest)
                distinct = distinct and loop.distinct_loads
            else:
                em = _Emitter(nodes, gid)
                info = _lower_vector(g, gid, ms, homes, extra_stores, em, setup=v)
                spans[gid] = (start, len(nodes), *em.longest[1:])
                distinct = distinct and em.distinct_loads
        infos.append(info)
    facts = {"groups": spans, "distinct_loads": True} if distinct else {"groups": spans}
    if not loops:
        return TileGraph(g.name, tuple(buffers), tuple(infos), tuple(nodes)).noted(facts)
    parts = [LoopPart(loops[info.id]) if info.id in loops else tuple(nodes[spans[info.id][0]:spans[info.id][1]])
             for info in infos]
    return LoopTileGraph(g.name, tuple(buffers), tuple(infos), parts).noted(facts)


# ---------------------------------------------------------------------------------------
# GM homes

def _assign_homes(g: TensorGraph):
    stored = {n.attrs["param"] for n in g.nodes if n.op == "store"}
    buffers = []
    for p in g.params:
        role = "inout" if p.name in stored and _param_is_read(g, p.name) else (
            "output" if p.name in stored else "input")
        buffers.append(GMBuffer(p.name, p.shape, p.dtype, role))
    by_name = {b.name: b for b in buffers}
    homes: dict[int, GMRef] = {}
    extra: dict[int, list[GMRef]] = {}
    stores = [(n, GMRef.whole(by_name[n.attrs["param"]]).window(n.attrs["offsets"], n.shape, n.attrs.get("steps")))
              for n in g.nodes if n.op == "store"]
    users = g.users()
    for k, (n, ref) in enumerate(stores):
        v = n.inputs[0]
        # a value read again from GM lives where it is stored only if no later store writes over
        # that region (out[:] = v; out[:1] = w; ... v read: v keeps a workspace of its own)
        kept = v not in homes and not (any(g.node(u).op != "store" for u in users[v]) and any(
            ref.overlaps(later) for _, later in stores[k + 1:]))
        if kept:
            homes[v] = ref
        else:
            extra.setdefault(v, []).append(ref)
    for n in g.nodes:
        kind = OPS[n.op].kind
        if kind == "input":
            homes[n.id] = GMRef.whole(by_name[n.attrs["param"]])
        elif kind == "write":
            # the buffer it writes (its readers read it whole); its tiles go to the region
            homes[n.id] = homes[n.inputs[0]]
            if n.op == "write":             # (a scatter's MSCATTER names its own windows)
                extra[n.id] = [homes[n.id].window(n.attrs["offsets"], n.attrs["shape"], n.attrs.get("steps"))]
        elif kind == "layout":
            src = homes[n.inputs[0]]
            ref = _layout(src, n)
            if ref is None:
                raise UnsupportedError(
                    f"{n.op} of a non-contiguous view (a slice or transpose) is not supported",
                    loc=n.loc, expected="reshape of a contiguous tensor",
                    got=f"{n.op} of a window with strides {list(src.strides)}")
            homes[n.id] = ref
        elif (n.attrs.get("materialize") or kind == "scratch" or n.id in extra) and n.id not in homes:
            ws = GMBuffer(f"ws{sum(b.role == 'workspace' for b in buffers)}", n.shape, n.dtype, "workspace")
            buffers.append(ws)
            homes[n.id] = GMRef.whole(ws)
    return homes, extra, buffers


def _param_is_read(g: TensorGraph, name: str) -> bool:
    users = g.users()
    return any(n.op == "input" and n.attrs["param"] == name and users[n.id] for n in g.nodes)


def _layout(src: GMRef, n) -> GMRef | None:
    if n.op == "view":
        return src.window(n.attrs["offsets"], n.attrs["shape"], n.attrs.get("steps"))
    if n.op == "transpose":
        return src.transpose(n.attrs["dim0"], n.attrs["dim1"])
    return src.reshape(n.attrs["shape"])


# ---------------------------------------------------------------------------------------
# vector groups

@functools.lru_cache(maxsize=1 << 12)
def _source_dims(vshape, domain) -> tuple:
    """Per dim of a value (shape vshape, aligned with the domain at the last dim): the domain dim
    its tiles follow, or None where it is broadcast (size 1 against a larger domain dim: every
    tile holds all of it, from offset 0)."""
    off = len(domain) - len(vshape)
    return tuple(None if size == 1 and domain[j + off] != 1 else j + off for j, size in enumerate(vshape))


@functools.lru_cache(maxsize=1 << 16)
def _projection(vshape, domain, start, extent, tile):
    """(gm offsets, valid shape, tile shape) of a value's tile for one iteration of the domain."""
    dims = _source_dims(vshape, domain)
    return (tuple(0 if i is None else start[i] for i in dims), tuple(1 if i is None else extent[i] for i in dims),
            tuple(1 if i is None else tile[i] for i in dims))


def _epilogue_order(g, ms, cube_tile_of):
    """For a vector group reading a cube group's result (directly or through transposes): a
    sort key of its outer tile indices that walks the cube's tiles in the order the cube stores
    them, row-major within each (an epilogue then finishes each cube tile as soon as it is
    stored); None when the vector tiles do not nest in the cube tiles."""
    tile = ms[0].attrs["tile"]
    member_ids = {m.id for m in ms}
    for m in ms:
        for i in m.inputs:
            if i in member_ids or len(tile) < 2:
                continue
            src, perm = transpose_source(g, i)
            if src not in cube_tile_of or g.node(i).shape[-2:] != m.shape[-2:] or len(perm) != len(tile):
                continue
            nest = cube_nest(cube_tile_of[src], perm)
            if any(c % t for c, t in zip(nest, tile) if c > 1):
                continue
            axis_of = {d: k for k, d in enumerate(perm)}      # result axis -> axis of the group

            def key(ix, tile=tile, nest=nest, axis_of=axis_of):
                return (*(ix[axis_of[d]] * tile[axis_of[d]] // nest[axis_of[d]] for d in range(len(ix))), *ix)
            return key
    return None


def first_iterations(g: TensorGraph, gids) -> dict[int, list[TileNode]]:
    """The tile nodes of the first outer iteration of each vector group in `gids` of fused
    graph g, spaces not yet assigned: the tiles `allocate` sizes a group's buffers by (one
    iteration of its loop; the first has no tail tiles).  Fusion lowers these to learn whether a
    tile shape fits on chip before it settles on one (`fusion.whole_row_plan`)."""
    homes, extra_stores, _ = _assign_homes(g)
    members: dict[int, list] = {}
    for n in g.nodes:
        if n.attrs.get("group") in gids:
            members.setdefault(n.attrs["group"], []).append(n)
    out = {}
    for gid, ms in members.items():
        nodes: list[TileNode] = []
        _lower_vector(g, gid, ms, homes, extra_stores, _Emitter(nodes, gid), first_only=True)
        out[gid] = nodes
    return out


class _VectorSetup:
    """What lowering a vector group works out before its iterations: its domain, tile, tile
    counts, the reduced dim (`pd`, None: none across tiles), the outer dims and iterations (in
    order), the inner steps per outer iteration, the values it stores."""

    def __init__(self, g, ms, homes, order=None):
        first = self.first = _domain_node(ms)
        kind0 = OPS[first.op].kind            # (fusion's rule: a reduction's input, a write's value)
        self.domain = domain = (g.node(first.inputs[0 if kind0 == "reduce" else 1]).shape
                                if kind0 in ("reduce", "write") else first.shape)
        self.tile = tile = first.attrs["tile"]
        self.r = r = len(domain)
        self.ntiles = ntiles = [ceil_div(d, t) for d, t in zip(domain, tile)]
        self.member_ids = {m.id for m in ms}
        self.pd = pd = next((m.attrs["dim"] for m in ms if OPS[m.op].kind == "reduce" and ntiles[m.attrs["dim"]] > 1),
                            None)
        self.outer_dims = outer_dims = [d for d in range(r) if d != pd]
        self.n_inner = ntiles[pd] if pd is not None else 1
        self.outer_space = list(itertools.product(*[range(ntiles[d]) for d in outer_dims]))
        if order is not None and pd is None:       # cube tile by cube tile (row-major within each)
            self.outer_space.sort(key=order)
        self.to_store = [m for m in ms if m.id in homes or m.attrs.get("materialize")]
        self.node_of = {n.id: n for n in g.nodes}

    def at(self, oidx, k: int) -> tuple:
        """(idx, start, shape_of) of inner step k of the outer iteration at `oidx`: its tile's
        index, where it starts, its shape (which tiles are the last along each dim, whether k is
        the first inner step: what its nodes depend on but for `_At` attributes)."""
        idx = [0] * self.r
        for d, v in zip(self.outer_dims, oidx):
            idx[d] = v
        if self.pd is not None:
            idx[self.pd] = k
        start = tuple([i * t for i, t in zip(idx, self.tile)])
        return idx, start, (tuple([i == n - 1 for i, n in zip(idx, self.ntiles)]), k == 0)


def _lower_vector(g, gid, ms, homes, extra_stores, em: _Emitter, order=None, first_only=False,
                  setup: "_VectorSetup | None" = None) -> GroupInfo:
    v = setup or _VectorSetup(g, ms, homes, order)
    first, domain, tile, ntiles, n_inner = v.first, v.domain, v.tile, v.ntiles, v.n_inner
    outer_space = v.outer_space
    acc: dict[int, int] = {}
    if first_only:                          # (first_iterations: one outer iteration)
        outer_space = outer_space[:1]
    else:
        _check_size(prod(ntiles) * (2 * len(ms) + len(v.to_store)) + len(em.nodes), first, domain, tile)

    # an iteration's nodes depend on where its tile starts only through their GM windows and iota
    # starts (`_At`): the lowering works out the first iteration of each shape and replays the
    # rest.  Its shape: which of its tiles are the last along each dim (the tail tiles' extents
    # follow: a tile not the last is whole) and whether it is the first inner step.
    plans: dict[tuple, _Plan | None] = {}
    for o, oidx in enumerate(outer_space):
        em.outer = o
        for k in range(n_inner):
            em.inner, em.lin = k, o * n_inner + k
            idx, start, shape_of = v.at(oidx, k)
            plan = plans.get(shape_of)
            base = len(em.nodes)
            if plan is not None:
                plan.replay(em, start, acc)
            else:
                extent = tuple([min(t, d - s) for t, d, s in zip(tile, domain, start)])
                em.start, em.recorded, acc_before = start, [], dict(acc)
                _vector_iteration(g, ms, v.member_ids, v.node_of, v.to_store, homes, extra_stores, domain, ntiles,
                                  tile, idx, start, extent, em, acc, k, n_inner, v.pd)
                if shape_of not in plans:
                    plans[shape_of] = _Plan.of(em.recorded, base, acc_before, acc)
                em.recorded = None
            em.iteration_done(base)
    return GroupInfo(gid, "vector", domain, tuple(tile), len(outer_space), n_inner, first.loc)


def _vector_loop(g, gid, ms, homes, extra_stores, v: "_VectorSetup", start: int) -> tuple[GroupInfo, NodeLoop] | None:
    """A vector group as a loop over its outer iterations (`NodeLoop`, its nodes made when a pass
    first reads them, as a matmul's are), or None when it is lowered node by node: when an
    iteration's nodes cannot be replayed (an input from an earlier outer iteration), when outer
    iterations differ in their node count, or when one loads a GM window twice (the pass that
    drops such loads reads every node).  Its outer iterations are of a few kinds (which of their
    tiles are the last along each outer dim); the first of each kind is lowered op by op (a
    scratch one: its `_Plan`s), and every iteration, templates included, is those plans replayed.
    `v`: the group's `_VectorSetup` (which `_lower_vector` takes too when this gives None)."""
    if len(v.outer_space) < 2 or any(m.op in _INDEXED for m in ms):
        return None
    kinds: dict[tuple, int] = {}                # kind -> its first outer iteration
    for o, oidx in enumerate(v.outer_space):
        kinds.setdefault(_outer_kind(v, oidx), o)
    plans: dict[tuple, _Plan] = {}
    for o in kinds.values():
        scratch = _Emitter([], gid)
        acc: dict[int, int] = {}
        scratch.outer = o
        for k in range(v.n_inner):
            scratch.inner, scratch.lin = k, o * v.n_inner + k
            idx, at, shape_of = v.at(v.outer_space[o], k)
            if shape_of in plans:
                plans[shape_of].replay(scratch, at, acc)
                continue
            extent = tuple([min(t, d - s) for t, d, s in zip(v.tile, v.domain, at)])
            base = len(scratch.nodes)
            scratch.start, scratch.recorded, acc_before = at, [], dict(acc)
            _vector_iteration(g, ms, v.member_ids, v.node_of, v.to_store, homes, extra_stores, v.domain, v.ntiles,
                              v.tile, idx, at, extent, scratch, acc, k, v.n_inner, v.pd)
            plan = _Plan.of(scratch.recorded, base, acc_before, acc)
            if plan is None or (k == 0 and any(step[2] for step in plan.steps)):
                return None         # (an input of an earlier iteration: the outer iterations are not apart)
            plans[shape_of] = plan
    counts = {o: [len(plans[v.at(v.outer_space[o], k)[2]].steps) for k in range(v.n_inner)] for o in kinds.values()}
    per = sum(next(iter(counts.values())))
    if any(sum(c) != per for c in counts.values()):
        return None
    _check_size(prod(v.ntiles) * (2 * len(ms) + len(v.to_store)) + start, v.first, v.domain, v.tile)
    loop = _VectorLoop(v, plans, gid, start, per)
    templates = tuple(tuple(loop.make(None, None, outer=[o])) for o in sorted(kinds.values()))
    for t in templates:
        windows = [n.attrs._dict["gm"] for n in t if n.op == "TLOAD"]
        if len(set(windows)) != len(windows):
            return None
    # the group's longest (outer, inner) iteration, the first such
    most = max(max(c) for c in counts.values())
    o = min(o for o, c in counts.items() if most in c)
    first = start + o * per + sum(counts[o][:counts[o].index(most)])
    # whether no two outer iterations load one window: every load moves along every outer dim of
    # more than one tile (a window is its value's elements at the tile: apart where the tiles are)
    moving = {d for d in v.outer_dims if v.ntiles[d] > 1}
    apart = all(moving <= getattr(fn, "dims", frozenset()) for plan in plans.values() for st in plan.steps
                if st[0] == "TLOAD" for name, fn in st[8] if name == "gm")
    info = GroupInfo(gid, "vector", v.domain, tuple(v.tile), len(v.outer_space), v.n_inner, v.first.loc)
    return info, NodeLoop(start, per * len(v.outer_space), templates, (first, first + most), True,
                          loop.make, per, loop.kind, windows_apart=apart, windows=loop.windows,
                          windows_only=all(name == "gm" for plan in plans.values() for st in plan.steps
                                           for name, _ in st[8]))


def _outer_kind(v: _VectorSetup, oidx) -> tuple:
    """What tells the nodes of an outer iteration from another's besides ids, `par`, valid
    shapes and GM windows: which of its tiles are the last along each outer dim."""
    return tuple([i == v.ntiles[d] - 1 for d, i in zip(v.outer_dims, oidx)])


class _VectorLoop:
    """What a vector group's `NodeLoop` makes its nodes with: the `_Plan` of each shape of inner
    step, replayed at each outer iteration's ids (`make`, see `NodeLoop.make`)."""

    def __init__(self, v: _VectorSetup, plans: dict, group: int, start: int, per: int):
        self.v, self.plans, self.group, self.start, self.per = v, plans, group, start, per
        self.by_kind: dict[tuple, list] = {}    # kind of an outer iteration -> the plan of each inner step

    def kind(self, o: int) -> tuple:
        return _outer_kind(self.v, self.v.outer_space[o])

    def make(self, spaces, place, dropped=None, outer=None, gm_only=False) -> list[TileNode]:
        return self._walk(spaces, place, dropped, outer, gm_only, False)

    def windows(self, dropped=None, outer=None) -> list[tuple]:
        """(op, GM window) of the loads and stores `make(..., gm_only=True)` makes, in its order,
        without making them (see `NodeLoop.windows`)."""
        return self._walk(None, None, dropped, outer, True, True)

    def _walk(self, spaces, place, dropped, outer, gm_only, windows) -> list:
        out: list = []
        v = self.v
        n_inner, group, per, first = v.n_inner, self.group, self.per, self.start
        outer_dims, tile, pd, r = v.outer_dims, v.tile, v.pd, v.r
        for o in (range(len(v.outer_space)) if outer is None else outer):
            oidx = v.outer_space[o]
            kind = _outer_kind(v, oidx)
            plans = self.by_kind.get(kind)
            if plans is None:
                plans = self.by_kind[kind] = [self.plans[v.at(oidx, k)[2]] for k in range(n_inner)]
            at = [0] * r
            for d, i in zip(outer_dims, oidx):
                at[d] = i * tile[d]
            base = first + o * per
            acc: dict[int, int] = {}
            for k, plan in enumerate(plans):
                if pd is not None:
                    at[pd] = k * tile[pd]
                if windows:
                    base = plan.windows(out, base, tuple(at), dropped)
                else:
                    base = plan.made(out, base, group, o, k, o * n_inner + k, tuple(at), acc, spaces, place,
                                     dropped, gm_only)
        return out


def _vector_iteration(g, ms, member_ids, node_of, to_store, homes, extra_stores, domain, ntiles, tile,
                      idx, start, extent, em: _Emitter, acc, k, n_inner, pd) -> None:
    """Append the tile nodes of one iteration of a vector group (its tile at `start`, of
    extents `extent`): the loads of its inputs, its ops, the stores of its finished values.
    Later iterations of its shape replay these nodes (`_Plan`): an attribute worked out from
    `start` must be an `_At` (its decisions may only depend on the extents, the last tiles and
    whether k is 0)."""
    cur: dict[int, int] = {}

    def operand(i, user):
        n = node_of[i]
        if n.op == "const":
            return ("scalar", n.attrs["value"])
        if i in member_ids:
            return ("tile", cur[i])
        if i not in cur:
            _, valid, shape = _projection(n.shape, domain, start, extent, tile)
            cur[i] = em.emit("TLOAD", [], shape, valid, n.dtype, "?", f"ld{i}", user.loc,
                             gm=_window_at(homes[i], n.shape, valid, domain))
        return ("tile", cur[i])

    for m in ms:
        if m.op in _INDEXED:        # MGATHER / MSCATTER (its GM input stays in GM)
            cur[m.id] = _indexed(g, m, operand, homes, domain, start, extent, tile, em)
            continue
        if m.op == "write":         # its value's tile, stored into the written region
            cur[m.id] = operand(m.inputs[1], m)[1]
            continue
        cur[m.id] = _vector_op(g, m, [operand(i, m) for i in m.inputs], domain, start, extent, tile,
                               em, acc, k, n_inner, pd)
    for m in to_store:
        if not _complete(m, domain, ntiles, idx):
            continue
        t = em.node(cur[m.id])
        written = OPS[m.op].kind == "write"
        vshape = g.node(m.inputs[1]).shape if written else m.shape
        _, valid, shape = _projection(vshape, domain, start, extent, tile)
        src = cur[m.id]
        if prod(t.valid) != prod(valid):
            # an expand to more dims is its source's tile (`broadcast` in `_vector_op`): the
            # copies along its new dims made for the store (a store moves the tile as it is)
            ones = em.emit(find("FILL"), [], shape, valid, t.dtype, "?", f"st{m.id}.ones", m.loc, scalar=1)
            src = em.emit(find("MUL"), [ones, src], shape, valid, t.dtype, "?", f"st{m.id}.copies", m.loc)
        for ref in ([] if written else [homes[m.id]]) + extra_stores.get(m.id, []):
            em.emit("TSTORE", [src], (), (), t.dtype, "", f"st{m.id}", m.loc,
                    gm=_window_at(ref, vshape, valid, domain))


def _window_at(ref: GMRef, vshape, valid, domain, dim=None) -> _At:
    """`ref`'s window (shape `valid`) of the tile of a value of shape `vshape` in the iteration
    starting at `start` (`ref.window` at the offsets `_projection` gives; 0 along `dim`, a
    gather's source or a scatter's target, whole along it).  Its offset is ref's plus
    start[i] * stride for each dim of the value that follows domain dim i: worked out once."""
    terms = tuple((i, stride) for k, (i, stride) in enumerate(zip(_source_dims(vshape, domain), ref.strides))
                  if i is not None and k != dim)
    buf, base, strides = ref.buf, ref.offset, ref.strides

    def at(start):
        off = base
        for i, stride in terms:
            off += start[i] * stride
        return GMRef(buf, off, valid, strides)
    at.dims = frozenset(i for i, stride in terms if stride)     # (the domain dims the window moves along)
    return _At(at)


_INDEXED = tuple(name for name, r in OPS.items() if r.tile in ("GATHER", "SCATTER"))


def _indexed(g, m, operand, homes, domain, start, extent, tile, em: _Emitter) -> int:
    """A gather: MGATHER of this tile of the result from the source's GM window (the tile's
    extents off the dim, the dim whole), with the index tile.  A scatter: MSCATTER of the value
    tile (over the domain, its src's) with the index tile into the buffer's window (atomic=ADD
    for scatter_add); its tile is then the value tile (a scatter stores nothing else)."""
    row, d = OPS[m.op], m.attrs["dim"]
    data = m.inputs[0] if row.kind == "gather" else m.inputs[1]
    vshape = m.shape if row.kind == "gather" else g.node(data).shape
    _, valid, shape = _projection(vshape, domain, start, extent, tile)
    ref = homes[data if row.kind == "gather" else m.id]
    win = _window_at(ref, vshape, tuple(ref.shape[d] if k == d else v for k, v in enumerate(valid)), domain, dim=d)
    idx = operand(m.inputs[1 if row.kind == "gather" else 2], m)[1]
    op = find(row.tile)
    if row.kind == "gather":
        return em.emit(op, [idx], shape, valid, m.dtype, "?", f"n{m.id}", m.loc, gm=win, dim=d)
    values = operand(data, m)[1]
    em.emit(op, [values, idx], (), (), m.dtype, "", f"sc{m.id}", m.loc, gm=win, dim=d, **_row_attrs(row, op, m))
    return values


def _domain_node(ms):
    """The member that set the group's domain: its first with inputs (values made from nothing,
    fills and iotas, join the group of their reader just before it, and may be smaller)."""
    return next((m for m in ms if m.inputs), ms[0])


def _check_size(n_ops: int, n, domain, tile) -> None:
    """Refuse a group whose tiles would make more than MAX_TILE_OPS tile ops in all."""
    if n_ops <= MAX_TILE_OPS:
        return
    tiles = prod(ceil_div(d, t) for d, t in zip(domain, tile))
    spec = n.attrs.get("tile")
    where = f" (set at line {spec.loc.line})" if getattr(spec, "loc", None) else ""
    raise ShapeError(f"the tile shape {list(tile)}{where} cuts the domain {list(domain)} into {tiles:,} tiles: "
                     f"about {n_ops:,} tile ops, more than a program can unroll", loc=n.loc,
                     expected=f"at most {MAX_TILE_OPS:,} tile ops", got=f"about {n_ops:,}",
                     hint="choose larger tiles (pypto.set_vec_tile_shapes, pypto.set_cube_tile_shapes) or a "
                          "smaller problem")


def _complete(m, domain, ntiles, idx, g=None) -> bool:
    """A value's tile is final at this iteration (last tile along every dim it is broadcast over)."""
    shape = m.shape if m.op != "write" else domain
    off = len(domain) - len(shape)
    for i in range(len(domain)):
        j = i - off
        broadcast = j < 0 or (shape[j] == 1 and domain[i] != 1)
        if broadcast and ntiles[i] > 1 and idx[i] != ntiles[i] - 1:
            return False
    return True


def _vector_op(g, m, ops, domain, start, extent, tile, em: _Emitter, acc, k, n_inner, pd) -> int:
    kind = OPS[m.op].kind
    _, valid, shape = _projection(m.shape, domain, start, extent, tile)
    key, loc = f"n{m.id}", m.loc

    def out(op, inputs, persistent=False, k_=None, **attrs):
        return em.emit(op, inputs, shape, valid, m.dtype, "?", k_ or key, loc, persistent, **attrs)

    if m.op == "copy":
        return ops[0][1]
    row = OPS[m.op]
    if kind == "unary":
        op = find(row.tile)
        return out(op, [ops[0][1]], **_row_attrs(row, op, m))
    if kind == "cast":
        return out("TCVT", [ops[0][1]], to=m.dtype.name)
    if kind == "reduce":
        dim = m.attrs["dim"]
        op = find(row.tile, "ROW" if dim == len(m.shape) - 1 else "COL")
        src = ops[0][1]
        # a source of fewer dims (an expand to more dims, `broadcast` below): the instruction's
        # dim counts in the source's dims (aligned at the last); a dim the source lacks holds
        # copies of it
        lift = len(m.shape) - len(em.node(src).shape)
        if dim < lift:
            n = _projection(g.node(m.inputs[0]).shape, domain, start, extent, tile)[1][dim]
            part = _over_copies(m, row, src, n, out, k_=f"{key}.part" if dim == pd and k else None)
            if dim != pd:
                return part
            if k == 0:      # (the accumulator outlives the source's slot)
                acc[m.id] = out(find("MUL", "S"), [part], persistent=True, scalar=1)
            else:
                acc[m.id] = out(find(OPS[row.combine].tile), [acc[m.id], part], persistent=True)
            return acc[m.id]
        d = dim - lift
        if dim != pd:
            return out(op, [src], dim=d)
        if k == 0:
            acc[m.id] = out(op, [src], persistent=True, dim=d)
        else:
            part = out(op, [src], k_=f"{key}.part", dim=d)
            acc[m.id] = out(find(OPS[row.combine].tile), [acc[m.id], part], persistent=True)
        return acc[m.id]
    if kind in ("binary", "compare"):
        return _binary(m, ops, em, out)
    if kind in ("fill", "iota"):
        return _source(m, row, lambda s: _projection(m.shape, domain, s, extent, tile)[0], out)
    if kind == "select":
        return _select(m, ops, em, out)
    if kind == "broadcast":           # spread over a tile of the result's shape (TEXPANDS gives it)
        # (an expand to more dims whose new dims need no row or column expansion stays its
        # source's tile, of fewer dims: element-wise readers broadcast it; a reduction counts its
        # dim in the source's dims, and a store makes the copies first, `_vector_iteration`)
        # judged by the tile shapes, not the valid ones: a tail tile whose valid extent is 1 is
        # expanded as the full tiles are, so its tiles live as theirs (the allocator gives every
        # iteration the first one's slots: an expand skipped in the tail left its source alive
        # where the first iteration had freed the slot, and a later load overwrote it)
        t = ops[0][1]
        if tuple(em.node(t).shape) == tuple(shape):
            return t
        ref = em.emit(find("FILL"), [], shape, valid, m.dtype, "?", f"{key}.shape", loc, scalar=0)
        return _expanded(em, m, t, ref, key, by_shape=True)
    raise UnsupportedError(f"no tile lowering for '{m.op}'", loc=loc)


def _over_copies(m, row, src: int, n: int, out, k_=None) -> int:
    """The reduction of `n` copies of tile `src` (along a dim of the reduced value that its
    source, expanded to more dims, does not have): the tile itself for a max or a min, n times it
    for a sum (one TMULS), its n-th power for a product (n - 1 TMULs)."""
    if n == 1 or row.combine in ("maximum", "minimum"):
        return src
    if row.combine == "add":
        return out(find("MUL", "S"), [src], k_=k_, scalar=n)
    power = src
    for j in range(n - 1):
        power = out(find("MUL"), [power, src], k_=f"{k_ or 'n%d' % m.id}.pow{j}")
    return power


def _row_attrs(row, op: str, m) -> dict:
    """The instruction attributes a registry row names in its `extra` (TCVT's round=, ...);
    a conversion also says its dtype (to=)."""
    attrs = {k: v for k, v in row.extra.items() if k in ATTRS}
    if isa_row(op).kind == "cvt":
        attrs["to"] = m.dtype.name
    return attrs


def _source(m, row, offsets, out) -> int:
    """A value made from nothing: TEXPANDS of its value, or TCI of the sequence from this tile's
    offset (element j of a tile starting at index c along the dim is start + (c + j) * step;
    `offsets(start)`: the tile's offsets in an iteration starting at `start`)."""
    op, a = find(row.tile), m.attrs
    if row.kind == "fill":
        return out(op, [], scalar=a["value"])
    d, first, step = a["dim"], a["start"], a["step"]
    return out(op, [], dim=d, start=_At(lambda start: first + offsets(start)[d] * step), step=step)


def _bcast_kind(a: TileNode, b: TileNode) -> str:
    """How tile b broadcasts against tile a: '' (same), 'ROW' (last dim 1) or 'COL' (row dim 1)."""
    return _expand_kind(a.valid, b.valid)


def _broadcast(sa: tuple, sb: tuple) -> tuple:
    """The broadcast of two shapes (numpy's rule: aligned at the last dim)."""
    r = max(len(sa), len(sb))
    sa, sb = (1,) * (r - len(sa)) + tuple(sa), (1,) * (r - len(sb)) + tuple(sb)
    return tuple(max(x, y) for x, y in zip(sa, sb))


def _expand_kind(sa: tuple, sb: tuple) -> str:
    """How a tile of valid shape sb broadcasts against one of valid shape sa (see _bcast_kind)."""
    if len(sb) < len(sa):
        sb = (1,) * (len(sa) - len(sb)) + sb
    if sa == sb or prod(sa) == 1 and prod(sb) == 1:
        return ""
    if sb[-1] == 1 and sa[-1] != 1:
        return "ROW"
    if len(sa) >= 2 and sb[-2] == 1 and sa[-2] != 1:
        return "COL"
    return ""


def _expanded(em: _Emitter, m, t: int, ref: int, key: str, by_shape: bool = False) -> int:
    """Tile t broadcast against tile ref (one TROWEXPAND / TCOLEXPAND: a row vector, a column
    vector or a single element spread over the shape both make); t itself when it has it
    (`by_shape`: judged by the tile shapes, not the valid ones, so that a tail tile whose valid
    extent is 1 is expanded as the full tiles are)."""
    tt, tr = em.node(t), em.node(ref)
    shape, valid = _broadcast(tt.shape, tr.shape), _broadcast(tt.valid, tr.valid)
    form = _expand_kind(shape, tt.shape) if by_shape else _expand_kind(valid, tt.valid)
    if not form:
        return t
    return em.emit(find("", form + "EXPAND"), [t, ref], shape, valid, tt.dtype, "?", key, m.loc)


def _binary(m, ops, em: _Emitter, out) -> int:
    row = OPS[m.op]
    fn = row.tile
    attrs = {"cmp": row.extra["cmp"]} if "cmp" in row.extra else {}
    (ka, a), (kb, b) = ops
    if ka == "scalar" and kb == "scalar":  # pragma: no cover - folded by the frontend
        raise UnsupportedError("binary op of two constants", loc=m.loc)
    if ka == "scalar":
        if row.commutative:
            return out(find(fn, "S"), [b], scalar=a, **attrs)
        if row.scalar_left:
            # c op x = binary(unary(x), c): c - x = -x + c ; c / x = (1/x) * c
            pre_op, then = row.scalar_left
            pre = em.emit(find(OPS[pre_op].tile), [b], em.node(b).shape, em.node(b).valid,
                          m.dtype, "?", f"n{m.id}.pre", m.loc)
            return out(find(OPS[then].tile, "S"), [pre], scalar=a)
        tb = em.node(b)                      # the constant as a tile (TEXPANDS), then tile op tile
        c = em.emit(find("FILL"), [], tb.shape, tb.valid, tb.dtype, "?", f"n{m.id}.c", m.loc, scalar=a)
        return out(find(fn), [c, b], **attrs)
    if kb == "scalar":
        return out(find(fn, "S"), [a], scalar=b, **attrs)
    ta, tb = em.node(a), em.node(b)
    kind_b, kind_a = _bcast_kind(ta, tb), _bcast_kind(tb, ta)
    if (kind_a and not (kind_a + "EXPAND" in opcodes(fn))) or (kind_b and not (kind_b + "EXPAND" in opcodes(fn))) or (
            ta.shape != tb.shape and not ("ROWEXPAND" in opcodes(fn))):
        # no broadcasting form of this math (TCMP, TAND, ...): broadcast the operands first, as
        # their tile shapes say (a tail tile then runs the instructions the full ones do: the
        # buffer allocation plans the slots of every iteration from one of them)
        a = _expanded(em, m, a, b, f"n{m.id}.bc", by_shape=True)
        b = _expanded(em, m, b, a, f"n{m.id}.bcb", by_shape=True)
        return out(find(fn), [a, b], **attrs)
    if kind_a and not kind_b:
        if row.commutative:
            return out(find(fn, kind_a + "EXPAND"), [b, a], **attrs)
        full = em.emit(find("", kind_a + "EXPAND"), [a, b], _broadcast(ta.shape, tb.shape),
                       _broadcast(ta.valid, tb.valid), m.dtype, "?", f"n{m.id}.bc", m.loc)
        return out(find(fn), [full, b], **attrs)
    if kind_b and kind_a:  # both broadcast ([M,1] op [1,N], or [M,1] op [N]): expand a first
        full_shape, full_valid = _broadcast(ta.shape, tb.shape), _broadcast(ta.valid, tb.valid)
        a = em.emit(find("", _expand_kind(full_valid, ta.valid) + "EXPAND"), [a, b], full_shape, full_valid,
                    m.dtype, "?", f"n{m.id}.bc", m.loc)
        return out(find(fn, _bcast_kind(em.node(a), tb) + "EXPAND"), [a, b], **attrs)
    return out(find(fn, kind_b + "EXPAND" if kind_b else ""), [a, b], **attrs)


def _select(m, ops, em: _Emitter, out) -> int:
    """where(mask, a, b): TSEL of three tiles of the result's shape (broadcast operands expanded
    first), TSELS when b is a constant; a constant a becomes a TEXPANDS tile."""
    (km, mask), (ka, a), (kb, b) = ops
    if km == "scalar":  # pragma: no cover - the frontend folds a constant condition
        raise UnsupportedError("where with a constant condition", loc=m.loc)
    tiles = [t for k, t in ops if k == "tile"]
    # by tile shapes, not valid ones: a tail tile runs the instructions the full ones do
    target = functools.reduce(_broadcast, (em.node(t).shape for t in tiles))
    done: dict[int, int] = {}               # operand tile -> it at the result's shape
    full = next((t for t in tiles if tuple(em.node(t).shape) == tuple(target)), None)
    if full is None:                        # no operand has the result's shape: spread the first
        full = tiles[0]
        for t in tiles[1:]:
            full = _expanded(em, m, full, t, f"n{m.id}.bc", by_shape=True)
        done[tiles[0]] = full
    ref = em.node(full)

    def tile_of(k, t, name):
        if k == "scalar":
            return em.emit(find("FILL"), [], ref.shape, ref.valid, m.dtype, "?", f"n{m.id}.{name}", m.loc, scalar=t)
        if t not in done:
            done[t] = _expanded(em, m, t, full, f"n{m.id}.{name}", by_shape=True)
        return done[t]
    mask, a = tile_of(km, mask, "m"), tile_of(ka, a, "a")
    if kb == "scalar":
        return out(find("SEL", "S"), [mask, a], scalar=b)
    return out(find("SEL"), [mask, a, tile_of(kb, b, "b")])


# ---------------------------------------------------------------------------------------
# cube groups

def _sub2d(ref: GMRef, lead: tuple[int, ...], r0, c0, rows, cols) -> GMRef:
    strides = ref.strides
    off = ref.offset
    if lead:
        off += sum(i * s for i, s in zip(lead, strides[:-2]))
    off += r0 * strides[-2] + c0 * strides[-1]
    return GMRef(ref.buf, off, (rows, cols), strides[-2:])


def _bias_row(ref: GMRef, n0: int, nv: int) -> GMRef:
    """Window [1, nv] at column n0 of a bias row ([N] or [1, .., N])."""
    step = ref.strides[-1]
    return GMRef(ref.buf, ref.offset + n0 * step, (1, nv), (nv * step, step))


def _operands(g, mm, homes) -> tuple[GMRef, GMRef]:
    """The GM windows of a matmul's A [.., M, K] and B [.., K, N], transposes applied."""
    A, B = (homes[i] for i in mm.inputs)
    if mm.attrs["a_trans"]:
        A = A.transpose(len(A.shape) - 2, len(A.shape) - 1)
    if mm.attrs["b_trans"]:
        B = B.transpose(len(B.shape) - 2, len(B.shape) - 1)
    return A, B


def _lead(bi: tuple[int, ...], ref: GMRef) -> tuple[int, ...]:
    """The leading (batch) index of `ref` for batch index bi, broadcast over its size-1 dims."""
    dims = ref.shape[:-2]
    return tuple(i if s != 1 else 0 for i, s in zip(bi[len(bi) - len(dims):], dims))


def _shared_operand(nm: int, nn: int, terms, batch) -> str | None:
    """The tile key ("a1", "b1") of the operand panel consecutive output tiles share
    (`tileshape.shared_panel`), or None."""
    broadcast = next((name for name, k in (("b", 1), ("a", 0))
                      if all(all(d == 1 for d in t[k].shape[:-2]) for t in terms)), None)
    panel = shared_panel(nm, nn, prod(batch), broadcast)
    return None if panel is None else panel + "1"


def _lower_matmul(g, ms, homes, extra_stores, start: int, group: int, machine,
                  l1_reuse: bool = True) -> tuple[GroupInfo, NodeLoop]:
    """`ms`: the matmul, then its cube epilogue (fusion.py): matmuls summed with it (each adds
    its K chunks to the same L0C accumulator: a convolution's kernel positions), a bias add
    and/or a ReLU.  The group's nodes are ids `start` on; returns its GroupInfo and its loop
    over output tiles (a `NodeLoop`: the nodes are made when first read, see `_MatmulLoop`).

    With `l1_reuse`, K is walked forward in even output tiles and backward in odd ones
    (serpentine), and the operand panel consecutive output tiles share (`_shared_operand`) is
    loaded into a ring of L1 slots chosen by its K chunk
    (`ring`: `allocate` gives it the L1 left over).  The last chunks one tile loads are then the
    first the next one needs, still in their slots: the `l1_reuse` block pass drops those loads.
    """
    m, result = ms[0], ms[-1]
    members = {y.id for y in ms}
    bias = None
    for x in ms[1:]:
        if x.op == "add" and not set(x.inputs) <= members:
            bias = homes[next(i for i in x.inputs if i not in members)]
    act = {"act": "relu"} if any(x.op == "relu" for x in ms[1:]) else {}
    terms = [_operands(g, x, homes) for x in ms if x.op == "matmul"]   # summed in L0C (fusion.py)
    A, B = terms[0]
    M, K = A.shape[-2:]
    N = B.shape[-1]
    batch = m.shape[:-2]
    ml0, kl0, nl0, kl1 = matmul_cube_tile(g, m, machine)
    nm, nn, nk1 = ceil_div(M, ml0), ceil_div(N, nl0), ceil_div(K, kl1)
    # per output tile and K chunk: two loads, two extracts per kL0 step and a matmul (about)
    _check_size(prod(batch) * nm * nn * len(terms) * nk1 * (2 + 3 * ceil_div(kl1, kl0)) + start, m,
                (*batch, M, N, K), (*(1,) * len(batch), ml0, nl0, kl1))
    nest = _MatmulLoop(g, m, result, terms, bias, act, [homes[result.id]] + extra_stores.get(result.id, []),
                       (ml0, kl0, nl0, kl1), group, _shared_operand(nm, nn, terms, batch) if l1_reuse else None)
    info = GroupInfo(group, "cube", (prod(batch), M, K, N), (ml0, kl0, nl0, kl1), nest.n_tiles, len(terms) * nk1,
                     m.loc)
    return info, nest.loop(start)


_INNER = operator.attrgetter("inner")


class _MatmulLoop:
    """A matmul group's loop over its output tiles (batch, then M, then N tiles), from which
    its `NodeLoop` makes the nodes.  Every output tile has the same nodes: the bias row (when
    the group has a bias), then per K chunk its A and B loads and per kL0 step two extracts and
    a matmul into the tile's accumulator, then its stores.  What differs from tile to tile is
    the ids (the same count every tile), the `par` counters (affine in the tile's index), the
    GM windows, the valid shapes of tail tiles and, with a shared panel (L1 reuse), the
    direction K is walked in.  So the first tile of each kind (tail in M, tail in N, K
    backward) is every kind of tile there is (`NodeLoop.templates`)."""

    def __init__(self, g, m, result, terms, bias, act, outs, tile, group: int, shared: str | None):
        self.terms, self.bias, self.act, self.outs = terms, bias, act, outs
        self.loc, self.result, self.group, self.shared = m.loc, result, group, shared
        self.dtype = g.node(m.inputs[0]).dtype
        self.acc_dtype = DT_INT32 if self.dtype.name == "int8" else DT_FP32
        ml0, kl0, nl0, kl1 = self.tile = tile
        A, B = terms[0]
        self.M, self.K = M, K = A.shape[-2:]
        self.N = N = B.shape[-1]
        self.batch = batch = m.shape[:-2]
        self.nm, self.nn, nk1 = ceil_div(M, ml0), ceil_div(N, nl0), ceil_div(K, kl1)
        self.n_tiles = prod(batch) * self.nm * self.nn
        self.chunks = chunks = [(t, k1) for t in range(len(terms)) for k1 in range(nk1)]
        # the tile shapes, one tuple each for every node (and the valid shape of a full tile)
        self.s_a1, self.s_b1, self.s_c = (ml0, kl1), (kl1, nl0), (ml0, nl0)
        s_a0, s_b0 = (ml0, kl0), (kl0, nl0)
        # the attribute maps, in the order emit gives them (its keywords first), one Attrs for all
        # the nodes that have it: an extract's per kL0 step, the accumulator's
        n_k0 = ceil_div(kl1, kl0)
        x_a0 = [Attrs.of({"offsets": (0, k0 * kl0), "key": "a0"}) for k0 in range(n_k0)]
        x_b0 = [Attrs.of({"offsets": (k0 * kl0, 0), "key": "b0"}) for k0 in range(n_k0)]
        self.acc = Attrs.of({"key": "c", "persistent": True})
        self.bt_attrs = Attrs.of({"key": "bt", "persistent": True})
        # (mv, nv, kv1) -> per kL0 step of a K chunk of kv1 of an output tile of valid extents (mv, nv):
        # the map and valid shape of its A extract, then its B extract's (made when first needed)
        self.extracts: dict[tuple, list] = {}
        self.x = (x_a0, x_b0, s_a0, s_b0)
        kvs = [min(kl1, K - k1 * kl1) for _, k1 in chunks]
        self.kv1 = kvs
        self.steps_per_tile = sum(ceil_div(kv, kl0) for kv in kvs)
        self.per_tile = (2 if bias is not None else 0) + 2 * len(chunks) + 3 * self.steps_per_tile + len(outs)
        # the operand loads of an output row (A) or column (B) of tiles, one each per K chunk: every
        # output tile of the row (column) loads the same windows; per batch index
        parts = [{t[0].buf.name for t in terms}, {t[1].buf.name for t in terms}] + ([{bias.buf.name}] if bias else [])
        self.distinct = sum(map(len, parts)) == len(set().union(*parts))
        self.bis = list(itertools.product(*[range(s) for s in batch]))
        self.a_loads, self.b_loads = [], []
        for bi in self.bis:
            leads = [(_lead(bi, A_), _lead(bi, B_)) for A_, B_ in terms]
            self.b_loads.append([self._loads("b1", [_sub2d(terms[t][1], leads[t][1], k1 * kl1, ni * nl0, kvs[c],
                                                          min(nl0, N - ni * nl0)) for c, (t, k1) in enumerate(chunks)],
                                             self.s_b1) for ni in range(self.nn)])
            self.a_loads.append([self._loads("a1", [_sub2d(terms[t][0], leads[t][0], mi * ml0, k1 * kl1,
                                                          min(ml0, M - mi * ml0), kvs[c])
                                                    for c, (t, k1) in enumerate(chunks)], self.s_a1)
                                 for mi in range(self.nm)])

    def _loads(self, key, windows, full):
        """(Attrs, valid shape) of the loads of `windows`, one per K chunk: the shared panel's
        picks its L1 copy by K chunk (a ring), the other by iteration.  A whole tile's valid
        shape is its tile shape `full` (one tuple for all)."""
        self.distinct = self.distinct and len(set(windows)) == len(windows)
        ring = {"ring": True} if self.shared == key else {}
        return [(Attrs.of({"gm": w, **ring, "key": key}), full if w.shape == full else w.shape) for w in windows]

    def _tiles(self):
        """(o, batch index, mi, ni) of every output tile, in order."""
        o = 0
        for b in range(len(self.bis)):
            for mi in range(self.nm):
                for ni in range(self.nn):
                    yield o, b, mi, ni
                    o += 1

    def _extracts(self, mv: int, nv: int, kv1: int) -> list:
        """Per kL0 step of a K chunk of kv1 of an output tile of valid extents (mv, nv): the map
        and valid shape of its A extract, then its B extract's (made once, `self.extracts`)."""
        _, kl0, _, _ = self.tile
        x_a0, x_b0, s_a0, s_b0 = self.x
        xs = self.extracts[(mv, nv, kv1)] = []
        for k0 in range(ceil_div(kv1, kl0)):
            kv = min(kl0, kv1 - k0 * kl0)
            xs.append((x_a0[k0], s_a0 if (mv, kv) == s_a0 else (mv, kv),
                       x_b0[k0], s_b0 if (kv, nv) == s_b0 else (kv, nv)))
        return xs

    def kind_of(self, o: int) -> tuple:
        """`_kind` of output tile o."""
        return self._kind(o, (o // self.nn) % self.nm, o % self.nn)

    def _kind(self, o: int, mi: int, ni: int) -> tuple:
        """What tells apart the nodes of two output tiles besides ids, `par` and GM windows."""
        ml0, _, nl0, _ = self.tile
        return (o % 2 if self.shared is not None else 0, min(ml0, self.M - mi * ml0), min(nl0, self.N - ni * nl0))

    def loop(self, start: int) -> NodeLoop:
        per = self.per_tile
        firsts, kinds = [], set()
        for o, b, mi, ni in self._tiles():
            k = self._kind(o, mi, ni)
            if k not in kinds:
                kinds.add(k)
                firsts.append((o, b, mi, ni))
            if len(kinds) == 8:             # (2 directions x tail or not in M and N)
                break
        templates = []
        for o, b, mi, ni in firsts:
            nodes: list[TileNode] = []
            self._tile(nodes, start + o * per, o, b, mi, ni, None, None)
            templates.append(tuple(nodes))
        # the group's longest iteration (outer, inner), the first such: the steps of a tile differ
        # by their kL0 steps (a tail chunk has fewer), the first has the bias row and the last the
        # stores; tiles of one kind alike, so the first of the kind that has it
        most, longest = 0, (start, start)
        for t in templates:
            at = 0
            for _, run in itertools.groupby(t, _INNER):
                k = len(list(run))
                if k > most:
                    most, longest = k, (t[at].id, t[at].id + k)
                at += k
        return NodeLoop(start, per * self.n_tiles, tuple(templates), longest, self.distinct,
                        lambda spaces, place, dropped=None, outer=None, gm_only=False:
                        self.make(start, spaces, place, dropped, outer, gm_only), per, self.kind_of,
                        windows=lambda dropped, outer: self.make(start, None, None, dropped, outer, True, True))

    def make(self, start: int, spaces, place, dropped=None, outer=None, gm_only=False, windows=False) -> list:
        """The nodes of `NodeLoop.make`; `windows`: (op, GM window) of the loads and stores instead
        (`NodeLoop.windows`: a twin task's windows, no node made)."""
        nodes: list = []
        per = self.per_tile
        if windows:
            nn, nm = self.nn, self.nm
            tiles = self._tiles() if outer is None else ((o, *divmod(o // nn, nm), o % nn) for o in outer)
            for o, b, mi, ni in tiles:
                self._tile_windows(nodes, start + o * per, o, b, mi, ni, dropped)
            return nodes
        if outer is None:
            for o, b, mi, ni in self._tiles():
                self._tile(nodes, start + o * per, o, b, mi, ni, spaces, place, dropped, gm_only)
            return nodes
        nn, nm = self.nn, self.nm
        for o in outer:
            bm, ni = divmod(o, nn)
            b, mi = divmod(bm, nm)
            self._tile(nodes, start + o * per, o, b, mi, ni, spaces, place, dropped, gm_only)
        return nodes

    def _tile_windows(self, nodes: list, nid: int, o: int, b: int, mi: int, ni: int, dropped) -> None:
        """Append (op, GM window) of the loads and stores `_tile(..., gm_only=True)` makes for output
        tile `o` (ids from `nid`), without the loads of `dropped`; a twin task's windows
        are a few hundred tiles' (`NodeLoop.windows`), so the chunks' windows are made once per row
        and column of tiles and only the ids are counted here."""
        ml0, _, nl0, _ = self.tile
        m0, n0 = mi * ml0, ni * nl0
        mv, nv = min(ml0, self.M - m0), min(nl0, self.N - n0)
        append = nodes.append
        if self.bias is not None:
            if dropped is None or nid not in dropped:
                append(("TLOAD", _bias_row(self.bias, n0, nv)))
            nid += 2
        wins = self.__dict__.get("_gm_windows")
        if wins is None:        # per chunk: (op, window) of the A load of each (batch, row), the B of each column
            wins = self._gm_windows = (
                [[[("TLOAD", a._dict["gm"]) for a, _ in al] for al in row] for row in self.a_loads],
                [[[("TLOAD", a._dict["gm"]) for a, _ in bl] for bl in col] for col in self.b_loads],
                [2 + 3 * ceil_div(kv, self.tile[1]) for kv in self.kv1])     # ids per chunk
        al, bl, span = wins[0][b][mi], wins[1][b][ni], wins[2]
        order = range(len(span))
        if self.shared is not None and o % 2 == 1:
            order = reversed(order)
        if dropped is None:
            for chunk in order:
                append(al[chunk])
                append(bl[chunk])
                nid += span[chunk]
        else:
            for chunk in order:
                if nid not in dropped:
                    append(al[chunk])
                if nid + 1 not in dropped:
                    append(bl[chunk])
                nid += span[chunk]
        bi = self.bis[b]
        for ref in self.outs:
            append(("TSTORE", _sub2d(ref, bi[len(bi) - len(ref.shape[:-2]):], m0, n0, mv, nv)))

    def _tile(self, nodes: list, nid: int, o: int, b: int, mi: int, ni: int, spaces, place, dropped=None,
              gm_only=False) -> None:
        """Append the nodes of output tile `o` (ids from `nid`): the nodes the lowering makes, with
        the spaces of `spaces` and the maps `place` gives, without the loads of `dropped` (their
        readers reading the loads `dropped` names instead), only the loads and stores if
        `gm_only` (see `NodeLoop.make`; their windows alone: `_tile_windows`)."""
        ml0, _, nl0, _ = self.tile
        s_a1, s_b1, s_c = self.s_a1, self.s_b1, self.s_c
        _, _, s_a0, s_b0 = self.x
        dtype, acc_dtype, loc, group, acc = self.dtype, self.acc_dtype, self.loc, self.group, self.acc
        sp = spaces.get if spaces is not None else None
        q = "?"
        sp_a1 = sp(("TLOAD", "a1"), q) if sp else q
        sp_b1 = sp(("TLOAD", "b1"), q) if sp else q
        sp_a0 = sp(("TEXTRACT", "a0"), q) if sp else q
        sp_b0 = sp(("TEXTRACT", "b0"), q) if sp else q
        append, make = nodes.append, _make_node     # (the hot loop builds its nodes itself, as emit would)
        m0, n0 = mi * ml0, ni * nl0
        mv, nv = min(ml0, self.M - m0), min(nl0, self.N - n0)
        v_c = s_c if (mv, nv) == s_c else (mv, nv)
        a_ring, b_ring = self.shared == "a1", self.shared == "b1"
        chunks, kvs = self.chunks, self.kv1
        lin = o * len(chunks)
        steps = o * self.steps_per_tile
        c = None
        order = range(len(chunks))
        if self.shared is not None and o % 2 == 1:
            order = reversed(order)
        al, bl = self.a_loads[b][mi], self.b_loads[b][ni]
        extracts = self.extracts
        step = 0
        for step, chunk in enumerate(order):
            kv1 = kvs[chunk]
            bt = None
            if self.bias is not None and step == 0:
                # persistent: slots of their own (per output tile), so the operand loads never
                # wait for the bias row to leave L1
                bias, s_bias = self.bias, (1, nl0)
                a = Attrs.of({"gm": _bias_row(bias, n0, nv), "key": "bias1", "persistent": True})
                space = sp(("TLOAD", "bias1"), q) if sp else q
                if dropped is None or nid not in dropped:
                    append(make(nid, "TLOAD", (), s_bias, (1, nv), bias.dtype, space, group, o, 0,
                                place(a, o) if place is not None and space != q else a, loc, o))
                if not gm_only:
                    a = self.bt_attrs
                    src = (nid,) if dropped is None else (dropped.get(nid, nid),)
                    append(make(nid + 1, "TMOV", src, s_bias, (1, nv), bias.dtype, "BT", group, o, 0,
                                place(a, o) if place is not None else a, loc, o))
                bt = nid + 1
                nid += 2
            attrs, valid = al[chunk]
            p = chunk if a_ring else lin
            a1, b1 = (nid,), (nid + 1,)
            if dropped is None or nid not in dropped:
                append(make(nid, "TLOAD", (), s_a1, valid, dtype, sp_a1, group, o, step,
                            place(attrs, p) if place is not None and sp_a1 != q else attrs, loc, p))
            else:
                a1 = (dropped[nid],)
            attrs, valid = bl[chunk]
            p = chunk if b_ring else lin
            if dropped is None or nid + 1 not in dropped:
                append(make(nid + 1, "TLOAD", (), s_b1, valid, dtype, sp_b1, group, o, step,
                            place(attrs, p) if place is not None and sp_b1 != q else attrs, loc, p))
            else:
                b1 = (dropped[nid + 1],)
            nid += 2
            lin += 1
            if gm_only:             # (the extracts and matmuls of the chunk: ids and counters only)
                n_x = len(extracts.get((mv, nv, kv1)) or self._extracts(mv, nv, kv1))
                nid += 3 * n_x
                steps += n_x
                c = nid - 1
                continue
            xs = extracts.get((mv, nv, kv1)) or self._extracts(mv, nv, kv1)
            for xa, va, xb, vb in xs:
                # L0A/L0B alternate per k0 step, so MTE1 fills one while the cube reads the other
                if place is not None:
                    xa = place(xa, steps) if sp_a0 != q else xa
                    xb = place(xb, steps) if sp_b0 != q else xb
                append(make(nid, "TEXTRACT", a1, s_a0, va, dtype, sp_a0, group, o, step, xa, loc, steps))
                append(make(nid + 1, "TEXTRACT", b1, s_b0, vb, dtype, sp_b0, group, o, step, xb, loc, steps))
                steps += 1
                if c is not None:
                    op, ins = "TMATMUL_ACC", (c, nid, nid + 1)
                elif bt is not None:
                    op, ins = "TMATMUL_BIAS", (bt, nid, nid + 1)
                else:
                    op, ins = "TMATMUL", (nid, nid + 1)
                space = sp((op, "c"), q) if sp else q
                append(make(nid + 2, op, ins, s_c, v_c, acc_dtype, space, group, o, step,
                            place(acc, o) if place is not None and space != q else acc, loc, o))
                c = nid + 2
                nid += 3
        bi = self.bis[b]
        result, act = self.result, self.act
        for ref in self.outs:
            gm = _sub2d(ref, bi[len(bi) - len(ref.shape[:-2]):], m0, n0, mv, nv)
            append(make(nid, "TSTORE", (c,), (), (), result.dtype, "", group, o, step,
                        Attrs.of({"gm": gm, **act, "key": "st"}), result.loc, lin - 1))
            nid += 1


