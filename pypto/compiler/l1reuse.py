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
from ..ir.tile import tile_bytes
from .pipeline import Pass, PassContext
from .reuse import load_key, without_loads


def reused_loads(g: BlockGraph) -> dict[int, int]:
    """{id of a TLOAD whose slot already holds its window: id of the TLOAD that put it there}."""
    nodes = g.tiles.by_id()
    dup: dict[int, int] = {}
    # tile shape -> (the dtype object of its last tile, tile_bytes): tile_bytes hashes the dtype
    # in Python, and a matmul's tiles are of a few shapes of one dtype
    sizes: dict[tuple, tuple] = {}
    for t in g.tasks:
        # per space: slot address -> (end, load key, load id) of the window it holds; the slots
        # of a space never meet (a load clears whatever its own slot meets)
        held: dict[str, dict[int, tuple[int, tuple, int]]] = {}
        for i in t.nodes:
            n = nodes[i]
            op = n.op
            if op == "TSTORE":
                w = n.attrs._dict["gm"]
                name = w.buf.name
                for slots in held.values():
                    gone = [a for a, (_, key, ld) in slots.items()
                            if key[0] == name and nodes[ld].attrs["gm"].overlaps(w)]
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
                    dup[i] = have[2]
                    continue
            if have is not None and have[0] == hi > lo:
                del slots[lo]           # (the only slot its bytes meet: slots never meet)
            elif slots:
                gone = [a for a, (b, _, _) in slots.items() if a < hi and lo < b]
                for a in gone:
                    del slots[a]
            if op == "TLOAD":
                slots[lo] = (hi, key, i)
    return dup


def l1_reuse(g: BlockGraph, ctx: PassContext | None = None) -> BlockGraph:
    if ctx is not None and not ctx.options.get("l1_reuse", True):
        return g
    dup = reused_loads(g)
    if not dup:
        return g
    tasks = [dataclasses.replace(t, nodes=tuple(itertools.filterfalse(dup.__contains__, t.nodes))) for t in g.tasks]
    return BlockGraph(g.name, g.tiles.replace(list(without_loads(g.tiles.nodes, dup))), tuple(tasks))


L1_REUSE = Pass("l1_reuse", "block", l1_reuse,
                "drop a load whose on-chip slot still holds its window from an earlier tile of the task")
