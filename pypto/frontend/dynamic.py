"""Dynamic shapes: `pypto.DYNAMIC` dims, `pypto.SymbolicScalar` sizes and loop indices, and the
symbolic `pypto.loop`.

A kernel parameter annotated `x: pypto.Tensor([pypto.DYNAMIC, 1024], pypto.DT_FP32)` has a first
dim whose size is known only when the kernel is called.  Such a kernel is compiled once, for a
*chunk* of that dim (some hundreds of rows, `CompiledKernel.dynamic.chunk`), and the chunk's
program runs as many times as a call needs (`pypto.compiler.dynamic`).  That is exact only when
every row of the outputs is computed the same way from the same rows of the inputs, so while
tracing, the size of the dim is a `SymbolicScalar` (it prints as `N`; its value is the chunk's),
and what would make the result depend on where the chunk boundaries fall is an error at the
kernel's line: fixed row offsets into the dim (slice with the index of `pypto.loop(0, N, step)`
instead), the size used as a number in the computation, Python `if` on it.  The compiler checks
the rest on the Tensor Graph (no op may reduce over or mix rows of the dim).
"""
from __future__ import annotations

import sys

from ..errors import UnsupportedError, in_package


class _Dynamic:
    """The marker of a dim whose size is known only at call time (`pypto.DYNAMIC`)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self):
        return "pypto.DYNAMIC"

    def __reduce__(self):
        return (_Dynamic, ())


DYNAMIC = _Dynamic()

# The symbol a dynamic dim's size is traced as (every DYNAMIC dim of a kernel is the same size).
SIZE_NAME = "N"


def called_by_user(own_file: str, depth: int = 2) -> bool:
    """Whether the code that called into module `own_file` (the first frame past its own, from
    `depth` frames up) is the user's: the package's own shape arithmetic sees plain ints."""
    f = sys._getframe(depth)
    while f is not None and f.f_code.co_filename == own_file:
        f = f.f_back
    return f is not None and not in_package(f.f_code.co_filename)


def _from_user() -> bool:
    return called_by_user(__file__)


def _v(n) -> int:
    """The plain int of `n` (a SymbolicScalar's value), without the check `int()` makes."""
    return int.__int__(n)


class SymbolicScalar(int):
    """An integer known only when the kernel is called: the size `N` of a `pypto.DYNAMIC` dim
    (`x.shape[0]`), or the index of a `pypto.loop` over it.  While tracing it stands for its value
    in the chunk the kernel is compiled for, so it works as an int for shapes, slices and
    `pypto.loop` bounds; what would depend on its run-time value (a Python `if`, division, its
    use as a number in the computation) is an error at the kernel's line."""

    # base: "N" or a loop index's name; kind: "size" or "index"; the value is base + shift;
    # step: a loop index's step
    # (an int subclass cannot have __slots__: the four live in its __dict__)

    def __new__(cls, value: int, base: str = SIZE_NAME, kind: str = "size", shift: int = 0,
                step: int | None = None):
        self = super().__new__(cls, _v(value))
        self.base, self.kind, self.shift, self.step = base, kind, shift, step
        return self

    @property
    def expr(self) -> str:
        s = self.shift
        return self.base if s == 0 else f"{self.base}{'+' if s > 0 else '-'}{abs(s)}"

    def __repr__(self):
        return self.expr

    __str__ = __repr__

    def _moved(self, by: int) -> "SymbolicScalar":
        return SymbolicScalar(_v(self) + by, self.base, self.kind, self.shift + by, self.step)

    def __add__(self, o):
        if isinstance(o, int) and not isinstance(o, (bool, SymbolicScalar)):
            return self._moved(o)
        return _v(self) + o if not _from_user() else self._refuse(f"{self.expr} + {o!r}")

    __radd__ = __add__

    def __sub__(self, o):
        if isinstance(o, int) and not isinstance(o, (bool, SymbolicScalar)):
            return self._moved(-o)
        return _v(self) - o if not _from_user() else self._refuse(f"{self.expr} - {o!r}")

    def __rsub__(self, o):
        return o - _v(self) if not _from_user() else self._refuse(f"{o!r} - {self.expr}")

    def __mul__(self, o):
        if _from_user():
            return self._refuse(f"{self.expr} * {o!r}")
        return _v(self) * o

    __rmul__ = __mul__

    def __floordiv__(self, o):
        return _v(self) // o if not _from_user() else self._refuse(f"{self.expr} // {o!r}")

    def __rfloordiv__(self, o):
        return o // _v(self) if not _from_user() else self._refuse(f"{o!r} // {self.expr}")

    def __truediv__(self, o):
        return _v(self) / o if not _from_user() else self._refuse(f"{self.expr} / {o!r}")

    def __rtruediv__(self, o):
        return o / _v(self) if not _from_user() else self._refuse(f"{o!r} / {self.expr}")

    def __mod__(self, o):
        return _v(self) % o if not _from_user() else self._refuse(f"{self.expr} % {o!r}")

    def __int__(self):
        if _from_user():
            self._refuse(f"int({self.expr})")
        return int.__int__(self)

    def __float__(self):
        return float(_v(self)) if not _from_user() else self._refuse(f"float({self.expr})")

    def __neg__(self):
        return -_v(self) if not _from_user() else self._refuse(f"-{self.expr}")

    def _compare(self, o, op: str, fn):
        if _from_user():
            self._refuse(f"{self.expr} {op} {o!r}", control=True)
        return fn(_v(self), o)

    def __lt__(self, o): return self._compare(o, "<", int.__lt__)
    def __le__(self, o): return self._compare(o, "<=", int.__le__)
    def __gt__(self, o): return self._compare(o, ">", int.__gt__)
    def __ge__(self, o): return self._compare(o, ">=", int.__ge__)
    __hash__ = int.__hash__

    def __eq__(self, o):
        if isinstance(o, SymbolicScalar):
            return (self.base, self.shift) == (o.base, o.shift)
        return self._compare(o, "==", int.__eq__)

    def __ne__(self, o):
        return not self.__eq__(o)

    def __bool__(self):
        if _from_user():
            self._refuse(f"if {self.expr}", control=True)
        return _v(self) != 0

    def _refuse(self, what: str, control: bool = False):
        from .tracer import user_loc
        what_is = ("the size N of a pypto.DYNAMIC dim" if self.kind == "size"
                   else "the index of a pypto.loop over a pypto.DYNAMIC dim")
        if control:
            hint = ("the kernel is compiled once for every size: choose per element with a mask "
                    "(pypto.where) rather than per size in Python")
        else:
            hint = ("a dynamic size may shape, slice and bound loops (x[i:i+8] in pypto.loop(0, N, 8)); "
                    "pass a number the computation needs as a constant or a tensor")
        raise UnsupportedError(f"`{what}`: {what_is} is known only when the kernel is called", loc=user_loc(),
                               expected="N in shapes, slices and pypto.loop bounds",
                               got=what, hint=hint)


def is_symbolic(v) -> bool:
    return isinstance(v, SymbolicScalar)


def plain(v):
    """`v` with every SymbolicScalar (also inside tuples and lists) its int value: what graph
    nodes and attributes hold."""
    if isinstance(v, SymbolicScalar):
        return _v(v)
    if isinstance(v, tuple):
        return tuple(plain(x) for x in v)
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def loop(*args):
    """CANN PyPTO's `pypto.loop(start, stop, step)`.  Over a `pypto.DYNAMIC` size
    (`pypto.loop(0, x.shape[0], 8)`) it yields loop indices `i` (SymbolicScalar) for slices
    `x[i:i+8]` that cover the dim in steps of 8; the body is traced for the chunk the kernel is
    compiled for and runs for every chunk of a call.  Over plain ints it is a Python range,
    unrolled while tracing."""
    if not any(isinstance(a, SymbolicScalar) for a in args):
        return range(*args)
    from .tracer import user_loc
    start, stop, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3] if len(args) == 2 else args
    if len(args) > 3:
        raise UnsupportedError("pypto.loop takes at most three arguments", loc=user_loc(),
                               expected="pypto.loop(start, stop, step)", got=f"{len(args)} arguments")
    if not (isinstance(stop, SymbolicScalar) and stop.kind == "size" and stop.shift == 0):
        raise UnsupportedError("a pypto.loop over a dynamic dim must stop at its size", loc=user_loc(),
                               expected="pypto.loop(0, N, step) with N = x.shape[0]",
                               got=f"pypto.loop({start!r}, {stop!r}, {step!r})",
                               hint="the loop covers the whole dim: every row is computed alike")
    if isinstance(start, SymbolicScalar) or int(start) != 0:
        raise UnsupportedError("a pypto.loop over a dynamic dim must start at 0", loc=user_loc(),
                               expected="pypto.loop(0, N, step)", got=f"start {start!r}",
                               hint="skip rows with a mask (pypto.where) rather than a shifted loop")
    if isinstance(step, SymbolicScalar) or not isinstance(step, int) or step < 1 or _v(stop) % step:
        raise UnsupportedError("the step of a pypto.loop over a dynamic dim must divide the chunk the kernel "
                               "is compiled for", loc=user_loc(),
                               expected=f"a power of two (dividing {_v(stop)}, the rows it is compiled for)",
                               got=f"step {step!r}")
    from .tracer import TraceContext
    steps = TraceContext.current("pypto.loop over a dynamic dim").loop_steps
    steps.append(step)
    name = "i" if len(steps) == 1 else f"i{len(steps)}"
    return (SymbolicScalar(v, name, "index", 0, step) for v in range(0, _v(stop), step))


