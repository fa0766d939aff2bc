"""Block -> Execution lowering and the Execution-level pipeline: pipe binding (`select`),
scheduling (listsched.py), sync insertion (sync.py), buffer pressure (pressure.py), codegen."""
from __future__ import annotations

import itertools
from functools import cached_property
import operator
from operator import attrgetter, itemgetter

import numpy as np

from ..ir.block import BlockGraph
from ..ir.tile import LoopTileGraph
from ..ir.core import Attrs
from ..ir.exec import STREAM_SHAPES, ExecGraph, carry_streams, ExecTask, Instr, TileRef, pipe_of
from ..ir.gm import GMRef, moved_alike, window_columns
from ..ir.program import Program
from ..target.isa import ATTRS, SYNC_OPS, gm_access
from .listsched import DynamicScheduler
from .memory import copy_period
from .pipeline import Pass, PassContext
from .pressure import BUFFER_PRESSURE
from .sync import insert_sync


def select_instructions(g: BlockGraph, ctx: PassContext | None = None) -> ExecGraph:
    tiles = g.tiles
    parts = tiles.loop_tasks(g.tasks) if isinstance(tiles, LoopTileGraph) else None
    # node id -> node: of a graph with loops not made yet, the nodes of its other groups, and
    # those of a loop's task when it is selected op by op (its twins need none, `_LoopTwins`)
    nodes = dict(tiles.plain_by_id()) if parts is not None else tiles.by_id()
    select = _selector(nodes)
    twins = _Twins(nodes)
    loop_twins = _LoopTwins(twins)
    tile_twins = _TileTwins(select, nodes, loop_twins.periods)
    tasks = []
    shapes: dict[int, tuple] = {}       # the STREAM_SHAPES side table: see below
    for k, t in enumerate(g.tasks):
        part = parts[k] if parts is not None else None
        if part is not None:
            instrs, rep = loop_twins.stream(t, part)
            if instrs is None:
                instrs, moved = tile_twins.stream(t, part)
                loop_twins.add(instrs, moved)
        else:
            instrs, rep = twins.stream(t)
            if instrs is None:
                instrs, moved = select(t)
                twins.add(t, instrs, moved)
        if rep is not None:
            # a twin whose windows are the representative's moved by one offset per buffer: an
            # isomorphic stream (same dependences, flags and buffer pressure, the same scheduling
            # key), which the side table tells the passes after this one (the representative's
            # entry first)
            shapes.setdefault(id(rep.instrs), (rep.instrs, rep.shape))
            shapes[id(instrs)] = (instrs, rep.shape)
        task = ExecTask(t.id, t.group, t.core_type, t.deps, t.level, instrs, t.pair)
        task.__dict__["instrs"], task.__dict__["n_instrs"] = instrs, len(instrs)    # (no loops yet)
        tasks.append(task)
    if isinstance(tiles, LoopTileGraph):
        tiles.forget_gm()               # (select is the last pass that reads the loops' GM nodes)
    out = ExecGraph(g.name, g.tiles.buffers, tuple(tasks))
    if shapes:
        out.__dict__[STREAM_SHAPES] = shapes
    return out


