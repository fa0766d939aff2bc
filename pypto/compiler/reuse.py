"""Tile-level data reuse: redundant-load elimination.

Tiling emits the loads of each iteration of a group's tile loop on their own, so a value that
does not change along the inner (reduced) loop is reloaded for every inner iteration: in a
softmax whose rows span several column tiles (TN < N), the second group reloads the same row
maximum `ws0[r0:r1, 0:1]` for every column tile of a row block.

`eliminate_redundant_loads` keeps the first TLOAD of a GM window in each outer iteration and
points the users of the later, identical TLOADs (same window, tile shape, valid shape, dtype and
space) at it.  When the kept tile is used in a later inner iteration it must survive the whole
outer iteration: it becomes `persistent` with `par` = the outer index, as tiling does for
accumulators, so that `allocate` gives its key a fixed slot (double-buffered across outer
iterations, so the next row block's load can still run ahead).

It leaves a load alone when
- a TSTORE of the same outer iteration writes GM overlapping the window between the two loads
  (the second load would see new data);
- keeping the tile would make its key hold two live tiles at once (the key's loads are not all
  of one window in some outer iteration; a persistent key has one slot per outer iteration);
- the fixed slot would make the group's tiles stop fitting on chip with the N-buffering they
  had before (allocation would fall back to fewer buffers: fewer loads, but a slower loop).

Node ids are kept (the removed ids are simply gone), so the rest of the graph reads the same.
"""
from __future__ import annotations

from ..ir.exec import Intervals
from ..ir.core import Attrs
from ..ir.tile import LoopPart, LoopTileGraph, TileGraph, TileNode, copier
from .pipeline import Pass, PassContext


def load_key(n: TileNode) -> tuple:
    w = n.attrs._dict["gm"]  # plain ints and strings: cheap to hash (the pass sees every load)
    return (w.buf.name, w.offset, w.shape, w.strides, n.shape, n.valid, n.dtype.name, n.space)


def find_redundant_loads(g: TileGraph) -> dict[int, int]:
    """{id of a redundant TLOAD: id of the earlier TLOAD of the same iteration it duplicates}.

    The loads kept so far are indexed per (group, outer iteration, buffer) by the span of their
    window, so a store looks only at the loads whose spans meet its own (an outer iteration of
    31,000 inner ones made this quadratic: 31 s).  An index is built when a store first meets
    the loads of its (group, outer iteration, buffer), and kept up to date from then on: the
    loads of a buffer no store of the iteration writes (a matmul's operands) need none.  None
    when the lowering noted that no iteration loads a window twice (TileGraph.facts)."""
    if g.facts().get("distinct_loads"):
        return {}
    seen: dict[tuple, dict[tuple, tuple]] = {}      # (group, outer, buffer) -> load key -> (first id, window)
    spans: dict[tuple, Intervals] = {}              # (group, outer, buffer) -> span -> its keys
    dup: dict[int, int] = {}
    for n in g.nodes:
        op = n.op
        if op == "TLOAD":
            w = n.attrs._dict["gm"]
            at = (n.group, n.outer, w.buf.name)
            cache = seen.get(at)
            if cache is None:
                cache = seen[at] = {}
            k = load_key(n)
            first = cache.get(k)
            if first is None:
                cache[k] = (n.id, w)
                index = spans.get(at)
                if index is not None:
                    _index_load(index, w, k)
            else:
                dup[n.id] = first[0]
        elif op == "TSTORE":
            w = n.attrs._dict["gm"]
            at = (n.group, n.outer, w.buf.name)
            cache = seen.get(at)
            if not cache:
                continue
            index = spans.get(at)
            if index is None:
                index = spans[at] = Intervals()
                for k, (_, kw) in cache.items():
                    _index_load(index, kw, k)
            for span in index.overlapping(*w.span()):
                keys = index.get(span)
                hit = [k for k in keys if cache[k][1].overlaps(w)]
                for k in hit:                       # later loads must see the store
                    del cache[k]
                    keys.remove(k)
                if not keys:
                    index.remove(span)
    return dup


def _index_load(index: Intervals, w, k: tuple) -> None:
    """Enter load key k, of window w, in its iteration's span index."""
    span = w.span()
    keys = index.get(span)
    if keys is None:
        index.set(span, [k])
    else:
        keys.append(k)


