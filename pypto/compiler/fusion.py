"""Tensor-level fusion: group ops that can run tile by tile without going through GM.

Each vector op joins the group of one of its inputs when it iterates over the same domain
with the same tile shape and does not need a value that is still being accumulated (a
reduction across several tiles is complete only after its last tile).  A matmul is a group of
its own on the cube core, together with the epilogue the cube core does for free: a bias row
added to its result (TMATMUL_BIAS starts the accumulator from the bias table) and then a ReLU
(the FIX pipe applies it on the way out of L0C).  Groups are numbered so that every group only
reads values of lower-numbered groups, which keeps the group graph acyclic.

The pass annotates members with `group` and their normalised `tile`; values needed outside
their group (by another group or a GM view) get `materialize=True`.

A group's tile is the kernel's (set_vec_tile_shapes) or pypto's default (`tileshape.default_vec_tile`),
chosen by the op that starts the group.  Before grouping, `whole_row_plan` looks for reductions
along the last dim that the default would cut (rows wider than 8 KiB): for such a domain the
default becomes whole rows, as many as let the group's tiles fit UB double-buffered (found by
grouping with each row count and lowering one iteration of the group, as `allocate` will size
it; single-buffered when no row count fits twice, the cut default when not even one row fits).
A whole-row group computes the reduction and what follows it tile by tile, reading its input
from HBM once.

A `pypto.fuse()` region (the ops traced in it carry its `FuseRegion` as their `fuse` attr) must
end up in one group: its vector ops join the group of the region's first op before any other
candidate, even without reading its values; one that cannot (another domain or tile, a value
still being reduced across tiles, a cube group, a value of a later group) is a located error
naming it and why.  With fusion off (options {"fusion": False}) regions are not kept.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import PyptoError, SourceLoc, UnsupportedError
from ..ir.core import broadcast_shapes, ceil_div
from ..ir.tensor import OPS, TensorGraph
from ..ir.tile import TileGraph
from .pipeline import Pass, PassContext
from .layout import transpose_source
from .memory import assign_spaces, buffers_that_fit
from .tileshape import (cube_nest, default_vec_tile, epilogue_vec_tile, matmul_cube_tile, matmul_k,
                        normalize_vec_tile)
from .tiling import first_iterations


@dataclass(frozen=True)
class FuseRegion:
    """A `pypto.fuse()` region of a trace: the value of its ops' `fuse` attr (printed as its
    id: a number, or `op.N` for a region inside a registered op's body; equal by id, the
    location of its `with` line aside)."""
    id: int | str
    loc: SourceLoc | None = field(default=None, compare=False, hash=False)

    def __str__(self):
        return str(self.id)


@dataclass
class _Group:
    id: int
    kind: str
    domain: tuple[int, ...]
    tile: tuple[int, ...] | None
    partial_dim: int | None = None
    members: list[int] = field(default_factory=list)
    closed: bool = False                # no later op joins it (it scatters into GM)
    whole_rows: bool = False            # its tile is whole rows of the row plan (whole_row_plan)
    auto: bool = False                  # its tile is pypto's default (no kernel tile, not an epilogue's)


def _iter_shape(g: TensorGraph, n) -> tuple[int, ...]:
    """The domain a vector op iterates over: its input's for a reduction, the written value's
    for a write, else its result's."""
    kind = OPS[n.op].kind
    return g.node(n.inputs[0 if kind == "reduce" else 1]).shape if kind in ("reduce", "write") else n.shape


def fuse(g: TensorGraph, ctx: PassContext | None = None) -> TensorGraph:
    refusals: dict[int, str] = {}
    plan = whole_row_plan(g, ctx)
    fused, groups = _fuse(g, ctx, plan, refusals)
    smaller = fitting_plan(g, ctx, plan, fused, groups)
    if smaller != plan:
        refusals = {}
        fused, _ = _fuse(g, ctx, smaller, refusals)
    fused = order_groups(fused)
    if ctx is None or ctx.options.get("fusion", True):
        check_regions(fused, refusals)
    return fused