def _selector(nodes: dict):
    """`select(task) -> (its instructions, the positions of those with a GM window)`: the
    instruction of each tile op of the task, in order (positions None when the task has flags of
    its own: it is no representative of twins, see `_Twins`).  Equal operands, attribute maps and
    on-chip instructions are shared by every task the selector sees (see the tables below)."""
    refs: dict[int, TileRef] = {}           # node id -> the tile it produces, as an operand
    interned: dict[tuple, TileRef] = {}     # equal operands share one object (cheap to cache on)
    # space -> buf -> the last operand made there: a node of its shape, valid shape and dtype
    # object takes it without building a key of tuples to hash (its dtype's hash is a Python
    # `__hash__`); any other goes through `interned`
    placed: dict[str, dict[int, TileRef]] = {}

    def ref(n) -> TileRef:
        key = (n.space, n.attrs._dict["buf"], n.dtype, n.shape, n.valid)
        got = interned.get(key)
        if got is None:
            got = interned[key] = TileRef(*key)
        refs[n.id] = got
        at = placed.get(key[0])
        if at is None:
            at = placed[key[0]] = {}
        at[key[1]] = got
        return got

    ref_of = refs.__getitem__
    # per (op, attribute names), worked out once: (how its GM window is an operand, its pipe,
    # the names the instruction keeps in their order, whether one is a scalar operand, the name
    # when it keeps that one only and not a scalar, the `shared` entry of that name)
    plans: dict[tuple, tuple] = {}
    keep = set(ATTRS) | {"scalar"}
    empty = Attrs()                     # one shared by every instruction that keeps none
    of = Attrs.of                       # (the dicts built here are handed over, never changed)
    make = Instr._make                  # (op, pipe, dst, srcs, attrs, loc), all given
    # name -> value -> the Attrs of an instruction keeping that one name (not "scalar": a
    # TEXTRACT's offsets), shared by the instructions with that value when it is an int or a
    # flat tuple of ints (a value equal to one of other types (1.0, True, a numpy int) prints
    # differently: not shared)
    shared: dict[str, dict] = {}
    # equal on-chip instructions are one object (a matmul's extracts and MACs repeat from output
    # tile to output tile; a 4096x8192x4096 matmul: 228k instructions, 2k distinct), keyed on
    # the identities of their parts, which are interned (`made` keeps them alive)
    made: dict[tuple, Instr] = {}
    # id of an attribute map -> what the instruction of an op with that map takes from it, the
    # op first (`entry`): tile ops share their maps (a 4096^3 matmul: 1,289 maps for 115k ops),
    # so the names and values are looked at once per map (the graph keeps its maps alive), and
    # the ops of one map share the Attrs their instructions keep
    by_map: dict[int, tuple] = {}

    def entry(op: str, d: dict) -> tuple:
        """(op, how its GM window is an operand, its pipe, the Attrs the instruction keeps, its
        scalar operand in a tuple or (), its `buf`, the id of the Attrs) of an op with attribute
        dict `d`."""
        plan = plans.get((op, tuple(d)))     # ((op, *d) builds a list first: slower)
        if plan is None:
            plan = plans[(op, tuple(d))] = _plan(op, d, keep, shared)
        kind, pipe, kept, scalar, one, same = plan
        extra = ()
        if kind == "flag":      # a tile-level kernel's own flag (pypto.tile.set_flag / wait_flag)
            pipe = d["src"] if op == "SET_FLAG" else d["dst"]
            a = Attrs({k: d[k] for k in ("src", "dst", "event")})
        elif one is not None:
            v = d[one]
            c = v.__class__
            if c is int or c is tuple and _INTS.issuperset(map(type, v)):
                a = same.get(v)
                if a is None:
                    a = same[v] = of({one: v})
            else:
                a = of({one: v})
        elif not kept:
            a = empty
        else:
            a = {k: d[k] for k in kept}
            if scalar:
                extra = (a.pop("scalar"),)
            a = of(a)
        return op, kind, pipe, a, extra, d.get("buf"), id(a)

    def select(t) -> tuple[tuple, list[int] | None]:
        instrs = []
        append = instrs.append
        moved = []                      # positions of the instructions with a GM window
        flags = False
        for i in t.nodes:
            n = nodes[i]
            op = n.op
            attrs = n.attrs
            e = by_map.get(id(attrs))
            if e is None or e[0] != op:
                e = by_map[id(attrs)] = entry(op, attrs._dict)
            _, kind, pipe, a, extra, buf, ka = e
            # its tile, made an operand here (a task's ops come in program order: its operands'
            # are made first); None for a store or a flag (`dst or refs[i]`: a KeyError for any
            # other op without a tile, as for a missing operand)
            space = n.space
            if space:
                at = placed.get(space)
                dst = None if at is None else at.get(buf)
                if dst is None or dst.dtype is not n.dtype or dst.shape != n.shape or dst.valid != n.valid:
                    dst = ref(n)
                else:
                    refs[i] = dst
            else:
                dst = None
            if kind == "flag":
                append(make(op, pipe, None, (), a, n.loc))
                flags = True
                continue
            # its operands, and the key of an on-chip instruction in `made` (by count: tuples of
            # a few subscripts and ids, not of a `map`)
            inputs = n.inputs
            try:
                count = len(inputs)
                if count == 1:
                    s0 = refs[inputs[0]]
                    srcs, k = (s0,), (op, ka, id(dst), id(n.loc), id(s0))
                elif count == 2:
                    s0, s1 = refs[inputs[0]], refs[inputs[1]]
                    srcs, k = (s0, s1), (op, ka, id(dst), id(n.loc), id(s0), id(s1))
                elif count == 3:
                    s0, s1, s2 = refs[inputs[0]], refs[inputs[1]], refs[inputs[2]]
                    srcs, k = (s0, s1, s2), (op, ka, id(dst), id(n.loc), id(s0), id(s1), id(s2))
                else:
                    srcs = tuple(map(ref_of, inputs)) if count else ()
                    k = None
            except KeyError:        # an operand not made yet (its op later in the task)
                srcs = tuple([refs[j] if j in refs or not nodes[j].space else ref(nodes[j]) for j in inputs])
                k = None
            if extra:
                srcs += extra
                k = None
            if kind == "tile":
                dst = dst or refs[i]
                if k is None:
                    k = (op, ka, id(dst), id(n.loc), *map(id, srcs))
                ins = made.get(k)
                if ins is None:
                    ins = made[k] = make(op, pipe, dst, srcs, a, n.loc)
            else:
                moved.append(len(instrs))
                gm = attrs._dict["gm"]
                if kind == "load":
                    ins = make("TLOAD", "MTE2", dst or refs[i], (gm,), a, n.loc)
                elif kind == "store":
                    ins = make("TSTORE", pipe_of("TSTORE", srcs[0].space), gm, srcs, a, n.loc)
                elif kind == "read":     # MGATHER: dst <- GM window, index tile
                    ins = make(op, pipe, dst or refs[i], (gm,) + srcs, a, n.loc)
                else:                    # "write", MSCATTER: GM window <- values, index tile
                    ins = make(op, pipe, gm, srcs, a, n.loc)
            append(ins)
        return tuple(instrs), None if flags else moved

    select.refs = refs          # (`_TileTwins` reads and gives the tiles of the tiles it copies)
    return select


