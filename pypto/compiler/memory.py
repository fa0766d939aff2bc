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

import math
from itertools import groupby
from operator import attrgetter

from ..errors import TileShapeError
from ..ir.core import fmt_shape
from ..ir.tile import LoopPart, LoopTileGraph, TileGraph, TileNode, copier, tile_bytes
from .pipeline import Pass, PassContext
from .reuse import ELIMINATE_REDUNDANT_LOADS


def assign_spaces(g: TileGraph, ctx: PassContext | None = None) -> TileGraph:
    if isinstance(g, LoopTileGraph):
        return _assign_spaces_loops(g)
    return g.replace(_spaced(g.nodes)).noted(g.facts())     # (the spaces are all it changes)


def _spaced(nodes) -> list[TileNode]:
    """`nodes` (all the nodes that read any of them) with their spaces assigned."""
    to_l1: set[int] = set()             # loads an extract or a bias move reads
    matmul_of: dict[int, TileNode] = {}  # extract -> the first matmul reading it
    is_matmul: dict[str, bool] = {}     # op -> a TMATMUL* (worked out once per op)
    for n in nodes:
        op = n.op
        if op == "TEXTRACT" or op == "TMOV":
            to_l1.update(n.inputs)
            continue
        mm = is_matmul.get(op)
        if mm is None:
            mm = is_matmul[op] = op.startswith("TMATMUL")
        if mm:
            for i in n.inputs:
                if i not in matmul_of:
                    matmul_of[i] = n
    fixed: dict[str, str] = {}          # op -> the space of its tiles, where the op alone decides it
    with_space = copier("space")
    out = []
    append = out.append
    for n in nodes:
        if n.space == "?":
            op = n.op
            if op == "TLOAD":
                space = "L1" if n.id in to_l1 else "UB"
            elif op == "TEXTRACT":
                space = "L0A" if matmul_of[n.id].inputs[-2] == n.id else "L0B"
            else:
                space = fixed.get(op)
                if space is None:
                    space = fixed[op] = "L0C" if op.startswith("TMATMUL") else "UB"
            n = with_space(n, space)
        append(n)
    return out


def _assign_spaces_loops(g: LoopTileGraph) -> TileGraph:
    """assign_spaces of a graph with loops: the nodes of its groups that are no loops as on any
    graph (they read no loop's nodes, nor a loop theirs: each group reads the others' tiles
    from GM), and each loop's by its templates.  A tile's space follows from its op and the
    ops that read it, the same in every outer iteration: the templates' spaces, per (op, key),
    are every node's.  A loop whose templates give one (op, key) two spaces is made and
    assigned node by node."""
    plain = _spaced([n for p in g.parts if not isinstance(p, LoopPart) for n in p])
    at = 0
    parts = []
    for p in g.parts:
        if not isinstance(p, LoopPart):
            parts.append(tuple(plain[at:at + len(p)]))
            at += len(p)
            continue
        loop, spaces, place, dropped = p
        got = dict(spaces or {})
        nodes = [n for t in p.templates() for n in t]
        for n, m in zip(nodes, _spaced(nodes)):
            if n.space == "?" and got.setdefault((n.op, n.key), m.space) != m.space:
                parts.append(tuple(_spaced(p.nodes())))
                break
        else:
            parts.append(LoopPart(loop, got, place, dropped))
    return g.with_parts(parts).noted(g.facts())


def allocate(g: TileGraph, ctx: PassContext) -> TileGraph:
    caps = ctx.machine.capacities()
    want_nbuf = 2 if ctx.options.get("double_buffer", True) else 1
    # group -> key -> (the offsets of its slot's copies, how many, its turn and the slot's turns)
    placement: dict[int, dict[str, tuple[tuple[int, ...], int, int, int]]] = {}
    for info, nodes, template in _groups(g):
        keys = _Keys(nodes, template)
        slots = _slots(keys)
        chunks, asked = keys.chunks, keys.asked
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
                bufs = tuple(off + c * s["size"] for c in range(n_copies))
                for i, k in enumerate(s["keys"]):
                    here[k] = (bufs, n_copies, i, len(s["keys"]))
                off += s["size"] * n_copies
    if isinstance(g, LoopTileGraph):        # a loop's nodes get theirs when they are made
        return g.with_parts([LoopPart(p[0], p[1], _Placer(placement[p[0].templates[0][0].group]), p[3])
                             if isinstance(p, LoopPart) else tuple(_placed(p, placement)) for p in g.parts])
    return g.replace(_placed(g.nodes, placement))


