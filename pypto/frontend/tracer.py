"""Tracing: a kernel runs once over `Tensor` proxies and every op it calls becomes a node.

`Tensor` is both the user-facing spec (`pypto.Tensor([256, 1024], pypto.DT_FP32)`, usable as an
annotation or as a shape-only argument) and, while tracing, the proxy of a graph value.
"""
from __future__ import annotations

import numbers
import sys
from typing import Sequence

from .. import dtypes as dt
from ..errors import DTypeError, ShapeError, SourceLoc, UnsupportedError, PyptoError, code_loc, in_package
from ..ir.core import Attrs, fmt_shape
from ..ir.tensor import OPS, Param, TileSpec, TNode, TensorGraph, infer_shape
from .dynamic import DYNAMIC, SymbolicScalar, called_by_user, plain

def user_loc() -> SourceLoc | None:
    """The innermost stack frame outside the pypto package: the user's kernel line, with the
    columns of the call (or operator) that is running there."""
    f = sys._getframe(1)
    while f is not None:
        if not in_package(f.f_code.co_filename):
            return code_loc(f.f_code, f.f_lasti, f.f_lineno)
        f = f.f_back
    return None


def _as_dtype(d):
    """A pypto dtype from its name ("fp16") or a numpy dtype (np.float16, "float16"); `d`
    itself when it is neither (the caller reports it)."""
    if isinstance(d, str) and d in dt.BY_NAME:
        return dt.parse(d)
    try:
        import numpy as np
        found = dt.from_numpy(np.dtype(d))
    except (TypeError, ValueError):
        return d
    return found if found is not None else d


def _check_dims(shape) -> tuple[int, ...]:
    """A tensor shape as a tuple of positive ints, or `pypto.DYNAMIC` for a size known only at
    call time (a ShapeError naming the bad dim otherwise)."""
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise ShapeError("a tensor shape must be a list of ints", loc=user_loc(),
                         expected="e.g. pypto.Tensor([256, 1024], pypto.DT_FP32)",
                         got=f"{type(shape).__name__} {shape!r}"[:80]) from None
    for i, d in enumerate(dims):
        if d is DYNAMIC:
            continue
        if not isinstance(d, numbers.Integral) or isinstance(d, bool):
            raise ShapeError(f"dim {i} of the tensor shape is not an integer", loc=user_loc(),
                             expected="positive ints, or pypto.DYNAMIC for a size known when the kernel is called",
                             got=f"{list(dims)!r}: {type(d).__name__} {d!r}"[:100])
        if d < 0:
            raise ShapeError(f"dim {i} of the tensor shape is negative", loc=user_loc(),
                             expected="positive ints", got=list(dims))
        if d == 0:
            raise ShapeError(f"dim {i} of the tensor shape is 0: empty tensors are not supported",
                             loc=user_loc(), expected="at least one element along every dim", got=list(dims),
                             hint="a kernel over no data has nothing to compute; skip the call")
    return tuple(d if d is DYNAMIC else int(d) for d in dims)


def _user_calls() -> bool:
    """Whether the code calling into this module (past its own frames) is the user's."""
    return called_by_user(__file__)


# the op kinds that take the kernel's vector tile (set_vec_tile_shapes) as their `tile` attr
TILED_KINDS = ("unary", "binary", "reduce", "cast", "composite", "compare", "select", "broadcast", "fill", "iota")


