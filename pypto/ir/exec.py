"""Level 4, the Execution Graph: task launches with dependencies, each an instruction stream.

Every instruction is bound to a pipe of its core; instructions on one pipe run in order, and
across pipes order exists only through SET_FLAG / WAIT_FLAG pairs (inserted by the sync pass).
Operands are resolved: on-chip tiles are byte ranges of a space, GM operands are windows.
"""
from __future__ import annotations

import bisect
import itertools
import operator
from dataclasses import dataclass, field, replace as _replace
from typing import NamedTuple

from ..dtypes import DType
from ..errors import SourceLoc, VerificationError
from ..target.isa import ATTRS, INSTRUCTIONS, SYNC_OPS, pipe_of  # noqa: F401 - SYNC_OPS, pipe_of: re-exported
from .core import Attrs, TextForm, cached, fmt_shape, pair_problem, prod, quick_init
from .gm import GMBuffer, GMRef
from .tile import tile_bytes, tile_strides

AIC_PIPES = ("MTE2", "MTE1", "M", "FIX", "S")
AIV_PIPES = ("MTE2", "V", "MTE3", "S")
# Cross-core flags of a 1 AIC : 2 AIV pair: a pipe of the cube task sets a flag of its AIV `slot`
# (CROSS_SET_FLAG FIX -> AIV1, EVENT_ID0), a pipe of the paired vector task waits for it
# (CROSS_WAIT_FLAG AIC -> MTE2, EVENT_ID0).  They count: every set is consumed by one wait.
CROSS_OPS = tuple(r.name for r in INSTRUCTIONS.values() if r.kind == "cross")
EVENTS_PER_PIPE_PAIR = 8
# SYNC_OPS (the flags and barriers) and pipe_of (the pipe an instruction runs on) are the
# instruction table's (pypto.target.isa), importable from here for the exec level's readers.


@quick_init
@dataclass(frozen=True)
class TileRef:
    space: str
    addr: int
    dtype: DType
    shape: tuple[int, ...]
    valid: tuple[int, ...]

    @cached
    def nbytes(self) -> int:
        return tile_bytes(self.shape, self.dtype)

    @cached
    def extent(self) -> tuple[int, int]:
        """The bytes [lo, hi) from its first valid element to its last (of a window of a larger
        tile, TEXTRACT's source, which has that tile's row pitch: less than `nbytes` from `addr`)."""
        if 0 in self.valid:
            return self.addr, self.addr
        return self.addr, self.addr + self.dtype.itemsize + sum(
            (v - 1) * s for v, s in zip(self.valid, tile_strides(self.shape, self.dtype)))

    def __hash__(self):             # hashed often (keys of decoders, passes): computed once
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.space, self.addr, self.dtype, self.shape, self.valid))
        return h

    @cached
    def _accesses(self) -> tuple["Access", "Access"]:
        """(its read, its write) as `accesses` gives them (worked out once per tile operand)."""
        hi = self.addr + self.nbytes
        return Access(self.space, self.addr, hi, False), Access(self.space, self.addr, hi, True)

    def text(self) -> str:
        v = "" if self.valid == self.shape else f"{{{','.join(map(str, self.valid))}}}"
        return f"{self.space}[{self.addr:#x}]:{self.dtype}{fmt_shape(self.shape)}{v}"


@quick_init
@dataclass(frozen=True, slots=True)     # slots: a program holds one per instruction
class Instr:
    op: str
    pipe: str
    dst: TileRef | GMRef | None = None
    srcs: tuple = ()
    attrs: Attrs = field(default_factory=Attrs)
    loc: SourceLoc | None = None

    def text(self) -> str:
        a = self.attrs
        if self.op in ("SET_FLAG", "WAIT_FLAG"):
            body = f"{a['src']} -> {a['dst']}, EVENT_ID{a['event']}" + _steps_text(a)
        elif self.op == "CROSS_SET_FLAG":
            body = f"{a['src']} -> AIV{a['slot']}, EVENT_ID{a['event']}" + _steps_text(a)
        elif self.op == "CROSS_WAIT_FLAG":
            body = f"AIC -> {a['dst']}, EVENT_ID{a['event']}" + _steps_text(a)
        elif self.op == "PIPE_BARRIER":
            body = a.get("pipes", "ALL")
        else:
            ops = [_operand(self.dst)] if self.dst is not None else []
            ops += [_operand(s) for s in self.srcs]
            extra = [f"{k}={_attr_text(k, a[k])}" for k in TEXT_ATTRS if k in a]
            body = ", ".join(ops + extra)
        loc = f"  ; {self.loc.short()}" if self.loc else ""
        return f"{self.op:<18} {body}{loc}"


