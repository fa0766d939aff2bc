"""Tile-level passes: memory-space assignment, redundant-load elimination (see reuse.py) and
buffer allocation (with N-buffering).

Space assignment follows the legal data paths: a loaded tile that feeds the cube goes to L1,
any other to UB; an extracted tile goes to L0A or L0B by the matmul operand it feeds.

Allocation works per fusion group on the tiles of one iteration: tiles with the same `key`
play the same role in every iteration and share a slot; slots of tiles whose lifetimes do not
overlap are reused; each slot gets `nbuf` copies (2 = double buffering, so iteration i+1's
loads can overlap iteration i's compute), selected by the tile's `par` counter.
"""
from __future__ import annotations

from ..errors import TileShapeError
from ..ir.core import fmt_shape
from ..ir.tile import TileGraph, TileNode, tile_bytes
from .pipeline import Pass, PassContext
from .reuse import ELIMINATE_REDUNDANT_LOADS


def assign_spaces(g: TileGraph, ctx: PassContext | None = None) -> TileGraph:
    users: dict[int, list[TileNode]] = {}
    for n in g.nodes:
        for i in n.inputs:
            users.setdefault(i, []).append(n)
    nodes = []
    for n in g.nodes:
        if n.space == "?":
            us = users.get(n.id, [])
            if n.op == "TLOAD":
                space = "L1" if any(u.op in ("TEXTRACT", "TMOV") for u in us) else "UB"
            elif n.op == "TEXTRACT":
                mm = next(u for u in us if u.op.startswith("TMATMUL"))
                space = "L0A" if mm.inputs[-2] == n.id else "L0B"
            elif n.op.startswith("TMATMUL"):
                space = "L0C"
            else:
                space = "UB"
            n = n.replace(space=space)
        nodes.append(n)
    return g.replace(nodes)


def allocate(g: TileGraph, ctx: PassContext) -> TileGraph:
    caps = ctx.machine.capacities()
    want_nbuf = 2 if ctx.options.get("double_buffer", True) else 1
    placement: dict[tuple[int, str], tuple[int, int, int]] = {}   # (group, key) -> (offset, size, nbuf)
    by_group: dict[int, list[TileNode]] = {}
    for n in g.nodes:
        by_group.setdefault(n.group, []).append(n)
    for info in g.groups:
        nodes = by_group.get(info.id, [])
        template = _longest_iteration(nodes)
        slots = _slots(template, nodes)
        for space in sorted({s["space"] for s in slots}):
            sl = [s for s in slots if s["space"] == space]
            for nbuf in range(want_nbuf, 0, -1):
                total = sum(s["size"] for s in sl) * nbuf
                if total <= caps[space]:
                    break
            else:
                detail = ", ".join(f"{'+'.join(s['keys'])} {s['size']} B" for s in sl)
                raise TileShapeError(
                    f"the tiles of group {info.id} do not fit {space} (tile {fmt_shape(info.tile)})",
                    loc=info.loc, expected=f"at most {caps[space] // 1024} KiB of {space}",
                    got=f"{total / 1024:.1f} KiB for {len(sl)} live tiles ({detail}); choose a smaller tile")
            copies = _ring_copies(sl, nodes, nbuf, caps[space] - total)
            off = 0
            for s, n_copies in zip(sl, copies):
                for k in s["keys"]:
                    placement[(info.id, k)] = (off, s["size"], n_copies)
                off += s["size"] * n_copies
    out = []
    for n in g.nodes:
        if n.space and n.space != "?":
            off, size, nbuf = placement[(n.group, n.key)]
            n = n.replace(attrs=n.attrs.replace(buf=off + (n.attrs["par"] % nbuf) * size, nbuf=nbuf))
        out.append(n)
    return g.replace(out)


def _ring_copies(slots: list[dict], nodes: list[TileNode], nbuf: int, spare: int) -> list[int]:
    """Copies per slot: `nbuf`, except that slots holding a `ring` key (an operand panel whose
    tiles pick their copy by K chunk, see tiling._lower_matmul) share the spare bytes of the space,
    up to one copy per chunk: every extra copy keeps one more chunk for the next output tile."""
    chunks: dict[str, set] = {}
    for n in nodes:
        if n.attrs.get("ring"):
            chunks.setdefault(n.key, set()).add(n.attrs["par"])
    copies = []
    for s in slots:
        want = max((len(chunks[k]) for k in s["keys"] if k in chunks), default=0)
        extra = min(max(0, want - nbuf), spare // s["size"]) if want else 0
        spare -= extra * s["size"]
        copies.append(nbuf + extra)
    return copies


def buffers_that_fit(nodes: list[TileNode], caps: dict[str, int], want: int = 2) -> dict[str, int]:
    """Per on-chip space, how many copies of the slots of one group's tiles fit (at most `want`,
    0 when not even one does): the N-buffering `allocate` would give the group there."""
    slots = _slots(_longest_iteration(nodes), nodes)
    out = {}
    for space in {s["space"] for s in slots}:
        total = sum(s["size"] for s in slots if s["space"] == space)
        out[space] = next((k for k in range(want, 0, -1) if total * k <= caps[space]), 0)
    return out


def _longest_iteration(nodes: list[TileNode]) -> list[TileNode]:
    iters: dict[tuple[int, int], list[TileNode]] = {}
    for n in nodes:
        iters.setdefault((n.outer, n.inner), []).append(n)
    return max(iters.values(), key=len) if iters else []


def _slots(template: list[TileNode], nodes: list[TileNode]) -> list[dict]:
    """Group the keys of an iteration into slots by lifetime (linear scan)."""
    size: dict[str, int] = {}
    space: dict[str, str] = {}
    persistent: set[str] = set()
    for n in nodes:
        if n.space and n.space != "?":
            size[n.key] = max(size.get(n.key, 0), tile_bytes(n.shape, n.dtype))
            space[n.key] = n.space
            if n.attrs.get("persistent"):
                persistent.add(n.key)
    pos = {n.id: i for i, n in enumerate(template)}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    key_of = {n.id: n.key for n in nodes}
    for i, n in enumerate(template):
        if n.key in size:
            first.setdefault(n.key, i)
            last[n.key] = max(last.get(n.key, i), i)
        for src in n.inputs:
            k = key_of.get(src)
            if k in size:
                last[k] = max(last.get(k, i), i)
                first.setdefault(k, pos.get(src, 0))
    end = len(template)
    for k in size:
        first.setdefault(k, 0)
        last.setdefault(k, end)
        if k in persistent:
            first[k], last[k] = 0, end
    slots: list[dict] = []
    for k in sorted(size, key=lambda k: (first[k], k)):
        for s in slots:
            if (s["space"] == space[k] and not s["persistent"] and k not in persistent
                    and s["free_after"] < first[k]):
                s["keys"].append(k)
                s["size"] = max(s["size"], size[k])
                s["free_after"] = last[k]
                break
        else:
            slots.append({"space": space[k], "keys": [k], "size": size[k], "free_after": last[k],
                          "persistent": k in persistent})
    return slots


TILE_PASSES = [
    Pass("assign_spaces", "tile", assign_spaces, "place each tile in UB, L1, L0A, L0B or L0C along legal data paths"),
    ELIMINATE_REDUNDANT_LOADS,
    Pass("allocate", "tile", allocate, "buffer offsets with lifetime reuse, double buffering and capacity checks"),
]
