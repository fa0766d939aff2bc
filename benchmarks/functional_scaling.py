"""Functional simulation time against program size: it must grow linearly with the instructions.

Kernels with vector tiles of 1x8 fp32, so that the instruction count grows with the data:

- `row sum, 1 task`: the sum of one long row, one task whose stream grows (a chain through the
  accumulator tile: nothing batches or fuses);
- `softmax, 1 row`: a softmax of one long row (the reductions in one task each, the element-wise
  part spread over the vector cores);
- `exp*2+1, many rows`: an element-wise chain over many rows of 8, spread over the vector cores
  (48 tasks on a2a3, each looping over its rows).

For each, programs of about 1k, 3k, 10k, 30k and 100k instructions (sync instructions included)
are compiled (not timed), then timed: building the functional plan (`plan_for`, once per
program, with the collector paused as `simulate` pauses it), and a warm
`simulate(mode="functional")` run (median of a few, the plan cached).  Last,
the time per instruction at the largest size over that at the smallest: 1.0 is linear.

    python benchmarks/functional_scaling.py                 # up to 100k instructions, ~2 min
    python benchmarks/functional_scaling.py --max 30000     # quicker
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the pypto of this checkout

import pypto  # noqa: E402
from pypto.gcpause import gc_paused  # noqa: E402
from pypto.sim.functional_plan import plan_for  # noqa: E402

SIZES = (1_000, 3_000, 10_000, 30_000, 100_000)


@pypto.jit
def row_sum(x, out):
    pypto.set_vec_tile_shapes(1, 8)
    out[:] = pypto.sum(x, dim=-1, keepdim=True)


@pypto.jit
def softmax(x, out):
    pypto.set_vec_tile_shapes(1, 8)
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)


@pypto.jit
def exp_chain(x, out):
    pypto.set_vec_tile_shapes(1, 8)
    out[:] = pypto.exp(x) * 2.0 + 1.0


# name, kernel, (x shape, out shape) for n tiles of 8, instructions per tile (about)
CASES = [
    ("row sum, 1 task", row_sum, lambda n: ((1, 8 * n), (1, 1)), 5),
    ("softmax, 1 row", softmax, lambda n: ((1, 8 * n), (1, 8 * n)), 27),
    ("exp*2+1, many rows", exp_chain, lambda n: ((n, 8), (n, 8)), 9),
]


def measure(kernel, shapes, rounds: int) -> dict:
    rng = np.random.default_rng(0)
    (xs, os_) = shapes
    x = rng.standard_normal(xs).astype(np.float32)
    out = np.zeros(os_, np.float32)
    ck = kernel.compile(x, out)
    program, machine = ck.program, ck.machine
    t0 = time.perf_counter()
    with gc_paused():                   # as simulate builds it (the collector paused)
        plan_for(program, machine)
    build = time.perf_counter() - t0
    pypto.sim.simulate(program, x, out, machine=machine, mode="functional")     # warm: verified, views
    runs = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        pypto.sim.simulate(program, x, out, machine=machine, mode="functional")
        runs.append(time.perf_counter() - t0)
    return {"instrs": sum(len(t.instrs) for t in program.tasks), "tasks": len(program.tasks),
            "ops": len(plan_for(program, machine).ops), "build": build, "run": statistics.median(runs)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=SIZES[-1], help="largest program (instructions)")
    ap.add_argument("--rounds", type=int, default=3, help="warm runs timed per program")
    args = ap.parse_args(argv)
    sizes = [s for s in SIZES if s <= args.max]
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus (background load skews the figures)")
    print(f"{'kernel':20s} {'instrs':>8s} {'tasks':>6s} {'numpy calls':>11s} {'build s':>8s} {'run s':>8s} "
          f"{'build us/instr':>14s} {'run us/instr':>12s}")
    for name, kernel, shapes, per_tile in CASES:
        rows = []
        for size in sizes:
            r = measure(kernel, shapes(max(1, size // per_tile)), args.rounds)
            rows.append(r)
            print(f"{name:20s} {r['instrs']:8d} {r['tasks']:6d} {r['ops']:11d} {r['build']:8.3f} {r['run']:8.4f} "
                  f"{r['build'] / r['instrs'] * 1e6:14.2f} {r['run'] / r['instrs'] * 1e6:12.2f}")
        first, last = rows[0], rows[-1]
        per = [(r["build"] + r["run"]) / r["instrs"] for r in (first, last)]
        print(f"{name:20s} time per instruction at {last['instrs']:,} / at {first['instrs']:,}: "
              f"build {last['build'] / last['instrs'] / (first['build'] / first['instrs']):.2f}, "
              f"run {last['run'] / last['instrs'] / (first['run'] / first['instrs']):.2f}, "
              f"both {per[1] / per[0]:.2f}")


if __name__ == "__main__":
    main()
