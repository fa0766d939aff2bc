"""The Tensor-level operations a kernel calls (names and signatures follow CANN PyPTO / torch)."""
from __future__ import annotations

import builtins
import numbers

from .. import dtypes as dt
from ..errors import DTypeError, ShapeError, TileShapeError, UnsupportedError
from ..ir.core import prod as _size_prod   # (pypto.prod is the tensor op below)
from ..ir.ops import OPS
from ..ir.tensor import TileSpec
from . import dynamic as _dyn
from .dynamic import SymbolicScalar, check_slice
from .tracer import Tensor, TraceContext, check_shape, user_loc


def _ctx(x: Tensor, what: str) -> TraceContext:
    if isinstance(x, Tensor) and x._ctx is not None:
        return x._ctx
    return TraceContext.current(f"pypto.{what}")


def _tensor(x, what: str) -> Tensor:
    if isinstance(x, Tensor) and x._node is not None:
        return x
    hint = None
    if isinstance(x, (list, tuple)) or type(x).__module__ == "numpy":
        hint = "data reaches a kernel through its arguments: pass the array as one more tensor argument"
    elif isinstance(x, Tensor):
        hint = "pypto.Tensor(shape, dtype) describes an argument; inside a kernel use the kernel's arguments"
    raise UnsupportedError(f"pypto.{what} expects a tensor of the kernel", loc=user_loc(),
                           expected="a traced Tensor (a kernel argument or a value computed from one)",
                           got=type(x).__name__, hint=hint)


def _const(ctx: TraceContext, value, like: Tensor, op: str = "op") -> Tensor:
    if isinstance(value, SymbolicScalar):
        value._refuse(f"{op}(tensor, {value!r})")
    if like.dtype == dt.DT_BOOL:
        if value not in (0, 1):
            raise DTypeError(f"{op}: the constant {value!r} is not a truth value", loc=user_loc(),
                             expected="True or False", got=repr(value))
        return ctx.add("const", [], (), like.dtype, value=int(bool(value)))
    if not like.dtype.is_float:
        if value != int(value):        # a float that would be truncated: say so rather than compute x + 0
            raise DTypeError(f"{op}: the float constant {value!r} would be truncated to the integer dtype of "
                             f"the tensor", loc=user_loc(), expected=f"an integer constant for {like.dtype}",
                             got=repr(value),
                             hint=f"cast the tensor first: pypto.cast(x, pypto.DT_FP32) {_SYMBOL.get(op, op)} {value!r}")
        info = like.dtype.np_dtype
        import numpy as np
        lo, hi = np.iinfo(info).min, np.iinfo(info).max
        if not lo <= int(value) <= hi:
            raise DTypeError(f"{op}: the constant {value!r} does not fit {like.dtype}", loc=user_loc(),
                             expected=f"an integer in [{lo}, {hi}]", got=repr(value))
    return ctx.add("const", [], (), like.dtype, value=float(value) if like.dtype.is_float else int(value))


_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def _float_only(x: Tensor, op: str):
    if not x.dtype.is_float:
        raise DTypeError(f"{op} needs a floating-point tensor", loc=user_loc(),
                         expected="fp32, fp16 or bf16", got=str(x.dtype))


def _binary(op: str, a, b) -> Tensor:
    """An element-wise op of two operands (tensors or Python numbers), with broadcasting; its
    registry row gives the result's kind: a mask for comparisons, else the operands' dtype."""
    kind = OPS[op].kind
    logic = op.startswith("logical_")
    for v in (a, b):
        if (isinstance(v, bool) and not logic) or isinstance(v, complex) or (
                isinstance(v, numbers.Number) and not isinstance(v, numbers.Real)):
            raise DTypeError(f"{op}: a Python {type(v).__name__} operand is not supported", loc=user_loc(),
                             expected="a tensor, an int or a float", got=repr(v))
    if isinstance(a, Tensor) and isinstance(b, Tensor) and kind != "compare" and not logic and \
            (a.dtype == dt.DT_BOOL) != (b.dtype == dt.DT_BOOL):
        # a mask in arithmetic counts as 0 / 1 of the other operand's dtype (as in torch)
        a, b = (cast(a, b.dtype), b) if a.dtype == dt.DT_BOOL else (a, cast(b, a.dtype))
    if isinstance(a, numbers.Number) and isinstance(b, Tensor):
        if kind == "compare" and not OPS[op].commutative:     # 2 < x is x > 2
            return _binary(_FLIPPED[op], b, a)
        ctx = _ctx(b, op)
        a = _const(ctx, a, b, op)
    elif isinstance(b, numbers.Number) and isinstance(a, Tensor):
        ctx = _ctx(a, op)
        b = _const(ctx, b, a, op)
    a, b = _tensor(a, op), _tensor(b, op)
    ctx = _ctx(a, op)
    if a.dtype != b.dtype:
        raise DTypeError(f"{op}: operands have different dtypes (cast one with pypto.cast)",
                         loc=user_loc(), expected=f"{a.dtype} and {a.dtype}", got=f"{a.dtype} and {b.dtype}")
    if logic and a.dtype != dt.DT_BOOL:
        raise DTypeError(f"{op} works on masks", loc=user_loc(), expected="bool tensors (from comparisons)",
                         got=str(a.dtype), hint="compare first, e.g. pypto.logical_and(x > 0, y > 0)")
    if not logic and kind != "compare" and a.dtype == dt.DT_BOOL:
        raise DTypeError(f"{op} of two masks", loc=user_loc(), expected="numbers, or one mask and numbers",
                         got="bool and bool", hint="for masks use pypto.logical_and / logical_or, or cast one")
    shape = check_shape(op, [a, b], {})
    return ctx.add(op, [a, b], shape, dt.DT_BOOL if kind == "compare" else a.dtype)


_FLIPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def add(a, b): return _binary("add", a, b)
def sub(a, b): return _binary("sub", a, b)
def mul(a, b): return _binary("mul", a, b)
def div(a, b):
    """`a / b`, elementwise, with broadcasting.

    As in torch, division is true division: on integer tensors (int8, int32) the operands are
    cast to fp32 first and the result is fp32 (`x / 2` on int32 data [1, 2, 3] is fp32
    [0.5, 1.0, 1.5]); an integer tensor divided by a float tensor takes the float's dtype.
    Division by zero gives IEEE inf / nan, as numpy's fp32 division does (1/0 = inf,
    -1/0 = -inf, 0/0 = nan).  int32 values above 2**24 are rounded by the cast to fp32."""
    ta, tb = isinstance(a, Tensor), isinstance(b, Tensor)
    da, db = (a.dtype if ta else None), (b.dtype if tb else None)
    if (da is not None and not da.is_float) or (db is not None and not db.is_float):
        floats = [d for d in (da, db) if d is not None and d.is_float]
        target = floats[0] if floats else dt.DT_FP32
        if ta and not da.is_float:
            a = cast(a, target)
        if tb and not db.is_float:
            b = cast(b, target)
    return _binary("div", a, b)
def maximum(a, b): return _binary("maximum", a, b)
def minimum(a, b): return _binary("minimum", a, b)


# comparisons: a mask (bool tensor) per element; also the operators == != < <= > >=
def eq(a, b): return _binary("eq", a, b)
def ne(a, b): return _binary("ne", a, b)
def lt(a, b): return _binary("lt", a, b)
def le(a, b): return _binary("le", a, b)
def gt(a, b): return _binary("gt", a, b)
def ge(a, b): return _binary("ge", a, b)


equal, not_equal, less, less_equal, greater, greater_equal = eq, ne, lt, le, gt, ge


def logical_and(a, b): return _binary("logical_and", a, b)
def logical_or(a, b): return _binary("logical_or", a, b)
def logical_xor(a, b): return _binary("logical_xor", a, b)


def logical_not(x):
    x = _tensor(x, "logical_not")
    if x.dtype != dt.DT_BOOL:
        raise DTypeError("logical_not works on masks", loc=user_loc(), expected="a bool tensor", got=str(x.dtype),
                         hint="compare first: pypto.logical_not(x > 0)")
    return _ctx(x, "logical_not").add("logical_not", [x], x.shape, x.dtype)


def isnan(x): return _mask_of("isnan", x)
def isinf(x): return _mask_of("isinf", x)
def isfinite(x): return _mask_of("isfinite", x)


def _mask_of(op: str, x) -> Tensor:
    x = _tensor(x, op)
    _float_only(x, op)
    return _ctx(x, op).add(op, [x], x.shape, dt.DT_BOOL)


def sign(x):
    x = _tensor(x, "sign")
    return _ctx(x, "sign").add("sign", [x], x.shape, x.dtype)


