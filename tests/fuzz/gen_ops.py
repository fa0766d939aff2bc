"""Generator steps for the ops of pypto's op registry (mixed into gen.Generator).

Comparisons (masks, dtype "bool") feeding where / masked_fill / logic ops / mask arithmetic,
isnan / isfinite; the element-wise math of the registry (silu, softplus, hardswish, ..., clamp,
pow, floor / ceil / round / trunc, sign); remainder / fmod with nonzero divisors; var / std /
prod / logsumexp / argmax / argmin and reductions over several dims; stepped slices; concat and
pad; writes into a value of the kernel; permute / squeeze / unsqueeze / flatten.

Every new node is modelled (shape, dtype, interval) here and evaluated in reference.py from its
documented semantics, never from the registry's own `ref` functions.
"""
from __future__ import annotations

import math

FLOATS = ("fp32", "fp16", "bf16")
SAFE_PROD = {"fp32": 1e30, "fp16": 1e4, "bf16": 1e30, "int8": 100, "int32": 2**30}
INTS = ("int32", "int8")
# the dtypes as a kernel's source names them
PY_DT = {"fp32": "pypto.DT_FP32", "fp16": "pypto.DT_FP16", "bf16": "pypto.DT_BF16",
         "int8": "pypto.DT_INT8", "int32": "pypto.DT_INT32"}
CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
UN2_FLOAT = ("silu", "softplus", "hardswish", "hardsigmoid", "square", "expm1", "log1p", "leaky_relu", "elu",
             "clamp", "pow", "floor", "ceil", "round", "trunc", "sign")
UN2_INT = ("square", "clamp", "floor", "ceil", "round", "trunc", "sign")


def _bshape(*shapes):
    from .gen import broadcast
    out = ()
    for s in shapes:
        out = broadcast(out, s)
        if out is None:
            return None
    return out


