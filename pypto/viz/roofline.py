"""The roofline of a simulated kernel: where it sits between the machine's HBM and compute roofs.

x is the arithmetic intensity (FLOP per byte moved to or from HBM), y the achieved FLOP/s; the
machine gives two roofs: the HBM roof (bandwidth x intensity) and the compute roof (the cube's
peak, `machine.peak_flops`).  A kernel under the slanted part is bandwidth-bound, under the flat
part compute-bound.

Vector-only kernels do no cube work: 0 FLOP is not a point on a log-log plot, so for them the
figure shows what does limit them instead -- the achieved HBM bandwidth next to the HBM roof.
"""
from __future__ import annotations

from ..ir.exec import static_instrs


def roofline_numbers(res) -> dict:
    """The figures the plot shows, as plain numbers (also handy in tests and text reports)."""
    if res.cycles is None:
        raise ValueError("the roofline needs a timing simulation (res.cycles is None)")
    m, s = res.machine, res.stats
    seconds = max(res.cycles, 1) / (m.clock_ghz * 1e9)
    flops, hbm = s.get("flops", 0), s.get("hbm_bytes", 0)
    return {
        "flops": flops, "hbm_bytes": hbm, "seconds": seconds,
        "flops_per_s": flops / seconds,
        "intensity": flops / hbm if hbm else None,              # FLOP per HBM byte
        "hbm_bytes_per_s": hbm / seconds,
        "peak_flops": m.peak_flops, "hbm_roof_bytes_per_s": m.hbm_gbps * 1e9,
        "ridge": m.peak_flops / (m.hbm_gbps * 1e9),              # intensity where the roofs meet
        "bound": s.get("bound", ""),
    }


def fp32_cube(program) -> bool:
    """Whether the program's matmuls read fp32 operands (the cube runs them at half rate)."""
    prog = program
    return prog is not None and any(i.op.startswith("TMATMUL") and getattr(i.srcs[-1], "dtype", None) is not None
                              and i.srcs[-1].dtype.name == "fp32" for t in prog.tasks for i, _ in static_instrs(t.code))


def _fmt_flops(v: float) -> str:
    for unit, scale in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if v >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.3g} FLOP/s"


def plot_roofline(res, ax=None, title=None, half_rate: bool | None = None, program=None):
    """A matplotlib Figure: the machine's HBM and compute roofs and the kernel as a point.

    For a kernel without cube work (0 FLOP) a bar chart of the achieved HBM bandwidth against
    the HBM roof replaces the point.  `half_rate=True` also draws the fp32-input compute roof
    (half the fp16 peak); by default it is drawn when the matmuls of `program` (the kernel's
    `ck.program`, when given) read fp32 operands.
    """
    from .timeline import _figure_class
    n = roofline_numbers(res)
    if ax is None:
        fig = _figure_class()(figsize=(7.5, 4.2))
        ax = fig.add_subplot()
        fig.subplots_adjust(left=0.12, right=0.97, top=0.88, bottom=0.14)
    else:
        fig = ax.figure
    m = res.machine
    name = f"{res.kernel} on {m.name}"
    if not n["flops"]:
        _bandwidth_bars(ax, n, m)
        ax.set_title(title or f"{name}: vector-only kernel (0 FLOP) -- achieved HBM bandwidth vs the HBM roof",
                     fontsize=10)
        return fig
    import numpy as np
    bw, peak, ridge, ai = n["hbm_roof_bytes_per_s"], n["peak_flops"], n["ridge"], n["intensity"]
    lo = min(ai, ridge) / 16
    hi = max(ai, ridge) * 16
    xs = np.geomspace(lo, hi, 200)
    ax.loglog(xs, np.minimum(bw * xs, peak), color="#cccccc", linewidth=6, alpha=0.5, zorder=1)
    ax.loglog(xs[xs <= ridge * 4], (bw * xs)[xs <= ridge * 4], color="#4c78a8", linewidth=2,
              label=f"HBM roof: {m.hbm_gbps:.0f} GB/s x intensity", zorder=2)
    ax.loglog([ridge / 4, hi], [peak, peak], color="#e45756", linewidth=2,
              label=f"compute roof: cube peak {_fmt_flops(peak)} (fp16/bf16)", zorder=2)
    if half_rate is None:
        half_rate = fp32_cube(program)
    if half_rate:
        ax.loglog([ridge / 8, hi], [peak / 2, peak / 2], color="#e45756", linewidth=1.2, linestyle="--",
                  label=f"compute roof, fp32 operands: {_fmt_flops(peak / 2)}", zorder=2)
    ax.axvline(ridge, color="#999999", linestyle=":", linewidth=0.8)
    ax.text(ridge, peak * 1.15, f" ridge {ridge:.0f} FLOP/B", fontsize=8, color="#666666", va="bottom")
    y = n["flops_per_s"]
    ax.loglog([ai], [y], "o", color="#111111", markersize=8, zorder=3,
              label=f"{res.kernel}: {_fmt_flops(y)} at {ai:.3g} FLOP/B")
    ax.annotate(f"{_fmt_flops(y)}\n{100 * y / min(bw * ai, peak):.0f}% of the roof above",
                (ai, y), textcoords="offset points", xytext=(8, -22), fontsize=8)
    ax.set_xlim(lo, hi)
    ax.set_ylim(min(y, bw * lo) / 4, peak * 3)
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
    ax.set_ylabel("FLOP/s")
    ax.grid(True, which="major", linestyle=":", linewidth=0.5)
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    ax.set_title(title or f"{name}: roofline (bound: {n['bound']})", fontsize=10)
    return fig


def _bandwidth_bars(ax, n, m):
    roof, got = m.hbm_gbps, n["hbm_bytes_per_s"] / 1e9
    bars = ax.barh([1, 0], [roof, got], color=["#4c78a8", "#54a24b"], height=0.55)
    bars[0].set_label(f"HBM roof: {roof:.0f} GB/s")
    bars[1].set_label(f"achieved: {got:.1f} GB/s")
    ax.set_yticks([1, 0], ["HBM roof", "achieved"])
    ax.set_xlim(0, max(roof, got) * 1.25)
    ax.set_ylim(-0.6, 1.6)
    pct = 100 * got / roof if roof else 0.0
    ax.text(got, 0, f"  {got:.1f} GB/s ({pct:.0f}% of the roof)", va="center", fontsize=9)
    ax.text(roof, 1, f"  {roof:.0f} GB/s", va="center", fontsize=9)
    ax.set_xlabel("HBM bandwidth (GB/s)")
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    ax.text(0.99, 0.97, f"0 FLOP (no cube work); {n['hbm_bytes'] / 2**20:.2f} MiB moved in "
                        f"{n['seconds'] * 1e6:.2f} us; bound: {n['bound']}",
            transform=ax.transAxes, ha="right", va="top", fontsize=8, color="#555555")


def roofline_png(res, dpi: int = 80, **kw) -> bytes:
    from .static import fig_png
    return fig_png(plot_roofline(res, **kw), dpi)
