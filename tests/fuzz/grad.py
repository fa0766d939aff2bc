"""The gradient stage of the fuzzer: `pypto.grad` of random kernels against differences.

A case of the generator (`gen.from_seed`) whose tensors are all fp32 and finite is written as a
real kernel file and imported; its backward kernel (`pypto.grad` with respect to every input it
reads, a random cotangent for every output) is compiled and simulated as a user's would, and two
things are checked:
- the simulation against the backward kernel's own numpy reference (pypto's check, `res.ok`);
- the gradient rules: the backward graph evaluated in float64 (`eval64`: the registry's numpy
  references, op by op) against the directional central difference of sum(out * cotangent) along
  three random directions per input, on the traced forward graph also in float64.  It shares
  nothing with the rules, and no fp32 rounding blurs it (an ill-conditioned kernel's fp32
  gradient may differ from the exact one by more than any fixed tolerance).

Verdicts: `ok`; `wrong` (pypto's check fails, or a directional derivative differs from the
differences by more than 1e-5 of the sum of the magnitudes of its terms, or than ten times the
differences' own noise, |d(eps) - d(eps/4)|, or twenty times the loss's rounding over the step,
where those are larger); `refused` (a PyptoError at a kernel line: a gradient asked through
ops that pass none only, a backward group that does not fit); `unlocated` and `crash` (defects);
`kink` (no claim: the differences at eps and eps/4 disagree, the loss jumps or bends there (a
remainder, a floor, a max of equal values), or a gradient is not finite); `skip` (a case this stage
does not take).  Outputs that are not finite get no cotangent.

    python tests/fuzz/grad.py FIRST COUNT      # seeds FIRST .. FIRST+COUNT-1, a line per finding
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import traceback

import numpy as np

from pypto.errors import PyptoError
from pypto.ir.core import region_slices
from pypto.ir.ops import OPS

VERDICTS = ("ok", "wrong", "refused", "unlocated", "crash", "kink", "skip")


def eval64(g, arrays):
    """The outputs of traced graph `g` on float64 arrays, op by op with the registry's refs
    (sums and products accumulated in float64: the refs accumulate fp32 data in fp64 but
    float64 data in fp32)."""
    vals, outs = {}, {o: np.zeros(g.param(o).shape) for o in g.output_names}
    for n in g.nodes:
        if n.op == "input":
            vals[n.id] = arrays[n.attrs["param"]]
        elif n.op == "const":
            vals[n.id] = np.asarray(n.attrs["value"], np.float64 if n.dtype.is_float else np.int64)
        elif n.op == "store":
            outs[n.attrs["param"]][region_slices(n.attrs["offsets"], n.shape, n.attrs.get("steps"))] = \
                vals[n.inputs[0]]
        elif n.op in ("sum", "prod") and n.dtype.is_float:
            f = np.sum if n.op == "sum" else np.prod
            vals[n.id] = f(vals[n.inputs[0]], axis=n.attrs["dim"], keepdims=n.attrs["keepdim"], dtype=np.float64)
        else:
            with np.errstate(all="ignore"):
                r = np.asarray(OPS[n.op].ref([vals[i] for i in n.inputs], n.attrs))
            vals[n.id] = r.astype(np.float64) if n.dtype.is_float else r.astype(n.dtype.np_dtype)
    return outs


def _load(case, folder: str):
    path = os.path.join(folder, f"gradcase_{abs(hash(case.label))}.py")
    with open(path, "w") as f:
        f.write(case.source())
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.fuzz_kernel


def check(seed: int, folder: str | None = None) -> tuple[str, str]:
    """(verdict, detail) of the case of `seed` (see the module docstring)."""
    import pypto
    from fuzz.gen import from_seed
    case = from_seed(seed)
    if case.expect_error or any(i.dtype != "fp32" or i.specials for i in case.inputs) or \
            any(s.dtype != "fp32" for s in case.stores):
        return "skip", ""
    folder = folder or tempfile.mkdtemp(prefix="pypto_gradfuzz_")
    k = _load(case, folder)
    arrays = case.arrays()
    try:
        k.compile(*arrays, machine=case.machine)
    except PyptoError:
        return "skip", "the forward kernel does not compile"
    g = k._trace(k._specs(tuple(arrays)), {})
    outs = g.output_names
    used = {g.node(i).attrs["param"] for n in g.nodes for i in n.inputs if g.node(i).op == "input"}
    wrt = [i.name for i in case.inputs if i.name in used and i.name not in outs]
    if not wrt:
        return "skip", "no input read"
    rng = np.random.default_rng(seed)
    x64 = {n: a.astype(np.float64) for n, a in zip(case.params, arrays)}
    at = eval64(g, x64)
    # no cotangent where the output is not a finite number (there the derivative means nothing)
    cots = {o: np.where(np.isfinite(at[o]), rng.standard_normal(g.param(o).shape), 0.0).astype(np.float32)
            for o in outs}
    grad = pypto.grad(k, wrt=wrt)
    try:
        bk, bargs = grad.prepare(*arrays, cotangents=cots, machine=case.machine)
        ck = bk.compile(*bargs, machine=case.machine)
        res = ck.simulate(*bargs)
    except PyptoError as e:
        return ("refused" if e.loc is not None else "unlocated"), str(e).splitlines()[0]
    except Exception:  # noqa: BLE001 - any other exception is a defect to report
        return "crash", traceback.format_exc()[-1500:]
    if not res.ok:      # the backward kernel's simulation against its own numpy reference
        return "wrong", f"the backward kernel's check says MISMATCH: {res.check}"[:800]
    # the rules: the backward graph evaluated in float64 (no fp32 rounding: an ill-conditioned
    # kernel's gradient in fp32 may differ from the exact one by more than any fixed tolerance)
    b64 = {p.name: np.asarray(a).astype(np.float64) for p, a in zip(ck.traced.params, bargs)}
    exact = eval64(ck.traced, b64)
    got = {w: exact[n] for w, n in zip(wrt, bk.tensor_params[-len(wrt):])}
    if not all(np.isfinite(v).all() for v in got.values()):
        return "kink", "a gradient is not finite (a NaN or an infinity upstream: 0 * nan is nan)"

    def loss(xs):
        o = eval64(g, xs)
        return sum(float(np.sum(np.where(np.isfinite(o[n]), o[n], 0.0) * cots[n])) for n in outs)
    # the loss's own rounding (its terms' magnitude times float64's unit), which the differences
    # divide by the step: a loss of large constants (a masked_fill of -1e4) is known only so well
    magnitude = sum(float(np.sum(np.abs(np.where(np.isfinite(at[n]), at[n], 0.0) * cots[n]))) for n in outs)
    worst = 0.0
    at_loss = loss(x64)
    for name in wrt:
        for _ in range(3):
            u = rng.standard_normal(x64[name].shape)
            eps = 1e-8 * max(1.0, float(np.max(np.abs(x64[name]))))   # small: few elements cross a kink
            fd, mid = [], []
            for h in (eps, 0.25 * eps):
                up, down = dict(x64), dict(x64)
                up[name], down[name] = x64[name] + h * u, x64[name] - h * u
                lu, ld = loss(up), loss(down)
                fd.append((lu - ld) / (2 * h))
                mid.append(abs(0.5 * (lu + ld) - at_loss))
            # the loss at the point itself off both sides' (a where on x == c at exactly c): the
            # differences see one side, the rules the point; no claim there
            if max(mid) > 1e-6 * max(1.0, abs(at_loss)) + 1e3 * 2.0 ** -52 * magnitude:
                return "kink", f"the loss jumps at the point: {at_loss:.6g} vs {max(mid):.3g} off it"
            an = float(np.sum(got[name] * u))
            scale = max(1.0, abs(fd[0]), float(np.sum(np.abs(got[name]) * np.abs(u))))
            noise = abs(fd[0] - fd[1])         # the differences' own error (rounding, curvature)
            floor = 2.0 ** -52 * magnitude / eps
            if not np.isfinite(fd[0]) or noise > 1e-4 * scale + 20 * floor:
                return "kink", f"differences at eps and eps/4 disagree: {fd[0]:.4g} vs {fd[1]:.4g}"
            worst = max(worst, abs(fd[0] - an) / max(1e-5 * scale, 10 * noise, 20 * floor) * 1e-5)
    return ("ok" if worst < 1e-5 else "wrong"), f"{name}: error {worst:.2e} (1e-5: the tolerance)"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    first, count = int(argv[0]), int(argv[1])
    tally = dict.fromkeys(VERDICTS, 0)
    folder = tempfile.mkdtemp(prefix="pypto_gradfuzz_")
    for seed in range(first, first + count):
        verdict, detail = check(seed, folder)
        tally[verdict] += 1
        if verdict not in ("ok", "skip", "kink"):
            print(f"seed {seed}: {verdict}: {detail}", flush=True)
    print("gradient fuzz, seeds %d..%d: " % (first, first + count - 1)
          + ", ".join(f"{k} {v}" for k, v in tally.items()))
    return 1 if tally["wrong"] or tally["crash"] or tally["unlocated"] else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
