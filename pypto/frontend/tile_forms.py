"""The seeds' forms, conveniences over the Tile tier (`pypto.tile`) in tile- and block-level kernels.

    for idx, t in x.to_tile(shape=(TM, TN)):        # (offsets, a UB tile) per tile of x, tails included
        outs.append((idx, pypto.tile.texp(t)))
    pypto.merge_tiles(outs, out)                     # tstore of each at its offsets

`x.to_tile(auto_shape=True)` picks the tile: full rows, as many as fit UB with double buffering
(`live` tiles of that size per iteration).  `pypto.tile_conv2d(x, w)` convolves one window of a
tensor by a small kernel (cross-correlation, as torch's conv2d, "valid" padding) with shifted
multiply-adds on UB tiles: the vector unit has no UB sub-tile extraction, so each of the KH x KW
shifted windows is loaded from GM (TLOAD), scaled by its weight (TROWEXPANDMUL by a column of it,
made by TCOLEXPANDADD onto a zero column from TEXPANDS) and added up.  The cube path (im2col matmuls) would need
the kernel reshaped into a Toeplitz matrix in GM first; it is not this form.
"""
from __future__ import annotations

import itertools

from ..errors import ShapeError, UnsupportedError
from ..ir.core import fmt_shape
from ..ir.tile import row_pitch
from . import tile as T
from .tracer import Tensor, user_loc


class TileGrid:
    """The tiles of a view of a kernel tensor: iterating yields (offsets, tile) for each, the
    tile loaded into `space` (or the view itself with load=False)."""

    def __init__(self, view: Tensor, shape: tuple[int, ...], space: str, load: bool):
        self.view, self.shape, self.space, self.load = view, shape, space, load

    def __repr__(self):
        return f"<tiles {fmt_shape(self.shape)} of {fmt_shape(self.view.shape)}: {len(self)}>"

    def __len__(self):
        n = 1
        for d, s in zip(self.view.shape, self.shape):
            n *= -(-d // s)
        return n

    def offsets(self):
        """The offsets of every tile, row-major."""
        return itertools.product(*(range(0, d, s) for d, s in zip(self.view.shape, self.shape)))

    def __iter__(self):
        for idx in self.offsets():
            v = self.view[tuple(slice(o, min(o + s, d)) for o, s, d in zip(idx, self.shape, self.view.shape))]
            yield idx, (T.tload(v, space=self.space) if self.load else v)


def to_tile(x: Tensor, shape=None, *, auto_shape: bool = False, space: str = "UB", load: bool = True,
            live: int = 2) -> TileGrid:
    """`x.to_tile(shape=(TM, TN))` / `x.to_tile(auto_shape=True)`: the tiles of view `x` (see TileGrid).
    A shorter `shape` tiles the last dims (the leading ones one at a time)."""
    tr = T.TileTrace.current("to_tile")
    loc = user_loc()
    tr.window(x, "to_tile")                     # a view of a kernel tensor (the error otherwise)
    if (shape is None) == (not auto_shape):
        raise UnsupportedError("to_tile needs a tile shape or auto_shape=True (one of them)", loc=loc,
                               expected="x.to_tile(shape=(TM, TN)) or x.to_tile(auto_shape=True)",
                               got=f"shape={shape!r}, auto_shape={auto_shape!r}")
    if auto_shape:
        shape = _auto_shape(tr, x, space, live, loc)
    shape = tuple(int(s) for s in shape)
    if not 1 <= len(shape) <= x.ndim or any(s <= 0 for s in shape):
        raise ShapeError("to_tile: the tile shape does not fit the tensor", loc=loc,
                         expected=f"1 to {x.ndim} positive sizes (the last dims of {fmt_shape(x.shape)})",
                         got=repr(shape))
    shape = (1,) * (x.ndim - len(shape)) + shape
    return TileGrid(x, tuple(min(s, d) for s, d in zip(shape, x.shape)), space, load)


def _auto_shape(tr, x: Tensor, space: str, live: int, loc) -> tuple[int, ...]:
    """Full rows, as many as fit `space` with double buffering (`live` tiles of the shape per
    iteration), a power of two; a row too long for that: the widest power of two of one row."""
    caps = T._machine_caps(tr)
    budget = (caps or {}).get(space, 192 * 1024) // (2 * max(1, live))
    rows = x.shape[-2] if x.ndim >= 2 else 1
    pitch = row_pitch(x.shape[-1:], x.dtype)
    fit = budget // pitch
    if fit >= 1:
        tm = 1 << (fit.bit_length() - 1) if fit < rows else rows
        return (tm, x.shape[-1]) if x.ndim >= 2 else (x.shape[-1],)
    tn = 1 << ((budget // x.dtype.itemsize).bit_length() - 1)
    if tn * x.dtype.itemsize < 32:
        raise UnsupportedError(f"to_tile(auto_shape=True): no tile fits {space}", loc=loc,
                               expected=f"{live} double-buffered tiles in {space}", got=f"live={live}")
    return (1, tn) if x.ndim >= 2 else (tn,)


def merge_tiles(tiles, out: Tensor) -> None:
    """Store each (offsets, tile) of `tiles` (a list of pairs, or a dict) into `out` at its
    offsets (`pypto.tile.tstore`): the inverse of `x.to_tile`."""
    loc = user_loc()
    items = tiles.items() if isinstance(tiles, dict) else tiles
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], T.Tile)):
            raise UnsupportedError("merge_tiles takes (offsets, tile) pairs", loc=loc,
                                   expected="[(idx, tile), ...] as x.to_tile() yields them", got=repr(item)[:80])
        idx, t = item
        if len(idx) != out.ndim or t.ndim != out.ndim:
            raise ShapeError("merge_tiles: the offsets or the tile do not match the output's rank", loc=loc,
                             expected=f"{out.ndim} offsets and a tile of rank {out.ndim}",
                             got=f"offsets {tuple(idx)}, tile {fmt_shape(t.shape)}")
        T.tstore(out[tuple(slice(o, o + s) for o, s in zip(idx, t.shape))], t)