_INTS = frozenset([int])


def _plan(op: str, d: dict, keep: set, shared: dict) -> tuple:
    """How `select_instructions` turns a tile op with these attribute names into an instruction:
    (how its GM window is an operand, its pipe, the names it keeps, whether one is "scalar", the
    name when it keeps that one only and it is not "scalar", and then `shared`'s dict of the
    Attrs of that name by value)."""
    acc = gm_access(op)
    kind = "load" if op == "TLOAD" else "store" if op == "TSTORE" else acc or (
        "flag" if op in SYNC_OPS else "tile")
    pipe = None if op == "TSTORE" else "MTE2" if op == "TLOAD" else pipe_of(op)
    kept = tuple(k for k in d if k in keep)
    scalar = "scalar" in kept
    one = kept[0] if len(kept) == 1 and not scalar else None
    return kind, pipe, kept, scalar, one, None if one is None else shared.setdefault(one, {})


class _Twins:
    """Tasks whose instructions are an earlier task's but for their GM windows: the twins of
    that task, which take its instructions and move the windows, not selected op by op.

    Partition cuts a group's iterations into even chunks, so most tasks run the same tile ops
    on other windows: a 4096^3 matmul's 24 tasks are 3 classes of 8 (they load 21 or 22 output
    tiles' operands, and `l1_reuse` keeps the same ones).  Telling that a task is a twin costs
    half of selecting it op by op, as it compares the task with a representative column by
    column (C-level maps over its tile ops, a Python step per op with a window only), and it
    compares everything select reads of a tile op:
      - node ids that differ from the representative's by one constant, and inputs that differ
        by it too: each input is the op at the same position (the representative's inputs are
        all its own ops, as the Block level's verifier requires);
      - per position the same op, space, dtype, shape, valid shape and source location, and the
        same attribute map object, or for an op with a GM window (known by the representative's
        instruction) a map alike but for its "gm": the same names in the same order, values of
        the same type and repr (1 and 1.0 are equal but print otherwise).
    Then every on-chip operand and every instruction without a window is the representative's,
    and an instruction with a window is the representative's with the task's own window.
    """

    MIN_OPS = 64        # a shorter task is selected op by op (its columns would not pay)
    REPS = 4            # representatives kept per pattern of node ids (tasks alike but for it)

    def __init__(self, nodes: dict):
        self.nodes = nodes
        self.reps: dict[bytes, list[_Rep]] = {}     # node ids less the first's -> representatives
        self.canon: dict[int, tuple] = {}           # id of a map with "gm" -> its other items (`canons`)
        self.pattern: bytes | None = None           # that of the task `stream` saw last
        self.made = 0                               # representatives made (their shape ids)

    def stream(self, t) -> tuple:
        """(the instructions of task `t`, its representative when the task's windows are the
        representative's moved by one offset per buffer, else None) when it is the twin of a
        representative, else (None, None)."""
        ids = t.nodes
        self.pattern = None
        if len(ids) < self.MIN_OPS:
            return None, None
        pattern = np.fromiter(ids, np.int64, len(ids))
        pattern -= ids[0]
        self.pattern = pattern = pattern.tobytes()
        reps = self.reps.get(pattern)
        if not reps:
            return None, None
        cols = _columns(itemgetter(*ids)(self.nodes), ids[0])
        for rep in reps:
            got = rep.twin(cols, self)
            if got is not None:
                instrs, uniform = got
                return instrs, rep if uniform else None
        return None, None

    def add(self, t, instrs: tuple, moved: list[int] | None) -> None:
        """Task `t`, just selected op by op (`stream` saw it last), becomes a representative of
        its pattern; not one with flags (`moved` None): their sync is the task's own."""
        if self.pattern is not None and moved is not None:
            reps = self.reps.setdefault(self.pattern, [])
            if len(reps) < self.REPS:
                self.made += 1
                reps.append(_Rep(t, instrs, moved, self.pattern, self.made))

    def canons(self, maps: list) -> list[tuple]:
        """The items of each map but its "gm", in order, each as (name, type, repr) (worked out
        once per map): equal for maps select takes the same from, whatever their windows."""
        ids = list(map(id, maps))
        out = list(map(self.canon.get, ids))
        if None in out:
            canon = self.canon
            for k, c in enumerate(out):
                if c is None:
                    c = canon.get(ids[k])
                    if c is None:
                        c = canon[ids[k]] = tuple((name, v.__class__, repr(v))
                                                  for name, v in maps[k]._dict.items() if name != "gm")
                    out[k] = c
        return out