class TraceContext:
    """Collects the nodes of one kernel trace.

    `machine` is the Machine compiled for (None when a trace is not for one compile: a probe);
    `pypto.target_specific` reads it and sets `machine_used`.  `fuse` is the open
    `pypto.fuse()` region (a `compiler.fusion.FuseRegion`): the ops traced in it get it as
    their `fuse` attr."""

    _stack: list["TraceContext"] = []

    def __init__(self, name: str, machine=None):
        self.name = name
        self.machine = machine
        self.machine_used = False
        self.fuse = None
        self.fuse_count = 0
        self.nodes: list[TNode] = []
        self.params: list[Param] = []
        self.vec_tile: TileSpec | None = None
        self.cube_tile: TileSpec | None = None
        self.stored: set[str] = set()
        self.dynamic = False            # a kernel with pypto.DYNAMIC dims (SymbolicScalar sizes)
        self.loop_steps: list[int] = []     # the steps of its pypto.loops over them
        self.loc: SourceLoc | None = None   # set: the location of every node added (generated
        #                                     code, e.g. a gradient, names the line it came from)

    def __enter__(self):
        TraceContext._stack.append(self)
        return self

    def __exit__(self, *exc):
        TraceContext._stack.pop()

    @classmethod
    def current(cls, what: str = "this operation") -> "TraceContext":
        if not cls._stack:
            raise PyptoError(f"{what} can only be used inside a @pypto.jit kernel", loc=user_loc())
        return cls._stack[-1]

    def graph(self) -> TensorGraph:
        return TensorGraph(self.name, tuple(self.params), tuple(self.nodes))

    def add(self, op: str, inputs: Sequence["Tensor"], out_shape, dtype, /, **attrs) -> "Tensor":
        for t in inputs:
            if t._ctx is not self:
                raise UnsupportedError(
                    f"{op}: a tensor of another trace", loc=user_loc(),
                    expected="tensors of the kernel (or registered op) being traced", got=repr(t),
                    hint="a registered op's body computes only with its arguments: pass the tensor as one more")
            if t._param is not None and t._param in self.stored:
                raise UnsupportedError(
                    f"'{t._param}' is read after the kernel wrote to it", loc=user_loc(),
                    expected="outputs to be written after their last read", got=f"a read of {t._param}")
        if OPS[op].kind in TILED_KINDS and self.vec_tile:
            attrs.setdefault("tile", self.vec_tile)
        if op == "matmul" and self.cube_tile:
            attrs.setdefault("tile", self.cube_tile)
        if self.fuse is not None and op not in ("input", "const", "store"):
            attrs.setdefault("fuse", self.fuse)
        out_shape = tuple(out_shape)
        symbolic = any(isinstance(d, SymbolicScalar) for d in out_shape)
        if self.dynamic:                # graph nodes hold plain ints; the proxy keeps the symbols
            attrs = {k: plain(v) for k, v in attrs.items()}
        node = TNode(len(self.nodes), op, tuple(t._node for t in inputs), plain(out_shape) if symbolic else out_shape,
                     dtype, Attrs(attrs), self.loc or user_loc())
        self.nodes.append(node)
        return Tensor._proxy(self, node, out_shape if symbolic else None)

    def input(self, name: str, shape, dtype, loc: SourceLoc | None = None) -> "Tensor":
        """A kernel parameter; its location is the kernel's `def` line.  A dim of `shape` that
        is a SymbolicScalar is a dynamic one: the graph holds its value, the proxy the symbol."""
        shape = tuple(shape)
        self.params.append(Param(name, plain(shape), dtype))
        node = TNode(len(self.nodes), "input", (), plain(shape), dtype, Attrs({"param": name}), loc)
        self.nodes.append(node)
        t = Tensor._proxy(self, node, shape if any(isinstance(d, SymbolicScalar) for d in shape) else None)
        t._param = name
        return t