def check_slice(x_shape, d: int, k):
    """The rules for indexing dim `d` of a tensor whose size there is symbolic (`k` a slice or an
    index): the whole dim (`x[:]`, `x[0:N]`), or one step of a `pypto.loop` over it
    (`x[i:i+step]`, `x[i]` for step 1).  Returns (offset, size): the size symbolic for the
    whole dim, None for an index (the dim dropped), the offset a loop index for a step."""
    from .tracer import user_loc
    n = x_shape[d]
    if isinstance(k, slice):
        if k.step not in (None, 1):
            why = f"a step of {k.step}"
        elif k.start in (None, 0) and (k.stop is None or (isinstance(k.stop, SymbolicScalar) and k.stop == n)):
            return 0, n
        elif (isinstance(k.start, SymbolicScalar) and k.start.kind == "index" and k.start.shift == 0
              and isinstance(k.stop, SymbolicScalar) and k.stop.kind == "index"
              and k.stop.base == k.start.base and k.stop.shift == k.start.step):
            return k.start, k.start.step
        else:
            why = f"rows {k.start if k.start is not None else 0}:{k.stop if k.stop is not None else n}"
    elif isinstance(k, SymbolicScalar) and k.kind == "index" and k.shift == 0 and k.step == 1:
        return k, None
    else:
        why = f"row {k!r}"
    raise UnsupportedError(f"dim {d} has the dynamic size N: {why} of it depends on where the kernel's chunks "
                           "fall", loc=user_loc(),
                           expected="the whole dim (x[:]) or one step of pypto.loop(0, N, step): x[i:i+step]",
                           got=why,
                           hint="for i in pypto.loop(0, x.shape[0], 8): out[i:i+8] = f(x[i:i+8])")


def cond(scalar) -> bool:
    """CANN PyPTO's `if pypto.cond(expr):`.  Here the conditions a kernel branches on are static
    (constants, shapes, indices of loops over static dims): `cond` gives their truth value for
    Python's `if`.  A condition on a dynamic size or the index of a loop over it is refused where
    it is computed (N > 4 is not known while compiling); per-element choices are pypto.where."""
    if isinstance(scalar, SymbolicScalar):
        scalar._refuse(f"pypto.cond({scalar.expr})", control=True)
    return bool(scalar)
