"""Tile-level passes: memory-space assignment, redundant-load elimination (see reuse.py) and
buffer allocation (with N-buffering).

Space assignment follows the legal data paths: a loaded tile that feeds the cube goes to L1,
any other to UB; an extracted tile goes to L0A or L0B by the matmul operand it feeds.

Allocation works per fusion group on the tiles of one iteration: tiles with the same `key`
play the same role in every iteration and share a slot; slots of tiles whose lifetimes do not
overlap are reused; each slot gets `nbuf` copies (2 = double buffering, so iteration i+1's
loads can overlap iteration i's compute), selected by the tile's `par` counter.

Tile-level kernels (`pypto.tile`) mark their tiles: `buffers` (the copies `pypto.tile.buffers(n)`
asked for: their slot gets exactly that many, or the group does not fit) and `rotate` (tiles of
one iteration sharing a slot take its copies in turn, so that the next one's load or extract
overlaps the compute on the one before).
"""
from __future__ import annotations

from ..errors import TileShapeError
from ..ir.core import Attrs, fmt_shape
from ..ir.tile import TileGraph, TileNode, tile_bytes
from .pipeline import Pass, PassContext
from .reuse import ELIMINATE_REDUNDANT_LOADS


def assign_spaces(g: TileGraph, ctx: PassContext | None = None) -> TileGraph:
    to_l1: set[int] = set()             # loads an extract or a bias move reads
    matmul_of: dict[int, TileNode] = {}  # extract -> the first matmul reading it
    for n in g.nodes:
        op = n.op
        if op == "TEXTRACT" or op == "TMOV":
            to_l1.update(n.inputs)
        elif op.startswith("TMATMUL"):
            for i in n.inputs:
                if i not in matmul_of:
                    matmul_of[i] = n
    nodes = []
    for n in g.nodes:
        if n.space == "?":
            op = n.op
            if op == "TLOAD":
                space = "L1" if n.id in to_l1 else "UB"
            elif op == "TEXTRACT":
                space = "L0A" if matmul_of[n.id].inputs[-2] == n.id else "L0B"
            elif op.startswith("TMATMUL"):
                space = "L0C"
            else:
                space = "UB"
            n = n.with_field("space", space)
        nodes.append(n)
    return g.replace(nodes)


def allocate(g: TileGraph, ctx: PassContext) -> TileGraph:
    caps = ctx.machine.capacities()
    want_nbuf = 2 if ctx.options.get("double_buffer", True) else 1
    placement: dict[int, dict[str, tuple[int, int, int]]] = {}   # group -> key -> (offset, size, nbuf)
    by_group: dict[int, list[TileNode]] = {}
    for n in g.nodes:
        nodes = by_group.get(n.group)
        if nodes is None:
            nodes = by_group[n.group] = []
        nodes.append(n)
    by_id = g.by_id()
    for info in g.groups:
        nodes = by_group.get(info.id, [])
        template = _longest_iteration(nodes)
        slots = _slots(template, nodes, by_id, info.id)
        chunks = _ring_chunks(nodes)
        asked = _asked_buffers(nodes)
        for space in sorted({s["space"] for s in slots}):
            sl = [s for s in slots if s["space"] == space]
            fixed = [max((asked[k] for k in s["keys"] if k in asked), default=0) for s in sl]
            for nbuf in range(want_nbuf, 0, -1):
                total = sum(s["size"] * (f or nbuf) for s, f in zip(sl, fixed))
                if total <= caps[space]:
                    break
            else:
                detail = ", ".join(f"{'+'.join(s['keys'])} {s['size']} B" + (f" x {f}" if f else "")
                                   for s, f in zip(sl, fixed))
                raise TileShapeError(
                    f"the tiles of group {info.id} do not fit {space} (tile {fmt_shape(info.tile)})",
                    loc=info.loc, expected=f"at most {caps[space] // 1024} KiB of {space}",
                    got=f"{total / 1024:.1f} KiB for {len(sl)} live tiles ({detail}); choose a smaller tile"
                        + ("" if not any(fixed) else " or fewer buffers (pypto.tile.buffers)"))
            copies = _ring_copies(sl, chunks, nbuf, caps[space] - total, fixed)
            off = 0
            here = placement.setdefault(info.id, {})
            for s, n_copies in zip(sl, copies):
                for i, k in enumerate(s["keys"]):
                    here[k] = (off, s["size"], n_copies, i, len(s["keys"]))
                off += s["size"] * n_copies
    out = []
    append = out.append
    of = Attrs.of
    for n in g.nodes:
        space = n.space
        if space and space != "?":
            d = n.attrs._dict
            off, size, nbuf, turn, turns = placement[n.group][d["key"]]
            d = d.copy()
            d["buf"] = off + ((d["par"] * turns + turn if d.get("rotate") else d["par"]) % nbuf) * size
            d["nbuf"] = nbuf
            n = n.with_field("attrs", of(d))
        append(n)
    return g.replace(out)


