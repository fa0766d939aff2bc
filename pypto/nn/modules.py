"""torch.nn's layers with torch's names, parameter names, shapes and semantics, written with
pypto ops: a torch state dict (as numpy arrays) loads into them and gives the same outputs.

Every constructor takes `dtype=` (the parameters' dtype, fp32 by default) and `seed=` (an int,
a numpy Generator, or None for the generator of `pypto.nn.manual_seed`); initial values follow
torch.nn.init's distributions (not its bits)."""
from __future__ import annotations

import collections
import copy
import math
import numbers

import numpy as np

from .. import dtypes as dt
from ..errors import DTypeError, PyptoError, ShapeError, UnsupportedError, caller_loc
from ..frontend import ops as P
from . import init
from .module import Module, Parameter, check_input


def _np_dtype(dtype) -> np.dtype:
    if dtype is None:
        return np.dtype(np.float32)
    if isinstance(dtype, dt.DType):
        return dtype.np_dtype
    if isinstance(dtype, str) and dtype in dt.BY_NAME:
        return dt.BY_NAME[dtype].np_dtype
    return np.dtype(dtype)


def _empty(shape, dtype) -> Parameter:
    return Parameter(np.zeros(tuple(shape), _np_dtype(dtype)))


def _dims(x) -> list:
    return [int(s) for s in x.shape]


def _same_dtype(x, p, what: str = "input"):
    check_input(x.dtype == p.dtype, f"the {what}'s dtype differs from the parameters'",
                expected=str(p.dtype), got=str(x.dtype), error=DTypeError,
                hint=f"cast the {what} (x.astype(...)) or the module (m.to(np.float16))")


class Identity(Module):
    """The input itself."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def _config(self):
        return ()

    def forward(self, input):
        return input


class Linear(Module):
    """y = x W^T + b: `weight` [out_features, in_features], `bias` [out_features]; x [..., in]."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype=None, seed=None):
        super().__init__()
        rng = init.generator(seed)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.weight = _empty((self.out_features, self.in_features), dtype)
        init.kaiming_uniform_(self.weight, a=math.sqrt(5), rng=rng)
        if bias:
            self.bias = _empty((self.out_features,), dtype)
            init.fan_in_uniform_(self.bias, self.in_features, rng)
        else:
            self.register_parameter("bias", None)

    def _config(self):
        return (self.in_features, self.out_features)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self._parameters['bias'] is not None}"

    def forward(self, input):
        x = input
        check_input(x.ndim >= 1 and x.shape[-1] == self.in_features, "the input's last dim is not in_features",
                    expected=f"[..., {self.in_features}]", got=_dims(x))
        w, b = self.weight, self.bias
        _same_dtype(x, w)
        lead = tuple(x.shape[:-1])
        x2 = x if x.ndim == 2 else x.reshape(math.prod(lead), self.in_features)
        y = P.matmul(x2, w, b_trans=True)
        if b is not None:
            y = y + b
        return y if x.ndim == 2 else y.reshape(*lead, self.out_features)


def _pair(v, what: str) -> tuple[int, int]:
    if isinstance(v, numbers.Integral):
        return int(v), int(v)
    v = tuple(int(a) for a in v)
    if len(v) != 2:
        raise ShapeError(f"Conv2d: {what} takes an int or a pair", loc=caller_loc(), expected="e.g. 3 or (3, 3)",
                         got=v)
    return v


