"""Advice that proves itself: what bounds a compiled kernel, and the changes that make it faster,
each compiled and re-simulated before it is suggested.

    adv = pypto.advise(ck)          # or res.advise(), or `pypto advise FILE.py:kernel`
    adv.bound, adv.evidence         # the busiest resource, and the figures that show it
    adv.suggestions                 # the changes that measurably help, fastest first
    adv.suggestions[0].compile()    # the kernel with that change (its cycles are the claim)

The evidence: pipe busy %, the bytes per data path, the HBM bytes against those the kernel must
move (its tensors read or written once), the tasks against the cores (waves), the peak use of
each on-chip buffer (`pypto.compiler.buffer_pressure`) and the critical path.

The candidates: every keyword-only integer constant of the kernel scaled by 2^k (k in -3..3; the
tile constants, mostly), each compile option that could change the cycles turned off, then a
second step from the best constant change (the other constants scaled again from there).  They are timed by `pypto.tune` (timing mode, in this process or on `executor`); one is
suggested when it saves at least `min_gain_pct` of the cycles.  Changes of precision (float
inputs in fp16 or bf16, fp16 math without the fp32 steps autocast adds) are timed too but listed
apart, in `adv.precision`: they change the numbers the kernel computes, so they are not the same
kernel made faster.

Not proposed yet: tile shapes of a kernel that has no constants for them, layouts of the inputs
(a transposed operand) and the flags a pipe waits on (the timing engine does not count stalls).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..compiler.pipeline import OPTIONS
from ..errors import PyptoError
from . import split_config, tensors, tune

MIN_GAIN_PCT = 2.0
SCALES = (-3, -2, -1, 1, 2, 3)          # a constant v is tried at v * 2**k
PRECISIONS = ("fp16", "bf16")


@dataclass(frozen=True)
class Evidence:
    label: str           # "bound", "HBM", "waves", "buffers", ...
    text: str


@dataclass
class Suggestion:
    """One change, with the cycles it was measured at."""
    title: str                    # "TN=1024 (now 256)"
    kind: str                     # "constant", "constants", "option", "precision"
    consts: dict                  # the kernel's constants with the change
    options: dict                 # the compile options with the change
    dtypes: dict                  # parameter -> dtype name, for a change of precision ({} otherwise)
    cycles: int
    base_cycles: int
    bound: str
    why: str
    kernel: object = field(default=None, repr=False)
    specs: tuple = field(default=(), repr=False)
    machine: object = field(default=None, repr=False)

    @property
    def gain_pct(self) -> float:
        return 100.0 * (self.base_cycles - self.cycles) / self.base_cycles

    @property
    def speedup(self) -> float:
        return self.base_cycles / self.cycles

    def compile(self, *args):
        """The kernel compiled with this change (for these arguments; without them, specs of the
        advised kernel's shapes, in the suggested dtypes)."""
        args = args or tensors(self.specs)
        return self.kernel.compile(*args, machine=self.machine, options=self.options or None, **self.consts)

    def text(self) -> str:
        return (f"{self.title}: {self.cycles:,} cycles, {self.gain_pct:.1f}% fewer ({self.speedup:.2f}x); "
                f"{self.why}")


@dataclass
class Advice:
    kernel_name: str
    machine: str
    cycles: int
    bound: str
    evidence: list
    suggestions: list            # same numbers, faster: fastest first
    precision: list              # faster with other dtypes (other numbers)
    tried: int                   # candidates timed
    failed: int                  # of them, those that did not compile
    min_gain_pct: float = MIN_GAIN_PCT

    @property
    def best(self) -> Suggestion | None:
        return self.suggestions[0] if self.suggestions else None

    def text(self) -> str:
        lines = [f"advice for {self.kernel_name} on {self.machine}: {self.cycles:,} cycles, bound: {self.bound}"]
        lines += [f"  {e.label:<14} {e.text}" for e in self.evidence]
        if self.suggestions:
            lines.append(f"suggestions (each compiled and re-simulated; {self.tried} changes tried):")
            lines += [f"  {i + 1}. {s.text()}" for i, s in enumerate(self.suggestions)]
        else:
            lines.append(f"no suggestion: none of the {self.tried} changes tried saves {self.min_gain_pct:g}% of the "
                         f"cycles ({self.failed} did not compile)")
        if self.precision:
            lines.append("with other numerics (the outputs change):")
            lines += [f"  - {s.text()}" for s in self.precision]
        return "\n".join(lines)

    def __repr__(self):
        return self.text()

    def _repr_pretty_(self, p, cycle):
        p.text(self.text())

    def _repr_html_(self) -> str:
        from ..viz.tune import advice_html
        return advice_html(self)


# --- evidence ------------------------------------------------------------------------------

def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"


def evidence(ck, res) -> list:
    s, m = res.stats, ck.machine
    out = []
    busy = sorted(s["pipe_busy_pct"].items(), key=lambda kv: -kv[1])
    out.append(Evidence("pipes busy", ", ".join(f"{k} {v:.1f}%" for k, v in busy[:4]) or "none"))
    must = sum(p.dtype.itemsize * _prod(p.shape) for p in ck.params)
    hbm = s["hbm_bytes"]
    ratio = f", {hbm / must:.1f}x the {_mib(must)} its tensors hold (each read or written once)" if must else ""
    out.append(Evidence("HBM", f"{_mib(hbm)} at {s['hbm_util_pct']:.1f}% of {m.hbm_gbps:.0f} GB/s{ratio}"))
    paths = sorted(s["bytes_by_path"].items(), key=lambda kv: -kv[1])
    out.append(Evidence("bytes per path", ", ".join(f"{k} {_mib(v)}" for k, v in paths[:4]) or "none"))
    for ct, n_cores in (("AIC", m.n_aic), ("AIV", m.n_aiv)):
        n = sum(1 for t in ck.program.tasks if t.core_type == ct)
        if n:
            waves = -(-n // n_cores)
            last = n - (waves - 1) * n_cores
            text = (f"{n} {ct} tasks on {n_cores} cores: " +
                    (f"{n_cores - n} cores idle" if n < n_cores else
                     f"{waves} wave{'s' if waves > 1 else ''}" +
                     (f", the last {100 * last / n_cores:.0f}% full" if last < n_cores else "")))
            out.append(Evidence("waves", text))
    try:
        from ..compiler import buffer_pressure
        peaks: dict = {}
        for row in buffer_pressure(ck.exec_graph, m):
            if row.share > peaks.get(row.space, (0, None))[0]:
                peaks[row.space] = (row.share, row)
        if peaks:
            out.append(Evidence("buffers", ", ".join(f"{sp} {100 * sh:.0f}% full at the peak"
                                                     for sp, (sh, _) in peaks.items())))
    except PyptoError:
        pass
    path = s["critical_path"]
    if path:
        out.append(Evidence("critical path", f"{len(path)} task{'s' if len(path) != 1 else ''}, "
                                             f"{path[-1]['end'] - path[0]['start']:,} of {res.cycles:,} cycles"))
    return out


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# --- candidates ----------------------------------------------------------------------------

def _why(base: dict, row: dict) -> str:
    """What the change did, in the figures that moved (10% or more) and the bound."""
    parts = []
    if row["bound"] != base["bound"]:
        parts.append(f"bound {base['bound']} -> {row['bound']}")
    for key, label, fmt in (("hbm_bytes", "HBM", _mib), ("tasks", "tasks", str),
                            ("instructions", "instructions", lambda v: f"{v:,}")):
        a, b = base[key], row[key]
        if a and abs(b - a) >= 0.1 * a:
            parts.append(f"{label} {fmt(a)} -> {fmt(b)}")
    top = max(base["pipe_busy_pct"], key=base["pipe_busy_pct"].get, default=None)
    if top and top in row["pipe_busy_pct"]:
        parts.append(f"{top} busy {base['pipe_busy_pct'][top]:.0f}% -> {row['pipe_busy_pct'][top]:.0f}%")
    return "; ".join(parts) or "the same work, scheduled better"


# options that change nothing a kernel without matmuls runs, and one that changes no cycle
CUBE_OPTIONS = ("layout", "l1_reuse", "pairing", "cross_core_sync")
TEXT_ONLY_OPTIONS = ("loops",)          # the program text folds; every instruction runs as before
PRECISION_OPTIONS = ("autocast",)       # off: fp16 math in fp16, other numbers


def relevant_options(ck) -> list:
    """The compile options whose change could change this kernel's cycles."""
    ops = {n.op for n in ck.traced.nodes}
    low = any(p.dtype.name in ("fp16", "bf16") for p in ck.params) or "cast" in ops
    return [o for o in OPTIONS if o not in TEXT_ONLY_OPTIONS and (o not in CUBE_OPTIONS or "matmul" in ops)
            and (o != "autocast" or low)]


def _scaled(v: int) -> list:
    return sorted({v * 2**k if k >= 0 else v // 2**-k for k in SCALES} - {0, v})


def advise(ck, *args, res=None, executor=None, min_gain_pct: float = MIN_GAIN_PCT,
           precision: bool = True) -> Advice:
    """Advice for compiled kernel `ck` (see the module docstring).  `res`: its timing result,
    when one is at hand (else it is simulated in timing mode); `args` are not needed (the
    shapes are the compiled ones).  `executor` times the candidates elsewhere (`pypto.tune`)."""
    kernel = ck.kernel
    if kernel is None:
        raise PyptoError("advice recompiles the kernel: this one has no @pypto.jit kernel behind it",
                         expected="a kernel compiled by kernel.compile(...)", got="a CompiledKernel alone")
    if ck.dynamic is not None:
        raise PyptoError(f"{ck.name} has a pypto.DYNAMIC dim: advice is for one size", expected="a static kernel",
                         got=ck.dynamic.describe(), hint="compile it for the size to advise on: pypto.Tensor([rows, ...])")
    if res is None or res.cycles is None:
        res = ck.simulate(mode="timing", trace=False)
    base = {"cycles": res.cycles, "bound": res.stats["bound"], "hbm_bytes": res.stats["hbm_bytes"],
            "tasks": res.stats["tasks"], "instructions": res.stats["instructions"],
            "pipe_busy_pct": res.stats["pipe_busy_pct"]}
    specs = tuple((tuple(p.shape), p.dtype.name) for p in ck.params)
    consts = dict(ck.consts)
    options = dict(ck.options)
    ints = {k: v for k, v in consts.items() if k in kernel.int_constants and isinstance(v, int)}
    configs, titles = [], []
    for k, v in ints.items():
        for w in _scaled(v):
            configs.append({k: w})
            titles.append(("constant", f"{k}={w} (now {v})"))
    for name in relevant_options(ck):
        if options.get(name, True) and (precision or name not in PRECISION_OPTIONS):
            configs.append({name: False})
            titles.append(("precision" if name in PRECISION_OPTIONS else "option", f"options={{{name!r}: False}}"))
    machine = ck.machine
    full = [{**consts, **c} for c in configs]
    swept = tune(kernel, full, *tensors(specs), machine=machine, executor=executor, options=options) \
        if full else None
    rows = swept.rows if swept else []
    suggestions, failed = [], 0
    threshold = res.cycles * (1 - min_gain_pct / 100)

    def suggest(kind, title, row, cfg, dtypes=None, sp=specs):
        c, o, _ = split_config(kernel, cfg, machine)
        o = {**options, **o}
        return Suggestion(title, kind, c, o, dtypes or {}, row["cycles"], res.cycles, row["bound"],
                          _why(base, row), kernel=kernel, specs=sp, machine=machine)

    seen = set()                # programs that time the same (a tile clamped to the tensor: the same tiles)
    other = []

    def keep(kind, title, row, cfg, limit):
        same = (row["cycles"], row["instructions"], row["tasks"], row["hbm_bytes"])
        if row["cycles"] <= limit and same not in seen:
            seen.add(same)
            (other if kind == "precision" else suggestions).append(suggest(kind, title, row, cfg))

    for (kind, title), cfg, row in zip(titles, full, rows):
        if "cycles" not in row:
            failed += 1
        else:
            keep(kind, title, row, cfg, threshold)
    tried = len(full)
    # a second step from the best constant change: the other constants scaled again from there
    first = min((s for s in suggestions if s.kind == "constant"), key=lambda s: s.cycles, default=None)
    if first is not None and len(ints) > 1:
        (k1,) = [k for k in ints if first.consts[k] != consts[k]]
        step = [{**first.consts, k: w} for k, v in ints.items() if k != k1 for w in _scaled(v)]
        again = tune(kernel, step, *tensors(specs), machine=machine, executor=executor, options=options).rows
        tried += len(step)
        failed += sum("cycles" not in r for r in again)
        ok = [(r, cfg) for r, cfg in zip(again, step) if "cycles" in r]
        if ok:
            row, cfg = min(ok, key=lambda rc: rc[0]["cycles"])
            (k2,) = [k for k in ints if k != k1 and cfg[k] != consts[k]]
            keep("constants", f"{k1}={cfg[k1]}, {k2}={cfg[k2]} (now {k1}={consts[k1]}, {k2}={consts[k2]})",
                 row, cfg, first.cycles * (1 - min_gain_pct / 100))
    suggestions.sort(key=lambda s: (s.cycles, s.title))
    if precision:
        floats = [i for i, (_, dt) in enumerate(specs) if dt == "fp32"]
        for dt in PRECISIONS if floats else ():
            sp = tuple((shape, dt if i in floats else d) for i, (shape, d) in enumerate(specs))
            row = tune(kernel, [consts], *tensors(sp), machine=machine, executor=executor, options=options).rows[0]
            tried += 1
            if "cycles" in row and row["cycles"] <= threshold:
                names = {ck.params[i].name: dt for i in floats}
                other.append(suggest("precision", f"{', '.join(names)} in {dt} (now fp32)", row, consts,
                                     dtypes=names, sp=sp))
            failed += "cycles" not in row
        other.sort(key=lambda s: s.cycles)
    return Advice(ck.name, machine.name, res.cycles, base["bound"], evidence(ck, res), suggestions, other,
                  tried, failed, min_gain_pct)
