"""Execution-level pass `loops`: each task's repeated instruction sequences become loops.

A task runs the same few instructions once per tile: the same ops on the same on-chip buffers,
the same flags, only the GM windows move, by the same number of elements every tile.  The pass
finds those repetitions and writes them once, as a loop whose instructions name their window at
the first iteration and by how much it moves per iteration (`gm_step=`, see `ir.exec.Loop`):

    .loop 62
      WAIT_FLAG          V -> MTE2, EVENT_ID0
      TLOAD              UB[0x0]:fp32[16,1024], GM:x[16:32,0:1024], gm_step=16384  ; softmax.py:4
      ...
    .endloop

Tiles taking turns in a ring of slots (a matmul's A panel in four L1 slots, a double-buffered
load's two) move around the ring (`addr_ring`, see `ir.exec`): their steps are compared modulo
the ring, so a K chunk is one loop body whichever slot it starts in; the ring is written only
where an iteration wraps around it.  A long stream (scheduled output tile by output tile) is
folded tile by tile: each region up to a GM store alone, alike ones sharing one fold, then the
sequence of their folds (a loop over a task's tiles, K loops inside each).

Loops are found inner first: a pass over the instructions folds the runs of identical copies
of a sequence (the longest saving first at each position), then the same over the loops and
instructions it made, which nests loops (a matmul's K chunks inside its output tiles), until
nothing repeats.  Instructions are compared by ids that leave out what moves (GM offsets, event
ids, extract offsets); the copies must also move each of those by one constant step.  A loop's
body is folded too (inner loops), and a task isomorphic to one already folded takes its loops:
at once when its windows are those of the first task moved by one offset per buffer (`moved`),
else checked iteration by iteration (`replay`).  So does any stream (a task, a loop body) whose
instructions have the ids of one folded before and move alike (`_folding`): the passes would
decide the same.

The instructions the task runs are exactly the ones before (`ExecTask.instrs` unrolls them), so
cycles and results do not change; what changes is what one reads (`ck.program.text()`, the
Exec level) and what the text costs.  `options={"loops": False}` keeps the streams unrolled.
"""
from __future__ import annotations

import itertools
import marshal
import operator
from functools import cached_property

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..ir.core import Attrs
from ..ir.exec import (ADDR_RING, ADDR_STEP, EVENTS_PER_PIPE_PAIR, MOVING_STEPS, SIM_CACHE, STEP_KEYS, STREAM_SHAPES,
                       ExecGraph, ExecTask, Instr, Loop, TileRef, n_instrs, store_regions, stream_shape, tile_operands)
from ..ir.gm import GMRef
from ..ir.tile import tile_bytes
from .listsched import REGION_MIN
from .pipeline import Pass, PassContext

MIN_TASK = 96                   # shorter tasks are left as they are (a few tiles: little to fold)
MIN_BODY = 8                    # a loop body is searched for inner loops from this length
SMALL_PERIOD = 48               # the periods up to this many tokens that occur are tried (inner
                                # loops), and the structural periods of the outer repetitions
MAX_DEPTH = 4                   # loops nest at most this deep
# streams of the same ids that do not move alike are folded anew: the folds of the first few are
# kept for the ones to come (a matmul's output tiles walking K forward and back, one each)
TEMPLATES_PER_IDS = 4
# a long stream is folded output tile by output tile when its tiles (regions up to a GM store)
# are this many instructions on average (a matmul's: hundreds); shorter ones (a vector kernel's
# row blocks of a few dozen) fold faster as one stream, into the same text
TILE_MIN = 128
# a task whose folded text keeps more than 1/LEFT of its instructions is folded again with the
# addresses of its on-chip tiles moving (`addr_step`); that folding is taken when its text is
# under 1/BETTER of the first one's.  Kernels whose tiles stay put fold as they did.
LEFT, BETTER = 4, 2
# (a task longer than REGION_MIN, scheduled tile by tile, is folded with its tiles moving first, and
# as above when that leaves more than 1/LEFT of its instructions)
# tokens compared per token of a task when copies equal by their ids fail the constant-step check
# (a stream that repeats but moves irregularly, e.g. a matmul whose L1 reuse varies from tile to
# tile): the pass stops looking for other periods beyond it, so it stays linear in the stream
WORK_PER_TOKEN = 16
# streams whose tokens times candidate periods are at most this many compare all the periods at
# once (`_best_periods`), longer ones period by period
ALL_PERIODS_AT_ONCE = 1 << 16


def fold_loops(g: ExecGraph, ctx: PassContext | None = None) -> ExecGraph:
    if ctx is not None and not ctx.options.get("loops", True):
        return g
    known = _Tokens()               # what the folds learn of the tasks' instructions
    # ... and the second stage's, whose tiles move: one per table of the rings of slots they
    # move around (`_rings`: the tasks of a group share their allocation, so their table)
    tiles: dict = {}
    tasks, shapes, folded = [], {}, {}
    for t in g.tasks:
        shape = stream_shape(g, t.instrs)
        items = None
        if shape in folded:         # an isomorphic task: its loops are those of the first one
            template = folded[shape]
            items = template.moved(t.instrs)
            if items is None:
                items = replay(template.items, t.instrs)
        if items is None:
            if len(t.instrs) >= MIN_TASK:
                n = len(t.instrs)
                moving = template = None
                if n > REGION_MIN:
                    # a long stream, scheduled tile by tile: its output tiles take turns in
                    # double-buffered slots, so the fold with the tiles moving finds their loop,
                    # tile by tile (the other one is tried when it leaves more than a quarter)
                    moving = _moving(t.instrs, known, tiles, by_tiles=True)
                    if _lines(moving.items) * LEFT <= n:
                        template = moving
                if template is None:
                    template = _folding(t.instrs, known)
                    lines = _lines(template.items)
                    if lines * LEFT > n:
                        # few repetitions with the very same tiles: those whose tiles move by
                        # constant steps (a matmul's A panel, one L1 copy per K chunk)
                        if moving is None:
                            moving = _moving(t.instrs, known, tiles)
                        if _lines(moving.items) * BETTER < lines:
                            template = moving
            else:
                template = _Template(t.instrs, t.instrs)
            items = template.items
            if shape is not None:
                folded[shape] = template
        if items is not t.code:
            run = t.instrs
            t = ExecTask(t.id, t.group, t.core_type, t.deps, t.level, items, t.pair, t.core)
            t.__dict__["instrs"] = run      # what its loops unroll to: the very instructions it ran
                                            # (the simulators read them; no unrolling again)
        if shape is not None:       # the shape of the stream the task runs, folded or not
            shapes[id(t.code)] = (t.code, shape)
        tasks.append(t)
    out = g.replace(tasks)
    out.__dict__[STREAM_SHAPES] = shapes
    # the tasks run the very instructions they ran: what the simulator knows of them still holds
    out.__dict__[SIM_CACHE] = g.__dict__.setdefault(SIM_CACHE, {})
    return out