def tile_conv2d(x: Tensor, w: Tensor):
    """The 2-D convolution (cross-correlation, torch's conv2d with "valid" padding) of window `x`
    [H, W] by kernel `w` [KH, KW]: a UB tile [H - KH + 1, W - KW + 1] (see the module docstring).
    Both are views of the kernel's tensors (e.g. from `x.to_tile(..., load=False)`): the form
    loads the shifted windows itself."""
    tr = T.TileTrace.current("tile_conv2d")
    loc = user_loc()
    for v, what in ((x, "x"), (w, "w")):
        if isinstance(v, T.Tile):
            raise UnsupportedError(f"tile_conv2d takes the view {what} is loaded from, not a tile", loc=loc,
                                   expected=f"a view of a kernel tensor, e.g. {what}[i:i + H, :]", got=repr(v),
                                   hint="the form loads each shifted window of x itself (UB tiles have no "
                                        "sub-tile extraction); x.to_tile(shape, load=False) yields views")
        tr.window(v, "tile_conv2d")
        if v.ndim != 2:
            raise ShapeError(f"tile_conv2d: {what} is not 2-D", loc=loc, expected="[H, W] and [KH, KW]",
                             got=fmt_shape(v.shape))
    (h, wd), (kh, kw) = x.shape, w.shape
    oh, ow = h - kh + 1, wd - kw + 1
    if oh < 1 or ow < 1:
        raise ShapeError("tile_conv2d: the kernel is larger than the window", loc=loc,
                         expected=f"a kernel of at most {fmt_shape(x.shape)}", got=fmt_shape(w.shape))
    if x.dtype != w.dtype:
        raise ShapeError("tile_conv2d: x and w differ in dtype", loc=loc, expected=str(x.dtype), got=str(w.dtype))
    zero = T.texpands((oh, 1), 0, x.dtype)                                  # [OH, 1] of zeros
    acc = None
    for a in range(kh):
        for b in range(kw):
            xs = T.tload(x[a:a + oh, b:b + ow])
            wcol = T.tcolexpandadd(zero, T.tload(w[a:a + 1, b:b + 1]))     # [OH, 1] of w[a, b]
            term = T.trowexpandmul(xs, wcol)
            acc = term if acc is None else T.tadd(acc, term)
    return acc


__all__ = ["TileGrid", "merge_tiles", "tile_conv2d", "to_tile"]
