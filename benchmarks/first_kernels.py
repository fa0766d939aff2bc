"""The kernels a user writes first (benchmarks/kernels.py), on a2a3: instructions, tasks,
simulated cycles and time, and the check against numpy.  Run with `make bench`."""
from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE, os.path.join(HERE, "..", "tests")]   # this checkout's pypto first

from test_first_kernels import KERNELS  # noqa: E402  (the kernels with their arguments)

from pypto.sim import get_machine  # noqa: E402


def main() -> None:
    print("first kernels on a2a3 (benchmarks/kernels.py; numpy references in tests/test_first_kernels.py)")
    print(f"  {'kernel':<18} {'instrs':>7} {'tasks':>6} {'cycles':>8} {'us':>7} {'compile ms':>11}  check")
    for name, make in KERNELS.items():
        kernel, args, _ = make()
        t0 = time.perf_counter()
        ck = kernel.compile(*args)
        t1 = time.perf_counter()
        res = ck.simulate(*args)
        us = get_machine("a2a3").cycles_to_us(res.cycles)
        print(f"  {name:<18} {len(ck.program):>7} {len(ck.program.tasks):>6} {res.cycles:>8} {us:>7.2f} "
              f"{(t1 - t0) * 1e3:>11.1f}  {'OK' if res.ok else 'MISMATCH'}")


if __name__ == "__main__":
    main()