def eliminate_redundant_loads(g: TileGraph, ctx: PassContext | None = None) -> TileGraph:
    """Within one outer iteration of a group, load each GM window once (see the module doc)."""
    if isinstance(g, LoopTileGraph) and "_nodes" not in g.__dict__ and all(
            p[0].distinct_loads for p in g.parts if isinstance(p, LoopPart)):
        return _without_loops(g, ctx)
    dup = find_redundant_loads(g)
    if not dup:
        return g
    nodes = g.by_id()
    # kept tiles read in a later inner iteration must live across the inner loop: their key
    # becomes persistent, which is only sound when the key holds one tile per outer iteration
    pinned: set[tuple[int, str]] = set()
    for d, k in dup.items():
        if nodes[d].inner != nodes[k].inner:
            pinned.add((nodes[k].group, nodes[k].key))
    if pinned:
        bad = _keys_with_two_tiles(g, dup, pinned)
        if bad:
            dup = {d: k for d, k in dup.items()
                   if nodes[d].inner == nodes[k].inner or (nodes[k].group, nodes[k].key) not in bad}
            pinned -= bad
    out = _rebuild(g, dup, pinned)
    if ctx is not None:
        # a group whose tiles would then fit with fewer buffers than before keeps its loads
        worse = _groups_losing_buffers(g, out, {nodes[d].group for d in dup}, ctx)
        if worse:
            dup = {d: k for d, k in dup.items() if nodes[d].group not in worse}
            pinned = {p for p in pinned if p[0] not in worse}
            out = _rebuild(g, dup, pinned) if dup else g       # (none left: g as it was)
    return out


def _without_loops(g: LoopTileGraph, ctx: PassContext | None) -> TileGraph:
    """The pass on a graph whose loops load no window twice in an iteration (their own fact):
    on the nodes of its other groups alone (a group's loads are its own), the loops as they
    are."""
    plain = [p for p in g.parts if not isinstance(p, LoopPart)]
    sub = TileGraph(g.name, g.buffers, g.groups, tuple(n for p in plain for n in p))
    out = eliminate_redundant_loads(sub, ctx)
    if out is sub:
        return g
    by_group: dict[int, list] = {}
    for n in out.nodes:
        by_group.setdefault(n.group, []).append(n)
    return g.with_parts([p if isinstance(p, LoopPart) else tuple(by_group.get(p[0].group, ())) if p else p
                         for p in g.parts])


def _keys_with_two_tiles(g: TileGraph, dup: dict[int, int], pinned: set) -> set:
    """Pinned (group, key)s that would still have two tiles of one outer iteration after removal."""
    count: dict[tuple, int] = {}
    for n in g.nodes:
        gk = (n.group, n.key) if n.space != "" else None
        if gk in pinned and n.id not in dup:
            c = (n.group, n.key, n.outer)
            count[c] = count.get(c, 0) + 1
    return {(grp, key) for (grp, key, _), c in count.items() if c > 1}


def without_loads(nodes, dup: dict[int, int]):
    """The tile nodes without the loads in `dup`, their users reading the kept loads instead."""
    with_inputs = copier("inputs")
    for n in nodes:
        if n.id in dup:
            continue
        for i in n.inputs:
            if i in dup:
                n = with_inputs(n, tuple([dup.get(i, i) for i in n.inputs]))
                break
        yield n


def _rebuild(g: TileGraph, dup: dict[int, int], pinned: set) -> TileGraph:
    if not pinned:
        return g.replace(list(without_loads(g.nodes, dup)))
    out = []
    with_attrs, with_par = copier("attrs"), copier("par")
    # id of a map -> it made persistent: one new map per old one (g keeps the old maps alive)
    made: dict[int, Attrs] = {}
    for n in without_loads(g.nodes, dup):
        if n.space != "" and (n.group, n.key) in pinned:
            a = made.get(id(n.attrs))
            if a is None:
                a = made[id(n.attrs)] = n.attrs.replace(persistent=True)
            n = with_par(with_attrs(n, a), n.outer)
        out.append(n)
    return g.replace(out)


def _groups_losing_buffers(before: TileGraph, after: TileGraph, changed: set[int], ctx: PassContext) -> set[int]:
    from .memory import buffers_that_fit
    caps = ctx.machine.capacities()
    want = 2 if ctx.options.get("double_buffer", True) else 1
    worse = set()
    for gid, (b, a) in _by_group(before, after, changed).items():
        fit = buffers_that_fit(a, caps, want)
        if any(k < want for k in fit.values()):
            was = buffers_that_fit(b, caps, want)
            if any(k < was.get(space, want) for space, k in fit.items()):
                worse.add(gid)
    return worse


def _by_group(before: TileGraph, after: TileGraph, groups: set[int]) -> dict[int, tuple[list, list]]:
    out: dict[int, tuple[list, list]] = {gid: ([], []) for gid in groups}
    for n in before.nodes:
        if n.group in out:
            out[n.group][0].append(n)
    for n in after.nodes:
        if n.group in out:
            out[n.group][1].append(n)
    return out


ELIMINATE_REDUNDANT_LOADS = Pass(
    "eliminate_redundant_loads", "tile", eliminate_redundant_loads,
    "load a GM window once per outer iteration; later users read the kept (persistent) tile")