FOLD_LOOPS = Pass("loops", "exec", fold_loops, "write each task's repeated instruction sequences once, as loops")


def _moving(instrs, known: _Tokens, tiles: dict, by_tiles: bool = False) -> _Template:
    """The fold of a stream with its tiles' addresses moving (the second stage), around the
    rings of slots its tiles take turns in; its steps written as plain steps where no iteration
    wraps around a ring (`_linear`).

    `by_tiles`: the stream cut after each GM store (`store_regions`, the regions it was scheduled
    and its flags planned by; when they are TILE_MIN instructions long on average), each region
    folded alone, then the sequence of their folds.  Alike regions fold as one (`_folding`): a
    matmul task's twenty-odd output tiles are two or three folds (K walked forward, back) taken
    by the others, and a tile's K chunks, one slot further around the rings each, a loop inside
    it."""
    rings = _rings(known.examples(instrs))
    mine = tiles.get(rings)
    if mine is None:
        # (its descriptions of the task's instructions are kept for the pass: the tasks of other
        # shapes share most of their instruction objects, the flags and on-chip ones)
        mine = tiles[rings] = _Tokens(tiles=True, base=known, rings=dict(rings))
    regions = store_regions(instrs) if by_tiles else ()
    if len(regions) < 2 or len(instrs) < TILE_MIN * len(regions):
        template = _folding(instrs, mine)
        items = _linear(template.items, (), {})
        return template if items is template.items else _Template(template.first, items, template.moving)
    tokens = []
    for lo, hi in regions:
        tokens.extend(_folding(instrs[lo:hi], mine).items)
    for _ in range(MAX_DEPTH):
        keys, offs = mine.describe_all(tokens)
        folded = _fold_pass(tokens, keys, offs, mine)
        if folded is None:
            break
        tokens = folded
    return _Template(instrs, _linear(tuple(tokens), (), {}))


def _rings(instrs) -> frozenset:
    """The rings of slots the tiles of `instrs` (a stream's, or one of each of its kinds:
    `_Tokens.examples`) take turns in: {(space, dtype, shape, valid, address): (lo, hi)} (as a
    frozenset of its items) for the tiles of a kind found at two or more addresses one slot
    apart in a row (a matmul's A panel: four L1 slots; a double-buffered load's two), [lo, hi)
    the bytes of their slots.  The addresses of a kind are cut into evenly spaced runs, lowest
    first: a kernel's other tiles of that shape are rings of their own, or none."""
    seen: dict = {}
    for x in instrs:
        for o in tile_operands(x):
            seen.setdefault((o.space, o.dtype, o.shape, o.valid), set()).add(o.addr)
    out = []
    for key, addrs in seen.items():
        a = sorted(addrs)
        size = tile_bytes(key[2], key[1])
        i = 0
        while i + 1 < len(a):
            d, j = a[i + 1] - a[i], i + 1
            while j + 1 < len(a) and a[j + 1] - a[j] == d:
                j += 1
            if d < size:            # (slots that overlap are no ring)
                i += 1
                continue
            out += [((*key, addr), (a[i], a[j] + d)) for addr in a[i:j + 1]]
            i = j + 1
    return frozenset(out)


def _linear(items, counts: tuple, memo: dict):
    """The folded items with the steps of each ring tile (`ADDR_RING`) written as plain steps
    when no iteration of the loops around it (`counts`) wraps around its ring: the steps the
    fold of the stream without rings wrote.  Those that wrap keep their ring, their steps the
    shortest way around it.  `items` itself when nothing changes."""
    out, changed = [], False
    for it in items:
        if isinstance(it, Loop):
            body = _linear(it.body, counts + (it.count,), memo)
            if body is not it.body:
                it, changed = Loop(it.count, body), True
        elif ADDR_RING in it.attrs._dict:
            key = (id(it), counts)
            y = memo.get(key)
            if y is None:
                y = memo[key] = _linear_instr(it, counts)     # (`it` stays alive in items: its id its own)
            if y is not it:
                it, changed = y, True
        out.append(it)
    return tuple(out) if changed else items


def _linear_instr(x: Instr, counts: tuple) -> Instr:
    """`_linear` of one instruction inside loops of `counts` iterations."""
    a = x.attrs._dict
    cols = [list(col) for col in zip(*a[ADDR_STEP])]        # per tile operand: a step per loop
    rings = list(a[ADDR_RING])
    spans = [c - 1 for c in counts]
    for k, (t, ring) in enumerate(zip(tile_operands(x), rings)):
        if ring is None:
            continue
        lo, hi = ring
        z = hi - lo
        steps = [s % z for s in cols[k]]
        # per loop: the step forward or back around the ring, with how far below and above the
        # first address its iterations reach that way
        ways = [((s, 0, s * n), (s - z, (s - z) * n, 0)) if s else ((0, 0, 0),) for s, n in zip(steps, spans)]
        for choice in itertools.product(*ways):
            if lo <= t.addr + sum([w[1] for w in choice]) and t.addr + sum([w[2] for w in choice]) < hi:
                cols[k], rings[k] = [w[0] for w in choice], None
                break
        else:
            cols[k] = [s if 2 * s <= z else s - z for s in steps]
    attrs = {key: v for key, v in a.items() if key != ADDR_RING}
    attrs[ADDR_STEP] = tuple(zip(*cols))
    if any(r is not None for r in rings):
        attrs[ADDR_RING] = tuple(rings)
    return Instr._make(x.op, x.pipe, x.dst, x.srcs, Attrs.of(attrs), x.loc)


