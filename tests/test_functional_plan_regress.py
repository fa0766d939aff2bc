"""Regressions of the functional simulator (issue 10, "no wrong answers, no crashes").

Each kernel runs through the batched plan (`mode="functional"`) and the reference interpreter
(`checked=True`); both are compared with numpy computed here, independently of the simulator:

- a negation batched over windows of a size-1 dim ([N, 1] columns): numpy's SIMD loop for
  `negative` wrote wrong elements into strided outputs (30 of 64 rows);
- broadcasting a tile of higher rank into a lower-rank destination ([4, 8, 1] against [8, 32]);
- long instruction streams (the plan's rewriting used to take quadratic time; here only their
  values are checked), reordered by levels of dependence and fused;
- fp16/bf16 rsqrt (and sums, products) rounded once, from fp32;
- malformed operands: a SimulationError at the instruction's line, never a raw numpy error.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pypto
from pypto.errors import PyptoError, SimulationError
from pypto.ir.program import Program
from pypto.sim.functional_plan import plan_for
from pypto.target import isa, semantics

BF16 = np.dtype(ml_dtypes.bfloat16)


def both_ways(ck, *args) -> list[dict[str, np.ndarray]]:
    """The outputs of the plan and of the reference interpreter (the plan must exist)."""
    assert plan_for(ck.program, ck.machine) is not None
    return [ck.simulate(*args, mode="functional", checked=checked).outputs for checked in (False, True)]


def tile_kernel(tiles, body):
    @pypto.jit
    def k(x, out):
        pypto.set_vec_tile_shapes(*tiles)
        out[:] = body(x)
    return k


BODIES = {
    "neg": (lambda x: -x, lambda x: -x),
    "neg_amax": (lambda x: -pypto.amax(x, dim=-1, keepdim=True), lambda x: -x.max(-1, keepdims=True)),
    "neg_sum": (lambda x: -pypto.sum(x, dim=-1, keepdim=True),
                lambda x: -x.sum(-1, keepdims=True, dtype=np.float64)),
    "exp_sub": (lambda x: pypto.exp(x - 1.0), lambda x: np.exp(x - np.float32(1.0))),
}


@pytest.mark.parametrize("machine", ["a2a3", "teach"])
@pytest.mark.parametrize("shape,tiles", [((64, 1), (1, 1)), ((64, 1), (8,)), ((64, 1), (1, 8)),
                                         ((64, 1), (2, 1)), ((17, 1), (1, 1)), ((1, 64), (1, 8)),
                                         ((3, 5, 1), (1, 1, 1)), ((3, 5, 1), (8,)), ((40, 3), (1, 8))])
@pytest.mark.parametrize("body", sorted(BODIES))
def test_size_one_dims_batched(machine, shape, tiles, body):
    """Windows of a size-1 dim, batched over tasks and fused over tiles, against numpy."""
    f, ref = BODIES[body]
    x = np.random.default_rng(1).random(shape).astype(np.float32)
    want = ref(x).astype(np.float32)
    ck = tile_kernel(tiles, f).compile(x, np.zeros(want.shape, np.float32), machine=machine)
    for got in both_ways(ck, x, np.zeros_like(want)):
        np.testing.assert_allclose(got["out"], want, rtol=1e-5, atol=1e-6)


def test_negative_into_strided_outputs():
    """TNEG's handler is right for every input and output stride (numpy's own loop is not)."""
    neg = isa.row("TNEG").semantics
    for dtype in (np.float32, np.float64, np.int32, np.float16):
        for si in range(1, 10):
            for so in range(1, 10):
                x = (np.arange(17 * si) + 1).astype(dtype)
                out = np.zeros(17 * so, dtype)
                neg(x[::si], out=out[::so])
                np.testing.assert_array_equal(out[::so], -x[::si])


@pytest.mark.parametrize("xs,ys", [((8, 1), (1, 32)), ((4, 8, 1), (8, 32)), ((2, 8, 1), (2, 1, 32)),
                                   ((1, 32), (8, 1)), ((8, 1), (32,)), ((32,), (8, 1)), ((2, 8, 1), (32,))])
def test_broadcast_both_ways(xs, ys):
    """Both operands broadcast, also against a lower-rank [N]: plan and interpreter exact."""
    rng = np.random.default_rng(2)
    x, y = rng.random(xs).astype(np.float32), rng.random(ys).astype(np.float32)

    @pypto.jit
    def k(x, y, out):
        out[:] = x - y
    out = np.zeros(np.broadcast_shapes(xs, ys), np.float32)
    for got in both_ways(k.compile(x, y, out), x, y, out):
        np.testing.assert_array_equal(got["out"], x - y)


def test_malformed_instruction_is_a_simulation_error():
    """A hand-edited program whose operands do not combine: SimulationError at its line, in the
    plan and in the interpreter."""
    @pypto.jit
    def k(x, y, out):
        out[:] = x + y
    x = np.ones((16, 64), np.float32)
    ck = k.compile(x, x, x)
    text = ck.program.text()
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("TADD"))
    first = line.index("fp32[", line.index(","))          # the first source tile's shape
    bad = line[:first] + "fp32[8,64]" + line[line.index("]", first) + 1:]
    program = Program.parse(text.replace(line, bad))
    for check in (False, True):
        with pytest.raises(SimulationError) as err:
            pypto.sim.simulate(program, x, x, np.zeros_like(x), machine=ck.machine, mode="functional",
                               check=check)
        assert err.value.loc is not None and "TADD" in str(err.value)


def test_wrong_array_size_is_an_error():
    @pypto.jit
    def k(x, out):
        out[:] = -x
    x = np.ones((8, 8), np.float32)
    ck = k.compile(x, x)
    with pytest.raises(PyptoError):
        pypto.sim.simulate(ck.program, np.ones(7, np.float32), x, machine=ck.machine, mode="functional")


@pytest.mark.parametrize("machine", ["a2a3", "teach"])
def test_long_row_reduction(machine):
    """One task of some 3,000 instructions (a chain through the accumulator)."""
    @pypto.jit
    def k(x, out):
        pypto.set_vec_tile_shapes(1, 8)
        out[:] = pypto.sum(x, dim=-1, keepdim=True)
    x = np.random.default_rng(4).random((1, 8 * 600)).astype(np.float32)
    out = np.zeros((1, 1), np.float32)
    for got in both_ways(k.compile(x, out, machine=machine), x, out):
        np.testing.assert_allclose(got["out"], x.sum(dtype=np.float64, keepdims=True, axis=-1), rtol=1e-5)


@pytest.mark.parametrize("shape,tiles", [((2, 800), (1, 8)), ((3, 96), (2, 16)), ((40, 64), (8, 8))])
def test_long_streams_softmax_layernorm(shape, tiles):
    """Reductions, broadcasts and element-wise chains over many tiles: reordered by dependence
    levels and fused, against numpy."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape).astype(np.float32)
    w, b = rng.standard_normal(shape[-1:]).astype(np.float32), rng.standard_normal(shape[-1:]).astype(np.float32)

    @pypto.jit
    def sm(x, out):
        pypto.set_vec_tile_shapes(*tiles)
        m = pypto.amax(x, dim=-1, keepdim=True)
        e = pypto.exp(x - m)
        out[:] = e / pypto.sum(e, dim=-1, keepdim=True)

    @pypto.jit
    def ln(x, w, b, out):
        pypto.set_vec_tile_shapes(*tiles)
        out[:] = pypto.layernorm(x, w, b)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    mu, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    cases = [(sm, (x,), e / e.sum(-1, keepdims=True)), (ln, (x, w, b), (x64 - mu) / np.sqrt(var + 1e-5) * w + b)]
    for kernel, ins, want in cases:
        out = np.zeros(shape, np.float32)
        ck = kernel.compile(*ins, out)
        for got in both_ways(ck, *ins, out):
            np.testing.assert_allclose(got["out"], want, rtol=1e-4, atol=1e-5)


