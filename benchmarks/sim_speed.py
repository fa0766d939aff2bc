"""Timing-simulation speed: the Python and the compiled (numba) engine on a kernel of >= 1 M instructions.

The target (simulator issue): timing-only simulation at >= 1,000,000 simulated instructions per
second of wall time on one core, on a kernel of >= 1,000,000 instructions, with memory that grows
with the live tiles, not with the instructions.  Printed:

- the kernel: instructions, tasks, compile time (not part of the simulation);
- the compiled engine's one-time costs: numba compiling it (first use on a computer, measured in
  a subprocess with an empty cache), loading it from numba's on-disk cache (first use in a
  process), and encoding the program (first simulation of a program, cached on it);
- the wall (and CPU) time of a timing run of each engine once warm (encoding / decoding cached), the
  instructions per second and the ratio to the 1 M/s target; the first run of each too;
- memory: the compiled engine's working state against the program's size, tracemalloc's peak of
  a run (trace=False), the size of the cached encoding, and the process's peak RSS.

    python benchmarks/sim_speed.py            # matmul fp16 4096x8192 @ 8192x4096: 1.25 M instructions, ~2 min
    python benchmarks/sim_speed.py --quick    # matmul fp16 2048^3: 79 k instructions, ~15 s
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the pypto of this checkout

import pypto  # noqa: E402
from pypto.sim import timing_fast  # noqa: E402
from pypto.ir.exec import STREAM_SHAPES  # noqa: E402
from pypto.sim.timing import run_timing, sim_cache  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels import matmul  # noqa: E402  (cube tile 128/64-256/128 by default)

TARGET = 1_000_000      # instructions per second


# the compiled engine's first use in a fresh process on a tiny program: import + load (or compile)
FIRST_USE = r"""
import time
import pypto
from pypto.ir.exec import STREAM_SHAPES
from pypto.sim.timing import run_timing, sim_cache
@pypto.jit
def add(x, out):
    out[:] = x + 1.0
ck = add.compile(pypto.Tensor([64, 64], pypto.DT_FP32), pypto.Tensor([64, 64], pypto.DT_FP32))
t0 = time.perf_counter()
run_timing(ck.program, ck.machine, trace=False, progress=False, engine="compiled")
print(time.perf_counter() - t0)
"""


def first_use_s(cache_dir: str | None) -> float:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))    # the pypto of this checkout
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    out = subprocess.run([sys.executable, "-c", FIRST_USE], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def timed(fn):
    """(wall seconds, CPU seconds of this process), fn's result."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return (time.perf_counter() - t0, time.process_time() - c0), out