def where(cond, a, b):
    """`a` where `cond` (a mask) is true, else `b`; either may be a Python number (both: an fp32
    result for floats, int32 for ints), with broadcasting."""
    cond = _tensor(cond, "where")
    if cond.dtype != dt.DT_BOOL:
        raise DTypeError("where: the condition must be a mask", loc=user_loc(), expected="a bool tensor",
                         got=str(cond.dtype), hint="compare first: pypto.where(x > 0, x, 0.0)")
    ctx = _ctx(cond, "where")
    for v in (a, b):
        if isinstance(v, (bool, complex)) or not isinstance(v, (Tensor, numbers.Real)):
            raise DTypeError("where: a value must be a tensor or a Python number", loc=user_loc(),
                             expected="a tensor, an int or a float", got=type(v).__name__)
    like = next((v for v in (a, b) if isinstance(v, Tensor)), None)
    if like is None:
        floats = any(isinstance(v, float) for v in (a, b))
        like = Tensor((), dt.DT_FP32 if floats else dt.DT_INT32)
    a = a if isinstance(a, Tensor) else _const(ctx, a, like, "where")
    b = b if isinstance(b, Tensor) else _const(ctx, b, like, "where")
    a, b = _tensor(a, "where"), _tensor(b, "where")
    if a.dtype != b.dtype:
        raise DTypeError("where: the two values have different dtypes (cast one with pypto.cast)", loc=user_loc(),
                         expected=f"{a.dtype} and {a.dtype}", got=f"{a.dtype} and {b.dtype}")
    shape = check_shape("where", [cond, a, b], {})
    return ctx.add("where", [cond, a, b], shape, a.dtype)


def masked_fill(x, mask, value):
    """x with `value` (a Python number) where `mask` is true (torch's masked_fill)."""
    x, mask = _tensor(x, "masked_fill"), _tensor(mask, "masked_fill")
    if mask.dtype != dt.DT_BOOL:
        raise DTypeError("masked_fill: the mask must be a bool tensor", loc=user_loc(), expected="bool",
                         got=str(mask.dtype))
    _const(_ctx(x, "masked_fill"), value, x, "masked_fill")        # checks that it fits x's dtype
    v = float(value) if x.dtype.is_float else int(value)
    shape = check_shape("masked_fill", [x, mask], {})
    if shape != x.shape:
        raise ShapeError("masked_fill: the mask must broadcast to x's shape", loc=user_loc(),
                         expected=list(x.shape), got=list(mask.shape))
    return _ctx(x, "masked_fill").add("masked_fill", [x, mask], x.shape, x.dtype, value=v)


# --- math, reductions and creation (grown through the registry)

def _floats(op: str, *vals) -> list:
    """The tensor operands of a float op of several inputs (Python numbers become constants of
    the first tensor's dtype), checked to share one float dtype."""
    like = next((v for v in vals if isinstance(v, Tensor)), None)
    if like is None:
        raise UnsupportedError(f"{op} needs at least one tensor operand", loc=user_loc(),
                               expected="a tensor of the kernel", got="only Python numbers")
    like = _tensor(like, op)
    ctx = _ctx(like, op)
    out = []
    for v in vals:
        if isinstance(v, numbers.Real) and not isinstance(v, bool):
            v = _const(ctx, v, like, op)
        v = _tensor(v, op)
        if v.dtype != like.dtype:
            raise DTypeError(f"{op}: operands have different dtypes (cast one with pypto.cast)", loc=user_loc(),
                             expected=str(like.dtype), got=f"{like.dtype} and {v.dtype}")
        out.append(v)
    if OPS[op].float_only:
        _float_only(like, op)
    return out


def _nary(op: str, vals, **attrs) -> Tensor:
    ins = _floats(op, *vals)
    return _ctx(ins[0], op).add(op, ins, check_shape(op, ins, attrs), ins[0].dtype, **attrs)


def mish(x): return _unary("mish", x)
def logsigmoid(x): return _unary("logsigmoid", x)
def softsign(x): return _unary("softsign", x)
def selu(x): return _unary("selu", x)
def tanhshrink(x): return _unary("tanhshrink", x)
def sinh(x): return _unary("sinh", x)
def cosh(x): return _unary("cosh", x)
def asinh(x): return _unary("asinh", x)
def acosh(x): return _unary("acosh", x)
def atanh(x): return _unary("atanh", x)
def celu(x, alpha: float = 1.0): return _unary("celu", x, alpha=_number(alpha, "celu", "alpha"))
def hardshrink(x, lambd: float = 0.5): return _unary("hardshrink", x, lambd=_number(lambd, "hardshrink", "lambd"))
def softshrink(x, lambd: float = 0.5): return _unary("softshrink", x, lambd=_number(lambd, "softshrink", "lambd"))
def hypot(a, b): return _nary("hypot", [a, b])
def logaddexp(a, b): return _nary("logaddexp", [a, b])


arcsinh, arccosh, arctanh = asinh, acosh, atanh


def prelu(x, weight):
    """x where x >= 0, else weight * x; `weight` has one element or one per channel (dim 1 of x,
    as torch's prelu: for x [N, C, ...] a weight [C] is broadcast over the dims after dim 1)."""
    x, weight = _tensor(x, "prelu"), _tensor(weight, "prelu")
    _float_only(x, "prelu")
    channels = x.shape[1] if x.ndim >= 2 else 1
    if weight.size not in (1, channels) or weight.ndim > 1:
        raise ShapeError("prelu: weight must have one element or one per channel (dim 1 of x)", loc=user_loc(),
                         expected=f"[1] or [{channels}]", got=list(weight.shape))
    if weight.size > 1 and x.ndim > 2:
        weight = reshape(weight, [channels] + [1] * (x.ndim - 2))
    return _nary("prelu", [x, weight])


def lerp(input, end, weight):
    """input + weight * (end - input); `weight` a Python number or a tensor (broadcast)."""
    if isinstance(weight, Tensor):
        return _nary("lerp", [input, end, weight])
    return _nary("lerp", [input, end], weight=_number(weight, "lerp", "weight"))


def addcmul(input, tensor1, tensor2, value=1):
    """input + value * tensor1 * tensor2 (with broadcasting)."""
    return _nary("addcmul", [input, tensor1, tensor2], value=_number(value, "addcmul", "value"))


def addcdiv(input, tensor1, tensor2, value=1):
    """input + value * tensor1 / tensor2 (with broadcasting)."""
    return _nary("addcdiv", [input, tensor1, tensor2], value=_number(value, "addcdiv", "value"))


def rsub(input, other, alpha=1):
    """other - alpha * input (torch's rsub); either may be a Python number."""
    if alpha != 1:
        input = mul(input, alpha)
    return _binary("rsub", input, other)


def norm(x, p=2, dim=-1, keepdim=False):
    """The p-norm over one dim: p = 2 (the default), 1 or inf (float('inf'))."""
    x = _tensor(x, "norm")
    _float_only(x, "norm")
    if p in ("fro",):
        p = 2
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or float(p) not in (1.0, 2.0, float("inf")):
        raise UnsupportedError("norm: this p", loc=user_loc(), expected="p = 1, 2 or inf", got=repr(p))
    a = {"dim": _dim(x, dim, "norm"), "keepdim": bool(keepdim), "p": float(p)}
    return _ctx(x, "norm").add("norm", [x], check_shape("norm", [x], a), x.dtype, **a)


def remainder(a, b):
    """a mod b with the sign of b (torch's remainder and the % operator, Python's %)."""
    return _binary("remainder", a, b)


def fmod(a, b):
    """a mod b with the sign of a (torch's fmod, C's fmod)."""
    return _binary("fmod", a, b)


def prod(x, dim=-1, keepdim=False):
    """The product over one dim, several dims (a tuple) or all (None); float products accumulate
    in fp32 at least."""
    return _reduce("prod", x, dim, keepdim)




def floor(x): return _unary("floor", x)
def ceil(x): return _unary("ceil", x)
def trunc(x): return _unary("trunc", x)
def frac(x): return _unary("frac", x)


def round(x, decimals: int = 0):
    """To the nearest integral value, ties to even (as torch.round)."""
    if decimals != 0:
        raise UnsupportedError("round: only decimals=0", loc=user_loc(), expected="decimals=0", got=decimals,
                               hint="scale first: pypto.round(x * 100) / 100")
    return _unary("round", x)


fix = trunc

def _size_args(shape, op: str) -> tuple[int, ...]:
    """A shape given as ints (zeros(2, 3)) or one list/tuple (zeros((2, 3)))."""
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        shape = tuple(shape[0])
    dims = Tensor(shape).shape if shape else ()
    if not dims:
        raise ShapeError(f"{op}: a 0-d tensor", loc=user_loc(), expected="at least one dim", got="shape []")
    return dims


def _dtype_arg(dtype, default, op: str):
    if dtype is None:
        return default
    d = dtype if isinstance(dtype, dt.DType) else Tensor((1,), dtype).dtype
    return d


def full(shape, fill_value, dtype=None):
    """A tensor of `shape` with every element `fill_value` (dtype: fp32 for a float value, int32
    for an int, unless given); made in UB by TEXPANDS, tile by tile, where it is read."""
    shape = _size_args((shape,), "full")
    ctx = TraceContext.current("pypto.full")
    default = dt.DT_FP32 if isinstance(fill_value, float) else dt.DT_INT32
    dtype = _dtype_arg(dtype, default, "full")
    if isinstance(fill_value, bool) or not isinstance(fill_value, numbers.Real):
        raise DTypeError("full: the value must be a Python number", loc=user_loc(), expected="an int or a float",
                         got=repr(fill_value)[:60])
    _const(ctx, fill_value, Tensor((1,), dtype), "full")          # checks that it fits the dtype
    v = float(fill_value) if dtype.is_float else int(fill_value)
    return ctx.add("full", [], shape, dtype, shape=shape, value=v)