# why a region's op could not join its region's group, the reasons `check_regions` gives a hint of its own
CUBE_REFUSAL = ("a matmul's group runs on the cube core: only a bias row added to its result and a ReLU "
                "after it join it")
MATMUL_ALONE = "a matmul runs on the cube core in a group of its own (only a bias row and a ReLU join it)"
PARTIAL_REFUSAL = "its result is complete only after the group's last tile"


def check_regions(g: TensorGraph, refusals: dict[int, str] | None = None) -> None:
    """Every `pypto.fuse()` region in one group, or an UnsupportedError at the first op (in graph
    order) that is not in the group of the region's first op, saying why (`refusals`: node id ->
    the reason fusion gave when it could not put the op there)."""
    first: dict = {}
    for n in g.nodes:
        region, gid = n.attrs.get("fuse"), n.attrs.get("group")
        if region is None or gid is None:
            continue
        if region not in first:
            first[region] = n
            continue
        lead = first[region]
        if gid == lead.attrs["group"]:
            continue
        why = (refusals or {}).get(n.id)
        if why is None:
            why = MATMUL_ALONE if n.op == "matmul" else "fusion could not place it there"
        where = f" (the `with pypto.fuse()` at {region.loc.short()})" if region.loc is not None else ""
        lead_at = f" at {lead.loc.short()}" if lead.loc is not None else ""
        hint = ("end the region before this op, or start a new one after it" if why in (CUBE_REFUSAL, MATMUL_ALONE)
                else "end the region before this op")
        if why.endswith(PARTIAL_REFUSAL):
            hint = ("give the reduced dim one tile (set_vec_tile_shapes with its full size) so that the "
                    "reduction ends in the tile that reads it, or " + hint)
        raise UnsupportedError(
            f"pypto.fuse() region {region}{where} cannot stay one group: '{n.op}' cannot join the group of "
            f"'{lead.op}'{lead_at}: {why}", loc=n.loc,
            expected="the ops of the region in one group", got=f"'{n.op}' in group {gid}, '{lead.op}' in group "
                                                                f"{lead.attrs['group']}", hint=hint)


def order_groups(g: TensorGraph) -> TensorGraph:
    """The groups renumbered (when they must be) so that their order keeps the kernel's stores in
    program order where they write overlapping regions of an output: groups run in number order
    (their tasks, and the tasks' GM dependences, follow it), and a store goes with the group of
    the value it writes, which may be made earlier than the value of an earlier store.

        new = x[0:8, 0:8] + 1.0      # group 0
        out[:] = x                   # group 1 (a copy)
        out[0:8, 0:8] = new          # with group 0: it must run after group 1

    The order is a topological one of the groups' data edges (a group reads the values of the
    groups before it) and these store edges, the numbering kept where it already is one.  When
    no order exists, the later store is refused at its line."""
    from ..ir.core import topological_order
    from ..ir.gm import GMBuffer, GMRef
    group = {n.id: n.attrs["group"] for n in g.nodes if "group" in n.attrs}
    if len(set(group.values())) < 2:
        return g
    by_id = {n.id: n for n in g.nodes}
    made_by: dict[int, frozenset] = {}      # value -> the groups that make it (through views)

    def makers(i: int) -> frozenset:
        got = made_by.get(i)
        if got is None:
            if i in group:
                got = frozenset((group[i],))
            else:
                got = frozenset().union(*(makers(j) for j in by_id[i].inputs)) if by_id[i].inputs else frozenset()
            made_by[i] = got
        return got

    edges: dict[int, set] = {gid: set() for gid in set(group.values())}
    for n in g.nodes:
        if n.id in group:
            for i in n.inputs:
                for h in makers(i):
                    if h != group[n.id]:
                        edges[h].add(group[n.id])
    buffers = {p.name: GMBuffer(p.name, p.shape, p.dtype, "output") for p in g.params}
    stores = [(n, GMRef.whole(buffers[n.attrs["param"]]).window(n.attrs["offsets"], n.shape, n.attrs.get("steps")),
               makers(n.inputs[0])) for n in g.nodes if n.op == "store" and n.attrs.get("param") in buffers]
    wanted: dict[tuple, object] = {}        # (earlier group, later group) -> the later store
    for k, (s1, r1, g1) in enumerate(stores):
        for s2, r2, g2 in stores[k + 1:]:
            if r1.overlaps(r2):
                for a in g1:
                    for b in g2:
                        if a != b:
                            edges[a].add(b)
                            wanted.setdefault((a, b), s2)
    if all(b > a for a, bs in edges.items() for b in bs):
        return g                            # the numbering keeps every order already
    order = topological_order(edges)
    if len(order) < len(edges):             # a cycle: some store cannot keep its place
        stuck = set(edges) - set(order)
        store = next(s for (a, b), s in wanted.items() if a in stuck and b in stuck)
        raise UnsupportedError(
            f"this store to '{store.attrs['param']}' writes over a region an earlier store writes, but its value "
            "is computed together with values that store needs first", loc=store.loc,
            expected="stores to overlapping regions whose values can be computed in program order",
            got=f"{store.attrs['param']}{list(store.shape)} at offsets {list(store.attrs['offsets'])}",
            hint="write the regions in the other order, or compute this value after the earlier store's")
    new = {old: k for k, old in enumerate(order)}
    return g.replace([n.replace(attrs=n.attrs.replace(group=new[n.attrs["group"]])) if "group" in n.attrs else n
                      for n in g.nodes])


