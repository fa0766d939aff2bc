"""What the passes are worth: simulated cycles on a2a3 with each optimisation on and off, and
automatic tiling against the best tile shape of an exhaustive sweep.

For every kernel: the cycles with the default pipeline, with fusion off
(`options={"fusion": False}`), with double buffering off (`options={"double_buffer": False}`),
with redundant-load elimination removed from the pipeline
(`CompilerPipeline().remove("eliminate_redundant_loads")`), with L1 reuse across output tiles off
(`options={"l1_reuse": False}`: no serpentine K, every operand chunk reloaded), with list scheduling off
(`options={"list_scheduling": False}`) and with the tile-by-tile streaming of paired epilogues off
(`options={"cross_core_sync": False}`: whole-task dependencies instead); then `AutoTilingPass()` on a version
of the kernel that sets no tile shapes, against the fastest tile shape of a small grid tried
exhaustively (the gap is how much slower the automatic choice is); and the cube utilisation of
the matmuls.  Everything is simulated in timing mode (no data): the figures are cycles of the
deterministic timing model, the same on every run and every computer.

    python benchmarks/passes.py            # about five minutes on a 2-core laptop
    python benchmarks/passes.py --quick    # without the 4096^3 matmul and the targets: about two minutes

The 4096^3 matmul (about 20 s per compile and timing run) only gets the pass columns: its tile
search and sweep would take many minutes.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the pypto of this checkout

import pypto  # noqa: E402
from pypto.compiler import AutoTilingPass, CompilerPipeline  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels import (layernorm, layernorm_auto, matmul, matmul_auto, matmul_bias_gelu,  # noqa: E402
                     matmul_bias_gelu_auto, softmax, softmax_auto)

MACHINE = "a2a3"
F16, F32 = pypto.DT_FP16, pypto.DT_FP32
T = pypto.Tensor


# --- the grids of the exhaustive sweeps ---------------------------------------------------------

VEC_GRID = [dict(TM=tm, TN=tn) for tn in (256, 512, 1024) for tm in (4, 8, 16, 32, 64)]
CUBE_GRID = [dict(ML0=m, NL0=n, KL0=k0, KL1=k1) for m in (64, 128, 256) for n in (64, 128, 256)
             for k0, k1 in ((32, 128), (64, 256), (128, 256), (64, 512))]
EPILOGUE_GRID = [dict(ML0=m, NL0=n, KL0=64, KL1=256, VM=vm, VN=vn)
                 for m in (64, 128, 256) for n in (64, 128, 256)
                 for vm, vn in ((32, 128), (16, 256), (32, 256), (8, 1024))]


@dataclass
class Case:
    name: str
    label: str
    kernel: object
    auto_kernel: object | None
    specs: tuple
    consts: dict = field(default_factory=dict)   # the tile shapes of the pass columns
    grid: list | None = None
    cube: bool = False


def cases(quick: bool) -> list[Case]:
    n = 1024
    vec = (T([n, n], F32), T([n, n], F32))
    ln = (T([n, n], F32), T([n], F32), T([n], F32), T([n, n], F32))
    mm = (T([n, n], F16),) * 3
    out = [
        Case("softmax 1024x1024 fp32", "tile 64x256", softmax, softmax_auto, vec, dict(TM=64, TN=256), VEC_GRID),
        Case("layernorm 1024x1024 fp32", "weight and bias, tile 64x256", layernorm, layernorm_auto, ln,
             dict(TM=64, TN=256), VEC_GRID),
        Case("matmul fp16 1024^3", "cube tile 128/64-256/128", matmul, matmul_auto, mm, {}, CUBE_GRID, cube=True),
    ]
    if not quick:
        big = (T([4096, 4096], F16),) * 3
        out.append(Case("matmul fp16 4096^3", "pypto's default tile for a2a3", matmul_auto, None, big, {}, None,
                        cube=True))
    out.append(Case("matmul+bias+gelu fp16 1024^3", "cube tile 128/64-256/128, vector tile 32x128", matmul_bias_gelu,
                    matmul_bias_gelu_auto, (T([n, n], F16), T([n, n], F16), T([n], F16), T([n, n], F16)),
                    {}, EPILOGUE_GRID, cube=True))
    return out


# --- measuring ------------------------------------------------------------------------------------

def timed(ck):
    """The timing model's result for a compiled kernel (no data, no trace, no progress bar)."""
    return pypto.sim.simulate(ck.program, machine=ck.machine, mode="timing", trace=False, progress=False)


def cycles_of(kernel, specs, pipeline=None, options=None, **consts) -> int:
    ck = kernel.compile(*specs, machine=MACHINE, pipeline=pipeline, options=options, **consts)
    return timed(ck).cycles


def tile_of(ck) -> str:
    parts = []
    for g in ck.tile_graph.groups:
        if g.kind == "cube":
            ml0, kl0, nl0, kl1 = g.tile
            parts.append(f"{ml0}/{kl0}-{kl1}/{nl0}")
        else:
            parts.append("x".join(str(d) for d in g.tile))
    return ", ".join(dict.fromkeys(parts))


def sweep(case: Case):
    """(best cycles, its constants, configurations tried, of which illegal)."""
    best, illegal = None, 0
    for consts in case.grid:
        try:
            c = cycles_of(case.kernel, case.specs, **consts)
        except pypto.TileShapeError:
            illegal += 1
            continue
        if best is None or c < best[0]:
            best = (c, consts)
    return best[0], best[1], len(case.grid), illegal


