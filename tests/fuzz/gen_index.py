"""Generator steps for the registry's index ops (mixed into gen.Generator): gather (and
take_along_dim), index_select, embedding, one_hot, scatter (src or value=), scatter_add,
index_add, tril / triu, iota (arange, eye) and topk.

Index tensors are int32 (sometimes int8, which pypto widens): a new kernel input whose data
`make_data` draws uniformly in [lo, hi] (ints get no specials), set to [0, size - 1]; or computed
in the kernel: an arange (a coprime step, shifted per line by an int input, `% size`), any int
value of the pool `% size` (a floored remainder by a positive number is always in range), or
argmax / argmin (in range by construction; undetermined on near ties, which the reference then
carries into the gathered elements).  Every index is in range for certain: out-of-range indices
are clipped or dropped by pypto and flagged by checked mode, a different contract.

Every new node is modelled (shape, dtype, interval) here and evaluated in ref_index.py from its
documented semantics, never from the registry's own `ref` functions.
"""
from __future__ import annotations

import math

from .gen_ops import FLOATS, INTS, PY_DT


def _lst(s) -> str:
    return "[" + ", ".join(str(int(d)) for d in s) + "]"


class IndexSteps:
    """Mixin: see gen_ops.OpSteps for what it needs of the generator."""

    def s_index(self, x):
        c = self.c
        fn = c.weighted([(3, "gather"), (2, "index_select"), (2, "embedding"), (2, "one_hot"), (3, "scatter"),
                         (2, "scatter_add"), (2, "index_add"), (2, "tri"), (2, "iota"), (1, "topk")])
        return getattr(self, "_ix_" + fn)(x)

    # --- index values --------------------------------------------------------------------
    def _index_input(self, shape, n):
        """A new int input of `shape` with values in [0, n - 1] (int8 sometimes when that fits:
        the index ops widen it).  make_data draws ints uniformly in [lo, hi] and injects no
        specials into ints, so every index is in range."""
        dt = "int8" if n <= 100 and self.c.chance(0.2) else "int32"
        node = self.new_input(tuple(shape), dt)
        if node is None:
            return None
        spec = self.inputs[-1]
        spec.lo, spec.hi = 0, n - 1
        node.lo, node.hi = 0.0, float(n - 1)
        return node

    def _index_pool(self, shape, n):
        """An int value of the pool of exactly `shape`, taken `% n` (floored: always in [0, n))."""
        v = self.pick_value(lambda t: t.dtype in INTS and tuple(t.shape) == tuple(shape)
                            and (t.dtype == "int32" or n <= 100))
        if v is None:
            return None
        return self._mod(v, n)

    def _mod(self, v, n):
        if v.lo >= 0 and v.hi <= n - 1:
            return v
        text = f"{v.name} % {n}" if self.c.chance(0.6) else f"pypto.remainder({v.name}, {n})"
        return self.add("mod", [v.id, ("c", n)], {"fn": "remainder"}, v.shape, v.dtype, 0, n - 1, text)

    def _arange(self, m, start, step, dtype="int32", kw_dtype=False):
        """pypto.arange of m elements start, start + step, ... (ints)."""
        end = start + m * step
        if step == 1 and start == 0 and self.c.chance(0.6):
            args = f"{m}"
        elif step == 1 and self.c.chance(0.5):
            args = f"{start}, {end}"
        else:
            args = f"{start}, {end}, {step}"
        if kw_dtype:
            args += f", dtype={PY_DT[dtype]}"
        last = start + (m - 1) * step
        return self.add("iota", [], {"shape": (m,), "dim": 0, "start": start, "step": step}, (m,), dtype,
                        min(start, last), max(start, last), f"pypto.arange({args})")

    def _index_iota(self, shape, d, n):
        """(arange along dim d with a step coprime to n, plus a per-line shift) % n: unique along
        d when shape[d] <= n, the other dims broadcast from an int input (or zeros)."""
        c = self.c
        r, m = len(shape), shape[d]
        step = c.pick([s for s in (1, 3, -1, 5, 7, 2, 11) if math.gcd(abs(s), n) == 1])
        start = c.pick([0, c.int(0, n - 1), -5])
        ar = self._arange(m, start, step)
        lo, hi = ar.lo, ar.hi
        plain = lo >= 0 and hi <= n - 1
        if r > 1:
            s1 = tuple(m if k == d else 1 for k in range(r))
            ar = self.add("reshape", [ar.id], {"shape": s1}, s1, "int32", lo, hi,
                          c.pick([f"{ar.name}.reshape({_lst(s1)})", f"pypto.reshape({ar.name}, {_lst(s1)})"]))
        if any(s > 1 for k, s in enumerate(shape) if k != d):
            bshape = tuple(1 if k == d else s for k, s in enumerate(shape))
            b = self.new_input(bshape, "int32") if c.chance(0.7) else None
            if b is None:
                b = self.add("zeros", [], {}, shape, "int32", 0, 0,
                             f"pypto.zeros({_lst(shape)}, dtype=pypto.DT_INT32)")
            ar = self.binary(ar, b, "add")
            plain = False
        if plain and c.chance(0.5):
            return ar
        return self._mod(ar, n) if not plain else self.add(
            "mod", [ar.id, ("c", n)], {"fn": "remainder"}, ar.shape, "int32", 0, n - 1, f"{ar.name} % {n}")

    def _index(self, shape, d, n, unique=False):
        """An int index of `shape` with values in [0, n); unique along dim d when asked (then
        shape[d] <= n, or shape[d] == 1)."""
        c = self.c
        shape = tuple(shape)
        if unique and shape[d] > 1:
            return self._index_iota(shape, d, n)
        how = c.weighted([(5, "input"), (2, "iota"), (2, "pool")])
        idx = None
        if how == "pool":
            idx = self._index_pool(shape, n)
        if how == "input" or (idx is None and c.chance(0.7)):
            idx = self._index_input(shape, n)
        return idx if idx is not None else self._index_iota(shape, d, n)

    def _argidx(self, x, d, keepdim):
        """argmax / argmin of x along d: in [0, x.shape[d]) by construction."""
        c = self.c
        r = len(x.shape)
        fn = c.pick(["argmax", "argmin"])
        dim = d - r if c.chance(0.4) else d
        shape = tuple(1 if k == d else s for k, s in enumerate(x.shape)) if keepdim else \
            tuple(s for k, s in enumerate(x.shape) if k != d)
        kd = ", keepdim=True" if keepdim else ""
        text = f"pypto.{fn}({x.name}, dim={dim}{kd})" if c.chance(0.7) else f"{x.name}.{fn}({dim}{kd})"
        return self.add("red2", [x.id], {"fn": fn, "dims": (d,), "keepdim": keepdim}, shape, "int32", 0,
                        x.shape[d] - 1, text)

    def _sub_shape(self, s, d, m):
        """A shape at most s off dim d (torch's index may be smaller there), m along d."""
        c = self.c
        return tuple(m if k == d else (n if c.chance(0.65) else c.int(1, n)) for k, n in enumerate(s))

    def _along(self, n):
        c = self.c
        return c.pick([n, 1, min(n, 8), c.int(1, n), 2 * n, 3])

    def _pick_dim(self, x):
        """(a dim of x, as the kernel writes it (negative sometimes), x's size along it)."""
        r = len(x.shape)
        d = self.c.int(0, r - 1)
        return d, d - r if self.c.chance(0.4) else d, x.shape[d]

    # --- gathers -------------------------------------------------------------------------
    def _ix_gather(self, x):
        from .gen import MAX_ELEMS
        c = self.c
        d, dim, n = self._pick_dim(x)
        mode = c.weighted([(5, "gather"), (2, "take"), (1, "flat")])
        if mode == "flat":
            m = c.pick([x.size, 1, 7, min(x.size, 300)])
            shape = (m,) if c.chance(0.6) or m < 2 else (2, m)
            if math.prod(shape) > MAX_ELEMS:
                shape = (m,)
            idx = self._index(shape, 0, x.size)
            text = c.pick([f"pypto.take_along_dim({x.name}, {idx.name})", f"{x.name}.take_along_dim({idx.name})"])
            return self.add("gather", [x.id, idx.id], {"dim": 0, "mode": "flat"}, (math.prod(shape),), x.dtype,
                            x.lo, x.hi, text)
        if mode == "take":
            shape = tuple(self._along(n) if k == d else (s if c.chance(0.6) else 1) for k, s in enumerate(x.shape))
            out = tuple(shape[d] if k == d else s for k, s in enumerate(x.shape))
            if math.prod(out) > MAX_ELEMS:
                return self.s_un2(x)
            idx = self._index(shape, d, n)
            text = c.pick([f"pypto.take_along_dim({x.name}, {idx.name}, dim={dim})",
                           f"pypto.take_along_dim({x.name}, {idx.name}, {dim})",
                           f"{x.name}.take_along_dim({idx.name}, {dim})"])
            return self.add("gather", [x.id, idx.id], {"dim": d, "mode": "take"}, out, x.dtype, x.lo, x.hi, text)
        if c.chance(0.3):
            idx = self._argidx(x, d, True)       # gather(x, d, argmax(x, d, keepdim=True)): the max
        else:
            shape = self._sub_shape(x.shape, d, self._along(n))
            if math.prod(shape) > MAX_ELEMS:
                return self.s_un2(x)
            idx = self._index(shape, d, n)
        text = c.pick([f"pypto.gather({x.name}, {dim}, {idx.name})", f"{x.name}.gather({dim}, {idx.name})",
                       f"pypto.gather({x.name}, dim={dim}, index={idx.name})"])
        return self.add("gather", [x.id, idx.id], {"dim": d, "mode": "gather"}, idx.shape, x.dtype, x.lo, x.hi,
                        text)

    def _ix_index_select(self, x):
        from .gen import MAX_ELEMS
        c = self.c
        r = len(x.shape)
        d, dim, n = self._pick_dim(x)
        if r == 2 and c.chance(0.25):
            idx = self._argidx(x, d, False)     # the other dim's length: 1-D, in [0, n)
        else:
            m = self._along(n)
            if x.size // n * m > MAX_ELEMS:
                m = 1
            idx = self._index((m,), 0, n, unique=c.chance(0.3) and m <= n)
        m = idx.shape[0]
        shape = tuple(m if k == d else s for k, s in enumerate(x.shape))
        if math.prod(shape) > MAX_ELEMS:
            return self.s_un2(x)
        text = c.pick([f"pypto.index_select({x.name}, {dim}, {idx.name})", f"{x.name}.index_select({dim}, {idx.name})",
                       f"pypto.index_select({x.name}, dim={dim}, index={idx.name})"])
        return self.add("index_select", [x.id, idx.id], {"dim": d}, shape, x.dtype, x.lo, x.hi, text)

    def _ix_embedding(self, x):
        from .gen import MAX_ELEMS
        c = self.c
        w = x
        if len(x.shape) != 2:       # the weight [V, D]: x's rows
            t = (x.size // x.shape[-1], x.shape[-1]) if len(x.shape) > 2 else (x.shape[0], 1) \
                if c.chance(0.3) else (1, x.shape[0])
            w = self.add("reshape", [x.id], {"shape": t}, t, x.dtype, x.lo, x.hi,
                         f"pypto.reshape({x.name}, {_lst(t)})")
        nv, dd = w.shape
        m = c.pick([5, 1, 16, 100, nv, 33])
        shape = (m,) if c.chance(0.6) else (c.pick([2, 3, 1]), m)
        if math.prod(shape) * dd > MAX_ELEMS:
            shape = (max(1, MAX_ELEMS // dd // 4),)
        idx = self._index(shape, len(shape) - 1, nv)
        text = c.pick([f"pypto.embedding({idx.name}, {w.name})",
                       f"pypto.embedding(input={idx.name}, weight={w.name})"])
        return self.add("embedding", [idx.id, w.id], {}, idx.shape + (dd,), w.dtype, w.lo, w.hi, text)

    def _ix_one_hot(self, x):
        from .gen import MAX_ELEMS
        c = self.c
        how = c.pick(["x", "arg", "input"])
        k = c.pick([2, 5, 16, 3, 100, 64])
        if how == "x" and x.dtype in INTS and x.size * k <= MAX_ELEMS and (x.dtype == "int32" or k <= 100):
            idx = self._mod(x, k)
        elif how == "arg":
            d = c.int(0, len(x.shape) - 1)
            idx = self._argidx(x, d, c.chance(0.3))
            k = x.shape[d] + c.pick([0, 0, 3])
        else:
            m = c.pick([7, 1, 32, 100])
            shape = (m,) if c.chance(0.6) else (c.pick([2, 4]), m)
            idx = self._index(shape, len(shape) - 1, k)
        if idx.size * k > MAX_ELEMS or not idx.shape:
            if idx.shape and idx.size <= MAX_ELEMS // 2:
                k = 2
            else:
                return self.s_un2(x)
            if idx.hi > 1:
                idx = self._mod(idx, 2)
        text = c.pick([f"pypto.one_hot({idx.name}, {k})", f"pypto.one_hot({idx.name}, num_classes={k})"])
        return self.add("one_hot", [idx.id], {"num_classes": k}, idx.shape + (k,), "int32", 0, 1, text)

    # --- scatters ------------------------------------------------------------------------
    def _src(self, x, shape, bigger=False):
        """A value of x's dtype at least `shape` (torch's scatter reads its leading part)."""
        c = self.c
        v = self.pick_value(lambda t: t.dtype == x.dtype and tuple(t.shape) == tuple(shape) and t.id != x.id)
        if v is not None and c.chance(0.6):
            return v
        big = tuple(s + (c.pick([0, 1, 3]) if bigger else 0) for s in shape)
        v = self.new_input(big, x.dtype)
        if v is not None:
            return v
        if all(s <= n for s, n in zip(shape, x.shape)):     # a window of -x
            key = ", ".join(f":{s}" for s in shape)
            w = self.add("view", [x.id], {"shape": tuple(shape), "offsets": (0,) * len(shape), "drop": ()}, shape,
                         x.dtype, x.lo, x.hi, f"{x.name}[{key}]")
            return self.unary(w, "neg")
        return None

    def _ix_scatter(self, x, add=False):
        from .gen import MAX_ELEMS
        c = self.c
        d, dim, n = self._pick_dim(x)
        # duplicate indices along dim: the frontend documents "the last in index order wins" for
        # the simulator but unspecified on hardware (as torch), and cores may store tiles in any
        # order; so scatter keeps the indices unique along dim (a coprime arange shifted per line,
        # or one index per line), except with value= (every duplicate writes the same number)
        # and in "dup" mode, where the reference leaves an element written twice with different
        # values undetermined.  scatter_add accumulates duplicates: any index.
        mode = "add" if add else c.weighted([(4, "unique"), (2, "single"), (2, "value"), (1, "dup")])
        if mode == "single" and c.chance(0.4):
            idx = self._argidx(x, d, True)       # x with its max (min) along dim replaced
            shape = idx.shape
        else:
            m = c.int(1, n) if mode == "unique" else 1 if mode == "single" else self._along(n)
            shape = self._sub_shape(x.shape, d, m)
            if math.prod(shape) > MAX_ELEMS:
                shape = tuple(1 if k == d else s for k, s in enumerate(shape))
            idx = self._index(shape, d, n, unique=mode == "unique")
        src = None
        if mode != "value":
            src = self._src(x, shape, bigger=c.chance(0.3))
            if src is None:
                if add:
                    return idx
                mode = "value"
        if mode == "value":
            v = self.const(x.dtype) if c.chance(0.7) else 0
            vt = self._num_text(v, x.dtype)
            text = c.pick([f"pypto.scatter({x.name}, {dim}, {idx.name}, value={vt})",
                           f"{x.name}.scatter({dim}, {idx.name}, value={vt})",
                           f"pypto.scatter({x.name}, {dim}, {idx.name}, {vt})"])
            return self.add("scatter", [x.id, ("c", v), idx.id], {"dim": d}, x.shape, x.dtype,
                            min(x.lo, v), max(x.hi, v), text)
        if add:
            cnt = shape[d]          # the most values added into one element
            lo = x.lo + cnt * min(src.lo, 0.0)
            hi = x.hi + cnt * max(src.hi, 0.0)
            if not self.fits(x.dtype, lo, hi) or (x.dtype == "fp16" and max(-lo, hi) > 1e4):
                return src          # the sum may overflow: no op
            text = c.pick([f"pypto.scatter_add({x.name}, {dim}, {idx.name}, {src.name})",
                           f"{x.name}.scatter_add({dim}, {idx.name}, {src.name})",
                           f"pypto.scatter_add({x.name}, dim={dim}, index={idx.name}, src={src.name})"])
            return self.add("scatter_add", [x.id, src.id, idx.id], {"dim": d}, x.shape, x.dtype, lo, hi, text)
        text = c.pick([f"pypto.scatter({x.name}, {dim}, {idx.name}, {src.name})",
                       f"{x.name}.scatter({dim}, {idx.name}, {src.name})",
                       f"pypto.scatter({x.name}, {dim}, {idx.name}, src={src.name})"])
        return self.add("scatter", [x.id, src.id, idx.id], {"dim": d}, x.shape, x.dtype,
                        min(x.lo, src.lo), max(x.hi, src.hi), text)

    def _ix_scatter_add(self, x):
        return self._ix_scatter(x, add=True)

    def _ix_index_add(self, x):
        from .gen import MAX_ELEMS
        c = self.c
        d, dim, n = self._pick_dim(x)
        m = self._along(n)
        sshape = tuple(m if k == d else s for k, s in enumerate(x.shape))
        if math.prod(sshape) > MAX_ELEMS:
            m = 1
            sshape = tuple(m if k == d else s for k, s in enumerate(x.shape))
        idx = self._index((m,), 0, n, unique=c.chance(0.2) and m <= n)
        src = self._src(x, sshape)
        if src is None:
            return idx
        isf = x.dtype in FLOATS
        alpha = c.pick([1, 2, -1, 0.5, 3, -1.5]) if isf else c.pick([1, 2, -1, 3])
        p = (alpha * src.lo, alpha * src.hi)
        lo, hi = x.lo + m * min(min(p), 0.0), x.hi + m * max(max(p), 0.0)
        if not self.fits(x.dtype, lo, hi) or (x.dtype == "fp16" and max(-lo, hi) > 1e4):
            return self.s_un2(x)
        at = self._num_text(alpha, x.dtype) if not isf else repr(float(alpha))
        kw = "" if alpha == 1 and c.chance(0.5) else c.pick([f", alpha={at}", f", {at}"])
        text = c.pick([f"pypto.index_add({x.name}, {dim}, {idx.name}, {src.name}{kw})",
                       f"{x.name}.index_add({dim}, {idx.name}, {src.name}{kw})"])
        return self.add("index_add", [x.id, idx.id, src.id], {"dim": d, "alpha": alpha}, x.shape, x.dtype,
                        lo, hi, text)

    # --- triangles, sequences, topk ------------------------------------------------------
    def _ix_tri(self, x):
        c = self.c
        if len(x.shape) < 2:
            n = x.shape[0]
            f = next((f for f in (16, 8, 4, 3, 2) if n % f == 0 and n > f), None)
            t = (n // f, f) if f and c.chance(0.7) else (1, n)
            x = self.add("reshape", [x.id], {"shape": t}, t, x.dtype, x.lo, x.hi, f"pypto.reshape({x.name}, {_lst(t)})")
        rows, cols = x.shape[-2:]
        diag = c.pick([0, 1, -1, 2, -3, c.int(-rows, cols), cols, -rows])
        fn = c.pick(["tril", "triu"])
        if diag == 0 and c.chance(0.4):
            text = c.pick([f"pypto.{fn}({x.name})", f"{x.name}.{fn}()"])
        else:
            text = c.pick([f"pypto.{fn}({x.name}, {diag})", f"{x.name}.{fn}({diag})",
                           f"pypto.{fn}({x.name}, diagonal={diag})"])
        return self.add("tri", [x.id], {"fn": fn, "diagonal": diag}, x.shape, x.dtype,
                        min(x.lo, 0.0), max(x.hi, 0.0), text)

    def _ix_iota(self, x):
        """arange (x's last dim, so that it combines with x) or eye (x's last two dims)."""
        c = self.c
        dt = x.dtype
        if len(x.shape) >= 2 and c.chance(0.3):
            n, m = x.shape[-2:]
            shown = "" if dt == "fp32" and c.chance(0.5) else f", dtype={PY_DT[dt]}"
            text = f"pypto.eye({n}{shown})" if n == m and c.chance(0.5) else f"pypto.eye({n}, {m}{shown})"
            e = self.add("eye", [], {}, (n, m), dt, 0, 1, text)
            return self.binary(x, e, "mul")
        m = x.shape[-1]
        if dt in FLOATS and c.chance(0.6):
            start, step = c.pick([(-1.5, 0.5), (0.0, 0.25), (2.0, -0.1), (0.5, 1.0), (-3.0, 0.125)])
            end = start + (m - 0.5) * step      # n = ceil((end - start) / step) = m, far from a tie
            kw = "" if dt == "fp32" and c.chance(0.5) else f", dtype={PY_DT[dt]}"
            last = start + (m - 1) * step
            if not self.fits(dt, min(start, last), max(start, last)):
                return self.s_un2(x)
            io = self.add("iota", [], {"shape": (m,), "dim": 0, "start": start, "step": step}, (m,), dt,
                          min(start, last), max(start, last), f"pypto.arange({start!r}, {end!r}, {step!r}{kw})")
        else:
            step = c.pick([1, 2, -1, 3])
            start = c.pick([0, 1, -7, 5])
            if dt == "int8" and max(abs(start), abs(start + (m - 1) * step)) > 100:
                step, start = 1, -min(m // 2, 50)
                if m > 100:
                    return self.s_un2(x)
            io = self._arange(m, start, step, dt, kw_dtype=dt != "int32")
        fn = c.pick(["add", "sub", "mul"])
        lo, hi = x.lo, x.hi
        p = [a * b for a in (lo, hi) for b in (io.lo, io.hi)]
        if fn == "mul" and not self.fits(dt, min(p), max(p)):
            fn = "add"
        if not self.fits(dt, lo - max(abs(io.lo), abs(io.hi)), hi + max(abs(io.lo), abs(io.hi))):
            return io
        return self.binary(x, io, fn, swap=c.chance(0.3))

    def _ix_topk(self, x):
        from .gen_ops import Node_
        c = self.c
        r = len(x.shape)
        d, dim, n = self._pick_dim(x)
        k = min(n, c.weighted([(4, 1), (4, 2), (2, 3), (1, 5)]))
        largest = c.chance(0.7)
        shape = tuple(k if i == d else s for i, s in enumerate(x.shape))
        form = c.pick(["fn", "kw", "method"])
        if form == "fn" and d == r - 1 and largest:
            call = f"pypto.topk({x.name}, {k})"
        elif form == "method":
            call = f"{x.name}.topk({k}, {dim}" + ("" if largest else ", largest=False") + ")"
        else:
            call = f"pypto.topk({x.name}, {k}, dim={dim}, largest={largest}" + \
                (", sorted=True)" if c.chance(0.3) else ")")
        vals = Node_(self, "topk", [x.id], {"dim": d, "k": k, "largest": largest, "out": "values"}, shape, x.dtype,
                     x.lo, x.hi)
        idx = Node_(self, "topk", [x.id], {"dim": d, "k": k, "largest": largest, "out": "indices"}, shape, "int32",
                    0, n - 1)
        self.lines.append(f"{vals.name}, {idx.name} = {call}")
        if c.chance(0.5):       # the indices used: the values gathered back (in range: a NaN's own)
            return self.add("gather", [x.id, idx.id], {"dim": d, "mode": "gather"}, shape, x.dtype, x.lo, x.hi,
                            f"pypto.gather({x.name}, {dim}, {idx.name})")
        return vals
