"""Block-level pass `l1_reuse`: a tile still in its on-chip slot is not loaded again.

A task runs its outer iterations one after another on one core, so its buffers carry over from
one output tile to the next.  Tiling arranges for that to pay off in matmuls: K runs serpentine
(forward, then backward) and the operand panel consecutive output tiles share sits in a ring of
L1 slots picked by K chunk, so the chunks one tile loaded last are the ones the next tile needs
first (see tiling._lower_matmul).  The same holds for any load whose slot happens to still hold
its window, e.g. a vector kernel's weight row reloaded for every row block.

The pass replays each task's tile ops in program order, tracking what every slot holds: a TLOAD
puts its GM window in its slot, any other on-chip write clears what it overwrites, and a TSTORE
to GM clears the slots holding windows it overlaps.  A TLOAD whose slot already holds the same
window (same tile shape, valid shape, dtype and layout) is dropped and its users read the tile
that is there.  The exactness of that replay is what makes the pass safe: it never depends on
how the slots were chosen.  `options={"l1_reuse": False}` turns off both this pass and the
serpentine order.
"""
from __future__ import annotations

import dataclasses
import itertools

from ..ir.block import BlockGraph
from ..ir.gm import moved_alike, window_columns
from ..ir.tile import LoopPart, LoopTileGraph, tile_bytes
from .memory import copy_period
from .pipeline import Pass, PassContext
from .reuse import load_key, without_loads


def reused_loads(g: BlockGraph) -> dict[int, int]:
    """{id of a TLOAD whose slot already holds its window: id of the TLOAD that put it there}.

    A task of a loop (`LoopTileGraph.loop_of`) has its nodes made for its iterations alone, and
    when its loads go to spaces no other node of the loop writes, only its loads and stores
    (`gm_only`): the other nodes change no slot a load could find its window in."""
    tiles = g.tiles
    parts = tiles.loop_tasks(g.tasks) if isinstance(tiles, LoopTileGraph) else None
    nodes = None
    dup: dict[int, int] = {}
    # tile shape -> (the dtype object of its last tile, tile_bytes): tile_bytes hashes the dtype
    # in Python, and a matmul's tiles are of a few shapes of one dtype
    sizes: dict[tuple, tuple] = {}
    apart: dict[int, bool] = {}         # id of a loop -> its loads' spaces are only theirs
    reps: dict[int, dict] = {}          # id of a loop -> `_iteration_ops`' representatives
    # a task of a loop alike a task replayed before (`LoopPart.task_key`), its windows those of
    # that one moved by one offset per buffer: every window it loads equals, overlaps or misses
    # another as there, so its drops are that one's, its ids moved.  task key -> (that task's
    # first node id, its windows by column (`window_columns`), its drops less its first id)
    replayed: dict[tuple, tuple] = {}
    for k, t in enumerate(g.tasks):
        part = parts[k] if parts is not None else None
        if part is not None and part[0].windows_apart:
            continue        # (no window loaded twice in the loop: no load to drop, whatever the slots hold)
        key = None
        if part is not None:
            r = reps.setdefault(id(part[0]), {})
            if None not in r:
                r[None] = copy_period(part)
            key = part.task_key(t.outer, t.nodes, r[None])
            like = replayed.get(key) if key is not None else None
            if like is not None and moved_alike([gm for _, gm in part.windows(t.outer)], like[1]):
                first = t.nodes[0]
                dup.update((a + first, b + first) for a, b in like[2])
                continue
            ok = apart.get(id(part[0]))
            if ok is None:
                ok = apart[id(part[0])] = _loads_apart(part)
            if ok:
                ops = part.nodes(t.outer, gm_only=True)
            else:       # (a loop whose other nodes write where its loads go, a vector group's UB)
                ops = _iteration_ops(part, t.outer, r)
        else:
            if nodes is None:
                nodes = tiles.plain_by_id() if parts is not None else tiles.by_id()
            ops = map(nodes.__getitem__, t.nodes)
        mine: dict[int, int] = {}
        _replay(ops, mine, sizes)
        dup.update(mine)
        if key is not None and key not in replayed:
            first = t.nodes[0]
            replayed[key] = (first, window_columns([gm for _, gm in part.windows(t.outer)]),
                             [(a - first, b - first) for a, b in mine.items()])
    return dup


