"""Functional simulation speed against numpy doing the same math.

Three kernels: softmax 4096x1024 fp32 with 128x128 vector tiles, matmul 1024^3 fp32 with
128x128x128 cube tiles, and matmul 2048^3 fp16 with pypto's default cube tile (`matmul_auto`),
against numpy's fp32 product of the inputs widened and rounded back to fp16 (the same math: the
simulator multiplies fp16 factors in fp32).  For each, the numpy reference and
`simulate(mode="functional")` are timed after one warm-up; the figures are medians.  The target is a simulation at most 3x the numpy
time.  Other processes on the machine skew both (the matmuls most: OpenBLAS runs each 128^3
product of the simulation on two threads, and a busy core stalls every one of them).

    python benchmarks/functional_speed.py            # 15 runs of each
    python benchmarks/functional_speed.py --rounds 30
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]     # the pypto of this checkout, and kernels.py

import pypto  # noqa: E402
from kernels import matmul_auto, softmax  # noqa: E402  (the tutorial softmax, tiles TM x TN)

TARGET = 3.0
F32 = pypto.DT_FP32


@pypto.jit
def matmul(a, b, c, *, T: int = 128):
    pypto.set_cube_tile_shapes([T, T], [T, T], [T, T])
    c[:] = pypto.matmul(a, b)


def numpy_softmax(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def cases():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4096, 1024)).astype(np.float32)
    sm = softmax.compile(pypto.Tensor([4096, 1024], F32), pypto.Tensor([4096, 1024], F32), TM=128, TN=128)
    a = rng.standard_normal((1024, 1024)).astype(np.float32)
    b = rng.standard_normal((1024, 1024)).astype(np.float32)
    mm = matmul.compile(*(pypto.Tensor([1024, 1024], F32),) * 3)
    h = rng.standard_normal((2048, 2048)).astype(np.float16)
    g = rng.standard_normal((2048, 2048)).astype(np.float16)
    hm = matmul_auto.compile(*(pypto.Tensor([2048, 2048], pypto.DT_FP16),) * 3)
    return [("softmax 4096x1024 fp32, tile 128x128", sm, (x, np.zeros_like(x)), lambda: numpy_softmax(x)),
            ("matmul 1024^3 fp32, cube tile 128", mm, (a, b, np.zeros_like(a)), lambda: a @ b),
            ("matmul 2048^3 fp16, matmul_auto", hm, (h, g, np.zeros_like(h)),
             lambda: (h.astype(np.float32) @ g.astype(np.float32)).astype(np.float16))]


def measure(ck, args, reference, rounds: int) -> tuple[float, float]:
    """Medians of numpy and simulation times, run in alternating blocks of 5: each block runs
    with its own allocations warm, and background load hits both alike."""
    def simulate():
        return pypto.sim.simulate(ck.program, *args, machine=ck.machine, mode="functional")

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    simulate(), reference()                     # warm-up: plan building, caches
    ref, sim = [], []
    for _ in range(-(-rounds // 5)):
        ref += [timed(reference) for _ in range(5)]
        sim += [timed(simulate) for _ in range(5)]
    return statistics.median(ref), statistics.median(sim)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    rounds = ap.parse_args(argv).rounds
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus (background load skews the figures)")
    print(f"{'kernel':40s} {'numpy ms':>9s} {'sim ms':>8s} {'ratio':>6s}  target <= {TARGET:g}x")
    for name, ck, args, reference in cases():
        ref, sim = measure(ck, args, reference, rounds)
        ratio = sim / ref
        print(f"{name:40s} {ref * 1e3:9.1f} {sim * 1e3:8.1f} {ratio:6.2f}  {'ok' if ratio <= TARGET else 'MISSED'}")


if __name__ == "__main__":
    main()