def whole_row_plan(g: TensorGraph, ctx: PassContext | None) -> dict[tuple[int, ...], int]:
    """{domain: rows}: the domains whose default vector tile becomes `rows` whole rows
    (`tileshape.default_vec_tile`).

    A domain is a candidate when an op without a kernel tile shape reduces it along its last
    dim and the default tile would cut that dim (rows wider than MAX_ROW_BYTES).  Row counts are
    tried from the largest power of two whose tile UB could hold at all (at most the domain's
    rows) down to 1.  For each, the graph is grouped with it and one iteration of every group
    that got whole rows over the domain is lowered: its live tiles after lifetime reuse, times
    the buffers, are what `allocate` will need (`memory.buffers_that_fit`).  The domain gets
    the first count with which all of them fit UB with the buffering asked for (two buffers,
    one when the option double_buffer is off) and one of them reduces along the last dim; else
    the largest that fits with one buffer (while one core computes, the other cores' transfers
    keep HBM busy: cheaper than reading the rows again); else (not even one row fits) none, and
    the domain keeps the cut default.  Without a context (no machine) nothing is planned."""
    if ctx is None:
        return {}
    doms: dict[tuple[int, ...], int] = {}          # domain -> widest element reduced along it
    for n in g.nodes:
        if OPS[n.op].kind != "reduce" or "tile" in n.attrs:
            continue
        dom = _iter_shape(g, n)
        if n.attrs["dim"] == len(dom) - 1 and default_vec_tile(dom, n.dtype)[-1] < dom[-1]:
            doms[dom] = max(doms.get(dom, 0), n.dtype.itemsize)
    if not doms:
        return {}
    ub = ctx.machine.capacities()["UB"]
    want = 2 if ctx.options.get("double_buffer", True) else 1
    plan: dict[tuple[int, ...], int] = {}
    for dom, itemsize in sorted(doms.items()):
        most = ub // (dom[-1] * itemsize)           # whole rows of one tile that UB could hold
        lead = dom[-2] if len(dom) >= 2 else 1
        single = None
        for rows in sorted({min(1 << k, lead) for k in range(most.bit_length())}, reverse=True):
            nbuf = _whole_row_buffers(g, ctx, {**plan, dom: rows}, dom, want)
            if nbuf >= want:
                plan[dom] = rows
                break
            if nbuf and single is None:
                single = rows
        else:
            if single is not None:
                plan[dom] = single
    return plan


