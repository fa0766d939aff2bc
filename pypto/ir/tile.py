"""Level 2, the Tile Graph: ops on single tiles in on-chip buffers, with explicit loads/stores.

Each node produces at most one tile (stores produce none).  A node belongs to a fusion group
and to one iteration of that group's tile loop (`outer`, `inner`: the inner loop walks the
tiles of a reduced or accumulated dim).  Tail tiles carry a `valid` shape smaller than the
allocated `shape`.  A node's `par` counts the iterations its slot takes turns over: buffer
allocation gives it copy `par % nbuf` of its slot (N-buffering).  After buffer allocation every
tile node has a `buf` byte offset in its space.

Attribute maps hold what a node's op and slot need, not where the node sits in the loop (that
is `outer`, `inner`, `par`): the nodes of different iterations that do the same have equal maps,
and the passes that make or rebuild nodes give them one shared `Attrs` (a tile graph holds
hundreds of thousands of nodes).

A group's loop may stay a loop (`NodeLoop`, in a `LoopTileGraph`): the first outer iteration of
each kind, and a builder that makes the nodes when a pass first reads them.  The tile passes
that know loops decide on those templates; every other reader sees the nodes as above.
"""
from __future__ import annotations

import functools
import itertools
import operator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import numpy as np

from ..dtypes import DType
from ..errors import SourceLoc, VerificationError
from .core import Attrs, TextForm, field_copiers, fmt_shape, quick_init
from .gm import GMBuffer
from ..target.isa import INSTRUCTIONS, SYNC_OPS

ON_CHIP = ("UB", "L1", "L0A", "L0B", "L0C", "BT")

# Legal data paths of the machine (source space -> destination spaces).
DATA_PATHS = {
    "GM": ("UB", "L1"),
    "L1": ("L0A", "L0B", "BT"),
    "L0C": ("GM", "L1", "UB"),
    "UB": ("GM", "UB"),
}


@dataclass(frozen=True)
class GroupInfo:
    id: int
    kind: str                    # vector | cube
    domain: tuple[int, ...]      # iteration shape
    tile: tuple[int, ...]        # tile shape over the domain (cube: (mL0, kL0, nL0, kL1))
    n_outer: int
    n_inner: int
    loc: SourceLoc | None = None

    @property
    def core_type(self) -> str:
        return "AIC" if self.kind == "cube" else "AIV"


@quick_init
@dataclass(frozen=True, slots=True)     # slots: a graph holds one per tile op
class TileNode:
    id: int
    op: str
    inputs: tuple[int, ...]
    shape: tuple[int, ...]
    valid: tuple[int, ...]
    dtype: DType
    space: str                   # where the produced tile lives ('' for stores)
    group: int
    outer: int
    inner: int
    attrs: Attrs = field(default_factory=Attrs)
    loc: SourceLoc | None = None
    # which copy of its slot the tile takes (`par % nbuf`, see memory.allocate): tiles of one
    # key whose `par` differ by one are in different copies (their loads overlap the compute)
    par: int = 0

    def replace(self, **changes) -> "TileNode":
        """A copy with some fields changed."""
        new = self
        for name, value in changes.items():
            new = new.with_field(name, value)
        return new

    def with_field(self, name: str, value) -> "TileNode":
        """`replace(**{name: value})` of one field, without the keyword dict (hot in passes)."""
        copy = _WITH.get(name)
        if copy is None:
            raise TypeError(f"TileNode has no field {name!r}")
        return copy(self, value)

    @property
    def key(self) -> str:
        return self.attrs["key"]


# field name -> fn(node, value): the node with that field changed (all fields passed on).  A
# pass that changes one field of every node takes its function once (`copier`) and calls it.
_WITH = field_copiers(TileNode)


def copier(name: str):
    """`fn(node, value)`, the `node.with_field(name, value)` of one field, for a pass's loop."""
    return _WITH[name]