class Conv2d(Module):
    """2-D convolution (torch.nn.Conv2d): `weight` [out, in / groups, kh, kw], `bias` [out];
    input [N, C, H, W] (or [C, H, W]); `padding` an int, a pair, "valid" or "same" (zeros)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", dtype=None, seed=None):
        super().__init__()
        if padding_mode != "zeros":
            raise UnsupportedError("Conv2d: only padding_mode='zeros'", loc=caller_loc(), expected="'zeros'",
                                   got=repr(padding_mode))
        if in_channels % groups or out_channels % groups:
            raise ShapeError("Conv2d: in_channels and out_channels must be divisible by groups", loc=caller_loc(),
                             expected=f"multiples of groups={groups}", got=f"{in_channels}, {out_channels}")
        rng = init.generator(seed)
        self.in_channels, self.out_channels, self.groups = int(in_channels), int(out_channels), int(groups)
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride, self.dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
        if isinstance(padding, str):
            if padding not in ("valid", "same"):
                raise ShapeError("Conv2d: padding must be an int, a pair, 'valid' or 'same'", loc=caller_loc(),
                                 expected="'valid' or 'same'", got=repr(padding))
            if padding == "same" and self.stride != (1, 1):
                raise ShapeError("Conv2d: padding='same' needs stride 1", loc=caller_loc(), expected="stride=1",
                                 got=f"stride={self.stride}")
            self.padding = padding
        else:
            self.padding = _pair(padding, "padding")
        self.padding_mode = padding_mode
        kh, kw = self.kernel_size
        self.weight = _empty((self.out_channels, self.in_channels // self.groups, kh, kw), dtype)
        init.kaiming_uniform_(self.weight, a=math.sqrt(5), rng=rng)
        if bias:
            self.bias = _empty((self.out_channels,), dtype)
            init.fan_in_uniform_(self.bias, self.in_channels // self.groups * kh * kw, rng)
        else:
            self.register_parameter("bias", None)

    def _config(self):
        return (self.in_channels, self.out_channels, self.kernel_size, self.stride, self.padding, self.dilation,
                self.groups)

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding!r}" if isinstance(self.padding, str) else f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self._parameters["bias"] is None:
            s += ", bias=False"
        return s

    def forward(self, input):
        x = input
        check_input(x.ndim in (3, 4) and x.shape[-3] == self.in_channels,
                    "the input is not [N, in_channels, H, W] (or [in_channels, H, W])",
                    expected=f"[N, {self.in_channels}, H, W]", got=_dims(x))
        _same_dtype(x, self.weight)
        unbatched = x.ndim == 3
        if unbatched:
            x = x.reshape(1, *x.shape)
        pad = self.padding
        if pad == "valid":
            pad = (0, 0)
        elif pad == "same":
            th, tw = (d * (k - 1) for d, k in zip(self.dilation, self.kernel_size))
            if th % 2 or tw % 2:            # torch puts the odd one after
                x = P.pad(x, (tw // 2, tw - tw // 2, th // 2, th - th // 2))
                pad = (0, 0)
            else:
                pad = (th // 2, tw // 2)
        kh, kw = self.kernel_size
        h, w = x.shape[2] + 2 * pad[0], x.shape[3] + 2 * pad[1]
        check_input(h >= self.dilation[0] * (kh - 1) + 1 and w >= self.dilation[1] * (kw - 1) + 1,
                    "the (padded) input is smaller than the kernel",
                    expected=f"H >= {self.dilation[0] * (kh - 1) + 1 - 2 * pad[0]}, "
                             f"W >= {self.dilation[1] * (kw - 1) + 1 - 2 * pad[1]}", got=_dims(input))
        y = P.conv2d(x, self.weight, self.bias, stride=self.stride, padding=pad, dilation=self.dilation,
                     groups=self.groups)
        return y.reshape(*y.shape[1:]) if unbatched else y


Conv2D = Conv2d          # the seeds' spelling


def _normalized(shape) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, numbers.Integral) else tuple(int(s) for s in shape)


def _check_normalized(x, shape):
    k = len(shape)
    check_input(x.ndim >= k and tuple(x.shape[-k:]) == shape,
                "the input's last dims are not normalized_shape",
                expected=f"[..., {', '.join(map(str, shape))}]", got=_dims(x))


def _flat_last(x, k):
    """x with its last k dims as one (and the shape to restore)."""
    if k == 1:
        return x, None
    lead = tuple(x.shape[:-k])
    return x.reshape(*lead, math.prod(x.shape[-k:])), tuple(x.shape)


class _Norm(Module):
    """What LayerNorm and RMSNorm share: a normalized_shape, an eps, an optional weight."""

    def _config(self):
        return (self.normalized_shape, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class LayerNorm(_Norm):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last len(normalized_shape) dims;
    `weight` (ones) and `bias` (zeros) of normalized_shape when elementwise_affine."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 dtype=None, seed=None):
        super().__init__()
        self.normalized_shape = _normalized(normalized_shape)
        self.eps, self.elementwise_affine = float(eps), bool(elementwise_affine)
        if elementwise_affine:
            self.weight = Parameter(np.ones(self.normalized_shape, _np_dtype(dtype)))
            if bias:
                self.bias = Parameter(np.zeros(self.normalized_shape, _np_dtype(dtype)))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input):
        shape = self.normalized_shape
        _check_normalized(input, shape)
        w, b = self.weight, self.bias
        if w is not None:
            _same_dtype(input, w)
        x, back = _flat_last(input, len(shape))
        if back is not None:
            w = None if w is None else w.reshape(math.prod(shape))
            b = None if b is None else b.reshape(math.prod(shape))
        y = P.layernorm(x, w, b, self.eps)
        return y if back is None else y.reshape(*back)


class RMSNorm(_Norm):
    """x / sqrt(mean(x^2) + eps) * weight over the last len(normalized_shape) dims; eps None:
    the machine epsilon of the input's dtype (torch.nn.RMSNorm)."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, dtype=None,
                 seed=None):
        super().__init__()
        self.normalized_shape = _normalized(normalized_shape)
        self.eps = None if eps is None else float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        if elementwise_affine:
            self.weight = Parameter(np.ones(self.normalized_shape, _np_dtype(dtype)))
        else:
            self.register_parameter("weight", None)

    def forward(self, input):
        shape = self.normalized_shape
        _check_normalized(input, shape)
        eps = self.eps if self.eps is not None else float(np.finfo(input.dtype.np_dtype).eps)
        w = self.weight
        x, back = _flat_last(input, len(shape))
        if w is not None:
            _same_dtype(input, w)
            y = P.rms_norm(x, w if back is None else w.reshape(math.prod(shape)), eps)
        else:
            y = x * P.rsqrt(P.mean(x * x, dim=-1, keepdim=True) + eps)
        return y if back is None else y.reshape(*back)