def _lines(items) -> int:
    """How many instructions the text of a folded stream has."""
    loops = [x for x in items if isinstance(x, Loop)]
    return len(items) - len(loops) + sum(_lines(x.body) for x in loops)


def moved(template, first, instrs) -> tuple | None:
    """`instrs` with the loops of `template` (the folding of `first`) when it is `first` with the
    GM windows of each buffer moved by one offset (the same offset for every window of a buffer):
    then every loop holds with the same steps.  None when it is not."""
    return _Template(first, template).moved(instrs)


_KIND, _VALUE = operator.itemgetter(0), operator.itemgetter(1)     # of a moving component
_INT = frozenset((int,))


def _step_kind(c) -> int:
    """The kind of a moving component as its step attribute has it: a ring tile's (4) is a tile's (3)."""
    return 3 if c[0] == 4 else c[0]


class _Template:
    """A stream (`first`) and its folding (`items`), as other streams take its loops (`taken`):
    the isomorphic tasks (`moved`), and the streams `fold` meets whose tokens have the same ids
    and move alike (`moving`: the moving components of `first`).  A matmul's twenty-odd tasks
    are a few shapes of 12k instructions each: what they are compared with and where the text's
    instructions are in a stream are worked out once per template (when a second stream comes),
    and compared and gathered list by list."""

    def __init__(self, first, items, moving=None):
        self.first, self.items, self.moving = first, items, moving
        # the GM operands of instructions of `first` (by position) that some stream `moved` had
        # otherwise: (operand index, buffer name, strides, offset) of each
        self._gm: dict[int, list] = {}
        self._groups: tuple | bool | None = None    # (`_moving_groups` of `moving`, once compared)

    @cached_property
    def _plan(self) -> tuple | None:
        """Where the text's instructions are in the stream (`_plan`), None without loops."""
        return _plan(self.items, 0, self.first)[0] if any(isinstance(x, Loop) for x in self.items) else None

    def moved(self, instrs) -> tuple | None:
        """`moved(self.items, self.first, instrs)`.  Streams of one stream shape have the same
        ops, attributes, tiles and window shapes; what is left to compare is each window's
        buffer, strides and offset, and the ops and source lines, where an instruction is not
        the very one of `first` (the flags and on-chip ops mostly are: streams of a shape share
        them)."""
        first = self.first
        if len(first) != len(instrs):
            return None
        same = list(map(operator.is_, first, instrs))
        gm = self._gm
        delta: dict[str, int] = {}
        for pos in itertools.compress(itertools.count(), map(operator.not_, same)):
            a, b = first[pos], instrs[pos]
            # (compared as lists compare their items: the very object, or equal)
            if not (b.op is a.op or b.op == a.op) or not (b.loc is a.loc or b.loc == a.loc):
                return None
            ops = gm.get(pos)
            if ops is None:
                ops = gm[pos] = [(j, x.buf.name, x.strides, x.offset) for j, x in enumerate((a.dst, *a.srcs))
                                 if isinstance(x, GMRef)]
            for j, name, strides, offset in ops:
                if j > len(b.srcs):     # (operands compared pairwise, as far as both have them)
                    continue
                y = b.srcs[j - 1] if j else b.dst
                if not isinstance(y, GMRef) or y.buf.name != name or y.strides != strides:
                    return None
                d = delta.setdefault(name, y.offset - offset)
                if y.offset - offset != d:
                    return None
        return self.taken(instrs, same)

    def moves_alike(self, keys, offs) -> bool:
        """Whether the moving components `offs` of a stream of tokens with the ids of `first`
        (`keys`) are those of `first` (`moving`) moved by one step (`_steps`) per id and
        component, all integers of the same kinds.  What depends on `first` alone is worked out
        at its first comparison (a template is compared with the bodies of many loops), and
        only the tokens whose components are not the very ones of `first` are compared one by
        one (most are: the descriptions of an instruction object are one tuple, and streams
        share their flags and on-chip instructions): the others move by nothing."""
        mine = self._groups
        if mine is None:
            mine = self._groups = _moving_groups(keys, self.moving)
        if not mine:
            return False
        lengths, order, grouped = mine
        other = list(map(operator.is_not, offs, self.moving))
        if not any(other):
            return True
        theirs, ours = list(itertools.compress(offs, other)), list(itertools.compress(self.moving, other))
        if list(map(len, theirs)) != list(map(len, ours)):
            return False
        theirs, ours = list(itertools.chain.from_iterable(theirs)), list(itertools.chain.from_iterable(ours))
        kinds = list(map(_KIND, theirs))
        if kinds != list(map(_KIND, ours)):
            return False
        values = list(map(_VALUE, theirs))
        if not _INT.issuperset(map(type, values)):
            return False                # (steps of other numbers could round, or print otherwise: 1.0)
        try:
            shift = np.array(list(map(operator.sub, values, map(_VALUE, ours))), np.int64)
        except OverflowError:
            return False                # (then folded anew: the same loops, found again)
        if 1 in kinds:                  # (event ids move modulo their count, as `_steps` has it)
            shift[np.asarray(kinds) == 1] %= EVENTS_PER_PIPE_PAIR
        moves = np.zeros(len(order), np.int64)
        moves[np.repeat(np.asarray(other), lengths)] = shift
        moves = moves[order]
        return not (grouped & (moves[1:] != moves[:-1])).any()

    def taken(self, instrs, same: list | None = None) -> tuple:
        """`instrs`, a stream that folds as `first` does, with the loops of `items` (`same`:
        whether each instruction is the very one of `first`)."""
        plan = self._plan
        if plan is None:
            return tuple(instrs)
        return _shifted(plan, instrs, list(map(operator.is_, self.first, instrs)) if same is None else same)


