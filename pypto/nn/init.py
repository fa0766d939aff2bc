"""Initialisation of parameters with torch.nn.init's distributions, from numpy generators.

The values are not torch's bit for bit (another generator), the distributions are: a module made
with the same `seed` (or after the same `pypto.nn.manual_seed(n)`) gets the same values.  Without
either, a process-wide generator seeded with 0 at import is used (deterministic, as torch's
default seed is)."""
from __future__ import annotations

import math
import numbers

import numpy as np

_GLOBAL = [np.random.default_rng(0)]


def manual_seed(seed: int) -> np.random.Generator:
    """Re-seed the generator that modules made without `seed=` draw from; returns it."""
    _GLOBAL[0] = np.random.default_rng(int(seed))
    return _GLOBAL[0]


def generator(seed=None) -> np.random.Generator:
    """The generator of a `seed=` argument: None -> the process-wide one, an int -> a new one
    seeded with it, a numpy Generator -> itself (how a module hands its draws to sub-modules)."""
    if seed is None:
        return _GLOBAL[0]
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return np.random.default_rng(int(seed))
    raise TypeError(f"seed must be None, an int or a numpy Generator, not {type(seed).__name__}")


def _array(p):
    return p.data if hasattr(p, "data") and isinstance(p.data, np.ndarray) else p


def _fill(p, values) -> object:
    a = _array(p)
    a[...] = np.asarray(values, dtype=np.float64).astype(a.dtype)
    return p


def fan_in_and_fan_out(shape) -> tuple[int, int]:
    """torch's fans: dim 1 and dim 0 of a weight, times its receptive field (dims 2 and on)."""
    if len(shape) < 2:
        raise ValueError("fan in and fan out need a weight of at least 2 dims")
    field = math.prod(shape[2:])
    return shape[1] * field, shape[0] * field


def uniform_(p, a: float = 0.0, b: float = 1.0, rng=None):
    return _fill(p, generator(rng).uniform(a, b, _array(p).shape))


def normal_(p, mean: float = 0.0, std: float = 1.0, rng=None):
    return _fill(p, generator(rng).normal(mean, std, _array(p).shape))


def zeros_(p):
    return _fill(p, 0.0)


def ones_(p):
    return _fill(p, 1.0)


def calculate_gain(nonlinearity: str, param=None) -> float:
    """torch.nn.init.calculate_gain: linear/sigmoid 1, tanh 5/3, relu sqrt(2), leaky_relu
    sqrt(2 / (1 + slope^2)) (slope `param`, 0.01 by default)."""
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "sigmoid", "conv_transpose2d"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r}")


def kaiming_uniform_(p, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", rng=None):
    """U(-bound, bound), bound = gain * sqrt(3 / fan) (torch.nn.init.kaiming_uniform_)."""
    fan_in, fan_out = fan_in_and_fan_out(_array(p).shape)
    fan = fan_in if mode == "fan_in" else fan_out
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan) if fan else 0.0
    return uniform_(p, -bound, bound, rng)


def xavier_uniform_(p, gain: float = 1.0, rng=None):
    """U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)) (torch.nn.init.xavier_uniform_)."""
    fan_in, fan_out = fan_in_and_fan_out(_array(p).shape)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(p, -bound, bound, rng)


def fan_in_uniform_(p, fan_in: int, rng=None):
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): the bias of torch's Linear and Conv2d."""
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return uniform_(p, -bound, bound, rng)