@dataclass(frozen=True)
class TileGraph(TextForm):
    name: str
    buffers: tuple[GMBuffer, ...]
    groups: tuple[GroupInfo, ...]
    nodes: tuple[TileNode, ...]

    level = "tile"

    def __len__(self):
        return len(self.nodes)

    def replace(self, nodes=None, groups=None) -> "TileGraph":
        return TileGraph(self.name, self.buffers, self.groups if groups is None else tuple(groups),
                         self.nodes if nodes is None else tuple(nodes))

    def by_id(self) -> dict[int, TileNode]:
        cache = self.__dict__.get("_by_id")
        if cache is None:
            cache = {n.id: n for n in self.nodes}
            object.__setattr__(self, "_by_id", cache)
        return cache

    def facts(self) -> Mapping:
        """What the pass that built this graph knew of its nodes, for the passes after it that
        would otherwise walk every node to work it out (the lowering knows where it put each
        group's nodes): {name: value}, empty when none were noted.  Facts hold for this graph
        object (its nodes never change); a pass that builds a new graph hands on those its
        change keeps true (`noted`), and a graph made any other way (a pass of the user's) has
        none: the passes then walk its nodes.
        - "groups": {group: (start, end, first, last)}: the group's nodes are nodes[start:end]
          and its iteration with the most nodes (the first such) nodes[first:last];
        - "distinct_loads": True when no outer iteration of a group loads one GM window twice
          (there are no redundant loads to find).
        """
        return self.__dict__.get("_facts", _NO_FACTS)

    def noted(self, facts: dict) -> "TileGraph":
        """This graph, with `facts` (see `facts`) noted."""
        if facts:
            object.__setattr__(self, "_facts", facts)
        return self

    def text(self, full: bool = False) -> str:
        return print_graph(self, full)


_NO_FACTS = MappingProxyType({})