def _placed(nodes, placement: dict) -> list[TileNode]:
    """`nodes`, those in a space with their slot's copy in their map (`_Placer`)."""
    out = []
    append = out.append
    with_attrs = copier("attrs")
    placers: dict[int, _Placer] = {}
    group, place = None, None
    for n in nodes:
        space = n.space
        if space and space != "?":
            if n.group != group:            # (a group's nodes mostly follow each other)
                group = n.group
                place = placers.get(group)
                if place is None:
                    place = placers[group] = _Placer(placement[group])
            n = with_attrs(n, place(n.attrs, n.par))
        append(n)
    return out


def copy_period(part: LoopPart) -> int:
    """How many outer iterations of a loop apart two of one kind take the same copies of their
    slots: the lcm of the copies of its keys whose tiles pick theirs by their `par` counter,
    affine in the iteration (a ring key's tiles pick by K chunk: the same in every iteration).
    1 before allocation."""
    place = part[2]
    if not isinstance(place, _Placer):
        return 1 if place is None else 0     # (0: a placement of the user's, which this cannot tell)
    period = 1
    for t in part.templates():
        for n in t:
            if n.space and n.space != "?" and not n.attrs._dict.get("ring"):
                period = math.lcm(period, place.here[n.key][1])
    return period


class _Placer:
    """fn(attrs, par) -> the map of a node of one group with map `attrs` and counter `par`: with
    its slot's copy (`buf`, `nbuf`) of its key (`placement`: key -> (the offsets of the slot's
    copies, how many, the key's turn, the slot's turns)).  The nodes that shared a map and get
    the same copy of its slot share the new one (remembered per map: the map is kept with it,
    so that its id stays its own)."""

    __slots__ = ("here", "seen")

    def __init__(self, here: dict):
        self.here = here
        self.seen: dict[int, tuple] = {}      # id of a map -> (it, its copies' new maps, rotate's turns or None)

    def __call__(self, a, par: int):
        got = self.seen.get(id(a))
        if got is None:
            d = a._dict
            bufs, nbuf, turn, turns = self.here[d["key"]]
            got = self.seen[id(a)] = (a, bufs, [None] * nbuf,
                                      (turn, turns) if "rotate" in d and d["rotate"] else None)
        _, bufs, maps, rotate = got
        if rotate is not None:
            par = par * rotate[1] + rotate[0]
        c = par % len(maps)
        attrs = maps[c]
        if attrs is None:
            attrs = maps[c] = a.replace(buf=bufs[c], nbuf=len(maps))
        return attrs


def _groups(g: TileGraph):
    """(GroupInfo, its nodes, its `_longest_iteration`) per group of g, where the lowering
    noted them (TileGraph.facts), else found by walking the nodes."""
    if isinstance(g, LoopTileGraph):
        loops = {p[0].templates[0][0].group: p for p in g.parts if isinstance(p, LoopPart)}
        if loops:
            plain = {}
            for p in g.parts:
                if not isinstance(p, LoopPart) and p:
                    plain.setdefault(p[0].group, []).extend(p)
            for info in g.groups:
                part = loops.get(info.id)
                if part is not None:    # its templates say of its keys what all its nodes would
                    first, last = part[0].longest
                    templates = part.templates()
                    nodes = [n for t in templates for n in t]
                    yield info, nodes, [n for n in nodes if first <= n.id < last]
                else:
                    nodes = plain.get(info.id, [])
                    yield info, nodes, _longest_iteration(nodes)
            return
    spans = g.facts().get("groups")
    if spans is not None:
        for info in g.groups:
            start, end, first, last = spans[info.id]
            yield info, g.nodes[start:end], list(g.nodes[first:last])
        return
    by_group: dict[int, list[TileNode]] = {}
    for gid, run in groupby(g.nodes, _group):     # (a group's nodes mostly follow each other)
        nodes = by_group.get(gid)
        if nodes is None:
            by_group[gid] = list(run)
        else:
            nodes.extend(run)
    for info in g.groups:
        nodes = by_group.get(info.id, [])
        yield info, nodes, _longest_iteration(nodes)


