"""What a simulation returns: cycles, time, stats, outputs, the trace and the check vs numpy."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ir.exec import AIC_PIPES, AIV_PIPES
from ..target.machine import Machine
from .trace import write_chrome_trace


@dataclass
class SimResult:
    kernel: str
    machine: Machine
    cycles: int | None
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    trace: list = field(default_factory=list)
    check: dict | None = None
    races: list[str] | None = None      # found by the race check of `simulate(races=True)`
    task_times: dict = field(default_factory=dict, repr=False)   # task -> (core, start, end)
    program: object = field(default=None, repr=False)
    # a call of a dynamic kernel: what its pypto.DYNAMIC dim was ("N = 1000 rows")
    size: str | None = None
    # the CompiledKernel that ran (set by ck.simulate; None for a program simulated alone)
    compiled: object = field(default=None, repr=False)

    @property
    def time_us(self) -> float | None:
        return None if self.cycles is None else round(self.machine.cycles_to_us(self.cycles), 3)

    @property
    def instructions(self) -> int:
        return self.stats.get("instructions", 0)

    @property
    def ok(self) -> bool | None:
        """Outputs within their error bound of the numpy reference and no race found; None when
        nothing was checked."""
        if self.check is None and self.races is None:
            return None
        return all(c["ok"] for c in (self.check or {}).values()) and not self.races

    def timeline(self, **kw):
        """Per-core, per-pipe swimlane of the trace (matplotlib figure)."""
        from ..viz.timeline import plot_timeline
        return plot_timeline(self, **kw)

    def roofline(self, **kw):
        """The kernel on the machine's roofline (matplotlib figure)."""
        from ..viz.roofline import plot_roofline
        return plot_roofline(self, **kw)

    def advise(self, **kw):
        """What bounds this kernel and the changes that make it faster, each re-simulated
        (`pypto.tuning.advisor.advise`); only for a result of `ck.simulate`."""
        if self.compiled is None:
            from ..errors import PyptoError
            raise PyptoError("advice recompiles the kernel: this result has none (a program simulated alone)",
                             expected="a result of ck.simulate(...)", got="pypto.sim.simulate(program, ...)")
        from ..tuning.advisor import advise
        return advise(self.compiled, res=self, **kw)

    def to_chrome_trace(self, path) -> str:
        """Write Chrome Trace Event JSON (Perfetto): a process per core, a thread per pipe."""
        return write_chrome_trace(path, self.trace, self.machine, self.kernel, self.task_times, self.program)

    # --- text ---------------------------------------------------------------------------
    def stats_rows(self) -> list[tuple[str, str]]:
        """The stats as (label, text) rows: the one readable form used by summary(), the
        explorer's Stats tab and the HTML report."""
        s = self.stats
        rows: list[tuple[str, str]] = []
        if self.cycles is not None:
            rows.append(("cycles", f"{self.cycles}  ({self.time_us} us at {self.machine.clock_ghz} GHz)"))
            rows.append(("bound", s["bound"]))
            rows.append(("instructions", f"{s['instructions']} in {s['tasks']} tasks on "
                                         f"{s['cores_used']['AIC']} AIC + {s['cores_used']['AIV']} AIV cores"))
            rows.append(("pipe busy", "  ".join(f"{p} {v:.1f}%" for p, v in s["pipe_busy_pct"].items())))
            rows.append(("bytes moved", "  ".join(f"{k} {v / 1024:.0f} KiB"
                                                  for k, v in sorted(s["bytes_by_path"].items()))))
            rows.append(("L2", f"{s['l2_hits']} hits ({s['l2_hit_bytes'] / 2**20:.2f} MiB), "
                               f"{s['l2_misses']} misses ({s['l2_miss_bytes'] / 2**20:.2f} MiB)"))
            rows.append(("HBM", f"{s['hbm_bytes'] / 2**20:.2f} MiB at {s['hbm_gbps']:.1f} GB/s "
                                f"({s['hbm_util_pct']:.1f}% of {self.machine.hbm_gbps:.0f} GB/s)"))
            path = s["critical_path"]
            groups = " -> ".join(f"g{p['group']}" for p in path)
            rows.append(("critical path", f"{len(path)} tasks ({groups})" if len(path) <= 8 else
                                          f"{len(path)} tasks, groups {sorted({p['group'] for p in path})}"))
            if s.get("flops"):
                rows.append(("compute", f"{s['tflops']:.2f} TFLOP/s ({s['cube_util_pct']:.1f}% of cube peak), "
                                        f"{s['arithmetic_intensity']:g} FLOP per HBM byte"))
        for name, c in (self.check or {}).items():
            rows.append((f"check {name}", check_text(name, c)))
        if self.races:
            more = f" (and {len(self.races) - 1} more)" if len(self.races) > 1 else ""
            rows.append(("races", f"{len(self.races)} found: {self.races[0]}{more}"))
        return rows

    def summary(self) -> str:
        lines = [f"kernel {self.kernel} on {self.machine.name}" + (f", {self.size}" if self.size else "")]
        lines += [f"  {label:<13} {text}" for label, text in self.stats_rows()]
        return "\n".join(lines)

    def __repr__(self):
        return f"SimResult({self.kernel}, machine={self.machine.name}, cycles={self.cycles})"

    def _repr_pretty_(self, p, cycle):
        p.text(self.summary())


