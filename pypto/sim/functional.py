"""Functional simulation: run a PTO program on numpy, one short handler per instruction.

On-chip spaces are byte arrays; a tile operand is a strided numpy view of its bytes (rows
padded to 32 bytes), so the program's buffer allocation is exercised for real.  Tasks run one
after another in dependency order, each instruction stream in program order: synchronisation
only matters for timing, a correct program computes the same values sequentially.
"""
from __future__ import annotations

import numpy as np

from ..errors import SimulationError
from ..ir.exec import SYNC_OPS, Instr, TileRef
from ..ir.gm import GMRef
from ..ir.program import Program
from ..ir.tile import row_pitch
from .machine import Machine


class Memory:
    """GM buffers and on-chip spaces of one simulation.

    In checked mode fresh on-chip bytes are 0xFF (NaN for every float dtype) and a byte mask
    tracks what the current task has written, so a read of bytes it never wrote is reported.
    """

    def __init__(self, program: Program, machine: Machine, arrays: dict[str, np.ndarray],
                 checked: bool = False):
        self.capacity = machine.capacities()
        self.checked = checked
        fill = 0xFF if checked else 0
        self.onchip = {k: np.full(v, fill, dtype=np.uint8) for k, v in self.capacity.items()}
        self.written = {k: np.zeros(v, dtype=np.bool_) for k, v in self.capacity.items()} if checked else None
        self._views: dict[int, np.ndarray] = {}     # id(TileRef) -> view (operands are interned)
        self._fits: set[int] = set()                # TileRefs already checked against capacity
        self.gm: dict[str, np.ndarray] = {}
        for b in program.buffers:
            if b.name in arrays:
                a = np.ascontiguousarray(arrays[b.name], dtype=b.dtype.np_dtype).reshape(-1).copy()
            else:
                a = np.zeros(int(np.prod(b.shape)), dtype=b.dtype.np_dtype)
            self.gm[b.name] = a

    def tile(self, t: TileRef, buffer=None, dtype=None) -> np.ndarray:
        """The valid region of a tile, as a view of its space's bytes (or of another byte array)."""
        if buffer is None:
            v = self._views.get(id(t))
            if v is None:
                v = self._views[id(t)] = self._view(t, self.onchip[t.space], t.dtype.np_dtype)
            return v
        return self._view(t, buffer, dtype)

    @staticmethod
    def _view(t: TileRef, buffer, dtype) -> np.ndarray:
        item = t.dtype.itemsize
        strides, acc = [item], row_pitch(t.shape, t.dtype)
        for s in reversed(t.shape[:-1]):
            strides.insert(0, acc)
            acc *= s
        return np.ndarray(t.valid, dtype=dtype, buffer=buffer, offset=t.addr, strides=tuple(strides))

    def new_task(self):
        if self.checked:
            for m in self.written.values():
                m[:] = False

    def check_tile(self, t: TileRef, ins: Instr, task, k: int, reading: bool):
        if not self.checked and id(t) in self._fits:
            return
        if t.addr < 0 or t.addr + t.nbytes > self.capacity[t.space]:
            raise SimulationError(
                f"task {task.id} instruction {k} ({ins.op}): tile overflows {t.space}", loc=ins.loc,
                expected=f"bytes within [0, {self.capacity[t.space]})",
                got=f"[{t.addr}, {t.addr + t.nbytes})")
        if self.checked:
            mask = self.tile(t, self.written[t.space], np.bool_)
            if reading and not mask.all():
                raise SimulationError(
                    f"task {task.id} instruction {k} ({ins.op}) reads uninitialised {t.space} data "
                    f"at {t.addr:#x}", loc=ins.loc, expected="bytes written earlier by this task",
                    got=f"{int((~mask).sum())} of {mask.size} elements never written")
            if not reading:
                mask[...] = True
        self._fits.add(id(t))

    def window(self, r: GMRef) -> np.ndarray:
        flat = self.gm[r.buf.name]
        lo, hi = r.span()
        if lo < 0 or hi > flat.size:
            raise SimulationError(f"GM access outside buffer {r.buf.name}", expected=f"[0, {flat.size})",
                                  got=f"[{lo}, {hi})")
        item = flat.itemsize
        return np.ndarray(r.shape, dtype=flat.dtype, buffer=flat, offset=r.offset * item,
                          strides=tuple(s * item for s in r.strides))

    def get(self, o):
        if isinstance(o, TileRef):
            return self.tile(o)
        if isinstance(o, GMRef):
            return self.window(o)
        return o