class _LoopTwins:
    """Twins known from a loop (`LoopTileGraph.loop_of`), without their tile ops compared or even
    made: two tasks of one loop whose outer iterations are, in order, of the same kinds
    (`NodeLoop.kind`) and in the same phase of their slots' copies (`memory.copy_period`), and
    which hold their iterations' nodes at the same relative ids (L1 reuse dropped the same
    loads, and their readers read loads in the same slots), run the same tile ops on the same
    on-chip tiles: their instructions are the same but for the GM windows, which the loop's
    loads and stores give (made for the twin's iterations alone, `gm_only`).  What `_Twins`
    tells by comparing columns, from what made the columns."""

    def __init__(self, twins: _Twins):
        self.twins = twins                      # (their shape ids count on, `_Twins.made`)
        self.reps: dict[tuple, _Rep] = {}       # (id of the loop, `_key`) -> its representative
        self.periods: dict[int, int] = {}       # id of a loop -> its `copy_period`
        self.key = None                         # that of the task `stream` saw last

    def _key(self, t, part) -> tuple | None:
        loop = part[0]
        period = self.periods.get(id(loop))
        if period is None:
            period = self.periods[id(loop)] = copy_period(part)
        if len(t.nodes) < _Twins.MIN_OPS or not loop.windows_only:
            return None         # (an iota's first value moves too: not copied)
        return part.task_key(t.outer, t.nodes, period)

    def stream(self, t, part) -> tuple:
        """(the instructions of task `t`, its representative when its windows are the
        representative's moved by one offset per buffer, else None) when a task of the loop
        `part` like it was selected already, else (None, None)."""
        self.key = key = self._key(t, part)
        rep = self.reps.get(key) if key is not None else None
        if rep is None:
            return None, None
        made = part.windows(t.outer)        # (its loads, then its stores: `_Rep.moved`)
        gms = [gm for op, gm in made if op == "TLOAD"] + [gm for op, gm in made if op == "TSTORE"]
        if len(gms) != len(rep.moved):
            return None, None
        instrs, uniform = rep.with_windows(gms)
        return instrs, rep if uniform else None

    def add(self, instrs: tuple, moved: list[int] | None) -> None:
        """The task `stream` saw last, just selected op by op, represents its key; `moved`: its
        instructions with a GM window (None: it has flags of its own, no twins)."""
        if self.key is not None and moved is not None and self.key not in self.reps:
            if all(instrs[k].op in ("TLOAD", "TSTORE") for k in moved):
                self.twins.made += 1
                self.reps[self.key] = _Rep(None, instrs, moved, b"", self.twins.made)