class Embedding(Module):
    """weight[input]: `weight` [num_embeddings, embedding_dim] ~ N(0, 1), the padding_idx row 0;
    input int indices (int64 arrays are taken as int32)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm=None, norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False,
                 _weight=None, _freeze: bool = False, dtype=None, seed=None):
        super().__init__()
        if max_norm is not None:
            raise UnsupportedError("Embedding: max_norm (renormalising rows in place) is not supported",
                                   loc=caller_loc(), expected="max_norm=None", got=max_norm)
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        if padding_idx is not None and padding_idx < 0:
            padding_idx += self.num_embeddings
        self.padding_idx = padding_idx
        if _weight is not None:
            self.weight = Parameter(_weight, requires_grad=not _freeze)
        else:
            self.weight = _empty((self.num_embeddings, self.embedding_dim), dtype)
            init.normal_(self.weight, rng=init.generator(seed))
            if padding_idx is not None:
                self.weight.data[padding_idx] = 0

    def _config(self):
        return (self.num_embeddings, self.embedding_dim)

    def extra_repr(self):
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        return s + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")

    def forward(self, input):
        check_input(not input.dtype.is_float and input.dtype != dt.DT_BOOL, "the indices must be integers",
                    expected="int32 (or int64, int8) indices", got=str(input.dtype), error=DTypeError)
        return P.embedding(input, self.weight)


class Dropout(Module):
    """The identity, in eval and in train mode alike: the simulator has no random numbers
    (torch's dropout is the identity in eval mode only).  `p` is kept for the repr."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise PyptoError("Dropout: p must be a probability", loc=caller_loc(), expected="0 <= p <= 1", got=p)
        self.p, self.inplace = float(p), bool(inplace)

    def _config(self):
        return ()

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"

    def forward(self, input):
        return input


class ReLU(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def _config(self):
        return ()

    def forward(self, input):
        return P.relu(input)


class GELU(Module):
    """GELU; approximate "none" (torch's default: the erf form) or "tanh"."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise PyptoError("GELU: approximate must be 'none' or 'tanh'", loc=caller_loc(),
                             expected="'none' or 'tanh'", got=repr(approximate))
        self.approximate = approximate

    def _config(self):
        return (self.approximate,)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"

    def forward(self, input):
        return P.gelu(input, approximate=self.approximate)


class SiLU(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()

    def _config(self):
        return ()

    def forward(self, input):
        return P.silu(input)


class Tanh(Module):
    def _config(self):
        return ()

    def forward(self, input):
        return P.tanh(input)


class Sigmoid(Module):
    def _config(self):
        return ()

    def forward(self, input):
        return P.sigmoid(input)


class Softmax(Module):
    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def _config(self):
        return (self.dim,)

    def extra_repr(self):
        return f"dim={self.dim}"

    def forward(self, input):
        return P.softmax(input, -1 if self.dim is None else self.dim)


# --- containers -----------------------------------------------------------------------------------

class Sequential(Module):
    """Sub-modules called in order (named "0", "1", ... or by an OrderedDict's keys)."""

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], collections.OrderedDict):
            for k, m in args[0].items():
                self.add_module(k, m)
        else:
            for i, m in enumerate(args):
                self.add_module(str(i), m)

    def _config(self):
        return ()

    def forward(self, input):
        for m in self.children():
            input = m(input)
        return input

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, i):
        items = list(self._modules.items())
        if isinstance(i, slice):
            return Sequential(collections.OrderedDict(items[i]))
        return items[i][1]

    def append(self, module: Module) -> "Sequential":
        self.add_module(str(len(self)), module)
        return self


