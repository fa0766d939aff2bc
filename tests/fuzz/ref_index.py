"""The fuzzer's reference for the index ops of gen_index.py (see reference.py).

Index ops move values exactly: an element's bound is the bound of the source element moved
there.  An index whose own value is not certain (e > 0: argmax on a near tie, say) makes every
element it decides undetermined (e = inf): the gathered element; for a scatter, its whole line
along dim (the value may land anywhere on it).  scatter_add / index_add add in the result's
dtype in an order the doc leaves open (atomic adds across cores): the bound is one rounding per
addition of the largest partial sum, |x| + sum |src|, whatever the order.
"""
from __future__ import annotations

import numpy as np


def _full(x, shape=None):
    """x's values and bounds as arrays of x's (or the given) shape."""
    shape = x.v.shape if shape is None else shape
    return np.broadcast_to(x.v, shape), np.broadcast_to(x.e, shape)


def _idx(i, n):
    """An index's values as int64 in [0, n) (clipped only where it is undetermined) and whether
    each is certain."""
    with np.errstate(all="ignore"):
        sure = np.isfinite(i.v) & (np.broadcast_to(i.e, i.v.shape) == 0)
        v = np.where(np.isfinite(i.v), i.v, 0)
    return np.clip(v, 0, n - 1).astype(np.int64), sure


def gather(x, i, d, mode, out_shape):
    from .reference import V
    xv, xe = _full(x)
    if mode == "flat":
        xv, xe, d = xv.reshape(-1), xe.reshape(-1), 0
        ii, sure = _idx(i, xv.shape[0])
        ii, sure = ii.reshape(-1), sure.reshape(-1)
    else:
        ii, sure = _idx(i, xv.shape[d])
        if mode == "take":                  # the index broadcast against x off dim
            ii, sure = np.broadcast_to(ii, out_shape), np.broadcast_to(sure, out_shape)
        else:                               # x's leading part off dim: the index's extent
            key = tuple(slice(None) if k == d else slice(0, s) for k, s in enumerate(ii.shape))
            xv, xe = xv[key], xe[key]
    v = np.take_along_axis(xv, ii, d)
    e = np.where(sure, np.take_along_axis(xe, ii, d), np.inf)
    return V(v, e)


def index_select(x, i, d):
    from .reference import V
    xv, xe = _full(x)
    ii, sure = _idx(i, xv.shape[d])
    v, e = np.take(xv, ii, axis=d), np.take(xe, ii, axis=d)
    shp = [1] * xv.ndim
    shp[d] = len(ii)
    return V(v, np.where(sure.reshape(shp), e, np.inf))


def embedding(i, w):
    from .reference import V
    wv, we = _full(w)
    ii, sure = _idx(i, wv.shape[0])
    return V(wv[ii], np.where(sure[..., None], we[ii], np.inf))


def one_hot(i, k):
    from .reference import V
    with np.errstate(all="ignore"):
        v = (i.v[..., None] == np.arange(k)).astype(np.float64)
    sure = np.isfinite(i.v) & (np.broadcast_to(i.e, i.v.shape) == 0)
    return V(v, np.where(sure[..., None], 0.0, np.inf) * np.ones_like(v))


def _targets(shape, d, ii):
    grids = list(np.indices(shape, sparse=False))
    grids[d] = ii
    return tuple(g.reshape(-1) for g in grids)


def _unsure_lines(sure, d, xshape):
    """The lines of x (along d) that a scatter of an uncertain index may write."""
    bad = np.any(~sure, axis=d, keepdims=True)
    out = np.zeros(tuple(1 if k == d else s for k, s in enumerate(xshape)), bool)
    out[tuple(slice(0, s) for s in bad.shape)] = bad
    return np.broadcast_to(out, xshape)


def scatter(x, src, i, d):
    """x with src written at the index along d; an element written twice with different values
    (or bounds) is undetermined: which write lands last is not specified."""
    from .reference import V
    shape = i.v.shape
    ii, sure = _idx(i, x.v.shape[d])
    if np.ndim(src.v) == 0:                 # value=: a number
        sv, se = _full(src, shape)
    else:                                   # src's leading part: the index's extent
        key = tuple(slice(0, s) for s in shape)
        sv, se = (a[key] for a in _full(src))
    sv, se = sv.reshape(-1), se.reshape(-1)
    v, e = (np.array(a, dtype=np.float64) for a in _full(x))
    t = _targets(shape, d, ii)
    v[t] = sv
    e[t] = se
    same = ((v[t] == sv) | (np.isnan(v[t]) & np.isnan(sv))) & (e[t] == se)
    clash = np.zeros(v.shape, bool)
    np.logical_or.at(clash, t, ~same)
    e = np.where(clash | _unsure_lines(sure, d, v.shape), np.inf, e)
    return V(v, e)