class Tensor:
    """A tensor: a shape and a dtype; while tracing, also a value of the kernel's graph."""

    __array_priority__ = 1000  # numpy scalars on the left defer to our operators

    def __init__(self, shape, dtype: dt.DType = dt.DT_FP32, name: str | None = None):
        if not isinstance(dtype, dt.DType):
            dtype = _as_dtype(dtype)
        if not isinstance(dtype, dt.DType):
            raise DTypeError("unsupported dtype", loc=user_loc(),
                             expected=dt.supported_names(), got=repr(dtype))
        self.shape = _check_dims(shape)
        self.dtype = dtype
        self.name = name
        self._ctx: TraceContext | None = None
        self._node: int | None = None
        self._param: str | None = None

    @classmethod
    def _proxy(cls, ctx: TraceContext, node: TNode, shape=None) -> "Tensor":
        t = cls.__new__(cls)
        t.shape, t.dtype, t.name = tuple(node.shape) if shape is None else shape, node.dtype, None
        t._ctx, t._node, t._param = ctx, node.id, None
        return t

    # --- introspection -------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= int(s)
        sym = next((s for s in self.shape if isinstance(s, SymbolicScalar)), None)
        if sym is not None and _user_calls():   # x.numel() depends on N: not a number for the kernel
            sym._refuse("x.numel()")
        return n

    def __repr__(self):
        what = f"%{self._node}" if self._node is not None else (self.name or "Tensor")
        return f"{what}: {self.dtype}{fmt_shape(self.shape)}"

    def __len__(self):
        if not self.shape:
            raise UnsupportedError("len() of a 0-d tensor", loc=user_loc(),
                                   expected="a tensor with at least one dim", got="shape []")
        if isinstance(self.shape[0], SymbolicScalar) and _user_calls():
            self.shape[0]._refuse("len(x)")     # (len() would hand the kernel the chunk's rows)
        return self.shape[0]

    def __bool__(self):
        raise UnsupportedError("a traced tensor has no truth value (its data is not known while compiling)",
                               loc=user_loc(), expected="Python control flow on shapes or constants",
                               got="`if` / `while` on a tensor",
                               hint="choose per element with a mask instead: pypto.where(x > 0, a, b)")

    # --- operators (defined in ops.py, bound here) --------------------------------------
    def __add__(self, o): return _ops().add(self, o)
    def __radd__(self, o): return _ops().add(o, self)
    def __sub__(self, o): return _ops().sub(self, o)
    def __rsub__(self, o): return _ops().sub(o, self)
    def __mul__(self, o): return _ops().mul(self, o)
    def __rmul__(self, o): return _ops().mul(o, self)
    def __truediv__(self, o): return _ops().div(self, o)
    def __rtruediv__(self, o): return _ops().div(o, self)
    def __matmul__(self, o): return _ops().matmul(self, o)
    def __neg__(self): return _ops().neg(self)
    def __abs__(self): return _ops().abs(self)
    def __pow__(self, p):
        if isinstance(p, numbers.Number) and not isinstance(p, bool):
            if p == 2:
                return _ops().mul(self, self)      # any dtype (pow is float-only)
            return _ops().pow(self, p)
        raise UnsupportedError("a tensor exponent is not supported", loc=user_loc(),
                               expected="x ** a Python number", got=f"x ** {type(p).__name__}"[:60],
                               hint="for x ** y with tensors x > 0 and y write pypto.exp(y * pypto.log(x))")

    def __rpow__(self, p):
        raise UnsupportedError("a number raised to a tensor power is not supported", loc=user_loc(),
                               expected="x ** a Python number", got=f"{p!r}**tensor"[:60],
                               hint="for b**x (b > 0) write pypto.exp(x * math.log(b))")

    # --- comparisons: masks (bool tensors), as in torch; a tensor still hashes as an object
    def __eq__(self, o): return _ops().eq(self, o)
    def __ne__(self, o): return _ops().ne(self, o)
    def __lt__(self, o): return _ops().lt(self, o)
    def __le__(self, o): return _ops().le(self, o)
    def __gt__(self, o): return _ops().gt(self, o)
    def __ge__(self, o): return _ops().ge(self, o)
    def __and__(self, o): return _ops().logical_and(self, o)
    def __rand__(self, o): return _ops().logical_and(o, self)
    def __or__(self, o): return _ops().logical_or(self, o)
    def __ror__(self, o): return _ops().logical_or(o, self)
    def __xor__(self, o): return _ops().logical_xor(self, o)
    def __rxor__(self, o): return _ops().logical_xor(o, self)
    def __invert__(self): return _ops().logical_not(self)

    __hash__ = object.__hash__

    def _no_scalar(self, what: str):
        raise UnsupportedError(f"a traced tensor cannot be converted to a Python {what}", loc=user_loc(),
                               expected="a tensor used in pypto operations", got=f"{what}(tensor)",
                               hint="its data is not known while compiling; shapes are: x.shape[0]")

    def __float__(self): self._no_scalar("float")
    def __int__(self): self._no_scalar("int")
    def __index__(self): self._no_scalar("int")
    def __complex__(self): self._no_scalar("complex")

    def __iter__(self):
        """Rows along the first dim (the loop is unrolled while tracing)."""
        if not self.shape:
            raise UnsupportedError("iterating over a 0-d tensor", loc=user_loc(),
                                   expected="a tensor with at least one dim", got="shape []")
        for i in range(self.shape[0]):
            yield self[i]

    # --- methods (torch's names): element-wise, reductions, layout
    def exp(self): return _ops().exp(self)
    def log(self): return _ops().log(self)
    def sqrt(self): return _ops().sqrt(self)
    def rsqrt(self): return _ops().rsqrt(self)
    def reciprocal(self): return _ops().reciprocal(self)
    def abs(self): return _ops().abs(self)
    def neg(self): return _ops().neg(self)
    def relu(self): return _ops().relu(self)
    def sigmoid(self): return _ops().sigmoid(self)
    def tanh(self): return _ops().tanh(self)
    def square(self): return _ops().square(self)
    def expm1(self): return _ops().expm1(self)
    def log1p(self): return _ops().log1p(self)
    # (math, reductions and creation grown through the registry)
    def sinh(self): return _ops().sinh(self)
    def cosh(self): return _ops().cosh(self)
    def asinh(self): return _ops().asinh(self)
    def acosh(self): return _ops().acosh(self)
    def atanh(self): return _ops().atanh(self)
    arcsinh, arccosh, arctanh = asinh, acosh, atanh
    def erf(self): return _ops().erf(self)
    def exp2(self): return _ops().exp2(self)
    def log2(self): return _ops().log2(self)
    def log10(self): return _ops().log10(self)
    def sign(self): return _ops().sign(self)
    def hypot(self, other): return _ops().hypot(self, other)
    def logaddexp(self, other): return _ops().logaddexp(self, other)
    def lerp(self, end, weight): return _ops().lerp(self, end, weight)
    def addcmul(self, tensor1, tensor2, value=1): return _ops().addcmul(self, tensor1, tensor2, value)
    def addcdiv(self, tensor1, tensor2, value=1): return _ops().addcdiv(self, tensor1, tensor2, value)
    def norm(self, p=2, dim=-1, keepdim=False): return _ops().norm(self, p, dim, keepdim)
    def prelu(self, weight): return _ops().prelu(self, weight)
    def __mod__(self, o): return _ops().remainder(self, o)
    def __rmod__(self, o): return _ops().remainder(o, self)
    def remainder(self, other): return _ops().remainder(self, other)
    def fmod(self, other): return _ops().fmod(self, other)
    def prod(self, dim=-1, keepdim=False): return _ops().prod(self, dim, keepdim)
    def floor(self): return _ops().floor(self)
    def ceil(self): return _ops().ceil(self)
    def round(self, decimals=0): return _ops().round(self, decimals)
    def trunc(self): return _ops().trunc(self)
    def frac(self): return _ops().frac(self)
    def tril(self, diagonal=0): return _ops().tril(self, diagonal)
    def triu(self, diagonal=0): return _ops().triu(self, diagonal)
    def argmax(self, dim=None, keepdim=False): return _ops().argmax(self, dim, keepdim)
    def argmin(self, dim=None, keepdim=False): return _ops().argmin(self, dim, keepdim)
    # indexing: gather, scatter, topk
    def gather(self, dim, index): return _ops().gather(self, dim, index)
    def take_along_dim(self, indices, dim=None): return _ops().take_along_dim(self, indices, dim)
    def index_select(self, dim, index): return _ops().index_select(self, dim, index)
    def scatter(self, dim, index, src=None, value=None): return _ops().scatter(self, dim, index, src, value)
    def scatter_add(self, dim, index, src): return _ops().scatter_add(self, dim, index, src)
    def index_add(self, dim, index, source, alpha=1): return _ops().index_add(self, dim, index, source, alpha)
    def topk(self, k, dim=-1, largest=True, sorted=True): return _ops().topk(self, k, dim, largest, sorted)
    def pow(self, exponent): return _ops().pow(self, exponent)
    def clamp(self, min=None, max=None): return _ops().clamp(self, min, max)
    clip = clamp
    def softmax(self, dim=-1): return _ops().softmax(self, dim)
    def log_softmax(self, dim=-1): return _ops().log_softmax(self, dim)
    def sum(self, dim=-1, keepdim=False): return _ops().sum(self, dim, keepdim)
    def amax(self, dim=-1, keepdim=False): return _ops().amax(self, dim, keepdim)
    def amin(self, dim=-1, keepdim=False): return _ops().amin(self, dim, keepdim)
    def mean(self, dim=-1, keepdim=False): return _ops().mean(self, dim, keepdim)
    def var(self, dim=-1, keepdim=False, correction=1): return _ops().var(self, dim, keepdim, correction)
    def std(self, dim=-1, keepdim=False, correction=1): return _ops().std(self, dim, keepdim, correction)
    def logsumexp(self, dim=-1, keepdim=False): return _ops().logsumexp(self, dim, keepdim)
    def matmul(self, other): return _ops().matmul(self, other)
    def permute(self, *dims): return _ops().permute(self, *dims)
    def expand(self, *sizes): return _ops().expand(self, *sizes)
    def expand_as(self, other): return _ops().expand(self, other.shape)
    def repeat(self, *sizes): return _ops().repeat(self, *sizes)
    def squeeze(self, dim=None): return _ops().squeeze(self, dim)
    def unsqueeze(self, dim): return _ops().unsqueeze(self, dim)
    def flatten(self, start_dim=0, end_dim=-1): return _ops().flatten(self, start_dim, end_dim)
    def unflatten(self, dim, sizes): return _ops().unflatten(self, dim, sizes)
    def narrow(self, dim, start, length): return _ops().narrow(self, dim, start, length)

    def to_tile(self, shape=None, *, auto_shape=False, space="UB", load=True, live=2):
        """In a tile- or block-level kernel: iterate the tiles of this view as (offsets, tile)
        pairs (`pypto.frontend.tile_forms.to_tile`)."""
        from .tile_forms import to_tile
        return to_tile(self, shape, auto_shape=auto_shape, space=space, load=load, live=live)

    def split(self, size, dim=0): return _ops().split(self, size, dim)
    def chunk(self, chunks, dim=0): return _ops().chunk(self, chunks, dim)
    def unbind(self, dim=0): return _ops().unbind(self, dim)
    def movedim(self, source, destination): return _ops().movedim(self, source, destination)
    def swapaxes(self, dim0, dim1): return _ops().transpose(self, dim0, dim1)
    swapdims = swapaxes
    def t(self): return _ops().t(self)
    def where(self, cond, other): return _ops().where(cond, self, other)
    def masked_fill(self, mask, value): return _ops().masked_fill(self, mask, value)
    def isnan(self): return _ops().isnan(self)
    def isinf(self): return _ops().isinf(self)
    def isfinite(self): return _ops().isfinite(self)
    def logical_not(self): return _ops().logical_not(self)
    def dim(self): return self.ndim
    def numel(self): return self.size
    def float(self): return _ops().cast(self, dt.DT_FP32)
    def half(self): return _ops().cast(self, dt.DT_FP16)
    def bfloat16(self): return _ops().cast(self, dt.DT_BF16)
    def int(self): return _ops().cast(self, dt.DT_INT32)
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        return _ops().reshape(self, shape)
    def transpose(self, dim0=-2, dim1=-1): return _ops().transpose(self, dim0, dim1)
    def cast(self, dtype): return _ops().cast(self, dtype)
    astype = cast

    @property
    def T(self):
        """All dims reversed (torch's .T; for 2-D the matrix transpose)."""
        return _ops().permute(self, list(range(self.ndim))[::-1]) if self.ndim > 2 else _ops().transpose(self, -2, -1)

    @property
    def mT(self):
        """The last two dims swapped (a batch of matrices transposed)."""
        return _ops().transpose(self, -2, -1)

    def __getitem__(self, key):
        return _ops().getitem(self, key)

    def __setitem__(self, key, value):
        _ops().setitem(self, key, value)


def _ops():
    from . import ops
    return ops


def check_shape(op: str, inputs, attrs) -> tuple[int, ...]:
    shape = infer_shape(op, [t.shape for t in inputs], attrs)
    if shape is None:
        got = " and ".join(fmt_shape(t.shape) for t in inputs)
        raise ShapeError(f"{op}: shapes do not fit", loc=user_loc(),
                         expected=_shape_rule(op, attrs), got=got)
    return shape


def _shape_rule(op, attrs) -> str:
    kind = OPS[op].kind
    if kind == "binary":
        return "shapes that broadcast (equal dims, or 1)"
    if op == "matmul":
        return "[..., M, K] @ [..., K, N] (after the transpose flags)"
    if kind == "reduce" or op == "mean":
        return "a dim inside the tensor's rank"
    return f"a shape valid for {op}"