def fmt_consts(consts: dict) -> str:
    if "ML0" in consts:
        s = f"{consts['ML0']}/{consts['KL0']}-{consts['KL1']}/{consts['NL0']}"
        return s + (f", {consts['VM']}x{consts['VN']}" if "VM" in consts else "")
    return f"{consts['TM']}x{consts['TN']}"


def pct(a: int, base: int) -> str:
    return f"{100.0 * (a - base) / base:+.1f}%"


def measure(case: Case) -> dict:
    t0 = time.perf_counter()
    ck = case.kernel.compile(*case.specs, machine=MACHINE, **case.consts)
    res = timed(ck)
    row = {"name": case.name, "label": f"{case.name}, {case.label}", "default": res.cycles, "groups": len(ck.tile_graph.groups),
           "instructions": len(ck.program),
           "cube_util": res.stats["cube_util_pct"] if case.cube else None}
    row["fusion_off"] = cycles_of(case.kernel, case.specs, options={"fusion": False}, **case.consts)
    row["double_buffer_off"] = cycles_of(case.kernel, case.specs, options={"double_buffer": False}, **case.consts)
    row["rle_off"] = cycles_of(case.kernel, case.specs,
                               pipeline=CompilerPipeline().remove("eliminate_redundant_loads"), **case.consts)
    row["l1_reuse_off"] = cycles_of(case.kernel, case.specs, options={"l1_reuse": False}, **case.consts)
    row["sched_off"] = cycles_of(case.kernel, case.specs, options={"list_scheduling": False}, **case.consts)
    row["stream_off"] = cycles_of(case.kernel, case.specs, options={"cross_core_sync": False}, **case.consts)
    row["tile"] = tile_of(ck)
    if case.auto_kernel is not None:
        auto = AutoTilingPass()
        ack = CompilerPipeline([("tiling", auto)]).compile(case.auto_kernel, *case.specs, machine=MACHINE)
        ares = timed(ack)
        row["auto"] = (ares.cycles, tile_of(ack), len(auto.tried))
        hck = case.auto_kernel.compile(*case.specs, machine=MACHINE)       # pypto's heuristic tiles
        row["heuristic"] = (timed(hck).cycles, tile_of(hck))
        row["sweep"] = sweep(case)
        if case.cube:
            row["auto_cube_util"] = ares.stats["cube_util_pct"]
    row["seconds"] = time.perf_counter() - t0
    return row


def table(rows: list[dict]) -> str:
    lines = ["| kernel (a2a3, cycles) | default | fusion off | double buffering off | "
             "redundant-load elim. off | L1 reuse off | list scheduling off | cross-core streaming off | cube util |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        d = r["default"]
        util = "" if r["cube_util"] is None else f"{r['cube_util']:.1f}%"
        off = [r[k] for k in ("fusion_off", "double_buffer_off", "rle_off", "l1_reuse_off", "sched_off", "stream_off")]
        lines.append(f"| {r['label']} ({r['tile']}) | {d} | " + " | ".join(f"{c} ({pct(c, d)})" for c in off)
                     + f" | {util} |")
    lines += ["", "| kernel without tile shapes (a2a3, cycles) | pypto heuristic | AutoTilingPass() | "
                  "best of sweep | auto vs best |",
              "|---|---:|---:|---:|---:|"]
    for r in rows:
        if "auto" not in r:
            continue
        (hc, ht), (ac, at, n_tried) = r["heuristic"], r["auto"]
        bc, bconsts, n_grid, illegal = r["sweep"]
        name = r["name"]
        util = f", cube {r['auto_cube_util']:.1f}%" if "auto_cube_util" in r else ""
        lines.append(f"| {name} | {hc} ({ht}) | {ac} ({at}; {n_tried} tried{util}) | "
                     f"{bc} ({fmt_consts(bconsts)}; {n_grid - illegal} legal of {n_grid}) | {pct(ac, bc)} |")
    return "\n".join(lines)


def targets() -> str:
    """The issue's two automatic-tiling targets on a2a3, default tiles: a 4096^3 fp16 matmul at
    80% of the cube peak or more, and softmax 8192x4096 fp32 at 80% of the HBM bandwidth."""
    big = (T([4096, 4096], F16),) * 3
    mm = timed(matmul_auto.compile(*big, machine=MACHINE))
    sm = timed(softmax_auto.compile(T([8192, 4096], F32), T([8192, 4096], F32), machine=MACHINE))
    return "\n".join([
        "| target (a2a3, default tiles) | cycles | achieved | asked |", "|---|---:|---:|---:|",
        f"| matmul fp16 4096^3: cube peak | {mm.cycles} | {mm.stats['cube_util_pct']:.1f}% | 80% |",
        f"| softmax fp32 8192x4096: HBM bandwidth | {sm.cycles} | {sm.stats['hbm_util_pct']:.1f}% | 80% |"])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--quick", action="store_true", help="leave out the 4096^3 matmul and the targets table")
    args = ap.parse_args(argv)
    rows = []
    for case in cases(args.quick):
        rows.append(measure(case))
        print(f"measured {case.name} in {rows[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
    print(table(rows))
    print()
    if not args.quick:
        print(targets())
        print()
    print("Notes: cycles of the timing model (deterministic); in brackets the change against the default "
          "pipeline. Cube tiles are mL0/kL0-kL1/nL0. 'auto vs best' is how much slower AutoTilingPass()'s "
          "choice is than the fastest legal shape of the sweep grid. The 4096^3 matmul has no "
          "tile search or sweep (about 20 s per candidate). Cross-core streaming only changes mixed "
          "cube/vector kernels (epilogues paired 1 AIC : 2 AIV).")


if __name__ == "__main__":
    main()