class _Keys:
    """What the tiles of one group say about their keys, in one walk over them: per key its
    size (its largest tile), space and whether it is `persistent`; the K chunks (`par`) of each
    `ring` key (see `_ring_copies`: `chunks`); the copies asked for where its tiles ask
    (`buffers`, from pypto.tile.buffers: `asked`).  And for `_slots`, the group's iteration
    `template` (`_longest_iteration`) and `key_of`, node id -> key of the template's tiles and
    of the group's tiles they read (an input from another group has none)."""

    def __init__(self, nodes: list[TileNode], template: list[TileNode]):
        self.template = template
        key_of = {n.id: n.attrs["key"] for n in template}
        outside = {src for n in template for src in n.inputs if src not in key_of}
        size: dict[str, int] = {}
        space: dict[str, str] = {}
        persistent: set[str] = set()
        chunks: dict[str, set] = {}
        asked: dict[str, int] = {}
        shape_of: dict[str, tuple] = {}     # the (shape, dtype) a key's size was last worked out for
        mixed: set[str] = set()             # keys with tiles in several spaces (a pass of the user's)
        # id of a map -> (shape, dtype, space, its key's K chunks if a ring key) of its last node:
        # what a node says about its key follows from its map and those (the nodes of different
        # iterations share map, shape and dtype), so a node whose fields are those very objects
        # says nothing new but its K chunk.  Not kept for maps with a GM window: a vector group's
        # loads and stores have one each (the group keeps its maps: their ids stay)
        seen: dict[int, tuple] = {}
        for n in nodes:                     # (`in` tests of the attrs: cheaper than get calls)
            a = n.attrs
            e = seen.get(id(a))
            if e is not None and e[0] is n.shape and e[1] is n.dtype and e[2] is n.space:
                if e[3] is not None:
                    e[3].add(n.par)
            else:
                d = a._dict
                sp = n.space
                shape, dtype = n.shape, n.dtype
                if sp and sp != "?":
                    k = d["key"]
                    was = shape_of.get(k)
                    if was is None or (was[0] is not shape and was[0] != shape) or (
                            was[1] is not dtype and was[1] != dtype):
                        shape_of[k] = (shape, dtype)
                        b = tile_bytes(shape, dtype)
                        if b > size.get(k, 0):
                            size[k] = b
                        elif k not in size:
                            size[k] = b
                    if space.setdefault(k, sp) != sp:
                        mixed.add(k)
                    if "persistent" in d and d["persistent"]:
                        persistent.add(k)
                ring = None
                if "ring" in d and d["ring"]:
                    ring = chunks.setdefault(d["key"], set())
                    ring.add(n.par)
                if "buffers" in d and d["buffers"]:
                    k = d["key"]
                    asked[k] = max(asked.get(k, 0), d["buffers"])
                if "gm" not in d:
                    seen[id(a)] = (shape, dtype, sp, ring)
            if outside and n.id in outside:
                key_of[n.id] = a._dict["key"]
        self.size, self.space, self.persistent = size, space, persistent
        self.chunks, self.asked, self.key_of = chunks, asked, key_of
        if mixed:
            self._last_spaces(nodes, mixed)

    def _last_spaces(self, nodes: list[TileNode], mixed: set[str]) -> None:
        """The space of each key of `mixed`, whose tiles are in several: its last tile's (a node
        `seen` skipped may be that one)."""
        for n in reversed(nodes):
            sp = n.space
            if sp and sp != "?" and n.attrs._dict["key"] in mixed:
                k = n.attrs._dict["key"]
                self.space[k] = sp
                mixed.discard(k)
                if not mixed:
                    break


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
    slots = _slots(_Keys(nodes, _longest_iteration(nodes)))
    out = {}
    for space in {s["space"] for s in slots}:
        total = sum(s["size"] for s in slots if s["space"] == space)
        out[space] = next((k for k in range(want, 0, -1) if total * k <= caps[space]), 0)
    return out


def _longest_iteration(nodes: list[TileNode]) -> list[TileNode]:
    """The tile nodes of the group's iteration with the most (the first such in node order).
    Counted per run of nodes of one iteration (an iteration's nodes mostly follow each other),
    not per node."""
    count: dict[tuple, int] = {}
    runs = []                                       # (iteration, first position, end)
    at = 0
    for it, run in groupby(nodes, _iteration):
        end = at + len(list(run))
        runs.append((it, at, end))
        count[it] = count.get(it, 0) + end - at
        at = end
    if not count:
        return []
    best = max(count, key=count.__getitem__)      # the first of the longest, as dicts keep order
    out = []
    for it, at, end in runs:
        if it == best:
            out.extend(nodes[at:end])
    return out


_iteration = attrgetter("outer", "inner")
_group = attrgetter("group")


def _slots(keys: _Keys) -> list[dict]:
    """Group the keys of a group's iteration (`keys.template`) into slots by lifetime (linear
    scan)."""
    template = keys.template
    size, space, persistent = keys.size, keys.space, keys.persistent
    pos = {n.id: i for i, n in enumerate(template)}
    key_of = keys.key_of.get
    first: dict[str, int] = {}
    last: dict[str, int] = {}
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
