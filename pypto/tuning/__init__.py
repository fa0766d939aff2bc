"""Sweeps of a kernel's configurations and advice that proves itself (above the frontend and the
simulator, below viz).

`tune(kernel, space, *args)` compiles and times (timing mode, no data) every configuration of a
space: the kernel's keyword-only constants, the compile options (`pypto.compiler.OPTIONS`) and
the machine.  The work runs in this process or on any executor (`pypto.sweep`), a Dask cluster
among them; each result is cached by (kernel source, argument shapes, configuration, machine),
so a second sweep over an overlapping space times only what is new.

    res = pypto.tune(matmul, {"TM": [64, 128], "TN": [64, 128, 256]}, a, b, c, executor=client)
    res.best["cycles"], res.best_config      # {"TM": 128, "TN": 256}
    res.plot(); res.compile(a, b, c)

`advise(ck)` (advisor.py) names what bounds a compiled kernel and re-simulates the changes that
could help, keeping only those that do.
"""
from __future__ import annotations

import difflib
from concurrent.futures import ThreadPoolExecutor
import hashlib
import itertools
import time
from dataclasses import dataclass, field

from .. import sweep
from ..dtypes import BY_NAME
from ..errors import PyptoError, UnsupportedError

MACHINE = "machine"
_RESULTS: dict = {}          # cache key -> result row (without the config)


def space_configs(kernel, space) -> tuple[tuple[str, ...], list[dict]]:
    """(the swept names, the configurations): a dict of name -> values is its product (a single
    value counts as one), a list of dicts is taken as it is.  Names are the kernel's keyword-only
    constants, compile options and "machine"; anything else is an error naming the choices."""
    from ..compiler.pipeline import OPTIONS
    if isinstance(space, dict):
        names = tuple(space)
        values = [v if isinstance(v, (list, tuple, range)) else [v] for v in space.values()]
        configs = [dict(zip(names, combo)) for combo in itertools.product(*values)]
    elif isinstance(space, (list, tuple)) and all(isinstance(c, dict) for c in space):
        configs = [dict(c) for c in space]
        names = tuple(dict.fromkeys(k for c in configs for k in c))
    else:
        raise PyptoError("a tuning space is a dict of name -> values, or a list of configurations (dicts)",
                         expected="{'TM': [32, 64], 'TN': [128, 256]}", got=type(space).__name__)
    known = list(kernel.const_params) + list(OPTIONS) + [MACHINE]
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
            raise PyptoError(f"{name!r} is not something {kernel.name} can be tuned by",
                             expected="a keyword-only constant of the kernel (" +
                                      (", ".join(kernel.const_params) or "it has none") +
                                      "), a compile option or 'machine'", got=repr(name),
                             hint=f"did you mean {close[0]!r}?" if close else
                             f"add it to the kernel: def {kernel.name}(..., *, {name}: int = ...)")
    if not configs:
        raise PyptoError("the tuning space is empty", expected="at least one configuration", got="none")
    return names, configs


def split_config(kernel, config: dict, machine) -> tuple[dict, dict, object]:
    """(constants, options, machine) of one configuration."""
    consts = {k: v for k, v in config.items() if k in kernel.const_params}
    options = {k: v for k, v in config.items() if k not in consts and k != MACHINE}
    return consts, options, config.get(MACHINE, machine)


def arg_specs(kernel, args) -> tuple:
    """((shape, dtype name), ...) of the arguments: what a worker needs to compile the kernel."""
    from ..frontend.dynamic import DYNAMIC
    specs = kernel._specs(args)
    for s in specs:
        if s.shape and s.shape[0] is DYNAMIC:
            raise UnsupportedError(f"tune compiles {kernel.name} for one size; '{s.name}' has a pypto.DYNAMIC dim",
                                   expected="arguments of one size", got=f"{s.name}: [DYNAMIC, ...]",
                                   hint="give pypto.Tensor([rows, ...], dtype) specs of the size to tune for")
    return tuple((tuple(s.shape), s.dtype.name) for s in specs)


def tensors(specs) -> list:
    """pypto.Tensor specs of ((shape, dtype name), ...) (what `arg_specs` gives)."""
    from ..frontend.tracer import Tensor
    return [Tensor(list(shape), BY_NAME[dt]) for shape, dt in specs]


