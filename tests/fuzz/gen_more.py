"""Generator steps for more of the registry's math (mixed into gen.Generator).

`s_un3`: the element-wise composites sinh, cosh, asinh, acosh, atanh, erf, exp2, log2, log10, frac,
hardshrink, softshrink, softsign, tanhshrink, celu, selu, mish, logsigmoid, and isinf (as the mask
of a where); `s_bin3`: hypot, logaddexp, rsub, lerp (a number or a tensor weight), addcmul,
addcdiv, prelu; `s_rowop2`: log_softmax, norm (p = 1, 2, inf), swiglu, and expand / broadcast_to / repeat.

Every node is modelled (shape, dtype, interval) here and evaluated in ref_more.py from the op's
documented decomposition, never from the registry's own `ref` functions.
"""
from __future__ import annotations

import math

from .gen_ops import FLOATS, _bshape

UN3 = ("sinh", "cosh", "asinh", "acosh", "atanh", "erf", "exp2", "log2", "log10", "frac", "hardshrink",
       "softshrink", "softsign", "tanhshrink", "celu", "selu", "mish", "logsigmoid", "isinf")
BIN3 = ("hypot", "logaddexp", "rsub", "lerp", "addcmul", "addcdiv", "prelu")
SELU_ALPHA, SELU_SCALE = 1.6732632423543772, 1.0507009873554805
# the largest |x| whose exp stays finite with room to spare, per dtype (fp16's max is 65504)
EXP_ARG = {"fp32": 80.0, "fp16": 10.0, "bf16": 80.0}