def zeros(*size, dtype=dt.DT_FP32):
    """A tensor of zeros (fp32 unless dtype is given): a full."""
    return full(_size_args(size, "zeros"), 0, dtype)


def ones(*size, dtype=dt.DT_FP32):
    """A tensor of ones (fp32 unless dtype is given): a full."""
    return full(_size_args(size, "ones"), 1, dtype)


def full_like(x, fill_value, dtype=None):
    """A full of x's shape (and dtype, unless given)."""
    x = _tensor(x, "full_like")
    return full(x.shape, fill_value, dtype or x.dtype)


def zeros_like(x, dtype=None):
    """Zeros of x's shape and dtype."""
    return full_like(x, 0, dtype)


def ones_like(x, dtype=None):
    """Ones of x's shape and dtype."""
    return full_like(x, 1, dtype)


def _iota(shape, dim: int, dtype, start=0, step=1) -> Tensor:
    ctx = TraceContext.current("pypto.arange")
    return ctx.add("iota", [], shape, dtype, shape=tuple(shape), dim=dim, start=start, step=step)


def arange(start, end=None, step=1, dtype=None):
    """[start, start + step, ...) below `end` (torch's arange; `arange(n)` is 0 .. n-1): int32
    when all three are ints, else fp32 (unless given); made in UB by TCI, tile by tile."""
    if end is None:
        start, end = 0, start
    for v, what in ((start, "start"), (end, "end"), (step, "step")):
        _number(v, "arange", what)
    if step == 0:
        raise ShapeError("arange: step must not be 0", loc=user_loc(), expected="a nonzero step", got=step)
    import math
    n = math.ceil((end - start) / step)
    if n < 1:
        raise ShapeError("arange: an empty range", loc=user_loc(), expected="at least one element",
                         got=f"arange({start}, {end}, {step})")
    ints = all(isinstance(v, numbers.Integral) for v in (start, end, step))
    dtype = _dtype_arg(dtype, dt.DT_INT32 if ints else dt.DT_FP32, "arange")
    if not dtype.is_float:
        start, step = int(start), int(step)
    else:
        start, step = float(start), float(step)
    return _iota((n,), 0, dtype, start, step)


def eye(n, m=None, dtype=dt.DT_FP32):
    """The n x m identity (ones where the row index equals the column index)."""
    m = n if m is None else m
    shape = Tensor((n, m)).shape
    mask = eq(_iota((n, 1), 0, dt.DT_INT32), _iota((1, m), 1, dt.DT_INT32))
    return cast(mask, _dtype_arg(dtype, dt.DT_FP32, "eye"))


def _tri(op: str, x, diagonal) -> Tensor:
    x = _tensor(x, op)
    if x.ndim < 2:
        raise ShapeError(f"{op} needs a matrix (or a batch of them)", loc=user_loc(), expected="at least 2 dims",
                         got=list(x.shape))
    if isinstance(diagonal, bool) or not isinstance(diagonal, numbers.Integral):
        raise DTypeError(f"{op}: diagonal must be an int", loc=user_loc(), expected="an int", got=repr(diagonal))
    return _ctx(x, op).add(op, [x], x.shape, x.dtype, diagonal=int(diagonal))


def tril(x, diagonal=0):
    """x on and below the diagonal (and `diagonal` diagonals above it; below for a negative one),
    0 elsewhere: a mask of two TCI sequences compared, then TSELS."""
    return _tri("tril", x, diagonal)


def triu(x, diagonal=0):
    """x on and above the diagonal (shifted by `diagonal`), 0 elsewhere."""
    return _tri("triu", x, diagonal)


def one_hot(tensor, num_classes: int):
    """int32 [..., num_classes]: 1 where the class is the index (torch.nn.functional.one_hot; the
    class count must be given: the data is not known while compiling)."""
    idx = _tensor(tensor, "one_hot")
    if idx.dtype not in (dt.DT_INT32, dt.DT_INT8):
        raise DTypeError("one_hot: the indices must be integers", loc=user_loc(), expected="int32",
                         got=str(idx.dtype))
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 1:
        raise UnsupportedError("one_hot: num_classes must be given", loc=user_loc(),
                               expected="a positive int", got=repr(num_classes))
    if idx.dtype != dt.DT_INT32:
        idx = cast(idx, dt.DT_INT32)
    a = {"num_classes": int(num_classes)}
    return _ctx(idx, "one_hot").add("one_hot", [idx], check_shape("one_hot", [idx], a), dt.DT_INT32, **a)


def _arg(op: str, x, dim, keepdim) -> Tensor:
    x = _tensor(x, op)
    if x.dtype == dt.DT_BOOL:
        x = cast(x, dt.DT_INT32)
    if dim is None:                     # over all elements (of the flattened tensor)
        x, dim = reshape(x, [x.size]), 0
    a = {"dim": _dim(x, dim, op), "keepdim": bool(keepdim)}
    return _ctx(x, op).add(op, [x], check_shape(op, [x], a), dt.DT_INT32, **a)


def argmax(x, dim=None, keepdim=False):
    """int32 index of the largest element along dim (the first such; a row with nan gives its
    first nan's index, as torch); dim=None: over all elements."""
    return _arg("argmax", x, dim, keepdim)


def argmin(x, dim=None, keepdim=False):
    """int32 index of the smallest element along dim (the first such; nan as argmax)."""
    return _arg("argmin", x, dim, keepdim)

def _unary(op: str, x, **attrs) -> Tensor:
    """An element-wise op of one tensor, as its registry row says (float-only or not)."""
    x = _tensor(x, op)
    if OPS[op].float_only:
        _float_only(x, op)
    return _ctx(x, op).add(op, [x], x.shape, x.dtype, **attrs)


def _number(v, op: str, what: str):
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise DTypeError(f"{op}: {what} must be a Python number", loc=user_loc(),
                         expected="an int or a float", got=repr(v)[:60])
    return float(v)


def exp(x): return _unary("exp", x)
def log(x): return _unary("log", x)
def sqrt(x): return _unary("sqrt", x)
def rsqrt(x): return _unary("rsqrt", x)
def reciprocal(x): return _unary("recip", x)
def abs(x): return _unary("abs", x)
def neg(x): return _unary("neg", x)
def relu(x): return _unary("relu", x)
def sigmoid(x): return _unary("sigmoid", x)
def tanh(x): return _unary("tanh", x)
def silu(x): return _unary("silu", x)
def softplus(x): return _unary("softplus", x)
def hardsigmoid(x): return _unary("hardsigmoid", x)
def hardswish(x): return _unary("hardswish", x)
def square(x): return _unary("square", x)
def expm1(x): return _unary("expm1", x)
def log1p(x): return _unary("log1p", x)
def exp2(x): return _unary("exp2", x)
def log2(x): return _unary("log2", x)
def log10(x): return _unary("log10", x)


def gelu(x, approximate: str = "tanh"):
    """GELU; `approximate="tanh"` (the default here, as in CANN's kernels): 0.5 x (1 + tanh(...));
    `approximate="none"` (torch's default): the exact form 0.5 x (1 + erf(x / sqrt(2)))."""
    if approximate == "none":
        x = _tensor(x, "gelu")
        _float_only(x, "gelu")
        half = mul(x, 0.5)
        return mul(half, add(erf(mul(x, 0.7071067811865476)), 1.0))    # noqa: F821 (erf: the registry's row)
    if approximate != "tanh":
        raise UnsupportedError("gelu: unknown approximation", loc=user_loc(),
                               expected='approximate="tanh" or "none"', got=repr(approximate))
    return _unary("gelu", x)


def leaky_relu(x, negative_slope: float = 0.01):
    return _unary("leaky_relu", x, negative_slope=_number(negative_slope, "leaky_relu", "negative_slope"))


def elu(x, alpha: float = 1.0):
    return _unary("elu", x, alpha=_number(alpha, "elu", "alpha"))


def clamp(x, min=None, max=None):
    """min(max(x, min), max), with Python-number bounds (either may be None)."""
    x = _tensor(x, "clamp")
    if min is None and max is None:
        raise UnsupportedError("clamp: at least one of min and max is needed", loc=user_loc(),
                               expected="clamp(x, min=..., max=...)", got="neither")
    lo = None if min is None else _number(min, "clamp", "min")
    hi = None if max is None else _number(max, "clamp", "max")
    if not x.dtype.is_float:
        for v in (lo, hi):
            if v is not None:
                _const(_ctx(x, "clamp"), v, x, "clamp")     # an integer bound that fits the dtype
        lo, hi = (None if v is None else int(v) for v in (lo, hi))
    return _ctx(x, "clamp").add("clamp", [x], x.shape, x.dtype, min=lo, max=hi)


clip = clamp


def relu6(x):
    """min(max(x, 0), 6)."""
    return clamp(x, 0.0 if _tensor(x, "relu6").dtype.is_float else 0, 6)