def test_fused_stream_is_short():
    """An element-wise chain over one long row: the plan's calls are far fewer than the
    instructions (the loop over tiles fused), and right."""
    @pypto.jit
    def k(x, out):
        pypto.set_vec_tile_shapes(1, 8)
        out[:] = pypto.exp(x) * 2.0 + 1.0
    x = np.random.default_rng(6).random((1, 8 * 400)).astype(np.float32)
    ck = k.compile(x, np.zeros_like(x), machine="teach")
    plan = plan_for(ck.program, ck.machine)
    assert len(plan.ops) * 10 < sum(len(t.instrs) for t in ck.program.tasks)
    for got in both_ways(ck, x, np.zeros_like(x)):
        np.testing.assert_allclose(got["out"], np.exp(x) * 2 + 1, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["fp16", "bf16"])
def test_low_precision_rounded_once(dtype):
    """rsqrt, sums and matmul products of fp16/bf16 are computed in fp32 and rounded once."""
    x = np.random.default_rng(7).uniform(0.1, 4.0, (16, 64)).astype(dtype)
    once = (1 / np.sqrt(x.astype(np.float32))).astype(dtype)
    rsqrt = isa.row("TRSQRT").semantics
    np.testing.assert_array_equal(rsqrt(x).view(np.uint16), once.view(np.uint16))
    out = np.zeros((16, 128), dtype)[:, ::2]
    rsqrt(x, out=out)
    np.testing.assert_array_equal(out.view(np.uint16), once.view(np.uint16))
    ones = np.ones((1, 4096), dtype)
    total = isa.row("TROWSUM").semantics(ones, axis=-1, keepdims=True)
    assert total.dtype == dtype and float(total[0, 0]) == 4096.0
    a, b = x[:, :32], x[:, 32:].T
    prod = semantics.product(np.dtype(dtype))(a, b)
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(dtype)
    np.testing.assert_array_equal(prod.view(np.uint16), want.view(np.uint16))


def test_plan_error_is_reported_not_hidden():
    """A numpy error inside a plan is the plan's bug: a SimulationError naming the instruction,
    not a silent rerun on the interpreter."""
    @pypto.jit
    def k(x, out):
        out[:] = -x
    x = np.ones((16, 64), np.float32)
    ck = k.compile(x, x)
    plan = plan_for(ck.program, ck.machine)

    def broken(*args):
        raise ValueError("operands could not be broadcast together")
    saved = plan.ops[0]
    plan.ops[0] = (broken, saved[1])
    try:
        with pytest.raises(SimulationError, match="functional plan failed") as err:
            ck.simulate(x, np.zeros_like(x), mode="functional")
        assert err.value.loc is not None
    finally:
        plan.ops[0] = saved