def _scalar(v, like: np.ndarray):
    return np.asarray(v, dtype=like.dtype)


UNARY = {"TEXP": np.exp, "TLOG": np.log, "TSQRT": np.sqrt, "TRSQRT": lambda x: np.reciprocal(np.sqrt(x)),
         "TRECIP": np.reciprocal, "TABS": np.abs, "TNEG": np.negative,
         "TRELU": lambda x: np.maximum(x, np.zeros((), x.dtype))}
BINARY = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide,
          "MAX": np.maximum, "MIN": np.minimum}
REDUCE = {"SUM": np.sum, "MAX": np.max, "MIN": np.min}


def _binary_name(op: str) -> tuple[str, str] | None:
    """'TROWEXPANDSUB' -> ('ROWEXPAND', 'SUB'); 'TADDS' -> ('S', 'ADD'); 'TADD' -> ('', 'ADD')."""
    body = op[1:]
    for pre in ("ROWEXPAND", "COLEXPAND"):
        if body.startswith(pre) and body[len(pre):] in BINARY:
            return pre, body[len(pre):]
    if body in BINARY:
        return "", body
    if body.endswith("S") and body[:-1] in BINARY:
        return "S", body[:-1]
    return None


def execute(ins: Instr, mem: Memory) -> None:
    op = ins.op
    if op in SYNC_OPS:
        return
    dst = mem.get(ins.dst)
    srcs = [mem.get(s) for s in ins.srcs]
    if op in ("TLOAD", "TSTORE"):
        dst[...] = srcs[0].astype(dst.dtype, copy=False)
    elif op == "TEXTRACT":
        full = ins.srcs[0]
        # the whole allocated source tile (a temporary ref: not cached, its id may be reused)
        whole = mem._view(TileRef(full.space, full.addr, full.dtype, full.shape, full.shape),
                          mem.onchip[full.space], full.dtype.np_dtype)
        r0, c0 = ins.attrs["offsets"]
        dst[...] = whole[r0:r0 + dst.shape[0], c0:c0 + dst.shape[1]]
    elif op == "TMATMUL":
        dst[...] = np.matmul(srcs[0].astype(dst.dtype), srcs[1].astype(dst.dtype))
    elif op == "TMATMUL_ACC":
        dst[...] = srcs[0] + np.matmul(srcs[1].astype(dst.dtype), srcs[2].astype(dst.dtype))
    elif op in UNARY:
        dst[...] = UNARY[op](srcs[0])
    elif op == "TCVT":
        dst[...] = srcs[0].astype(dst.dtype)
    elif op in ("TROWEXPAND", "TCOLEXPAND"):
        dst[...] = np.broadcast_to(srcs[0], dst.shape)
    elif op[:4] in ("TROW", "TCOL") and op[4:] in REDUCE:
        dst[...] = REDUCE[op[4:]](srcs[0], axis=ins.attrs["dim"], keepdims=True)
    else:
        parts = _binary_name(op)
        if parts is None:
            raise SimulationError(f"no functional rule for instruction {op}", loc=ins.loc)
        kind, name = parts
        b = _scalar(srcs[1], srcs[0]) if kind == "S" else srcs[1]
        dst[...] = BINARY[name](srcs[0], b)


def run_functional(program: Program, machine: Machine, arrays: dict[str, np.ndarray],
                   checked: bool = False) -> dict[str, np.ndarray]:
    """Execute the program; return the final contents of every non-workspace GM buffer."""
    mem = Memory(program, machine, arrays, checked)
    with np.errstate(all="ignore"):
        for t in program.tasks:
            mem.new_task()
            for k, ins in enumerate(t.instrs):
                if ins.op in SYNC_OPS:          # ordering only matters to the timing model
                    continue
                for s in ins.srcs:
                    if isinstance(s, TileRef):
                        mem.check_tile(s, ins, t, k, reading=True)
                if isinstance(ins.dst, TileRef):
                    mem.check_tile(ins.dst, ins, t, k, reading=False)
                execute(ins, mem)
    return {b.name: mem.gm[b.name].reshape(b.shape) for b in program.buffers if b.role != "workspace"}