class OpSteps:
    """Mixin: needs self.c, self.add, self.pick_value, self.new_input, self.unary, self.binary,
    self.positive, self.fits, self.const, self.bcast_partner, self.cast, self.lines."""

    # --- masks ---------------------------------------------------------------------------
    def _num_text(self, v, dtype):
        if dtype in INTS:
            return str(int(v))
        if v == float("inf"):
            return "float('inf')"
        if v == float("-inf"):
            return "float('-inf')"
        return repr(float(v))

    def _inside(self, x):
        """A number inside (or at the edge of) x's interval, of x's kind."""
        c = self.c
        lo, hi = x.lo, x.hi
        if x.dtype in INTS:
            return c.pick([int(round((lo + hi) / 2)), int(lo), int(hi), 0, 1])
        return c.pick([round((lo + hi) / 2, 3), 0.0, round(lo + 0.25 * (hi - lo), 2), 0.5, float(round(hi))])

    def make_mask(self, x):
        from .gen import MAX_ELEMS
        c = self.c
        if x.dtype in FLOATS and c.chance(0.2):
            fn = c.pick(["isnan", "isfinite"])
            text = f"pypto.{fn}({x.name})" if fn == "isfinite" or c.chance(0.5) else f"{x.name}.isnan()"
            return self.add("isx", [x.id], {"fn": fn}, x.shape, "bool", 0, 1, text)
        fn = c.pick(list(CMP))
        how = c.weighted([(5, "const"), (3, "node"), (2, "input")])
        b = None
        if how == "node":
            b = self.pick_value(lambda n: n.dtype == x.dtype and n.id != x.id and _bshape(x.shape, n.shape) is not None
                                and math.prod(_bshape(x.shape, n.shape)) <= MAX_ELEMS)
        elif how == "input":
            b = self.new_input(self.bcast_partner(x.shape), x.dtype)
            if b is not None and math.prod(_bshape(x.shape, b.shape) or (MAX_ELEMS + 1,)) > MAX_ELEMS:
                b = None
        if b is None:
            b = ("c", self._inside(x))
        swap = isinstance(b, tuple) and c.chance(0.25)
        bn = self._num_text(b[1], x.dtype) if isinstance(b, tuple) else b.name
        left, right = (bn, x.name) if swap else (x.name, bn)
        text = f"{left} {CMP[fn]} {right}" if c.chance(0.6) else f"pypto.{fn}({left}, {right})"
        args = [x.id, b if isinstance(b, tuple) else b.id]
        if swap:
            args.reverse()
        shape = x.shape if isinstance(b, tuple) else _bshape(x.shape, b.shape)
        return self.add("cmp", args, {"fn": fn}, shape, "bool", 0, 1, text)

    def s_select(self, x):
        from .gen import MAX_ELEMS
        c = self.c
        m = self.make_mask(x)
        if c.chance(0.3):                        # two conditions combined
            y = self.pick_value(lambda n: n.dtype != "bool" and _bshape(n.shape, m.shape) is not None
                                and math.prod(_bshape(n.shape, m.shape)) <= MAX_ELEMS) or x
            m2 = self.make_mask(y)
            fn = c.pick(["logical_and", "logical_or", "logical_xor"])
            sym = {"logical_and": "&", "logical_or": "|", "logical_xor": "^"}[fn]
            text = f"{m.name} {sym} {m2.name}" if c.chance(0.5) else f"pypto.{fn}({m.name}, {m2.name})"
            both = _bshape(m.shape, m2.shape)
            if both is not None:                 # (y's mask may be broadcast further than y)
                m = self.add("logic", [m.id, m2.id], {"fn": fn}, both, "bool", 0, 1, text)
        if c.chance(0.15):
            text = f"~{m.name}" if c.chance(0.5) else f"pypto.logical_not({m.name})"
            m = self.add("logic", [m.id], {"fn": "logical_not"}, m.shape, "bool", 0, 1, text)
        use = c.weighted([(5, "where"), (3, "masked_fill"), (2, "arith")])
        if use == "masked_fill" and _bshape(x.shape, m.shape) == tuple(x.shape):
            if x.dtype in FLOATS:
                v = c.pick([0.0, -1e4 if x.dtype != "fp16" else -1e3, float("-inf"), 1.5, float("nan")])
            else:
                v = c.pick([0, -1, 7])
            vt = "float('nan')" if v != v else self._num_text(v, x.dtype)
            text = (f"pypto.masked_fill({x.name}, {m.name}, {vt})" if c.chance(0.6)
                    else f"{x.name}.masked_fill({m.name}, {vt})")
            fin = [v] if math.isfinite(v) else []
            return self.add("mfill", [x.id, m.id], {"value": v}, x.shape, x.dtype, min([x.lo] + fin),
                            max([x.hi] + fin), text)
        if use == "arith":
            if c.chance(0.5):
                to = x.dtype if c.chance(0.6) else c.pick(["fp32", "int32", "fp16"])
                n = self.add("mcast", [m.id], {"to": to}, m.shape, to, 0, 1, f"pypto.cast({m.name}, {PY_DT[to]})")
                if _bshape(n.shape, x.shape) is None or n.dtype != x.dtype:
                    return n
                m = n
            shape = _bshape(x.shape, m.shape)
            text = f"{x.name} * {m.name}" if c.chance(0.5) else f"{m.name} * {x.name}"
            return self.add("mmul", [x.id, m.id], {}, shape, x.dtype, min(x.lo, 0), max(x.hi, 0), text)
        # where: the values from x, another value, or numbers
        def branch():
            k = c.weighted([(4, "x"), (3, "const"), (3, "node")])
            if k == "node":
                b = self.pick_value(lambda n: n.dtype == x.dtype and n.id != x.id
                                    and _bshape(n.shape, m.shape, x.shape) is not None
                                    and math.prod(_bshape(n.shape, m.shape, x.shape)) <= MAX_ELEMS)
                if b is not None:
                    return b
            if k == "const":
                return ("c", self.const(x.dtype) if c.chance(0.7) else 0)
            return x
        a, b = branch(), branch()
        if isinstance(a, tuple) and isinstance(b, tuple):
            a = x
        shapes = [m.shape] + [v.shape for v in (a, b) if not isinstance(v, tuple)]
        shape = _bshape(*shapes)
        if shape is None:               # a combined mask that no longer broadcasts with x: no op
            return x
        iv = [(v[1], v[1]) if isinstance(v, tuple) else (v.lo, v.hi) for v in (a, b)]
        txt = [self._num_text(v[1], x.dtype) if isinstance(v, tuple) else v.name for v in (a, b)]
        if not isinstance(a, tuple) and c.chance(0.2):
            text = f"{txt[0]}.where({m.name}, {txt[1]})"
        else:
            text = f"pypto.where({m.name}, {txt[0]}, {txt[1]})"
        args = [m.id] + [v if isinstance(v, tuple) else v.id for v in (a, b)]
        return self.add("where", args, {}, shape, x.dtype, min(iv[0][0], iv[1][0]), max(iv[0][1], iv[1][1]), text)

    # --- element-wise math ---------------------------------------------------------------
    def s_un2(self, x):
        c = self.c
        isf = x.dtype in FLOATS
        fn = c.pick(UN2_FLOAT if isf else UN2_INT)
        lo, hi = x.lo, x.hi
        m = max(abs(lo), abs(hi))
        attrs = {"fn": fn}
        if fn == "square" and not self.fits(x.dtype, 0, m * m):
            fn = attrs["fn"] = "sign"
        if fn == "expm1" and hi > (8 if x.dtype == "fp16" else 30):
            fn = attrs["fn"] = "softplus"
        if fn == "softplus" and x.dtype == "fp16" and hi > 3e4:
            fn = attrs["fn"] = "hardsigmoid"
        if fn == "log1p" and lo <= -0.9:
            x = self.positive(x)
            lo, hi = x.lo, x.hi
        name = x.name
        if fn == "silu":
            lo, hi, text = -0.28, max(hi, 0.0), f"pypto.silu({name})"
        elif fn == "softplus":
            lo, hi, text = 0.0, max(hi, 0.0) + 0.7, f"pypto.softplus({name})"
        elif fn == "hardswish":
            lo, hi, text = -0.375, max(hi, 0.0), f"pypto.hardswish({name})"
        elif fn == "hardsigmoid":
            lo, hi, text = 0.0, 1.0, f"pypto.hardsigmoid({name})"
        elif fn == "square":
            lo = 0.0 if lo <= 0 <= hi else min(lo * lo, hi * hi)
            hi = m * m
            text = c.pick([f"pypto.square({name})", f"{name}.square()", f"{name} ** 2"])
        elif fn == "expm1":
            lo, hi, text = math.expm1(lo), math.expm1(hi), c.pick([f"pypto.expm1({name})", f"{name}.expm1()"])
        elif fn == "log1p":
            lo, hi, text = math.log1p(lo), math.log1p(hi), c.pick([f"pypto.log1p({name})", f"{name}.log1p()"])
        elif fn == "leaky_relu":
            s = attrs["slope"] = c.pick([0.01, 0.2, 0.5])
            lo = min(lo, lo * s)
            text = c.pick([f"pypto.leaky_relu({name}, {s!r})", f"pypto.leaky_relu({name}, negative_slope={s!r})"]) \
                if s != 0.01 or c.chance(0.5) else f"pypto.leaky_relu({name})"
        elif fn == "elu":
            a = attrs["alpha"] = c.pick([1.0, 0.5, 2.0])
            lo, hi = a * math.expm1(min(lo, 0.0)), max(hi, a * math.expm1(min(hi, 0.0)))
            text = f"pypto.elu({name})" if a == 1.0 and c.chance(0.5) else f"pypto.elu({name}, alpha={a!r})"
        elif fn == "clamp":
            a, b = self._inside(x), self._inside(x)
            a, b = min(a, b), max(a, b)
            if c.chance(0.2):
                a = None
            elif c.chance(0.2):
                b = None
            attrs["min"], attrs["max"] = a, b
            at = None if a is None else self._num_text(a, x.dtype)
            bt = None if b is None else self._num_text(b, x.dtype)
            if a is not None:
                lo, hi = max(lo, a), max(hi, a)
            if b is not None:
                lo, hi = min(lo, b), min(hi, b)
            form = c.pick(["fn", "method", "kw", "clip"])
            if form == "kw" or a is None or b is None:
                kws = ", ".join(k for k in ((f"min={at}" if at else ""), (f"max={bt}" if bt else "")) if k)
                text = f"pypto.clamp({name}, {kws})"
            elif form == "method":
                text = f"{name}.clamp({at}, {bt})"
            else:
                text = f"pypto.{'clip' if form == 'clip' else 'clamp'}({name}, {at}, {bt})"
        elif fn == "pow":
            e = c.pick([2, 3, 0.5, -1, 4, -0.5, 1.5, -2])
            if e in (0.5, -0.5, 1.5) or e < 0:
                if x.lo < 0.1:
                    x = self.positive(x)
                name = x.name
            lo, hi = x.lo, x.hi
            mm = max(abs(lo), abs(hi))
            if e > 0 and not self.fits(x.dtype, 0, mm ** e):
                e = 0.5
                if x.lo < 0.1:
                    x = self.positive(x)
                name, lo, hi = x.name, x.lo, x.hi
            if e < 0 and x.lo ** e > (1e4 if x.dtype == "fp16" else 1e30):
                e = 0.5
            attrs["exponent"] = e
            if float(e).is_integer() and e > 0 and int(e) % 2 == 0:
                lo, hi = (0.0 if lo <= 0 <= hi else min(lo ** e, hi ** e)), max(abs(lo), abs(hi)) ** e
            elif lo > 0:
                lo, hi = sorted((lo ** e, hi ** e))
            else:
                lo, hi = -(max(abs(lo), abs(hi)) ** e), max(abs(lo), abs(hi)) ** e
            et = repr(e)
            text = c.pick([f"pypto.pow({name}, {et})", f"{name} ** {et}", f"{name}.pow({et})"])
        elif fn in ("floor", "ceil", "round", "trunc"):
            lo, hi = math.floor(lo), math.ceil(hi)
            text = f"pypto.{fn}({name})" if c.chance(0.6) else f"{name}.{fn}()"
        else:   # sign
            lo, hi, text = -1.0, 1.0, f"pypto.sign({name})"
        return self.add("un2", [x.id], attrs, x.shape, x.dtype, lo, hi, text)

    def s_mod(self, x):
        from .gen import MAX_ELEMS
        c = self.c
        fn = c.pick(["remainder", "fmod"])
        isf = x.dtype in FLOATS
        swap = False
        how = c.weighted([(5, "const"), (3, "node"), (1, "swap")])
        if how == "swap":                       # number % tensor: the tensor is the divisor
            num = c.pick([5.0, -3.5, 1.0]) if isf else c.pick([5, -7, 1])
            d = self.positive(x)
            if c.chance(0.3):
                d = self.unary(d, "neg", form="fn")
            a, b, swap = ("c", num), d, True
            bm = max(abs(d.lo), abs(d.hi))
        elif how == "node":
            y = self.pick_value(lambda n: n.dtype == x.dtype and _bshape(x.shape, n.shape) is not None
                                and math.prod(_bshape(x.shape, n.shape)) <= MAX_ELEMS) or x
            d = self.positive(y)
            if c.chance(0.3):
                d = self.unary(d, "neg", form="fn")
            a, b = x, d
            bm = max(abs(d.lo), abs(d.hi))
        else:
            v = c.pick([2.0, 0.75, -1.5, 3.0, 0.1]) if isf else c.pick([3, -2, 5, 7, 1])
            a, b = x, ("c", v)
            bm = abs(v)
        am = abs(a[1]) if isinstance(a, tuple) else max(abs(x.lo), abs(x.hi))
        m = min(am, bm) if fn == "fmod" else bm
        lo, hi = -m, m
        names = [self._num_text(v[1], x.dtype) if isinstance(v, tuple) else v.name for v in (a, b)]
        if fn == "remainder" and c.chance(0.5):
            text = f"{names[0]} % {names[1]}"
        elif not swap and c.chance(0.3):
            text = f"{names[0]}.{fn}({names[1]})"
        else:
            text = f"pypto.{fn}({names[0]}, {names[1]})"
        shapes = [v.shape for v in (a, b) if not isinstance(v, tuple)]
        args = [v if isinstance(v, tuple) else v.id for v in (a, b)]
        return self.add("mod", args, {"fn": fn}, _bshape(*shapes), x.dtype, lo, hi, text)

    # --- reductions --------------------------------------------------------------------------
    def s_red2(self, x):
        c = self.c
        isf = x.dtype in FLOATS
        r = len(x.shape)
        opts = [(2, "var"), (2, "std"), (2, "prod"), (2, "logsumexp"), (2, "argmax"), (1, "argmin"),
                (2, "msum"), (1, "mamax"), (1, "mmean")] if isf else \
            [(2, "prod"), (2, "argmax"), (1, "argmin"), (2, "msum"), (1, "mamax")]
        fn = c.weighted(opts)
        keepdim = c.chance(0.4)
        if fn in ("msum", "mamax", "mmean"):
            if r >= 2 and c.chance(0.7):
                d0 = c.int(0, r - 1)
                d1 = (d0 + c.int(1, r - 1)) % r
                dims = tuple(sorted((d0, d1))) if c.chance(0.7) else (d1, d0)
                dims_t = repr(tuple(d - r if c.chance(0.3) else d for d in dims))
                dims = tuple(sorted(dims))
            else:
                dims, dims_t = tuple(range(r)), "None"
            n = math.prod(x.shape[d] for d in dims)
            if fn == "msum" and not isf and not self.fits(x.dtype, x.lo * n, x.hi * n):
                if x.dtype == "int8" and self.fits("int32", x.lo * n, x.hi * n):
                    x = self.cast(x, "int32")
                else:
                    fn = "mamax"
            if fn in ("msum", "mmean") and x.dtype == "fp16" and max(abs(x.lo), abs(x.hi)) * n > 3e4:
                x = self.cast(x, "fp32")
            lo, hi = x.lo, x.hi
            if fn == "msum":
                lo, hi = min(lo * n, lo), max(hi * n, hi)
            base = {"msum": "sum", "mamax": "amax", "mmean": "mean"}[fn]
            shape = tuple(1 if d in dims else s for d, s in enumerate(x.shape)) if keepdim else \
                tuple(s for d, s in enumerate(x.shape) if d not in dims)
            kd = ", keepdim=True" if keepdim else ""
            text = (f"{x.name}.{base}(dim={dims_t}{kd})" if c.chance(0.25)
                    else f"pypto.{base}({x.name}, dim={dims_t}{kd})")
            return self.add("red2", [x.id], {"fn": fn, "dims": dims, "keepdim": keepdim}, shape, x.dtype,
                            lo, hi, text)
        dim = c.int(-r, r - 1)
        d = dim % r
        n = x.shape[d]
        attrs = {"fn": fn, "dims": (d,), "keepdim": keepdim}
        kd = ", keepdim=True" if keepdim else ""
        if fn in ("argmax", "argmin"):
            if c.chance(0.25):          # over all elements
                attrs["dims"] = tuple(range(r))
                shape = (1,) * r if keepdim else ()
                if keepdim:             # torch keeps every dim as 1; keep it simple: no keepdim
                    keepdim = attrs["keepdim"] = False
                    shape, kd = (), ""
                text = f"pypto.{fn}({x.name}{kd})" if c.chance(0.6) else f"{x.name}.{fn}()"
                attrs["all"] = True
                return self.add("red2", [x.id], attrs, (), "int32", 0, x.size - 1, text)
            shape = tuple(1 if i == d else s for i, s in enumerate(x.shape)) if keepdim else \
                tuple(s for i, s in enumerate(x.shape) if i != d)
            text = f"pypto.{fn}({x.name}, dim={dim}{kd})" if c.chance(0.7) else f"{x.name}.{fn}({dim}{kd})"
            return self.add("red2", [x.id], attrs, shape, "int32", 0, n - 1, text)
        shape = tuple(1 if i == d else s for i, s in enumerate(x.shape)) if keepdim else \
            tuple(s for i, s in enumerate(x.shape) if i != d)
        lo, hi = x.lo, x.hi
        m = max(abs(lo), abs(hi))
        if fn in ("var", "std"):
            corr = c.pick([1, 0]) if n > 1 or c.chance(0.3) else 0
            attrs["correction"] = corr
            if x.dtype == "fp16" and max((2 * m) ** 2, m) * n > 3e4:
                x = self.cast(x, "fp32")
            return self._var(x, fn, dim, d, keepdim, corr, shape, attrs)
        if fn == "prod":
            big = n * math.log(max(m, 1e-30)) > math.log(1e4 if x.dtype == "fp16" else SAFE_PROD[x.dtype])
            if big:
                if isf:
                    x = self.unary(x, "tanh")
                    m = 1.0
                else:
                    return self.s_red(x)
            lo, hi = -(m ** n), m ** n
            text = f"pypto.prod({x.name}, dim={dim}{kd})" if c.chance(0.7) else f"{x.name}.prod({dim}{kd})"
            return self.add("red2", [x.id], attrs, shape, x.dtype, lo, hi, text)
        # logsumexp
        lo, hi = lo, hi + math.log(n)
        text = (f"pypto.logsumexp({x.name}, dim={dim}{kd})" if c.chance(0.7)
                else f"{x.name}.logsumexp({dim}{kd})")
        return self.add("red2", [x.id], attrs, shape, x.dtype, lo, hi, text)

    def _var(self, x, fn, dim, d, keepdim, corr, shape, attrs):
        c = self.c
        m = max(abs(x.lo), abs(x.hi))
        kd = ", keepdim=True" if keepdim else ""
        cr = c.pick([f", correction={corr}", f", unbiased={bool(corr)}"]) if corr != 1 or c.chance(0.5) else ""
        text = (f"pypto.{fn}({x.name}, dim={dim}{kd}{cr})" if c.chance(0.7) or "unbiased" in cr
                else f"{x.name}.{fn}({dim}{kd}{cr})")
        hi = (2 * m) ** 2 * max(x.shape[d], 2) if fn == "var" else 2 * m * math.sqrt(max(x.shape[d], 2))
        return self.add("red2", [x.id], attrs, shape, x.dtype, 0.0, hi, text)

    # --- layout: stepped slices, concat, pad, writes, permute / squeeze / flatten ----------
    def s_stepview(self, x):
        c = self.c
        src = x
        if c.chance(0.75):
            ins = [n for n in self.nodes if n.op == "input" and n.shape]
            src = c.pick(ins) if ins else x
        if not src.shape:
            return self.s_un2(x)
        keys, offs, shape, steps = [], [], [], []
        for i, dsz in enumerate(src.shape):
            k = c.weighted([(3, 1), (3, 2), (2, 3), (1, 5)]) if dsz > 1 else 1
            o = c.pick([0, 1, 0, 2]) if dsz > 2 else 0
            o = min(o, dsz - 1)
            stop = dsz if c.chance(0.7) else max(o + 1, dsz - c.int(0, dsz // 2))
            cnt = len(range(o, stop, k))
            offs.append(o), shape.append(cnt), steps.append(k)
            if k == 1 and o == 0 and stop == dsz:
                keys.append(":")
            else:
                keys.append(f"{o if o else ''}:{stop if stop != dsz else ''}" + (f":{k}" if k != 1 else ""))
        if all(k == ":" for k in keys):
            i = len(keys) - 1 if src.shape[-1] > 1 else 0
            if src.shape[i] > 1:
                keys[i], steps[i], shape[i] = "::2", 2, len(range(0, src.shape[i], 2))
        while len(keys) > 1 and keys[-1] == ":":
            keys.pop()
        text = f"{src.name}[{', '.join(keys)}]"
        return self.add("view", [src.id], {"shape": tuple(shape), "offsets": tuple(offs), "steps": tuple(steps),
                                           "drop": ()}, shape, src.dtype, src.lo, src.hi, text)

    def s_concat(self, x):
        from .gen import MAX_ELEMS
        c = self.c
        r = len(x.shape)
        dim = c.int(-r, r - 1)
        d = dim % r
        parts = [x]
        for _ in range(c.weighted([(4, 1), (1, 2)])):
            kind = c.pick(["pool", "self", "view", "neg"])
            p = None
            if kind == "pool":
                p = self.pick_value(lambda n: n.dtype == x.dtype and len(n.shape) == r and n.id != x.id and all(
                    a == b for i, (a, b) in enumerate(zip(n.shape, x.shape)) if i != d))
            elif kind == "view" and x.shape[d] > 1:
                k = c.int(1, x.shape[d] - 1)
                shape = tuple(k if i == d else s for i, s in enumerate(x.shape))
                key = ", ".join([":"] * d + [f":{k}"])
                p = self.add("view", [x.id], {"shape": shape, "offsets": (0,) * r, "drop": ()}, shape, x.dtype,
                             x.lo, x.hi, f"{x.name}[{key}]")
            elif kind == "neg":
                p = self.unary(x, "neg")
            parts.append(p or x)
        total = sum(p.shape[d] for p in parts)
        shape = tuple(total if i == d else s for i, s in enumerate(x.shape))
        if math.prod(shape) > MAX_ELEMS:
            return self.s_un2(x)
        names = ", ".join(p.name for p in parts)
        fnn = c.pick(["concat", "cat", "concat"])
        text = f"pypto.{fnn}([{names}], dim={dim})" if c.chance(0.6) else f"pypto.{fnn}(({names}), {dim})"
        return self.add("concat", [p.id for p in parts], {"dim": d}, shape, x.dtype,
                        min(p.lo for p in parts), max(p.hi for p in parts), text)

    def s_pad(self, x):
        from .gen import MAX_ELEMS
        c = self.c
        r = len(x.shape)
        k = 1 if r == 1 or c.chance(0.5) else 2
        pads = [c.pick([1, 0, 2, 3, 16]) for _ in range(2 * k)]
        if not any(pads):
            pads[0] = 1
        shape = list(x.shape)
        for j in range(k):
            shape[r - 1 - j] += pads[2 * j] + pads[2 * j + 1]
        if math.prod(shape) > MAX_ELEMS:
            return self.s_un2(x)
        if x.dtype in FLOATS:
            v = c.pick([0.0, -1.0, 2.5, float("-inf")])
        else:
            v = c.pick([0, -1, 3])
        vt = "" if v == 0 and c.chance(0.5) else f", value={self._num_text(v, x.dtype)}"
        fin = [v] if math.isfinite(v) else []
        text = f"pypto.pad({x.name}, {tuple(pads)!r}{vt})"
        return self.add("pad", [x.id], {"pads": tuple(pads), "value": v}, shape, x.dtype,
                        min([x.lo] + fin), max([x.hi] + fin), text)

    def s_write(self, x):
        c = self.c
        s = x.shape
        r = len(s)
        how = c.weighted([(4, "mul"), (1, "zeros")])
        if how == "zeros":
            buf = self.add("zeros", [], {}, s, x.dtype, 0, 0, f"pypto.zeros_like({x.name})")
        else:
            one = "1.0" if x.dtype in FLOATS else "1"
            buf = self.add("bin", [x.id, ("c", 1.0 if x.dtype in FLOATS else 1)], {"fn": "mul"}, s, x.dtype,
                           x.lo, x.hi, f"{x.name} * {one}")
        # the region: rows a:b (step 1 or 2), maybe columns too, or one index
        form = c.weighted([(4, "rows"), (2, "block"), (1, "index"), (1, "step")])
        offs, shape, steps, drop = [0] * r, list(s), [1] * r, ()
        keys = [":"] * r
        if form == "index" and r >= 2:
            i = c.int(0, s[0] - 1)
            offs[0], shape[0], keys[0], drop = i, 1, str(i), (0,)
        else:
            a = c.int(0, s[0] - 1)
            b = c.int(a + 1, s[0])
            k = 2 if form == "step" and b - a > 2 else 1
            offs[0], shape[0], steps[0] = a, len(range(a, b, k)), k
            keys[0] = f"{a}:{b}" + (f":{k}" if k != 1 else "")
            if form == "block" and r >= 2:
                a1 = c.int(0, s[1] - 1)
                b1 = c.int(a1 + 1, s[1])
                offs[1], shape[1], keys[1] = a1, b1 - a1, f"{a1}:{b1}"
        vshape = tuple(n for i, n in enumerate(shape) if i not in drop)
        val = self.pick_value(lambda n: n.dtype == x.dtype and n.shape == vshape and n.id != buf.id)
        if val is None or c.chance(0.4):
            # a window of x elsewhere, scaled
            src_offs = [c.int(0, d - n) if st == 1 else 0 for d, n, st in zip(s, shape, steps)]
            key = ", ".join(f"{o}:{o + n}" for o, n in zip(src_offs, shape))
            w = self.add("view", [x.id], {"shape": tuple(shape), "offsets": tuple(src_offs), "drop": ()}, shape,
                         x.dtype, x.lo, x.hi, f"{x.name}[{key}]")
            if drop:
                w = self.add("reshape", [w.id], {"shape": vshape}, vshape, x.dtype, w.lo, w.hi,
                             f"{w.name}.reshape({list(vshape)})")
            val = self.unary(w, "neg") if c.chance(0.5) else w
        while len(keys) > 1 and keys[-1] == ":":
            keys.pop()
        self.lines.append(f"{buf.name}[{', '.join(keys)}] = {val.name}")
        buf.attrs["dead"] = True
        n = Node_(self, "write", [buf.id, val.id], {"alias": buf.name, "offsets": tuple(offs), "shape": tuple(shape),
                                                     "steps": tuple(steps)}, s, x.dtype,
                  min(buf.lo, val.lo), max(buf.hi, val.hi))
        return n

    def s_layout2(self, x):
        c = self.c
        s = list(x.shape)
        r = len(s)
        v = c.pick(["permute", "squeeze", "unsqueeze", "flatten"])
        if v == "permute" and r >= 2:
            import itertools
            perm = list(c.pick([p for p in itertools.permutations(range(r)) if list(p) != list(range(r))]))
            t = [s[p] for p in perm]
            shown = [p - r if c.chance(0.2) else p for p in perm]
            text = c.pick([f"pypto.permute({x.name}, {tuple(shown)!r})", f"{x.name}.permute({', '.join(map(str, shown))})",
                           f"pypto.permute({x.name}, {', '.join(map(str, shown))})"])
            return self.add("permute", [x.id], {"perm": tuple(perm)}, t, x.dtype, x.lo, x.hi, text)
        if v == "squeeze" and 1 in s:
            if c.chance(0.5):
                t = [d for d in s if d != 1]
                text = f"pypto.squeeze({x.name})" if c.chance(0.5) else f"{x.name}.squeeze()"
            else:
                i = s.index(1)
                t = s[:i] + s[i + 1:]
                text = f"pypto.squeeze({x.name}, {i})"
            return self.add("reshape", [x.id], {"shape": tuple(t)}, t, x.dtype, x.lo, x.hi, text)
        if v == "flatten" and r >= 2:
            a = c.int(0, r - 2)
            b = c.int(a + 1, r - 1)
            t = s[:a] + [math.prod(s[a:b + 1])] + s[b + 1:]
            text = (f"pypto.flatten({x.name}, {a}, {b})" if (a, b) != (0, r - 1) or c.chance(0.5)
                    else f"{x.name}.flatten()")
            return self.add("reshape", [x.id], {"shape": tuple(t)}, t, x.dtype, x.lo, x.hi, text)
        if r >= 3:
            return self.s_reshape(x)
        i = c.int(-r - 1, r)
        d = i % (r + 1)
        t = s[:d] + [1] + s[d:]
        text = f"pypto.unsqueeze({x.name}, {i})" if c.chance(0.6) else f"{x.name}.unsqueeze({i})"
        return self.add("reshape", [x.id], {"shape": tuple(t)}, t, x.dtype, x.lo, x.hi, text)

    # --- invalid constructs of the new ops (each must end in a located PyptoError) -----------
    def misuse_ops(self, x):
        opts = [f"{{}} = pypto.var({x.name}, dim=(0, -1))", f"{{}} = pypto.where({x.name}, {x.name}, {x.name})",
                f"{{}} = pypto.logical_and({x.name}, {x.name})", f"{{}} = pypto.masked_fill({x.name}, {x.name}, 0)",
                f"{{}} = pypto.pow({x.name}, {x.name})", f"{{}} = pypto.round({x.name}, 2)"]
        if x.dtype in INTS:
            opts += [f"{{}} = pypto.silu({x.name})", f"{{}} = pypto.isnan({x.name})",
                     f"{{}} = pypto.logsumexp({x.name})", f"{{}} = pypto.std({x.name})",
                     f"{{}} = {x.name} ** 0.5", f"{{}} = pypto.clamp({x.name}, 0.5)"]
        if len(x.shape) >= 1:
            opts += [f"{{}} = pypto.concat([{x.name}, pypto.reshape({x.name}, [{x.size}, 1])], dim=0)"
                     if len(x.shape) != 2 or x.shape[1] != 1 else f"{{}} = pypto.pad({x.name}, (1,))",
                     f"{{}} = pypto.permute({x.name}, {tuple([0] * (len(x.shape) + 1))!r})"]
        return opts


def Node_(g, op, args, attrs, shape, dtype, lo, hi):
    """A node whose source line was written by the caller (a write keeps the name of its buffer)."""
    from .gen import Node
    n = Node(len(g.nodes), op, list(args), dict(attrs), tuple(shape), dtype, float(lo), float(hi), "")
    g.nodes.append(n)
    return n