def hardtanh(x, min_val=-1.0, max_val=1.0):
    """x clamped to [min_val, max_val]."""
    return clamp(x, min_val, max_val)


def pow(x, exponent):
    """x ** exponent for a Python number exponent."""
    x = _tensor(x, "pow")
    _float_only(x, "pow")
    e = _number(exponent, "pow", "the exponent")
    if e == 1:
        return x
    if e == 0:
        raise UnsupportedError("pow: x ** 0 is all ones", loc=user_loc(), expected="a nonzero exponent", got=0,
                               hint="write the constant instead")
    return _ctx(x, "pow").add("pow", [x], x.shape, x.dtype, exponent=e)


def _dim(x: Tensor, dim: int, what: str) -> int:
    d = dim + x.ndim if dim < 0 else dim
    if not 0 <= d < x.ndim:
        raise ShapeError(f"{what}: dim {dim} is out of range", loc=user_loc(),
                         expected=f"a dim in [-{x.ndim}, {x.ndim - 1}]", got=dim)
    return d


def _dims(x: Tensor, dim, what: str) -> list[int]:
    """The dims a reduction runs over: one, several (a tuple or list) or all (None), sorted."""
    if dim is None:
        return list(range(x.ndim))
    dims = [_dim(x, d, what) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))]
    if len(set(dims)) != len(dims):
        raise ShapeError(f"{what}: a dim is given twice", loc=user_loc(), expected="distinct dims", got=tuple(dim))
    return sorted(dims)


def _reduce(op: str, x, dim, keepdim, **attrs) -> Tensor:
    """A reduction over one dim, several dims (one after another, keeping dims; then the reduced
    dims dropped unless keepdim) or all (dim=None)."""
    x = _tensor(x, op)
    if OPS[op].float_only:
        _float_only(x, op)
    if x.dtype == dt.DT_BOOL and op == "sum":         # a count, as torch's sum of a mask
        x = cast(x, dt.DT_INT32)
    dims = _dims(x, dim, op)
    if len(dims) == 1:
        a = {"dim": dims[0], "keepdim": bool(keepdim), **attrs}
        return _ctx(x, op).add(op, [x], check_shape(op, [x], a), x.dtype, **a)
    if op not in _SEPARABLE:
        raise UnsupportedError(f"{op} over several dims at once", loc=user_loc(), expected="one dim",
                               got=tuple(dims), hint=f"reshape the dims into one first, then {op} over it")
    inner, scale = _SEPARABLE[op]
    out = x
    for d in dims:
        out = _reduce(inner, out, d, True)
    if scale:
        out = mul(out, 1.0 / _size_prod(x.shape[d] for d in dims))
    if not keepdim:
        out = reshape(out, [s for d, s in enumerate(x.shape) if d not in dims])
    return out


# reductions over several dims: reduce over each in turn (the op over each, and a scale)
_SEPARABLE = {"sum": ("sum", False), "amax": ("amax", False), "amin": ("amin", False), "mean": ("sum", True),
               "prod": ("prod", False)}


def sum(x, dim=-1, keepdim=False): return _reduce("sum", x, dim, keepdim)
def amax(x, dim=-1, keepdim=False): return _reduce("amax", x, dim, keepdim)
def amin(x, dim=-1, keepdim=False): return _reduce("amin", x, dim, keepdim)
def mean(x, dim=-1, keepdim=False): return _reduce("mean", x, dim, keepdim)
def logsumexp(x, dim=-1, keepdim=False): return _reduce("logsumexp", x, dim, keepdim)


def var(x, dim=-1, keepdim=False, correction=1, unbiased=None):
    """Variance over one dim; `correction=1` divides by n - 1 (torch's default), 0 by n
    (`unbiased=False` is torch's older spelling of correction=0)."""
    if unbiased is not None:
        correction = 1 if unbiased else 0
    return _reduce("var", x, dim, keepdim, correction=int(correction))


def std(x, dim=-1, keepdim=False, correction=1, unbiased=None):
    if unbiased is not None:
        correction = 1 if unbiased else 0
    return _reduce("std", x, dim, keepdim, correction=int(correction))


def softmax(x, dim=-1):
    x = _tensor(x, "softmax")
    _float_only(x, "softmax")
    return _ctx(x, "softmax").add("softmax", [x], x.shape, x.dtype, dim=_dim(x, dim, "softmax"))


def log_softmax(x, dim=-1):
    x = _tensor(x, "log_softmax")
    _float_only(x, "log_softmax")
    return _ctx(x, "log_softmax").add("log_softmax", [x], x.shape, x.dtype, dim=_dim(x, dim, "log_softmax"))


def swiglu(x, dim=-1):
    """silu(a) * b, where a and b are the two halves of x along `dim` (as in LLaMA-style MLPs)."""
    x = _tensor(x, "swiglu")
    _float_only(x, "swiglu")
    d = _dim(x, dim, "swiglu")
    if x.shape[d] % 2:
        raise ShapeError("swiglu: the dim to split must have an even size", loc=user_loc(),
                         expected="an even size", got=x.shape[d])
    attrs = {"dim": d}
    return _ctx(x, "swiglu").add("swiglu", [x], check_shape("swiglu", [x], attrs), x.dtype, **attrs)


def rms_norm(x, weight, eps: float = 1e-6):
    x, weight = _tensor(x, "rms_norm"), _tensor(weight, "rms_norm")
    _float_only(x, "rms_norm")
    if weight.shape != x.shape[-1:] or weight.dtype != x.dtype:
        raise ShapeError("rms_norm: weight must match the last dim of x", loc=user_loc(),
                         expected=f"{x.dtype}[{x.shape[-1]}]", got=repr(weight))
    return _ctx(x, "rms_norm").add("rms_norm", [x, weight], x.shape, x.dtype, eps=float(eps))


def layernorm(x, weight=None, bias=None, eps: float = 1e-5):
    x = _tensor(x, "layernorm")
    _float_only(x, "layernorm")
    ins = [x]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            t = _tensor(t, "layernorm")
            if t.shape != x.shape[-1:] or t.dtype != x.dtype:
                raise ShapeError(f"layernorm: {name} must match the last dim of x", loc=user_loc(),
                                 expected=f"{x.dtype}[{x.shape[-1]}]", got=repr(t))
            ins.append(t)
    return _ctx(x, "layernorm").add("layernorm", ins, x.shape, x.dtype, eps=float(eps),
                                    has_weight=weight is not None, has_bias=bias is not None)


layer_norm = layernorm


def matmul(a, b, out_dtype=None, a_trans=False, b_trans=False):
    a, b = _tensor(a, "matmul"), _tensor(b, "matmul")
    if a.dtype != b.dtype:
        raise DTypeError("matmul: operands have different dtypes", loc=user_loc(),
                         expected=f"{a.dtype} @ {a.dtype}", got=f"{a.dtype} @ {b.dtype}")
    if a.dtype == dt.DT_INT32:
        raise DTypeError("matmul: int32 operands are not supported by the cube unit", loc=user_loc(),
                         expected="fp16, bf16, fp32 or int8", got="int32")
    out_dtype = out_dtype or (dt.DT_INT32 if a.dtype == dt.DT_INT8 else a.dtype)
    attrs = {"a_trans": bool(a_trans), "b_trans": bool(b_trans), "out_dtype": out_dtype.name}
    shape = check_shape("matmul", [a, b], attrs)
    return _ctx(a, "matmul").add("matmul", [a, b], shape, out_dtype, **attrs)


def cast(x, dtype):
    x = _tensor(x, "cast")
    if not isinstance(dtype, dt.DType):
        raise DTypeError("cast: unsupported dtype", loc=user_loc(), expected=dt.supported_names(),
                         got=repr(dtype))
    if dtype == x.dtype:
        return x
    return _ctx(x, "cast").add("cast", [x], x.shape, dtype, to=dtype.name)


def reshape(x, shape):
    x = _tensor(x, "reshape")
    # a dynamic dim kept (squeeze, unsqueeze, x.reshape([N, ...])) stays symbolic: slicing it
    # afterwards is checked as slicing the dim itself (frontend.dynamic.check_slice)
    shape = [s if isinstance(s, SymbolicScalar) else int(s) for s in shape]
    if shape.count(-1) == 1:
        known = _size_prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = x.size // known if known else 0
    if _size_prod(shape) != x.size:
        raise ShapeError("reshape: the number of elements must not change", loc=user_loc(),
                         expected=f"{x.size} elements", got=f"{shape} = {_size_prod(shape)} elements")
    return _ctx(x, "reshape").add("reshape", [x], tuple(shape), x.dtype, shape=tuple(shape))


def transpose(x, dim0=-2, dim1=-1):
    x = _tensor(x, "transpose")
    a, b = sorted((_dim(x, dim0, "transpose"), _dim(x, dim1, "transpose")))
    if a == b:
        return x
    attrs = {"dim0": a, "dim1": b}
    return _ctx(x, "transpose").add("transpose", [x], check_shape("transpose", [x], attrs), x.dtype, **attrs)


# --- shape and layout, built on reshape, transpose and view (no data moves until a copy is needed)