def median_s(fn, repeat: int) -> tuple[float, float]:
    runs = sorted(timed(fn)[0] for _ in range(repeat))
    return runs[len(runs) // 2]


def traced_peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def mib(n: float) -> str:
    return f"{n / 2 ** 20:8.1f} MiB"


def rate(n: int, s: tuple[float, float]) -> str:
    wall, cpu = s
    return (f"{wall:8.3f} s  {n / wall / 1e6:6.2f} M instr/s  ({n / wall / TARGET:5.2f}x the 1 M/s target; "
            f"CPU {cpu:.3f} s)")


def user_path(ck, total: int) -> None:
    """`ck.simulate(mode="timing")` with its defaults, as a user calls it after compiling: the run
    the compiler made (assign_cores) is returned, the trace made when read; then the first
    simulation of a program whose streams the simulator has not seen (a copy of the program
    with the compiler's stream shapes, nothing kept): decoding, encoding and the run."""
    (first, _), res = timed(lambda: ck.simulate(mode="timing"))
    print(f"  ck.simulate(mode='timing')    {first:8.3f} s  {total / first / 1e6:8.1f} M instr/s  "
          f"(target >= 10 M/s: {'met' if total / first >= 10e6 else 'NOT MET'}; the compiler's run, "
          f"trace not made yet)")
    import matplotlib.figure  # noqa: F401  (imported once per process: not the timeline's cost)
    (fig_s, _), fig = timed(lambda: res.timeline())
    (png_s, _), _ = timed(lambda: fig._repr_png_())
    print(f"    res.timeline()              {fig_s:8.3f} s  (+ {png_s:.3f} s to PNG, as a notebook shows it; "
          f"the trace's columns read off the run, no event made: {not res.trace.made})")
    (agg_s, _), fig = timed(lambda: res.timeline(aggregate=True))
    (png_s, _), _ = timed(lambda: fig._repr_png_())
    print(f"    res.timeline(aggregate=True) {agg_s:7.3f} s  (+ {png_s:.3f} s to PNG)")
    (made, _), _ = timed(lambda: len(list(res.trace)))
    print(f"    reading res.trace           {made:8.3f} s  ({len(res.trace)} events, made by a run with trace)")
    with tempfile.TemporaryDirectory() as d:
        (chrome_s, _), path = timed(lambda: res.to_chrome_trace(os.path.join(d, "trace.json")))
        size = os.path.getsize(path)
    print(f"    res.to_chrome_trace()       {chrome_s:8.3f} s  ({size / 2 ** 20:.0f} MiB of JSON)")
    p = ck.program
    copy = pypto.Program(p.name, p.buffers, p.tasks)
    copy.__dict__[STREAM_SHAPES] = p.__dict__[STREAM_SHAPES]
    copy.__dict__["_verified_for"] = {ck.machine}      # the compiler's program: not verified again
    (new, _), res2 = timed(lambda: pypto.sim.simulate(copy, machine=ck.machine, mode="timing", progress=False))
    print(f"  first simulation of streams   {new:8.3f} s  {total / new / 1e6:8.1f} M instr/s  "
          f"(target >= 3 M/s: {'met' if total / new >= 3e6 else 'NOT MET'}; decoding and encoding included)")
    (again, _), _ = timed(lambda: pypto.sim.simulate(copy, machine=ck.machine, mode="timing", progress=False,
                                                      engine="compiled"))
    print(f"  again (encoding kept)         {again:8.3f} s  {total / again / 1e6:8.1f} M instr/s")
    assert res2.cycles == res.cycles and res2.stats == res.stats


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 79 k-instruction matmul instead of 1.25 M")
    args = ap.parse_args(argv)
    m, k, n = (2048, 2048, 2048) if args.quick else (4096, 8192, 4096)
    f16 = pypto.DT_FP16
    if not timing_fast.AVAILABLE:
        sys.exit("numba is not installed: only the Python engine is available")

    t_compile, ck = timed(lambda: matmul.compile(pypto.Tensor([m, k], f16), pypto.Tensor([k, n], f16),
                                                 pypto.Tensor([m, n], f16), machine="a2a3"))
    program, machine = ck.program, ck.machine
    total = len(program)
    print(f"timing simulation speed: matmul fp16 {m}x{k} @ {k}x{n}, cube tiles 128/64-256/128, machine a2a3")
    print(f"  program                       {total} instructions in {len(program.tasks)} tasks "
          f"(compiled in {t_compile[0]:.1f} s)")

    with tempfile.TemporaryDirectory() as empty:
        jit_compile_s = first_use_s(empty)
    jit_load_s = first_use_s(None)
    print(f"  compiled engine, first use    {jit_compile_s:8.3f} s  on a computer (numba compiles it)")
    print(f"                                {jit_load_s:8.3f} s  in a process (numba import + on-disk cache)")

    def run(engine, trace=False):
        return run_timing(program, machine, trace=trace, progress=False, engine=engine)

    user_path(ck, total)

    run("compiled")                 # loads the engine (not the program's first simulation: see below)
    sim_cache(program).pop(("encoding", machine), None)
    first_c, res_c = timed(lambda: run("compiled"))
    warm_c = median_s(lambda: run("compiled"), repeat=5)
    first_py, res_py = timed(lambda: run("python"))
    warm_py = median_s(lambda: run("python"), repeat=1)
    same = all(res_py[key] == res_c[key] for key in res_py)
    print(f"  simulated cycles              {res_c['cycles']} (both engines: "
          f"{'identical results' if same else 'RESULTS DIFFER'})")
    print(f"  compiled engine, warm     {rate(total, warm_c)}")
    print(f"  compiled, first run       {rate(total, first_c)}  incl. encoding the program")
    print(f"  Python engine, warm       {rate(total, warm_py)}")
    print(f"  Python, first run         {rate(total, first_py)}  incl. decoding the program")
    print(f"  speed-up compiled/Python  {warm_py[0] / warm_c[0]:8.1f} x warm, {first_py[0] / first_c[0]:.1f} x "
          "first run")
    warm_trace = median_s(lambda: run("compiled", trace=True), repeat=1)
    print(f"  compiled with trace=True  {rate(total, warm_trace)}  (a TraceEvent per instruction)")

    enc = timing_fast.encode(program, machine)
    state = timing_fast._new_state(enc, record=False)
    state_bytes = sum(a.nbytes for a in state)
    enc_bytes = sum(a.nbytes for a in enc.arrays)
    peak_c = traced_peak(lambda: run("compiled"))
    print("  memory")
    print(f"    compiled engine state   {mib(state_bytes)}  for {len(program.tasks)} tasks, {enc.n_windows} GM "
          f"windows, {machine.n_aic + machine.n_aiv} cores, {len(state.pool_time)} pending-flag slots "
          f"(nothing per instruction)")
    print(f"    peak of a compiled run  {mib(peak_c)}  (tracemalloc, trace=False, encoding cached)")
    print(f"    encoding (cached)       {mib(enc_bytes)}  ({enc_bytes / total:.0f} bytes per instruction)")
    peak_py = traced_peak(lambda: run("python"))
    print(f"    peak of a Python run    {mib(peak_py)}  (tracemalloc, trace=False, decoding cached)")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"    process peak RSS        {mib(rss)}  (the compiled program itself included)")


if __name__ == "__main__":
    main()