def check_text(name: str, c: dict) -> str:
    """One output's check vs numpy, in words: the largest error and how much of the error bound
    of its steps' rounding it uses (pypto.ir.numerics); for a mismatch, the worst element."""
    if c["ok"]:
        return f"OK vs numpy (max abs err {c['max_abs_err']:.3g}, {100 * c['max_err_ratio']:.3g}% of its bound)"
    where = "" if c.get("worst") is None else f" at {name}[{', '.join(map(str, c['worst']))}]"
    return f"MISMATCH vs numpy (max abs err {c['max_abs_err']:.3g}, {c['max_err_ratio']:.3g}x its bound{where})"


def build_stats(timing: dict, program, machine: Machine) -> dict:
    cycles = max(timing["cycles"], 1)
    cores = {"AIC": set(), "AIV": set()}
    for core, _, _ in timing["tasks"].values():
        cores[core[:3]].add(core)
    busy_pipe: dict[str, int] = {}
    for (core, pipe), b in timing["busy"].items():
        busy_pipe[f"{core[:3]}.{pipe}"] = busy_pipe.get(f"{core[:3]}.{pipe}", 0) + b
    pct = {}
    for ct, pipes in (("AIC", AIC_PIPES), ("AIV", AIV_PIPES)):
        n = len(cores[ct])
        for p in pipes:
            k = f"{ct}.{p}"
            if k in busy_pipe and n:
                pct[k] = round(100.0 * busy_pipe[k] / (cycles * n), 1)
    flops = timing["flops"]         # counted by the engine's decoding
    seconds = cycles / (machine.clock_ghz * 1e9)
    hbm_gbps = timing["hbm_bytes"] / seconds / 1e9
    hbm_util = 100.0 * hbm_gbps / machine.hbm_gbps
    core_busy: dict[str, int] = {}
    for (core, _), b in timing["busy"].items():
        core_busy[core] = max(core_busy.get(core, 0), b)
    l2 = timing["l2"]
    return {
        "cycles": timing["cycles"], "time_us": round(machine.cycles_to_us(timing["cycles"]), 3),
        "instructions": timing["instructions"], "tasks": len(program.tasks),
        "cores_used": {k: len(v) for k, v in cores.items()},
        "pipe_busy_pct": pct,
        # a core is as busy as its busiest pipe
        "core_busy_pct": {c: round(100.0 * b / cycles, 1) for c, b in sorted(core_busy.items(), key=_core_order)},
        "bytes_by_path": dict(sorted(timing["bytes_by_path"].items())),
        "l2_hits": l2["hits"], "l2_misses": l2["misses"], "l2_hit_bytes": l2["hit_bytes"],
        "l2_miss_bytes": l2["miss_bytes"],
        "hbm_bytes": timing["hbm_bytes"], "hbm_gbps": round(hbm_gbps, 1),
        "hbm_util_pct": round(hbm_util, 1),
        "flops": flops, "tflops": round(flops / seconds / 1e12, 3),
        "cube_util_pct": round(100.0 * flops / seconds / machine.peak_flops, 1),
        "arithmetic_intensity": round(flops / timing["hbm_bytes"], 3) if timing["hbm_bytes"] else None,
        "bound": bound(pct, hbm_util),
        "critical_path": critical_path(program, timing["tasks"], machine),
    }


def _core_order(item):
    core = item[0]
    return (core[:3] != "AIC", int(core[3:]))


def critical_path(program, task_times: dict, machine: Machine) -> list[dict]:
    """The chain of tasks that decided the end time, first to last.

    Walking back from the task that finished last: a task waited either for its latest-finishing
    dependency or, when that finished earlier, for its core (the previous task on that core).
    """
    if not task_times:
        return []
    by_core: dict[str, list[int]] = {}
    for tid, (core, start, _) in sorted(task_times.items(), key=lambda kv: kv[1][1]):
        by_core.setdefault(core, []).append(tid)
    tid = max(task_times, key=lambda t: (task_times[t][2], -t))
    chain = []
    while tid is not None:
        core, start, end = task_times[tid]
        task = program.tasks[tid]
        chain.append({"task": tid, "group": task.group, "core": core, "start": start, "end": end})
        ready = start - machine.dispatch_cycles
        dep = max(task.deps, key=lambda d: task_times[d][2], default=None)
        if dep is not None and task_times[dep][2] >= ready:
            tid = dep
            continue
        order = by_core[core]
        i = order.index(tid)
        prev = order[i - 1] if i > 0 else None
        tid = prev if prev is not None and task_times[prev][2] >= ready else None
    return chain[::-1]


BOUND_THRESHOLD_PCT = 50.0
RESOURCE_NAMES = {"AIC.M": "cube compute", "AIV.V": "vector compute"}


def bound(pipe_busy_pct: dict, hbm_util_pct: float) -> str:
    """The resource that limits the kernel: the busiest of the HBM and the pipes (per used core),
    or 'dependencies' when none is busy half of the time (latency, sync and launch gaps)."""
    cands = {"HBM bandwidth": hbm_util_pct}
    for k, v in pipe_busy_pct.items():
        cands[RESOURCE_NAMES.get(k, f"{k} pipe")] = v
    name, util = max(cands.items(), key=lambda kv: (kv[1], kv[0]))
    return name if util >= BOUND_THRESHOLD_PCT else "dependencies"