def fitting_plan(g: TensorGraph, ctx: PassContext | None, plan: dict, fused: TensorGraph,
                 groups: list["_Group"]) -> dict[tuple[int, ...], int]:
    """The row plan (`whole_row_plan`) with fewer rows for the domains where a group of pypto's
    default tile does not fit UB even single-buffered.

    The default tile holds about 16 KiB of data, but a group of many live tiles (a long fused
    chain, a backward kernel) can need more than UB even with one buffer, and rows narrower than
    32 bytes are padded to 32 (a last dim of 1 in fp32 takes eight times its bytes): the kernel
    would be refused though the user chose no tile.  For such a domain, when the default keeps
    its rows whole, the row count is halved until every group over the domain fits: the largest
    count whose tiles fit with the buffering asked for (two, one with double_buffer off), else
    the largest that fits once.  A domain whose default cuts its rows, or where even one row
    does not fit, keeps its tile and gets the allocator's error, which says what did not fit.
    Groups that fit are left as they are, so the programs of kernels that compiled before do
    not change."""
    if ctx is None:
        return plan
    caps = ctx.machine.capacities()
    want = 2 if ctx.options.get("double_buffer", True) else 1
    tight = {grp.domain: grp.tile[-2] for grp in groups
             if grp.kind == "vector" and grp.auto and len(grp.domain) >= 2 and grp.tile[-1] == grp.domain[-1]
             and grp.tile[-2] > 1 and _group_buffers(fused, caps, [grp.id], 1) == 0}
    out = dict(plan)
    for dom, rows in sorted(tight.items()):
        single = None
        while rows > 1:
            rows //= 2
            trial = {**out, dom: rows}
            fused_t, groups_t = _fuse(g, ctx, trial)
            nbuf = _group_buffers(fused_t, caps, [grp.id for grp in groups_t if grp.domain == dom], want)
            if nbuf >= want:
                single = None
                out = trial
                break
            if nbuf and single is None:
                single = rows
        if single is not None:
            out[dom] = single
    return out


def _group_buffers(fused: TensorGraph, caps: dict, gids, want: int) -> int:
    """The buffers (at most `want`, 0: none fits) UB gives one iteration of each of the groups
    `gids` of a fused graph, as `allocate` will size them (-1: cannot tell, the tiling pass will)."""
    try:
        iterations = first_iterations(fused, set(gids))
    except PyptoError:
        return -1
    nbuf = want
    for nodes in iterations.values():
        spaced = assign_spaces(TileGraph(fused.name, (), (), tuple(nodes)))
        nbuf = min([nbuf, *buffers_that_fit(list(spaced.nodes), caps, want).values()])
    return nbuf


def _whole_row_buffers(g, ctx, plan, dom, want) -> int:
    """The buffers (at most `want`, 0: none fits) UB gives the tiles of every group over `dom`
    that grouping with `plan` makes with whole rows, when one of them reduces along the last
    dim (else 0: the plan would not keep a reduction whole)."""
    fused, groups = _fuse(g, ctx, plan)
    gids = {grp.id for grp in groups if grp.whole_rows and grp.domain == dom}
    last = len(dom) - 1
    if not any(OPS[n.op].kind == "reduce" and n.attrs.get("group") in gids and n.attrs["dim"] == last
               for n in fused.nodes):
        return 0
    return max(0, _group_buffers(fused, ctx.machine.capacities(), gids, want))   # -1: left to the tiling pass