def _replay(ops, dup: dict, sizes: dict) -> None:
    """Replay one task's nodes `ops` in program order, tracking what every slot holds; each
    TLOAD whose slot holds its window goes into `dup` (see `reused_loads`)."""
    # per space: slot address -> (end, load key, load id, its window) of the window it holds;
    # the slots of a space never meet (a load clears whatever its own slot meets)
    held: dict[str, dict[int, tuple[int, tuple, int, object]]] = {}
    for n in ops:
        op = n.op
        if op == "TSTORE":
            w = n.attrs._dict["gm"]
            name = w.buf.name
            for slots in held.values():
                gone = [a for a, (_, key, _, gm) in slots.items() if key[0] == name and gm.overlaps(w)]
                for a in gone:
                    del slots[a]
            continue
        space = n.space
        if not space:
            continue
        slots = held.get(space)
        if not slots and op != "TLOAD":
            continue                # nothing held there to clear (the L0 tiles of a matmul)
        d = n.attrs._dict
        if "buf" not in d:
            continue
        if slots is None:
            slots = held[space] = {}
        lo = d["buf"]
        size = sizes.get(n.shape)
        if size is None or size[0] is not n.dtype:
            size = sizes[n.shape] = (n.dtype, tile_bytes(n.shape, n.dtype))
        hi = lo + size[1]
        have = slots.get(lo)
        if op == "TLOAD":
            key = load_key(n)
            if have is not None and have[0] == hi and have[1] == key:
                dup[n.id] = have[2]
                continue
        if have is not None and have[0] == hi > lo:
            del slots[lo]           # (the only slot its bytes meet: slots never meet)
        elif slots:
            gone = [a for a, (b, _, _, _) in slots.items() if a < hi and lo < b]
            for a in gone:
                del slots[a]
        if op == "TLOAD":
            slots[lo] = (hi, key, n.id, d["gm"])


def _loads_apart(part: LoopPart) -> bool:
    """Whether no node of the loop but its loads writes bytes its loads go to, in any copy of
    their slots (its templates say it of every iteration; a slot's copies are those `par` + k
    takes, as the Tile level's verifier walks them): then the other nodes change no slot a load
    could find its window in (a matmul's loads go to L1, which nothing else writes; a vector
    group's to UB slots of their own)."""
    loop, _, place, _ = part
    loads: dict[str, list] = {}
    others: dict[str, list] = {}
    for raw, template in zip(loop.templates, part.templates()):
        for r, n in zip(raw, template):
            if not n.space or n.space == "?" or n.op == "TSTORE":
                continue
            size = tile_bytes(n.shape, n.dtype)
            nbuf = n.attrs._dict.get("nbuf", 1)
            bufs = {n.attrs._dict.get("buf", 0)} | ({place(r.attrs, r.par + k)._dict["buf"] for k in range(1, nbuf)}
                                                     if place is not None else set())
            (loads if n.op == "TLOAD" else others).setdefault(n.space, []).extend((b, b + size) for b in bufs)
    for space, mine in loads.items():
        theirs = others.get(space)
        if theirs and any(lo < b and a < hi for lo, hi in set(mine) for a, b in set(theirs)):
            return False
    return True


def _iteration_ops(part: LoopPart, outer, reps: dict):
    """The nodes of a loop's outer iterations `outer` as the replay reads them: its loads and
    stores made for them (their ids and windows are theirs), every other node that of a
    representative iteration of the same kind and the same copies of its slots (`copy_period`
    apart: the same op, space, buffer and shape), made once (`reps`: (kind, phase) -> its
    nodes; None -> the loop's `copy_period`).  All of the iterations' nodes made when the
    loop's placement is not the allocator's."""
    loop = part[0]
    period = reps.get(None)
    if period is None:
        period = reps[None] = copy_period(part)
    if not period or loop.kind is None:
        yield from part.nodes(outer)
        return
    gm = iter(part.nodes(outer, gm_only=True))
    for o in outer:
        key = (loop.kind(o), o % period)
        rep = reps.get(key)
        if rep is None:
            rep = reps[key] = [(n, "gm" in n.attrs._dict) for n in part.nodes([o])]
        for n, moves in rep:
            yield next(gm) if moves else n


def l1_reuse(g: BlockGraph, ctx: PassContext | None = None) -> BlockGraph:
    if ctx is not None and not ctx.options.get("l1_reuse", True):
        return g
    dup = reused_loads(g)
    if not dup:
        return g
    tasks = [dataclasses.replace(t, nodes=tuple(itertools.filterfalse(dup.__contains__, t.nodes))) for t in g.tasks]
    return BlockGraph(g.name, _without(g.tiles, dup), tuple(tasks))


def _without(tiles, dup: dict[int, int]):
    """The tile graph without the loads of `dup` (their readers reading the loads kept): a
    loop's nodes made without them when they are made (`NodeLoop.make`'s `dropped`)."""
    if not isinstance(tiles, LoopTileGraph) or "_nodes" in tiles.__dict__:
        return tiles.replace(list(without_loads(tiles.nodes, dup)))
    parts = []
    for p in tiles.parts:
        if isinstance(p, LoopPart):
            lo, hi = p[0].start, p[0].start + p[0].count
            mine = {d: k for d, k in dup.items() if lo <= d < hi}
            if p[3]:
                mine.update(p[3])
            parts.append(LoopPart(p[0], p[1], p[2], mine or None))
        else:
            parts.append(tuple(without_loads(p, dup)))
    return tiles.with_parts(parts)


L1_REUSE = Pass("l1_reuse", "block", l1_reuse,
                "drop a load whose on-chip slot still holds its window from an earlier tile of the task")
