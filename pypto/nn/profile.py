"""profile_model: a model run on arrays, kernel by kernel, with the simulated time of each.

A model called on arrays runs as kernels (one per layer for a Transformer); each distinct
compiled kernel is simulated once more in timing mode (its cycles do not depend on the values:
layers of one compiled kernel take the same time), and the kernels are laid end to end on one
time axis, as the device runs them one after another."""
from __future__ import annotations

import collections
import time

from ..sim.result import SimResult
from ..target.isa import SYNC_OPS
from ..target.machine import get_machine
from .module import Module, _state

# the unit of each pipe (what the share of time per op kind groups by)
_UNITS = {"M": "cube", "V": "vector", "MTE1": "L1 -> L0 moves", "MTE2": "loads", "MTE3": "stores", "FIX": "stores",
          "S": "scalar"}


class ModelProfile:
    """What `profile_model` returns (data; a notebook shows it as tables).

    - `outputs`: the model's outputs (numpy), as `model(*inputs)` returns them;
    - `layers`: per kernel run, in order: name (the module's path), kernel, cycles, time_us,
      start / end cycle on the model's time axis, instructions, tasks, bound;
    - `kernels`: per distinct compiled kernel: kernel, calls, cycles per call, total cycles,
      instructions, compile_s (its first compile), timing_s (its timing simulation);
    - `ops`: per PTO instruction: op, unit(s), busy cycles (summed over cores, pipes and calls:
      pipes overlap, so these add up to more than the model's cycles), share of all busy
      cycles; `units`: the same per unit (cube, vector, loads, stores, L1 -> L0, sync);
    - `cycles`, `time_us`: the whole model; `wall_s`: seconds this machine took (run, timing).
    `timeline()` draws the kernels on one axis (`as_result()` is that run as a SimResult);
    `to_chrome_trace(path)` writes it for Perfetto."""

    def __init__(self, model: str, machine, outputs, layers, kernels, ops, units, wall_s, results):
        self.model, self.machine, self.outputs = model, machine, outputs
        self.layers, self.kernels, self.ops, self.units = layers, kernels, ops, units
        self.wall_s = wall_s
        self._results = results           # layer index -> SimResult of its kernel (timing)
        self.cycles = layers[-1]["end"] if layers else 0
        self.time_us = round(machine.cycles_to_us(self.cycles), 3)

    def trace(self) -> list:
        """Every instruction of every kernel run, shifted onto the model's time axis (the
        layer's name before each source location)."""
        out = []
        for i, layer in enumerate(self.layers):
            shift = layer["start"]
            for e in self._results[i].trace:
                out.append(e._replace(start=e.start + shift, end=e.end + shift,
                                      ready=e.ready + shift if e.ready >= 0 else e.ready,
                                      line=f"{layer['name']}: {e.line}" if e.line else layer["name"]))
        return out

    def as_result(self) -> SimResult:
        """The run as one SimResult (cycles, the merged trace): res.timeline() draws it."""
        return SimResult(self.model, self.machine, self.cycles, trace=self.trace())

    def timeline(self, aggregate: bool = True, **kw):
        """The kernels on one time axis, per core type and pipe, each layer's start marked
        (matplotlib figure; `aggregate=False`: per core)."""
        from ..viz.nn_report import plot_profile_timeline
        return plot_profile_timeline(self, aggregate=aggregate, **kw)

    def to_chrome_trace(self, path) -> str:
        from ..sim.trace import write_chrome_trace
        return write_chrome_trace(path, self.trace(), self.machine, self.model)

    def summary(self) -> str:
        lines = [f"{self.model} on {self.machine.name}: {self.cycles} cycles ({self.time_us} us), "
                 f"{len(self.layers)} kernel runs of {len(self.kernels)} compiled kernels "
                 f"(run {self.wall_s['run']:.2f} s, timing {self.wall_s['timing']:.2f} s on this machine)"]
        lines.append(f"  {'layer':<28} {'kernel':<24} {'cycles':>10} {'us':>10}  bound")
        for layer in self.layers:
            lines.append(f"  {layer['name']:<28} {layer['kernel']:<24} {layer['cycles']:>10} "
                         f"{layer['time_us']:>10.3f}  {layer['bound']}")
        lines.append("  busy cycles per unit: " + ", ".join(f"{u['unit']} {u['share']:.1f}%" for u in self.units))
        lines.append("  busiest ops: " + ", ".join(f"{o['op']} {o['share']:.1f}%" for o in self.ops[:6]))
        return "\n".join(lines)

    def __repr__(self):
        return f"ModelProfile({self.model}, machine={self.machine.name}, cycles={self.cycles}, " \
               f"kernels={len(self.layers)})"

    def _repr_pretty_(self, p, cycle):
        p.text(self.summary())

    def _repr_html_(self) -> str:
        from ..viz.nn_report import profile_html
        return profile_html(self)


def profile_model(model: Module, *inputs, machine="a2a3", **kwargs) -> ModelProfile:
    """Run `model(*inputs, **kwargs)` on arrays on `machine` (compiling for it) and time every
    kernel it runs: cycles and time per layer and per kernel, the share of time per op kind
    and unit, a timeline across layers (`ModelProfile`)."""
    m = get_machine(machine)
    st = _state()
    records: list = []
    old = st.machine
    st.machine = m.name
    st.recorders.append(records)
    t0 = time.perf_counter()
    try:
        outputs = model(*inputs, **kwargs)
    finally:
        st.recorders.remove(records)
        st.machine = old
    run_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    timed: dict = {}
    layers, results = [], []
    clock = 0
    for r in records:
        hit = timed.get(id(r.compiled))
        if hit is None:
            s0 = time.perf_counter()
            res = r.compiled.simulate(mode="timing")
            hit = timed[id(r.compiled)] = (res, time.perf_counter() - s0, r)
        res = hit[0]
        layers.append({"name": r.name, "kernel": r.compiled.name, "cycles": res.cycles, "time_us": res.time_us,
                       "start": clock, "end": clock + res.cycles, "instructions": res.instructions,
                       "tasks": res.stats.get("tasks"), "bound": res.stats.get("bound", "")})
        results.append(res)
        clock += res.cycles
    timing_s = time.perf_counter() - t1
    calls = collections.Counter(id(r.compiled) for r in records)
    kernels = []
    busy: collections.Counter = collections.Counter()
    per_unit: collections.Counter = collections.Counter()
    op_units: dict = {}
    for key, (res, sim_s, r) in timed.items():
        kernels.append({"kernel": r.compiled.name, "calls": calls[key], "cycles": res.cycles,
                        "total_cycles": res.cycles * calls[key], "instructions": res.instructions,
                        "compile_s": round(r.runner.compile_s or 0.0, 3), "timing_s": round(sim_s, 3)})
        for e in res.trace:
            c = (e.end - e.start) * calls[key]
            unit = "sync" if e.op in SYNC_OPS else _UNITS.get(e.pipe, e.pipe)
            busy[e.op] += c
            per_unit[unit] += c
            op_units.setdefault(e.op, collections.Counter())[unit] += c
    total = sum(busy.values()) or 1
    ops = [{"op": op, "unit": " / ".join(u for u, _ in op_units[op].most_common()), "busy_cycles": c,
            "share": 100.0 * c / total} for op, c in busy.most_common()]
    units = [{"unit": u, "busy_cycles": c, "share": 100.0 * c / total} for u, c in per_unit.most_common()]
    name = type(model).__name__
    return ModelProfile(name, m, outputs, layers, kernels, ops, units, {"run": run_s, "timing": timing_s}, results)