def _fuse(g: TensorGraph, ctx: PassContext | None, plan: dict,
          refusals: dict | None = None) -> tuple[TensorGraph, list["_Group"]]:
    """The fused graph and its groups; `plan`: {domain: rows} of whole-row default tiles;
    `refusals` receives why a `pypto.fuse()` region's op could not join its region's group."""
    groups: list[_Group] = []
    regions: dict = {}                 # FuseRegion -> the group of its first op
    group_of: dict[int, int] = {}      # member value -> group id
    source_group: dict[int, int] = {}  # GM-resident value -> group that writes it (-1: kernel input)
    partial: set[int] = set()
    materialize: set[int] = set()
    tile_of: dict[int, tuple[int, ...]] = {}
    join = ctx is None or ctx.options.get("fusion", True)
    users = g.users()
    epilogue: dict[int, str] = {}      # cube group result value -> "" | "bias" | "relu" (what it ends with)
    cube_tile: dict[int, tuple[int, int]] = {}     # cube group result value -> its output tile (mL0, nL0)

    def enter_region(n, gid):
        if n.attrs.get("fuse") is not None:
            regions.setdefault(n.attrs["fuse"], gid)

    def place(n):
        floating.discard(n.id)
        _place_vector(g, n, groups, group_of, partial, tile_of, ensure_gm, join=join,
                      nest=_epilogue_nest(g, n, cube_tile), floating=floating, plan=plan,
                      regions=regions, refusals=refusals)

    floating: set[int] = set()         # values made from nothing (fill, iota) not yet placed

    def ensure_gm(i: int) -> int:
        """Make value i GM-resident; return the group that produces it (-1 for none)."""
        if i in source_group:
            return source_group[i]
        if i in floating:                   # read by a group that cannot compute it: a group of its own
            place(g.node(i))
        if i in group_of:
            materialize.add(i)
            source_group[i] = group_of[i]
            return group_of[i]
        return -1  # constants

    for n in g.nodes:
        kind = OPS[n.op].kind
        if kind in ("input", "scratch"):
            source_group[n.id] = -1
        elif kind == "layout":
            source_group[n.id] = ensure_gm(n.inputs[0])
        elif kind in ("const", "store"):
            continue
        elif not n.inputs:
            # made from nothing (a fill, an iota): computed, tile by tile, in the group of its first
            # vector reader (or in a group of its own when something else reads it first)
            floating.add(n.id)
        elif n.op == "matmul" and join and (into := _accumulates_into(g, n, groups, group_of, epilogue, users, ctx)) is not None:
            for i in n.inputs:
                ensure_gm(i)
            groups[group_of[into]].members.append(n.id)     # its sum with `into` follows
            group_of[n.id] = group_of[into]
            enter_region(n, group_of[into])
        elif n.op == "matmul":
            for i in n.inputs:
                ensure_gm(i)
            grp = _Group(len(groups), "cube", n.shape, None)
            enter_region(n, grp.id)
            groups.append(grp)
            grp.members.append(n.id)
            group_of[n.id] = grp.id
            materialize.add(n.id)
            source_group[n.id] = grp.id
            epilogue[n.id] = ""
            if ctx is not None:
                ml0, _, nl0, _ = matmul_cube_tile(g, n, ctx.machine)
                cube_tile[n.id] = (ml0, nl0)
        elif join and not floating.intersection(n.inputs) and (
                found := _epilogue_of(g, n, epilogue, group_of, users)) is not None and _made_before(
                g, n, found[0], group_of, floating):
            tail, kind = found
            gid = group_of[tail]
            groups[gid].members.append(n.id)
            group_of[n.id] = gid
            enter_region(n, gid)
            for i in n.inputs:
                if i != tail and group_of.get(i) != gid:
                    ensure_gm(i)            # the bias row
            materialize.discard(tail)       # its only user is n: the group's result moves on
            del source_group[tail]
            materialize.add(n.id)
            source_group[n.id] = gid
            epilogue[n.id] = kind
            del epilogue[tail]
            if tail in cube_tile:
                cube_tile[n.id] = cube_tile.pop(tail)
        else:
            place(n)
    for i in sorted(floating):              # read only by stores
        if users[i]:
            place(g.node(i))
    for n in g.nodes:                       # a write's tiles go to its buffer, which is in GM
        if OPS[n.op].kind == "write":
            ensure_gm(n.inputs[0])
            materialize.add(n.id)
    nodes = []
    for n in g.nodes:
        if n.id in group_of:
            extra = {"group": group_of[n.id]}
            if n.id in tile_of:
                extra["tile"] = tile_of[n.id]
                if "tile" not in n.attrs:       # chosen by pypto, not by set_vec_tile_shapes
                    extra["auto_tile"] = True
            if n.id in materialize:
                extra["materialize"] = True
            n = n.replace(attrs=n.attrs.replace(**extra))
        nodes.append(n)
    return g.replace(nodes), groups


