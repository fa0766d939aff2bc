"""pypto.nn end to end: Transformer(d_model=512, nhead=8, num_layers=6) on a (1, 128, 512) fp32
input.  Prints the wall-clock seconds of this machine (construction, first call: compile and
functional simulation, a second call: the cache, the timing simulation) and the simulated cycles
per layer on a2a3; with torch installed, the largest difference from torch's TransformerEncoder
loaded with the same state dict.  Run with `python benchmarks/nn.py [--machine a2a3]`."""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the pypto of this checkout

import pypto.nn as nn  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--machine", default="a2a3")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()

    t0 = time.perf_counter()
    m = nn.Transformer(d_model=512, nhead=8, num_layers=args.layers, seed=0).eval()
    t1 = time.perf_counter()
    x = np.random.default_rng(0).standard_normal((1, args.seq, 512)).astype(np.float32)
    prof = nn.profile_model(m, x, machine=args.machine)          # compile + functional + timing
    t2 = time.perf_counter()
    y = m.to(args.machine)(x)                                    # cached: no compile
    t3 = time.perf_counter()
    assert np.array_equal(y, prof.outputs)

    n_params = sum(p.size for p in m.parameters())
    print(f"pypto.nn.Transformer(512, 8, {args.layers}) on (1, {args.seq}, 512) fp32, "
          f"{n_params / 1e6:.2f} M parameters, machine {args.machine}")
    print(f"  construction              {t1 - t0:8.3f} s")
    print(f"  first call (profile_model) {t2 - t1:7.3f} s   (compile {prof.kernels[0]['compile_s']:.3f} s once, "
          f"run {prof.wall_s['run']:.3f} s, timing {prof.wall_s['timing']:.3f} s)")
    print(f"  second call (cached)      {t3 - t2:8.3f} s")
    print(f"  simulated                 {prof.cycles:8d} cycles = {prof.time_us:.1f} us "
          f"({len(prof.layers)} kernels, {prof.kernels[0]['instructions']} instructions each)")
    for layer in prof.layers:
        print(f"    {layer['name']:<22} {layer['cycles']:>8} cycles {layer['time_us']:>9.2f} us  {layer['bound']}")
    print("  busy cycles per unit: " + ", ".join(f"{u['unit']} {u['share']:.1f}%" for u in prof.units))
    print("  busiest ops:   " + ", ".join(f"{o['op']} {o['share']:.1f}%" for o in prof.ops[:6]))
    try:
        import torch
    except ImportError:
        return
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True)
    tm = torch.nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False).eval()
    tm.load_state_dict({k: torch.from_numpy(v) for k, v in m.state_dict().items()})
    with torch.no_grad():
        want = tm(torch.from_numpy(x)).numpy()
    print(f"  vs torch {torch.__version__}: max abs diff {np.abs(y - want).max():.3g} "
          f"(outputs of order {np.abs(want).max():.3g})")


if __name__ == "__main__":
    main()
