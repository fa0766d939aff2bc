"""Level 3, the Block Graph: tasks, each a group of tile iterations run by one core type.

A task runs on one AIC (cube) or AIV (vector) core; its tile ops are those of some outer
iterations of one fusion group.  Dependencies between tasks come from GM regions one writes and
another reads or writes; `level` is the task's wavefront (longest dependency chain before it).
"""
from __future__ import annotations

from dataclasses import dataclass
import itertools
from itertools import chain
from operator import attrgetter

from ..errors import VerificationError
from .core import TextForm, gather, pair_problem, quick_init
from .tile import LoopTileGraph, TileGraph


@quick_init
@dataclass(frozen=True)
class Task:
    id: int
    group: int
    core_type: str                 # AIC | AIV
    outer: tuple[int, ...]         # outer iterations of the group
    nodes: tuple[int, ...]         # tile node ids, in program order
    deps: tuple[int, ...] = ()
    level: int = 0
    # (cube task, AIV slot 0|1) for a vector epilogue of a mixed kernel: the task runs on the
    # AIV `slot` of the AIC that ran the cube task (1 AIC : 2 AIV), None for any free core
    pair: tuple[int, int] | None = None


@dataclass(frozen=True)
class BlockGraph(TextForm):
    name: str
    tiles: TileGraph
    tasks: tuple[Task, ...]

    level = "block"

    def __len__(self):
        return len(self.tasks)

    def replace(self, tasks) -> "BlockGraph":
        return BlockGraph(self.name, self.tiles, tuple(tasks))

    def text(self) -> str:
        lines = [f"block_graph {self.name} {{"]
        for t in self.tasks:
            outer = f"{t.outer[0]}..{t.outer[-1]}" if len(t.outer) > 1 else str(t.outer[0])
            lines.append(f"  task {t.id}: group {t.group} on {t.core_type}, iterations {outer}, "
                         f"{len(t.nodes)} tile ops, deps {list(t.deps)}, wave {t.level}"
                         + (f", paired with task {t.pair[0]} (AIV slot {t.pair[1]})" if t.pair else ""))
        lines.append("}")
        return "\n".join(lines)



def verify(g: BlockGraph) -> None:
    seen: set[int] = set()
    covered: set[int] = set()
    core_of: dict[int, str] = {}
    kinds = {i.id: i.core_type for i in g.tiles.groups}
    parts = g.tiles.loop_tasks(g.tasks) if isinstance(g.tiles, LoopTileGraph) else None
    tiles = None
    for k, t in enumerate(g.tasks):
        if any(d not in seen for d in t.deps):
            raise VerificationError(f"block graph task {t.id}: depends on a later or unknown task",
                                    expected=f"deps among {sorted(seen)}", got=list(t.deps))
        if kinds.get(t.group) != t.core_type:
            raise VerificationError(f"block graph task {t.id}: group {t.group} needs a {kinds.get(t.group)} core",
                                    got=t.core_type)
        problem = pair_problem(t.core_type, t.pair, core_of)
        if problem:
            raise VerificationError(f"block graph task {t.id}: {problem}", got=t.pair)
        core_of[t.id] = t.core_type
        mine = set(t.nodes)
        if not covered.isdisjoint(mine):
            raise VerificationError(f"block graph task {t.id}: tile ops assigned to two tasks")
        covered |= mine
        seen.add(t.id)
        part = parts[k] if parts is not None else None
        if part is not None:
            _own_loop_tiles(t, part, mine)
            continue
        if tiles is None:
            tiles = g.tiles.plain_by_id() if parts is not None else g.tiles.by_id()
        # every tile a task's ops read is its own: all their inputs at once (C-level: the ops
        # by one gather, not a lookup call per op), and only when one is not, the op
        # that reads it
        ops = gather(tiles, t.nodes)
        read = set(chain.from_iterable(map(_INPUTS, ops)))
        if not read <= mine:
            for i in t.nodes:
                stray = [j for j in tiles[i].inputs if j not in mine]
                if stray:
                    raise VerificationError(f"block graph task {t.id}: tile op {i} reads tile {stray[0]} "
                                            "of another task (tasks do not share on-chip buffers)")
    if len(covered) != len(g.tiles):
        raise VerificationError(f"block graph {g.name}: tile ops left out of every task",
                                expected=len(g.tiles), got=len(covered))


def _own_loop_tiles(t: Task, part, mine: set) -> None:
    """That task `t`, which holds the nodes of some outer iterations of a loop (`loop_of`), reads
    only its own tiles, without making them: a loop's nodes read only nodes of their own outer
    iteration (its templates do, and each iteration is one of them: the Tile level's verifier
    checks both), so what is left to check is that the task holds every node of its iterations
    but the loads dropped by L1 reuse, and that their readers read a load the task holds."""
    loop, _, _, dropped = part
    per = loop.per
    whole = set(itertools.chain.from_iterable(range(loop.start + o * per, loop.start + (o + 1) * per)
                                              for o in t.outer))
    gone = whole - mine
    if mine - whole or any(dropped is None or dropped.get(i) not in mine for i in gone):
        raise VerificationError(f"block graph task {t.id}: its tile ops are not those of its iterations "
                                f"{t.outer[0]}..{t.outer[-1]} of group {t.group}'s loop",
                                expected=f"{len(whole)} tile ops, less loads dropped for one it keeps",
                                got=f"{len(mine)}, {len(mine - whole)} from elsewhere")


_INPUTS = attrgetter("inputs")
