"""Windows of global memory (GM): a buffer seen through offset, shape and strides.

Slicing, transposing and (contiguous) reshaping of a GM-resident tensor are free: they only
change the window.  Every load and store of the lower levels names one window.
"""
from __future__ import annotations

import functools
import itertools
import operator
from dataclasses import dataclass

import numpy as np

from ..dtypes import DType
from .core import cached, prod, quick_init


@functools.lru_cache(maxsize=1024)
def natural_strides(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


@dataclass(frozen=True)
class GMBuffer:
    name: str
    shape: tuple[int, ...]
    dtype: DType
    role: str            # input | output | inout | workspace

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.itemsize


@functools.lru_cache(maxsize=1024)
def _dim_of_stride(nat: tuple[int, ...]) -> dict[int, int]:
    """Natural strides -> {stride: the first buffer dim with it} (`nat.index`, looked up)."""
    out: dict[int, int] = {}
    for j, s in enumerate(nat):
        out.setdefault(s, j)
    return out


_LAYOUTS: dict[tuple, tuple] = {}


def _layout(bshape: tuple, shape: tuple, strides: tuple) -> tuple:
    """What a window's box and span take from its buffer's shape and its own shape and strides,
    not its offset: (the buffer's natural strides, per buffer dim the extent of the box (1 for a
    dim the window does not walk), the last element's offset from the first).  The extents are
    None when `_compute_box` is to decide (strides not a permutation of the buffer's, or a zero
    natural stride: its error, as before)."""
    key = (bshape, shape, strides)
    try:
        got = _LAYOUTS.get(key)
    except TypeError:                   # (a list for a tuple somewhere: worked out, not kept)
        got, key = None, None
    if got is not None:
        return got
    nat = natural_strides(bshape)
    dim_of = _dim_of_stride(nat)
    ext = [1] * len(nat)
    used = set()
    for size, stride in zip(shape, strides):
        if size == 1:
            continue
        j = dim_of.get(stride)
        if j is None or j in used:
            ext = None
            break
        used.add(j)
        ext[j] = size
    if 0 in nat:                        # (a buffer of a zero dim: `_compute_box` raises, as before)
        ext = None
    last = sum((s - 1) * st for s, st in zip(shape, strides))
    got = (nat, None if ext is None else tuple(ext), last)
    if key is not None and len(_LAYOUTS) < 65536:      # (bounded: a session compiles many kernels)
        _LAYOUTS[key] = got
    return got


def _boxes(refs) -> list:
    """`[r._box for r in refs]`, the boxes not known yet worked out here (keeping the span too),
    with the layout looked up once per run of windows of one layout (the tiles of one loop): a
    task's footprint has thousands of windows."""
    out = []
    seen = None                         # (buffer shape, shape, strides) of `layout`
    for r in refs:
        box = r.__dict__.get("_box", _UNKNOWN)
        if box is _UNKNOWN:
            if seen is None or seen[1] != r.shape or seen[2] != r.strides or seen[0] != r.buf.shape:
                seen = (r.buf.shape, r.shape, r.strides)
                layout = _layout(*seen)
            box = _placed(r, layout)
        out.append(box)
    return out


def _placed(r: "GMRef", layout: tuple):
    """`r._box` (and `r._span`, while at it), kept on `r`, from `_layout` of its shape and
    strides: the offset only places it."""
    nat, ext, last = layout
    off = r.offset
    d = r.__dict__
    d["_span"] = (off, off + last + 1)
    if ext is None:
        box = r._compute_box()
    elif len(nat) == 2:                 # (most buffers: one divmod, the last natural stride is 1)
        i, j = divmod(off, nat[0])
        box = (i, i + ext[0]), (j, j + ext[1])
    else:
        ranges = []
        for s, e in zip(nat, ext):
            i, off = divmod(off, s)
            ranges.append((i, i + e))
        box = tuple(ranges)
    d["_box"] = box
    return box


_UNKNOWN = object()


@quick_init
@dataclass(frozen=True)
class GMRef:
    buf: GMBuffer
    offset: int                      # in elements
    shape: tuple[int, ...]
    strides: tuple[int, ...]         # in elements

    def __hash__(self):
        # windows are dict keys in the simulators' hot loops (L2 residency, the timing engine's
        # window ids): the hash of the four fields (a buffer's among them) is computed once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.buf, self.offset, self.shape, self.strides))
            object.__setattr__(self, "_hash", h)
        return h

    def __eq__(self, other):
        # (the dataclass's compares the buffers field by field even for equal objects)
        if self is other:
            return True
        if other.__class__ is not GMRef:
            return NotImplemented
        return (self.offset == other.offset and self.shape == other.shape and self.strides == other.strides
                and (self.buf is other.buf or self.buf == other.buf))

    def __reduce__(self):
        # (the cached hash is this process's: a pickled window computes its own)
        return (GMRef, (self.buf, self.offset, self.shape, self.strides))

    @classmethod
    def whole(cls, buf: GMBuffer) -> "GMRef":
        return cls(buf, 0, buf.shape, natural_strides(buf.shape))

    @property
    def dtype(self) -> DType:
        return self.buf.dtype

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.buf.dtype.itemsize

    def is_contiguous(self) -> bool:
        """The window's elements are one run of memory (the stride of a size-1 dim is irrelevant)."""
        nat = natural_strides(self.shape)
        return all(s == n for s, n, d in zip(self.strides, nat, self.shape) if d != 1) or prod(self.shape) <= 1

    def window(self, offsets, shape, steps=None) -> "GMRef":
        """`shape` elements from `offsets`, every `steps`-th along each dim (default 1)."""
        strides = self.strides
        off = self.offset
        for o, s in zip(offsets, strides):
            off += o * s
        if steps:
            strides = tuple([s * k for s, k in zip(strides, steps)])
        return GMRef(self.buf, off, tuple(shape), strides)

    def transpose(self, a: int, b: int) -> "GMRef":
        sh, st = list(self.shape), list(self.strides)
        sh[a], sh[b] = sh[b], sh[a]
        st[a], st[b] = st[b], st[a]
        return GMRef(self.buf, self.offset, tuple(sh), tuple(st))

    def reshape(self, shape) -> "GMRef | None":
        """The same elements with a new shape, or None when the window is not contiguous."""
        if not self.is_contiguous():
            return None
        return GMRef(self.buf, self.offset, tuple(shape), natural_strides(tuple(shape)))

    @cached
    def _box(self):
        # a window's shape and strides are mostly those of many others (the tiles of one loop):
        # what they decide comes from `_layout`, and the offset only places it
        return _placed(self, _layout(self.buf.shape, self.shape, self.strides))

    def box(self):
        """Per-buffer-dim [lo, hi) ranges covered, or None when strides are not a permutation."""
        return self._box

    def _compute_box(self):
        nat = natural_strides(self.buf.shape)
        dim_of = _dim_of_stride(nat)
        rem = self.offset
        idx = []
        for s in nat:
            i, rem = divmod(rem, s)
            idx.append(i)
        ranges = [(i, i + 1) for i in idx]
        used = set()
        for size, stride in zip(self.shape, self.strides):
            if size == 1:
                continue
            j = dim_of.get(stride)
            if j is None or j in used:
                return None
            used.add(j)
            ranges[j] = (idx[j], idx[j] + size)
        return tuple(ranges)

    @cached
    def _exact(self):
        b = self._box
        return b if b is not None and all(h <= d for (_, h), d in zip(b, self.buf.shape)) else None

    def exact_box(self):
        """Per-buffer-dim ranges of exactly the elements of the window; None when its strides are
        not a permutation of the buffer's, or a dim runs past the buffer's (the window wraps)."""
        return self._exact

    @cached
    def _touched(self) -> tuple[tuple[int, int], ...]:
        b = self._exact
        if b is not None or not self.buf.shape:
            return b or ()
        lo, hi = self._span
        rows = natural_strides(self.buf.shape)[0]
        return ((lo // rows, (hi - 1) // rows + 1),) + tuple((0, d) for d in self.buf.shape[1:])

    def touched_box(self) -> tuple[tuple[int, int], ...]:
        """Per-buffer-dim ranges the window touches: exact, or a bounding box of whole rows."""
        return self._touched

    @cached
    def _span(self) -> tuple[int, int]:
        return self.offset, self.offset + _layout(self.buf.shape, self.shape, self.strides)[2] + 1

    def span(self) -> tuple[int, int]:
        """[first, last + 1) element offsets the window touches."""
        return self._span

    def overlaps(self, other: "GMRef") -> bool:
        if self.buf.name != other.buf.name:
            return False
        a, b = self.box(), other.box()
        if a is not None and b is not None:
            return all(x0 < y1 and y0 < x1 for (x0, x1), (y0, y1) in zip(a, b))
        (a0, a1), (b0, b1) = self.span(), other.span()
        return a0 < b1 and b0 < a1

    def text(self) -> str:
        b = self.box()
        # (the box form reads back as the window of the box's shape with the buffer's strides: a
        # window of another shape over the same elements, a transposed [1,3] of a [3,1] buffer,
        # is written out)
        if b is not None and self.strides == natural_strides(self.buf.shape)[-len(self.shape):] \
                and len(self.shape) == len(self.buf.shape) and all(hi - lo == n for (lo, hi), n in zip(b, self.shape)):
            return f"{self.buf.name}[" + ",".join(f"{lo}:{hi}" for lo, hi in b) + "]"
        return (f"{self.buf.name}{{off={self.offset},shape={list(self.shape)},"
                f"strides={list(self.strides)}}}")

    def __str__(self):
        return self.text()


class Footprint:
    """Bounding boxes (or spans) of the GM windows a task reads or writes, per buffer: what the
    partitioner orders tasks by and the race checker compares task runs by."""

    def __init__(self):
        self.box: dict[str, list] = {}
        self.span: dict[str, list] = {}

    def add(self, ref: GMRef):
        name = ref.buf.name
        b = ref._box                    # (first: working it out keeps the span too)
        lo, hi = ref._span
        s = self.span.get(name)
        if s is None:
            self.span[name] = [lo, hi]
        else:                           # (the lists are the footprint's own: grown in place)
            if lo < s[0]:
                s[0] = lo
            if hi > s[1]:
                s[1] = hi
        if b is None:
            self.box[name] = None
        else:
            self._add_box(name, b)

    def add_all(self, refs: list[GMRef]):
        """`add` of each of `refs`, with a Python step per buffer, not per window: the windows of
        a buffer are picked out together, their boxes and spans read and bounded at C level (the
        boxes not known yet worked out by `_boxes`)."""
        if len(refs) < 4:
            for ref in refs:
                self.add(ref)
            return
        names = list(map(_BUF_NAME, refs))
        order = dict.fromkeys(names)                    # (the buffers in `add`'s order)
        for name in order:
            # (a C-level pass per buffer: a task's windows are of a few buffers, interleaved)
            run = refs if len(order) == 1 else list(itertools.compress(refs, map(name.__eq__, names)))
            boxes = _boxes(run)                     # (first: working a box out keeps the span too)
            spans = list(map(_SPAN, run))
            lo, hi = min(map(_LO, spans)), max(map(_HI, spans))
            s = self.span.get(name)
            if s is None:
                self.span[name] = [lo, hi]
            else:
                if lo < s[0]:
                    s[0] = lo
                if hi > s[1]:
                    s[1] = hi
            if None in boxes:                       # (a window without a box: the buffer has none)
                self.box[name] = None
                continue
            if len(set(map(len, boxes))) != 1:      # (buffers of one name and other ranks: as `add`)
                for b in boxes:
                    self._add_box(name, b)
                continue
            # per buffer dim, the smallest start and the largest end
            b = [(min(map(_LO, dim)), max(map(_HI, dim))) for dim in zip(*boxes)]
            self._add_box(name, b)

    def _add_box(self, name: str, b):
        """The box half of `add`, of a box `b` (not None)."""
        box = self.box
        if name not in box:
            box[name] = [list(r) for r in b]
        else:
            mine = box[name]
            if mine is not None:
                for x, (y0, y1) in zip(mine, b):
                    if y0 < x[0]:
                        x[0] = y0
                    if y1 > x[1]:
                        x[1] = y1

    def overlaps(self, other: "Footprint") -> bool:
        for name, (lo, hi) in self.span.items():
            o = other.span.get(name)
            if o is None or not (lo < o[1] and o[0] < hi):
                continue
            a, b = self.box.get(name), other.box.get(name)
            if a is None or b is None or all(x0 < y1 and y0 < x1 for (x0, x1), (y0, y1) in zip(a, b)):
                return True
        return False


_BUF_NAME = operator.attrgetter("buf.name")
_SPAN = operator.attrgetter("_span")
_LO, _HI = operator.itemgetter(0), operator.itemgetter(1)


_BUF, _SHAPE, _STRIDES, _OFFSET = (operator.attrgetter("buf"), operator.attrgetter("shape"),
                                   operator.attrgetter("strides"), operator.attrgetter("offset"))


def window_columns(gms: list) -> tuple:
    """GM windows by column, for `moved_alike`: buffers, shapes, strides, offsets, and per window
    the position of the first window of its buffer (by name, as the passes tell buffers apart),
    whose move every window of the buffer must make."""
    bufs = list(map(_BUF, gms))
    where: dict[str, int] = {}
    first = np.fromiter((where.setdefault(b.name, k) for k, b in enumerate(bufs)), np.int64, len(bufs))
    return bufs, list(map(_SHAPE, gms)), list(map(_STRIDES, gms)), np.fromiter(map(_OFFSET, gms), np.int64,
                                                                               len(gms)), first


def moved_alike(gms: list, columns: tuple) -> bool:
    """Whether the windows `gms` (a twin task's) are those of `columns` (`window_columns` of
    another's) moved by one offset per buffer: same buffers, shapes and strides, by C-level
    compares, and the offsets by numpy (a task has a window per load: thousands).  Then every
    relation between two windows of one buffer (equal, overlapping, how far apart) holds in one
    task as in the other."""
    bufs, shapes, strides, offsets, first = columns
    if (list(map(_BUF, gms)) != bufs or list(map(_SHAPE, gms)) != shapes
            or list(map(_STRIDES, gms)) != strides):
        return False
    delta = np.fromiter(map(_OFFSET, gms), np.int64, len(gms)) - offsets
    return bool((delta == delta[first]).all())