def _epilogue_nest(g, n, cube_tile) -> tuple[int, ...] | None:
    """The output tile of the cube group whose result n reads (directly or through transposes,
    as an NCHW convolution's result is), over n's dims; None when n reads none."""
    for i in n.inputs:
        src, perm = transpose_source(g, i)
        if src in cube_tile and g.node(i).shape == n.shape:
            return cube_nest(cube_tile[src], perm)
    return None


def _place_vector(g, n, groups, group_of, partial, tile_of, ensure_gm, join=True, nest=None, floating=None,
                  plan=None, regions=None, refusals=None):
    """`nest`: the output tile of the cube group whose result n reads, over n's dims; without
    a tile of the kernel's, a group n starts gets a tile nested in it (its cube tiles are then
    finished by whole vector tiles, which lets the epilogue pair with the cube task).  `floating`:
    values made from nothing (fill, iota) not placed yet; those n reads join its group, before it.
    `plan`: {domain: rows} (`whole_row_plan`); without a tile of the kernel's (or an epilogue's),
    a group n starts over a planned domain gets that many whole rows.  `regions`: {FuseRegion:
    group of its first op}; an op of a region tries that group first (`refusals` gets why not)."""
    dom = _iter_shape(g, n)
    dtype = g.node(n.inputs[0]).dtype if OPS[n.op].kind in ("cast", "compare") else n.dtype
    own_tile = None
    if nest is not None and "tile" not in n.attrs and len(dom) >= 2 and OPS[n.op].kind != "reduce":
        own_tile = epilogue_vec_tile(dom, dtype, nest)
    rows = None
    auto = False
    if own_tile is None:
        rows = (plan or {}).get(dom) if "tile" not in n.attrs else None
        own_tile = normalize_vec_tile(n.attrs.get("tile"), dom, dtype, n.loc, rows)
        auto = "tile" not in n.attrs
    ins = [i for i in n.inputs if g.node(i).op != "const"]
    # with fusion off (options {"fusion": False}) every op is a group of its own
    cands = sorted({group_of[i] for i in ins if i in group_of}, reverse=True) if join else []
    region = n.attrs.get("fuse") if join and regions is not None else None
    forced = regions.get(region) if region is not None else None
    if forced is not None:
        cands = [forced] + [c for c in cands if c != forced]    # a pypto.fuse() region's group first
    # a reader of a write's result reads the whole buffer from GM, after the write: in the
    # write's group its tile would be the written value's, not the buffer's (a later write
    # into the same buffer does not read it)
    cands = [c for c in cands if not any(group_of.get(i) == c and OPS[g.node(i).op].kind == "write"
                                         and not (n.op == "write" and i == n.inputs[0]) for i in ins)]
    cands = _indexed_candidates(g, n, dom, cands, groups, group_of, ensure_gm)
    if forced is not None and forced not in cands and refusals is not None:
        refusals.setdefault(n.id, "it reads or makes a value written into memory by an indexed write (a scatter "
                                  "or a write into a buffer), which must be complete before its readers run")
    chosen = None
    for gid in cands:
        grp = groups[gid]
        why = _refusal(g, n, grp, dom, dtype, ins, group_of, partial)
        if why is None:
            chosen = grp
            break
        if gid == forced and refusals is not None:
            refusals.setdefault(n.id, why)
    if chosen is None:
        chosen = _Group(len(groups), "vector", dom, own_tile, whole_rows=rows is not None, auto=auto)
        groups.append(chosen)
    for i in ins:
        if join and floating is not None and i in floating:   # computed here, tile by tile, just before n
            floating.discard(i)
            chosen.members.append(i)
            group_of[i] = chosen.id
            tile_of[i] = chosen.tile
        elif group_of.get(i) != chosen.id:
            ensure_gm(i)
    pd = _partial_dim(n, chosen.domain, chosen.tile)
    if pd is not None:
        chosen.partial_dim = pd
        partial.add(n.id)
    chosen.members.append(n.id)
    group_of[n.id] = chosen.id
    tile_of[n.id] = chosen.tile
    chosen.closed = chosen.closed or (OPS[n.op].kind == "write" and n.op != "write")
    if region is not None:
        regions.setdefault(region, chosen.id)


