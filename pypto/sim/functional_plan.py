"""What each instruction computes on numpy (`decode`), and the batched plan that runs a program.

`decode` is the one definition of the functional semantics: it maps an instruction to a handler
`f(dst, *srcs)` and the operands to pass it (tiles, GM windows, constants).  Handlers work on
arrays with any number of leading axes, so the same handler serves the reference interpreter
(one task, plain tile views) and the plan (a leading axis of tasks run together).

The plan is built once per program and machine and cached on the program:

1. Tasks are keyed by their instruction stream: same ops on the same on-chip tiles, GM windows of
   the same shape at the same offsets relative to the task's first window in each buffer.  Tasks
   with one key run as a batch: each instruction is one numpy call over a leading task axis,
   every space has one copy per task, and a GM operand is one strided view of the tasks' windows
   (a batch only takes tasks whose windows are evenly spaced).
2. Batching needs tasks that cannot see each other.  If some task reads on-chip bytes it did not
   write itself (checked once per stream), the plan runs the tasks one by one in program order on
   one zero-filled copy of each space, as the reference interpreter does.  Otherwise what a task
   leaves on chip never matters, and tasks run level by level, a task's level being one more
   than that of any earlier task it depends on or conflicts with in GM (one of the two writing):
   an order with the sequential result, in which tasks of one level and key form batches.
3. With on-chip data private to its task, each stream is rewritten into fewer numpy calls that
   compute the same values: copies that only relay data are dropped (loads and extracts whose
   readers read the source in place -- a matmul's blocks of an L1 panel as the windows of GM the
   panel was loaded from -- stores whose producer writes GM: _elide_copies), a tile
   passed from its producer to an element-wise instruction writing GM is skipped (_chain), and
   instructions repeated with only their GM windows moved -- the iterations of a loop over tiles
   -- run as one call over a group axis (_fuse), so numpy sees whole rows where there were tiles.
   The stream then runs level by level of dependence through memory, like the tasks in 2.

Building is about linear in the program's size: a store's producer is looked for at most WINDOW
instructions away, a copy's readers through an index of the rules touching each tile (until the
tile is overwritten), and levels (of tasks, of a stream's instructions) are kept in arrays per
byte of a space and per element of a GM buffer, not found by comparing pairs.

Running a plan makes the numpy views for this run's GM buffers and the reused per-thread on-chip
copies (and an fp32 copy of a buffer of fp16 matmul factors: _widened_factors), then makes its
list of numpy calls: the Python cost is per batch, not per task.  Decode
refuses operands numpy would refuse (SimulationError at the instruction's line), so a numpy
error while running a plan is the plan's own bug, reported as such, never hidden by a fallback.
"""
from __future__ import annotations

import bisect
import functools
import threading
from functools import partial
from typing import NamedTuple

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from ..errors import SimulationError
from ..ir.core import prod
from ..ir.exec import ADDR_STEP, SYNC_OPS, Instr, Loop, TileRef
from ..ir.gm import GMRef, natural_strides
from ..ir.tile import tile_strides
from ..target.isa import INDEXED_KINDS, INSTRUCTIONS
from ..target.semantics import ACTIVATIONS, accumulate, index_errors, product, wide, widened

MAX_BATCH = 16                  # tasks run together: beyond a few, numpy's per-element work dominates
REUSED_BYTES = 32 << 20         # largest memory kept for the next run (on-chip copies, a workspace)


# --- instruction semantics ---------------------------------------------------------------------
# What an instruction computes is its row of the instruction table (pypto.target.isa): `kind`
# picks the handler, `semantics` is the numpy function it applies (pypto.target.semantics).

# the kinds whose handler applies `semantics` element by element (with numpy broadcasting): their
# handlers may run in place on GM (_chain); a kind left out only loses that rewrite
ELEMENTWISE_KINDS = ("unary", "binary", "scalar", "expand_binary")
ELEMENTWISE = {r.semantics for r in INSTRUCTIONS.values() if r.kind in ELEMENTWISE_KINDS and r.semantics is not None}
ELEMENTWISE |= set(ACTIVATIONS.values())     # of a store (act=)


def _kind(op: str) -> str | None:
    r = INSTRUCTIONS.get(op)
    return None if r is None else r.kind


def _shape(o) -> tuple[int, ...]:
    """Of a tile, GM window or the plan's stand-in for a window."""
    return o.valid if isinstance(o, TileRef) else o.ref.shape if isinstance(o, _GM) else o.shape


def _dtype(o):
    if isinstance(o, _GM):
        o = o.ref
    return o.dtype.np_dtype if isinstance(o, (TileRef, GMRef)) else None


def _assign(dst, src):                          # TLOAD, TSTORE, TEXTRACT, TMOV, TCVT: convert and copy
    dst[...] = src


def _expand(dst, src):                          # TROWEXPAND, TCOLEXPAND: an assignment's broadcast
    dst[...] = src


def _into(f, dst, *srcs):                       # the result written straight into dst
    f(*srcs, out=dst)


def _via(f, dst, *srcs):                        # the result computed, then converted into dst
    dst[...] = f(*srcs)


def _iota(f, start, step, axis, dst):          # TCI: the sequence along axis (from the end)
    f(start, step, axis, out=dst)


def _reduce(f, axis, dst, src):
    dst[...] = f(src, axis=axis, keepdims=True)


def _elementwise(f, dst, srcs):
    """The handler of an element-wise op: `out=dst` when the result has dst's dtype and shape
    (no temporary), else computed and converted as an assignment would."""
    shape, dtype = _shape(dst), _dtype(dst)
    try:
        direct = (all(_dtype(s) is None or (_dtype(s) == dtype and len(_shape(s)) <= len(shape)) for s in srcs)
                  and np.broadcast_shapes(*map(_shape, srcs), shape) == shape
                  and (not isinstance(f, np.ufunc) or f.resolve_dtypes((dtype,) * f.nin + (None,))[-1] == dtype))
    except (ValueError, TypeError):             # shapes that do not combine (decode refuses them)
        direct = False                          # or no loop for the dtype: numpy's own casting
    return (partial(_into if direct else _via, f), (dst, *srcs))


def _matmul(ins: Instr):
    dst, srcs = ins.dst, ins.srcs
    acc = ins.op != "TMATMUL"
    dtype = _dtype(dst)
    f = (accumulate if acc else product)(dtype)
    a, b = srcs[-2:]
    direct = (all(len(_shape(o)) == 2 for o in (dst, a, b)) and _shape(a)[1] == _shape(b)[0]
              and _shape(dst) == (_shape(a)[0], _shape(b)[1])
              and (not acc or (_shape(srcs[0]) == _shape(dst) and _dtype(srcs[0]) == dtype)))
    return partial(_into if direct else _via, f), (dst, *srcs)


def _result_shape(ins: Instr, srcs) -> tuple[int, ...]:
    """The shape of what an instruction computes from its sources (before it is written to dst),
    by numpy's rules; ValueError when the sources do not combine."""
    op, shapes = ins.op, [_shape(s) if isinstance(s, (TileRef, GMRef)) else np.shape(s) for s in srcs]
    kind = _kind(op)
    if kind == "cube":                         # np.matmul's rule: a vector gains a dim, then loses it
        a, b = shapes[-2:]
        if not (a and b):
            raise ValueError("a factor is a scalar")
        a2, b2 = (1,) * (len(a) == 1) + a, b + (1,) * (len(b) == 1)
        if a2[-1] != b2[-2]:
            raise ValueError(f"inner dims {a2[-1]} and {b2[-2]} differ")
        out = np.broadcast_shapes(a2[:-2], b2[:-2]) + a2[-2:-1] * (len(a) > 1) + b2[-1:] * (len(b) > 1)
        return np.broadcast_shapes(shapes[0], out) if len(shapes) == 3 else out
    if kind == "reduce":
        (s,) = shapes
        axis = normalize_axis_index(ins.attrs["dim"], len(s))
        return s[:axis] + (1,) + s[axis + 1:]
    if kind in INDEXED_KINDS:
        return _indexed_shape(ins, kind, shapes)
    return np.broadcast_shapes(*shapes)