# An instruction inside loops names its GM window at iteration 0 of every loop around it; its
# `gm_step` attribute says by how many elements the window's offset moves per iteration of each
# of them (outermost first): at iterations (i0, i1, ..) the offset is offset + i0*s0 + i1*s1 + ...
GM_STEP = "gm_step"
# A flag inside loops names its event id at iteration 0; `event_step` says by how much the id
# moves per iteration of each loop around it, modulo the EVENTS_PER_PIPE_PAIR ids of its pipe pair
# (the sync pass hands the ids of a pipe pair out in turn, so they rotate from tile to tile).
EVENT_STEP = "event_step"
# A TEXTRACT inside loops names its offsets into the L1 tile at iteration 0; `offsets_step` says
# by how much they move per iteration of each loop around it (a matmul's kL0 steps along K).
OFFSETS_STEP = "offsets_step"
# An instruction inside loops names its on-chip tiles at iteration 0; `addr_step` says by how many
# bytes each tile's address moves per iteration of each loop around it: one tuple per loop
# (outermost first) with one step per tile operand, in operand order (dst first).  A ring of
# buffers walked in turn moves by one slot per iteration (a matmul's A panel, one L1 copy per K
# chunk, kept for the next output tile), around the ring where an iteration wraps (`addr_ring`).
ADDR_STEP = "addr_step"
# A tile whose buffer is one of a ring of equal slots walked in turn (a matmul's A panel, one L1
# slot per K chunk; double-buffered loads) moves modulo the ring: `addr_ring` names, per tile
# operand (dst first), the byte range [lo, hi) of its ring, or None (written `-`) for a tile that
# moves by its steps alone.  At loop indices (i0, i1, ..) a ring tile's address is
# lo + (addr + i0*s0 + i1*s1 + ... - lo) mod (hi - lo): one K chunk is a loop body, whatever slot it
# starts in.  Written only where some iteration wraps around the ring (`addr_ring=(-,0x0:0x40000)`).
ADDR_RING = "addr_ring"
TEXT_ATTRS = ATTRS + (GM_STEP, OFFSETS_STEP, ADDR_STEP, ADDR_RING)


@dataclass(frozen=True)
class Loop:
    """`count` iterations of `body`: instructions and inner loops, the same every iteration but
    for their GM windows, which move by their `gm_step` (affine in the loop indices).  Printed
    as `.loop N` ... `.endloop`; `unrolled` gives the instructions it runs, in order."""
    count: int
    body: tuple

    @cached
    def n_instrs(self) -> int:
        """How many instructions its iterations run (inner loops unrolled)."""
        return self.count * n_instrs(self.body)


_JUST_INSTRS = frozenset((Instr,))     # the item types of a stream without loops


def n_instrs(items) -> int:
    """The number of instructions a sequence of instructions and loops runs."""
    if not isinstance(items, (tuple, list)):
        items = tuple(items)
    # (C-level maps, not a loop over the items: a task's stream is up to a hundred thousand
    # instructions, and every exec pass counts it)
    if set(map(type, items)) <= _JUST_INSTRS:
        return len(items)
    plain = list(map(isinstance, items, itertools.repeat(Instr)))
    n = plain.count(True)
    if n < len(plain):
        n += sum(i.n_instrs for i in itertools.compress(items, map(operator.not_, plain)))
    return n


def has_loops(items) -> bool:
    return any(map(isinstance, items, itertools.repeat(Loop)))     # (C-level, as in n_instrs)


def unrolled(items, _at: tuple = ()):
    """The instructions a sequence of instructions and loops runs, in order (`at_iteration`)."""
    # Each loop is unrolled as a whole (`_Unroll`): every instruction of its body is moved to all
    # its iterations at once, from its steps read once, and instructions alike share that work,
    # rather than one `at_iteration` per instruction run (a 4096^3 matmul runs 290k of them from
    # 52k in its text)
    outer = [range(i, i + 1) for i in _at]      # the loops around `items`: at fixed indices
    unroll = _Unroll()
    for it in items:
        if isinstance(it, Loop):
            if it.count > 0:
                for run in unroll.runs(it.body, outer + [range(it.count)]):
                    yield from run
        else:
            yield at_iteration(it, _at) if _at else it


MOVING_STEPS = (GM_STEP, EVENT_STEP, OFFSETS_STEP, ADDR_STEP)
# (for `STEP_KEYS.isdisjoint(attrs)`: an instruction without steps, nor a ring its steps move around)
STEP_KEYS = frozenset(MOVING_STEPS + (ADDR_RING,))


def at_iteration(ins: "Instr", at: tuple) -> "Instr":
    """An instruction of a loop body at loop indices `at` (outermost first): its GM window, event
    id, extract offsets and tile addresses moved by their steps, the step attributes gone (the
    instruction itself when nothing of it moves)."""
    a = ins.attrs
    keys = [k for k in MOVING_STEPS if k in a]
    if not keys:
        return ins
    attrs = {k: v for k, v in a.items() if k not in keys and k != ADDR_RING}
    dst, srcs = ins.dst, ins.srcs
    for key in keys:
        steps = a[key]
        if key == GM_STEP:
            delta = sum(i * s for i, s in zip(at, steps))

            def move(o):
                return GMRef(o.buf, o.offset + delta, o.shape, o.strides) if isinstance(o, GMRef) else o
            dst, srcs = move(dst), tuple(move(o) for o in srcs)
        elif key == EVENT_STEP:
            attrs["event"] = (a["event"] + sum(i * s for i, s in zip(at, steps))) % EVENTS_PER_PIPE_PAIR
        elif key == OFFSETS_STEP:
            attrs["offsets"] = tuple(o + sum(i * s[d] for i, s in zip(at, steps)) for d, o in enumerate(a["offsets"]))
        else:
            tiles = iter(range(len(steps[0])))
            rings = a.get(ADDR_RING) or ()

            def shift(o):
                if not isinstance(o, TileRef):
                    return o
                k = next(tiles)
                d = sum(i * s[k] for i, s in zip(at, steps))
                if d and k < len(rings) and rings[k] is not None:
                    d = ring_moved(o.addr, d, rings[k]) - o.addr
                return TileRef(o.space, o.addr + d, o.dtype, o.shape, o.valid) if d else o
            dst = shift(dst)
            srcs = tuple(shift(o) for o in srcs)
    return Instr(ins.op, ins.pipe, dst, srcs, Attrs(attrs), ins.loc)


