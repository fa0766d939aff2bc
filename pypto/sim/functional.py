"""Functional simulation: run a PTO program on numpy.

On-chip spaces are byte arrays; a tile operand is a strided numpy view of its bytes (rows
padded to 32 bytes), so the program's buffer allocation is exercised for real.  Synchronisation
only matters for timing: a correct program computes the same values when its tasks run one after
another in program order, each instruction stream in program order.  What each instruction
computes is defined once, by `functional_plan.decode`.

Two ways to run, with the same results:

* the plan (unchecked mode, `functional_plan`): the program decoded once into a list of numpy
  calls.  Tasks that run the same instruction stream execute together along a leading task axis;
  each stream is rewritten into fewer calls (copies that only relay data dropped, the iterations
  of a loop over tiles fused into one call); GM buffers whose first contents the program never
  reads are not filled.  The Python cost is paid per batch of tasks, and the numpy work comes
  close to that of the same math written directly;
* the reference interpreter (checked mode, and programs the plan refuses: operands out of bounds,
  no functional rule, shapes that do not combine): one instruction at a time, with the checks;
  what fails is a SimulationError naming the task, instruction and kernel line.  In checked
  mode fresh on-chip bytes are 0xFF (NaN for every float dtype) and a byte mask tracks what the
  current task has written, so a read of bytes it never wrote is reported, as are tiles beyond
  their space, windows beyond their GM buffer and indices of an MGATHER / MSCATTER outside the dim
  they index (unchecked, a gather clips them and a scatter drops the element).
"""
from __future__ import annotations

import numpy as np

from ..errors import SimulationError
from ..ir.core import prod
from ..ir.exec import SYNC_OPS, Instr, TileRef
from ..ir.gm import GMRef
from ..ir.program import Program
from ..ir.tile import tile_strides
from .functional_plan import check_indices, decode, plan_for, reused
from ..target.machine import Machine


def _gm_arrays(program: Program, arrays: dict[str, np.ndarray], unobserved=frozenset()) -> dict[str, np.ndarray]:
    """Flat copies of the given GM buffers, zeros for the others; no first contents for those
    the program never observes (a workspace then reuses memory of an earlier run)."""
    gm = {}
    for b in program.buffers:
        n, dtype = prod(b.shape), b.dtype.np_dtype
        if b.name in unobserved:
            gm[b.name] = (reused(("GM", b.name), n * dtype.itemsize)[:n * dtype.itemsize].view(dtype)
                          if b.role == "workspace" else np.empty(n, dtype))
        elif b.name in arrays:
            a = np.asarray(arrays[b.name])
            if a.size != n:
                raise SimulationError(f"the array for GM buffer {b.name} has the wrong size",
                                      expected=f"{list(b.shape)} ({n} elements)", got=f"{list(a.shape)}")
            try:
                gm[b.name] = np.ascontiguousarray(a, dtype=dtype).reshape(-1).copy()
            except (TypeError, ValueError) as e:
                raise SimulationError(f"the array for GM buffer {b.name} does not convert to {b.dtype}",
                                      got=f"{a.dtype}: {e}") from None
        else:
            gm[b.name] = np.zeros(n, dtype)
    return gm


class Memory:
    """GM buffers and on-chip spaces of one run of the reference interpreter."""

    def __init__(self, program: Program, machine: Machine, arrays: dict[str, np.ndarray],
                 checked: bool = False):
        self.capacity = machine.capacities()
        self.checked = checked
        fill = 0xFF if checked else 0
        self.onchip = {k: np.full(v, fill, dtype=np.uint8) for k, v in self.capacity.items()}
        self.written = {k: np.zeros(v, dtype=np.bool_) for k, v in self.capacity.items()} if checked else None
        self._views: dict[TileRef, np.ndarray] = {}
        self._fits: set[int] = set()                # TileRefs already checked against capacity
        self.gm = _gm_arrays(program, arrays)

    def tile(self, t: TileRef, buffer=None, dtype=None) -> np.ndarray:
        """The valid region of a tile, as a view of its space's bytes (or of another byte array)."""
        if buffer is None:
            v = self._views.get(t)
            if v is None:
                v = self._views[t] = self._view(t, self.onchip[t.space], t.dtype.np_dtype)
            return v
        return self._view(t, buffer, dtype)

    @staticmethod
    def _view(t: TileRef, buffer, dtype) -> np.ndarray:
        return np.ndarray(t.valid, dtype=dtype, buffer=buffer, offset=t.addr,
                          strides=tile_strides(t.shape, t.dtype))

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

    def check_window(self, r: GMRef, ins: Instr, task, k: int):
        size = self.gm[r.buf.name].size
        lo, hi = r.span()
        if lo < 0 or hi > size:
            raise SimulationError(f"task {task.id} instruction {k} ({ins.op}): GM access outside buffer "
                                  f"{r.buf.name}", loc=ins.loc, expected=f"[0, {size})", got=f"[{lo}, {hi})")

    def window(self, r: GMRef) -> np.ndarray:
        flat = self.gm[r.buf.name]
        item = flat.itemsize
        return np.ndarray(r.shape, dtype=flat.dtype, buffer=flat, offset=r.offset * item,
                          strides=tuple(s * item for s in r.strides))

    def get(self, o):
        if isinstance(o, TileRef):
            return self.tile(o)
        if isinstance(o, GMRef):
            return self.window(o)
        return o


def run_functional(program: Program, machine: Machine, arrays: dict[str, np.ndarray],
                   checked: bool = False) -> dict[str, np.ndarray]:
    """Execute the program; return the final contents of every non-workspace GM buffer."""
    plan = None if checked else plan_for(program, machine)
    if plan is None:    # checked, or a program the plan refuses: the interpreter says where it fails
        return _interpret(program, machine, arrays, checked)
    gm = _gm_arrays(program, arrays, plan.unobserved)
    plan.run(gm)
    return _outputs(program, gm)


def _interpret(program: Program, machine: Machine, arrays, checked: bool) -> dict[str, np.ndarray]:
    """The reference interpreter: one instruction at a time, checks first."""
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
                for o in (ins.dst, *ins.srcs):
                    if isinstance(o, GMRef):
                        mem.check_window(o, ins, t, k)
                handler, operands = decode(ins)
                if checked:                     # an index out of range: at the kernel's line
                    check_indices(ins, [mem.get(o) for o in operands])
                try:
                    handler(*[mem.get(o) for o in operands])
                except (ArithmeticError, LookupError, TypeError, ValueError) as e:
                    raise SimulationError(f"task {t.id} instruction {k} ({ins.op}) failed: {e}",
                                          loc=ins.loc) from e
    return _outputs(program, mem.gm)


def _outputs(program: Program, gm: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {b.name: gm[b.name].reshape(b.shape) for b in program.buffers if b.role != "workspace"}