def _machine_key(machine):
    return machine if isinstance(machine, str) else (getattr(machine, "name", None), hash(machine))


# --- a job: what one worker needs to time one configuration ------------------------------------

@dataclass(frozen=True)
class Job:
    kernel: object               # the JitKernel (in process and in threads), or its pickled function
    specs: tuple
    consts: dict
    options: dict
    machine: object


_REBUILT: dict = {}              # pickled kernel digest -> JitKernel (per worker process)


def _kernel_of(payload):
    if not isinstance(payload, bytes):
        return payload
    digest = hashlib.sha1(payload).hexdigest()
    kernel = _REBUILT.get(digest)
    if kernel is None:
        import cloudpickle
        from ..frontend.jit import JitKernel
        fn, pipeline, *level = cloudpickle.loads(payload)
        kernel = _REBUILT[digest] = JitKernel(fn, pipeline=pipeline, level=level[0] if level else "tensor")
    return kernel


def evaluate(job: Job) -> dict:
    """Compile and time one configuration: a row of cycles, time, bound, instructions, tasks and
    HBM use, or {"error": ...} when it does not compile (a tile that does not fit).  Leaves the
    kernel's compile cache as it found it: a sweep of large kernels does not keep every program."""
    kernel = _kernel_of(job.kernel)
    specs = tensors(job.specs)
    before = set(kernel._cache)
    try:
        ck = kernel.compile(*specs, machine=job.machine, options=job.options or None, **job.consts)
        res = ck.simulate(mode="timing", trace=False)
        s = res.stats
        return {"cycles": res.cycles, "time_us": res.time_us, "bound": s["bound"],
                "instructions": s["instructions"], "tasks": s["tasks"],
                "hbm_bytes": s["hbm_bytes"], "hbm_util_pct": s["hbm_util_pct"],
                "pipe_busy_pct": dict(s["pipe_busy_pct"])}
    except PyptoError as e:
        return {"error": f"{type(e).__name__}: {e.message}"}
    finally:
        for key in set(kernel._cache) - before:
            kernel._cache.pop(key, None)


def _payload(kernel, executor):
    """The kernel as a job carries it: itself where the job runs in this process (no executor, a
    thread pool), else its function pickled by value (cloudpickle: a notebook's function too)."""
    if executor is None or isinstance(executor, ThreadPoolExecutor):
        return kernel
    try:
        import cloudpickle
    except ImportError:
        raise PyptoError("tuning on another process needs cloudpickle (it comes with dask.distributed)",
                         expected="pip install 'distributed'", got="no cloudpickle",
                         hint="or tune in this process: executor=None") from None
    return cloudpickle.dumps((kernel.fn, kernel.pipeline, getattr(kernel, "level", "tensor")))


# --- the sweep -----------------------------------------------------------------------------