class _Unroll:
    """The unrolling of a sequence of loops (`unrolled`): what their instructions share.

    A loop body inside loops whose indices take n combinations runs n times; each of its
    instructions is moved to those n iterations at once (`instances`, what `at_iteration` gives
    at each).  The instructions of a body repeat (a matmul's flags; its extracts, all from the
    same operand objects): one with the same operands (the same objects) and attributes inside
    the same loops has the same instances, worked out once.  The results equal `at_iteration`'s,
    with the same attribute order; an instruction without steps is itself at every iteration and
    a tile that does not move at an iteration the same object, as there; the other objects are
    built once and may be shared where `at_iteration` builds equal ones each time."""

    def __init__(self):
        self.done: dict = {}        # (loops, instruction) -> its instances
        self.deltas: dict = {}      # loops -> {steps -> `_deltas`}
        self.flags: dict = {}       # a flag but for its event id -> {event id -> the flag with it}
        # a tile (space, dtype, shape, valid: its own key) -> {address -> the tile there}: a ring of
        # slots walked by `addr_step` holds a few tiles, met once per iteration
        self.tiles: dict = {}
        # (op, pipe, and by identity loc, attrs, dst, srcs) -> (the instruction, its operands:
        # kept alive with it): the instances of one body instruction alike (a tile ring's turns)
        # share one
        self.made: dict = {}

    def runs(self, body, loops: list) -> list:
        """The instructions of each run of a loop body inside `loops` (the index ranges of the
        loops around it, outermost first): one sequence per combination of their indices, in the
        order running the loops gives them (the innermost index fastest)."""
        n = prod(map(len, loops))
        where = tuple((r.start, len(r)) for r in loops)      # (`loops` as a key)
        deltas = self.deltas.setdefault(where, {})
        parts = []          # one list of n sequences per inner loop or stretch of instructions
        stretch = []        # the instances of the instructions since the last loop
        for it in body:
            if isinstance(it, Loop):
                if stretch:
                    parts.append(list(zip(*stretch)))
                    stretch = []
                c = it.count
                if c <= 0:
                    continue
                inner = self.runs(it.body, loops + [range(c)])      # c runs of its body per run of ours
                parts.append(inner if c == 1 else
                             [tuple(itertools.chain.from_iterable(inner[j:j + c])) for j in range(0, n * c, c)])
            else:
                a = it.attrs
                if STEP_KEYS.isdisjoint(a._dict if type(a) is Attrs else a):
                    stretch.append([it] * n)            # nothing of it moves: the instruction itself
                else:
                    stretch.append(self.instances(it, loops, where, n, deltas))
        if stretch:
            parts.append(list(zip(*stretch)))
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return [()] * n
        return [tuple(itertools.chain.from_iterable(run)) for run in zip(*parts)]

    def instances(self, ins: Instr, loops: list, where: tuple, n: int, deltas: dict) -> list:
        """The instruction `ins` (with steps) of a loop body at each of the n iterations of
        `loops`, in order: what `at_iteration` gives at each."""
        try:
            a = ins.attrs._dict
            if not all(map(_int_steps, (a[k] for k in MOVING_STEPS if k in a))):
                raise TypeError("steps not all ints (equal to ints, they would share their results)")
            # (ints the ids of the operands, pairs the attributes: the key is unambiguous; the
            # objects are those of `ins`, alive as long as the unrolling)
            key = (where, ins.op, ins.pipe, id(ins.loc), id(ins.dst), *map(id, ins.srcs), *a.items())
            out = self.done.get(key)
            if out is None:
                out = self.done[key] = self.moved(ins, a, [k for k in MOVING_STEPS if k in a], loops, n, deltas)
            return out
        except Exception:       # steps that do not fit the loops or the operands: as `at_iteration` says
            return [at_iteration(ins, at) for at in itertools.product(*loops)]

    def moved(self, ins: Instr, a: dict, keys: list, loops: list, n: int, deltas: dict) -> list:
        """`instances`, worked out: per step attribute, the operands or the attribute it moves
        at each iteration, then the instructions."""
        attrs = {k: v for k, v in a.items() if k not in keys and k != ADDR_RING}      # (in their order)
        ops = (ins.dst, *ins.srcs)
        moving = [None] * len(ops)      # per operand: it at each iteration (None: it does not move)
        values = {}                     # per attribute that moves: it at each iteration
        for key in keys:
            steps = a[key]
            if key == GM_STEP:
                d = _deltas(loops, steps, n, deltas)
                for k, o in enumerate(ops):
                    if isinstance(o, GMRef):
                        if type(o) is not GMRef:
                            raise TypeError("a GMRef subclass: at_iteration's path")
                        if d is not None:
                            buf, off, shape, strides = o.buf, o.offset, o.shape, o.strides
                            # (a window that does not move at an iteration is the same object)
                            moving[k] = [GMRef(buf, off + x, shape, strides) if x else o for x in d]
            elif key == EVENT_STEP:
                e = a["event"]
                d = _deltas(loops, steps, n, deltas)
                if d is None:
                    attrs["event"] = e % EVENTS_PER_PIPE_PAIR
                else:
                    values["event"] = [(e + x) % EVENTS_PER_PIPE_PAIR for x in d]
            elif key == OFFSETS_STEP:
                offsets = a["offsets"]
                steps = steps[:len(loops)]
                per_dim = [_deltas(loops, tuple([s[k] for s in steps]), n, deltas) for k in range(len(offsets))]
                if per_dim.count(None) == len(per_dim):
                    attrs["offsets"] = tuple(offsets)
                else:
                    values["offsets"] = list(zip(*[[o] * n if d is None else [o + x for x in d]
                                                   for o, d in zip(offsets, per_dim)]))
            else:                       # ADDR_STEP: one step per tile operand, in operand order
                steps = steps[:len(loops)]
                tiles = [k for k, o in enumerate(ops) if isinstance(o, TileRef)]
                if len(tiles) > len(steps[0]):
                    raise IndexError("more tiles than steps: at_iteration's path")
                rings = a.get(ADDR_RING) or ()
                for t, k in enumerate(tiles):
                    o = ops[k]
                    if type(o) is not TileRef:
                        raise TypeError("a TileRef subclass: at_iteration's path")
                    d = _deltas(loops, tuple([s[t] for s in steps]), n, deltas)
                    if d is not None:
                        space, addr, dtype, shape, valid = o.space, o.addr, o.dtype, o.shape, o.valid
                        if t < len(rings) and rings[t] is not None:
                            d = [ring_moved(addr, x, rings[t]) - addr for x in d]
                        # (a tile that does not move at an iteration is the same object, as in
                        # at_iteration; the tiles it moves to, one object per address)
                        ring = self.tiles.setdefault((space, dtype, shape, valid), {})
                        at = []
                        for x in d:
                            if not x:
                                at.append(o)
                                continue
                            t = ring.get(addr + x)
                            if t is None:
                                t = ring[addr + x] = TileRef(space, addr + x, dtype, shape, valid)
                            at.append(t)
                        moving[k] = at
        make, op, pipe, loc = Instr._make, ins.op, ins.pipe, ins.loc
        # the operands at each iteration
        dsts = itertools.repeat(ins.dst, n) if moving[0] is None else moving[0]
        if all(m is None for m in moving[1:]):
            srcs = itertools.repeat(ins.srcs, n)
        else:
            srcs = list(zip(*[[o] * n if m is None else m for o, m in zip(ops[1:], moving[1:])]))
        # the attributes at each iteration, then the instructions
        if not values:
            attrs = Attrs.of(attrs)
            if moving.count(None) == len(ops):      # nothing moves: one instruction every iteration
                return [make(op, pipe, ins.dst, ins.srcs, attrs, loc)] * n
            if any(isinstance(o, GMRef) for o in ops):
                return [make(op, pipe, dst, s, attrs, loc) for dst, s in zip(dsts, srcs)]
            # only tiles move (on a ring of slots): the same few instructions over and over, shared
            made = self.made
            out = []
            for dst, s in zip(dsts, srcs):
                key = (op, pipe, id(loc), id(attrs), id(dst), *map(id, s))
                got = made.get(key)
                if got is None:
                    got = made[key] = (make(op, pipe, dst, s, attrs, loc), dst, s)
                out.append(got[0])
            return out
        if len(values) == 1 and len(ops) == 1 and ins.dst is None:
            # a flag (its event id moves): the same few flags over and over, shared
            (name, vals), = values.items()
            flags = self.flags.setdefault(
                (op, pipe, id(loc), tuple(attrs), *[v for k, v in attrs.items() if k != name]), {})
            out = []
            for v in vals:
                f = flags.get(v)
                if f is None:
                    d = attrs.copy()
                    d[name] = v
                    f = flags[v] = make(op, pipe, None, ins.srcs, Attrs.of(d), loc)
                out.append(f)
            return out
        all_attrs = []
        for v in zip(*values.values()):
            d = attrs.copy()
            d.update(zip(values, v))            # (keys already there: their places kept)
            all_attrs.append(Attrs.of(d))
        return [make(op, pipe, dst, s, at, loc) for dst, s, at in zip(dsts, srcs, all_attrs)]


