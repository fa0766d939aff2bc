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

Isomorphic tasks (one stream shape, `ir.exec.STREAM_SHAPES`) that get their flags at the same
positions stay isomorphic: the passes after this one and the simulator still work out each
shape once (a 4096^3 matmul with a fused epilogue: 24 cube and 48 vector tasks, a few shapes).
"""
from __future__ import annotations

import itertools
import operator

from ..ir.core import Attrs
from ..ir.exec import STREAM_SHAPES, ExecGraph, ExecTask, Instr, per_shape, stream_shape
from ..ir.gm import GMRef
from .pipeline import Pass, PassContext
from .sync import with_stream

EVENT = 0


def cross_core_sync(g: ExecGraph, ctx: PassContext | None = None) -> ExecGraph:
    if ctx is not None and not ctx.options.get("cross_core_sync", True):
        return g
    by_id = {t.id: t for t in g.tasks}
    waits: dict[int, list[tuple]] = {}        # vector task -> (load index, tile it needs) pairs
    reads: dict[int, dict[int, set[int]]] = {}   # cube task -> slot -> tiles its epilogue reads
    stored: dict[int, list] = {}              # cube task -> `_stored_tiles`
    # positions of the GM stores (loads) of a stream, per stream shape
    at_stores: dict[int, list] = {}
    at_loads: dict[int, list] = {}
    for t in g.tasks:
        if t.pair is None or t.pair[0] not in t.deps:
            continue
        cube, slot = t.pair
        tiles = stored.get(cube)
        if tiles is None:
            tiles = stored[cube] = _stored_tiles(by_id[cube], per_shape(g, at_stores, by_id[cube].instrs,
                                                                        lambda: _at(by_id[cube].instrs, "TSTORE")))
        need = _tile_needed_per_instr(t, tiles, per_shape(g, at_loads, t.instrs, lambda: _at(t.instrs, "TLOAD")))
        if need is None:
            continue
        waits[t.id] = need
        reads.setdefault(cube, {}).setdefault(slot, set()).update(j for _, j in need)
    if not waits:
        return g
    tasks = []
    # stream shape side table: a task left as it was keeps its entry; a changed one gets the
    # shape of (its old shape, where its flags went), a new id
    old_shapes = g.__dict__.get(STREAM_SHAPES, {})
    shapes: dict[int, tuple] = {}
    made: dict[tuple, int] = {}
    fresh = 1 + max((e[1] for e in old_shapes.values()), default=0)
    flags: dict[tuple, Instr] = {}          # equal flags are one instruction (immutable)
    for t in g.tasks:
        shape = stream_shape(g, t.instrs)
        if t.id in waits:
            out, where = _with_waits(t, waits[t.id], reads[t.pair[0]][t.pair[1]], flags)
        elif t.id in reads:
            out, where = _with_sets(t, reads[t.id], stored[t.id], flags)
        else:
            out, where = t, None
        if shape is not None:
            if where is not None:
                shape = made.setdefault((shape, where), fresh + len(made))
            shapes[id(out.instrs)] = (out.instrs, shape)
        tasks.append(out)
    g = g.replace(tasks)
    if shapes:
        g.__dict__[STREAM_SHAPES] = shapes
    return g


def _at(instrs, op: str) -> list[int]:
    """The positions of the instructions of op `op` in a stream."""
    return list(itertools.compress(itertools.count(), map(op.__eq__, map(_OP, instrs))))


def _stored_tiles(cube: ExecTask, stores: list[int]) -> list[tuple[int, GMRef]]:
    """(instruction index, window) of the cube task's GM stores, in order: tile j is the j-th.
    `stores`: the positions of its TSTOREs (`_at`)."""
    instrs = cube.instrs
    return [(k, instrs[k].dst) for k in stores if isinstance(instrs[k].dst, GMRef)]


def _tile_needed_per_instr(t: ExecTask, tiles, loads: list[int]) -> list[tuple[int, int]] | None:
    """The GM loads of the epilogue (at the positions `loads`, its TLOADs) that read cube tiles:
    (instruction index, the last tile it reads) pairs, in order; None when there are none."""
    # per buffer, its tiles' boxes (2-d ones: compared inline, a load is compared with a task's
    # hundreds of tiles) and the others' windows (compared by `overlaps`)
    boxes: dict[str, list] = {}
    others: dict[str, list] = {}
    for i, (_, s) in enumerate(tiles):
        b = s.box()
        if b is not None and len(b) == 2:
            boxes.setdefault(s.buf.name, []).append((*b[0], *b[1], i))
        else:
            others.setdefault(s.buf.name, []).append((i, s))
    out = []
    instrs = t.instrs
    for k in loads:
        w = instrs[k].srcs[0]
        if not isinstance(w, GMRef):
            continue
        name = w.buf.name
        b = w.box()
        if b is not None and len(b) == 2:
            (r0, r1), (c0, c1) = b
            j = max((i for a0, a1, b0, b1, i in boxes.get(name, ()) if a0 < r1 and r0 < a1 and b0 < c1 and c0 < b1),
                    default=-1)
        else:
            j = max((i for _, _, _, _, i in boxes.get(name, ()) if tiles[i][1].overlaps(w)), default=-1)
        if name in others:
            j = max(j, max((i for i, s in others[name] if s.overlaps(w)), default=-1))
        if j >= 0:
            out.append((k, j))
    return out or None


_OP = operator.attrgetter("op")


def _flag(flags: dict, op: str, pipe, attrs: dict, loc) -> Instr:
    """The flag instruction (one object per distinct flag: `flags`, the pass's)."""
    key = (op, pipe, tuple(attrs.items()), loc)
    got = flags.get(key)
    if got is None:
        got = flags[key] = Instr(op, pipe, attrs=Attrs(attrs), loc=loc)
    return got


def _with_waits(t: ExecTask, need: list[tuple], mine: set[int], flags: dict) -> tuple[ExecTask, tuple]:
    """Before each load, wait for the sets of the tiles this AIV reads up to the one it needs
    (`need`: `_tile_needed_per_instr`); (the task, where the waits went: (instruction index,
    waits before it) pairs)."""
    order = sorted(mine)
    done = 0                                   # sets consumed so far (tiles order[:done])
    where = []
    for k, j in need:
        n = done
        while done < len(order) and order[done] <= j:
            done += 1
        if done > n:
            where.append((k, done - n))
    instrs = t.instrs
    return with_stream(t, _inserted(instrs, [(k, [_flag(flags, "CROSS_WAIT_FLAG", instrs[k].pipe,
                                                        {"dst": instrs[k].pipe, "event": EVENT}, instrs[k].loc)] * n)
                                             for k, n in where]),
                       tuple(d for d in t.deps if d != t.pair[0])), tuple(where)


def _with_sets(cube: ExecTask, slots: dict[int, set[int]], tiles: list, flags: dict) -> tuple[ExecTask, tuple]:
    """After the store of each tile an epilogue reads, set the flag of that epilogue's AIV
    (`tiles`: the cube task's `_stored_tiles`); (the task, where the sets went: (instruction
    index, slots) pairs)."""
    after: dict[int, list[int]] = {}
    for slot, mine in sorted(slots.items()):
        for j in mine:
            after.setdefault(tiles[j][0], []).append(slot)
    where = tuple(sorted((k, tuple(v)) for k, v in after.items()))
    instrs = cube.instrs
    return with_stream(cube, _inserted(instrs, [(k + 1, [_flag(flags, "CROSS_SET_FLAG", instrs[k].pipe,
                                                              {"src": instrs[k].pipe, "slot": slot, "event": EVENT},
                                                              instrs[k].loc) for slot in v]) for k, v in where])), where


def _inserted(instrs: tuple, at: list) -> tuple:
    """The stream with instructions inserted: (position, instructions) pairs, in order of position,
    each put before the instruction at that position (the end: len(instrs))."""
    out, k = [], 0
    for pos, new in at:
        out.extend(instrs[k:pos])
        out.extend(new)
        k = pos
    out.extend(instrs[k:])
    return tuple(out)


CROSS_CORE_SYNC = Pass("cross_core_sync", "exec", cross_core_sync,
                       "paired epilogues wait per tile for cross-core flags instead of the whole cube task")