class NodeLoop:
    """One group's loop over its outer iterations, kept as a loop: its nodes are made when a
    pass first reads them (`make`), not when the lowering runs.  Its outer iterations are alike
    (the same nodes but for their ids, `par`, valid shapes and GM windows), so the tile passes
    decide from its `templates` what they would decide from every node.

    - `start`, `count`: its nodes are the graph's nodes start .. start + count - 1, in order;
    - `templates`: the nodes (real ids) of the first outer iteration of each kind: every kind of
      iteration the loop has (tail tiles, K walked backward) is among them;
    - `longest`: (first, last) positions of the group's iteration (outer, inner) with the most
      nodes, the first such (the "groups" fact, TileGraph.facts);
    - `distinct_loads`: no outer iteration loads a GM window twice;
    - `per`: the nodes of each outer iteration, when all have as many (ids start + o * per on),
      else None;
    - `kind`: fn(o) -> what tells outer iteration o's nodes from another's besides ids, `par`
      and GM windows (which template it is like), or None.  A node's `par` is affine in o;
      two iterations of one kind whose `par` agree modulo a slot's copies get the same copies;
    - `windows_apart`: no two outer iterations load the same GM window (each of a vector group's
      loads moves with every outer dim: l1_reuse has nothing to find in its tasks);
    - `windows(spaces, place, dropped, outer)`: (op, GM window) of the loads and stores `make`
      would make, without making them when the loop's lowering gives them (the twins of a task
      that `l1_reuse` and `select` read);
    - `windows_only`: iterations of one kind differ in nothing an instruction holds but their GM
      windows (and slot copies, valid shapes of their kind): False for a vector group whose ops
      have another attribute worked out from where its tile starts (an iota's first value), whose
      tasks `select` may not copy from one another;
    - `make(spaces, place, dropped=None, outer=None, gm_only=False)`: its nodes, in order.
      `spaces`: {(op, key): space} for the nodes whose space is "?" (None: left "?"); `place`:
      fn(attrs, par) -> the attribute map of a node with a space (buffer allocation; None: the
      maps as made); `dropped`: {id of a load: id of the load its readers read instead}, loads
      left out (l1_reuse); `outer`: only these outer iterations, in this order; `gm_only`: only
      the nodes that move data between GM and the chip (loads, stores), ids as in the whole.
    """

    __slots__ = ("start", "count", "templates", "longest", "distinct_loads", "make", "per", "kind", "gm",
                 "windows_apart", "_windows", "windows_only")

    def __init__(self, start: int, count: int, templates: tuple, longest: tuple, distinct_loads: bool, make,
                 per: int | None = None, kind=None, windows_apart: bool = False, windows=None,
                 windows_only: bool = True):
        self.start, self.count, self.templates = start, count, templates
        self.longest, self.distinct_loads, self.make, self.per = longest, distinct_loads, make, per
        self.kind, self.windows_apart, self.windows_only = kind, windows_apart, windows_only
        # fn(dropped, outer) -> (op, GM window) of each node `make(..., gm_only=True)` makes, in
        # order, without making them; None: read off the nodes
        self._windows = windows
        # the passes of the Block level read a loop's loads and stores alone (`gm_only`) several
        # times over: (spaces, place, dropped) -> (them, {outer iteration: its GM nodes}), by id,
        # for the latest (spaces, place, dropped) asked for
        self.gm: dict[tuple, tuple] = {}

    def gm_nodes(self, spaces, place, dropped, outer, placed: bool = True) -> list:
        """`make(spaces, place, dropped, outer, gm_only=True)`, each outer iteration's made once
        per (spaces, place, dropped), the objects (`gm`); with loads dropped, taken from the set
        made before they were (less those loads) when it is there.  `placed=False`: a reader of GM
        windows only, which takes the nodes made with a placement when they are there, else makes
        them without one (cheaper)."""
        base = None         # a set made before any load was dropped, of these spaces and maps
        for sp, pl, dr, mm in self.gm.values():
            if sp is spaces and (pl is place or not placed):
                if dr is dropped:
                    place = pl
                    break
                if dr is None:
                    base = pl, mm
        else:
            if base is not None and dropped:
                place = base[0]
            elif not placed:
                place = None
        key = (id(spaces), id(place), id(dropped))
        got = self.gm.get(key)
        if got is None or got[0] is not spaces or got[1] is not place or got[2] is not dropped:
            # (one set kept: the passes read the latest, and a compile's peak memory holds one)
            self.gm.clear()
            got = self.gm[key] = (spaces, place, dropped, {})
            if base is not None and dropped and base[0] is place:
                # the loads and stores with loads dropped are those made before less the dropped
                # loads (l1_reuse's, read again by dependencies and select), unless a store reads
                # a dropped load (then it reads the load kept instead: made anew)
                for o, nodes in base[1].items():
                    kept = [n for n in nodes if n.id not in dropped]
                    if all(i not in dropped for n in kept for i in n.inputs):
                        got[3][o] = kept
        made = got[3]
        outer = range(self.count // self.per) if outer is None else outer
        missing = list(dict.fromkeys(o for o in outer if o not in made))
        if missing:                     # (made in one call: an iteration may be a few nodes)
            for o in missing:
                made[o] = []
            for o, nodes in itertools.groupby(self.make(spaces, place, dropped, missing, True), _OUTER):
                made[o].extend(nodes)
        return list(itertools.chain.from_iterable(map(made.__getitem__, outer)))

    def windows(self, spaces, place, dropped, outer) -> list[tuple]:
        """(op, GM window) of each of `gm_nodes(spaces, place, dropped, outer)`, in order: read off
        the nodes when a pass made them (their windows do not depend on the placement; made
        before loads were dropped, less those), else worked out without them when the loop can
        (a vector group's from its plans, a matmul's from its tiles), else off nodes made now."""
        for sp, _, dr, made in self.gm.values():
            if sp is spaces and (dr is dropped or dr is None) and all(o in made for o in outer):
                nodes = itertools.chain.from_iterable(map(made.__getitem__, outer))
                if dr is not dropped and dropped:       # (made before l1_reuse dropped loads)
                    nodes = [n for n in nodes if n.id not in dropped]
                return [(n.op, n.attrs._dict["gm"]) for n in nodes]
        if self._windows is not None:
            return self._windows(dropped, outer)
        return [(n.op, n.attrs._dict["gm"]) for n in self.gm_nodes(spaces, place, dropped, outer, placed=False)]


class LoopPart(tuple):
    """A `NodeLoop` of a `LoopTileGraph` with what the passes decided for it so far:
    (loop, spaces, place, dropped), see `NodeLoop.make`."""

    __slots__ = ()

    def __new__(cls, loop: NodeLoop, spaces=None, place=None, dropped=None):
        return tuple.__new__(cls, (loop, spaces, place, dropped))

    def nodes(self, outer=None, gm_only: bool = False, placed: bool = True) -> list[TileNode]:
        """Its nodes (see `NodeLoop.make`); `placed=False`: their maps as the lowering made them
        (without `buf`: for a reader of GM windows only)."""
        loop, spaces, place, dropped = self
        if gm_only and loop.per:
            return loop.gm_nodes(spaces, place, dropped, outer, placed)
        return loop.make(spaces, place if placed else None, dropped, outer, gm_only)

    def task_key(self, outer, nodes, period: int) -> tuple | None:
        """Equal for two tasks of the loop (their outer iterations `outer` and node ids `nodes`)
        whose nodes are alike but for their ids (moved by one amount) and GM windows: the same
        kind of iteration and the same copies of their slots (`period`: the loop's
        `memory.copy_period`, 0 when not known) at each position, the same pattern of ids.
        None when the loop cannot tell (no kinds, no period)."""
        loop = self[0]
        if not period or loop.kind is None:
            return None
        kind = loop.kind
        ids = np.fromiter(nodes, np.int64, len(nodes))
        ids -= ids[0]
        return id(loop), tuple([(kind(o), o % period) for o in outer]), ids.tobytes()

    def windows(self, outer) -> list[tuple]:
        """(op, GM window) of the loads and stores of outer iterations `outer` (`NodeLoop.windows`)."""
        loop, spaces, place, dropped = self
        return loop.windows(spaces, place, dropped, outer)

    @property
    def count(self) -> int:
        """How many nodes it makes."""
        return self[0].count - (len(self[3]) if self[3] else 0)

    def templates(self) -> list[tuple[TileNode, ...]]:
        """The loop's templates as the graph's nodes are: with the spaces and maps decided (the
        loads l1_reuse drops, from the Block level on, are not in them)."""
        loop, spaces, place, _ = self
        if spaces is None and place is None:
            return list(loop.templates)
        out = []
        for t in loop.templates:
            made = []
            for n in t:
                if spaces is not None and n.space == "?":
                    n = _WITH["space"](n, spaces.get((n.op, n.key), "?"))
                if place is not None and n.space and n.space != "?":
                    n = _WITH["attrs"](n, place(n.attrs, n.par))
                made.append(n)
            out.append(tuple(made))
        return out


class LoopTileGraph(TileGraph):
    """A Tile graph some of whose groups are `NodeLoop`s: `parts` holds, per group in node
    order, its nodes (a tuple) or its loop (a `LoopPart`).  `nodes` makes the loops' nodes when
    first read (then kept): the lowering and the tile passes that know loops (assign_spaces,
    allocate) work on the templates, and the graph that leaves the Tile level is made once,
    not once per pass.  Anything else reads `nodes` as on any Tile graph, and `replace` gives
    a plain one."""

    def __init__(self, name: str, buffers: tuple, groups: tuple, parts: tuple):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "buffers", buffers)
        object.__setattr__(self, "groups", groups)
        d = self.__dict__
        d["parts"] = tuple(parts)
        d["_count"] = sum(p.count if isinstance(p, LoopPart) else len(p) for p in d["parts"])

    @property
    def nodes(self) -> tuple:
        got = self.__dict__.get("_nodes")
        if got is None:
            out: list[TileNode] = []
            for p in self.parts:
                out.extend(p.nodes() if isinstance(p, LoopPart) else p)
            got = self.__dict__["_nodes"] = tuple(out)
        return got

    def __len__(self):
        return self.__dict__["_count"]

    def forget_gm(self) -> None:
        """Let go of the loads and stores its loops made for the passes of the Block level
        (`NodeLoop.gm_nodes`): the last of them is done with them (a compiled kernel keeps the
        graph, not what its compile read of it)."""
        for p in self.parts:
            if isinstance(p, LoopPart):
                p[0].gm.clear()

    def with_parts(self, parts) -> "LoopTileGraph":
        return LoopTileGraph(self.name, self.buffers, self.groups, parts)

    def plain_by_id(self) -> dict[int, TileNode]:
        """`by_id` of the nodes of its groups that are no loops (its loops not made): what a pass
        that reads a loop's tasks from the loop (`loop_of`) looks the other tasks' nodes up in."""
        if "_nodes" in self.__dict__:
            return self.by_id()
        got = self.__dict__.get("_plain_by_id")
        if got is None:
            got = self.__dict__["_plain_by_id"] = {n.id: n for p in self.parts if not isinstance(p, LoopPart)
                                                   for n in p}
        return got

    def loop_tasks(self, tasks) -> list | None:
        """Per Block-level task its loop (`loop_of`) or None for a task of another group, when
        every task of a loop's group holds the nodes of its iterations as the loop makes them
        (then a pass reads those tasks from the loop, the others from `plain_by_id`); None when
        one does not (a pass of the user's split a task): a pass then reads `nodes` throughout."""
        if "_nodes" in self.__dict__:
            return None
        looped = {p[0].templates[0][0].group for p in self.parts if isinstance(p, LoopPart)}
        out = []
        for t in tasks:
            part = self.loop_of(t) if t.group in looped else None
            if part is None and t.group in looped:
                return None
            out.append(part)
        return out

    def loop_of(self, task) -> LoopPart | None:
        """The loop whose nodes a Block-level task holds (its group's, all the nodes of its outer
        iterations, in order), when the loop can make them for those iterations alone, else
        None: the task's nodes are then read from `nodes`."""
        for p in self.parts:
            if isinstance(p, LoopPart) and p[0].templates[0][0].group == task.group:
                loop = p[0]
                per, ids, outer = loop.per, task.nodes, task.outer
                if per is None or not ids or not outer:
                    return None
                # (its first node and its last, a store, are never dropped)
                if ids[0] == loop.start + outer[0] * per and ids[-1] == loop.start + (outer[-1] + 1) * per - 1:
                    return p
                return None
        return None


