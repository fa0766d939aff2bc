"""Tile -> Block lowering and Block-level passes: partitioning, dependencies, dependency pruning,
wavefronts.

Mixed kernels (a matmul whose result a vector group finishes: an activation, ...) follow the
machine's 1 AIC : 2 AIV pairing: the vector iterations that read the tiles one cube task stores
become two tasks, one per AIV of the pair (each takes half of every cube tile, in the order the
cube task stores them), marked `pair=(cube task, slot)`.  The dispatcher runs them on the two
AIVs coupled with the AIC that runs the cube task, and the `cross_core_sync` pass lets them
start on each tile as soon as it is in GM (an L2-resident workspace).  A cube group pairs with
one vector group at most (the first that reads it).
"""
from __future__ import annotations

import bisect
import itertools
import operator

from ..ir.block import BlockGraph, Task
from ..ir.gm import Footprint, GMRef
from ..ir.tile import LoopPart, LoopTileGraph, TileGraph
from ..target.isa import gm_access
from .pipeline import Pass, PassContext


def partition(g: TileGraph, ctx: PassContext) -> BlockGraph:
    """Split each group's outer iterations into contiguous chunks, one task per core of its type;
    epilogues of mixed kernels pair with their cube tiles (see the module docstring)."""
    m = ctx.machine
    by_outer: dict[tuple[int, int], list[int] | range] = {}
    # (the nodes of a group iteration come in consecutive runs, mostly a single one: grouped by
    # C-level steps per node, by group then by outer iteration: no key tuple per node)
    for nodes in _parts(g, by_outer):
        for group, of_group in itertools.groupby(nodes, _GROUP):
            for outer, run in itertools.groupby(of_group, _OUTER):
                k = (group, outer)
                ids = by_outer.get(k)
                if ids is None:
                    by_outer[k] = list(map(_ID, run))
                else:
                    ids.extend(map(_ID, run))
    pairs = epilogue_pairs(g) if ctx.options.get("pairing", True) and m.n_aiv >= 2 * m.n_aic else {}
    tasks = []
    task_of: dict[tuple[int, int], int] = {}       # (group, outer) -> its task, for the pairs

    def add(info, outer, pair=None):
        task_of.update(((info.id, o), len(tasks)) for o in outer)
        nodes = []
        for o in outer:
            nodes.extend(by_outer.get((info.id, o), ()))
        nodes = tuple(nodes)
        tasks.append(Task(len(tasks), info.id, info.core_type, tuple(outer), nodes, pair=pair))

    for info in g.groups:
        if info.id in pairs:
            cube, tile_of = pairs[info.id]
            by_tile: dict[int, dict[int, list[int]]] = {}       # cube task -> cube tile -> iterations
            for o in range(info.n_outer):
                by_tile.setdefault(task_of[(cube, tile_of[o])], {}).setdefault(tile_of[o], []).append(o)
            for ct, tiles in by_tile.items():
                halves: tuple[list, list] = ([], [])        # each AIV takes half of every tile
                for k, (_, outer) in enumerate(sorted(tiles.items())):
                    if len(outer) == 1:                     # a tile of one vector tile: by turns
                        halves[k % 2].extend(outer)
                        continue
                    cut = (len(outer) + 1) // 2
                    halves[0].extend(outer[:cut])
                    halves[1].extend(outer[cut:])
                for slot, part in enumerate(halves):
                    if part:
                        add(info, part, (ct, slot))
        else:
            cores = m.n_aic if info.core_type == "AIC" else m.n_aiv
            n_tasks = max(1, min(info.n_outer, cores))
            for t in range(n_tasks):
                add(info, range(t * info.n_outer // n_tasks, (t + 1) * info.n_outer // n_tasks))
    return BlockGraph(g.name, g, tuple(tasks))


_GROUP, _OUTER, _ID = operator.attrgetter("group"), operator.attrgetter("outer"), operator.attrgetter("id")


def _parts(g: TileGraph, by_outer: dict):
    """The nodes of g to walk, in runs: a loop whose outer iterations all have as many nodes
    (`NodeLoop.per`) puts the ids of each in `by_outer` itself (a range: its nodes are not
    made); the nodes of the other groups are walked."""
    if not isinstance(g, LoopTileGraph) or not any(isinstance(p, LoopPart) for p in g.parts):
        yield g.nodes
        return
    for p in g.parts:
        if not isinstance(p, LoopPart) or p[0].per is None or p[3]:
            yield p.nodes() if isinstance(p, LoopPart) else p
            continue
        loop = p[0]
        group = loop.templates[0][0].group
        for o in range(loop.count // loop.per):
            at = loop.start + o * loop.per
            by_outer[(group, o)] = range(at, at + loop.per)


def epilogue_pairs(g: TileGraph) -> dict[int, tuple[int, dict[int, int]]]:
    """Vector groups that only finish the tiles of one cube group: vector group -> (cube group,
    {vector iteration: the cube iteration whose stored tile it reads}).  A vector iteration must
    read GM written by exactly one cube tile (its loads inside that tile's window) and every
    iteration must read one, else the group is not an epilogue and is left unpaired; so is a group
    that writes into a buffer cube tiles store to (`out[:] = a @ b; out[:13] = -out[:13]`: a write
    after the cube's needs the cube task finished, not a flag per tile it reads)."""
    kind = {i.id: i.kind for i in g.groups}
    if "vector" not in kind.values() or "cube" not in kind.values():
        return {}                       # (a plain matmul, a vector kernel: no node to look at)
    grids: dict[str, _TileGrid] = {}
    # one walk over the nodes: the windows of the cube tiles, and the nodes to look at once they
    # are all known (loads and stores of the vector groups, indexed DMAs), kept in their order
    later = []
    indexed: dict[str, bool] = {}       # op -> an indexed DMA (MGATHER, MSCATTER)
    for n in _gm_walk(g):
        op = n.op
        if op == "TSTORE":
            if kind[n.group] == "cube":
                grids.setdefault(n.attrs["gm"].buf.name, _TileGrid()).add(n.attrs["gm"], n.group, n.outer)
            else:
                later.append(n)
        elif op == "TLOAD":
            if kind[n.group] == "vector":
                later.append(n)
        else:
            x = indexed.get(op)
            if x is None:
                x = indexed[op] = gm_access(op) is not None
            if x:
                later.append(n)
    if not grids:
        return {}
    found: dict[int, dict[int, set]] = {}
    overwrites: set[int] = set()            # vector groups writing a buffer cube tiles store to
    for n in later:
        op = n.op
        if op == "TLOAD":
            if kind[n.group] == "vector":
                grid = grids.get(n.attrs["gm"].buf.name)
                if grid is not None:
                    found.setdefault(n.group, {}).setdefault(n.outer, set()).add(grid.find(n.attrs["gm"]))
            continue
        if op == "TSTORE":
            if kind[n.group] == "vector" and n.attrs["gm"].buf.name in grids:
                overwrites.add(n.group)
            continue
        if n.attrs["gm"].buf.name in grids:     # (an indexed DMA)
            overwrites.add(n.group)         # an indexed DMA of cube data: after the whole cube task
    out, paired = {}, set()
    for info in g.groups:
        its = found.get(info.id)
        if not its or len(its) != info.n_outer or any(len(s) != 1 or None in s for s in its.values()):
            continue
        if info.id in overwrites:           # its stores must follow the cube's: a task dependency
            continue
        tiles = {o: next(iter(s)) for o, s in its.items()}
        cubes = {c for c, _ in tiles.values()}
        if len(cubes) == 1 and not cubes & paired:
            paired |= cubes
            out[info.id] = (cubes.pop(), {o: co for o, (_, co) in tiles.items()})
    return out


def _gm_walk(g: TileGraph):
    """g's nodes in order, a loop's (not made yet) its loads and stores alone: all that
    `epilogue_pairs` looks at of a loop (made placed, as l1_reuse, the next pass, reads them)."""
    if not isinstance(g, LoopTileGraph) or "_nodes" in g.__dict__:
        return g.nodes
    return itertools.chain.from_iterable(p.nodes(gm_only=True) if isinstance(p, LoopPart) else p
                                         for p in g.parts)


class _TileGrid:
    """The windows cube tiles store to one GM buffer, found by position: per buffer dim the sorted
    starts of the windows, so the tile holding a window is one bisection per dim away."""

    def __init__(self):
        self.at: dict[tuple, tuple] = {}           # window starts -> (box, group, outer)
        self.starts: list[set] | None = None
        self._sorted: list[list[int]] | None = None

    def add(self, ref: GMRef, group: int, outer: int):
        box = ref.box()
        if box is None:
            return
        lo = tuple(r[0] for r in box)
        self.at[lo] = (box, group, outer)
        self.starts = self.starts or [set() for _ in box]
        for s, x in zip(self.starts, lo):
            s.add(x)
        self._sorted = None

    def find(self, ref: GMRef):
        """(group, outer) of the tile whose window contains `ref`'s, or None."""
        box = ref.box()
        if box is None or not self.at:
            return None
        if self._sorted is None:
            self._sorted = [sorted(s) for s in self.starts]
        lo = []
        for starts, (x, _) in zip(self._sorted, box):
            i = bisect.bisect_right(starts, x)
            if i == 0:
                return None
            lo.append(starts[i - 1])
        hit = self.at.get(tuple(lo))
        if hit is None or not all(a0 <= b0 and b1 <= a1 for (a0, a1), (b0, b1) in zip(hit[0], box)):
            return None
        return hit[1], hit[2]


class _Index:
    """Task footprints of one kind (reads or writes) per GM buffer, sorted along the buffer's
    first dim so that a query only looks at tasks whose rows can meet its own."""

    def __init__(self, feet: list[Footprint]):
        self.rows: dict[str, list] = {}        # buffer -> sorted [(lo0, hi0, task)]
        self.any: dict[str, list[int]] = {}    # buffer -> tasks without a box (spans only)
        self.maxlen: dict[str, int] = {}
        for tid, f in enumerate(feet):
            for name in f.span:
                box = f.box.get(name)
                if box is None:
                    self.any.setdefault(name, []).append(tid)
                else:
                    lo, hi = box[0]
                    self.rows.setdefault(name, []).append((lo, hi, tid))
                    self.maxlen[name] = max(self.maxlen.get(name, 0), hi - lo)
        for lst in self.rows.values():
            lst.sort()

    def candidates(self, f: Footprint) -> set[int]:
        out: set[int] = set()
        for name in f.span:
            out.update(self.any.get(name, ()))
            lst = self.rows.get(name)
            if not lst:
                continue
            box = f.box.get(name)
            if box is None:
                out.update(t for _, _, t in lst)
                continue
            lo, hi = box[0]
            i = bisect.bisect_left(lst, (hi,))           # rows starting before our end
            floor = lo - self.maxlen[name]
            while i > 0 and lst[i - 1][0] > floor:         # earlier starts cannot reach our rows
                i -= 1
                if lst[i][1] > lo:
                    out.add(lst[i][2])
        return out


class _Access(dict):
    """op -> 1: it reads GM, 2: it writes GM, 0: neither; worked out on an op's first lookup."""

    def __missing__(self, op: str) -> int:
        k = self[op] = 1 if op == "TLOAD" or gm_access(op) == "read" else \
            2 if op == "TSTORE" or gm_access(op) == "write" else 0
        return k


def dependencies(g: BlockGraph, ctx: PassContext | None = None) -> BlockGraph:
    """Task B depends on earlier task A when A writes what B reads or writes, or reads what B writes.
    (A task of a loop, `LoopTileGraph.loop_of`, has its windows from the loop's loads and stores
    (`NodeLoop.windows`): no node of it is made here.)"""
    if len({t.group for t in g.tasks}) < 2:
        # tasks of one group never depend on each other (their ops are one group's iterations,
        # apart by construction): a plain matmul's hundreds of tiles need no footprint
        return g.replace(tuple(t if not t.deps else Task(t.id, t.group, t.core_type, t.outer, t.nodes, (),
                                                         pair=t.pair) for t in g.tasks))
    tiles = g.tiles
    parts = tiles.loop_tasks(g.tasks) if isinstance(tiles, LoopTileGraph) else None
    tile_nodes = None
    access = _Access()                  # op -> 1: reads GM, 2: writes GM, 0: neither
    reads, writes = [], []
    for k, t in enumerate(g.tasks):
        both = ([], [])                 # the windows the task reads, writes
        part = parts[k] if parts is not None else None
        if part is not None:            # (its windows, read off the loop: no node made)
            for op, gm in part.windows(t.outer):
                a = access[op]
                if a:
                    both[a - 1].append(gm)
        else:
            if tile_nodes is None:
                tile_nodes = tiles.plain_by_id() if parts is not None else tiles.by_id()
            for n in map(tile_nodes.__getitem__, t.nodes):
                a = access[n.op]
                if a:
                    both[a - 1].append(n.attrs._dict["gm"])
        r, w = Footprint(), Footprint()
        r.add_all(both[0])
        w.add_all(both[1])
        reads.append(r)
        writes.append(w)
    by_reads, by_writes = _Index(reads), _Index(writes)
    tasks = []
    for b in g.tasks:
        cands = by_writes.candidates(reads[b.id]) | by_writes.candidates(writes[b.id]) \
            | by_reads.candidates(writes[b.id])
        deps = tuple(a for a in sorted(cands) if a < b.id and g.tasks[a].group != b.group and (
            writes[a].overlaps(reads[b.id]) or writes[a].overlaps(writes[b.id])
            or reads[a].overlaps(writes[b.id])))
        tasks.append(Task(b.id, b.group, b.core_type, b.outer, b.nodes, deps, pair=b.pair))
    return g.replace(tasks)


def prune_dependencies(g: BlockGraph, ctx: PassContext | None = None) -> BlockGraph:
    """Transitive reduction: drop the edge a -> c when c also reaches a through its other deps.

    Task c depends on a and on b, and b depends on a: c cannot start before b ends, and b not
    before a ends, so the edge a -> c orders nothing and is dropped.  The task graph is a DAG
    whose deps point to earlier tasks, so one pass in task order computes every task's set of
    ancestors (a bit set per task); a dep of c is redundant when it is an ancestor of another
    dep of c.  Reachability, and with it every wavefront level and the simulated schedule, stays
    the same; the runtime has fewer edges to count down and the views fewer arrows to draw.  The
    edge of a paired epilogue to its cube task implies no end (the two run together).
    """
    ancestors: dict[int, int] = {}              # task id -> bit set of every task it depends on
    tasks = []
    for t in g.tasks:
        below = {d: ancestors[d] for d in t.deps}
        implied = 0                             # tasks reached through some dep
        for a in below.values():
            implied |= a
        keep = tuple(d for d in t.deps if not (implied >> d) & 1)
        reach = 0
        for d in t.deps:
            # a paired epilogue runs alongside its cube task (cross-core flags per tile): its end
            # implies the cube task's dependencies ended, not the cube task itself
            paired = t.pair is not None and d == t.pair[0]
            reach |= below[d] | (0 if paired else 1 << d)
        ancestors[t.id] = reach
        tasks.append(t if keep == t.deps else Task(t.id, t.group, t.core_type, t.outer, t.nodes, keep, t.level,
                                                          t.pair))
    return g.replace(tasks)


def wavefronts(g: BlockGraph, ctx: PassContext | None = None) -> BlockGraph:
    level: dict[int, int] = {}
    tasks = []
    for t in g.tasks:
        level[t.id] = 1 + max((level[d] for d in t.deps), default=-1)
        tasks.append(Task(t.id, t.group, t.core_type, t.outer, t.nodes, t.deps, level[t.id], t.pair))
    return g.replace(tasks)


PARTITION = Pass("partition", "tile->block", partition,
                 "split each group's iterations into one task per core; pair epilogues 1 AIC : 2 AIV")
BLOCK_PASSES = [
    Pass("dependencies", "block", dependencies, "task dependencies from the GM regions tasks read and write"),
    Pass("prune_dependencies", "block", prune_dependencies,
         "transitive reduction: drop a dependency another chain of dependencies already implies"),
    Pass("wavefronts", "block", wavefronts, "wavefront level of each task (longest dependency chain)"),
]