class _TileTwins:
    """A loop's task selected op by op (no task like it selected before), output tile by output
    tile: a tile alike one selected before runs that one's instructions but for its GM windows,
    which the loop gives without making its nodes (`NodeLoop.windows`); only the other tiles'
    nodes are made and selected (a 4096^3 matmul's first tasks of each class: 64 tiles, 8 kinds).

    Alike: of the same loop, the same kind of iteration and the same copies of its slots
    (`o % period`, as `_LoopTwins` tells tasks apart), the same pattern of node ids (the same loads
    dropped), and
    the very on-chip operands where it reads a tile of an earlier output tile (a kept load):
    then every tile op's op, attribute map and operands are the earlier tile's, and so is every
    instruction without a window (equal instructions are one object, `_selector`'s `made`)."""

    def __init__(self, select, nodes: dict, periods: dict):
        self.select, self.nodes, self.periods = select, nodes, periods
        # key of a tile -> (its `_Rep`, its instructions' positions with a window, in order, the
        # tiles its ops make and those they read from earlier tiles: (id less the tile's first, tile))
        self.reps: dict[tuple, tuple] = {}

    def stream(self, t, part) -> tuple:
        """(task `t`'s instructions, the positions of those with a GM window): `select(t)`."""
        loop, refs = part[0], self.select.refs
        period = self.periods.get(id(loop))
        if period is None:
            period = self.periods[id(loop)] = copy_period(part)
        got = self._tiles(t, loop, period)
        if got is None:
            self.nodes.update((n.id, n) for n in part.nodes(t.outer))
            return self.select(t)
        instrs: list = []
        moved: list[int] = []
        kind, start, per = loop.kind, loop.start, loop.per
        for o, ids in got:
            base = start + o * per
            key = (id(loop), kind(o), o % period, (ids - base).tobytes())
            known = self.reps.get(key)
            if known is not None and all(refs.get(base + r) is ref for r, ref in known[3]):
                rep, at, made, _ = known
                wins = part.windows([o])
                gms = [gm for op, gm in wins if op == "TLOAD"] + [gm for op, gm in wins if op == "TSTORE"]
                if len(gms) == len(rep.moved):
                    refs.update((base + r, ref) for r, ref in made)
                    moved.extend(len(instrs) + k for k in at)
                    instrs.extend(rep.with_windows(gms)[0])
                    continue
            mine = ids.tolist()
            tile = part.nodes([o])
            self.nodes.update((n.id, n) for n in tile)
            tile_instrs, at = self.select(_Ids(mine))
            if at is None:              # (flags of its own: no twins)
                self.nodes.update((n.id, n) for n in part.nodes(t.outer))
                return self.select(t)
            if key not in self.reps:
                end = base + per
                read = {j for n in tile for j in n.inputs if not base <= j < end}
                self.reps[key] = (_Rep(None, tile_instrs, at, b"", 0), at,
                                  [(i - base, refs[i]) for i in mine if i in refs],
                                  [(j - base, refs[j]) for j in sorted(read)])
            moved.extend(len(instrs) + k for k in at)
            instrs.extend(tile_instrs)
        return tuple(instrs), moved

    @staticmethod
    def _tiles(t, loop, period) -> list | None:
        """(outer iteration, its node ids (an int64 array)) of each tile of `t`, in order; None
        when the loop cannot tell tiles alike (no kinds, no period) or the task's ids do not come
        iteration by iteration."""
        if (not period or loop.kind is None or not loop.per or not loop.windows_only
                or len(t.nodes) < _Twins.MIN_OPS):
            return None
        ids = np.fromiter(t.nodes, np.int64, len(t.nodes))
        which = (ids - loop.start) // loop.per
        cuts = [0, *(np.flatnonzero(np.diff(which)) + 1).tolist(), len(ids)]
        outer = which[cuts[:-1]].tolist()
        if outer != list(t.outer):
            return None
        return [(o, ids[a:b]) for o, a, b in zip(outer, cuts, cuts[1:])]