def node_text(n: TileNode) -> str:
    args = ", ".join(f"%{i}" for i in n.inputs)
    a = dict(n.attrs)
    if n.op in SYNC_OPS:                # a flag of a manually synchronised tile-level kernel
        return f"{n.op} {a['src']} -> {a['dst']} event={a['event']}" + (f"  @{n.loc.short()}" if n.loc else "")
    extra = []
    if "gm" in a:
        extra.append(("GM " + a["gm"].text()))
    for k in ("scalar", "dim"):
        if k in a:
            extra.append(f"{k}={a[k]}")
    where = f"{n.space}" + (f"@{a['buf']:#x}" if "buf" in a else "")
    valid = "" if n.valid == n.shape else f" valid={fmt_shape(n.valid)}"
    loc = f"  @{n.loc.short()}" if n.loc else ""
    body = f"{n.op}({args})" + ("" if not extra else " " + " ".join(extra))
    if n.op == "TSTORE":
        return f"{body}{loc}"
    return f"%{n.id} = {body} : {where} {n.dtype}{fmt_shape(n.shape)}{valid}{loc}"


def print_graph(g: TileGraph, full: bool = False) -> str:
    lines = [f"tile_graph {g.name} {{"]
    for b in g.buffers:
        lines.append(f"  gm {b.name}: {b.dtype}{fmt_shape(b.shape)} {b.role}")
    by_group: dict[int, list[TileNode]] = {}
    # (count, its first outer iteration's nodes) of a loop whose nodes are not made: its first
    # template is that iteration (when no load of it was dropped), so the text needs no other
    firsts: dict[int, tuple[int, tuple]] = {}
    if not full and isinstance(g, LoopTileGraph) and "_nodes" not in g.__dict__ and not any(
            isinstance(p, LoopPart) and p[3] for p in g.parts):
        for p in g.parts:
            if isinstance(p, LoopPart):
                first = p.templates()[0]
                firsts[first[0].group] = (p.count, first)
            else:
                for n in p:
                    by_group.setdefault(n.group, []).append(n)
    else:
        for n in g.nodes:
            by_group.setdefault(n.group, []).append(n)
    for info in g.groups:
        nodes = by_group.get(info.id, [])
        count, shown = firsts.get(info.id) or (len(nodes), None)
        lines.append(f"  // group {info.id} ({info.kind} on {info.core_type}): domain {fmt_shape(info.domain)}, "
                     f"tile {fmt_shape(info.tile)}, {info.n_outer} x {info.n_inner} iterations, {count} tile ops")
        if shown is None:
            shown = nodes if full else [n for n in nodes if n.outer == 0]
        for n in shown:
            lines.append(f"  [{n.outer}.{n.inner}] " + node_text(n))
        if len(shown) < count:
            lines.append(f"  ... {count - len(shown)} more tile ops in {info.n_outer - 1} more outer iterations")
    lines.append("}")
    return "\n".join(lines)


