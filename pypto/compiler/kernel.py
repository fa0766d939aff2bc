"""A compiled kernel: the five levels, the pass log, and simulation against a numpy reference."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import KernelSignatureError
from ..ir.block import BlockGraph
from ..ir.exec import ExecGraph
from ..ir.program import Program
from ..ir.tensor import TensorGraph
from ..ir.tensor_eval import accumulates, evaluate, tolerance
from ..ir.tile import TileGraph
from ..sim.machine import Machine
from ..sim.result import SimResult
from ..sim.run import simulate as run_sim
from .pipeline import PassLog


@dataclass
class CompiledKernel:
    name: str
    machine: Machine
    consts: dict
    traced: TensorGraph             # as traced, before any pass
    tensor_graph: TensorGraph
    tile_graph: TileGraph
    block_graph: BlockGraph
    exec_graph: ExecGraph
    program: Program
    pass_log: PassLog
    snapshots: list | None = None
    kernel: object = field(default=None, repr=False)   # the JitKernel it came from

    @property
    def levels(self) -> dict:
        return {"tensor": self.tensor_graph, "tile": self.tile_graph, "block": self.block_graph,
                "exec": self.exec_graph, "pto": self.program}

    @property
    def params(self):
        return self.traced.params

    def bind(self, args) -> dict[str, np.ndarray]:
        """Map positional arrays to parameter names, checking shapes and dtypes."""
        params = self.traced.params
        if len(args) != len(params):
            raise KernelSignatureError(
                f"{self.name} takes {len(params)} tensor arguments",
                expected=", ".join(p.name for p in params), got=f"{len(args)} arguments")
        out = {}
        for p, a in zip(params, args):
            a = as_array(a)
            if tuple(a.shape) != p.shape or a.dtype != p.dtype.np_dtype:
                raise KernelSignatureError(
                    f"argument '{p.name}' differs from the one {self.name} was compiled for",
                    expected=f"{p.dtype}{list(p.shape)}", got=f"{a.dtype}{list(a.shape)}")
            out[p.name] = a
        return out

    def reference(self, *args) -> dict[str, np.ndarray]:
        """The kernel's outputs computed by the numpy reference interpreter of the Tensor level."""
        with np.errstate(all="ignore"):
            return evaluate(self.traced, self.bind(args))

    def simulate(self, *args, machine=None, mode: str = "full", check: bool = True,
                 checked: bool = False, trace: bool = True) -> SimResult:
        """Simulate on a machine (default: the one compiled for).

        `check` compares the outputs with the numpy reference of the kernel; `checked` runs the
        simulator's checked mode (races, uninitialised reads, event reuse raise SimulationError).
        """
        if machine is not None and machine != self.machine.name and machine != self.machine:
            return self.recompile(args, machine).simulate(*args, mode=mode, check=check, checked=checked,
                                                          trace=trace)
        arrays = self.bind(args) if mode != "timing" else {}
        res = run_sim(self.program, arrays, machine=self.machine, mode=mode, check=checked, trace=trace)
        if check and mode != "timing":
            res.check = compare(res.outputs, self.reference(*args), self.traced)
        return res

    def recompile(self, args, machine) -> "CompiledKernel":
        if self.kernel is None:
            raise KernelSignatureError("this kernel was compiled for one machine only",
                                       expected=self.machine.name, got=str(machine))
        return self.kernel.compile(*args, machine=machine, **self.consts)

    def __repr__(self):
        consts = ", ".join(f"{k}={v}" for k, v in self.consts.items())
        return (f"CompiledKernel({self.name}({consts}) on {self.machine.name}: "
                f"{len(self.tensor_graph)} tensor nodes, {len(self.tile_graph)} tile ops, "
                f"{len(self.block_graph)} tasks, {len(self.program)} instructions)")


def as_array(a) -> np.ndarray:
    if hasattr(a, "detach") and hasattr(a, "numpy"):   # a torch tensor
        return a.detach().numpy()
    return np.asarray(a)


def compare(outputs, expected, traced: TensorGraph) -> dict:
    """Outputs vs the reference: dtype-relative tolerance; for sums of many terms (where the
    summation order changes the rounding and cancellation can leave a small result) the
    absolute tolerance scales with the output's magnitude."""
    result = {}
    for name in traced.output_names:
        got, want = outputs[name], expected[name]
        p = traced.param(name)
        rtol, atol = tolerance(p.dtype)
        if p.dtype.name in ("fp16", "bf16"):      # compare low precision in fp32, fp32 as is
            got, want = got.astype(np.float32), want.astype(np.float32)
        elif not p.dtype.is_float:
            got, want = got.astype(np.int64), want.astype(np.int64)
        with np.errstate(all="ignore"):
            err = np.abs(got - want)
            finite = np.isfinite(want)
            scale = float(np.abs(want[finite]).max()) if finite.any() else 0.0
            if accumulates(traced):
                atol = max(atol, rtol * scale)
            bad = ~((err <= atol + rtol * np.abs(want)) | (np.isnan(got) & np.isnan(want))
                    | (got == want))
            errs = err[np.isfinite(err)]
            max_abs = float(errs.max()) if errs.size else 0.0
        result[name] = {"ok": not bool(bad.any()), "max_abs_err": max_abs, "rtol": rtol, "atol": atol}
    return result