def ring_moved(addr: int, delta: int, ring: tuple) -> int:
    """A ring tile's address moved by `delta` bytes: around its ring [lo, hi) (`ADDR_RING`)."""
    lo, hi = ring
    return lo + (addr + delta - lo) % (hi - lo)


def ring_text(rings: tuple) -> str:
    """An addr_ring value: `(-,0x0:0x40000)`, one entry per tile operand."""
    return "(" + ",".join("-" if r is None else f"{r[0]:#x}:{r[1]:#x}" for r in rings) + ")"


def _attr_text(key: str, value) -> str:
    """An instruction attribute's value as the text writes it."""
    if key in (GM_STEP, OFFSETS_STEP, ADDR_STEP):
        return steps_text(value)
    return ring_text(value) if key == ADDR_RING else _val(value)


def _int_steps(steps) -> bool:
    """Whether a step attribute's steps are all ints (not bools, not floats), nested or not."""
    return isinstance(steps, tuple) and all(
        type(s) is int or type(s) is tuple and all(type(x) is int for x in s) for s in steps)


def _deltas(loops: list, steps, n: int, memo: dict) -> list | None:
    """How far a value moved by `steps` (one per loop, outermost first) has moved at each of the
    n iterations of `loops`: `sum(i * s for i, s in zip(at, steps))` at every `at`, in order,
    added up loop by loop (memo: the ones worked out for these loops).  None: it never moves."""
    out = memo.get(steps, memo)
    if out is not memo:
        return out
    out = [0]
    moved = False
    for r, s in zip(loops, steps):
        if s:
            by = [i * s for i in r]
            out = [d + b for d in out for b in by]
            moved = True
        elif len(r) != 1:
            out = [d for d in out for _ in r]
    if not moved:
        out = None
    elif len(out) != n:         # fewer steps than loops: the inner loops do not move it
        out = [d for d in out for _ in range(n // len(out))]
    memo[steps] = out
    return out


def tile_operands(ins: "Instr") -> list:
    """The on-chip tiles an instruction names, in operand order (dst first): what `addr_step`
    has one step for."""
    return [o for o in (ins.dst, *ins.srcs) if isinstance(o, TileRef)]


def _steps_text(a) -> str:
    return f", event_step={steps_text(a[EVENT_STEP])}" if EVENT_STEP in a else ""


def steps_text(steps: tuple) -> str:
    """A gm_step / event_step / offsets_step value: one step per loop around the instruction,
    outermost first (`16384` in one loop, `(16384,256)` in two; an offsets step is a tuple itself:
    `(0,64)` in one loop, `((0,0),(0,64))` in two)."""
    one = [_val(x) if isinstance(x, tuple) else str(x) for x in steps]
    return one[0] if len(one) == 1 else "(" + ",".join(one) + ")"


def store_regions(instrs) -> list[tuple[int, int]]:
    """A stream cut after each of its GM stores (TSTORE): the [lo, hi) of each region, in order
    (a matmul task's output tiles, a vector task's row blocks), the last one ending the stream.
    The passes that work tile by tile cut streams here: the scheduler, the flag planner, `loops`."""
    n = len(instrs)
    ends = [k + 1 for k in itertools.compress(range(n), map("TSTORE".__eq__, map(_OP, instrs)))]
    if not ends or ends[-1] != n:
        ends.append(n)
    return list(zip([0] + ends[:-1], ends))


def run_sources(items) -> list:
    """Per instruction a sequence of instructions and loops runs, in order, the instruction of the
    text it is (a loop body's, as at the first iteration), without making the instructions run:
    what does not move with the loops (op, pipe, source line) is read off it.  A loop's are its
    body's, repeated (one list, not an instruction per iteration)."""
    out = []
    for it in items:
        if type(it) is Loop:
            out.extend(run_sources(it.body) * it.count)
        else:
            out.append(it)
    return out


def static_instrs(items, _depth: int = 0):
    """(instruction, loop depth) of every instruction of the program text (loops not unrolled)."""
    for it in items:
        if isinstance(it, Loop):
            yield from static_instrs(it.body, _depth + 1)
        else:
            yield it, _depth


def item_lines(items, indent: str = "  ") -> list[str]:
    """The text lines of a sequence of instructions and loops."""
    out = []
    for it in items:
        if isinstance(it, Loop):
            out.append(f"{indent}.loop {it.count}")
            out.extend(item_lines(it.body, indent + "  "))
            out.append(f"{indent}.endloop")
        else:
            out.append(indent + it.text())
    return out


class Access(NamedTuple):
    """A byte range an instruction reads or writes: `key` is an on-chip space ("UB", "L1", ...)
    or "GM:<buffer>"; [lo, hi) are bytes of the space, or elements of the GM buffer."""
    key: str
    lo: int
    hi: int
    write: bool


def accesses(ins: Instr, written_gm=None) -> list[Access]:
    """The one definition of what an instruction touches, read by the sync inserter, the list
    scheduler, the buffer-pressure analysis and the race checker alike, so that the flags the
    compiler inserts and the hazards the checker looks for agree by construction.

    A tile covers its whole allocated extent [addr, addr + nbytes) (row padding included); a GM
    window the span of its elements.  With `written_gm` (the names of the GM buffers the task
    writes), reads of other GM buffers are left out: read-only GM cannot order anything.
    """
    out = []
    o = ins.dst
    if isinstance(o, TileRef):
        out.append(o._accesses[1])
    elif isinstance(o, GMRef):
        out.append(_gm_accesses(o)[1])
    for o in ins.srcs:
        if isinstance(o, TileRef):
            out.append(o._accesses[0])
        elif isinstance(o, GMRef) and (written_gm is None or o.buf.name in written_gm):
            out.append(_gm_accesses(o)[0])
    return out


def _gm_accesses(o: GMRef) -> tuple[Access, Access]:
    """(read, write) of a GM window as `accesses` gives them, kept on the window (it is immutable)."""
    got = o.__dict__.get("_accesses")
    if got is None:
        lo, hi = o.span()
        key = "GM:" + o.buf.name
        got = o.__dict__["_accesses"] = (Access(key, lo, hi, False), Access(key, lo, hi, True))
    return got


class Intervals:
    """Ranges [lo, hi) of one space, each with a value, found by overlap in O(log n + hits): the
    ranges sorted by start, and the longest one bounds how far back an overlapping range can
    start.  The per-space range tables of the sync inserter and the race checker."""

    def __init__(self):
        self.keys: list[tuple[int, int]] = []
        self.values: dict[tuple[int, int], object] = {}
        self.longest = 0
        # the answers of `overlapping` since the ranges last changed: a task's tiles reuse a few
        # slots, so once every slot has been seen a lookup is one dict probe
        self._memo: dict[tuple[int, int], tuple] = {}

    def overlapping(self, lo: int, hi: int) -> tuple[tuple[int, int], ...]:
        """The ranges overlapping [lo, hi), in order of start."""
        q = (lo, hi)
        got = self._memo.get(q)
        if got is None:
            keys = self.keys
            i0 = bisect.bisect_left(keys, (lo - self.longest + 1,))
            i1 = bisect.bisect_left(keys, (hi,))
            got = self._memo[q] = tuple([k for k in keys[i0:i1] if k[1] > lo])
        return got

    def get(self, key, default=None):
        return self.values.get(key, default)

    def __contains__(self, key) -> bool:
        return key in self.values

    def set(self, key: tuple[int, int], value) -> None:
        if key not in self.values:
            bisect.insort(self.keys, key)
            self.longest = max(self.longest, key[1] - key[0])
            if self._memo:
                self._memo = {}
        self.values[key] = value

    def remove(self, key: tuple[int, int]) -> None:
        del self.keys[bisect.bisect_left(self.keys, key)]
        del self.values[key]
        if self._memo:
            self._memo = {}


def written_gm(instrs) -> set[str]:
    """The GM buffers an instruction stream writes."""
    return {i.dst.buf.name for i, _ in static_instrs(instrs) if isinstance(i.dst, GMRef)}


def stream_accesses(instrs) -> list[list[Access]]:
    """`accesses(i, written_gm(instrs))` of every instruction of a stream without loops, in
    order.  Worked out once per distinct instruction object: equal instructions are mostly one
    object, so a position's list may be another's (read them, do not change them)."""
    distinct = dict(zip(map(id, instrs), instrs))
    written = written_gm(distinct.values())
    of = {k: accesses(i, written) for k, i in distinct.items()}
    return list(map(of.__getitem__, map(id, instrs)))


def loops_in(items):
    """Every loop of a sequence of instructions and loops, inner ones included (outer first)."""
    for it in items:
        if isinstance(it, Loop):
            yield it
            yield from loops_in(it.body)


def _val(v):
    return "(" + ",".join(map(str, v)) + ")" if isinstance(v, tuple) else str(v)


def _operand(o) -> str:
    if isinstance(o, TileRef):
        return o.text()
    if isinstance(o, GMRef):
        return "GM:" + o.text()
    return repr(float(o)) if isinstance(o, float) else str(o)


@quick_init
@dataclass(frozen=True)
class ExecTask:
    id: int
    group: int
    core_type: str
    deps: tuple[int, ...]
    level: int
    code: tuple                      # the program text: instructions and loops (`Loop`)
    pair: tuple[int, int] | None = None     # see ir.block.Task.pair
    # the core (index among the machine's cores of core_type) the task runs on, set by the
    # assign_cores pass; None: the dispatcher picks a free one when the task is ready
    core: int | None = None

    @cached
    def instrs(self) -> tuple[Instr, ...]:
        """The instructions the task runs, in order: `code` with its loops unrolled (`code`
        itself when it has none).  Indices into it are the instruction indices of the trace, the
        race reports and the checked mode."""
        return tuple(unrolled(self.code)) if has_loops(self.code) else self.code

    @cached
    def n_instrs(self) -> int:
        """How many instructions the task runs (its loops' iterations counted)."""
        return n_instrs(self.code)

    def with_core(self, core: int | None) -> "ExecTask":
        """The task on `core`, the same stream: what was worked out of it (`instrs`, `n_instrs`)
        goes along (a 4096^3 matmul's task is twelve thousand instructions to walk again)."""
        out = _replace(self, core=core)
        for k in ("instrs", "n_instrs"):
            if k in self.__dict__:
                out.__dict__[k] = self.__dict__[k]
        return out

    def pipe_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in run_sources(self.code):       # (a program read from text: not unrolled)
            out[i.pipe] = out.get(i.pipe, 0) + 1
        return out


@dataclass(frozen=True)
class ExecGraph(TextForm):
    name: str
    buffers: tuple[GMBuffer, ...]
    tasks: tuple[ExecTask, ...]

    level = "exec"

    def __len__(self):
        return sum(t.n_instrs for t in self.tasks)

    def replace(self, tasks) -> "ExecGraph":
        return ExecGraph(self.name, self.buffers, tuple(tasks))

    def text(self) -> str:
        lines = [f"exec_graph {self.name} {{"]
        for t in self.tasks:
            pc = ", ".join(f"{p} {c}" for p, c in sorted(t.pipe_counts().items()))
            syncs = sum(i.op in SYNC_OPS for i in run_sources(t.code))
            core = t.core_type + ("" if t.core is None else str(t.core))
            loops = sum(1 for _ in loops_in(t.code))
            lines.append(f"  launch task {t.id} on {core} after {list(t.deps)}: "
                         f"{t.n_instrs} instrs ({pc}; {syncs} sync)"
                         + (f" in {loops} loop{'s' if loops > 1 else ''}, {sum(1 for _ in static_instrs(t.code))} "
                            "in the text" if loops else "")
                         + (f", paired with task {t.pair[0]} (AIV slot {t.pair[1]})" if t.pair else ""))
        lines.append("}")
        return "\n".join(lines)



# A graph's (or program's) side table {id(task.code): (task.code, shape id)}: streams of one
# shape id (isomorphic tasks, scheduled alike) get the same flags and the same buffer pressure,
# so insert_sync and buffer_pressure work them out once, and the simulator decodes them once.
# Only the passes that built a graph set it; `stream_shape` checks the entry is for that very
# stream.
STREAM_SHAPES = "_stream_shapes"


# A graph's (or program's) `SIM_CACHE`: a dict the simulator fills with what it works out from
# the instruction streams alone (their decoding and encoding, its timing runs), opaque to the
# compiler.  A pass that keeps every stream of its input (assign_cores, which only fixes cores,
# and codegen) hands the same dict on with `carry_streams`, so that the timing run assign_cores
# makes is the one `simulate(mode="timing")` returns, and nothing is decoded twice.
SIM_CACHE = "_sim_cache"


def carry_streams(src, dst) -> None:
    """Give `dst` (a graph or program with the very instruction streams of `src`, in the same
    order) the side tables of `src`: its stream shapes and the simulator's cache."""
    if STREAM_SHAPES in src.__dict__:
        dst.__dict__[STREAM_SHAPES] = src.__dict__[STREAM_SHAPES]
    dst.__dict__[SIM_CACHE] = src.__dict__.setdefault(SIM_CACHE, {})


def stream_shape(g, instrs) -> int | None:
    """The shape id the side table of `g` gives the stream `instrs`, or None (the shape of the
    instructions it runs: the loops of a task unrolled)."""
    e = g.__dict__.get(STREAM_SHAPES, {}).get(id(instrs))
    return e[1] if e is not None and e[0] is instrs else None


def per_shape(g, memo: dict, stream, work):
    """`work()` for the stream `stream` of `g`, worked out once per stream shape (`memo`: shape
    id -> result, the caller's): isomorphic tasks share what depends on their shape only.  A
    stream without a shape gets its own."""
    shape = stream_shape(g, stream)
    if shape is None:
        return work()
    got = memo.get(shape)
    if got is None:
        got = memo[shape] = work()
    return got


def loop_problem(items) -> tuple[str, SourceLoc | None] | None:
    """What is wrong with the loops of a task's instructions, or None: a loop runs at least
    once and has a body; `gm_step` gives one step per loop around its instruction, which has a
    GM operand; the GM windows of every iteration stay inside their buffers."""
    return _loop_problem(items, 0, (), set())


def _loop_problem(items, depth, counts, seen: set):
    """`loop_problem` of items inside loops of `counts` iterations; `seen`: (instruction id,
    counts) of the instructions checked already (a task's loop bodies share most of theirs)."""
    for it in items:
        if isinstance(it, Loop):
            if not isinstance(it.count, int) or it.count < 1 or not it.body:
                return (f"a loop needs a count >= 1 and a body (got .loop {it.count} with "
                        f"{len(it.body)} instructions)", None)
            p = _loop_problem(it.body, depth + 1, counts + (it.count,), seen)
            if p:
                return p
            continue
        a = it.attrs._dict
        if STEP_KEYS.isdisjoint(a):
            continue
        key = (id(it), counts)      # (the program keeps `it` alive: its id stays its own)
        if key in seen:
            continue
        seen.add(key)
        p = _step_problem(it, a, depth, counts)
        if p:
            return p
    return None


def _step_problem(it: Instr, a: dict, depth: int, counts: tuple) -> tuple[str, SourceLoc | None] | None:
    """What is wrong with the step attributes `a` of instruction `it` inside loops of `counts`
    iterations (`depth` of them), or None: the part of `loop_problem` that depends on the
    instruction and the loop counts only."""
    es = a.get(EVENT_STEP)
    if es is not None and (not isinstance(es, tuple) or len(es) != depth or "event" not in a):
        return (f"{it.op}: event_step= needs a flag and one step per loop around it ({depth}), "
                f"got {es!r}", it.loc)
    os_ = a.get(OFFSETS_STEP)
    if os_ is not None:
        offs = a.get("offsets")
        if (offs is None or not isinstance(os_, tuple) or len(os_) != depth
                or any(not isinstance(x, tuple) or len(x) != len(offs) for x in os_)):
            return (f"{it.op}: offsets_step= needs offsets= and one step per loop around it "
                    f"({depth}), each with one value per offset, got {os_!r}", it.loc)
        for d, o in enumerate(offs):
            lo = o + sum(x[d] * (c - 1) for x, c in zip(os_, counts) if x[d] < 0)
            hi = o + sum(x[d] * (c - 1) for x, c in zip(os_, counts) if x[d] > 0) + it.dst.valid[d]
            if lo < 0 or hi > it.srcs[0].shape[d]:
                return (f"{it.op}: the offsets of a later iteration read outside its source tile "
                        f"(offsets_step={steps_text(os_)} over {'x'.join(map(str, counts))} iterations)",
                        it.loc)
    ast = a.get(ADDR_STEP)
    if ast is not None:
        tiles = tile_operands(it)
        if (not tiles or not isinstance(ast, tuple) or len(ast) != depth
                or any(not isinstance(x, tuple) or len(x) != len(tiles) for x in ast)):
            return (f"{it.op}: addr_step= needs one step per loop around it ({depth}), each with "
                    f"one value per tile operand ({len(tiles)}), got {ast!r}", it.loc)
        rings = a.get(ADDR_RING)
        if rings is not None:
            if not isinstance(rings, tuple) or len(rings) != len(tiles) or any(
                    r is not None and not (isinstance(r, tuple) and len(r) == 2 and all(type(v) is int for v in r)
                                           and r[0] <= t.addr and t.addr + t.nbytes <= r[1])
                    for r, t in zip(rings, tiles)):
                return (f"{it.op}: addr_ring= needs one entry per tile operand ({len(tiles)}), each - or "
                        f"the range lo:hi of bytes its tile lies in, got {rings!r}", it.loc)
        for k, t in enumerate(tiles):
            if rings is not None and rings[k] is not None:
                continue            # (stays in its ring)
            if t.addr + sum(x[k] * (c - 1) for x, c in zip(ast, counts) if x[k] < 0) < 0:
                return (f"{it.op}: a later iteration's tile address is below 0 "
                        f"(addr_step={steps_text(ast)} over {'x'.join(map(str, counts))} iterations)",
                        it.loc)
    elif ADDR_RING in a:
        return f"{it.op} has addr_ring= but no addr_step=", it.loc
    step = a.get(GM_STEP)
    if step is None:
        return None
    gm = next((o for o in (it.dst, *it.srcs) if isinstance(o, GMRef)), None)
    if gm is None:
        return f"{it.op} has gm_step= but no GM operand", it.loc
    if not isinstance(step, tuple) or len(step) != depth:
        return (f"{it.op}: gm_step= needs one step per loop around it ({depth}), got "
                f"{step!r}", it.loc)
    lo, hi = gm.span()
    for s_, c in zip(step, counts):
        if s_ < 0:
            lo += s_ * (c - 1)
        else:
            hi += s_ * (c - 1)
    if lo < 0 or hi > prod(gm.buf.shape):
        return (f"{it.op}: the GM window of a later iteration leaves buffer {gm.buf.name} "
                f"(gm_step={_val(step)} over {'x'.join(map(str, counts))} iterations)", it.loc)
    return None


_EVENT_OPS = frozenset(("SET_FLAG", "WAIT_FLAG", *CROSS_OPS))


def verify(g: ExecGraph) -> None:
    core_of: dict[int, str] = {}
    # (counts, core type) -> ids of the instructions found fine inside loops of those counts on
    # that core type: what the checks of an instruction depend on.  Most instructions are shared
    # by loop bodies and by the isomorphic tasks of a graph: each is checked once, not per task
    # (`_task_fine`; a task it cannot vouch for gets the checks in program order, `_task_problem`,
    # which raise its first problem).  Under the key None: the step values found fine
    # (`_steps_fine`).
    fine: dict = {None: set()}
    for t in g.tasks:
        pipes = AIC_PIPES if t.core_type == "AIC" else AIV_PIPES
        if any(d not in core_of for d in t.deps):
            raise VerificationError(f"exec graph task {t.id}: depends on a later or unknown task",
                                    got=list(t.deps))
        problem = pair_problem(t.core_type, t.pair, core_of)
        if problem:
            raise VerificationError(f"exec graph task {t.id}: {problem}", got=t.pair)
        try:
            ok = _task_fine(t.code, (), t.core_type, _PIPE_SETS[pipes], fine)
        except Exception:       # a malformed instruction: `_task_problem` says what is wrong
            ok = False
        if not ok:              # (rare) the task's checks in program order, for its first problem
            _task_problem(t, pipes)
        core_of[t.id] = t.core_type


def _task_fine(items, counts: tuple, core_type: str, pipes: frozenset, fine: dict) -> bool:
    """Whether `items`, inside loops of `counts` iterations, pass the checks of `_task_problem`
    (False may also mean: it could not tell).  `fine`: see verify; only the instructions it does
    not hold yet are looked at, in bulk (C-level maps over them where it can)."""
    done = fine.get((counts, core_type))
    if done is None:
        done = fine[counts, core_type] = set()
    is_loop = list(map(isinstance, items, itertools.repeat(Loop)))
    instrs = items if True not in is_loop else list(itertools.compress(items, map(operator.not_, is_loop)))
    if not done.issuperset(map(id, instrs)):
        new = list(itertools.compress(instrs, map(operator.not_, map(done.__contains__, map(id, instrs)))))
        if not pipes.issuperset(map(_PIPE, new)):
            return False
        attrs = list(map(_ATTRS, new))
        flags = list(map(_EVENT_OPS.__contains__, map(_OP, new)))
        # (an event id in 0..7: `_task_problem` asks 0 <= id < 8, true of all of these)
        if True in flags and not _EVENT_IDS.issuperset(map(dict.get, itertools.compress(attrs, flags),
                                                           itertools.repeat("event"))):
            return False
        stepped = list(map(operator.not_, map(STEP_KEYS.isdisjoint, attrs)))
        if True in stepped and not _steps_fine(itertools.compress(zip(new, attrs, flags), stepped),
                                               counts, fine[None]):
            return False
        done.update(map(id, new))
    if True in is_loop:
        for it in itertools.compress(items, is_loop):
            if (not isinstance(it.count, int) or it.count < 1 or not it.body
                    or not _task_fine(it.body, counts + (it.count,), core_type, pipes, fine)):
                return False
    return True


def _steps_fine(instrs, counts: tuple, values: set) -> bool:
    """Whether `_step_problem` finds nothing wrong with any of `instrs` ((instruction, its attrs,
    whether it is a flag)) inside loops of `counts`.  `values`: the keys (below) of the ones found
    fine already: many instructions of isomorphic tasks are equal but not the same object."""
    depth = len(counts)
    for ins, a, flag in instrs:
        if flag:    # what `_step_problem` asks of a flag, at once: an event_step, one per loop
            es = a.get(EVENT_STEP)
            if (type(es) is tuple and len(es) == depth and "event" in a and GM_STEP not in a
                    and OFFSETS_STEP not in a and ADDR_STEP not in a):
                continue
        # everything `_step_problem`'s verdict depends on (op and loc only go into its message)
        key = (counts, ins.dst, ins.srcs, a.get(EVENT_STEP), "event" in a, a.get(OFFSETS_STEP),
               a.get("offsets"), a.get(ADDR_STEP), a.get(ADDR_RING), a.get(GM_STEP))
        if key in values:
            continue
        if _step_problem(ins, a, depth, counts):
            return False
        values.add(key)
    return True


_PIPE, _OP, _ATTRS = operator.attrgetter("pipe"), operator.attrgetter("op"), operator.attrgetter("attrs._dict")
_EVENT_IDS = frozenset(range(EVENTS_PER_PIPE_PAIR))
_PIPE_SETS = {AIC_PIPES: frozenset(AIC_PIPES), AIV_PIPES: frozenset(AIV_PIPES)}


def _task_problem(t: ExecTask, pipes: tuple) -> None:
    """Raise the first problem of task `t`'s instruction stream, in program order: its loops
    (`loop_problem`), then an instruction on a pipe its core does not have or with an event id
    out of range."""
    problem = loop_problem(t.code)
    if problem:
        raise VerificationError(f"exec graph task {t.id}: {problem[0]}", loc=problem[1])
    checked: set[int] = set()      # (ids of the instructions checked: most are shared)
    for k, (ins, _) in enumerate(static_instrs(t.code)):
        if id(ins) in checked:
            continue
        checked.add(id(ins))
        if ins.pipe not in pipes:
            raise VerificationError(f"exec graph task {t.id}, instruction {k} ({ins.op}): "
                                    f"pipe {ins.pipe} does not exist on {t.core_type}",
                                    loc=ins.loc, expected=" ".join(pipes), got=ins.pipe)
        if ins.op in _EVENT_OPS and not 0 <= ins.attrs["event"] < EVENTS_PER_PIPE_PAIR:
            raise VerificationError(f"exec graph task {t.id}, instruction {k}: event id out of range",
                                    expected=f"0..{EVENTS_PER_PIPE_PAIR - 1}", got=ins.attrs["event"])