# the data-path rule of an op's tile (verify): which check of its spaces applies
_SYNC, _LOAD, _STORE, _EXTRACT, _MOV, _MATMUL, _VECTOR = range(7)
_MATMUL_OPERANDS = ["L0A", "L0B"]


def _rule(op: str) -> int:
    if op in SYNC_OPS:
        return _SYNC
    if op == "TLOAD":
        return _LOAD
    if op == "TSTORE" or (op in INSTRUCTIONS and INSTRUCTIONS[op].kind == "scatter"):
        return _STORE
    if op == "TEXTRACT":
        return _EXTRACT
    if op == "TMOV":
        return _MOV
    if op.startswith("TMATMUL"):
        return _MATMUL
    return _VECTOR


def verify(g: TileGraph, capacities: dict[str, int] | None = None) -> None:
    if isinstance(g, LoopTileGraph) and "_nodes" not in g.__dict__:
        _verify_loops(g, capacities)
    else:
        _verify_nodes(g.nodes, capacities)
    if g.facts():
        _check_facts(g)


def _verify_loops(g: LoopTileGraph, capacities: dict[str, int] | None) -> None:
    """`verify` of a graph whose loops were not made yet: the nodes of its other groups as on any
    graph (no group reads another's tiles), and each loop by its templates, the first outer
    iteration of every kind it has (its other iterations are those but for ids, `par`, valid
    shapes and GM windows): each template on its own, and the tiles of each template node in
    every copy of its slot (`par` + k takes copy k along).  A loop's nodes are made when first
    read; `verify="each"` checks the facts against them."""
    _verify_nodes([n for p in g.parts if not isinstance(p, LoopPart) for n in p], capacities)
    caps = capacities or {}
    with_attrs = _WITH["attrs"]
    for p in g.parts:
        if not isinstance(p, LoopPart):
            continue
        loop, _, place, _ = p
        for raw, template in zip(loop.templates, p.templates()):
            _verify_nodes(template, capacities)
            if place is None:
                continue
            for r, n in zip(raw, template):
                nbuf = n.attrs._dict.get("nbuf", 1) if n.space and n.space != "?" else 1
                for k in range(1, nbuf):
                    m = with_attrs(n, place(r.attrs, r.par + k))
                    limit = caps.get(m.space)
                    if limit is not None and m.attrs["buf"] + tile_bytes(m.shape, m.dtype) > limit:
                        _fail(m, f"tile overflows {m.space}", expected=f"<= {limit} bytes",
                              got=m.attrs["buf"] + tile_bytes(m.shape, m.dtype))


