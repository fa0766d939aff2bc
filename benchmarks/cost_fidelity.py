"""How far pypto's cycle costs are from hardware: every measured case of the calibration set
(benchmarks/data/hw_cycles_train.md, what the calibrated constants were fitted to) and of the
held-out set (hw_cycles_holdout.md, measured cases they were not fitted to), costed by
`pypto.sim.cost` on a2a3 under the calibrated rules and under the public formulas, beside the
error of pto-isa's own public cost model on the case (1 - the precision its test asserts).

Printed per case: hw cycles, public formula, calibrated, their relative errors; then the median
relative error per op family and over all cases, and whether the issue's bar holds (median <= 10%,
no family worse than pto-isa's model; errors compared capped at 100%, as the pto-isa tests cap
theirs).  Then the kernel-level figure: a large fp16 GEMM on a2a3 as a fraction of cube peak.

    python benchmarks/cost_fidelity.py            # the tables and the GEMM (about a minute)
    python benchmarks/cost_fidelity.py --no-gemm  # the tables only
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

from pypto.sim.calibration import fidelity, summary  # noqa: E402


def table(path: str, title: str) -> bool:
    cases = fidelity(path)
    print(f"\n{title} ({os.path.relpath(path, os.path.dirname(HERE))}, {len(cases)} cases)")
    print(f"{'case':52s} {'hw':>6} {'public':>7} {'err':>7} {'calib.':>7} {'err':>7} {'pto-isa':>8}")
    for c in cases:
        print(f"{c.test[:52]:52s} {c.hw:6d} {c.public:7d} {c.public_error:7.1%} {c.calibrated:7d} {c.error:7.1%} "
              f"{c.pto_isa_error:8.1%}")
    print(f"\n{'family':18s} {'cases':>5} {'public':>8} {'calibrated':>11} {'(capped)':>9} {'pto-isa':>8}")
    ok = True
    for f in summary(cases):
        worse = f.calibrated_capped > f.pto_isa + 1e-9
        ok &= not worse
        print(f"{f.family:18s} {f.cases:5d} {f.public:8.1%} {f.calibrated:11.1%} {f.calibrated_capped:9.1%} "
              f"{f.pto_isa:8.1%}{'  worse than pto-isa' if worse else ''}")
    med = summary(cases)[-1].calibrated
    ok &= med <= 0.10
    print(f"median error {med:.1%} (bar: 10%), no family worse than pto-isa: "
          f"{'yes' if ok else 'no'} -> {'met' if ok else 'NOT MET'}")
    return ok


def gemm(n: int = 6144) -> None:
    """A large fp16 GEMM with pypto's default tile on a2a3: cycles and the fraction of cube peak."""
    import pypto
    from kernels import matmul_auto
    f16 = pypto.DT_FP16
    t0 = time.perf_counter()
    ck = matmul_auto.compile(pypto.Tensor([n, n], f16), pypto.Tensor([n, n], f16), pypto.Tensor([n, n], f16),
                             machine="a2a3")
    res = ck.simulate(mode="timing", trace=False)
    m = ck.machine
    ideal = 2 * n ** 3 / m.peak_flops * m.clock_ghz * 1e9           # cycles at cube peak
    tile = ck.tile_graph.groups[0].tile
    busy = res.stats.get("pipe_busy_pct", {})
    print(f"\nfp16 GEMM {n}^3 on a2a3 (default tile {tile}): {res.cycles} cycles, "
          f"{ideal / res.cycles:.1%} of cube peak (calibrated costs; {time.perf_counter() - t0:.0f} s to compile "
          f"and simulate){'; busiest pipes ' + str(busy) if busy else ''}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-gemm", action="store_true", help="skip the kernel-level GEMM figure")
    ap.add_argument("--n", type=int, default=6144, help="GEMM size (default 6144)")
    args = ap.parse_args(argv)
    ok = table(os.path.join(HERE, "data", "hw_cycles_train.md"), "Calibration set")
    ok &= table(os.path.join(HERE, "data", "hw_cycles_holdout.md"), "Held-out set")
    if not args.no_gemm:
        gemm(args.n)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
