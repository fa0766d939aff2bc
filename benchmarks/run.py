"""Benchmarks of the spine: compile and simulation speed on the tutorial softmax (1024x1024 fp32).

Prints figures and ratios; run with `make bench`.  Times are medians of several runs in one
warm process except the cold compile, which is the first compile in a fresh process.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]     # the pypto of this checkout, and kernels.py

COLD = r"""
import sys, time, numpy as np
sys.path[:0] = [%r, %r]
t0 = time.perf_counter()
import pypto
from kernels import softmax
x = np.random.rand(1024, 1024).astype(np.float32); out = np.zeros_like(x)
t1 = time.perf_counter()
softmax.compile(x, out)
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
""" % (os.path.dirname(HERE), HERE)


def median_time(fn, repeat=5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def numpy_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def main() -> None:
    from kernels import softmax

    rng = np.random.default_rng(0)
    x = rng.random((1024, 1024), dtype=np.float32)
    out = np.zeros_like(x)

    cold = subprocess.run([sys.executable, "-c", COLD], capture_output=True, text=True, check=True)
    import_s, cold_compile_s = map(float, cold.stdout.split())

    softmax.compile(x, out)                       # warm the process

    def recompile():                              # what a slider release costs: a new TM, no cache hit
        softmax.cache_clear()
        softmax.compile(x, out, TM=32)
    warm_recompile_s = median_time(recompile, repeat=5)

    ck = softmax.compile(x, out)
    full_s = median_time(lambda: ck.simulate(x, out), repeat=3)
    func_s = median_time(lambda: ck.simulate(x, out, mode="functional", check=False), repeat=5)
    timing_s = median_time(lambda: ck.simulate(x, out, mode="timing"), repeat=5)
    numpy_s = median_time(lambda: numpy_softmax(x), repeat=20)
    res = ck.simulate(x, out)

    print("pypto spine benchmark: softmax 1024x1024 fp32, tile 64x256, machine a2a3")
    print(f"  program                      {len(ck.program)} instructions in {len(ck.program.tasks)} tasks, "
          f"{res.cycles} simulated cycles")
    print(f"  import pypto                 {import_s * 1e3:8.1f} ms")
    print(f"  cold compile                 {cold_compile_s * 1e3:8.1f} ms")
    print(f"  warm recompile (TM 64->32)   {warm_recompile_s * 1e3:8.1f} ms")
    print(f"  simulate (full + check)      {full_s * 1e3:8.1f} ms")
    print(f"  functional simulation        {func_s * 1e3:8.1f} ms")
    print(f"  timing simulation            {timing_s * 1e3:8.1f} ms "
          f"({len(ck.program) / timing_s / 1e6:.2f} M instructions/s)")
    print(f"  numpy reference              {numpy_s * 1e3:8.2f} ms")
    print(f"  ratio functional / numpy     {func_s / numpy_s:8.1f} x")


if __name__ == "__main__":
    main()
    print()
    import explorer              # the notebook's slider latency (benchmarks/explorer.py)
    explorer.main()
    print()
    import passes                # what each pass buys, automatic tiling (benchmarks/passes.py)
    passes.main([])
    print()
    import functional_speed      # functional simulation against numpy (benchmarks/functional_speed.py)
    functional_speed.main([])
    print()
    import sim_speed             # the timing engines on a 1 M-instruction kernel (benchmarks/sim_speed.py)
    sim_speed.main([])