def _refusal(g, n, grp, dom, dtype, ins, group_of, partial) -> str | None:
    """Why vector op n cannot join group `grp` (None: it can)."""
    gid = grp.id
    if grp.kind != "vector":
        return CUBE_REFUSAL
    shape = dom if OPS[n.op].kind == "write" else n.shape
    fits = grp.domain == dom or (OPS[n.op].kind != "reduce"
                                 and broadcast_shapes(shape, grp.domain) == grp.domain
                                 and len(shape) <= len(grp.domain))
    if not fits:
        return f"it iterates over {list(dom)}, the group over {list(grp.domain)}"
    tile = grp.tile if "tile" not in n.attrs else normalize_vec_tile(n.attrs["tile"], grp.domain, dtype, n.loc)
    if tile != grp.tile:
        return f"its tile {list(tile)} differs from the group's {list(grp.tile)}"
    busy = next((i for i in ins if i in partial and group_of.get(i) == gid), None)
    if busy is not None:
        r = g.node(busy)
        d = r.attrs["dim"]
        at = f" at {r.loc.short()}" if r.loc is not None else ""
        return (f"it reads the {r.op}{at}, a reduction over dim {d} that spans {ceil_div(grp.domain[d], grp.tile[d])} "
                f"tiles of {grp.tile[d]}: {PARTIAL_REFUSAL}")
    late = next((i for i in ins if group_of.get(i) != gid and _producer(i, group_of, g) >= gid), None)
    if late is not None:
        r = g.node(late)
        at = f" at {r.loc.short()}" if r.loc is not None else ""
        return f"it reads the {r.op}{at}, a value computed by a group that runs after this one"
    pd = _partial_dim(n, grp.domain, grp.tile)
    if pd is not None and grp.partial_dim not in (None, pd):
        return f"it reduces over dim {pd} across tiles, and the group already reduces over dim {grp.partial_dim}"
    return None


def _indexed_candidates(g, n, dom, cands, groups, group_of, ensure_gm) -> list[int]:
    """The groups an op may join, without those scatters have closed; for an indexed op, also
    without the group producing its GM-side input (a gather's source, a scatter's buffer: read or
    written at any element, so complete before), which is made GM-resident; a scatter joins only
    a group of its own domain (a larger one would run it once per tile of the broadcast)."""
    cands = [c for c in cands if not groups[c].closed]
    kind = OPS[n.op].kind
    if kind != "gather" and (kind != "write" or n.op == "write"):
        return cands
    ensure_gm(n.inputs[0])
    src = _producer(n.inputs[0], group_of, g)
    return [c for c in cands if c != src and (kind == "gather" or groups[c].domain == dom)]


def _accumulates_into(g, n, groups, group_of, epilogue, users, ctx) -> int | None:
    """The cube group result matmul n is summed with, when the sum can accumulate in L0C
    (None otherwise): n's only user adds it to a group result that is still a matmul or a sum
    of them (no bias or ReLU yet), of the same shape and dtype, with the same K, operand dtype
    and cube tile.  A convolution traces as such a sum, one matmul per kernel position."""
    us = users[n.id]
    u = g.node(us[0]) if len(us) == 1 else None
    if u is None or u.op != "add" or len(u.inputs) != 2:
        return None
    other = next(i for i in u.inputs if i != n.id)
    if epilogue.get(other) not in ("", "sum") or len(users[other]) != 1:
        return None
    first = g.node(groups[group_of[other]].members[0])          # the group's first matmul
    if (g.node(other).shape != n.shape or g.node(other).dtype != n.dtype or u.dtype != n.dtype
            or matmul_k(g, first) != matmul_k(g, n) or g.node(first.inputs[0]).dtype != g.node(n.inputs[0]).dtype):
        return None
    if ctx is not None and matmul_cube_tile(g, first, ctx.machine) != matmul_cube_tile(g, n, ctx.machine):
        return None
    return other