def _indexed_shape(ins: Instr, kind: str, shapes) -> tuple[int, ...]:
    """MGATHER: the window with the index's extent along dim, broadcast with the index; MSCATTER:
    the window it writes (the values, which the index broadcasts to, fit it off the dim)."""
    a, b = shapes                                  # gather: window, index; scatter: values, index
    if len(a) != len(b):
        raise ValueError(f"the index has rank {len(b)}, the data {len(a)}")
    axis = normalize_axis_index(ins.attrs["dim"], len(a))
    if kind == "gather":
        return np.broadcast_shapes(a[:axis] + b[axis:axis + 1] + a[axis + 1:], b)
    if np.broadcast_shapes(a, b) != a:
        raise ValueError(f"the index {list(b)} does not broadcast to the values {list(a)}")
    w = _shape(ins.dst)
    if len(w) != len(a) or any(x != y for d, (x, y) in enumerate(zip(w, a)) if d != axis):
        raise ValueError(f"the values {list(a)} do not fit the window {list(w)} off dim {axis}")
    return w


def _gathered(f, axis, dst, src, index):       # MGATHER
    f(src, index, axis, out=dst)


def _scattered(f, axis, dst, values, index):   # MSCATTER (atomic=ADD: f adds)
    f(dst, values, index, axis)


def check_indices(ins: Instr, arrays) -> None:
    """Checked mode: SimulationError at the instruction's line (the kernel's gather, scatter, ...)
    when an index of an MGATHER / MSCATTER lies outside the dim it indexes."""
    if _kind(ins.op) not in INDEXED_KINDS:
        return
    dst, data, index = arrays
    n = (data if _kind(ins.op) == "gather" else dst).shape[ins.attrs["dim"]]
    bad = index_errors(index, n)
    if bad:
        idx = np.asarray(index)
        first = idx[(idx < 0) | (idx >= n)].flat[0]
        raise SimulationError(f"{ins.op}: {bad} index{'es' if bad > 1 else ''} out of range (the first: {first})",
                              loc=ins.loc, expected=f"indices in [0, {n}) along dim {ins.attrs['dim']}",
                              got=f"{int(idx.min())} .. {int(idx.max())}")