def scatter_add(x, vals, ii, sure, d, dt):
    """x with vals added at ii along d (vals and ii of one shape)."""
    from .reference import INTS, MAXV, TINY, U, U32, V
    shape = ii.shape
    sv, se = (a.reshape(-1) for a in _full(vals, shape))
    xv, xe = _full(x)
    t = _targets(shape, d, ii)
    with np.errstate(all="ignore"):
        v = np.array(xv, dtype=np.float64)
        np.add.at(v, t, sv)
        esum = np.array(xe, dtype=np.float64)
        np.add.at(esum, t, se)
        mag = np.where(np.isfinite(xv), np.abs(xv), 0.0)       # the largest partial sum's bound
        np.add.at(mag, t, np.where(np.isfinite(sv), np.abs(sv), 0.0))
        cnt = np.zeros(v.shape)
        np.add.at(cnt, t, 1.0)
        if dt in INTS:
            e = esum
        else:
            u = U[dt] if dt == "fp32" else U[dt] + U32
            e = esum + cnt * (u * mag + TINY[dt])
            # a partial sum may overflow in some order (then inf, or NaN against an opposite inf)
            over = (cnt > 0) & (mag * (1 + cnt * u) + e > MAXV[dt] * 0.999)
            e = np.where(np.isfinite(v), np.where(over, np.inf, e),
                         np.where(np.isfinite(esum) & ~over, 0.0, np.inf))
        e = np.where(cnt > 0, e, xe)
    e = np.where(_unsure_lines(sure, d, v.shape), np.inf, e)
    return V(v, e)


def tri(x, fn, diag):
    from .reference import V
    xv, xe = _full(x)
    rows, cols = xv.shape[-2:]
    off = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    keep = off <= diag if fn == "tril" else off >= diag
    return V(np.where(keep, xv, 0.0), np.where(keep, xe, 0.0))


def iota(a, dt):
    from .reference import INTS, V, _rounded
    shape, d = tuple(a["shape"]), a["dim"]
    col = a["start"] + a["step"] * np.arange(shape[d], dtype=np.float64)
    v = np.broadcast_to(col.reshape([-1 if k == d else 1 for k in range(len(shape))]), shape)
    return V(v, 0.0) if dt in INTS else _rounded(V(v, 0.0), dt)


def topk(x, a, src_dt, out):
    """The k largest (smallest) along dim, descending (ascending), ties to the lowest index; a
    row holding NaN or an undetermined element: undetermined (no claim on how a NaN ranks;
    pypto ranks it first, its index in range, which a gather of the indices checks).
    A value's bound: the row's largest (order statistics move at most that far); an index is
    undetermined where another element may be as large within the bounds (exact ties excepted)."""
    from .reference import V, _slack
    d, k, largest = a["dim"], a["k"], a["largest"]
    xv, xe = _full(x)
    xv, xe = np.moveaxis(xv, d, -1), np.moveaxis(xe, d, -1)
    key = -xv if largest else xv
    order = np.argsort(np.where(np.isnan(key), np.inf, key), axis=-1, kind="stable")[..., :k]
    v = np.take_along_axis(xv, order, -1)
    with np.errstate(all="ignore"):
        row_bad = np.any(np.isnan(xv) | ~np.isfinite(xe), axis=-1, keepdims=True)
        emax = np.max(xe, axis=-1, keepdims=True)
        if out == "values":
            e = np.where(np.isfinite(v), emax, 0.0)
            e = np.where(row_bad, np.inf, e)
            return V(np.moveaxis(v, -1, d), np.moveaxis(e, -1, d))
        s = np.where(np.isfinite(xv), _slack(V(xv, xe), src_dt), 0.0)
        lo, hi = xv - s, xv + s
        amb = np.zeros(v.shape, bool)
        for p in range(k):
            j = order[..., p:p + 1]
            vj, sj = np.take_along_axis(xv, j, -1), np.take_along_axis(s, j, -1)
            over = (lo <= vj + sj) & (hi >= vj - sj)
            tie = (xv == vj) & (s == 0) & (sj == 0)
            other = np.arange(xv.shape[-1]) != j
            amb[..., p] = np.any(over & ~tie & other, axis=-1)
        e = np.where(amb | row_bad, np.inf, 0.0)
    return V(np.moveaxis(order.astype(np.float64), -1, d), np.moveaxis(e, -1, d))


def evaluate_index(case, n, ins, vals):
    """The value of node `n` of an index op, else None."""
    from .reference import _arg_dtype, const, mul
    op, a, dt = n.op, n.attrs, n.dtype
    if op == "gather":
        return gather(ins[0], ins[1], a["dim"], a["mode"], tuple(n.shape))
    if op == "index_select":
        return index_select(ins[0], ins[1], a["dim"])
    if op == "embedding":
        return embedding(ins[0], ins[1])
    if op == "one_hot":
        return one_hot(ins[0], a["num_classes"])
    if op == "scatter":
        return scatter(ins[0], ins[1], ins[2], a["dim"])
    if op == "scatter_add":
        x, src, i = ins
        shape = i.v.shape
        ii, sure = _idx(i, x.v.shape[a["dim"]])
        sv, se = _full(src)
        key = tuple(slice(0, s) for s in shape)
        from .reference import V
        return scatter_add(x, V(sv[key], se[key]), ii, sure, a["dim"], dt)
    if op == "index_add":
        x, i, src = ins
        d = a["dim"]
        if a["alpha"] != 1:
            src = mul(src, const(a["alpha"], dt), dt)
        ii, sure = _idx(i, x.v.shape[d])
        shp = [1] * x.v.ndim
        shp[d] = len(ii)
        shape = src.v.shape
        return scatter_add(x, src, np.broadcast_to(ii.reshape(shp), shape), np.broadcast_to(sure.reshape(shp), shape),
                           d, dt)
    if op == "tri":
        return tri(ins[0], a["fn"], a["diagonal"])
    if op == "iota":
        return iota(a, dt)
    if op == "eye":
        from .reference import V
        return V(np.eye(*n.shape), 0.0)
    if op == "topk":
        return topk(ins[0], a, _arg_dtype(case, n, n.args[0]), a["out"])
    return None