class _Ids:
    """A task of only these tile op ids, for `select` (one output tile of a task)."""

    __slots__ = ("nodes",)

    def __init__(self, nodes: list):
        self.nodes = nodes


_SIG = attrgetter("op", "space", "dtype", "shape", "valid", "loc")
_ATTRS, _INPUTS, _DICT = attrgetter("attrs"), attrgetter("inputs"), attrgetter("_dict")
_GM = itemgetter("gm")


def _columns(ops: tuple, base: int) -> tuple:
    """Of a task's tile ops: (per op its `_SIG`, its attribute map, its input count; all their
    inputs in order less `base`, an int64 array)."""
    inputs = list(map(_INPUTS, ops))
    counts = list(map(len, inputs))
    flat = np.fromiter(itertools.chain.from_iterable(inputs), np.int64, sum(counts))
    flat -= base
    return list(map(_SIG, ops)), list(map(_ATTRS, ops)), counts, flat


class _Rep:
    """A task selected op by op, which its twins copy (`_Twins`, which compares a twin's tile ops
    with its own; `_LoopTwins`, which knows them alike from a loop and has no `task` for it)."""

    def __init__(self, t, instrs: tuple, moved: list[int], pattern: bytes, shape: int):
        self.task, self.instrs, self.pattern = t, instrs, pattern
        self.shape = shape          # the stream shape id of it and of its uniformly moved twins
        # the positions of its instructions with a GM window: those reading it (a load, a
        # gather), then those writing it (a store, a scatter)
        reads = [k for k in moved if not isinstance(instrs[k].dst, GMRef)]
        self.moved = reads + [k for k in moved if isinstance(instrs[k].dst, GMRef)]
        self.n_reads = len(reads)
        self.cols = None            # its columns, when a task of its pattern first comes; False: no twins

    def twin(self, cols: tuple, twins: _Twins) -> tuple | None:
        """(the instructions of the task of columns `cols` (of the same pattern of node ids),
        whether its windows are this one's moved by one offset per buffer (`moved_alike`)) when it is
        a twin of this one, else None."""
        if self.cols is None:
            self.cols = self._columns(twins)
        if not self.cols:
            return None
        sig, maps, counts, inputs = cols
        mine_sig, mine_maps, mine_counts, mine_inputs, mine_canons = self.cols
        if sig != mine_sig or counts != mine_counts or inputs.tobytes() != mine_inputs:
            return None
        moved = list(map(maps.__getitem__, self.moved))
        if twins.canons(moved) != mine_canons:
            return None
        # where the window moves, the maps are as good as the representative's: with those in
        # their place, every map must be the representative's, the very object (an equal map
        # may hold 1.0 where it holds 1, which prints differently)
        maps = maps.copy()              # (the task's own: other representatives may look at it)
        for k in self.moved:
            maps[k] = mine_maps[k]
        if not all(map(operator.is_, maps, mine_maps)):
            return None
        return self.with_windows(list(map(_GM, map(_DICT, moved))))

    def with_windows(self, gms: list) -> tuple:
        """(its instructions with the windows `gms` (one per instruction of `moved`, in its
        order) in place of its own, whether those are its own moved by one offset per buffer,
        `moved_alike`).  The instructions with a window are fresh ones with the representative's
        other parts, by a C-level `make` over columns."""
        ops, pipes, dsts, srcs, attrs, locs = self._parts
        n = self.n_reads
        made = itertools.chain(
            map(Instr._make, ops[:n], pipes[:n], dsts[:n], map(operator.add, zip(gms[:n]), srcs[:n]),
                attrs[:n], locs[:n]),
            map(Instr._make, ops[n:], pipes[n:], gms[n:], srcs[n:], attrs[n:], locs[n:]))
        out = list(self.instrs)
        for k, ins in zip(self.moved, made):
            out[k] = ins
        return tuple(out), moved_alike(gms, self._windows)

    @cached_property
    def _parts(self) -> tuple:
        """The parts of its instructions with a window but the window, by column (op, pipe, dst,
        the sources after the window (all for a write), attributes, loc)."""
        instrs = list(map(self.instrs.__getitem__, self.moved))
        n = self.n_reads
        srcs = [ins.srcs[1:] for ins in instrs[:n]] + [ins.srcs for ins in instrs[n:]]
        return (list(map(_OP, instrs)), list(map(_PIPE, instrs)), list(map(_DST, instrs)), srcs,
                list(map(_ATTRS, instrs)), list(map(_LOC, instrs)))

    @cached_property
    def _windows(self) -> tuple:
        """Its windows (`window_columns`), in the order of `moved`."""
        instrs = list(map(self.instrs.__getitem__, self.moved))
        n = self.n_reads
        return window_columns([ins.srcs[0] for ins in instrs[:n]] + [ins.dst for ins in instrs[n:]])

    def _columns(self, twins: _Twins):
        """What `twin` compares with: its `_columns` (the inputs as bytes) and the other items of
        the maps where the window moves; False when an op reads a tile of another task."""
        ids = self.task.nodes
        sig, maps, counts, inputs = _columns(itemgetter(*ids)(twins.nodes), ids[0])
        if not np.isin(inputs, np.frombuffer(self.pattern, np.int64)).all():
            return False
        return sig, maps, counts, inputs.tobytes(), twins.canons(list(map(maps.__getitem__, self.moved)))


_OP, _PIPE, _DST, _LOC = attrgetter("op"), attrgetter("pipe"), attrgetter("dst"), attrgetter("loc")


def codegen(g: ExecGraph, ctx: PassContext | None = None) -> Program:
    program = Program(g.name, g.buffers, g.tasks)
    carry_streams(g, program)           # isomorphic task streams: the simulator decodes each shape once
    # the Execution level's verifier and the compiler's construction vouch for it: the simulator
    # need not re-check it as it checks hand-written programs
    program.__dict__["_verified_for"] = {ctx.machine} if ctx is not None else set()
    return program


SELECT = Pass("select", "block->exec", select_instructions, "bind every tile op to a pipe with resolved operands")
EXEC_PASSES = [
    DynamicScheduler().as_pass("scheduling"),
    Pass("insert_sync", "exec", insert_sync, "SET_FLAG/WAIT_FLAG between pipes where data or buffers are shared"),
    BUFFER_PRESSURE,
]
CODEGEN = Pass("codegen", "exec->pto", codegen, "emit the PTO program")