swapaxes = swapdims = transpose


def t(x):
    """The transpose of a 2-D tensor (a 1-D one is returned as it is), as torch.t."""
    x = _tensor(x, "t")
    if x.ndim > 2:
        raise ShapeError("t: the tensor must have at most 2 dims", loc=user_loc(), expected="<= 2 dims",
                         got=list(x.shape), hint="use pypto.transpose(x, dim0, dim1) or pypto.permute")
    return x if x.ndim < 2 else transpose(x, 0, 1)


def permute(x, *dims):
    """The dims of x reordered: result dim i is x's dim dims[i] (swaps of dims: free in GM)."""
    x = _tensor(x, "permute")
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    perm = [_dim(x, d, "permute") for d in dims]
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError("permute: the dims must be a permutation of the tensor's dims", loc=user_loc(),
                         expected=f"each of 0..{x.ndim - 1} once", got=tuple(dims))
    cur = list(range(x.ndim))              # cur[i]: x's dim now at position i
    for i, want in enumerate(perm):        # selection by swaps: at most ndim - 1 transposes
        j = cur.index(want)
        if j != i:
            x = transpose(x, i, j)
            cur[i], cur[j] = cur[j], cur[i]
    return x


def movedim(x, source, destination):
    """x with dim `source` moved to position `destination` (a permute)."""
    x = _tensor(x, "movedim")
    src, dst = _dim(x, source, "movedim"), _dim(x, destination, "movedim")
    order = [d for d in range(x.ndim) if d != src]
    order.insert(dst, src)
    return permute(x, order)


def squeeze(x, dim=None):
    """x without its size-1 dims (or only `dim`, if it has size 1)."""
    x = _tensor(x, "squeeze")
    dims = range(x.ndim) if dim is None else _dims(x, dim, "squeeze")
    drop = {d for d in dims if x.shape[d] == 1}
    return reshape(x, [s for d, s in enumerate(x.shape) if d not in drop]) if drop else x


def unsqueeze(x, dim):
    """x with a new size-1 dim at `dim` (a reshape)."""
    x = _tensor(x, "unsqueeze")
    d = dim + x.ndim + 1 if dim < 0 else dim
    if not 0 <= d <= x.ndim:
        raise ShapeError(f"unsqueeze: dim {dim} is out of range", loc=user_loc(),
                         expected=f"a dim in [-{x.ndim + 1}, {x.ndim}]", got=dim)
    return reshape(x, x.shape[:d] + (1,) + x.shape[d:])


def flatten(x, start_dim=0, end_dim=-1):
    """Dims start_dim .. end_dim merged into one (a reshape; a strided view is copied first)."""
    x = _tensor(x, "flatten")
    if x.ndim == 0:
        return reshape(x, [1])
    a, b = _dim(x, start_dim, "flatten"), _dim(x, end_dim, "flatten")
    if a > b:
        raise ShapeError("flatten: start_dim comes after end_dim", loc=user_loc(), expected="start_dim <= end_dim",
                         got=(start_dim, end_dim))
    return reshape(x, x.shape[:a] + (_size_prod(x.shape[a:b + 1]),) + x.shape[b + 1:])


def unflatten(x, dim, sizes):
    """Dim `dim` split into `sizes` (a reshape; one size may be -1)."""
    x = _tensor(x, "unflatten")
    d = _dim(x, dim, "unflatten")
    sizes = [int(s) for s in sizes]
    if sizes.count(-1) == 1:
        known = _size_prod(s for s in sizes if s != -1)
        sizes[sizes.index(-1)] = x.shape[d] // known if known else 0
    if _size_prod(sizes) != x.shape[d]:
        raise ShapeError("unflatten: the sizes must multiply to the dim's size", loc=user_loc(),
                         expected=f"a product of {x.shape[d]}", got=sizes)
    return reshape(x, x.shape[:d] + tuple(sizes) + x.shape[d + 1:])


def narrow(x, dim, start, length):
    """Elements start .. start + length - 1 of dim (a view)."""
    x = _tensor(x, "narrow")
    d = _dim(x, dim, "narrow")
    offsets, shape = [0] * x.ndim, list(x.shape)
    offsets[d], shape[d] = int(start) + (x.shape[d] if start < 0 else 0), int(length)
    return view(x, shape, offsets)


def select(x, dim, index):
    """The slice at `index` of dim, with that dim dropped (x[..., index, ...])."""
    x = _tensor(x, "select")
    d = _dim(x, dim, "select")
    return getitem(x, (slice(None),) * d + (int(index),))


def split(x, split_size_or_sections, dim=0):
    """Views of consecutive pieces along dim: of `split_size` elements each (the last may be
    smaller), or of the given sizes."""
    x = _tensor(x, "split")
    d = _dim(x, dim, "split")
    n = x.shape[d]
    if isinstance(split_size_or_sections, numbers.Integral):
        step = int(split_size_or_sections)
        if step < 1:
            raise ShapeError("split: the split size must be positive", loc=user_loc(), expected=">= 1", got=step)
        sizes = [min(step, n - i) for i in range(0, n, step)]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if builtins.sum(sizes) != n:
            raise ShapeError("split: the sizes must add up to the dim's size", loc=user_loc(),
                             expected=f"a sum of {n}", got=sizes)
    out, start = [], 0
    for s in sizes:
        out.append(narrow(x, d, start, s))
        start += s
    return tuple(out)