def _asked_buffers(nodes: list[TileNode]) -> dict[str, int]:
    """key -> the copies its tiles ask for (`buffers`, from pypto.tile.buffers), where they do."""
    out: dict[str, int] = {}
    for n in nodes:
        b = n.attrs._dict.get("buffers")
        if b:
            k = n.attrs._dict["key"]
            out[k] = max(out.get(k, 0), b)
    return out


def _ring_chunks(nodes: list[TileNode]) -> dict[str, set]:
    """The K chunks (`par`) of each `ring` key of a group (see `_ring_copies`)."""
    chunks: dict[str, set] = {}
    for n in nodes:
        d = n.attrs._dict
        if d.get("ring"):
            chunks.setdefault(d["key"], set()).add(d["par"])
    return chunks


def _ring_copies(slots: list[dict], chunks: dict[str, set], nbuf: int, spare: int,
                 fixed: list[int]) -> list[int]:
    """Copies per slot: its `fixed` count where it has one (`pypto.tile.buffers`), else `nbuf`,
    except that slots holding a `ring` key (an operand panel whose tiles pick their copy by K
    chunk, see tiling._lower_matmul; `chunks`: `_ring_chunks`) share the spare bytes of the space,
    up to one copy per chunk: every extra copy keeps one more chunk for the next output tile."""
    copies = []
    for s, f in zip(slots, fixed):
        if f:
            copies.append(f)
            continue
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
    """The tile nodes of the group's iteration with the most (the first such in node order)."""
    count: dict[tuple[int, int], int] = {}
    for n in nodes:
        it = (n.outer, n.inner)
        count[it] = count.get(it, 0) + 1
    if not count:
        return []
    best = max(count, key=count.__getitem__)      # the first of the longest, as dicts keep order
    outer, inner = best
    return [n for n in nodes if n.outer == outer and n.inner == inner]


def _slots(template: list[TileNode], nodes: list[TileNode], by_id: dict | None = None,
           group: int | None = None) -> list[dict]:
    """Group the keys of an iteration into slots by lifetime (linear scan).  `nodes`: every
    tile node of the group (`group`, whose graph's `by_id` finds them by id)."""
    size: dict[str, int] = {}
    space: dict[str, str] = {}
    persistent: set[str] = set()
    shape_of: dict[str, tuple] = {}         # the (shape, dtype) a key's size was last worked out for
    for n in nodes:
        sp = n.space
        if sp and sp != "?":
            d = n.attrs._dict
            k = d["key"]
            shape, dtype = n.shape, n.dtype
            seen = shape_of.get(k)
            if seen is None or seen[0] != shape or (seen[1] is not dtype and seen[1] != dtype):
                shape_of[k] = (shape, dtype)
                b = tile_bytes(shape, dtype)
                if b > size.get(k, 0):
                    size[k] = b
                elif k not in size:
                    size[k] = b
            space[k] = sp
            if d.get("persistent"):
                persistent.add(k)
    pos = {n.id: i for i, n in enumerate(template)}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    if by_id is None:
        key_of = {n.id: n.key for n in nodes}.get
    else:
        def key_of(i):
            n = by_id.get(i)
            return n.attrs["key"] if n is not None and n.group == group else None
    for i, n in enumerate(template):
        if n.key in size:
            first.setdefault(n.key, i)
            last[n.key] = max(last.get(n.key, i), i)
        for src in n.inputs:
            k = key_of(src)
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