class ModuleList(Module):
    """A list of sub-modules, named "0", "1", ... (no forward of its own)."""

    def __init__(self, modules=None):
        super().__init__()
        for m in modules or ():
            self.append(m)

    def _config(self):
        return ()

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ModuleList(list(self._modules.values())[i])
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of range of a ModuleList of {n}")
        return self._modules[str(i % n)]

    def __setitem__(self, i, module):
        setattr(self, str(i % len(self)), module)

    def append(self, module: Module) -> "ModuleList":
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules) -> "ModuleList":
        for m in modules:
            self.append(m)
        return self

    def forward(self, *args, **kwargs):
        raise PyptoError("ModuleList has no forward: call its modules", loc=caller_loc(),
                         expected="for m in self.layers: x = m(x)", got="layers(x)")


# --- attention and the Transformer -------------------------------------------------------------------

class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention: `in_proj_weight` [3E, E] (q, k, v stacked), `in_proj_bias`
    [3E], `out_proj` a Linear(E, E).  forward(query, key, value, key_padding_mask=None,
    need_weights=True, attn_mask=None, average_attn_weights=True, is_causal=False) ->
    (output, weights or None); inputs [N, L, E] with batch_first, [L, N, E] without, or [L, E].

    Masks: bool (True: not attended) or float (added to the scores); attn_mask [L, S] or
    [N * num_heads, L, S], key_padding_mask [N, S].  `is_causal=True` masks the future; an
    attn_mask given with it is taken to be that mask (torch's hint) and applied instead;
    without one the causal mask is built in the kernel (torch asks for the mask)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim=None, vdim=None,
                 batch_first: bool = False, dtype=None, seed=None):
        super().__init__()
        if add_bias_kv or add_zero_attn or (kdim not in (None, embed_dim)) or (vdim not in (None, embed_dim)):
            raise UnsupportedError("MultiheadAttention: add_bias_kv, add_zero_attn and kdim/vdim other than "
                                   "embed_dim are not supported", loc=caller_loc(),
                                   expected="the defaults", got=dict(add_bias_kv=add_bias_kv,
                                                                     add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim))
        if embed_dim % num_heads:
            raise ShapeError("MultiheadAttention: embed_dim must be divisible by num_heads", loc=caller_loc(),
                             expected=f"a multiple of num_heads={num_heads}", got=embed_dim)
        rng = init.generator(seed)
        self.embed_dim, self.num_heads = int(embed_dim), int(num_heads)
        self.head_dim = self.embed_dim // self.num_heads
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        e = self.embed_dim
        self.in_proj_weight = _empty((3 * e, e), dtype)
        init.xavier_uniform_(self.in_proj_weight, rng=rng)
        if bias:
            self.in_proj_bias = _empty((3 * e,), dtype)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(e, e, bias=bias, dtype=dtype, seed=rng)
        if bias:
            init.zeros_(self.out_proj.bias)

    def _config(self):
        return (self.embed_dim, self.num_heads, self.batch_first)

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True, attn_mask=None,
                average_attn_weights: bool = True, is_causal: bool = False):
        e, h, d = self.embed_dim, self.num_heads, self.head_dim
        same_kv, same_qkv = key is value, key is value and query is key
        check_input(query.ndim in (2, 3) and query.shape[-1] == e, "the query is not [N, L, E], [L, N, E] or [L, E]",
                    expected=f"[{'N, L' if self.batch_first else 'L, N'}, {e}]", got=_dims(query))
        for name, t in (("key", key), ("value", value)):
            check_input(t.ndim == query.ndim and t.shape[-1] == e, f"the {name} does not fit the query",
                        expected=f"{query.ndim} dims, the last {e}", got=_dims(t))
        check_input(tuple(key.shape) == tuple(value.shape), "the key and the value differ in shape",
                    expected=_dims(key), got=_dims(value))
        _same_dtype(query, self.in_proj_weight, "query")
        batched = query.ndim == 3
        if not batched:
            q, k, v = (t.reshape(1, *t.shape) for t in (query, key, value))
        elif not self.batch_first:
            q, k, v = (P.transpose(t, 0, 1) for t in (query, key, value))
        else:
            q, k, v = query, key, value
        n, length = q.shape[0], q.shape[1]
        s = k.shape[1]
        check_input(k.shape[0] == n, "the key's batch differs from the query's", expected=n, got=k.shape[0])
        w, b = self.in_proj_weight, self.in_proj_bias

        def proj(x, rows, first, last):
            y = P.matmul(x.reshape(n * rows, e), w[first * e:last * e], b_trans=True)
            return y if b is None else y + b[first * e:last * e]
        if same_qkv:
            qkv = proj(q, length, 0, 3)
            qp, kp, vp = qkv[:, :e], qkv[:, e:2 * e], qkv[:, 2 * e:]
        elif same_kv:
            qp = proj(q, length, 0, 1)
            kv = proj(k, s, 1, 3)
            kp, vp = kv[:, :e], kv[:, e:]
        else:
            qp, kp, vp = proj(q, length, 0, 1), proj(k, s, 1, 2), proj(v, s, 2, 3)

        def heads(t, rows):                                     # [n * rows, e] -> [n, h, rows, d]
            return P.transpose(t.reshape(n, rows, h, d), 1, 2)
        scores = P.matmul(heads(qp, length), heads(kp, s), b_trans=True) * (1.0 / math.sqrt(d))
        if attn_mask is not None:
            ok = tuple(attn_mask.shape) in ((length, s), (n * h, length, s))
            check_input(ok, "attn_mask is not [L, S] or [N * num_heads, L, S]",
                        expected=f"[{length}, {s}] or [{n * h}, {length}, {s}]", got=_dims(attn_mask))
            m = attn_mask if attn_mask.ndim == 2 else attn_mask.reshape(n, h, length, s)
            scores = self._masked(scores, m, "attn_mask")
        elif is_causal:
            rows = P.arange(length, dtype=dt.DT_INT32).reshape(length, 1)
            cols = P.arange(s, dtype=dt.DT_INT32).reshape(1, s)
            scores = P.masked_fill(scores, cols > rows, float("-inf"))
        if key_padding_mask is not None:
            kpm = tuple(key_padding_mask.shape)
            check_input(kpm == (n, s) or (not batched and kpm == (s,)), "key_padding_mask is not [N, S]",
                        expected=f"[{n}, {s}]", got=_dims(key_padding_mask))
            scores = self._masked(scores, key_padding_mask.reshape(n, 1, 1, s), "key_padding_mask")
        p = P.softmax(scores, dim=-1)
        o = P.matmul(p, heads(vp, s))                              # [n, h, length, d]
        o = P.transpose(o, 1, 2).reshape(n * length, e)
        out = self.out_proj(o).reshape(n, length, e)
        if not batched:
            out = out.reshape(length, e)
        elif not self.batch_first:
            out = P.transpose(out, 0, 1)
        weights = None
        if need_weights:
            weights = P.mean(p, dim=1) if average_attn_weights else p
            if not batched:
                weights = weights.reshape(*weights.shape[1:])
        return out, weights

    def _masked(self, scores, mask, name):
        if mask.dtype == dt.DT_BOOL:
            return P.masked_fill(scores, mask, float("-inf"))
        check_input(mask.dtype == scores.dtype, f"{name} is neither a bool mask nor of the scores' dtype",
                    expected=f"bool or {scores.dtype}", got=str(mask.dtype), error=DTypeError)
        return scores + mask