class MoreSteps:
    """Mixin: needs what gen_ops.OpSteps needs."""

    def _float(self, x):
        """x, cast to fp32 when it is an int (these ops are float-only)."""
        return x if x.dtype in FLOATS else self.cast(x, "fp32")

    def _small(self, x, limit):
        """x, or tanh(x) * limit when its values reach past +-limit (an exp of it would overflow)."""
        if max(abs(x.lo), abs(x.hi)) <= limit:
            return x
        t = self.unary(x, "tanh", form="fn")
        return self.binary(t, ("c", float(limit)), "mul", form="op")

    # --- element-wise composites ---------------------------------------------------------------
    def s_un3(self, x):
        c = self.c
        x = self._float(x)
        fn = c.pick(UN3)
        attrs = {"fn": fn}
        dt = x.dtype
        if fn in ("sinh", "cosh", "celu", "selu", "mish", "exp2"):
            x = self._small(x, EXP_ARG[dt] / (1.5 if fn == "exp2" else 1.0))
        elif fn in ("log2", "log10"):
            x = self.positive(x)
        elif fn == "acosh":                     # x >= 1
            x = self.binary(self.positive(x), ("c", 1.0), "add", form="op")
        elif fn == "atanh":                     # |x| <= 0.9
            x = self._small(x, 0.9)
        lo, hi, name = x.lo, x.hi, x.name
        m = max(abs(lo), abs(hi))
        text = f"pypto.{fn}({name})"
        if fn == "sinh":
            lo, hi = math.sinh(lo), math.sinh(hi)
        elif fn == "cosh":
            lo, hi = (1.0 if lo <= 0 <= hi else math.cosh(min(abs(lo), abs(hi)))), math.cosh(m)
        elif fn == "asinh":
            lo, hi = math.asinh(lo), math.asinh(hi)
            text = c.pick([text, f"pypto.arcsinh({name})"])
        elif fn == "acosh":
            lo, hi = math.acosh(max(lo, 1.0)), math.acosh(max(hi, 1.0))
        elif fn == "atanh":
            lo, hi = math.atanh(max(lo, -0.9)), math.atanh(min(hi, 0.9))
        elif fn == "erf":
            lo, hi = math.erf(lo), math.erf(hi)
        elif fn == "exp2":
            lo, hi = 2.0 ** lo, 2.0 ** hi
        elif fn in ("log2", "log10"):
            f = math.log2 if fn == "log2" else math.log10
            lo, hi = f(lo), f(hi)
        elif fn == "frac":
            lo, hi = (-1.0 if lo < 0 else 0.0), (1.0 if hi > 0 else 0.0)
        elif fn in ("hardshrink", "softshrink"):
            lam = attrs["lambd"] = c.pick([0.5, 0.25, 1.0, 0.0])
            if fn == "softshrink":
                lo, hi = min(lo + lam, 0.0), max(hi - lam, 0.0)
            else:
                lo, hi = min(lo, 0.0), max(hi, 0.0)
            if lam != 0.5 or c.chance(0.5):
                text = f"pypto.{fn}({name}, {lam!r})" if c.chance(0.5) else f"pypto.{fn}({name}, lambd={lam!r})"
        elif fn == "softsign":
            lo, hi = lo / (1 + abs(lo)), hi / (1 + abs(hi))
        elif fn == "tanhshrink":
            lo, hi = lo - math.tanh(lo), hi - math.tanh(hi)
        elif fn == "celu":
            a = attrs["alpha"] = c.pick([1.0, 0.5, 2.0])
            x = self._small(x, EXP_ARG[dt] * a) if a < 1 else x
            lo, hi = -a, max(x.hi, 0.0)
            if a != 1.0 or c.chance(0.5):
                text = f"pypto.celu({x.name}, {a!r})" if c.chance(0.5) else f"pypto.celu({x.name}, alpha={a!r})"
            else:
                text = f"pypto.celu({x.name})"
        elif fn == "selu":
            lo, hi = -SELU_SCALE * SELU_ALPHA, SELU_SCALE * max(hi, 0.0)
        elif fn == "mish":
            lo, hi = -0.31, max(hi, 0.0)
        elif fn == "logsigmoid":
            lo, hi = min(lo, 0.0) - math.log(2.0), 0.0
        else:   # isinf: the mask of a where (or a masked_fill)
            mask = self.add("isinf", [x.id], {}, x.shape, "bool", 0, 1,
                            f"pypto.isinf({name})" if c.chance(0.6) else f"{name}.isinf()")
            v = c.pick([0.0, 1.0, -2.5])
            vt = self._num_text(v, dt)
            text = (f"pypto.where({mask.name}, {vt}, {name})" if c.chance(0.5)
                    else f"pypto.masked_fill({name}, {mask.name}, {vt})")
            return self.add("where", [mask.id, ("c", v), x.id], {}, x.shape, dt, min(lo, v), max(hi, v), text)
        if fn != "celu" and c.chance(0.2) and fn in ("sinh", "cosh", "asinh", "acosh", "atanh", "erf",
                                                         "exp2", "log2", "log10", "frac"):
            text = f"{name}.{fn}()"
        return self.add("un3", [x.id], attrs, x.shape, x.dtype, lo, hi, text)

    # --- two and three operands ------------------------------------------------------------------
    def _partner(self, x, ok=lambda n: True):
        """A value of x's dtype that broadcasts with x (from the pool, a new input, or x itself)."""
        from .gen import MAX_ELEMS
        c = self.c
        y = None
        if c.chance(0.5):
            y = self.pick_value(lambda n: n.dtype == x.dtype and n.id != x.id and ok(n)
                                and _bshape(x.shape, n.shape) is not None
                                and math.prod(_bshape(x.shape, n.shape)) <= MAX_ELEMS)
        if y is None and c.chance(0.7):
            y = self.new_input(self.bcast_partner(x.shape), x.dtype)
            if y is not None and (not ok(y) or math.prod(_bshape(x.shape, y.shape) or (MAX_ELEMS + 1,)) > MAX_ELEMS):
                y = None
        return y if y is not None else self.unary(x, "neg", form="fn")

    def s_bin3(self, x):
        c = self.c
        x = self._float(x)
        dt = x.dtype
        fn = c.pick(BIN3)
        if fn == "prelu":
            return self._prelu(x) if x.shape else self.s_un3(x)
        big = math.sqrt(1e4 if dt == "fp16" else 1e30) / 2
        if fn == "hypot":
            x = self._small(x, big)
            y = self._small(self._partner(x), big)
            shape = _bshape(x.shape, y.shape)
            if shape is None:
                return x
            m = math.hypot(max(abs(x.lo), abs(x.hi)), max(abs(y.lo), abs(y.hi)))
            return self.add("bin3", [x.id, y.id], {"fn": fn}, shape, dt, 0.0, m, f"pypto.hypot({x.name}, {y.name})")
        if fn == "logaddexp":
            y = self._partner(x)
            shape = _bshape(x.shape, y.shape)
            if shape is None:
                return x
            return self.add("bin3", [x.id, y.id], {"fn": fn}, shape, dt, max(x.lo, y.lo),
                            max(x.hi, y.hi) + math.log(2.0), f"pypto.logaddexp({x.name}, {y.name})")
        if fn == "rsub":
            alpha = c.pick([1, 1, 2, 0.5])
            al = "" if alpha == 1 and c.chance(0.5) else f", alpha={alpha!r}"
            if c.chance(0.4):       # other a number: number - alpha * x
                v = self.const(dt)
                args, shape = [x.id, ("c", float(v))], x.shape
                olo = ohi = float(v)
                text = f"pypto.rsub({x.name}, {self._num_text(v, dt)}{al})"
            else:
                y = self._partner(x)
                shape = _bshape(x.shape, y.shape)
                if shape is None:
                    return x
                args, olo, ohi = [x.id, y.id], y.lo, y.hi
                text = f"pypto.rsub({x.name}, {y.name}{al})"
            p = (alpha * x.lo, alpha * x.hi)
            lo, hi = olo - max(p), ohi - min(p)
            if not self.fits(dt, lo, hi):
                return x
            return self.add("bin3", args, {"fn": fn, "alpha": alpha}, shape, dt, lo, hi, text)
        # lerp, addcmul, addcdiv: three operands
        y = self._partner(x)
        if fn == "lerp":
            if c.chance(0.5):
                w = c.pick([0.25, 0.5, 0.75, 1.5, -0.5])
                shape = _bshape(x.shape, y.shape)
                if shape is None:
                    return x
                args, wt, wlo, whi = [x.id, y.id], repr(w), w, w
                attrs = {"fn": fn, "weight": w}
            else:
                w = self.unary(self._partner(x), "sigmoid", form="fn")
                shape = _bshape(x.shape, y.shape, w.shape)
                if shape is None:
                    return x
                args, wt, wlo, whi = [x.id, y.id, w.id], w.name, 0.0, 1.0
                attrs = {"fn": fn}
            ds = (y.lo - x.hi, y.hi - x.lo)
            p = [a * b for a in (wlo, whi) for b in ds]
            lo, hi = x.lo + min(p), x.hi + max(p)
            text = f"pypto.lerp({x.name}, {y.name}, {wt})"
            if not self.fits(dt, lo, hi):
                return x
            return self.add("bin3", args, attrs, shape, dt, lo, hi, text)
        z = self._partner(x)
        if fn == "addcdiv":
            z = self.positive(z)
            if c.chance(0.3):
                z = self.unary(z, "neg", form="fn")
        shape = _bshape(x.shape, y.shape, z.shape)
        if shape is None:
            return x
        value = c.pick([1, 0.5, -2.0, 3])
        ym, zm = max(abs(y.lo), abs(y.hi)), max(abs(z.lo), abs(z.hi))
        q = ym * zm if fn == "addcmul" else ym / max(min(abs(z.lo), abs(z.hi)), 0.1)
        m = abs(value) * q
        lo, hi = x.lo - m, x.hi + m
        if not self.fits(dt, lo, hi) or not self.fits(dt, -q, q):
            return x
        vt = "" if value == 1 and c.chance(0.5) else f", value={value!r}"
        text = f"pypto.{fn}({x.name}, {y.name}, {z.name}{vt})"
        return self.add("bin3", [x.id, y.id, z.id], {"fn": fn, "value": value}, shape, dt, lo, hi, text)

    def _prelu(self, x):
        """prelu(x, weight): weight one element, or one per channel (dim 1 of x), a kernel input."""
        c = self.c
        r = len(x.shape)
        channels = x.shape[1] if r >= 2 else 1
        n = channels if (channels > 1 and c.chance(0.6)) else 1
        w = self.new_input((n,), x.dtype, kind=c.pick([(0.0, 0.5), (-1.0, 1.0), (0.25, 0.25)]))
        if w is None:
            return x
        m = max(abs(w.lo), abs(w.hi))
        lo, hi = min(x.lo, 0.0, -m * max(abs(x.lo), abs(x.hi))), max(x.hi, 0.0, m * max(abs(x.lo), abs(x.hi)))
        return self.add("bin3", [x.id, w.id], {"fn": "prelu", "channels": n > 1}, x.shape, x.dtype, lo, hi,
                        f"pypto.prelu({x.name}, {w.name})")

    # --- row ops ---------------------------------------------------------------------------------
    def s_rowop2(self, x):
        c = self.c
        fn = c.pick(["log_softmax", "norm", "swiglu", "expand"])
        if fn == "expand":              # (ints too)
            return self._expand(x)
        x = self._float(x)
        r = len(x.shape)
        dim = c.int(-r, r - 1)
        d = dim % r
        if fn == "swiglu":
            if x.shape[d] % 2:
                fn = "log_softmax"
            else:
                h = x.shape[d] // 2
                shape = tuple(h if i == d else s for i, s in enumerate(x.shape))
                m = max(abs(x.lo), abs(x.hi))
                if not self.fits(x.dtype, -m * m, m * m):
                    return self.s_un3(x)
                text = f"pypto.swiglu({x.name}, dim={dim})" if dim != -1 or c.chance(0.5) else f"pypto.swiglu({x.name})"
                return self.add("rowop2", [x.id], {"fn": fn, "dim": d}, shape, x.dtype, -0.28 * m - m * m, m * m,
                                text)
        if fn == "log_softmax":
            n = x.shape[d]
            text = c.pick([f"pypto.log_softmax({x.name}, dim={dim})", f"pypto.log_softmax({x.name}, {dim})"])
            return self.add("rowop2", [x.id], {"fn": fn, "dim": d}, x.shape, x.dtype,
                            -(x.hi - x.lo) - math.log(n), 0.0, text)
        p = c.pick([2, 1, float("inf")])
        keepdim = c.chance(0.4)
        n = x.shape[d]
        m = max(abs(x.lo), abs(x.hi))
        if x.dtype == "fp16" and m * m * n > 3e4:
            x = self.cast(x, "fp32")
        shape = tuple(1 if i == d else s for i, s in enumerate(x.shape)) if keepdim else \
            tuple(s for i, s in enumerate(x.shape) if i != d)
        pt = "float('inf')" if p == float("inf") else repr(p)
        kd = ", keepdim=True" if keepdim else ""
        text = (f"pypto.norm({x.name}, dim={dim}{kd})" if p == 2 and c.chance(0.4)
                else f"pypto.norm({x.name}, p={pt}, dim={dim}{kd})")
        hi = m * (n if p == 1 else math.sqrt(n) if p == 2 else 1)
        return self.add("rowop2", [x.id], {"fn": "norm", "dim": d, "p": float(p), "keepdim": keepdim}, shape,
                        x.dtype, 0.0, hi, text)

    def _expand(self, x):
        """x.expand (a dim of 1 grown, a leading dim added; -1 keeps a dim), broadcast_to, or
        repeat (concatenated copies)."""
        from .gen import MAX_ELEMS
        c = self.c
        s = list(x.shape)
        lead = [c.pick([2, 3])] if (c.chance(0.4) or 1 not in s) and len(s) < 4 else []
        if c.chance(0.3):           # repeat: counts per dim (and the leading ones)
            counts = lead + [c.pick([1, 2, 3]) if c.chance(0.6) else 1 for _ in s]
            if all(k == 1 for k in counts):
                counts[-1] = 2
            shape = tuple(lead) + tuple(n * k for n, k in zip(s, counts[len(lead):]))
            if math.prod(shape) > MAX_ELEMS:
                return self.s_un3(x)
            text = c.pick([f"{x.name}.repeat({', '.join(map(str, counts))})", f"pypto.repeat({x.name}, {counts!r})"])
            return self.add("rowop2", [x.id], {"fn": "repeat", "counts": tuple(counts)}, shape, x.dtype, x.lo, x.hi,
                            text)
        grown = [c.pick([2, 4, 5]) if n == 1 else n for n in s]
        shape = tuple(lead + grown)
        if shape == tuple(s) or math.prod(shape) > MAX_ELEMS:
            return self.s_un3(x)
        sizes = lead + [-1 if n == g and c.chance(0.3) else g for n, g in zip(s, grown)]
        form = c.pick(["method", "fn", "broadcast_to"])
        if form == "broadcast_to":
            text = f"pypto.broadcast_to({x.name}, {list(shape)!r})"
        elif form == "fn":
            text = f"pypto.expand({x.name}, {', '.join(map(str, sizes))})"
        else:
            text = f"{x.name}.expand({tuple(sizes)!r})" if c.chance(0.5) else f"{x.name}.expand({', '.join(map(str, sizes))})"
        return self.add("rowop2", [x.id], {"fn": "expand", "shape": shape}, shape, x.dtype, x.lo, x.hi, text)