def _verify_nodes(nodes, capacities: dict[str, int] | None = None) -> None:
    # the nodes seen so far -> the space of their tile (a node whose space is None counts as
    # not defined: it is left out, so that a lookup that finds nothing is one that fails)
    space_of: dict[int, str] = {}
    caps = capacities or {}
    # (op, space, shape, dtype, input spaces) -> [capacity of the space, tile_bytes or None
    # until needed] when the data path is legal, None when no capacity applies: the data path
    # is checked once per such key (`_path_cap`), a program has a handful
    paths: dict[tuple, list | None] = {}
    # the keys of `paths` led by a node's `buf` (all `_check` reads of its attributes) that
    # passed `_check`: a node whose key is here would pass it too.  A handful per slot copy
    # (the graph keeps its dtypes: their ids stay)
    passed: set[tuple] = set()
    # id of a map -> (op, space, shape, dtype, input spaces) of the last node with that map:
    # a node with the same map whose fields are those very objects (the nodes of different
    # iterations share them) and whose inputs are in the same spaces has the same key, so that
    # neither the key nor its lookup need be made for it.  Not kept for maps with a GM window:
    # a vector group's loads and stores have one each (the graph keeps its maps: ids stay)
    last: dict[int, tuple] = {}
    for n in nodes:
        ins = n.inputs
        try:                    # (subscripts, not calls: most nodes read one or three tiles)
            k = len(ins)
            srcs = ((space_of[ins[0]],) if k == 1 else (space_of[ins[0]], space_of[ins[1]], space_of[ins[2]])
                    if k == 3 else (space_of[ins[0]], space_of[ins[1]]) if k == 2 else ()
                    if not k else tuple([space_of[i] for i in ins]))
        except KeyError:        # an input not defined (yet): which one
            _undefined(n, space_of)
        valid, shape, where = n.valid, n.shape, n.space
        if valid is not shape and valid != shape and (
                len(valid) != len(shape) or any(v > s for v, s in zip(valid, shape))):
            _fail(n, "valid shape exceeds the tile", expected=f"<= {fmt_shape(shape)}", got=fmt_shape(valid))
        a = n.attrs
        seen = last.get(id(a))
        if (seen is None or seen[0] is not n.op or seen[1] is not where or seen[2] is not shape
                or seen[3] is not n.dtype or seen[4] != srcs):
            key = (a._dict.get("buf"), n.op, where, shape, id(n.dtype), *srcs)
            if key not in passed:
                _check(n, key[1:], paths, caps)
                passed.add(key)
            if "gm" not in a._dict:
                last[id(a)] = (n.op, where, shape, n.dtype, srcs)
        if where is not None:
            space_of[n.id] = where
        else:
            space_of.pop(n.id, None)


