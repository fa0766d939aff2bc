"""The dtypes a kernel can use, with their numpy counterparts (bf16 through ml_dtypes, imported
when bf16 is first used: importing it takes about a second)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str          # short name used in IR text: fp32, fp16, bf16, int8, int32, bool
    itemsize: int
    _np: object        # the numpy dtype, or a function that makes it (bf16's: on first use)
    is_float: bool

    @property
    def np_dtype(self) -> np.dtype:
        v = self._np
        if not isinstance(v, np.dtype):
            v = v()
            object.__setattr__(self, "_np", v)
        return v

    def __eq__(self, other) -> bool:
        # every field, as the generated one, but the same object first (dtypes are singletons);
        # the name decides the numpy dtype
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.name, self.itemsize, self.is_float) == (other.name, other.itemsize, other.is_float)

    def __hash__(self) -> int:
        # the name alone (equal dtypes have equal names): the generated hash of every field
        # hashes the numpy dtype too, and tile sizes are looked up by (shape, dtype) per tile
        return hash(self.name)

    def __repr__(self) -> str:
        return f"pypto.DT_{self.name.upper()}"

    def __str__(self) -> str:
        return self.name


DT_FP32 = DType("fp32", 4, np.dtype(np.float32), True)
DT_FP16 = DType("fp16", 2, np.dtype(np.float16), True)
def _bfloat16() -> np.dtype:
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


DT_BF16 = DType("bf16", 2, _bfloat16, True)
DT_INT8 = DType("int8", 1, np.dtype(np.int8), False)
DT_INT32 = DType("int32", 4, np.dtype(np.int32), False)
DT_BOOL = DType("bool", 1, np.dtype(np.bool_), False)     # masks: what comparisons give, where selects by

ALL_DTYPES = (DT_FP32, DT_FP16, DT_BF16, DT_INT8, DT_INT32, DT_BOOL)
BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NUMPY = {d.np_dtype: d for d in ALL_DTYPES if d is not DT_BF16}


def from_numpy(dt) -> DType | None:
    """The pypto dtype of a numpy dtype, or None when pypto does not support it."""
    if isinstance(dt, str) and dt == "bfloat16":
        return DT_BF16
    d = np.dtype(dt)
    if d.name == "bfloat16":            # an ml_dtypes array: ml_dtypes is imported already
        return DT_BF16 if d == DT_BF16.np_dtype else None
    return _BY_NUMPY.get(d)


def parse(name: str) -> DType:
    return BY_NAME[name]


def promote(a: DType, b: DType) -> DType:
    """Result dtype of a binary op: the wider float wins; ints promote to floats."""
    if a == b:
        return a
    if a.is_float != b.is_float:
        return a if a.is_float else b
    return a if a.itemsize >= b.itemsize else b


def supported_names() -> str:
    return ", ".join(d.name for d in ALL_DTYPES)
