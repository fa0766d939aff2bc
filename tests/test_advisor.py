"""The advisor (`pypto.advise`): its top suggestion, applied, gives the cycles it claims and the
right numbers, on kernels bound by different resources; a kernel at its bound gets none."""
import numpy as np
import pytest

import pypto
from pypto.tuning.advisor import advise, relevant_options

T = pypto.Tensor
F32, F16 = pypto.DT_FP32, pypto.DT_FP16
rng = np.random.default_rng(7)


@pypto.jit
def softmax_split(x, out, *, TM: int = 8, TN: int = 256):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = pypto.softmax(x)


@pypto.jit
def softmax_few(x, out, *, TM: int = 16):
    pypto.set_vec_tile_shapes(TM, 1024)
    out[:] = pypto.softmax(x)


@pypto.jit
def activations(x, out, *, TM: int = 2, TN: int = 64):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = pypto.gelu(pypto.exp(x) * pypto.sigmoid(x)) + pypto.silu(x)


@pypto.jit
def matmul_small(a, b, c, *, ML0: int = 32, NL0: int = 32, KL0: int = 32):
    pypto.set_cube_tile_shapes([ML0, ML0], [KL0, 4 * KL0], [NL0, NL0])
    c[:] = pypto.matmul(a, b)


@pypto.jit
def matmul_gelu(a, b, bias, c, *, VM: int = 8, VN: int = 64):
    pypto.set_cube_tile_shapes([128, 128], [64, 256], [128, 128])
    pypto.set_vec_tile_shapes(VM, VN)
    c[:] = pypto.gelu(pypto.matmul(a, b) + bias)


def arrays(*specs):
    out = []
    for shape, dt in specs:
        a = rng.standard_normal(shape).astype(np.float16 if dt is F16 else np.float32)
        out.append(a * (0.25 if dt is F16 else 1.0))
    return out


CASES = {
    # kernel, arguments, the bound the stats name before the advice
    "HBM-bound softmax (the row split in 4)": (softmax_split, [((1024, 1024), F32)] * 2, "HBM bandwidth"),
    "vector-bound softmax (2 tasks for 48 cores)": (softmax_few, [((32, 1024), F32)] * 2, "vector compute"),
    "dependency-bound activations (tiny tiles)": (activations, [((256, 256), F32)] * 2, "dependencies"),
    "MTE2-bound matmul (32x32 cube tiles)": (matmul_small, [((512, 512), F16)] * 3, "AIC.MTE2 pipe"),
    "mixed cube/vector (narrow epilogue tiles)": (matmul_gelu, [((256, 512), F16), ((512, 512), F16), ((512,), F16),
                                                                ((256, 512), F16)], "dependencies"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_top_suggestion_applied_gives_the_cycles_it_claims_and_right_numbers(case):
    kernel, specs, bound = CASES[case]
    args = arrays(*specs)
    ck = kernel.compile(*args)
    res = ck.simulate(*args)
    assert res.stats["bound"] == bound
    adv = res.advise()
    assert adv.cycles == res.cycles and adv.bound == bound
    best = adv.best
    assert best is not None, adv.text()
    assert best.cycles <= res.cycles * 0.98 and best.gain_pct >= 2.0
    assert [s.cycles for s in adv.suggestions] == sorted(s.cycles for s in adv.suggestions)
    applied = best.compile(*args)
    got = applied.simulate(*args)
    assert got.cycles == best.cycles                      # the claim is a measurement
    assert got.ok, got.summary()                          # and the numbers are still right
    ref = kernel.compile(*args).reference(*args)
    for name, want in ref.items():
        assert np.allclose(got.outputs[name].astype(np.float64), want.astype(np.float64), rtol=2e-2, atol=2e-2)
    assert all(s.kind != "precision" for s in adv.suggestions)


def test_the_suggested_changes_are_the_expected_ones():
    x = T([1024, 1024], F32)
    adv = advise(softmax_split.compile(x, x))
    assert adv.best.consts == {"TM": 8, "TN": 1024}               # the whole row in one tile
    assert adv.best.cycles == 9800 and adv.cycles == 15245
    assert "HBM 12.01 MiB -> 8.00 MiB" in adv.best.why             # the row read once, not 1.5 times
    ev = {e.label: e.text for e in adv.evidence}
    assert "1.5x the 8.00 MiB its tensors hold" in ev["HBM"]
    assert ev["waves"] == "144 AIV tasks on 48 cores: 3 waves"
    few = advise(softmax_few.compile(T([32, 1024], F32), T([32, 1024], F32)))
    assert {e.text for e in few.evidence if e.label == "waves"} == {"2 AIV tasks on 48 cores: 46 cores idle"}
    assert few.best.consts == {"TM": 2}                           # more tasks for the idle cores
    assert "tasks 2 -> 16" in few.best.why


def test_a_kernel_at_its_bound_gets_no_suggestion():
    x = T([1024, 1024], F32)
    adv = advise(softmax_split.compile(x, x, TN=1024))
    assert adv.bound == "HBM bandwidth"
    assert adv.suggestions == [] and adv.best is None
    assert "no suggestion: none of the" in adv.text()
    # fp16 inputs move half the bytes: faster, but other numbers, so listed apart
    assert adv.precision and all(s.kind == "precision" for s in adv.precision)
    assert adv.precision[0].dtypes == {"x": "fp16", "out": "fp16"} and adv.precision[0].cycles < adv.cycles
    ck16 = adv.precision[0].compile()
    assert [p.dtype.name for p in ck16.params] == ["fp16", "fp16"]
    assert ck16.simulate(mode="timing").cycles == adv.precision[0].cycles


def test_options_that_cannot_change_a_vector_kernel_are_not_tried():
    x = T([64, 256], F32)
    names = relevant_options(softmax_split.compile(x, x))
    assert "loops" not in names and "pairing" not in names and "l1_reuse" not in names
    assert "autocast" not in names                  # no fp16 or bf16 in it
    a, b, c = T([128, 128], F16), T([128, 128], F16), T([128, 128], F16)
    assert {"pairing", "l1_reuse", "autocast"} <= set(relevant_options(matmul_small.compile(a, b, c)))


def test_turning_autocast_off_is_a_precision_change_not_a_suggestion():
    specs = [((256, 512), F16), ((512, 512), F16), ((512,), F16), ((256, 512), F16)]
    adv = advise(matmul_gelu.compile(*[T(list(s), d) for s, d in specs]))
    assert all("autocast" not in s.title for s in adv.suggestions)
    assert any("autocast" in s.title for s in adv.precision)
    assert "with other numerics" in adv.text()


def test_advice_renders_as_text_and_html():
    x = T([1024, 1024], F32)
    adv = advise(softmax_split.compile(x, x))
    text = adv.text()
    assert text.startswith("advice for softmax_split on a2a3: 15,245 cycles, bound: HBM bandwidth")
    assert "1. TN=1024 (now 256): 9,800 cycles, 35.7% fewer (1.56x)" in text
    html = adv._repr_html_()
    assert "<b>bound: HBM bandwidth</b>" in html and "TN=1024 (now 256)" in html and "9,800" in html


def test_advice_needs_a_kernel_to_recompile():
    from pypto.sim import simulate
    x = np.ones((64, 256), np.float32)
    ck = softmax_split.compile(x, x)
    res = simulate(ck.program, x, x.copy(), mode="timing")
    with pytest.raises(pypto.PyptoError, match="a program simulated alone"):
        res.advise()