@dataclass
class TuneResult:
    """Every configuration with its cycles (or the error that kept it from compiling), best first
    in `ranked()`; `best` is the fastest row."""
    kernel_name: str
    names: tuple
    rows: list                   # {"config": {...}, "cycles": ..., ...} or {"config": ..., "error": ...}
    machine: str
    executor: str
    seconds: float
    cached: int                  # rows that came from the cache (not timed again)
    kernel: object = field(default=None, repr=False)
    specs: tuple = field(default=(), repr=False)

    @property
    def ok_rows(self) -> list:
        return [r for r in self.rows if "cycles" in r]

    def ranked(self) -> list:
        """The rows that compiled, fastest first (ties: in sweep order), then the failures."""
        ok = sorted(self.ok_rows, key=lambda r: r["cycles"])
        return ok + [r for r in self.rows if "cycles" not in r]

    @property
    def best(self) -> dict | None:
        ok = self.ok_rows
        return min(ok, key=lambda r: r["cycles"]) if ok else None

    @property
    def best_config(self) -> dict | None:
        return None if self.best is None else dict(self.best["config"])

    def compile(self, *args, machine=None):
        """The kernel compiled with the best configuration (for these arguments, or the swept ones)."""
        if self.best is None:
            raise PyptoError(f"no configuration of {self.kernel_name} compiled", expected="one that compiles",
                             got=self.rows[0].get("error") if self.rows else "no rows")
        consts, options, m = split_config(self.kernel, self.best_config, machine or self.machine)
        args = args or tensors(self.specs)
        return self.kernel.compile(*args, machine=m, options=options or None, **consts)

    def text(self, limit: int | None = None) -> str:
        """A table, fastest first: the configuration, cycles, time, bound, instructions, tasks."""
        rows = self.ranked()[:limit] if limit else self.ranked()
        head = [*self.names, "cycles", "us", "bound", "instructions", "tasks"]
        body, tails = [], []
        for r in rows:
            cfg = [str(getattr(r["config"].get(n, ""), "name", r["config"].get(n, ""))) for n in self.names]
            if "cycles" in r:
                body.append(cfg + [f"{r['cycles']}", f"{r['time_us']:.2f}", r["bound"], str(r["instructions"]),
                                   str(r["tasks"])])
                tails.append("")
            else:
                body.append(cfg + ["-"] * 5)
                tails.append("  " + r["error"])
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        lines = [f"{self.kernel_name}: {len(self.rows)} configurations on {self.machine} ({self.executor}, "
                 f"{self.cached} from the cache)"]
        lines += [("  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip() + tail)
                  for line, tail in zip([head] + body, [""] + tails)]
        if limit and len(self.rows) > limit:
            lines.append(f"... {len(self.rows) - limit} more")
        return "\n".join(lines)

    def __repr__(self):
        return self.text(limit=20)

    def _repr_pretty_(self, p, cycle):
        p.text(self.text(limit=20))

    def _repr_html_(self) -> str:
        from ..viz.tune import tune_html
        return tune_html(self)

    def plot(self, **kw):
        """Cycles against the swept values (matplotlib figure)."""
        from ..viz.tune import plot_tune
        return plot_tune(self, **kw)


def _cfg_text(config: dict) -> str:
    return " ".join(f"{k}={getattr(v, 'name', v)}" for k, v in config.items())


def tune(kernel, space, *args, machine="a2a3", executor=None, options=None, cache: bool = True) -> TuneResult:
    """Time every configuration of `space` (see `space_configs`) for arguments `args` (arrays or
    pypto.Tensor specs) on `machine`; `options` are compile options every configuration shares.
    `executor`: None (this process), a concurrent.futures.Executor or a dask.distributed.Client."""
    from ..frontend.jit import JitKernel
    from ..target.machine import get_machine
    if not isinstance(kernel, JitKernel):
        raise PyptoError("tune takes a @pypto.jit kernel", expected="a JitKernel", got=type(kernel).__name__)
    names, configs = space_configs(kernel, space)
    specs = arg_specs(kernel, args)
    default_machine = machine
    t0 = time.perf_counter()
    rows: list = [None] * len(configs)
    todo, keys = [], []
    payload = None
    for i, config in enumerate(configs):
        consts, opts, m = split_config(kernel, config, default_machine)
        opts = {**(options or {}), **opts}
        get_machine(m)                              # an unknown machine fails here, before any work
        key = (kernel._source_hash, specs, tuple(sorted(consts.items())), tuple(sorted(opts.items())),
               _machine_key(m))
        hit = _RESULTS.get(key) if cache else None
        if hit is not None:
            rows[i] = {"config": config, **hit}
            continue
        if payload is None:
            payload = _payload(kernel, executor)
        todo.append((i, Job(payload, specs, consts, opts, m)))
        keys.append(key)

    def detail(job, out):
        cfg = _cfg_text({**job.consts, **job.options})
        return f"{cfg}: {out['cycles']} cycles" if "cycles" in out else f"{cfg}: does not compile"

    outs = sweep.run(evaluate, [job for _, job in todo], executor=executor, what=f"tuning {kernel.name}",
                     detail=detail)
    for (i, _), key, out in zip(todo, keys, outs):
        rows[i] = {"config": configs[i], **out}
        if cache:
            _RESULTS[key] = out
    name = default_machine if isinstance(default_machine, str) else default_machine.name
    return TuneResult(kernel.name, names, rows, name, sweep.describe(executor), time.perf_counter() - t0,
                      len(configs) - len(todo), kernel=kernel, specs=specs)


def clear_cache() -> None:
    """Forget every cached tuning result (they are kept per process)."""
    _RESULTS.clear()
