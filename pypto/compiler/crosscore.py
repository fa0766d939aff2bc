"""Execution-level pass `cross_core_sync`: paired epilogues stream tile by tile.

Partitioning pairs the vector tasks that finish a cube task's tiles with it (1 AIC : 2 AIV,
partition.py).  Through a task dependency an epilogue would start only once its cube task has
stored every tile.  This pass replaces that dependency with cross-core flags, as the mixed
(AIC + AIV) launches of the hardware do: after storing tile j the cube task's FIX pipe sets a
flag of each AIV that reads tile j (CROSS_SET_FLAG FIX -> AIV<slot>), and the epilogue's MTE2
waits for it (CROSS_WAIT_FLAG AIC -> MTE2) before its first load from tile j.  Flags count,
so one event id serves every tile: the n-th wait of an AIV consumes the n-th set for it.  The
epilogue of tile j then runs on the AIVs while the AIC computes tile j+1.

The dispatcher starts a paired task on its AIV once the cube task has started (timing.py); a
task that is not paired, or whose loads do not read its cube task's stores in the order they
are made, keeps its dependency.
"""
from __future__ import annotations

from ..ir.core import Attrs
from ..ir.exec import ExecGraph, ExecTask, Instr
from ..ir.gm import GMRef
from .pipeline import Pass, PassContext

EVENT = 0


def cross_core_sync(g: ExecGraph, ctx: PassContext | None = None) -> ExecGraph:
    if ctx is not None and not ctx.options.get("cross_core_sync", True):
        return g
    by_id = {t.id: t for t in g.tasks}
    waits: dict[int, list[int]] = {}          # vector task -> tile index needed before each of its loads
    reads: dict[int, dict[int, set[int]]] = {}   # cube task -> slot -> tiles its epilogue reads
    for t in g.tasks:
        if t.pair is None or t.pair[0] not in t.deps:
            continue
        cube, slot = t.pair
        tiles = _stored_tiles(by_id[cube])
        need = _tile_needed_per_instr(t, tiles)
        if need is None:
            continue
        waits[t.id] = need
        reads.setdefault(cube, {}).setdefault(slot, set()).update(j for j in need if j >= 0)
    if not waits:
        return g
    tasks = []
    for t in g.tasks:
        if t.id in waits:
            tasks.append(_with_waits(t, waits[t.id], reads[t.pair[0]][t.pair[1]]))
        elif t.id in reads:
            tasks.append(_with_sets(t, reads[t.id]))
        else:
            tasks.append(t)
    return g.replace(tasks)


def _stored_tiles(cube: ExecTask) -> list[tuple[int, GMRef]]:
    """(instruction index, window) of the cube task's GM stores, in order: tile j is the j-th."""
    return [(k, ins.dst) for k, ins in enumerate(cube.instrs)
            if ins.op == "TSTORE" and isinstance(ins.dst, GMRef)]


def _tile_needed_per_instr(t: ExecTask, tiles) -> list[int] | None:
    """Per instruction of the epilogue, the last cube tile its GM loads read (-1: none), or None
    when a load reads a tile that an earlier load could not have waited for in store order."""
    out, latest = [], -1
    for ins in t.instrs:
        j = -1
        if ins.op == "TLOAD" and isinstance(ins.srcs[0], GMRef):
            w = ins.srcs[0]
            j = max((i for i, (_, s) in enumerate(tiles) if s.overlaps(w)), default=-1)
        out.append(j)
        latest = max(latest, j)
    return out if latest >= 0 else None


def _with_waits(t: ExecTask, need: list[int], mine: set[int]) -> ExecTask:
    """Before each load, wait for the sets of the tiles this AIV reads up to the one it needs."""
    order = sorted(mine)
    done = 0                                   # sets consumed so far (tiles order[:done])
    instrs = []
    for ins, j in zip(t.instrs, need):
        while j >= 0 and done < len(order) and order[done] <= j:
            instrs.append(Instr("CROSS_WAIT_FLAG", ins.pipe, attrs=Attrs({"dst": ins.pipe, "event": EVENT}),
                                loc=ins.loc))
            done += 1
        instrs.append(ins)
    deps = tuple(d for d in t.deps if d != t.pair[0])
    return ExecTask(t.id, t.group, t.core_type, deps, t.level, tuple(instrs), t.pair)


def _with_sets(cube: ExecTask, slots: dict[int, set[int]]) -> ExecTask:
    """After the store of each tile an epilogue reads, set the flag of that epilogue's AIV."""
    store_of_tile = {j: k for j, (k, _) in enumerate(_stored_tiles(cube))}
    after: dict[int, list[int]] = {}
    for slot, tiles in sorted(slots.items()):
        for j in tiles:
            after.setdefault(store_of_tile[j], []).append(slot)
    instrs = []
    for k, ins in enumerate(cube.instrs):
        instrs.append(ins)
        for slot in after.get(k, ()):
            instrs.append(Instr("CROSS_SET_FLAG", ins.pipe, attrs=Attrs({"src": ins.pipe, "slot": slot,
                                                                         "event": EVENT}), loc=ins.loc))
    return ExecTask(cube.id, cube.group, cube.core_type, cube.deps, cube.level, tuple(instrs), cube.pair)


CROSS_CORE_SYNC = Pass("cross_core_sync", "exec", cross_core_sync,
                       "paired epilogues wait per tile for cross-core flags instead of the whole cube task")
