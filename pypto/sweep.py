"""Run one function over many jobs: in this process, on a `concurrent.futures` executor, or on a
Dask cluster, with progress.  The engine under `pypto.tune`, the advisor and the cost-model
search of `AutoTilingPass`.

    results = sweep.run(fn, jobs, executor=None, what="tuning mm", detail=lambda job, out: ...)

- `executor=None`: `fn(job)` for each job in turn, here.  The stages the jobs open themselves
  (each compile's passes) are kept quiet: the sweep's own stage is the progress to show.
- a `concurrent.futures.Executor` (a ThreadPoolExecutor, a ProcessPoolExecutor: `fn` and the
  jobs must then pickle), or a `dask.distributed.Client` (its `get_executor()`: a LocalCluster
  on a laptop, a scheduler's address for a cluster; Dask pickles with cloudpickle, so functions
  defined in a notebook travel too).
- The results come back in the order of `jobs`, whatever order the workers finish in.  An
  exception raised by `fn` (a bug, not a result: `fn` returns failures it expects as values) is
  raised here once the other submitted jobs are cancelled.
- Progress: one `pypto.progress` stage, `what` with the jobs as steps; `detail(job, result)`
  says what the last finished one gave ("TM=64: 12,345 cycles").
"""
from __future__ import annotations

import concurrent.futures as cf
from typing import Any, Callable, Sequence

from .progress import listening, stage


def describe(executor) -> str:
    """A few words on where the jobs run ("in process", "Dask, 2 workers", "ThreadPoolExecutor")."""
    if executor is None:
        return "in process"
    if is_dask_client(executor):
        try:
            # a client of a cluster it knows (a LocalCluster): the workers the cluster runs, even
            # at a moment the scheduler misses one (a worker's heartbeat late on a loaded machine);
            # else the workers the scheduler has
            workers = getattr(getattr(executor, "cluster", None), "workers", None)
            n = len(workers) if workers is not None else len(executor.scheduler_info().get("workers", {}))
        except Exception:  # noqa: BLE001 - a scheduler that does not answer: say Dask only
            return "Dask"
        return f"Dask, {n} worker{'s' if n != 1 else ''}"
    return type(executor).__name__


def is_dask_client(executor) -> bool:
    return hasattr(executor, "get_executor") and hasattr(executor, "scheduler_info")


def _quiet(fn, job):
    with listening(lambda event: None):
        return fn(job)


def run(fn: Callable[[Any], Any], jobs: Sequence, executor=None, what: str = "sweep",
        unit: str = "configs", detail: Callable[[Any, Any], str] | None = None) -> list:
    jobs = list(jobs)
    bar = stage(what, len(jobs), unit)
    done = 0
    try:
        if executor is None:
            out = []
            for job in jobs:
                out.append(_quiet(fn, job))
                done += 1
                bar.update(done, detail(job, out[-1]) if detail else "")
            return out
        pool = executor.get_executor() if is_dask_client(executor) else executor
        if not hasattr(pool, "submit"):
            from .errors import PyptoError
            raise PyptoError("the executor cannot run jobs", expected="None, a concurrent.futures.Executor "
                             "or a dask.distributed.Client", got=type(executor).__name__)
        futures = {pool.submit(fn, job): i for i, job in enumerate(jobs)}
        out = [None] * len(jobs)
        try:
            for fut in cf.as_completed(futures):
                i = futures[fut]
                out[i] = fut.result()
                done += 1
                bar.update(done, detail(jobs[i], out[i]) if detail else "")
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
        return out
    finally:
        bar.close(done)