_ACTIVATIONS = ("relu", "gelu")


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: self-attention then a feed-forward block, each with a
    residual and a LayerNorm (after, or before with norm_first); parameters `self_attn.*`,
    `linear1`, `linear2`, `norm1`, `norm2`; activation "relu", "gelu" (the erf form) or a
    module / function of pypto ops.  Dropout is the identity (see Dropout)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, dtype=None, seed=None):
        super().__init__()
        rng = init.generator(seed)
        if isinstance(activation, str) and activation not in _ACTIVATIONS:
            raise PyptoError("TransformerEncoderLayer: activation must be 'relu', 'gelu' or a callable",
                             loc=caller_loc(), expected="'relu' or 'gelu'", got=repr(activation))
        self.d_model, self.nhead, self.dim_feedforward = int(d_model), int(nhead), int(dim_feedforward)
        self.batch_first, self.norm_first = bool(batch_first), bool(norm_first)
        self.layer_norm_eps = float(layer_norm_eps)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            dtype=dtype, seed=rng)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype, seed=rng)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype, seed=rng)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = activation

    def _config(self):
        act = self.activation if isinstance(self.activation, str) else (
            ("module",) if isinstance(self.activation, Module) else ("fn", self.activation))
        return (self.d_model, self.nhead, self.dim_feedforward, self.batch_first, self.norm_first,
                self.layer_norm_eps, act)

    def extra_repr(self):
        act = self.activation if isinstance(self.activation, str) else getattr(self.activation, "__name__", "")
        return (f"d_model={self.d_model}, nhead={self.nhead}, dim_feedforward={self.dim_feedforward}, "
                f"batch_first={self.batch_first}, norm_first={self.norm_first}"
                + (f", activation={act!r}" if act else ""))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        check_input(src.ndim in (2, 3) and src.shape[-1] == self.d_model,
                    "the input is not [N, S, d_model], [S, N, d_model] or [S, d_model]",
                    expected=f"[{'N, S' if self.batch_first else 'S, N'}, {self.d_model}]", got=_dims(src))
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x, mask, key_padding_mask, is_causal):
        y = self.self_attn(x, x, x, attn_mask=mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(y)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self._activate(self.linear1(x)))))

    def _activate(self, x):
        a = self.activation
        if a == "relu":
            return P.relu(x)
        if a == "gelu":
            return P.gelu(x, approximate="none")
        return a(x)