def _fits(got: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether a result of shape `got` can be written to an operand of `shape` (numpy's
    assignment: broadcast, extra leading 1s dropped)."""
    extra = len(got) - len(shape)
    if extra > 0:
        if any(d != 1 for d in got[:extra]):
            return False
        got = got[extra:]
    return all(g in (1, s) for g, s in zip(got[::-1], shape[::-1]))


def _checked(ins: Instr, dst, srcs) -> None:
    """SimulationError (at the instruction's line) unless the sources combine and fit dst: what
    numpy would refuse is refused here, so the interpreter and the plan take the same programs."""
    try:
        got = _result_shape(ins, srcs)
    except (ValueError, LookupError) as e:
        raise SimulationError(f"{ins.op}: operand shapes do not combine ({e})", loc=ins.loc,
                              got=", ".join(str(list(_shape(s))) for s in srcs
                                            if isinstance(s, (TileRef, GMRef)))) from None
    if not _fits(got, _shape(dst)):
        raise SimulationError(f"{ins.op}: the result does not fit the destination", loc=ins.loc,
                              expected=f"a shape that broadcasts to {list(_shape(dst))}", got=str(list(got)))


def decode(ins: Instr):
    """(handler, operands) of an instruction; `handler(*arrays of the operands)` executes it.
    The operands are (dst, *srcs) with GM windows in their places; tiles and scalars may differ
    (TEXTRACT reads a window of its tile, a scalar operand becomes a 0-d array).  Operand shapes
    that do not combine raise SimulationError."""
    handler, operands = _decode(ins)
    _checked(ins, operands[0], operands[1:])
    return handler, operands


def _decode(ins: Instr):
    op, dst, srcs = ins.op, ins.dst, ins.srcs
    row = INSTRUCTIONS.get(op)
    kind = None if row is None else row.kind
    if kind == "cvt" and ins.attrs.get("round") is not None:      # to an integral value (TCVT round=)
        f = row.math(ins.attrs)
        if f is None:
            raise SimulationError(f"no functional rule for {op} with round={ins.attrs['round']}", loc=ins.loc)
        return _elementwise(f, dst, srcs[:1])
    if kind == "iota":                                             # TCI: no sources
        axis = normalize_axis_index(ins.attrs.get("dim", -1), len(_shape(dst))) - len(_shape(dst))
        return partial(_iota, row.semantics, ins.attrs.get("start", 0), ins.attrs.get("step", 1), axis), (dst,)
    if kind in ("load", "store", "cvt", "move"):
        act = ins.attrs.get("act")
        if act is None:
            return _assign, (dst, srcs[0])
        if act not in ACTIVATIONS:
            raise SimulationError(f"no functional rule for {op} with act={act}", loc=ins.loc)
        return _elementwise(ACTIVATIONS[act], dst, srcs[:1])   # applied by the FIX pipe on the way out
    if kind == "extract":
        full = srcs[0]
        # the window of the allocated source tile: same row pitch, starting at the offsets
        # (clipped like a slice: a window that does not fit is refused as not fitting dst)
        (r0, r1, _), (c0, c1, _) = (slice(o, o + n).indices(s)
                                    for o, n, s in zip(ins.attrs["offsets"], _shape(dst), full.shape))
        rs, cs = tile_strides(full.shape, full.dtype)
        window = TileRef(full.space, full.addr + r0 * rs + c0 * cs, full.dtype, full.shape,
                         (max(r1 - r0, 0), max(c1 - c0, 0)))
        if window.valid != _shape(dst):
            raise SimulationError(f"{op}: the window at {list(ins.attrs['offsets'])} runs past its tile",
                                  loc=ins.loc, expected=f"within {list(full.shape)}",
                                  got=f"{list(_shape(dst))} at {list(ins.attrs['offsets'])}")
        return _assign, (dst, window)
    if kind == "cube":
        return _matmul(ins)
    if kind in INDEXED_KINDS:                      # MGATHER (dst, GM, index), MSCATTER (GM, values, index)
        f = row.math(ins.attrs)
        if f is None:
            raise SimulationError(f"no functional rule for {op} with atomic={ins.attrs.get('atomic')}", loc=ins.loc)
        nd = len(_shape(srcs[0]))
        axis = normalize_axis_index(ins.attrs["dim"], nd) - nd     # from the end: task axes lead
        return partial(_gathered if kind == "gather" else _scattered, f, axis), (dst, srcs[0], srcs[1])
    if kind == "expand":
        return _expand, (dst, srcs[0])
    f = None if row is None else row.math(ins.attrs)
    if f is None:
        raise SimulationError(f"no functional rule for instruction {op}"
                              + (f" with {row.modes[0]}={ins.attrs.get(row.modes[0])}" if row and row.modes else ""),
                              loc=ins.loc)
    if kind == "unary":
        return _elementwise(f, dst, srcs[:1])
    if kind == "reduce":
        nd = len(_shape(srcs[0]))
        # counted from the end, so leading (task) axes do not shift it
        axis = normalize_axis_index(ins.attrs["dim"], nd) - nd
        return partial(_reduce, f, axis), (dst, srcs[0])
    if kind in ("binary", "scalar", "expand_binary"):
        b = np.asarray(srcs[1], dtype=_dtype(srcs[0])) if row.form == "S" else srcs[1]
        return _elementwise(f, dst, (srcs[0], b))
    if kind in ("select", "select_scalar"):
        c = np.asarray(srcs[2], dtype=_dtype(srcs[1])) if row.form == "S" else srcs[2]
        return _elementwise(f, dst, (srcs[0], srcs[1], c))
    if kind == "fill":
        return _elementwise(f, dst, (np.asarray(srcs[0], dtype=_dtype(dst)),))
    raise SimulationError(f"no functional rule for instruction {op} (of kind {kind})", loc=ins.loc)


# --- the plan ------------------------------------------------------------------------------------

class _GM(NamedTuple):
    """A GM operand of a stream: operand `p` of (dst, *srcs) of its `k`-th non-sync instruction
    (decode keeps GM operands in place); `ref` is that window in the first task of the stream.
    In a fused instruction (see _fuse) the windows of the group are `step` elements apart."""
    k: int
    p: int
    ref: GMRef
    step: int = 0
    sub: tuple | None = None    # (offsets, shape): a window inside operand p's (see _sub_window)

    def window(self, ins: Instr) -> GMRef:
        """This operand's window in an instruction alike the k-th (another task's, iteration's)."""
        w = (ins.dst, *ins.srcs)[self.p]
        return w if self.sub is None else w.window(*self.sub)


class _View(NamedTuple):
    """An operand array of a plan, made per run: np.ndarray(shape, dtype, buffer, offset, strides)
    with buffer a space's copies (key: its name) or a GM buffer (key: ('GM', name))."""
    key: object
    shape: tuple
    dtype: np.dtype
    offset: int
    strides: tuple


# Operand arrays have a task axis (n tasks of a batch), a group axis (g fused instructions, see
# _fuse; a tile is the same for all of them) and the operand's own axes, after leading 1s up to
# the instruction's highest rank (numpy broadcasting, made explicit past the two leading axes).

def _tile_spec(t: TileRef, n: int, g: int, rank: int, caps) -> _View:
    pad, stride = rank - len(t.valid), caps[t.space]
    return _View(t.space, (n, g) + (1,) * pad + t.valid, t.dtype.np_dtype, t.addr,
                 (stride, 0) + (0,) * pad + tile_strides(t.shape, t.dtype))


def _gm_spec(r: GMRef, task_step: int, n: int, g: int, g_step: int, rank: int, dtype) -> _View:
    item, pad = dtype.itemsize, rank - len(r.shape)
    return _View(("GM", r.buf.name), (n, g) + (1,) * pad + r.shape, dtype, r.offset * item,
                 (task_step * item, g_step * item) + (0,) * pad + tuple(s * item for s in r.strides))


def _exact_box(r: GMRef):
    """Per-buffer-dim ranges of exactly the elements of a window, or None (`GMRef.exact_box`)."""
    return r._exact


def _box(r: GMRef) -> tuple[tuple[int, int], ...]:
    """Per-buffer-dim ranges a window touches: exact, or a bounding box of whole rows."""
    return r._touched


def _scan(instrs, caps, sizes, forms=None):
    """(key, bases, GM accesses) of a task's instruction stream, or None when a tile lies outside
    its space or a window outside its buffer (the reference interpreter then reports where).

    Tasks with equal keys run the same instructions on the same tiles, with each buffer's windows
    moved by the difference of their bases (the offset of the task's first window in the buffer).
    An access is (buffer, box, written).  The key is a number per instruction, its form's in
    `forms` (shared by the tasks of a program: {"rows": row -> number, "ids": id of an
    instruction without GM operands, checked -> its number})."""
    if forms is None:
        forms = {"rows": {}, "ids": {}}
    rows, ids = forms["rows"], forms["ids"]
    base: dict[str, int] = {}
    key, accesses, tiles = [], set(), set()     # (tiles: those found inside their space)
    for i in instrs:
        known = ids.get(id(i))
        if known is not None:       # (an on-chip instruction: one object for many tiles and tasks)
            key.append(known)
            continue
        dst = i.dst
        row = [i.op, i.attrs]
        gm = False
        for o in (dst, *i.srcs) if i.srcs else (dst,):
            if type(o) is TileRef:
                if o not in tiles:
                    if not (o.space in caps and 0 <= o.addr and o.addr + o.nbytes <= caps[o.space]):
                        return None
                    tiles.add(o)
                row.append(o)
            elif isinstance(o, GMRef):
                lo, hi = o._span
                name = o.buf.name
                size = sizes.get(name)
                if size is None or lo < 0 or hi > size:
                    return None
                at = base.get(name)
                if at is None:
                    at = base[name] = o.offset
                row.append((name, o.shape, o.strides, o.offset - at))
                accesses.add((name, o._touched, o is dst))
                gm = True
            else:
                row.append((type(o), repr(o)))
        number = rows.setdefault(tuple(row), len(rows))
        if not gm:
            ids[id(i)] = number
        key.append(number)
    return tuple(key), base, accesses


def _reads_own_writes(rules, caps) -> bool:
    """Whether every on-chip byte the instruction stream reads was written earlier by it."""
    written = {s: np.zeros(c, np.bool_) for s, c in caps.items()}
    views: dict[TileRef, np.ndarray] = {}

    def view(t):
        v = views.get(t)
        if v is None:
            v = views[t] = _tile_bytes(written[t.space], t)
        return v
    full: set = set()           # tiles whose bytes are all written by now (the mask only grows)
    for _, (dst, *srcs), _ in rules:
        for s in srcs:
            if isinstance(s, TileRef) and s not in full:
                if not view(s).all():
                    return False
                full.add(s)
        if isinstance(dst, TileRef) and dst not in full:
            view(dst)[...] = True
            full.add(dst)
    return True


# --- rewriting a stream ---------------------------------------------------------------------------
# When tasks read only their own on-chip writes, on-chip data is dead once overwritten or at the
# end of the task.  A load or extract (tile <- source) whose tile is read whole until overwritten
# can be dropped, its readers reading the source; a store (GM <- tile) can make the tile's
# producer write GM directly.  Operands then become views of other memory, with the same dtype,
# shape and row-major order, so every numpy call computes the same values.
#
# A rule is (handler, operands, k): operands (dst, *srcs) as decoded, k the number of the
# instruction it comes from (for errors).  The searches for a store's producer and for what reads
# a tile before it is overwritten look at most WINDOW instructions away (a loop body's distance):
# farther, the copy stays, so rewriting costs O(WINDOW) per instruction; a copy's readers are
# found through an index of the rules that touch each tile, however far (a panel kept in L1
# across output tiles): its cost is the tile's readers.  Fusion orders the stream by levels of
# dependence through memory, found with an array of levels per space and GM buffer: O(bytes
# touched).

WINDOW = 256


def _overlaps(a: TileRef, b: TileRef) -> bool:
    """Whether two tiles' valid elements may share bytes (`TileRef.extent`: a window of a panel
    has the panel's row pitch, so its `nbytes` would run into the next tile of the space)."""
    if a.space != b.space:
        return False
    (alo, ahi), (blo, bhi) = a.extent, b.extent
    return alo < bhi and blo < ahi


def _touches(o, x) -> bool:
    """Whether operand o may share memory with x (a tile or a GM window).  Windows of one task
    are compared in the stream's first task: in every task of the stream, each buffer's windows
    are moved by the same offset, so they overlap alike."""
    if isinstance(x, TileRef):
        return isinstance(o, TileRef) and _overlaps(o, x)
    return isinstance(o, _GM) and o.ref.buf.name == x.ref.buf.name and all(
        lo < h and l2 < hi for (lo, hi), (l2, h) in zip(_box(o.ref), _box(x.ref)))


def _same(o, x) -> bool:
    return type(o) is type(x) and o == x


def _relays(t, s) -> bool:
    """Whether s can stand in for tile t: same dtype and shape, row-major, separate memory."""
    if not isinstance(t, TileRef) or _dtype(t) != _dtype(s) or _shape(t) != _shape(s) or _touches(s, t):
        return False
    if isinstance(s, TileRef):
        return True
    dims = [(n, st) for n, st in zip(s.ref.shape, s.ref.strides) if n > 1]
    return all(st >= n2 * st2 for (_, st), (n2, st2) in zip(dims, dims[1:])) and (not dims or dims[-1][1] == 1)


def _replace(rule, old, new):
    f, (dst, *srcs), k = rule
    return f, (dst, *(new if _same(o, old) else o for o in srcs)), k


@functools.lru_cache(maxsize=1 << 16)
def _part_of(o: TileRef, t: TileRef) -> tuple | None:
    """The element offsets in tile t of tile o when o's valid elements are some of t's (same
    space, dtype and row pitch: a TEXTRACT's source window of an L1 panel), else None."""
    if not (o.space == t.space and o.dtype == t.dtype and len(o.valid) == len(t.valid)):
        return None
    strides = tile_strides(t.shape, t.dtype)
    if tile_strides(o.shape, o.dtype) != strides or o.addr < t.addr:
        return None
    rest, starts = o.addr - t.addr, []
    for st in strides:
        i, rest = divmod(rest, st)
        starts.append(i)
    if rest or any(i + n > m for i, n, m in zip(starts, o.valid, t.valid)):
        return None
    return tuple(starts)


def _sub_window(o, t: TileRef, s: _GM) -> _GM | None:
    """What a read of tile o reads in window s when o lies inside tile t and t holds a copy of s
    (a TEXTRACT's source window of a loaded L1 panel): the window of s at o's element offsets in
    t, o's shape; None when o is not such a part of t."""
    starts = _part_of(o, t) if type(o) is TileRef else None
    if starts is None:
        return None
    ref = s.ref.window(starts, o.valid)
    if s.sub is not None:           # a part of a part: offsets add (the strides are the window's)
        starts = [i + j for i, j in zip(starts, s.sub[0])]
    return s._replace(ref=ref, sub=(tuple(starts), o.valid))


def _relayed(rule, t: TileRef, s):
    """Rule with its reads of tile t, whole or in part, reading s instead (see `_readers`)."""
    f, (dst, *srcs), k = rule
    return f, (dst, *(s if _same(o, t) else _sub_window(o, t, s) if isinstance(o, TileRef) and _overlaps(o, t)
                      else o for o in srcs)), k


def _sink(rules, k) -> None:
    """Store k (w <- t): t's producer writes w instead, and k becomes the copy t <- w."""
    _, (w, t), kk = rules[k]
    readers = []
    for p in range(k - 1, max(k - 1 - WINDOW, -1), -1):
        f, (dst, *srcs), kp = rules[p]
        if _touches(dst, w) or any(_touches(o, w) for o in srcs):
            return                              # w's buffer is used before the store
        if isinstance(dst, TileRef) and _overlaps(dst, t):
            if _same(dst, t):
                rules[p] = (f, (w, *srcs), kp)
                for j in readers:
                    rules[j] = _replace(rules[j], t, w)
                rules[k] = (_assign, (t, w), kk)
            return
        if any(isinstance(o, TileRef) and _overlaps(o, t) and not _same(o, t) for o in srcs):
            return
        if any(_same(o, t) for o in srcs):
            readers.append(p)


def _readers(rules, k, t, s, touching: dict, gm_writers: list) -> list[int] | None:
    """The instructions after copy k (t <- s) that read t, if each can read s instead: t is read
    whole (or, s being a GM window, in parts that are windows of s: `_sub_window`) until
    overwritten whole, or in part with the rest never read again (or the stream ends), and s
    does not change in the meantime.  Only the rules that can matter are looked at, however far:
    those touching t or s (`_touching`) or writing GM (`gm_writers`: the sorted indices of the
    rules that write GM or are loops)."""
    readers, changed = [], False
    parts = isinstance(s, _GM)
    for j in _merged(touching[t], gm_writers if parts else touching.get(s, ()), k):
        dst, *srcs = rules[j][1]
        reads = [o for o in srcs if isinstance(o, TileRef) and _overlaps(o, t)]
        if reads:
            if changed or not all(_same(o, t) or (parts and _part_of(o, t) is not None) for o in reads):
                return None
            readers.append(j)
        if isinstance(dst, TileRef) and _overlaps(dst, t):
            if _same(dst, t):
                return readers
            # overwritten in part (a tail tile loaded into t's slot): the readers so far may read
            # s if what is left of t is never read
            return readers if _rest_dead(rules, j, t, dst, touching[t]) else None
        changed = changed or _touches(dst, s) or (_is_loop(rules[j][0]) and any(_touches(o, s) for o in srcs))
    return readers


def _rest_dead(rules, j, t: TileRef, w: TileRef, touching: list) -> bool:
    """Whether no rule after j reads a byte of tile t that rule j, writing tile w, leaves, before
    that byte is overwritten (the stream's end: on-chip data dies with its task).  `touching`:
    the sorted indices of the rules with an operand overlapping t (`_touching`)."""
    later = touching[bisect.bisect_right(touching, j):]
    tiles = [o for i in later for o in rules[i][1] if type(o) is TileRef and o.space == t.space]
    mask = np.zeros(max([o.extent[1] for o in tiles + [t, w]]), np.bool_)
    _tile_bytes(mask, t)[...] = True
    _tile_bytes(mask, w)[...] = False
    for i in later:
        dst, *srcs = rules[i][1]
        if any(type(o) is TileRef and o.space == t.space and _tile_bytes(mask, o).any() for o in srcs):
            return False
        if type(dst) is TileRef and dst.space == t.space:
            _tile_bytes(mask, dst)[...] = False
            if not mask.any():
                return True
    return True


def _merged(a: list, b, k: int):
    """The distinct numbers after k of two sorted lists, in order (lazily: a search stops early)."""
    i, j = bisect.bisect_right(a, k), bisect.bisect_right(b, k)
    na, nb = len(a), len(b)
    while i < na or j < nb:
        if j >= nb or (i < na and a[i] <= b[j]):
            x = a[i]
            i += 1
            if j < nb and b[j] == x:
                j += 1
        else:
            x = b[j]
            j += 1
        yield x


def _elide_copies(rules) -> list:
    """The stream without the copies that only relay data: stores are sunk into their producers
    first, leaving copies (tile <- GM) that the second sweep drops along with loads and extracts."""
    rules = list(rules)
    for k, (f, operands, _) in enumerate(rules):
        if f is _assign and isinstance(operands[0], _GM) and _relays(operands[1], operands[0]):
            _sink(rules, k)
    touching = _touching(rules)
    gm_writers = [j for j, (f, (dst, *_), _) in enumerate(rules) if isinstance(dst, _GM) or _is_loop(f)]
    for k, (f, operands, _) in enumerate(rules):
        readers = (_readers(rules, k, *operands, touching, gm_writers) if f is _assign and _relays(*operands)
                   else None)
        if readers is not None:
            for j in readers:
                rules[j] = _relayed(rules[j], *operands)
            rules[k] = (None, operands, None)   # dropped (later rules never look back at it)
    return [r for r in rules if r[0] is not None]


def _tile_bytes(mask: np.ndarray, t: TileRef) -> np.ndarray:
    """The bytes of a tile's valid elements in a byte mask of its space (or of another array of
    the space's bytes: `mask.itemsize` per byte)."""
    item = mask.itemsize
    return np.ndarray(t.valid + (t.dtype.itemsize,), mask.dtype, buffer=mask, offset=t.addr * item,
                      strides=tuple(s * item for s in tile_strides(t.shape, t.dtype)) + (item,))


def _touching(rules) -> dict:
    """Tile -> the sorted indices of the rules with an operand overlapping it (or that had one:
    the rewrites only ever replace tiles by GM windows, so the lists stay a superset)."""
    at: dict[TileRef, list[int]] = {}
    for j, (_, operands, _) in enumerate(rules):
        for o in operands:
            if type(o) is TileRef:
                at.setdefault(o, []).append(j)
    by_space: dict[str, list[TileRef]] = {}
    for u in at:
        by_space.setdefault(u.space, []).append(u)
    out = {}
    for u in at:
        hits = [at[v] for v in by_space[u.space] if _overlaps(u, v)]
        out[u] = sorted(set().union(*hits)) if len(hits) > 1 else hits[0]
    return out


def _dead_after(rules, k, t, live, touching=None, views=None) -> bool:
    """Whether no instruction after k reads a byte of tile t before it is overwritten (within
    WINDOW instructions, else presumed read).  `live` is a clear byte mask of t's space, left clear.
    The mask is only filled once an instruction touches part of t: t itself read or overwritten
    whole first answers at once.  `touching` (see `_touching`) skips the rules that cannot;
    `views` keeps the tiles' views of `live` from call to call."""
    end = min(len(rules), k + 1 + WINDOW)
    if views is None:
        views = {}

    def _bytes(o):
        v = views.get(o)
        if v is None:
            v = views[o] = _tile_bytes(live, o)
        return v
    span = None                     # t's bytes in the mask, once marked
    dead = True
    if touching is None:
        candidates = range(k + 1, end)
    else:
        at = touching.get(t, ())
        lo, hi = bisect.bisect_right(at, k), bisect.bisect_left(at, end)
        candidates = at[lo:hi]

    def mark():
        _bytes(t)[...] = True
        return live[t.addr:t.addr + t.nbytes]
    for j in candidates:
        dst, *srcs = rules[j][1]
        for o in srcs:
            if isinstance(o, TileRef) and _overlaps(o, t):
                if span is None:
                    if _same(o, t):
                        return False
                    span = mark()
                if _bytes(o).any():
                    dead = False
                    break
        if not dead:
            break
        if isinstance(dst, TileRef) and _overlaps(dst, t):
            if span is None:
                if _same(dst, t):
                    return True
                span = mark()
            _bytes(dst)[...] = False
            if not span.any():
                break
    else:
        dead = end == len(rules) or (span is not None and not span.any())
    if span is not None:
        span[...] = False
    return dead


def _elementwise_op(f) -> bool:
    return isinstance(f, partial) and f.func in (_into, _via) and f.args[0] in ELEMENTWISE


def _chain(rules, caps) -> list:
    """Element-wise instructions writing GM from a tile that dies with them take the tile's
    producer along: the producer writes the GM window and the instruction runs in place there
    (p: t = g(..); k: w = f(t, ..)  ->  p: w = g(..); k: w = f(w, ..)), so both have GM operands
    only and can be fused.  From the last instruction back, so chains of producers follow."""
    rules, live, views = list(rules), {}, {}
    touching = _touching(rules)
    for k in range(len(rules) - 1, -1, -1):
        f, (w, *srcs), _ = rules[k]
        if not (_elementwise_op(f) and isinstance(w, _GM)):
            continue
        for t in dict.fromkeys(o for o in srcs if isinstance(o, TileRef) and _relays(o, w)):
            others = [o for o in srcs if not _same(o, t)]
            mask = live.get(t.space)
            if mask is None:
                mask = live[t.space] = np.zeros(caps[t.space], np.bool_)
                views[t.space] = {}
            if any(_touches(o, w) for o in others) or not _dead_after(rules, k, t, mask, touching,
                                                                     views[t.space]):
                continue
            for p in range(k - 1, max(k - 1 - WINDOW, -1), -1):
                g, (dst, *psrcs), kp = rules[p]
                if _touches(dst, w) or any(_touches(o, w) or (isinstance(o, TileRef) and _overlaps(o, t))
                                           for o in psrcs):
                    break
                if isinstance(dst, TileRef) and _overlaps(dst, t):
                    if _same(dst, t):
                        rules[p] = (g, (w, *psrcs), kp)
                        rules[k] = _replace(rules[k], t, w)
                    break
            f, (w, *srcs), _ = rules[k]
    return rules


def _dependence_levels(rules, caps) -> list[int]:
    """Per rule: 0, or one more than the highest level of an earlier rule sharing memory with it,
    one of the two writing (read after write, write after read or write).  Rules of one level
    are independent of each other: running the levels in order gives the stream's results.
    Found with the levels (+1) of who last wrote and the latest who read each byte of each space
    and element of each GM buffer the stream writes (over the span of its windows there): per
    footprint (the bytes or elements an operand covers) where the stream's footprints in that
    memory are each either the very same or apart (a matmul's tiles and windows: then every byte
    of a footprint always holds the same levels), else in arrays per byte or element."""
    spans: dict[str, list[int]] = {}
    written = {d.ref.buf.name for _, (d, *_), _ in rules if isinstance(d, _GM)}
    written |= {o.ref.buf.name for f, (_, *hulls), _ in rules if _is_loop(f) for o in hulls}
    for _, operands, _ in rules:
        for o in operands:
            if isinstance(o, _GM) and o.ref.buf.name in written:
                lo, hi = o.ref.span()
                s = spans.setdefault(o.ref.buf.name, [lo, hi])
                s[0], s[1] = min(s[0], lo), max(s[1], hi)
    arrays = {k: hi - lo for k, (lo, hi) in spans.items()}
    for s in {o.space for _, operands, _ in rules for o in operands if isinstance(o, TileRef)}:
        arrays[s] = caps[s]

    def footprint(o):
        """(memory, footprint key, its view of an array of the memory) of an operand; None for
        one no level is kept for (a constant, a window of a buffer the stream only reads)."""
        if isinstance(o, TileRef):
            return o.space, (o.addr, o.valid, tile_strides(o.shape, o.dtype)), lambda a: _tile_bytes(a, o)
        if isinstance(o, _GM) and o.ref.buf.name in spans:
            r = o.ref
            at = r.offset - spans[r.buf.name][0]
            return r.buf.name, (r.offset, r.shape, r.strides), lambda a: np.ndarray(
                r.shape, a.dtype, a, at * a.itemsize, tuple(x * a.itemsize for x in r.strides))
        return None

    # the footprints of each memory, painted one by one: one that meets a painted one (not the
    # very same) leaves the memory to the arrays
    prints: dict[str, dict] = {m: {} for m in arrays}
    seen: dict = {}                 # operand -> (memory, key, view maker)
    for _, operands, _ in rules:
        for o in operands:
            if isinstance(o, (TileRef, _GM)) and o not in seen:
                fp = seen[o] = footprint(o)
                if fp is not None and fp[1] not in prints[fp[0]]:
                    prints[fp[0]][fp[1]] = fp[2]
    coarse = set()
    for m, fps in prints.items():
        paint = np.zeros(arrays[m], np.int32)
        for j, make in enumerate(fps.values(), 1):
            v = make(paint)
            if v.any():
                break
            v[...] = j
        else:
            coarse.add(m)
    wrote = {m: ({} if m in coarse else np.zeros(arrays[m], np.int32)) for m in arrays}
    read = {m: ({} if m in coarse else np.zeros(arrays[m], np.int32)) for m in arrays}
    # per operand with levels: (wrote, read, key): the memory's dicts and its footprint's key, or
    # the memory's arrays' views of it and None
    handles = {o: (wrote[m], read[m], key) if m in coarse else (make(wrote[m]), make(read[m]), None)
               for o, (m, key, make) in ((o, fp) for o, fp in seen.items() if fp is not None)}

    def handle(o):
        return handles.get(o) if isinstance(o, (TileRef, _GM)) else None

    def top(levels, key) -> int:
        return levels.get(key, 0) if key is not None else int(levels.max(initial=0))

    def raise_to(levels, key, level: int) -> None:
        if key is None:
            np.maximum(levels, level, out=levels)
        elif levels.get(key, 0) < level:
            levels[key] = level

    def set_to(levels, key, level: int) -> None:
        if key is None:
            levels[...] = level
        else:
            levels[key] = level

    levels = []
    for f, (dst, *srcs), _ in rules:
        if _is_loop(f):             # a loop run as groups: as if it read and wrote all it touches
            outs = [h for h in map(handle, srcs) if h is not None]
            level = max((max(top(w, k), top(r, k)) for w, r, k in outs), default=0)
            for w, r, k in outs:
                set_to(w, k, level + 1)
                raise_to(r, k, level + 1)
            levels.append(level)
            continue
        ins = [h for h in map(handle, srcs) if h is not None]
        out = handle(dst)
        level = max((top(w, k) for w, _, k in ins), default=0)
        if out is not None:
            level = max(level, top(out[0], out[2]), top(out[1], out[2]))
        for _, r, k in ins:
            raise_to(r, k, level + 1)
        if out is not None:
            set_to(out[0], out[2], level + 1)
        levels.append(level)
    return levels


def _const_key(o):
    if isinstance(o, np.ndarray):
        return ("array", o.dtype.str, o.shape, o.tobytes())
    return (type(o), repr(o))


def _signature(rule):
    """What fused rules share: the handler, the tiles and constants, each GM operand's buffer,
    shape and strides (its offset may move)."""
    f, operands, _ = rule
    key = (f.func, f.args, tuple(f.keywords.items())) if isinstance(f, partial) else f
    return (key,) + tuple(o if isinstance(o, TileRef) else ("GM", o.ref.buf.name, o.ref.shape, o.ref.strides)
                          if isinstance(o, _GM) else _const_key(o) for o in operands)


def _fuse(rules, caps, loops=None) -> list:
    """(handler, operands, g, k): rules that repeat with only their GM windows moved (the
    iterations of a loop over tiles) run as one numpy call over a group axis of g; numpy then
    sees whole rows where the program has tiles.  The stream runs level by level (see
    _dependence_levels); within a level, rules of one signature whose GM windows are evenly spaced
    (one step per operand, from each to the next) form a group.  A group writes GM: two rules
    writing one tile are never of one level."""
    levels = _dependence_levels(rules, caps)
    by_level: dict[int, list[int]] = {}
    for i, lv in enumerate(levels):
        by_level.setdefault(lv, []).append(i)
    out = []
    for lv in sorted(by_level):
        runs, open_ = [], {}                    # signature -> its latest run [members, steps]
        for i in by_level[lv]:
            sig = _signature(rules[i])
            offsets = tuple(o.ref.offset for o in rules[i][1] if isinstance(o, _GM))
            run = open_.get(sig)
            if run is not None:
                diff = tuple(a - b for a, b in zip(offsets, run[2]))
                if run[1] is None or diff == run[1]:
                    run[0].append(i)
                    run[1], run[2] = diff, offsets
                    continue
            run = open_[sig] = [[i], None, offsets]
            runs.append(run)
        for members, steps, _ in runs:
            f, first, k = rules[members[0]]
            if _is_loop(f):         # (a marker's signature is its own: alone in its run)
                out.extend(loops[f.args[0]])
                continue
            steps = iter(steps or ())
            out.append((f, tuple(o._replace(step=next(steps)) if isinstance(o, _GM) and len(members) > 1 else o
                                 for o in first), len(members), k))
    return out


# --- loops of a stream ------------------------------------------------------------------------------
# A task's loops (ir.exec.Loop, from the compiler's `loops` pass) repeat a body with only its GM
# windows moved.  With on-chip data private to the task, a loop whose body is self-contained on
# chip (each iteration reads only bytes it wrote itself), whose rewritten body (copies elided,
# chains) has GM operands only, and whose iterations touch disjoint elements of what it writes,
# runs as one numpy call per rule of its body over a group axis of its iterations: the body is
# decoded and rewritten once, not once per iteration.  In the stream around it the loop is one
# rule, a marker that touches the bounding box of every window its iterations touch (as if it
# read and wrote them); nothing after it may read on-chip bytes it wrote.  Any other loop is
# unrolled into the stream.

MIN_GROUPED = 4                 # fewer iterations: unrolled (the stream's own fusion groups them)
MAX_GROUPED_ELEMENTS = 1 << 24  # elements a loop's disjointness check looks at, at most


def _loop_marker(j):            # never called: its partial marks the j-th grouped loop of a stream
    raise AssertionError("a loop marker is expanded by _fuse")


def _is_loop(f) -> bool:
    return isinstance(f, partial) and f.func is _loop_marker


def _entries(code) -> list[tuple]:
    """A task's items as (k0, count, n): `count` runs of `n` non-sync instructions from the k0-th
    (of the task's non-sync instructions, unrolled) for each innermost loop; (k, 1, 1) for an
    instruction outside them (the iterations of the loops around inner loops are walked)."""
    out = []

    def walk(items, k: int) -> int:
        for it in items:
            if isinstance(it, Loop):
                # walked iteration by iteration: loops around inner loops, and loops whose tiles
                # move (`addr_step`: a grouped run reads the same tiles in every iteration)
                if any(isinstance(x, Loop) or ADDR_STEP in x.attrs for x in it.body):
                    for _ in range(it.count):
                        k = walk(it.body, k)
                    continue
                n = sum(1 for x in it.body if x.op not in SYNC_OPS)
                if n:
                    out.append((k, it.count, n))
                k += it.count * n
            elif it.op not in SYNC_OPS:
                out.append((k, 1, 1))
                k += 1
        return k
    walk(code, 0)
    return out


class _Instrs(list):
    """A task's non-sync instructions, with the rules decoded from them so far (`_rule`): the
    privacy check, the rotation of loops and the rewriting read the same rules (immutable)."""

    def __init__(self, instrs, decoded: dict | None = None):
        super().__init__(instrs)
        self.rules: dict[int, tuple] = {}
        # id of an instruction without GM operands -> its (handler, operands): shared by the
        # tasks of a plan (the program keeps the instructions alive while it is built)
        self.decoded = {} if decoded is None else decoded


def _rule(instrs: _Instrs, k):
    r = instrs.rules.get(k)
    if r is None:
        ins = instrs[k]
        hit = instrs.decoded.get(id(ins))      # (an on-chip instruction: one object for many tiles, tasks)
        if hit is None:
            f, ops = decode(ins)
            if any(isinstance(o, GMRef) for o in ops):
                ops = tuple(_GM(k, p, o) if isinstance(o, GMRef) else o for p, o in enumerate(ops))
                return instrs.rules.setdefault(k, (f, ops, k))
            hit = instrs.decoded[id(ins)] = (f, tuple(ops))
        r = instrs.rules[k] = (*hit, k)
    return r


def _once(entries, instrs) -> list:
    """The stream's rules with each loop's body once: enough to tell whether the task reads
    only its own on-chip writes (a later iteration reads the tiles the first one read)."""
    return [_rule(instrs, k0 + j) for k0, _, n in entries for j in range(n)]


def _stream_rules(entries, instrs, caps) -> list:
    """The rewritten rules of a private stream, (handler, operands, g, k), its loops grouped
    where they can be (see above)."""
    entries = _rotated(entries, instrs, caps)
    rules, loops = [], []
    for e, (k0, count, n) in enumerate(entries):
        grouped = None
        if count >= MIN_GROUPED:
            body = [_rule(instrs, k0 + j) for j in range(n)]
            grouped = _grouped(body, count, n, instrs, caps)
            if grouped is not None and not _unread_after(body, entries[e + 1:], instrs, caps):
                grouped = None
        if grouped is None:
            rules.extend(_rule(instrs, k0 + j) for j in range(count * n))
            continue
        group_rules, hulls = grouped
        rules.append((partial(_loop_marker, len(loops)), (None, *hulls), k0))
        loops.append(group_rules)
    return _fuse(_chain(_elide_copies(rules), caps), caps, loops)


def _alike(a: Instr, b: Instr) -> bool:
    """The same instruction but for its GM windows' offsets."""
    return a.op == b.op and a.attrs == b.attrs and all(
        (isinstance(x, GMRef) and isinstance(y, GMRef) and x.buf is y.buf and x.shape == y.shape
         and x.strides == y.strides) or x is y or (not isinstance(x, GMRef) and x == y)
        for x, y in zip((a.dst, *a.srcs), (b.dst, *b.srcs)))


def _rotated(entries, instrs, caps) -> list:
    """The entries with each loop whose body is not self-contained on chip started earlier,
    when that makes it so: a software-pipelined loop loads the next tile at the end of its body,
    and the instructions before the loop are its first iteration's last ones.  The loop then
    starts m instructions earlier (the m before it are its first iteration's start) and its last
    iteration's last m instructions follow it."""
    out = list(entries)
    e = 0
    while e < len(out):
        k0, count, n = out[e]
        if count >= MIN_GROUPED and n > 1:
            body = [_rule(instrs, k0 + j) for j in range(n)]
            if not _reads_own_writes(body, caps):
                before = 0              # plain instructions right before the loop
                while before < min(e, n - 1) and out[e - before - 1] == (k0 - before - 1, 1, 1):
                    before += 1
                for m in range(1, before + 1):
                    if not _alike(instrs[k0 - m], instrs[k0 - m + n]):
                        break
                    if _reads_own_writes([_rule(instrs, k0 - m + j) for j in range(n)], caps):
                        end = k0 + count * n
                        out[e - m:e + 1] = [(k0 - m, count, n)] + [(k, 1, 1) for k in range(end - m, end)]
                        e -= m
                        break
        e += 1
    return out


def _grouped(body, count, n, instrs, caps):
    """(the body's rules over a group axis of `count`, the marker's hull windows) of a loop, or
    None when it cannot run that way."""
    for j in range(n):          # every iteration: the same instruction but for its GM windows
        a = instrs[body[j][2]]
        if not (_alike(a, instrs[body[j][2] + n]) and _alike(a, instrs[body[j][2] + (count - 1) * n])):
            return None
    if not _reads_own_writes(body, caps):
        return None
    rewritten = _chain(_elide_copies(body), caps)
    if any(isinstance(o, TileRef) for _, ops, _ in rewritten for o in ops):
        return None
    out, hulls, touched = [], {}, {}
    for f, ops, k in rewritten:
        moved = []
        for p, o in enumerate(ops):
            if not isinstance(o, _GM):
                moved.append(o)
                continue
            first = o.ref
            second, last = (o.window(instrs[o.k + i * n]) for i in (1, count - 1))
            step = second.offset - first.offset
            if last.offset != first.offset + (count - 1) * step or first.strides != last.strides:
                return None
            moved.append(o._replace(step=step))
            _hull(hulls, first, last)
            touched.setdefault(first.buf.name, []).append((first, step, p == 0))
        out.append((f, tuple(moved), count, k))
    if not _iterations_apart(touched, count):
        return None
    return out, [_GM(-1, -1, h) for h in _hull_refs(hulls)]


def _hull(hulls: dict, first: GMRef, last: GMRef) -> None:
    """Grow the bounding box (per buffer dim) of what a buffer's windows touch."""
    name = first.buf.name
    box = [(min(a, c), max(b, d)) for (a, b), (c, d) in zip(_box(first), _box(last))]
    had = hulls.get(name)
    hulls[name] = (first.buf, box if had is None else [(min(a, c), max(b, d)) for (a, b), (c, d) in zip(had[1], box)])


def _hull_refs(hulls: dict) -> list[GMRef]:
    out = []
    for buf, box in hulls.values():
        strides = natural_strides(buf.shape)
        out.append(GMRef(buf, sum(lo * st for (lo, _), st in zip(box, strides)),
                         tuple(hi - lo for lo, hi in box), strides))
    return out


def _iterations_apart(touched: dict, count: int) -> bool:
    """Whether no element of a buffer the loop writes is touched by two of its iterations."""
    total = 0
    for name, accs in touched.items():
        if not any(w for _, _, w in accs):
            continue
        elems, iters, writes = [], [], []
        for ref, step, w in accs:
            grid = np.zeros(1, np.int64) + ref.offset
            for size, stride in zip(ref.shape, ref.strides):
                grid = (grid[:, None] + np.arange(size, dtype=np.int64) * stride).ravel()
            total += grid.size * count
            if total > MAX_GROUPED_ELEMENTS:
                return False
            it = np.arange(count, dtype=np.int64)
            elems.append((grid[None, :] + it[:, None] * step).ravel())
            iters.append(np.repeat(it, grid.size))
            writes.append(np.full(grid.size * count, w))
        e, i, w = np.concatenate(elems), np.concatenate(iters), np.concatenate(writes)
        order = np.argsort(e, kind="stable")
        e, i, w = e[order], i[order], w[order]
        starts = np.flatnonzero(np.r_[True, e[1:] != e[:-1]])
        lo, hi = np.minimum.reduceat(i, starts), np.maximum.reduceat(i, starts)
        written = np.logical_or.reduceat(w, starts)
        if (written & (lo != hi)).any():
            return False
    return True


def _unread_after(body, later, instrs, caps) -> bool:
    """Whether no instruction after the loop reads an on-chip byte the loop's body writes before
    it is overwritten (loops after it looked at once: a later iteration reads what the first
    one read)."""
    pending = {}
    for _, (dst, *_), _ in body:
        if isinstance(dst, TileRef):
            mask = pending.get(dst.space)
            if mask is None:
                mask = pending[dst.space] = np.zeros(caps[dst.space], np.bool_)
            _tile_bytes(mask, dst)[...] = True
    for k0, _, n in later:
        for k in range(k0, k0 + n):
            ins = instrs[k]         # (a TEXTRACT's whole source tile: at least what it reads)
            dst, srcs = ins.dst, ins.srcs
            for o in srcs:
                if isinstance(o, TileRef) and o.space in pending and _tile_bytes(pending[o.space], o).any():
                    return False
            if isinstance(dst, TileRef) and dst.space in pending:
                _tile_bytes(pending[dst.space], dst)[...] = False
        if not any(m.any() for m in pending.values()):
            return True
    return True


def _unobserved(buffers, instrs_of, on_chip=()) -> frozenset[str]:
    """GM buffers whose contents at the start never show: no element is read before the program
    writes it and, unless the buffer is a workspace (not returned), every element is written.
    Followed in program order, whose results the plan's order keeps; a window that is not exact
    counts as read in its bounding box and as not written.  `on_chip`: ids of instructions
    without GM operands (skipped)."""
    written: dict[str, np.ndarray] = {}
    seen: set[str] = set()
    for instrs in instrs_of:
        for i in instrs:
            if id(i) in on_chip:
                continue
            # (an MSCATTER reads what it does not overwrite: its window counts as read)
            for r in i.srcs + ((i.dst,) if _kind(i.op) == "scatter" else ()):
                if isinstance(r, GMRef) and r.buf.name not in seen:
                    mask = written.get(r.buf.name)
                    if mask is None or not mask[tuple(slice(*b) for b in _box(r))].all():
                        seen.add(r.buf.name)
            w = i.dst
            box = _exact_box(w) if isinstance(w, GMRef) and w.buf.name not in seen else None
            if box is not None:
                mask = written.get(w.buf.name)
                if mask is None:        # (not setdefault: its default, a buffer-sized array, is made every call)
                    mask = written[w.buf.name] = np.zeros(w.buf.shape, np.bool_)
                mask[tuple(slice(*b) for b in box)] = True
    return frozenset(b.name for b in buffers if b.name not in seen and (
        b.role == "workspace" or (b.name in written and written[b.name].all())))


# --- ordering and batching -----------------------------------------------------------------------

def _levels(tasks, accesses, buffers) -> list[int]:
    """Per task: 0, or 1 + the highest level of the earlier tasks it depends on or conflicts with in
    GM (touching common elements, one of the two writing).  Kept per element of each GM buffer a
    task writes: the highest level (+1) of a task that wrote it, and of one that read it."""
    index = {t.id: i for i, t in enumerate(tasks)}
    written = {name for acc in accesses for name, _, write in acc if write}
    shapes = {b.name: b.shape for b in buffers if b.name in written}
    wrote = {name: np.zeros(shape, np.int32) for name, shape in shapes.items()}
    read = {name: np.zeros(shape, np.int32) for name, shape in shapes.items()}
    level = []
    for t, acc in zip(tasks, accesses):
        boxes = [(name, tuple(slice(*r) for r in box), write) for name, box, write in acc if name in wrote]
        lv = max((level[index[d]] + 1 for d in t.deps if d in index), default=0)
        for name, box, write in boxes:
            lv = max(lv, int(wrote[name][box].max(initial=0)))
            if write:
                lv = max(lv, int(read[name][box].max(initial=0)))
        for name, box, write in boxes:
            target = (wrote if write else read)[name][box]
            np.maximum(target, lv + 1, out=target)
        level.append(lv)
    return level


def _batches(tasks, buffers, stream_of, bases, accesses, rules, caps) -> list[list[int]]:
    """Tasks run together: same stream and level, GM windows evenly spaced from one task to the
    next, at most MAX_BATCH tasks and REUSED_BYTES of on-chip copies."""
    level = _levels(tasks, accesses, buffers)
    groups: dict[tuple, list[int]] = {}
    for i in sorted(range(len(tasks)), key=lambda i: (level[i], i)):
        if rules[stream_of[i]]:
            groups.setdefault((level[i], stream_of[i]), []).append(i)
    out = []
    for members in groups.values():
        spaces = {o.space for _, operands, *_ in rules[stream_of[members[0]]] for o in operands
                  if isinstance(o, TileRef)}
        size = max(1, min(MAX_BATCH, REUSED_BYTES // max(1, sum(caps[s] for s in spaces))))
        run, step = [members[0]], None
        for m in members[1:]:
            s = {b: bases[m][b] - bases[run[-1]][b] for b in bases[m]}
            if len(run) < size and step in (None, s):
                run.append(m)
                step = s
            else:
                out.append(run)
                run, step = [m], None
        out.append(run)
    return out


class Plan:
    """The program as a list of (handler, operand specs), run over per-run arrays."""

    def __init__(self, ops, origins, scratch: dict[str, int], private: bool, unobserved: frozenset[str],
                 widened: dict | None = None):
        self.ops = ops                  # [(handler, (_View | constant, ...)), ...]
        self.origins = origins          # per op: (task id, instruction) it runs (the first of a batch, group)
        self.scratch = scratch          # space -> bytes of its copies
        self.private = private          # tasks read only their own on-chip writes
        self.unobserved = unobserved    # GM buffers whose first contents do not matter
        self.widened = widened or {}    # GM buffer -> the dtype its matmul factors are read in

    def run(self, gm: dict[str, np.ndarray]) -> None:
        buffers = {("GM", name): a for name, a in gm.items()}
        for name, w in self.widened.items():
            buffers[("GM", name, "widened")] = widened(gm[name], w)
        for space, nbytes in self.scratch.items():
            buffers[space] = reused(space, nbytes)
            if not self.private:        # one task at a time on one copy, which starts zeroed
                buffers[space][:nbytes] = 0
        views: dict[_View, np.ndarray] = {}

        def array(s):
            if not isinstance(s, _View):
                return s
            v = views.get(s)
            if v is None:
                v = views[s] = np.ndarray(s.shape, s.dtype, buffer=buffers[s.key], offset=s.offset,
                                          strides=s.strides)
            return v
        bound = [(f, [array(s) for s in specs]) for f, specs in self.ops]
        n = 0
        try:
            with np.errstate(all="ignore"):
                for n, (f, args) in enumerate(bound):
                    f(*args)
        except (ArithmeticError, LookupError, TypeError, ValueError) as e:
            # decode refuses operands numpy would refuse: this is the plan's own error
            task, ins = self.origins[n]
            raise SimulationError(f"the functional plan failed on task {task} {ins.op} ({e}): a simulator "
                                  "bug; checked=True runs the reference interpreter", loc=ins.loc) from e


_pool = threading.local()


def reused(key, nbytes: int) -> np.ndarray:
    """Bytes kept per thread from one run to the next (of whatever they held): fresh memory costs
    the kernel's zeroing of every page, a good part of a run.  Larger than REUSED_BYTES: fresh."""
    if nbytes > REUSED_BYTES:
        return np.empty(nbytes, np.uint8)
    pool = _pool.__dict__.setdefault("buffers", {})
    buf = pool.get(key)
    if buf is None or buf.size < nbytes:
        buf = pool[key] = np.empty(nbytes, np.uint8)
    return buf


def plan_for(program, machine) -> Plan | None:
    """The program's plan for the machine's capacities; None when an instruction has no plan (an
    operand out of bounds, no functional rule): the reference interpreter then reports it."""
    caps = machine.capacities()
    cache = program.__dict__.setdefault("_functional_plans", {})
    key = tuple(sorted(caps.items()))
    if key not in cache:
        cache[key] = _build(program, caps)
    return cache[key]


def _build(program, caps) -> Plan | None:
    sizes = {b.name: prod(b.shape) for b in program.buffers}
    gm_dtypes = {b.name: b.dtype.np_dtype for b in program.buffers}
    instrs_of, stream_of, bases, accesses = [], [], [], []     # per task
    ids: dict[tuple, int] = {}                  # stream key -> stream number
    streams = []                                # per stream: (its entries, its instructions)
    decoded: dict = {}
    forms: dict = {"rows": {}, "ids": {}}
    for t in program.tasks:
        instrs = _Instrs((i for i in t.instrs if i.op not in SYNC_OPS), decoded)
        scanned = _scan(instrs, caps, sizes, forms)
        if scanned is None:
            return None
        key, base, access = scanned
        if key not in ids:
            if any(_kind(i.op) == "cube" and any(len(_shape(o)) != 2 for o in (i.dst, *i.srcs))
                   for i in instrs):
                return None                     # a matmul of vectors: a leading axis would change it
            streams.append((_entries(t.code), instrs))
            ids[key] = len(ids)
        instrs_of.append(instrs)
        stream_of.append(ids[key])
        bases.append(base)
        accesses.append(access)
    try:
        # (a loop's other iterations decode alike: the same instruction but for its GM window)
        private = all(_reads_own_writes(_once(entries, instrs), caps) for entries, instrs in streams)
        if private:
            rules = [_stream_rules(entries, instrs, caps) for entries, instrs in streams]
        else:
            rules = [[(*_rule(instrs, k)[:2], 1, k) for k in range(len(instrs))] for _, instrs in streams]
    except (SimulationError, LookupError):
        return None                             # the interpreter reports it, at its instruction
    if private:
        batches = _batches(program.tasks, program.buffers, stream_of, bases, accesses, rules, caps)
    else:
        batches = [[i] for i, s in enumerate(instrs_of) if s]

    ops, origins, scratch = [], [], {}
    factors: dict[tuple, list] = {}             # (GM buffer, dtype): [(op, operand)] read as factors
    for members in batches:
        first, n = members[0], len(members)
        step = {b: bases[members[1]][b] - bases[first][b] for b in bases[first]} if n > 1 else {}
        for f, operands, g, k in rules[stream_of[first]]:
            origins.append((program.tasks[first].id, instrs_of[first][k]))
            rank = max(len(_shape(o)) for o in operands if isinstance(o, (TileRef, _GM)))
            cube = not _is_loop(f) and _kind(instrs_of[first][k].op) == "cube"
            specs = []
            for p, o in enumerate(operands):
                if isinstance(o, TileRef):
                    specs.append(_tile_spec(o, n, g, rank, caps))
                    scratch[o.space] = max(scratch.get(o.space, 0), n * caps[o.space])
                elif isinstance(o, _GM):
                    w = o.window(instrs_of[first][o.k])
                    specs.append(_gm_spec(w, step.get(w.buf.name, 0), n, g, o.step, rank, gm_dtypes[w.buf.name]))
                    if cube and p >= len(operands) - 2:
                        factors.setdefault((w.buf.name, wide(_dtype(operands[0]))), []).append((len(ops), p))
                else:
                    specs.append(o)
            ops.append((f, tuple(specs)))
    written = {name for acc in accesses for name, _, w in acc if w}
    wide_gm = _widened_factors(ops, factors, written, sizes, gm_dtypes)
    return Plan(ops, origins, scratch, private, _unobserved(program.buffers, instrs_of, forms["ids"]), wide_gm)


def _widened_factors(ops: list, factors: dict, written: set, sizes: dict, gm_dtypes: dict) -> dict:
    """Matmul factors read from GM in a narrower dtype than the matmul multiplies in (fp16 factors,
    an fp32 accumulator) are read from a copy of their buffer converted once per run, when the
    program never writes that buffer and its factors read at least as many elements as it has:
    else every matmul converts its factors again (an fp16 4096^3 matmul: 800M elements, against
    33M).  The same values, so the same products.  Rewrites `ops`; returns {buffer: dtype}."""
    out = {}
    for (name, w), where in factors.items():
        if name in written or np.dtype(w) == gm_dtypes[name] or (name in out and out[name] != w):
            continue
        if sum(prod(ops[i][1][p].shape) for i, p in where) < sizes[name]:
            continue
        out[name] = w
        item, w_item = gm_dtypes[name].itemsize, np.dtype(w).itemsize
        for i, p in where:
            f, specs = ops[i]
            v = specs[p]
            wv = _View(("GM", name, "widened"), v.shape, np.dtype(w), v.offset // item * w_item,
                       tuple(st // item * w_item for st in v.strides))
            ops[i] = (f, specs[:p] + (wv,) + specs[p + 1:])
    return out
