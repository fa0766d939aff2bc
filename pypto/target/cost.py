"""The cost of one instruction (cycles), from the public Ascend figures and the instruction table.

- cube: 6 + c * ceil(M/16) * ceil(K/K0) * ceil(N/16), K0 = 32 bytes / sizeof(A), c = 2 for fp32;
- vector: head + slope * repeats + tail, a repeat being 256 bytes (`slope`: the row's cycles per
  repeat); an instruction that follows another on a busy V pipe shares its startup (no head);
- DMA: bytes / path bandwidth (GM traffic is additionally limited by the shared HBM, in timing);
- sync: the row's fixed `cycles`.

There is one cost model: `base_cycles(instr, machine)`; which rule applies is the row's `cost`
class (`isa.KINDS`) and the machine's `cost_model`: "public" is the formulas above, "calibrated"
(a2a3's default) refines the vector and GM-load rules with constants fitted to hardware-measured
cycles of single instructions (`isa.CALIBRATED`, docs/cost_model.md):

- vector: per-op startup + slope x repeats (divisions per element in fp32), row reductions and
  row broadcasts per row, column reductions a chain of dependent steps;
- GM loads: DMAs x `dma_burst_cycles` + bytes / `gm_load_peak_gibps` (one DMA per 2-D slice of
  the window); `gm_fixed_cycles` is that overhead as the timing engines add it before the bytes
  move (the L2 latency, which they add after, taken out), `pipe_cycles` the load's time on its pipe.

`pypto.sim.cost(op, machine, **shape)` builds a synthetic instruction and asks `base_cycles`.

The target sits below the IR, so the operands are read by duck typing, not by isinstance: a GM
window (`ir.gm.GMRef`) has a `.buf`; an on-chip tile (`ir.exec.TileRef`) has a `.space` and an
`.addr`; anything else (a float) is a scalar.
"""
from __future__ import annotations

import math

from ..errors import PyptoError
from .isa import (CAL_COL_STEP, CAL_FP32_FNS, CAL_HALF_CONVERT, CAL_MAX_REPEAT, CAL_ROW_STEP, CAL_ROWEXPAND_STEP,
                  INDEXED_KINDS, INDEXED_SECTOR, INSTRUCTIONS, is_vector)
from .machine import Machine

__all__ = ["base_cycles", "calibrated_rule_class", "cube_cycles", "dma_bytes", "dma_cycles", "dma_path", "gm_fixed_cycles", "is_vector",
           "pipe_cycles", "vector_repeats"]


def _is_gm(o) -> bool:
    """A GM window (ir.gm.GMRef: it has the buffer it views)."""
    return hasattr(o, "buf")


def _is_tile(o) -> bool:
    """An on-chip tile (ir.exec.TileRef: a space and an address in it)."""
    return hasattr(o, "space") and hasattr(o, "addr")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def vector_repeats(ins, m: Machine) -> int:
    """256-byte repeats over the larger of destination and sources (rows padded to 32 bytes)."""
    best = 0
    for t in (ins.dst,) + tuple(ins.srcs):
        if _is_tile(t):
            rows = math.prod(t.valid[:-1])
            row_bytes = _ceil_div(t.valid[-1] * t.dtype.itemsize, 32) * 32
            best = max(best, rows * row_bytes)
    return max(1, _ceil_div(best, m.vec_repeat_bytes))


def _largest(ins):
    """The tile operand with the most elements (the one a vector instruction iterates over)."""
    tiles = [t for t in (ins.dst,) + tuple(ins.srcs) if _is_tile(t)]
    return max(tiles, key=lambda t: math.prod(t.valid))


def calibrated_rule_class(row) -> str:
    """Which calibrated rule a vector instruction's row follows: "fp32" (per element in fp32),
    "row_reduce", "col_sum" (pairwise), "col_chain", "row_broadcast" (TROWEXPAND) or
    "elementwise" (startup + slope x repeats); the cost and the documentation's text both read it."""
    if row.fn in CAL_FP32_FNS:
        return "fp32"
    if row.kind == "reduce":
        return "row_reduce" if row.form == "ROW" else "col_sum" if row.fn == "SUM" else "col_chain"
    if row.kind == "expand" and row.form == "ROWEXPAND":
        return "row_broadcast"
    return "elementwise"


def calibrated_vector_cycles(ins, row, m: Machine) -> float:
    """The calibrated rule of a vector instruction (see the module docstring and isa.CALIBRATED)."""
    startup, slope = row.cal
    rule = calibrated_rule_class(row)
    t = _largest(ins)
    rows = math.prod(t.valid[:-1])
    # a row-broadcast op (TROWEXPANDSUB ...) first broadcasts the row values: a repeat per 8 rows
    extra = _ceil_div(rows, 8) if row.form == "ROWEXPAND" and rule != "row_broadcast" else 0
    if rule == "fp32":
        reps = max(1, _ceil_div(math.prod(t.valid) * 4, m.vec_repeat_bytes))
        return startup + slope * reps + (CAL_HALF_CONVERT if t.dtype.itemsize == 2 else 0) + extra
    if rule == "row_broadcast":
        return startup + CAL_ROWEXPAND_STEP * rows
    reps = vector_repeats(ins, m)
    if rows > CAL_MAX_REPEAT:          # beyond the 8-bit repeat count, a repeat covers one row at most
        reps = max(reps, rows * _ceil_div(_ceil_div(t.valid[-1] * t.dtype.itemsize, 32) * 32, m.vec_repeat_bytes))
    if rule == "row_reduce":
        return startup + CAL_ROW_STEP * rows + slope * max(0, reps - rows)
    if rule == "col_sum":
        return startup + slope * reps + CAL_COL_STEP * (math.ceil(math.log2(rows)) if rows > 1 else 0)
    if rule == "col_chain":
        return startup + slope * reps + CAL_COL_STEP * max(0, rows - 1)
    return startup + slope * reps + extra


