"""Tile -> Block lowering and Block-level passes: partitioning, dependencies, wavefronts."""
from __future__ import annotations

from ..ir.block import BlockGraph, Task
from ..ir.gm import GMRef
from ..ir.tile import TileGraph
from .pipeline import Pass, PassContext


def partition(g: TileGraph, ctx: PassContext) -> BlockGraph:
    """Split each group's outer iterations into contiguous chunks, one task per core of its type."""
    m = ctx.machine
    by_outer: dict[tuple[int, int], list[int]] = {}
    for n in g.nodes:
        by_outer.setdefault((n.group, n.outer), []).append(n.id)
    tasks = []
    for info in g.groups:
        cores = m.n_aic if info.core_type == "AIC" else m.n_aiv
        n_tasks = max(1, min(info.n_outer, cores))
        for t in range(n_tasks):
            lo, hi = t * info.n_outer // n_tasks, (t + 1) * info.n_outer // n_tasks
            outer = tuple(range(lo, hi))
            nodes = tuple(i for o in outer for i in by_outer.get((info.id, o), ()))
            tasks.append(Task(len(tasks), info.id, info.core_type, outer, nodes))
    return BlockGraph(g.name, g, tuple(tasks))


class _Footprint:
    """Bounding boxes (or spans) of the GM windows a task reads or writes, per buffer."""

    def __init__(self):
        self.box: dict[str, list] = {}
        self.span: dict[str, list] = {}

    def add(self, ref: GMRef):
        name = ref.buf.name
        lo, hi = ref.span()
        s = self.span.get(name)
        self.span[name] = [lo, hi] if s is None else [min(s[0], lo), max(s[1], hi)]
        b = ref.box()
        if b is None:
            self.box[name] = None
        elif name not in self.box:
            self.box[name] = [list(r) for r in b]
        elif self.box[name] is not None:
            self.box[name] = [[min(x[0], y[0]), max(x[1], y[1])] for x, y in zip(self.box[name], b)]

    def overlaps(self, other: "_Footprint") -> bool:
        for name, (lo, hi) in self.span.items():
            o = other.span.get(name)
            if o is None or not (lo < o[1] and o[0] < hi):
                continue
            a, b = self.box.get(name), other.box.get(name)
            if a is None or b is None or all(x0 < y1 and y0 < x1 for (x0, x1), (y0, y1) in zip(a, b)):
                return True
        return False


def dependencies(g: BlockGraph, ctx: PassContext | None = None) -> BlockGraph:
    """Task B depends on earlier task A when A writes what B reads or writes, or reads what B writes."""
    tile_nodes = g.tiles.by_id()
    reads, writes = [], []
    for t in g.tasks:
        r, w = _Footprint(), _Footprint()
        for i in t.nodes:
            n = tile_nodes[i]
            if n.op == "TLOAD":
                r.add(n.attrs["gm"])
            elif n.op == "TSTORE":
                w.add(n.attrs["gm"])
        reads.append(r)
        writes.append(w)
    # groups whose GM buffers never meet cannot have dependent tasks: skip their pairs
    touched: dict[int, tuple[set, set]] = {}
    for t in g.tasks:
        rd, wr = touched.setdefault(t.group, (set(), set()))
        rd.update(reads[t.id].span)
        wr.update(writes[t.id].span)

    def groups_meet(ga: int, gb: int) -> bool:
        (ra, wa), (rb, wb) = touched[ga], touched[gb]
        return bool(wa & rb or wa & wb or ra & wb)

    meet = {}
    tasks = []
    for b in g.tasks:
        deps = []
        for a in g.tasks[:b.id]:
            if a.group == b.group:
                continue
            pair = (a.group, b.group)
            if pair not in meet:
                meet[pair] = groups_meet(*pair)
            if meet[pair] and (writes[a.id].overlaps(reads[b.id]) or writes[a.id].overlaps(writes[b.id])
                               or reads[a.id].overlaps(writes[b.id])):
                deps.append(a.id)
        tasks.append(Task(b.id, b.group, b.core_type, b.outer, b.nodes, tuple(deps)))
    return g.replace(tasks)


def wavefronts(g: BlockGraph, ctx: PassContext | None = None) -> BlockGraph:
    level: dict[int, int] = {}
    tasks = []
    for t in g.tasks:
        level[t.id] = 1 + max((level[d] for d in t.deps), default=-1)
        tasks.append(Task(t.id, t.group, t.core_type, t.outer, t.nodes, t.deps, level[t.id]))
    return g.replace(tasks)


PARTITION = Pass("partition", "tile->block", partition, "split each group's iterations into one task per core")
BLOCK_PASSES = [
    Pass("dependencies", "block", dependencies, "task dependencies from the GM regions tasks read and write"),
    Pass("wavefronts", "block", wavefronts, "wavefront level of each task (longest dependency chain)"),
]