class TransformerEncoder(Module):
    """torch.nn.TransformerEncoder: `num_layers` copies of `encoder_layer` (deep copies: the
    same initial values, as torch's), then `norm` if given.  Called on arrays, each layer runs
    as a kernel of its own (one compile serves every layer: the parameters are arguments)."""

    _kernel_per_child = True

    def __init__(self, encoder_layer: Module, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(int(num_layers))])
        self.num_layers = int(num_layers)
        self.norm = norm

    def _config(self):
        return (self.num_layers,)

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal: bool | None = None):
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        if self.norm is not None:
            x = self.norm(x)
        return x


class Transformer(TransformerEncoder):
    """A stack of `num_layers` TransformerEncoderLayer(d_model, nhead, dim_feedforward, ...) on
    [batch, seq, d_model] inputs (batch_first=True by default); its state_dict keys are torch's
    nn.TransformerEncoder's (layers.0.self_attn.in_proj_weight, layers.0.linear1.weight, ...;
    norm.* too with final_norm=True).  Each layer is initialised on its own (torch's
    TransformerEncoder copies one layer).  Called on arrays, each layer is a kernel of its own;
    `pypto.nn.profile_model(m, x)` times them."""

    def __init__(self, d_model: int = 512, nhead: int = 8, num_layers: int = 6, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = True,
                 norm_first: bool = False, bias: bool = True, final_norm: bool = False, dtype=None, seed=None):
        Module.__init__(self)
        rng = init.generator(seed)
        self.d_model, self.nhead, self.num_layers = int(d_model), int(nhead), int(num_layers)
        self.layers = ModuleList([
            TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                                    batch_first, norm_first, bias, dtype=dtype, seed=rng)
            for _ in range(self.num_layers)])
        self.norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype) if final_norm else None

    def extra_repr(self):
        return f"d_model={self.d_model}, nhead={self.nhead}, num_layers={self.num_layers}"