def gm_dmas(o) -> int:
    """The 2-D DMAs a GM window is moved in: one per index of its dims before the last two, its
    dims of size 1 left out."""
    dims = [d for d in o.shape if d != 1]
    return max(1, math.prod(dims[:-2]))


def _calibrated_load(ins, m: Machine) -> bool:
    """A GM load under the calibrated rules."""
    return m.cost_model == "calibrated" and ins.op == "TLOAD" and _is_gm(ins.srcs[0])


def gm_fixed_cycles(ins, m: Machine) -> int:
    """Cycles a GM transfer occupies its pipe before its bytes move: under the calibrated rules a
    load's DMAs x burst cycles, less the L2 miss latency the engines add after the transfer (so a
    lone cold load takes what `base_cycles` says); 0 for stores and under the public rules."""
    if not _calibrated_load(ins, m):
        return 0
    return max(0, gm_dmas(ins.srcs[0]) * m.dma_burst_cycles - m.l2_hit_cycles - m.l2_miss_extra_cycles)


def cube_cycles(m_: int, k: int, n: int, itemsize: int, machine: Machine) -> int:
    k0 = 32 // itemsize
    c = 2 if itemsize == 4 else 1
    return machine.cube_startup + c * _ceil_div(m_, 16) * _ceil_div(k, k0) * _ceil_div(n, 16)


def dma_path(ins) -> tuple[str, str]:
    src = ins.srcs[0]
    s = "GM" if _is_gm(src) else src.space
    d = "GM" if _is_gm(ins.dst) else ins.dst.space
    return s, d


def dma_bytes(ins) -> int:
    """Bytes moved: the GM window of a load or store; for an on-chip move (TEXTRACT, TMOV) the
    valid data of the destination tile (an extract reads only its part of the source tile); for
    an indexed DMA (MGATHER, MSCATTER) one 32-byte sector per element (isa.INDEXED_SECTOR)."""
    row = INSTRUCTIONS.get(ins.op)
    if row is not None and row.kind in INDEXED_KINDS:
        t = ins.dst if _is_tile(ins.dst) else ins.srcs[0]
        return math.prod(t.valid) * INDEXED_SECTOR
    for o in (ins.dst,) + tuple(ins.srcs):
        if _is_gm(o):
            return o.nbytes
    t = ins.dst if _is_tile(ins.dst) else ins.srcs[0]
    return math.prod(t.valid) * t.dtype.itemsize


def dma_cycles(nbytes: int, src: str, dst: str, m: Machine) -> int:
    """ceil(bytes / (GiB/s * 2^30) * f_clk), at least 1."""
    return max(1, math.ceil(nbytes / m.dma_bytes_per_cycle(src, dst)))


def base_cycles(ins, m: Machine) -> int:
    """Cycles of one instruction alone on its pipe (vector: including head and tail)."""
    row = INSTRUCTIONS.get(ins.op)
    if row is None:
        raise PyptoError(f"no cost rule for instruction {ins.op}: it has no row in the instruction table",
                         expected="an instruction of pypto.target.isa.INSTRUCTIONS", got=ins.op)
    rule = row.cost
    if rule == "vector":
        if m.cost_model == "calibrated":
            return max(1, math.ceil(calibrated_vector_cycles(ins, row, m)))
        return m.vec_head + row.slope * vector_repeats(ins, m) + m.vec_tail
    if rule == "dma":
        src, dst = dma_path(ins)
        if _calibrated_load(ins, m):
            return math.ceil(gm_dmas(ins.srcs[0]) * m.dma_burst_cycles
                             + dma_bytes(ins) / m.gm_load_bytes_per_cycle(src, dst))
        return dma_cycles(dma_bytes(ins), src, dst, m)
    if rule == "cube":
        a, b = ins.srcs[-2], ins.srcs[-1]
        return cube_cycles(a.valid[0], a.valid[1], b.valid[1], a.dtype.itemsize, m)
    if rule == "sync":
        return row.cycles
    raise PyptoError(f"instruction {ins.op}: unknown cost rule {rule!r}", expected="vector, dma, cube or sync",
                     got=rule)


def pipe_cycles(ins, m: Machine) -> int:
    """Cycles an instruction alone occupies its pipe, as the timing engines charge it with no
    other core competing: `base_cycles`, except a calibrated GM load, whose L2 latency comes
    after the pipe is free again (its fixed cycles, then its bytes at the load peak)."""
    if not _calibrated_load(ins, m):
        return base_cycles(ins, m)
    src, dst = dma_path(ins)
    return gm_fixed_cycles(ins, m) + max(1, math.ceil(dma_bytes(ins) / m.gm_load_bytes_per_cycle(src, dst)))
