"""Functional simulation: run a PTO program on numpy, one short handler per instruction.

On-chip spaces are byte arrays; a tile operand is a strided numpy view of its bytes (rows
padded to 32 bytes), so the program's buffer allocation is exercised for real.  Tasks run one
after another in dependency order, each instruction stream in program order: synchronisation
only matters for timing, a correct program computes the same values sequentially.
"""
from __future__ import annotations

import numpy as np

from ..errors import SimulationError
from ..ir.exec import Instr, TileRef
from ..ir.gm import GMRef
from ..ir.program import Program
from ..ir.tile import row_pitch
from .machine import Machine


class Memory:
    def __init__(self, program: Program, machine: Machine, arrays: dict[str, np.ndarray]):
        self.onchip = {k: np.zeros(v, dtype=np.uint8) for k, v in machine.capacities().items()}
        self.gm: dict[str, np.ndarray] = {}
        for b in program.buffers:
            if b.name in arrays:
                a = np.ascontiguousarray(arrays[b.name], dtype=b.dtype.np_dtype).reshape(-1).copy()
            else:
                a = np.zeros(int(np.prod(b.shape)), dtype=b.dtype.np_dtype)
            self.gm[b.name] = a

    def tile(self, t: TileRef) -> np.ndarray:
        """The valid region of a tile, as a view of its space's bytes."""
        item = t.dtype.itemsize
        strides, acc = [item], row_pitch(t.shape, t.dtype)
        for s in reversed(t.shape[:-1]):
            strides.insert(0, acc)
            acc *= s
        return np.ndarray(t.valid, dtype=t.dtype.np_dtype, buffer=self.onchip[t.space], offset=t.addr,
                          strides=tuple(strides))

    def window(self, r: GMRef) -> np.ndarray:
        flat = self.gm[r.buf.name]
        lo, hi = r.span()
        if lo < 0 or hi > flat.size:
            raise SimulationError(f"GM access outside buffer {r.buf.name}", expected=f"[0, {flat.size})",
                                  got=f"[{lo}, {hi})")
        item = flat.itemsize
        return np.lib.stride_tricks.as_strided(flat[r.offset:], r.shape, tuple(s * item for s in r.strides),
                                               writeable=True)

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
    if op in ("SET_FLAG", "WAIT_FLAG", "PIPE_BARRIER"):
        return
    dst = mem.get(ins.dst)
    srcs = [mem.get(s) for s in ins.srcs]
    if op in ("TLOAD", "TSTORE"):
        dst[...] = srcs[0].astype(dst.dtype, copy=False)
    elif op == "TEXTRACT":
        full = ins.srcs[0]
        whole = mem.tile(TileRef(full.space, full.addr, full.dtype, full.shape, full.shape))
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


def run_functional(program: Program, machine: Machine, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute the program; return the final contents of every non-workspace GM buffer."""
    mem = Memory(program, machine, arrays)
    with np.errstate(all="ignore"):
        for t in program.tasks:
            for ins in t.instrs:
                execute(ins, mem)
    return {b.name: mem.gm[b.name].reshape(b.shape) for b in program.buffers if b.role != "workspace"}