def _epilogue_of(g, n, epilogue, group_of, users) -> tuple[int, str] | None:
    """(the cube group result that n finishes on the cube core, what n is: "sum", "bias" or
    "relu"), or None when n is not an epilogue: its sum with another matmul of the group
    (accumulated in L0C), a bias row added to it (before any ReLU), or a ReLU of it; the result
    must have no other user and keep its dtype."""
    kind = None
    if n.op == "relu" and epilogue.get(n.inputs[0]) in ("", "sum", "bias"):
        tail, kind = n.inputs[0], "relu"
    elif n.op == "add":
        tail = next((i for i in n.inputs if i in epilogue), None)
        other = [i for i in n.inputs if i != tail]
        if tail is not None and len(other) == 1 and epilogue[tail] in ("", "sum"):
            kind = ("sum" if group_of.get(other[0]) == group_of[tail]
                    else "bias" if _is_bias_row(g, other[0], n) and not _truncated(g, tail, other[0]) else None)
    if kind is None or len(users[tail]) != 1 or g.node(tail).dtype != n.dtype or g.node(tail).shape != n.shape:
        return None
    return tail, kind


def _truncated(g, tail, bias) -> bool:
    """Whether a bias row `bias` would lose its fraction in the accumulator of the matmul that
    `tail` ends with: the cube sums int8 products in int32 (tiling), which a float bias row in
    the bias table would start from (a fuzzed int8 matmul + fp32 bias came out whole numbers).
    Such a bias is added by a vector group, in its own dtype."""
    m = g.node(tail)
    while m.op != "matmul":             # (a sum of matmuls: its first input is one of them)
        if not m.inputs:
            return False
        m = g.node(m.inputs[0])
    return g.node(m.inputs[0]).dtype.name == "int8" and not g.node(bias).dtype.name.startswith("int")


def _made_before(g, n, tail, group_of, floating) -> bool:
    """Whether every input of epilogue n but the cube group's own values is computed before that
    group runs: a kernel input, a constant, or the value of an earlier group.  A bias computed
    by a later group (a row reduction after the matmul in the kernel) would be read by the cube
    task before it is written (a fuzzed `x.prod(1) + matmul(..)` added zeros)."""
    gid = group_of[tail]
    for i in n.inputs:
        if i == tail or group_of.get(i) == gid:
            continue
        src = g.node(i)
        while OPS[src.op].kind == "layout":
            src = g.node(src.inputs[0])
        if src.id in floating or group_of.get(src.id, -1) >= gid:
            return False
    return True


def _is_bias_row(g, i, n) -> bool:
    """Value i is one row of n's last dim, broadcast over the other dims (shape [N] or [1, N])."""
    b = g.node(i)
    return (b.op != "const" and b.shape[-1] == n.shape[-1] and all(d == 1 for d in b.shape[:-1])
            and len(n.shape) >= 2)


def _producer(i, group_of, g) -> int:
    """Group that produces value i, following GM views back to their source (-1: none)."""
    n = g.node(i)
    while OPS[n.op].kind == "layout":
        n = g.node(n.inputs[0])
    return group_of.get(n.id, -1)


def _partial_dim(n, domain, tile) -> int | None:
    if OPS[n.op].kind != "reduce":
        return None
    d = n.attrs["dim"]
    return d if ceil_div(domain[d], tile[d]) > 1 else None


FUSION_PASSES = [Pass("fusion", "tensor", fuse,
                      "group elementwise chains and reductions that can run tile by tile")]
