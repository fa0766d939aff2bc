"""Dynamic shapes: one compile of a kernel with a pypto.DYNAMIC dim serves every size.

For softmax, an element-wise kernel, layernorm and a matmul with dynamic rows, prints per size:
the simulated cycles of the dynamic kernel (its one compile for a chunk of rows, run as many
times as the call needs) against the kernel compiled for that very size, and the time to
compile each.  The dynamic kernel's cache holds one entry at the end.

    python benchmarks/dynamic_shapes.py [--sizes 1,7,1000,8192]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import pypto  # noqa: E402

D, F = pypto.DYNAMIC, pypto.DT_FP32
W = 1024


def kernels():
    def softmax(x: pypto.Tensor([D, W], F), out: pypto.Tensor([D, W], F)):
        out[:] = pypto.softmax(x, dim=-1)

    def gelu(x: pypto.Tensor([D, W], F), out: pypto.Tensor([D, W], F)):
        out[:] = pypto.gelu(x) * 2.0

    def layernorm(x: pypto.Tensor([D, W], F), g, b, out: pypto.Tensor([D, W], F)):
        out[:] = pypto.layernorm(x, g, b)

    def matmul(x: pypto.Tensor([D, W], pypto.DT_FP16), w, out: pypto.Tensor([D, 512], pypto.DT_FP16)):
        out[:] = pypto.matmul(x, w)

    def args(name, n, rng):
        x = rng.standard_normal((n, W)).astype(np.float16 if name == "matmul" else np.float32)
        if name == "layernorm":
            return x, np.ones(W, np.float32), np.zeros(W, np.float32), np.zeros_like(x)
        if name == "matmul":
            return x, (rng.standard_normal((W, 512)) / 32).astype(np.float16), np.zeros((n, 512), np.float16)
        return x, np.zeros_like(x)
    return [(f.__name__, f) for f in (softmax, gelu, layernorm, matmul)], args


def static(fn):
    """The same kernel without its annotations: compiled for each size."""
    plain = lambda *a, **k: fn(*a, **k)          # noqa: E731
    plain.__name__ = fn.__name__
    import inspect
    plain.__signature__ = inspect.Signature([p.replace(annotation=inspect.Parameter.empty)
                                             for p in inspect.signature(fn).parameters.values()])
    return plain


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,7,1000,8192")
    a = ap.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")]
    rng = np.random.default_rng(0)
    found, make = kernels()
    print(f"{'kernel':<10} {'rows':>6} {'dynamic cycles':>15} {'static cycles':>14} {'ratio':>6} "
          f"{'dyn compile s':>13} {'static compile s':>16} {'outputs':>8}")
    for name, fn in found:
        dyn = pypto.jit(fn)
        t = time.perf_counter()
        ck = dyn.compile(*make(name, sizes[0], rng))
        dyn_compile = time.perf_counter() - t
        for n in sizes:
            args = make(name, n, rng)
            res = ck.simulate(*args)
            st = pypto.jit(static(fn))
            t = time.perf_counter()
            sck = st.compile(*args)
            st_compile = time.perf_counter() - t
            sres = sck.simulate(*args, mode="timing")
            print(f"{name:<10} {n:>6} {res.cycles:>15,} {sres.cycles:>14,} {res.cycles / sres.cycles:>6.2f} "
                  f"{dyn_compile:>13.2f} {st_compile:>16.2f} {'ok' if res.ok else 'WRONG':>8}")
            dyn_compile = 0.0
        print(f"{'':<10} cache_size after {len(sizes)} sizes: {dyn.cache_size}")


if __name__ == "__main__":
    main()