def _check_loops(g: LoopTileGraph) -> None:
    """Check what each loop of `g` claims (NodeLoop): its nodes are its ids, and each of its
    outer iterations is one of its templates but for ids, `par` and GM windows (the same ops,
    inputs relative to the iteration's first id, shapes, valid shapes, dtypes, spaces, inner
    steps and attribute names), so that what the tile passes decide on the templates holds
    for every node."""
    at = 0
    for p in g.parts:
        if not isinstance(p, LoopPart):
            at += len(p)
            continue
        loop = p[0]
        made = g.nodes[at:at + p.count]
        if loop.start != at or any(n.id != at + k for k, n in enumerate(made)):
            raise VerificationError(f"tile graph {g.name}: a loop of group {made[0].group if made else '?'} "
                                    f"does not make nodes {at}..{at + loop.count - 1}")
        kinds = {_shape_of(t) for t in p.templates()}
        for _, it in itertools.groupby(made, _OUTER):
            it = tuple(it)
            if _shape_of(it) not in kinds:
                _fail(it[0], f"outer iteration {it[0].outer} of its loop is none of the loop's templates",
                      expected=f"one of {len(kinds)} kinds of iteration", got="another")
        at += p.count


_OUTER = operator.attrgetter("outer")


def _shape_of(nodes) -> tuple:
    """An outer iteration's nodes without what moves from one iteration to the next."""
    base = nodes[0].id
    return tuple((n.op, tuple(i - base for i in n.inputs), n.shape, n.valid, n.dtype, n.space, n.inner,
                  tuple(n.attrs._dict)) for n in nodes)


def _check_facts(g: TileGraph) -> None:
    """Check the facts noted on `g` (TileGraph.facts) against its nodes: the passes after the
    one that noted them trust them instead of walking the nodes.  (Only a graph that carries
    facts pays: the lowering's and assign_spaces' outputs, checked when verify="each".)"""
    if isinstance(g, LoopTileGraph):
        _check_loops(g)
    facts = g.facts()
    spans = facts.get("groups")
    if spans is not None:
        counted: dict[int, int] = {}
        for n in g.nodes:
            counted[n.group] = counted.get(n.group, 0) + 1
        for info in g.groups:
            start, end, first, last = spans.get(info.id, (0, 0, 0, 0))
            mine = g.nodes[start:end]
            if end - start != counted.get(info.id, 0) or any(n.group != info.id for n in mine):
                raise VerificationError(f"tile graph {g.name}: the \"groups\" fact puts group {info.id} at "
                                        f"nodes [{start}:{end}], which are not its nodes",
                                        expected=f"its {counted.get(info.id, 0)} nodes", got=f"{end - start} nodes")
            sizes: dict[tuple, int] = {}
            for n in mine:
                sizes[n.outer, n.inner] = sizes.get((n.outer, n.inner), 0) + 1
            longest = max(sizes, key=sizes.__getitem__) if sizes else None
            if longest is not None and (last - first != sizes[longest] or not start <= first <= last <= end
                                        or any((n.outer, n.inner) != longest for n in g.nodes[first:last])):
                raise VerificationError(f"tile graph {g.name}: the \"groups\" fact's longest iteration of group "
                                        f"{info.id} is not nodes [{first}:{last}]",
                                        expected=f"iteration {longest}, {sizes[longest]} nodes")
    if facts.get("distinct_loads"):
        loaded: set = set()
        for n in g.nodes:
            if n.op == "TLOAD":
                key = (n.group, n.outer, n.attrs["gm"])
                if key in loaded:
                    _fail(n, "loads a GM window its outer iteration loaded already, against the "
                             "graph's \"distinct_loads\" fact")
                loaded.add(key)


