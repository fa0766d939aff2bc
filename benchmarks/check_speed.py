"""The check `ck.simulate()` runs by default, against the simulation it checks.

`ck.simulate(*arrays)` compares the outputs with the numpy reference of the kernel within the error
bound every step's rounding allows (`pypto.ir.numerics`): it evaluates the reference in float64,
then the bound of every step, then compares.  On row-wise kernels that is most of a call: the
simulation of a softmax 1024x1024 takes 2 ms, its check 25-30 ms.  Printed per kernel and size:
the functional simulation alone (`check=False`), the check (`compare`: reference, bounds,
comparison, each timed), the check over the simulation, and whether the fused bound kernels
(`pypto.ir.bound_kernels`, numba) were loaded: a check loads them from `numerics.FUSED_LOAD_MIN`
elements and uses them from `FUSED_MIN` once loaded, so the small sizes run without them in a
fresh process (as here: the sizes run in order) and with them after a large check.  Medians of
--rounds runs in one process, after a warm-up round.

    python benchmarks/check_speed.py              # 1024x1024 to 8192x4096: about a minute
    python benchmarks/check_speed.py --quick      # the two small sizes
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

from kernels import layernorm_auto, matmul_auto, matmul_bias_gelu_auto, softmax_auto  # noqa: E402
from pypto.ir import numerics  # noqa: E402
from pypto.ir.numerics import output_bounds, within_bound  # noqa: E402
from pypto.ir.tensor_eval import evaluate  # noqa: E402


def cases(quick: bool):
    rng = np.random.default_rng(0)
    rows = [(1024, 1024), (4096, 1024)] + ([] if quick else [(8192, 4096)])
    for m, n in rows:
        x = rng.standard_normal((m, n)).astype(np.float32)
        w, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        yield f"softmax {m}x{n} fp32", softmax_auto, (x, np.zeros_like(x))
        yield f"layernorm {m}x{n} fp32", layernorm_auto, (x, w, b, np.zeros_like(x))
    for n in [1024] + ([] if quick else [2048]):
        a = rng.standard_normal((n, n)).astype(np.float16)
        b = rng.standard_normal((n, n)).astype(np.float16)
        bias = rng.standard_normal(n).astype(np.float16)
        yield f"matmul {n}^3 fp16", matmul_auto, (a, b, np.zeros_like(a))
        yield f"matmul+bias+gelu {n}^3 fp16", matmul_bias_gelu_auto, (a, b, bias, np.zeros_like(a))


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the small sizes only")
    a = ap.parse_args(argv)
    print(f"{'kernel':32s} {'simulate':>9s} {'check':>8s} {'reference':>9s} {'bounds':>7s} {'compare':>7s} "
          f"{'check/sim':>9s}  fused   (ms, medians of {a.rounds})")
    for name, kern, args in cases(a.quick):
        ck = kern.compile(*args)
        sims, parts = [], []
        for r in range(a.rounds + 1):           # (the first round warms up: plans, kernels loaded)
            s, res = timed(lambda: ck.simulate(*args, mode="functional", check=False))
            arrays, values = ck.bind(args), {}
            with np.errstate(all="ignore"):
                t_ref, want = timed(lambda: evaluate(ck.traced, arrays, values))
                t_bnd, bound = timed(lambda: output_bounds(ck.traced, values, want))
                t_cmp, _ = timed(lambda: {k: within_bound(res.outputs[k], want[k], bound[k], ck.traced.param(k).dtype)
                                          for k in ck.traced.output_names})
            if r:
                sims.append(s)
                parts.append((t_ref, t_bnd, t_cmp))
            del res, values, want, bound
        sim = statistics.median(sims)
        ref, bnd, cmp = (statistics.median(p[k] for p in parts) for k in range(3))
        check = ref + bnd + cmp
        print(f"{name:32s} {sim * 1e3:9.1f} {check * 1e3:8.1f} {ref * 1e3:9.1f} {bnd * 1e3:7.1f} {cmp * 1e3:7.1f} "
              f"{check / sim:8.1f}x  {'yes' if numerics._KERNELS and numerics._KERNELS[0] else 'no'}", flush=True)
        kern.cache_clear()


if __name__ == "__main__":
    main()