def _moving_groups(keys, moving) -> tuple | bool:
    """What `_Template.moves_alike` compares other streams' components with: the number of
    moving components of each token, and the components in order of (id of their token, index
    in it), stably, with whether each is of the group of the one before; False when some value
    is not an int."""
    comps = list(itertools.chain.from_iterable(moving))
    if not _INT.issuperset(map(type, map(_VALUE, comps))):
        return False
    # the (id, component) of each component, as one number
    n = np.asarray(list(map(len, moving)), np.int64)
    slot = np.arange(len(comps), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    which = np.repeat(np.asarray(keys, np.int64), n) * (int(n.max(initial=0)) + 1) + slot
    order = np.argsort(which, kind="stable")
    which = which[order]
    return n, order, which[1:] == which[:-1]


def _plan(items, pos, first):
    """(plan, position after them) of items whose first instruction is at `pos` of the stream
    `first` they fold.  The plan of a sequence: the position in the stream of each item's
    instruction at the first iteration (of a loop: of its first one), (index, position, the
    item, the instruction of `first` it was made of, `_exact` of that one's attributes once
    needed) of the instructions with steps (`MOVING_STEPS`) and (index, count, plan of the
    body) of the loops."""
    where, stepped, loops = [], [], []
    for k, it in enumerate(items):
        where.append(pos)
        if isinstance(it, Loop):
            body, _ = _plan(it.body, pos, first)
            loops.append((k, it.count, body))
            pos += it.n_instrs
            continue
        if not STEP_KEYS.isdisjoint(it.attrs._dict):
            stepped.append([k, pos, it, first[pos], ...])
        pos += 1
    return (where, stepped, loops), pos


def _shifted(plan, instrs, same) -> tuple:
    """The items of a plan with each instruction taken from `instrs` at its position of the
    first iteration, given the steps its template instruction has.  The template's instruction
    itself when the stream's is the one it was made of (`same`), or has the very operands and
    exactly its attributes (the extracts of isomorphic tasks); its attributes when the stream's
    are exactly those (the GM instructions)."""
    where, stepped, loops = plan
    out = [instrs[pos] for pos in where]
    for entry in stepped:
        k, pos, it, was, exact = entry
        if same[pos]:
            out[k] = it
            continue
        x = out[k]
        a = x.attrs._dict
        if exact is ...:
            exact = entry[4] = _exact(was.attrs._dict)
        if a is was.attrs._dict or exact is not None and _exact(a) == exact:
            if (x.dst is was.dst and x.loc is was.loc and x.op == was.op and x.pipe == was.pipe
                    and len(x.srcs) == len(was.srcs) and all(map(operator.is_, x.srcs, was.srcs))):
                out[k] = it
            else:
                out[k] = Instr._make(x.op, x.pipe, x.dst, x.srcs, it.attrs, x.loc)
        else:
            steps = it.attrs._dict
            out[k] = _with_attrs(x, {s: steps[s] for s in _LOOP_ATTRS if s in steps})
    for k, count, body in loops:
        out[k] = Loop(count, _shifted(body, instrs, same))
    return tuple(out)


def _exact(attrs: dict) -> bytes | None:
    """Attributes as bytes: equal for the same items in the same order with values of the same
    types (equal values of other types print otherwise: 0 and 0.0, 1 and True); None for values
    marshal does not write."""
    try:
        return marshal.dumps(attrs, 2)   # (version 2: no references, whose marks depend on reference counts)
    except ValueError:
        return None


def _with_attrs(x: Instr, attrs: dict) -> Instr:
    """The instruction with these attributes added (or replaced)."""
    return Instr._make(x.op, x.pipe, x.dst, x.srcs, Attrs.of({**x.attrs._dict, **attrs}), x.loc)


def replay(template, instrs) -> tuple | None:
    """`instrs` (a stream isomorphic to the one `template` folds: the same instructions but for
    their GM windows) with the loops of `template`; its steps taken from `instrs` and checked at
    every iteration.  None when they do not hold (then the stream is folded on its own)."""
    if template is None or not any(isinstance(x, Loop) for x in template):
        return tuple(instrs) if template is not None and len(template) == len(instrs) else None
    try:
        items, end = _rebuild(template, instrs, 0, ())
    except _Mismatch:
        return None
    return tuple(items) if end == len(instrs) else None


class _Mismatch(Exception):
    pass


def _rebuild(items, instrs, pos, loops):
    out = []
    for it in items:
        if isinstance(it, Loop):
            size = n_instrs(it.body)
            body, _ = _rebuild(it.body, instrs, pos, loops + ((it.count, size),))
            out.append(Loop(it.count, tuple(body)))
            pos += it.count * size
            continue
        if pos >= len(instrs) or instrs[pos].op != it.op:
            raise _Mismatch
        x = instrs[pos]
        comps = _tile_offsets(x)    # (tiles too: a template of either stage; steps of 0 not written)
        if loops:                   # every iteration: the same instruction, its windows moved
            same = _tile_key(x)
            per_loop = [tuple(_steps((comps,), (_tile_offsets(instrs[pos + size]),))) for _, size in loops]
            for idx in itertools.product(*(range(c) for c, _ in loops)):
                q = pos + sum(i * size for i, (_, size) in zip(idx, loops))
                if q != pos and _tile_key(instrs[q]) != same:
                    raise _Mismatch
                got = _tile_offsets(instrs[q])
                for k, (kind, base) in enumerate(comps):
                    want = base + sum(i * st[k] for i, st in zip(idx, per_loop))
                    if (got[k][1] - want) % EVENTS_PER_PIPE_PAIR if kind == 1 else got[k][1] != want:
                        raise _Mismatch
            attrs = _step_attrs(comps, per_loop) if comps else None
            if attrs:
                x = _with_attrs(x, attrs)
        out.append(x)
        pos += 1
    return out, pos


def _step_attrs(comps, per_loop) -> dict:
    """The step attributes of an instruction with moving components `comps` (`_tile_offsets`)
    whose components move by `per_loop` (per loop around it, outermost first: one step per
    component): a GM window and an event id one step per loop, extract offsets and tile
    addresses one tuple per loop; tile addresses only where one moves."""
    out, k = {}, 0
    for kind, group in itertools.groupby(comps, key=_KIND):
        n = len(list(group))
        steps = tuple(st[k:k + n] if kind >= 2 else st[k] for st in per_loop)
        k += n
        if kind != 3 or any(map(any, steps)):
            out[MOVING_STEPS[kind]] = steps
    return out


def fold(instrs, known: _Tokens | None = None) -> tuple:
    """A task's instructions (no loops) as instructions and loops that run exactly them.
    `known`: what the pass's other folds learnt of the instructions (a fold of its own without)."""
    return _folding(instrs, _Tokens() if known is None else known).items


def _folding(instrs, known: _Tokens) -> _Template:
    """`fold`, as the template of the streams that take its loops.

    What the passes decide depends on the ids of the tokens and the steps between the moving
    components of tokens of one id only: a stream with the ids of one folded before, whose
    components are that one's moved by one offset per id (and component), folds as it did (the
    bodies of a matmul's output tiles, a task of another shape but the same instructions)."""
    keys, offs = known.describe_all(instrs)
    alike = known.folded.get(tuple(keys), ())
    for like in alike:
        if like.moves_alike(keys, offs):
            return _Template(instrs, like.taken(instrs), offs)
    first = keys, offs
    tokens = list(instrs)
    for depth in range(MAX_DEPTH):
        if depth:
            keys, offs = known.describe_all(tokens)
        folded = _fold_pass(tokens, keys, offs, known)
        if folded is None:
            break
        tokens = folded
    template = _Template(instrs, tuple(tokens) if len(tokens) != len(instrs) else tuple(instrs), first[1])
    if len(alike) < TEMPLATES_PER_IDS:
        known.folded[tuple(first[0])] = (*alike, template)
    return template


# ---------------------------------------------------------------------------------------

class _Tokens:
    """The ids and moving components of the tokens the folds of a pass meet (`describe`),
    worked out once per token: a task's instructions are folded again in the loop bodies (inner
    loops).  Only whether two ids are equal matters, so one table serves every fold."""

    def __init__(self, tiles: bool = False, base: "_Tokens | None" = None, rings: dict | None = None):
        # `tiles`: the on-chip tiles' addresses move too (ids without them, `_tile_offsets`);
        # `base`: the first stage's, which described the instructions already: an id of its
        # (an instruction's key, tiles included) gives one of these and the tiles' addresses;
        # `rings`: the rings of slots the tiles move around (`_rings`), whose addresses are
        # components of their own kind, compared modulo their ring
        self.tiles, self.base, self.of_base = tiles, base, {}
        self.key, self.offsets = (_tile_key, _tile_offsets) if tiles else (_key, _offsets)
        if rings:                   # (a ring tile's ring is part of its id: copies on two rings differ)
            self.key, self.offsets = (lambda x: _ring_key(x, rings)), (lambda x: _ring_offsets(x, rings))
        self.ids: dict = {}         # key of a token -> its id
        self.memo: dict = {}        # id(token) -> (its id, its moving components, the token)
        self.alike: dict = {}       # an instruction's op, pipe, identity of its operands and
                                    # source line, attributes -> (id, moving, instruction)
        self.stepped: dict = {}     # (id, step attribute, step) -> id of the instruction with it
        self.given: dict = {}       # (id(instruction), depth, steps) -> `with_step` of it
        self.folded: dict = {}      # the ids of a stream folded -> the `_Template`s of its folds
        self.example: dict = {}     # id -> an instruction of it

    def examples(self, instrs) -> list:
        """One instruction of each id among `instrs` (of the first stage: their tiles as theirs)."""
        ids, _ = self.describe_all(instrs)
        return list(map(self.example.__getitem__, set(ids)))

    def describe(self, x) -> tuple:
        """(id, moving components `_offsets`, x) of an instruction or loop: equal ids for
        tokens that differ only in what moves (GM offsets, event ids, extract offsets)."""
        return self.memo.get(id(x)) or self._new(x)

    def describe_all(self, tokens) -> tuple[list, list]:
        """The ids and the moving components of the tokens (`describe`)."""
        if self.base is not None:       # (the second stage: mostly the first's descriptions)
            return self._from_base(tokens)
        memo, new = self.memo, self._new
        described = [memo.get(id(x)) or new(x) for x in tokens]
        return [d[0] for d in described], [d[1] for d in described]

    def _from_base(self, tokens) -> tuple[list, list]:
        """`describe_all` of the second stage: a token the first stage described has the id of
        that one's (its key, tiles included) without the tiles' addresses, and its moving
        components with theirs (`_new`, written out: a task's twelve thousand instructions)."""
        memo, base, of_base = self.memo, self.base.memo, self.of_base
        ids, moving = [], []
        for x in tokens:
            d = memo.get(id(x))
            if d is None:
                b = base.get(id(x))
                if b is None or isinstance(x, Loop):
                    d = self._new(x)
                else:
                    got = of_base.get(b[0]) or self._of_base(x, b[0])
                    d = memo[id(x)] = (got[0], b[1] + got[1] if got[1] else b[1], x)
            ids.append(d[0])
            moving.append(d[1])
        return ids, moving

    def _of_base(self, x: Instr, i: int) -> tuple:
        """(id, the tiles' moving components) of the instructions of the first stage's id i."""
        got = self.of_base[i] = (self._id(self.key(x)), self.offsets(x)[len(self.base.memo[id(x)][1]):])
        return got

    def with_step(self, x: Instr, steps, depth: int = 0) -> Instr:
        """`x` with the step of a new (outer) loop put before its steps: one per moving
        component, taken from the iterator `steps` (x itself without any), described.  Its key
        is that of x with the step attributes (`MOVING_STEPS`) set, so instructions of one id
        given one step have one id (the loop bodies of a task: thousands of instructions, a few
        ids and steps).  `depth`: the loops around x inside the new loop's body (an `addr_step`
        is written only where some tile moves: x has none when its tiles stayed in those)."""
        i, moving, _ = self.memo.get(id(x)) or self._new(x)
        if not moving:
            return x
        # the bodies of a task's loops are mostly the same instruction objects given the same
        # steps (a matmul's K chunks, the copies of its output tiles): one result per instruction,
        # depth and steps, shared (equal instructions may stand at several positions)
        mine = tuple(itertools.islice(steps, len(moving)))
        key = (id(x), depth, mine)
        y = self.given.get(key)
        if y is None:
            y = self._with_step(x, i, moving, iter(mine), depth)
            if _INT.issuperset(map(type, mine)):    # (1, 1.0 and True are one key but print otherwise)
                self.given[key] = y
        return y

    def _with_step(self, x: Instr, i: int, moving: tuple, steps, depth: int) -> Instr:
        """`with_step` of an instruction of id i and moving components `moving`."""
        a = x.attrs._dict
        new = {}
        for kind, comps in itertools.groupby(moving, key=_step_kind):
            key = MOVING_STEPS[kind]
            comps = list(comps)
            n = len(comps)
            mine = tuple(itertools.islice(steps, n)) if kind >= 2 else next(steps)
            if kind == 3 and key not in a:
                if not any(mine):
                    continue
                new[key] = (mine,) + ((0,) * n,) * depth
            else:
                new[key] = (mine,) + a.get(key, ())
            if kind == 3 and any(c[0] == 4 for c in comps):     # (tiles on rings: see `_linear`)
                new[ADDR_RING] = tuple((c[3], c[3] + c[2]) if c[0] == 4 else None for c in comps)
        if not new:
            return x
        y = _with_attrs(x, new)
        stepped = (i, tuple(new.items()))
        j = self.stepped.get(stepped)
        if j is None:
            self.stepped[stepped] = self._new(y)[0]
        else:
            self.memo[id(y)] = (j, moving, y)
        return y

    def _new(self, x) -> tuple:
        """`describe` of a token not described yet.

        A task's instructions are thousands of objects but a few dozen of kinds: its flags
        differ in their event ids, its extracts in their offsets, but for those they are the
        very same tiles, source lines and attribute values.  An instruction with the same op,
        operand objects, source line and attributes (`_exact`: event ids and extract offsets of
        the same types too) as one met before has its id and moving components; that look-up
        is cheaper than its key."""
        if isinstance(x, Loop):
            ids, moving = self.describe_all(x.body)
            i = self._id(("loop", x.count, tuple(ids)))
            moving = tuple(itertools.chain.from_iterable(moving))
        elif self.base is not None and id(x) in self.base.memo:
            i, moving, _ = self.base.memo[id(x)]
            got = self.of_base.get(i) or self._of_base(x, i)
            i, moving = got[0], moving + got[1] if got[1] else moving
        else:
            a = x.attrs._dict
            exact = _exact(a)
            like = got = None
            if exact is not None:
                like = (x.op, x.pipe, id(x.dst), id(x.loc), exact, tuple(map(id, x.srcs)) if x.srcs else ())
                got = self.alike.get(like)
                if got is not None and a != got[2].attrs._dict:
                    like = got = None       # (a nan: not equal to another, as the keys compare)
            if got is None:
                got = (self._id(self.key(x)), self.offsets(x), x)   # (x kept: its operands' ids stay theirs)
                self.example.setdefault(got[0], x)
                if like is not None:
                    self.alike[like] = got
            i, moving = got[0], got[1]
        d = self.memo[id(x)] = (i, moving, x)       # (x kept: the ids of id() stay unique)
        return d

    def _id(self, key) -> int:
        i = self.ids.get(key)
        if i is None:
            i = self.ids[key] = len(self.ids)
        return i


def _operand_key(o):
    if isinstance(o, GMRef):
        return ("GM", o.buf.name, o.shape, o.strides)
    return o


def _srcs_key(srcs: tuple) -> tuple:
    return tuple(_operand_key(o) for o in srcs)


def _attrs_key(attrs: Attrs):
    """The attributes but those that move from copy to copy (`_MOVING`)."""
    a = attrs._dict
    if _MOVING.isdisjoint(a):
        return attrs
    return tuple(item for item in a.items() if item[0] not in _MOVING)


def _key(x: Instr) -> tuple:
    """An instruction with what moves from copy to copy (GM offsets, event ids, offsets) left out."""
    return (x.op, x.pipe, _operand_key(x.dst), _srcs_key(x.srcs), _attrs_key(x.attrs), x.loc)


def _offsets(x: Instr) -> tuple[tuple[int, int], ...]:
    """What moves from copy to copy in an instruction, in text order: (1, event id) of a flag,
    (2, offset) of each extract offset, else (0, GM offset) of an instruction with a GM operand.
    A loop's: those of its instructions at their first iteration (`_Tokens.describe`)."""
    a = x.attrs._dict
    if "event" in a:
        return ((1, a["event"]),)
    if "offsets" in a and x.op == "TEXTRACT":
        return tuple((2, o) for o in a["offsets"])
    gm = x.dst if isinstance(x.dst, GMRef) else next((o for o in x.srcs if isinstance(o, GMRef)), None)
    return () if gm is None else ((0, gm.offset),)


def _tile_key(x: Instr) -> tuple:
    """`_key` with the on-chip tiles' addresses left out too."""
    return (x.op, x.pipe, _tile_operand_key(x.dst), tuple(map(_tile_operand_key, x.srcs)),
            _attrs_key(x.attrs), x.loc)


def _ring_offsets(x: Instr, rings: dict) -> tuple:
    """`_tile_offsets` with the tiles on a ring of `rings` as (4, address, ring size, ring start)."""
    tiles = []
    for o in tile_operands(x):
        r = rings.get((o.space, o.dtype, o.shape, o.valid, o.addr))
        tiles.append((3, o.addr) if r is None else (4, o.addr, r[1] - r[0], r[0]))
    return _offsets(x) + tuple(tiles) if tiles else _offsets(x)


def _ring_key(x: Instr, rings: dict) -> tuple:
    """`_tile_key` with the ring of each tile on one (`_rings`)."""
    def key(o):
        if isinstance(o, TileRef):
            return ("tile", o.space, o.dtype, o.shape, o.valid, rings.get((o.space, o.dtype, o.shape, o.valid, o.addr)))
        return _operand_key(o)
    return (x.op, x.pipe, key(x.dst), tuple(map(key, x.srcs)), _attrs_key(x.attrs), x.loc)


def _tile_operand_key(o):
    if isinstance(o, TileRef):
        return ("tile", o.space, o.dtype, o.shape, o.valid)
    return _operand_key(o)


def _tile_offsets(x: Instr) -> tuple[tuple[int, int], ...]:
    """`_offsets`, then (3, address) of each on-chip tile the instruction names, dst first."""
    tiles = tuple((3, o.addr) for o in tile_operands(x))
    return _offsets(x) + tiles if tiles else _offsets(x)


_LOOP_ATTRS = MOVING_STEPS + (ADDR_RING,)      # what a template's instruction hands the stream taking it
_MOVING = {"event", "offsets"}      # attributes that may move from copy to copy (with the GM windows)


def _steps(xs, ys) -> list:
    """The steps from the moving components of the tokens `xs` to those of the tokens `ys`,
    component by component (`zip`s: as far as both have them): GM elements, event ids modulo
    their count, extract offsets, tile addresses."""
    # (one comprehension, not a call per component: a matmul's output tiles are copies of a
    # thousand tokens, compared copy by copy)
    return [(b[1] - a[1]) % EVENTS_PER_PIPE_PAIR if a[0] == 1 else (b[1] - a[1]) % a[2] if a[0] == 4
            else b[1] - a[1] for x, y in zip(xs, ys) for a, b in zip(x, y)]


def _fold_pass(tokens, keys, offs, known: _Tokens):
    """One pass over the tokens: runs of copies folded into loops, or None when nothing repeats.

    For each candidate period p (every small one, and the structural periods of the outer
    repetitions) numpy finds, at every position, how many copies of the next p tokens follow by
    their ids alone; walking left to right, the period saving most tokens at a position is taken
    when its copies also move their GM windows, event ids and offsets by constant steps."""
    n = len(keys)
    k = np.asarray(keys, np.int64)
    if k.max(initial=0) < 1 << 15:     # (ids are few: compared in less memory, sorted by radix)
        k = k.astype(np.int16)
    periods = _candidate_periods(k, known.tiles)
    best_saved, best_p = _best_periods(k, periods)
    if not (best_saved >= 3).any():
        return None
    out, i, changed, work = [], 0, False, 0
    saved_at, p_at = best_saved.tolist(), best_p.tolist()
    while i < n:
        if saved_at[i] >= 3:
            # the best period by ids; when its copies do not move by constant steps, the others
            r, steps, p = *_copies(i, p_at[i], n, keys, offs), p_at[i]
            work += p
            # (the second stage also when the copies fall short of what the ids promised: a
            # matmul's output tiles alike by their ids, alike with their steps every second one)
            short = r < 2 or p * (r - 1) < 3 or known.tiles and p * (r - 1) < saved_at[i]
            if short and work < WORK_PER_TOKEN * n:
                tries = [(q, *_copies(i, q, n, keys, offs)) for q in periods
                         if q != p_at[i] and i + 2 * q <= n and keys[i + q] == keys[i]]
                work += sum(q for q, _, st in tries if st is not None)
                if r >= 2:
                    tries.append((p, r, steps))
                p, r, steps = max(tries, key=lambda x: (x[0] * (x[1] - 1), -x[0]), default=(p, 1, None))
            if r >= 2 and p * (r - 1) >= 3:
                out.append(Loop(r, _nested(tokens[i:i + p], steps, offs[i:i + p], known)))
                changed = True
                i += p * r
                continue
        out.append(tokens[i])
        i += 1
    return out if changed else None


def _best_periods(k: np.ndarray, periods: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """At each position, the most tokens a period saves by the ids `k` alone (p * (copies - 1)
    of the copies of the next p tokens that follow one another), and that period: the first of
    `periods` saving that many, 0 where none saves any."""
    n = len(k)
    if periods and n * len(periods) <= ALL_PERIODS_AT_ONCE:
        # a short stream: every period at once (numpy's cost per call is most of what it costs)
        p = np.asarray(periods, np.int64)[:, None]
        # (the ids of the tokens, then of as many past the end, each unlike any other)
        ahead = np.concatenate((k.astype(np.int64), -1 - np.arange(p.max(), dtype=np.int64)))
        same = sliding_window_view(ahead, n)[p[:, 0]] == k      # token i == token i + p
        at = np.arange(n)
        # how far that holds from each i on: to the next i where it does not
        run = np.minimum.accumulate(np.where(same, n, at)[:, ::-1], axis=1)[:, ::-1] - at
        saved = run - run % p                   # p * (copies - 1): run // p + 1 copies from i
        first = saved.argmax(axis=0)            # (the first period of the most saved)
        best_saved = saved[first, at]
        return best_saved, np.where(best_saved > 0, p[first, 0], 0)
    best_saved = np.zeros(n, np.int64)
    best_p = np.zeros(n, np.int64)
    for p in periods:
        same = k[:-p] == k[p:]                  # token i == token i + p (at a few i, mostly)
        if np.count_nonzero(same) < p:          # not p of them in a row: no second copy anywhere
            continue
        at, run = _long_runs(same, p)           # where that holds p times in a row, how far
        saved = run - run % p
        better = saved > best_saved[at]
        at = at[better]
        best_saved[at] = saved[better]
        best_p[at] = p
    return best_saved, best_p


def _long_runs(same: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    """The positions i from which `same` holds at least p times in a row (the others save
    nothing at period p), and how many times from each (the distance past the end of its run)."""
    edges = np.flatnonzero(np.diff(same, prepend=False, append=False))    # where runs start and end
    start, end = edges[::2], edges[1::2]
    count = end - start - (p - 1)               # the positions of each run with p of it ahead
    long = count > 0
    start, end, count = start[long], end[long], count[long]
    last = np.cumsum(count)
    at = np.arange(last[-1] if len(last) else 0) + np.repeat(start + count - last, count)
    return at, np.repeat(end, count) - at


def _candidate_periods(k: np.ndarray, doubled: bool = False) -> list[int]:
    """Every period up to SMALL_PERIOD, and the likely periods of the outer repetitions (`k`:
    the ids of the tokens; `doubled`: with twice each of those)."""
    n = len(k)
    # a period p repeats every token of the body p later: p is a gap between occurrences of the
    # tokens found once per copy (the gaps between consecutive occurrences, and twice them)
    order = np.argsort(k, kind="stable")           # the occurrences of each id, in order
    ks = k[order]
    again = ks[1:] == ks[:-1]                      # sorted position j and j + 1: one id
    gaps = (order[1:] - order[:-1])[again]
    small = np.unique(gaps[gaps <= SMALL_PERIOD])
    small = set(small.tolist()) | set((2 * small).tolist())
    group = np.concatenate(([0], np.cumsum(~again)))
    occurrences = np.bincount(group)[group[1:][again]]  # of the id of each gap
    return list(dict.fromkeys(sorted(p for p in small if p <= n // 2)
                              + [p for p in _structural_periods(gaps, occurrences, n, doubled) if p <= n // 2]))


def _structural_periods(gaps: np.ndarray, occurrences: np.ndarray, n: int, doubled: bool = False,
                        most: int = 16) -> list[int]:
    """Likely periods of the outer repetitions: the commonest gaps between consecutive
    occurrences of the rarer tokens (a store per output tile, a load per chunk), with twice
    them (ping-pong buffers repeat every second tile).  `gaps`: between consecutive occurrences
    of each token, `occurrences`: how many that token has."""
    values, counts = np.unique(gaps[occurrences <= max(2, n // 16)], return_counts=True)
    seen = dict(zip(values.tolist(), counts.tolist()))
    for g in values.tolist():
        seen.setdefault(2 * g, 0)
    top = sorted(seen, key=lambda g: (-seen[g], g))[:most]
    # (the second stage: tiles alike every second repetition, a serpentine K's forward and
    # backward output tiles, whose gaps differ by one or two instructions, so twice the commonest)
    return list(dict.fromkeys(top + [2 * g for g in top])) if doubled else top


def _copies(i, p, n, keys, offs):
    """How many copies of tokens[i:i+p] follow one another from i (each moving every GM offset,
    event id and extract offset by the same step as the second copy moved it), and those steps
    (one per moving component of the body, in text order)."""
    body = keys[i:i + p]
    if keys[i + p:i + 2 * p] != body:
        return 1, None
    steps = _steps(offs[i:i + p], offs[i + p:i + 2 * p])
    r = 2
    while i + (r + 1) * p <= n and keys[i + r * p:i + (r + 1) * p] == body:
        lo = i + r * p
        if _steps(offs[lo - p:lo], offs[lo:lo + p]) != steps:
            break
        r += 1
    return r, steps


def _nested(body, steps, offs, known: _Tokens):
    """The body of a new loop: its own repetitions folded first (inner loops; the greedy pass
    takes the longest saving, the outer loop, first), when the new loop's step of every
    instruction is the same at each of its inner iterations; else the body as it is."""
    if len(body) >= MIN_BODY and all(isinstance(x, Instr) for x in body):
        inner = fold(body, known)
        if any(isinstance(x, Loop) for x in inner):
            per_token, k = [], 0
            for o in offs:
                per_token.append(tuple(steps[k:k + len(o)]))
                k += len(o)
            # the outer step of each instruction of the text, by its position in the text (one
            # object may stand at several positions: equal instructions may be shared)
            at = _dynamic_positions(inner)
            outer: list = [None] * (max(at) + 1)
            for k, st in zip(at, per_token):
                if outer[k] is None:
                    outer[k] = st
                elif outer[k] != st:
                    break
            else:
                return _with_steps(inner, [x for st in outer for x in st], known)
    return _with_steps(body, steps, known)


def _dynamic_positions(items) -> list[int]:
    """For each instruction the items run, in order: the position in the text (`static_instrs`
    order) of the instruction it comes from."""
    out: list[int] = []
    _positions(items, 0, out)
    return out


def _positions(items, first: int, out: list) -> int:
    """Append the text positions of what `items` run (their text starting at position `first`);
    return the position after their text."""
    k = first
    for it in items:
        if isinstance(it, Loop):
            start = len(out)
            after = _positions(it.body, k, out)
            out.extend(out[start:] * (it.count - 1))
            k = after
        else:
            out.append(k)
            k += 1
    return k


def _with_steps(body, steps, known: _Tokens):
    """The body with each moving instruction's step of the new (outer) loop put before its steps."""
    return _stepped(body, 0, iter(steps), known)


def _stepped(items, depth: int, steps, known: _Tokens) -> tuple:
    """`_with_steps` of items inside `depth` loops of the new loop's body (`steps`: an iterator)."""
    # (a function of the module, not a closure calling itself: that would be a reference cycle
    # keeping the pass's descriptions alive until the collector runs, which compiles pause)
    step = known.with_step
    return tuple([Loop(x.count, _stepped(x.body, depth + 1, steps, known)) if isinstance(x, Loop)
                  else step(x, steps, depth) for x in items])