def _undefined(n: TileNode, space_of: dict[int, str]):
    """Fail on the first input of node `n` that is not defined before it."""
    for i in n.inputs:
        if i not in space_of:
            _fail(n, f"input %{i} is not defined before use")


def _check(n: TileNode, key: tuple, paths: dict, caps: dict) -> None:
    """Check the data path of node `n` (once per `key` of `paths`, see `verify`: its op,
    space, shape, dtype id and input spaces) and that its tile, at its `buf`, fits its space."""
    limit = paths.get(key, _UNSEEN)
    if limit is _UNSEEN:
        cap = _path_cap(n, n.space, list(key[4:]), caps)
        limit = paths[key] = None if cap is None else [cap, None]
    if limit is not None:
        buf = n.attrs.get("buf")
        if buf is not None:
            cap, size = limit
            if size is None:
                size = limit[1] = tile_bytes(n.shape, n.dtype)
            if buf + size > cap:
                _fail(n, f"tile overflows {n.space}", expected=f"<= {cap} bytes", got=buf + size)


_UNSEEN = object()


def _path_cap(n: TileNode, space: str, srcs: list, caps: dict) -> int | None:
    """Check the data path of node `n` (its tile in `space`, its inputs' in `srcs`) by the
    `_rule` of its op; return the capacity of `space` its buffer must fit in, None if none
    applies (no capacity given, or spaces not assigned yet)."""
    if space == "?" or "?" in srcs:   # before memory-space assignment
        return None
    rule = _rule(n.op)
    if rule == _LOAD:
        gm_dsts = DATA_PATHS["GM"]
        if space not in gm_dsts:
            _fail(n, "illegal data path", expected="GM -> " + "/".join(gm_dsts), got=f"GM -> {space}")
    elif rule == _STORE:
        if srcs[0] not in ("UB", "L0C"):
            _fail(n, "illegal data path", expected="UB/L0C -> GM", got=f"{srcs[0]} -> GM")
    elif rule == _EXTRACT:
        if srcs[0] != "L1" or space not in ("L0A", "L0B"):
            _fail(n, "illegal data path", expected="L1 -> L0A/L0B", got=f"{srcs[0]} -> {space}")
    elif rule == _MOV:
        if srcs[0] != "L1" or space != "BT":
            _fail(n, "illegal data path", expected="L1 -> BT (a bias row)", got=f"{srcs[0]} -> {space}")
    elif rule == _MATMUL:
        if srcs[-2:] != _MATMUL_OPERANDS or space != "L0C" or (n.op == "TMATMUL_BIAS" and srcs[0] != "BT"):
            _fail(n, "matmul operands must be (BT +) L0A x L0B -> L0C", got=f"{srcs} -> {space}")
    elif rule == _VECTOR:
        if space != "UB" or srcs.count("UB") != len(srcs):
            _fail(n, "vector ops work on UB tiles", expected="UB", got=f"{srcs} -> {space}")
    return caps.get(space)


def _fail(n: TileNode, msg, expected=None, got=None):
    raise VerificationError(f"tile graph node %{n.id} ({n.op}, group {n.group}): {msg}",
                            loc=n.loc, expected=expected, got=got)


def row_pitch(shape, dtype: DType) -> int:
    """Bytes per row of a tile: rows are 32-byte aligned."""
    last = shape[-1] if shape else 1
    return -(-(last * dtype.itemsize) // 32) * 32


@functools.lru_cache(maxsize=4096)
def tile_strides(shape, dtype: DType) -> tuple[int, ...]:
    """Byte strides of a tile: elements packed, rows padded to 32 bytes."""
    strides, acc = [dtype.itemsize], row_pitch(shape, dtype)
    for s in reversed(shape[:-1]):
        strides.insert(0, acc)
        acc *= s
    return tuple(strides)


@functools.lru_cache(maxsize=4096)
def tile_bytes(shape, dtype: DType) -> int:
    rows = 1
    for s in shape[:-1]:
        rows *= s
    return rows * row_pitch(shape, dtype)
