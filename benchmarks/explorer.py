"""Explorer latency: slider release -> refreshed view, on the tutorial softmax (1024x1024 fp32, a2a3).

`explorer.update(TM=v)` applies a change exactly like a slider release and returns once the view
is refreshed; as in a live kernel, the numpy check of the new configuration follows (it is timed
too, as "check shown").  Every measured value is never seen before: the explorer's caches and the kernel's
compile cache are cleared before each one, so each update compiles, simulates and renders.  The
budget is a median of 150 ms on a 2-core machine.

    python benchmarks/explorer.py            # median / p90 per selected tab, cached revisit
    python benchmarks/explorer.py --profile  # plus a cProfile of the updates (top functions)
    python benchmarks/explorer.py --dynamic  # the size slider of a dynamic softmax (see below)

`--dynamic` measures the size slider instead: a softmax with a pypto.DYNAMIC first dim
(x, out: [N, 1024] fp32, the arrays 1024 rows, a2a3), `explorer.update(N=v)` over sizes never
seen before (the explorer's runs and views, the arrays it makes and the compiled kernel's
programs per size are forgotten before each one; its one compile is kept, as in a notebook).
A move re-simulates the program of a call on N rows without recompiling: the kernel's compile
cache holds one entry and its compile is never called (both asserted).
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the pypto of this checkout

import pypto  # noqa: E402

BUDGET_MS = 150.0
TM_VALUES = (8, 16, 32, 64)        # the TM slider values that fit UB with TN = 256
ROUNDS = 3
N_VALUES = (1, 7, 100, 1000, 2048, 3000, 8192)   # the size slider's moves of --dynamic


def make():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kernels import softmax

    rng = np.random.default_rng(0)
    x = rng.random((1024, 1024), dtype=np.float32)
    return softmax, x, np.zeros_like(x)


def forget(ex):
    """Make every configuration never-seen again (explorer caches and the kernel's compile cache)."""
    ex._results.clear()
    ex._views.clear()
    ex._rendered.clear()
    ex._static_cache = None
    ex.kernel.cache_clear()


def ms(s: float) -> float:
    return 1e3 * s


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def measure(ex, tab, rounds=ROUNDS, name="TM", values=TM_VALUES, forget_=forget):
    """Wall and CPU times (s) of update(name=v) over never-seen `values` (`forget_` makes them so)
    with `tab` selected, the breakdown (compile, simulate, view) of each, and the time until the
    numpy check is shown.

    Runs inside an asyncio event loop, as in a live Jupyter kernel: there update() returns once
    the view is refreshed and the functional simulation + numpy check follow right after (they
    are waited for before the next value, and timed as "check done")."""
    import asyncio

    async def run():
        ex.select(tab)
        times, cpu, parts, checked = [], [], [], []
        for _ in range(rounds):
            for v in values:
                forget_(ex)
                c0, t0 = time.process_time(), time.perf_counter()
                ex.update(**{name: v})
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                now = ex.size if name == ex.size_name else ex.consts.get(name)
                assert ex.error is None and now == v, ex.error
                parts.append(tuple(ex._timing))
                while ex.res.check is None:          # let the deferred check run
                    await asyncio.sleep(0)
                checked.append(time.perf_counter() - t0)
                assert ex.res.ok, ex.res.check
        return times, cpu, parts, checked
    return asyncio.run(run())


def make_dynamic():
    # the annotations are strings here (from __future__ import annotations): @pypto.jit evaluates
    # them in the module's globals, so they name the module-level pypto, not a local alias
    @pypto.jit
    def softmax_dyn(x: pypto.Tensor([pypto.DYNAMIC, 1024], pypto.DT_FP32),
                    out: pypto.Tensor([pypto.DYNAMIC, 1024], pypto.DT_FP32)):
        out[:] = pypto.softmax(x, dim=-1)

    rng = np.random.default_rng(0)
    x = rng.random((1024, 1024), dtype=np.float32)
    assert softmax_dyn.dynamic_params(x, x) == ("x", "out"), softmax_dyn.annotations
    return softmax_dyn, x, np.zeros_like(x)


def forget_sizes(ex):
    """Make every size never-seen again, keeping the one compile and what depends on it alone
    (the graph, PTO and Passes renderings, as in a notebook): the explorer's runs, the renderings
    of the simulation tabs, the arrays it made, and the compiled kernel's programs per size."""
    from pypto.viz.views import SIM_TABS
    for entry in ex._results.values():
        entry.runs.clear()
    for key in [k for k in ex._views if len(k[0]) == 4]:     # (configuration, size): a run's view
        del ex._views[key]
    for title in SIM_TABS:
        ex._rendered.pop(title, None)
    ex._sized.clear()
    ex._static_cache = None
    ex.ck._instances.clear()


def report_tab(figures, tab, times, cpu, parts, checked, name, values, compile_: bool, check_what: str):
    """Print the figures of one tab's updates (median, p90, per value, check, CPU) into `figures`."""
    med, p90 = statistics.median(times), pct(times, 0.9)
    sim = statistics.median(p[1] for p in parts)
    view = statistics.median(p[2] for p in parts)
    figures[tab] = (med, p90)
    verdict = "within" if ms(med) <= BUDGET_MS else "OVER"
    comp = f"median compile {ms(statistics.median(p[0] for p in parts)):.0f} ms, " if compile_ else "no compile, median "
    print(f"  {tab + ' tab selected':<22} median {ms(med):7.1f} ms   p90 {ms(p90):7.1f} ms   "
          f"({verdict} the {BUDGET_MS:.0f} ms budget; {comp}simulate {ms(sim):.0f} ms, view {ms(view):.0f} ms)")
    per_value = {v: [] for v in values}
    for k, t in enumerate(times):
        per_value[values[k % len(values)]].append(t)
    print("      per value: " + ", ".join(f"{name}={v} {ms(statistics.median(ts)):.0f} ms"
                                       for v, ts in per_value.items()))
    print(f"      numpy check shown: median {ms(statistics.median(checked)):.1f} ms, "
          f"p90 {ms(pct(checked, 0.9)):.1f} ms after the release ({check_what})")
    figures[tab + " checked"] = (statistics.median(checked), pct(checked, 0.9))
    print(f"      CPU time of this process: median {ms(statistics.median(cpu)):.1f} ms, "
          f"p90 {ms(pct(cpu, 0.9)):.1f} ms (less sensitive to other processes than wall time)")
    figures[tab + " cpu"] = (statistics.median(cpu), pct(cpu, 0.9))


def measure_sizes(ex, tab, rounds=ROUNDS):
    """`measure` over update(N=v) for the never-seen sizes N_VALUES, asserting that none of the
    moves compiles."""
    kernel, ck = ex.kernel, ex.ck
    calls = []
    compile_ = kernel._compile
    kernel._compile = lambda *a, **k: calls.append(1) or compile_(*a, **k)
    try:
        out = measure(ex, tab, rounds, ex.size_name, N_VALUES, forget_sizes)
    finally:
        del kernel._compile
    assert not calls and ex.ck is ck and kernel.cache_size == 1, (len(calls), kernel.cache_size)
    return out


def main_dynamic() -> dict:
    from pypto.viz.explorer import Explorer

    kernel, x, out = make_dynamic()
    t0 = time.perf_counter()
    ex = Explorer(kernel, (x, out))
    first = time.perf_counter() - t0
    ex.update(N=512)                     # warm up
    ex.select("Timeline")
    ex.update(N=64)
    load = _load()
    print("pypto explorer latency: dynamic softmax [N, 1024] fp32 on a2a3 (arrays of 1024 rows), "
          f"update(N=v) over never-seen sizes {N_VALUES} x {ROUNDS} rounds, no recompile"
          + (f" (load average {load:.2f})" if load is not None else ""))
    print(f"  first view (construct, compile, simulate with trace, render)  {ms(first):7.1f} ms")
    figures = {}
    for tab in ("Tensor", "Timeline"):
        report_tab(figures, tab, *measure_sizes(ex, tab), "N", N_VALUES, compile_=False,
                   check_what="arrays made at N, functional simulation of each piece + reference")
    for v in N_VALUES:                   # see every size once
        ex.update(N=v)
    cached = []
    for _ in range(ROUNDS):
        for v in N_VALUES:
            t0 = time.perf_counter()
            ex.update(N=v)
            cached.append(time.perf_counter() - t0)
    figures["cached"] = (statistics.median(cached), pct(cached, 0.9))
    print(f"  cached revisit (a size seen before)     median {ms(figures['cached'][0]):7.2f} ms   "
          f"p90 {ms(figures['cached'][1]):7.2f} ms")
    print(f"  compile cache of the kernel: {kernel.cache_size} entry")
    return figures


def cached_revisit(ex, tab):
    ex.select(tab)
    for v in TM_VALUES:                      # see every value once
        ex.update(TM=v)
    times = []
    for _ in range(ROUNDS):
        for v in TM_VALUES:
            t0 = time.perf_counter()
            ex.update(TM=v)
            times.append(time.perf_counter() - t0)
    return times


def snapshot_overhead(kernel, x, out, repeat=5):
    """Median compile time without and with pass snapshots (TM=32, never-seen each time)."""
    res = {}
    for snaps in (False, True):
        ts = []
        for _ in range(repeat):
            kernel.cache_clear()
            t0 = time.perf_counter()
            kernel.compile(x, out, TM=32, snapshots=snaps)
            ts.append(time.perf_counter() - t0)
        res[snaps] = statistics.median(ts)
    return res


def _load():
    try:
        import os
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def main(profile: bool = False) -> dict:
    from pypto.viz.explorer import Explorer

    softmax, x, out = make()
    t0 = time.perf_counter()
    ex = Explorer(softmax, (x, out))
    first = time.perf_counter() - t0
    ex.update(TM=32)                     # warm up imports, dot, matplotlib fonts
    ex.select("Timeline")
    ex.update(TM=16)

    load = _load()
    print("pypto explorer latency: softmax 1024x1024 fp32 on a2a3, update(TM=v) over never-seen "
          f"values {TM_VALUES} x {ROUNDS} rounds" + (f" (load average {load:.2f})" if load is not None else ""))
    print(f"  first view (construct, compile, simulate with trace, render)  {ms(first):7.1f} ms")
    figures = {}
    prof = None
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    for tab in ("Tensor", "Timeline"):
        report_tab(figures, tab, *measure(ex, tab), "TM", TM_VALUES, compile_=True,
                   check_what="functional simulation + reference, right after the view")
    if prof is not None:
        prof.disable()
    cached = cached_revisit(ex, "Timeline")
    figures["cached"] = (statistics.median(cached), pct(cached, 0.9))
    print(f"  cached revisit (a value seen before)    median {ms(figures['cached'][0]):7.2f} ms   "
          f"p90 {ms(figures['cached'][1]):7.2f} ms")
    snaps = snapshot_overhead(softmax, x, out)
    print(f"  compile TM=32 without / with pass snapshots (Passes tab)  {ms(snaps[False]):.0f} ms / "
          f"{ms(snaps[True]):.0f} ms")
    if prof is not None:
        import pstats
        print("\ncProfile of the updates above (top 25 by cumulative time):")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return figures


if __name__ == "__main__":
    if "--dynamic" in sys.argv:
        main_dynamic()
    else:
        main(profile="--profile" in sys.argv)