def chunk(x, chunks, dim=0):
    """`chunks` views along dim (as torch: pieces of ceil(n / chunks), the last one smaller)."""
    x = _tensor(x, "chunk")
    n = x.shape[_dim(x, dim, "chunk")]
    return split(x, -(-n // int(chunks)), dim)


def unbind(x, dim=0):
    """The slices along dim, each without that dim (views)."""
    x = _tensor(x, "unbind")
    d = _dim(x, dim, "unbind")
    return tuple(select(x, d, i) for i in range(x.shape[d]))


def expand(x, *sizes):
    """x broadcast to `sizes` (torch's expand: -1 keeps a dim; new leading dims may be added)."""
    x = _tensor(x, "expand")
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    sizes = [int(s) for s in sizes]
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise ShapeError("expand: fewer sizes than the tensor has dims", loc=user_loc(),
                         expected=f"at least {x.ndim} sizes", got=tuple(sizes))
    shape = tuple(x.shape[k - lead] if s == -1 and k >= lead else s for k, s in enumerate(sizes))
    if any(s < 1 for s in shape) or any(x.shape[k] not in (1, shape[k + lead]) for k in range(x.ndim)):
        raise ShapeError("expand: a dim of size other than 1 cannot grow", loc=user_loc(),
                         expected=f"sizes that {list(x.shape)} broadcasts to", got=list(sizes))
    if shape == x.shape:
        return x
    return _ctx(x, "expand").add("expand", [x], shape, x.dtype, shape=shape)


def broadcast_to(x, shape):
    """x broadcast to `shape` (numpy's and torch's broadcast_to)."""
    return expand(x, tuple(shape))


def repeat(x, *sizes):
    """x repeated `sizes[d]` times along each dim (torch's repeat: concatenated copies)."""
    x = _tensor(x, "repeat")
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    sizes = [int(s) for s in sizes]
    if len(sizes) < x.ndim or any(s < 1 for s in sizes):
        raise ShapeError("repeat: one count >= 1 per dim", loc=user_loc(), expected=f"at least {x.ndim} counts",
                         got=tuple(sizes))
    x = reshape(x, (1,) * (len(sizes) - x.ndim) + x.shape)
    for d, r in enumerate(sizes):
        if r > 1:
            x = concat([x] * r, dim=d)
    return x


def _scratch(ctx: TraceContext, shape, dtype) -> Tensor:
    """A fresh tensor of the kernel to write into (a GM workspace)."""
    return ctx.add("scratch", [], tuple(shape), dtype, shape=tuple(shape))


def concat(tensors, dim=0):
    """The tensors joined along `dim` (torch.cat): each is written into its part of a new tensor
    (one copy per input, through GM)."""
    ts = [_tensor(t, "concat") for t in (tensors if isinstance(tensors, (list, tuple)) else [tensors])]
    if not ts:
        raise ShapeError("concat: no tensors", loc=user_loc(), expected="at least one tensor", got="[]")
    first = ts[0]
    d = _dim(first, dim, "concat")
    for t_ in ts[1:]:
        if t_.ndim != first.ndim or any(a != b for k, (a, b) in enumerate(zip(t_.shape, first.shape)) if k != d):
            raise ShapeError("concat: the tensors must match except along dim", loc=user_loc(),
                             expected=f"[{', '.join('*' if k == d else str(s) for k, s in enumerate(first.shape))}]",
                             got=list(t_.shape))
        if t_.dtype != first.dtype:
            raise DTypeError("concat: the tensors have different dtypes", loc=user_loc(), expected=str(first.dtype),
                             got=str(t_.dtype))
    if len(ts) == 1:
        return first
    shape = list(first.shape)
    shape[d] = builtins.sum(t_.shape[d] for t_ in ts)
    out = _scratch(_ctx(first, "concat"), shape, first.dtype)
    start = 0
    for t_ in ts:
        offsets = [0] * len(shape)
        offsets[d] = start
        _store(out, t_, offsets, t_.shape)
        start += t_.shape[d]
    return out


cat = concatenate = concat


def stack(tensors, dim=0):
    """The tensors (of one shape) stacked along a new dim."""
    ts = [_tensor(t_, "stack") for t_ in tensors]
    if not ts:
        raise ShapeError("stack: no tensors", loc=user_loc(), expected="at least one tensor", got="[]")
    if any(t_.shape != ts[0].shape for t_ in ts):
        raise ShapeError("stack: the tensors must have one shape", loc=user_loc(), expected=list(ts[0].shape),
                         got=[list(t_.shape) for t_ in ts])
    return concat([unsqueeze(t_, dim) for t_ in ts], dim if dim >= 0 else dim)


def pad(x, pad, value=0.0):
    """x with `value` around it (torch.nn.functional.pad, constant mode): `pad` gives
    (before, after) sizes for the last dim, then the one before it, ...:
    pad(x, (1, 1, 2, 0)) adds 1 column on each side and 2 rows on top."""
    x = _tensor(x, "pad")
    pad = [int(p) for p in pad]
    if len(pad) % 2 or len(pad) // 2 > x.ndim or any(p < 0 for p in pad):
        raise ShapeError("pad: sizes come in (before, after) pairs, from the last dim", loc=user_loc(),
                         expected=f"at most {x.ndim} pairs of sizes >= 0", got=tuple(pad))
    shape, offsets = list(x.shape), [0] * x.ndim
    for k in range(len(pad) // 2):
        d = x.ndim - 1 - k
        offsets[d] = pad[2 * k]
        shape[d] += pad[2 * k] + pad[2 * k + 1]
    if shape == list(x.shape):
        return x
    out = full(shape, value, x.dtype)
    _store(out, x, offsets, x.shape)
    return out


def view(x, shape, offsets=None, steps=None):
    """A rectangular window of `x`: `shape` elements starting at `offsets` (CANN PyPTO's view),
    every `steps`-th element along each dim (default 1: `x[:, 1::2]` is steps (1, 2)).  A window
    of a tensor in GM is free: a load reads it with strides."""
    x = _tensor(x, "view")
    offsets = tuple(offsets or (0,) * len(shape))
    for d, n in enumerate(x.shape):     # a pypto.DYNAMIC dim: whole, or one step of a pypto.loop
        if isinstance(n, SymbolicScalar) and d < len(shape) and d < len(offsets):
            check_slice(x.shape, d, slice(offsets[d], offsets[d] + shape[d]))
    shape = tuple(s if isinstance(s, SymbolicScalar) else int(s) for s in shape)
    offsets = tuple(int(o) for o in offsets)
    steps = tuple(int(k) for k in (steps or (1,) * len(shape)))
    if len(shape) != x.ndim or len(offsets) != x.ndim or len(steps) != x.ndim or any(
            o < 0 or s < 1 or k < 1 or o + (s - 1) * k + 1 > full for o, s, k, full in zip(offsets, shape, steps, x.shape)):
        raise ShapeError("view: window outside the tensor", loc=user_loc(),
                         expected=f"a window inside {list(x.shape)}",
                         got=f"shape {list(shape)} at offsets {list(offsets)}"
                             + (f" with steps {list(steps)}" if any(k != 1 for k in steps) else ""))
    if shape == x.shape:
        return x
    attrs = {"shape": shape, "offsets": offsets}
    if any(k != 1 for k in steps):
        attrs["steps"] = steps
    return _ctx(x, "view").add("view", [x], shape, x.dtype, **attrs)


def _pair(v, what: str) -> tuple[int, int]:
    if isinstance(v, numbers.Integral):
        v = (int(v), int(v))
    v = tuple(int(a) for a in v)
    if len(v) != 2:
        raise ShapeError(f"conv2d: {what} takes one int or a pair", loc=user_loc(), expected="e.g. 1 or (1, 2)", got=v)
    return v


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, layout: str = "NCHW"):
    """2-D convolution (torch.nn.functional.conv2d's arguments): `x` [N, C, H, W] with `weight`
    [F, C / groups, KH, KW] (layout "NCHW"), or `x` [N, H, W, C] with `weight` [KH, KW, C / groups, F]
    (layout "NHWC"); `stride`, `padding` (zeros) and `dilation` as ints or (h, w) pairs.

    It runs on the cube as KH x KW matmuls, one per kernel position: the output rows of a window
    of `x` (channels last; every stride-th row and column, a strided view) times that position's
    [C, F] weights, summed.  An NCHW tensor is read channels-last through transposed views (NCHW
    <-> NHWC is a change of strides, not a copy), and the result is transposed back; the `layout`
    pass folds the transposes two stacked NCHW convolutions would otherwise apply twice.  Padding
    writes `x` into a zero tensor first.  A depthwise convolution (groups = C = F) runs on the
    vector unit (per position: the window times that position's per-channel weights); other
    groups are one convolution per group, concatenated along the channels."""
    x, weight = _tensor(x, "conv2d"), _tensor(weight, "conv2d")
    if layout not in ("NCHW", "NHWC"):
        raise UnsupportedError("conv2d: unknown layout", loc=user_loc(), expected="NCHW or NHWC", got=repr(layout))
    if x.ndim != 4 or weight.ndim != 4:
        raise ShapeError("conv2d: input and weight must be 4-D", loc=user_loc(),
                         expected=f"{layout} input and its weight", got=f"{list(x.shape)} and {list(weight.shape)}")
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation")
    if min(sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ShapeError("conv2d: stride and dilation must be >= 1, padding >= 0", loc=user_loc(),
                         expected="stride >= 1, dilation >= 1, padding >= 0",
                         got=f"stride {(sh, sw)}, padding {(ph, pw)}, dilation {(dh, dw)}")
    if layout == "NCHW":
        x = permute(x, 0, 2, 3, 1)                                # N, H, W, C
        weight = permute(weight, 2, 3, 1, 0)                      # KH, KW, C / groups, F
    n, h, w, c = x.shape
    kh_, kw_, cg, f = weight.shape
    if groups < 1 or c % groups or f % groups or cg * groups != c:
        raise ShapeError("conv2d: weight does not fit the input's channels", loc=user_loc(),
                         expected=f"C / groups = {c}/{groups} input channels per group and F divisible by groups",
                         got=f"{cg} channels per group, {f} filters")
    oh = (h + 2 * ph - dh * (kh_ - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw_ - 1) - 1) // sw + 1
    if oh < 1 or ow < 1:
        raise ShapeError("conv2d: the kernel does not fit the (padded) input", loc=user_loc(),
                         expected=f"an extent of at most {h + 2 * ph}x{w + 2 * pw}",
                         got=f"kernel {kh_}x{kw_} dilated by {(dh, dw)}")
    if ph or pw:
        x = pad(x, (0, 0, pw, pw, ph, ph), 0.0 if x.dtype.is_float else 0)
    steps = (1, sh, sw, 1)

    def window(t, kh, kw, channels=None):
        c0, cn = channels or (0, t.shape[3])
        return view(t, (n, oh, ow, cn), (0, kh * dh, kw * dw, c0), steps)

    if groups == 1:
        out = None
        for kh in range(kh_):
            for kw in range(kw_):
                part = matmul(window(x, kh, kw), view(weight, (1, 1, c, f), (kh, kw, 0, 0)))
                out = part if out is None else add(out, part)
    elif groups == c and f == c:                                  # depthwise: on the vector unit
        out = None
        for kh in range(kh_):
            for kw in range(kw_):
                part = mul(window(x, kh, kw), reshape(view(weight, (1, 1, 1, f), (kh, kw, 0, 0)), [f]))
                out = part if out is None else add(out, part)
    else:
        fg = f // groups
        parts = [conv2d(view(x, (n, x.shape[1], x.shape[2], cg), (0, 0, 0, gi * cg)),
                        view(weight, (kh_, kw_, cg, fg), (0, 0, 0, gi * fg)),
                        stride=(sh, sw), dilation=(dh, dw), layout="NHWC") for gi in range(groups)]
        out = concat(parts, dim=3)
    if bias is not None:
        bias = _tensor(bias, "conv2d")
        if bias.shape != (f,):
            raise ShapeError("conv2d: bias must have one value per filter", loc=user_loc(), expected=[f],
                             got=list(bias.shape))
        out = add(out, bias)
    if layout == "NCHW":
        out = transpose(transpose(out, 2, 3), 1, 2)               # N, F, OH, OW
    return out


def _window(x: Tensor, key):
    """Offsets, shape and steps of `x[key]` (basic slicing, positive steps) and the dims an
    integer index drops."""
    if not isinstance(key, tuple):
        key = (key,)
    if any(k is Ellipsis for k in key):
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (x.ndim - len(key) + 1) + key[i + 1:]
    if len(key) > x.ndim:
        raise ShapeError("too many indices", loc=user_loc(), expected=f"at most {x.ndim}", got=len(key))
    key = key + (slice(None),) * (x.ndim - len(key))
    offsets, shape, steps, dropped = [], [], [], []
    for d, (k, n) in enumerate(zip(key, x.shape)):
        if isinstance(n, SymbolicScalar):               # a pypto.DYNAMIC dim: whole, or a loop step
            off, size = check_slice(x.shape, d, k)
            offsets.append(off)
            shape.append(1 if size is None else size)
            steps.append(1)
            if size is None:
                dropped.append(d)
            continue
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step < 1:
                raise UnsupportedError("slices with a negative step", loc=user_loc(), expected="a positive step",
                                       got=step, hint="reverse the data outside the kernel, or index forwards")
            offsets.append(start)
            shape.append(len(range(start, stop, step)))
            steps.append(step)
        elif isinstance(k, numbers.Integral):
            i = int(k) + n if k < 0 else int(k)
            if not 0 <= i < n:
                raise ShapeError("index out of range", loc=user_loc(), expected=f"0 <= index < {n}", got=k)
            offsets.append(i)
            shape.append(1)
            steps.append(1)
            dropped.append(d)
        else:
            raise UnsupportedError("tensor indexing with this key", loc=user_loc(),
                                   expected="integers and slices", got=type(k).__name__)
    if 0 in shape:
        raise ShapeError("empty slice", loc=user_loc(), expected="at least one element per dim",
                         got=shape)
    return tuple(offsets), tuple(shape), tuple(steps), dropped


def getitem(x: Tensor, key) -> Tensor:
    x = _tensor(x, "getitem")
    offsets, shape, steps, dropped = _window(x, key)
    v = view(x, shape, offsets, steps)
    if dropped:
        v = reshape(v, [s for d, s in enumerate(shape) if d not in dropped])
    return v


def assemble(src, offsets, dst) -> None:
    """Write `src` into `dst` at `offsets` (CANN PyPTO's assemble)."""
    src, dst = _tensor(src, "assemble"), _tensor(dst, "assemble")
    for d, (o, n) in enumerate(zip(offsets, dst.shape)):
        if isinstance(n, SymbolicScalar):
            check_slice(dst.shape, d, slice(o, o + (src.shape[d] if d < src.ndim else 1)))
    _store(dst, src, tuple(int(o) for o in offsets), src.shape)


def setitem(dst: Tensor, key, value) -> None:
    dst = _tensor(dst, "setitem")
    offsets, shape, steps, dropped = _window(dst, key)
    if isinstance(value, numbers.Number):
        raise UnsupportedError("assigning a Python number to a tensor", loc=user_loc(),
                               expected="a tensor value", got=value)
    value = _tensor(value, "setitem")
    want = tuple(s for d, s in enumerate(shape) if d not in dropped)
    squeezed = tuple(s for s in shape if s != 1)
    if value.shape != want and value.shape != shape and tuple(s for s in value.shape if s != 1) != squeezed:
        hint = None
        if dst._param is not None and not dropped and key in (slice(None), (slice(None),), Ellipsis):
            hint = (f"the output argument '{dst._param}' has shape {list(dst.shape)}: pass an output of shape "
                    f"{list(value.shape)}")
        elif value.size == _size_prod(shape):
            hint = f"reshape the value first: value.reshape({', '.join(map(str, want))})"
        raise ShapeError("assigned value does not match the target region", loc=user_loc(),
                         expected=list(want), got=list(value.shape), hint=hint)
    if value.shape != shape:
        value = reshape(value, shape)
    _store(dst, value, offsets, shape, steps)


def _store(dst: Tensor, value: Tensor, offsets, shape, steps=None) -> None:
    ctx = _ctx(dst, "assemble")
    if value.dtype != dst.dtype:
        raise DTypeError(f"writing {value.dtype} data into '{dst._param}'", loc=user_loc(),
                         expected=str(dst.dtype), got=str(value.dtype))
    steps = tuple(steps or (1,) * len(shape))
    if len(offsets) != dst.ndim or any(o < 0 or o + (s - 1) * k + 1 > n
                                       for o, s, k, n in zip(offsets, shape, steps, dst.shape)):
        raise ShapeError("write outside the output tensor", loc=user_loc(),
                         expected=f"a region inside {list(dst.shape)}",
                         got=f"shape {list(shape)} at offsets {list(offsets)}")
    attrs = {"offsets": tuple(offsets), "shape": tuple(shape)}
    if any(k != 1 for k in steps):
        attrs["steps"] = steps
    if dst._param is None:
        # a tensor of the kernel (pypto.zeros, a computed value, a concat's buffer): the write
        # gives its new contents, and the proxy follows them (later reads see the write)
        new = ctx.add("write", [dst, value], dst.shape, dst.dtype, **attrs)
        dst._node = new._node
        return
    ctx.add("store", [value], shape, value.dtype, param=dst._param, **attrs)
    ctx.stored.add(dst._param)


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def set_vec_tile_shapes(*dims: int) -> None:
    """Tile shape of the vector ops that follow: one size per dim, for the last dims of the
    tensors (a tile with fewer dims than a tensor is 1 along its leading dims)."""
    ctx = TraceContext.current("pypto.set_vec_tile_shapes")
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = tuple(dims[0])                      # set_vec_tile_shapes([64, 256]) reads the same
    if not dims or any(not _is_int(d) or d < 1 for d in dims):
        bad = "no dims" if not dims else next(repr(d) for d in dims if not _is_int(d) or d < 1)
        raise TileShapeError("vector tile dims must be positive integers", loc=user_loc(),
                             expected="e.g. set_vec_tile_shapes(64, 256)",
                             got=f"{tuple(dims)!r} ({bad})" if dims else "no dims",
                             hint="one positive size per tiled dim, for the last dims of the tensors")
    ctx.vec_tile = TileSpec(tuple(int(d) for d in dims), user_loc())


_CUBE_HINT = "set_cube_tile_shapes([mL0, mL1], [kL0, kL1], [nL0, nL1])"


def set_cube_tile_shapes(*args, **kwargs) -> None:
    """Cube tile shapes `[mL0, mL1], [kL0, kL1], [nL0, nL1]` of the matmuls that follow (m, k
    and n may be given as keywords; a single int v means [v, v])."""
    ctx = TraceContext.current("pypto.set_cube_tile_shapes")
    unknown = sorted(set(kwargs) - {"m", "k", "n"})
    named = [kwargs[name] for name in ("m", "k", "n")[len(args):] if name in kwargs]
    given = list(args) + named
    if unknown or len(given) != 3 or any(name in kwargs for name in ("m", "k", "n")[:len(args)]):
        raise TileShapeError("set_cube_tile_shapes takes three [L0, L1] pairs: for m, k and n",
                             loc=user_loc(), expected="3 arguments (m, k, n)",
                             got=f"{len(args) + len(kwargs)} argument{'s' if len(args) + len(kwargs) != 1 else ''}"
                                 + (f" (unknown keyword {', '.join(unknown)})" if unknown else ""),
                             hint=_CUBE_HINT)
    spec = []
    for name, v in zip("mkn", given):
        v = [v, v] if _is_int(v) else (list(v) if isinstance(v, (list, tuple)) else v)
        if not isinstance(v, list) or len(v) != 2 or any(not _is_int(x) or x < 1 for x in v) or v[1] % v[0]:
            why = ("not a pair" if not isinstance(v, list) or len(v) != 2 else
                   "not positive integers" if any(not _is_int(x) or x < 1 for x in v) else
                   f"L1 = {v[1]} is not a multiple of L0 = {v[0]}")
            raise TileShapeError(f"cube tile shape for {name} must be [L0, L1] with L1 a multiple of L0",
                                 loc=user_loc(), expected="e.g. [128, 128]", got=f"{v!r} ({why})",
                                 hint=_CUBE_HINT)
        spec.append((int(v[0]), int(v[1])))
    ctx.cube_tile = TileSpec(tuple(spec), user_loc())


loop = _dyn.loop


# --- indexing: gather, scatter, topk

def _index(index, op: str, ndim: int | None = None) -> Tensor:
    """An index tensor: int32 (int8 is widened); `ndim`: the rank it must have."""
    idx = _tensor(index, op)
    if idx.dtype == dt.DT_INT8:
        idx = cast(idx, dt.DT_INT32)
    if idx.dtype != dt.DT_INT32:
        raise DTypeError(f"{op}: the index must be an int32 tensor", loc=user_loc(), expected="int32",
                         got=str(idx.dtype), hint="cast it: pypto.cast(index, pypto.DT_INT32)")
    if ndim is not None and idx.ndim != ndim:
        raise ShapeError(f"{op}: the index must have {ndim} dim{'s' if ndim != 1 else ''}", loc=user_loc(),
                         expected=f"{ndim}-D", got=list(idx.shape))
    return idx


def _gather_into(x: Tensor, d: int, idx: Tensor, shape, op: str) -> Tensor:
    for k, (s, n) in enumerate(zip(shape, x.shape)):
        if k != d and s > n:
            raise ShapeError(f"{op}: the index is larger than the input off dim {d}", loc=user_loc(),
                             expected=f"at most {n} along dim {k}", got=list(idx.shape))
    ctx = _ctx(x, op)
    return ctx.add("gather", [x, idx], tuple(shape), x.dtype, dim=d, shape=tuple(shape), **_vec_tile(ctx))


def _vec_tile(ctx: TraceContext) -> dict:
    """The tile shape of set_vec_tile_shapes for an indexed op (its group iterates the index)."""
    return {"tile": ctx.vec_tile} if ctx.vec_tile else {}


def gather(input, dim, index):
    """torch.gather: out[i][j][k] = input[index[i][j][k]][j][k] along `dim` (the result has the
    index's shape; int32 index of input's rank, at most input's size off `dim`).  The input stays in
    GM and MGATHER reads its elements for each tile of the index (one 32-byte sector each).  An index
    out of range: checked mode (simulate(checked=True)) names this line; unchecked it is clipped
    into [0, n)."""
    x = _tensor(input, "gather")
    idx = _index(index, "gather", x.ndim)
    return _gather_into(x, _dim(x, dim, "gather"), idx, idx.shape, "gather")


def take_along_dim(input, indices, dim=None):
    """torch.take_along_dim: gather with the index broadcast against the input off `dim` (dim=None:
    over the flattened input)."""
    x = _tensor(input, "take_along_dim")
    if dim is None:
        idx = _index(indices, "take_along_dim")
        return gather(reshape(x, [x.size]), 0, reshape(idx, [idx.size]))
    idx = _index(indices, "take_along_dim", x.ndim)
    d = _dim(x, dim, "take_along_dim")
    shape = []
    for k, (s, n) in enumerate(zip(idx.shape, x.shape)):
        if k != d and s not in (1, n):
            raise ShapeError("take_along_dim: the index does not broadcast against the input", loc=user_loc(),
                             expected=f"1 or {n} along dim {k}", got=list(idx.shape))
        shape.append(s if k == d else n)
    return _gather_into(x, d, idx, shape, "take_along_dim")


def index_select(input, dim, index):
    """torch.index_select: the slices of input at the 1-D int32 `index` along `dim`."""
    x = _tensor(input, "index_select")
    idx = _index(index, "index_select", 1)
    d = _dim(x, dim, "index_select")
    a = {"dim": d}
    return _ctx(x, "index_select").add("index_select", [x, idx], check_shape("index_select", [x, idx], a),
                                       x.dtype, **a)


def embedding(input, weight):
    """torch.nn.functional.embedding: the rows of `weight` [V, D] at the int32 indices `input`
    (the lookup of an nn.Embedding): [*input.shape, D]; an index_select of rows."""
    idx, w = _index(input, "embedding"), _tensor(weight, "embedding")
    if w.ndim != 2:
        raise ShapeError("embedding: the weight must be [num_embeddings, embedding_dim]", loc=user_loc(),
                         expected="2-D", got=list(w.shape))
    return _ctx(w, "embedding").add("embedding", [idx, w], check_shape("embedding", [idx, w], {}), w.dtype)


def _scatter(op: str, input, dim, index, src) -> Tensor:
    x = _tensor(input, op)
    idx = _index(index, op, x.ndim)
    d = _dim(x, dim, op)
    for k, (s, n) in enumerate(zip(idx.shape, x.shape)):
        if k != d and s > n:
            raise ShapeError(f"{op}: the index is larger than the input off dim {d}", loc=user_loc(),
                             expected=f"at most {n} along dim {k}", got=list(idx.shape))
    if isinstance(src, numbers.Number):         # torch's value=: a tensor of it, the index's shape
        src = full(idx.shape, src, x.dtype)
    src = _tensor(src, op)
    if src.dtype != x.dtype:
        raise DTypeError(f"{op}: src and input have different dtypes", loc=user_loc(), expected=str(x.dtype),
                         got=str(src.dtype))
    if src.ndim != x.ndim or any(s < n for s, n in zip(src.shape, idx.shape)):
        raise ShapeError(f"{op}: src must be at least as large as the index", loc=user_loc(),
                         expected=f">= {list(idx.shape)}", got=list(src.shape))
    if src.shape != idx.shape:                  # torch reads src[:i0, :i1, ..]
        src = view(src, idx.shape, [0] * x.ndim)
    attrs = {"dim": d} if op == "scatter" else {"dim": d, "acc": x.dtype.name}
    ctx = _ctx(x, op)
    return ctx.add(op, [x, src, idx], x.shape, x.dtype, **attrs, **_vec_tile(ctx))


def scatter(input, dim, index, src=None, value=None):
    """torch.scatter (out of place): input with src[i][j] written at [index[i][j]][j] along `dim`
    (or the number `value`).  The result is a copy of input (a write into a buffer of its own, as
    x[region] = v) that MSCATTER stores into, tile by tile of the index; duplicate indices: the last
    in index order wins in the simulator (on hardware, as in torch, unspecified).  Out of range:
    checked mode names this line; unchecked the element is dropped."""
    return _scatter("scatter", input, dim, index, value if src is None else src)


def scatter_add(input, dim, index, src):
    """torch.scatter_add: input with src[i][j] added at [index[i][j]][j] along `dim`; duplicate
    indices accumulate (np.add.at), across cores too (MSCATTER atomic=ADD adds in GM, in the
    tensor's dtype)."""
    return _scatter("scatter_add", input, dim, index, src)


def index_add(input, dim, index, source, alpha=1):
    """torch.index_add: input with alpha * source's slices added at the 1-D int32 `index` along
    `dim` (source: input's shape with len(index) along dim); a scatter_add of the index broadcast."""
    x, s = _tensor(input, "index_add"), _tensor(source, "index_add")
    idx = _index(index, "index_add", 1)
    d = _dim(x, dim, "index_add")
    if s.shape != tuple(idx.shape[0] if k == d else n for k, n in enumerate(x.shape)):
        raise ShapeError("index_add: source must be input's shape with len(index) along dim", loc=user_loc(),
                         expected=[idx.shape[0] if k == d else n for k, n in enumerate(x.shape)], got=list(s.shape))
    if s.dtype != x.dtype:
        raise DTypeError("index_add: source and input have different dtypes", loc=user_loc(), expected=str(x.dtype),
                         got=str(s.dtype))
    a = {"dim": d, "alpha": _number(alpha, "index_add", "alpha"), "acc": x.dtype.name}
    return _ctx(x, "index_add").add("index_add", [x, idx, s], x.shape, x.dtype, **a)


def topk(input, k, dim=-1, largest=True, sorted=True):
    """torch.topk: (values, int32 indices) of the k largest (smallest) elements along `dim`, in
    descending (ascending) order, ties to the lowest index.  For small k: k rounds of the extreme
    (amax), the first index reaching it among those not yet taken (compare + where over an iota +
    amin), then that element marked taken.  A NaN ranks before every number (amax and amin
    propagate it): its round's value is NaN and its index the NaN's, the lowest first (torch ranks
    NaN first for largest=True, last for largest=False)."""
    x = _tensor(input, "topk")
    d = _dim(x, dim, "topk")
    n = x.shape[d]
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= n:
        raise ShapeError("topk: k out of range", loc=user_loc(), expected=f"1 <= k <= {n}", got=repr(k))
    extreme = amax if largest else amin
    iota_shape = [1] * x.ndim
    iota_shape[d] = n
    pos = _iota(tuple(iota_shape), d, dt.DT_INT32)
    ctx = _ctx(x, "topk")
    cur, taken, vals, idxs = x, eq(pos, n), [], []       # (nothing taken yet)
    a = {"dim": d, "largest": bool(largest)}
    for r in range(int(k)):
        vals.append(extreme(cur, d, keepdim=True))
        # (a row of its own: its index is exact for the honest check, as a gather's index is)
        i = ctx.add("top_index", [cur, taken], check_shape("top_index", [cur, taken], a), dt.DT_INT32, **a)
        idxs.append(i)
        if r + 1 < k:
            chosen = eq(pos, i)
            taken = logical_or(taken, chosen)
            # the taken element out of the running: the extreme is then another one's
            cur = where(chosen, _worst(x.dtype, largest), cur)
    return concat(vals, d), concat(idxs, d)


def _worst(dtype, largest: bool):
    import numpy as np
    if dtype.is_float:
        return float("-inf") if largest else float("inf")
    info = np.iinfo(dtype.np_dtype)
    return int(info.min) if largest else int(info.max)


def _from_row(row):
    """pypto.<name> of an element-wise row that has no function of its own here."""
    if row.signature == "x":
        def f(x):
            return _unary(row.name, x)
    else:
        def f(a, b):
            return _binary(row.name, a, b)
    f.__name__ = f.__qualname__ = row.api or row.name
    f.__doc__ = f"{row.doc} (element-wise; generated from the op registry's row)"
    return f


for _row in OPS.values():
    if _row.signature and (_row.api or _row.name) not in globals():
        globals()[_row.api or _row.name] = _from_row(_row)

# the public ops: every function of this module whose name has no leading underscore (the
# package re-exports them as pypto.<name>)
__all__ = sorted(n for n, v in list(globals().items())
                 if callable(v) and getattr(v, "__module__", None) == __name__ and not n.startswith("_")
                 and n not in ("getitem", "setitem"))       # (the tensor's [] and []=)
