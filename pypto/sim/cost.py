"""Per-instruction cost model (cycles), from the public Ascend figures.

- cube: 6 + c * ceil(M/16) * ceil(K/K0) * ceil(N/16), K0 = 32 bytes / sizeof(A), c = 2 for fp32;
- vector: head + slope * repeats + tail, a repeat being 256 bytes; an instruction that follows
  another on a busy V pipe shares its startup (no head);
- DMA: bytes / path bandwidth (GM traffic is additionally limited by the shared HBM, in timing).
"""
from __future__ import annotations

import math

from ..ir.core import ceil_div, prod
from ..ir.exec import Instr, TileRef
from ..ir.gm import GMRef
from .machine import Machine

VECTOR_SLOPE = {  # cycles per 256-byte repeat
    "TDIV": 4, "TDIVS": 4, "TRECIP": 4, "TROWEXPANDDIV": 4, "TCOLEXPANDDIV": 4,
    "TEXP": 4, "TLOG": 4, "TSQRT": 4, "TRSQRT": 4,
    "TROWSUM": 2, "TROWMAX": 2, "TROWMIN": 2, "TCOLSUM": 2, "TCOLMAX": 2, "TCOLMIN": 2,
}
SYNC_CYCLES = {"SET_FLAG": 1, "WAIT_FLAG": 1, "PIPE_BARRIER": 1}


def vector_repeats(ins: Instr, m: Machine) -> int:
    """256-byte repeats over the larger of destination and sources (rows padded to 32 bytes)."""
    best = 0
    for t in (ins.dst,) + tuple(ins.srcs):
        if isinstance(t, TileRef):
            rows = prod(t.valid[:-1])
            row_bytes = ceil_div(t.valid[-1] * t.dtype.itemsize, 32) * 32
            best = max(best, rows * row_bytes)
    return max(1, ceil_div(best, m.vec_repeat_bytes))


def cube_cycles(m_: int, k: int, n: int, itemsize: int, machine: Machine) -> int:
    k0 = 32 // itemsize
    c = 2 if itemsize == 4 else 1
    return machine.cube_startup + c * ceil_div(m_, 16) * ceil_div(k, k0) * ceil_div(n, 16)


def dma_path(ins: Instr) -> tuple[str, str]:
    src = ins.srcs[0]
    s = "GM" if isinstance(src, GMRef) else src.space
    d = "GM" if isinstance(ins.dst, GMRef) else ins.dst.space
    return s, d


def dma_bytes(ins: Instr) -> int:
    """Bytes moved: the valid data (GM side) of the transfer."""
    for o in (ins.dst,) + tuple(ins.srcs):
        if isinstance(o, GMRef):
            return o.nbytes
    t = ins.srcs[0]
    return prod(t.valid) * t.dtype.itemsize


def base_cycles(ins: Instr, m: Machine) -> int:
    """Cycles of one instruction alone on its pipe (vector: including head and tail)."""
    op = ins.op
    if op in SYNC_CYCLES:
        return SYNC_CYCLES[op]
    if op.startswith("TMATMUL"):
        a, b = ins.srcs[-2], ins.srcs[-1]
        return cube_cycles(a.valid[0], a.valid[1], b.valid[1], a.dtype.itemsize, m)
    if op in ("TLOAD", "TSTORE", "TEXTRACT", "TMOV"):
        src, dst = dma_path(ins)
        return max(1, math.ceil(dma_bytes(ins) / m.dma_bytes_per_cycle(src, dst)))
    return m.vec_head + VECTOR_SLOPE.get(op, 1) * vector_repeats(ins, m) + m.vec_tail


def is_vector(op: str) -> bool:
    return not (op in SYNC_CYCLES or op.startswith("TMATMUL") or op in ("TLOAD", "TSTORE", "TEXTRACT", "TMOV"))
