"""The functional plan reads a matmul's factors straight from GM: an L1 panel loaded from a GM
window and read only through blocks extracted from it (TEXTRACT) is dropped, each block read as
the window of GM it holds (`functional_plan._sub_window`); and fp16 factors read from a buffer the
program never writes come from one fp32 copy of that buffer made per run, not converted again by
every matmul (`_widened_factors`).  Outputs stay bit-identical to the reference interpreter and to
the instruction-by-instruction oracle; the streams below are the cases where the panel must stay."""
from __future__ import annotations

import numpy as np
import pytest

import pypto
from pypto.ir.core import Attrs
from pypto.ir.exec import ExecTask, Instr, TileRef
from pypto.ir.gm import GMBuffer, GMRef
from pypto.ir.program import Program
from pypto.sim.functional_plan import plan_for
from pypto.target.machine import get_machine

from common import matmul
from test_functional_fast import check_same

F16, F32 = pypto.DT_FP16, pypto.DT_FP32
PIPES = {"TLOAD": "MTE2", "TEXTRACT": "MTE1", "TMATMUL": "M", "TMATMUL_ACC": "M", "TSTORE": "FIX"}

M, K, N = 32, 64, 32
A = GMBuffer("a", (M, K), F16, "input")
B = GMBuffer("b", (K, N), F16, "input")
C = GMBuffer("c", (M, N), F32, "output")
D = GMBuffer("d", (M, 48), F16, "input")
E = GMBuffer("e", (M, N), F32, "input")
PA = TileRef("L1", 0, F16, (M, K), (M, K))              # panels: a whole, b whole
PB = TileRef("L1", 0x1000, F16, (K, N), (K, N))
ACC = TileRef("L0C", 0, F32, (M, N), (M, N))


def l0(space: str, k: int) -> TileRef:
    return TileRef(space, k * 0x800, F16, (32, 32), (32, 32))


def ins(op: str, dst, *srcs, **attrs) -> Instr:
    return Instr(op, PIPES[op], dst, srcs, Attrs(attrs))


def whole(buf: GMBuffer) -> GMRef:
    return GMRef.whole(buf)


def extract(dst, panel, r, c) -> Instr:
    return ins("TEXTRACT", dst, panel, offsets=(r, c))


def two_steps(between=(), pa=PA, load_a=None):
    """c = a @ b in two K steps of 32, each block extracted from the panels; `between` runs after
    the first step."""
    return [ins("TLOAD", pa, load_a or whole(A)), ins("TLOAD", PB, whole(B)),
            extract(l0("L0A", 0), pa, 0, 0), extract(l0("L0B", 0), PB, 0, 0),
            ins("TMATMUL", ACC, l0("L0A", 0), l0("L0B", 0)),
            *between,
            extract(l0("L0A", 1), pa, 0, 32), extract(l0("L0B", 1), PB, 32, 0),
            ins("TMATMUL_ACC", ACC, ACC, l0("L0A", 1), l0("L0B", 1)),
            ins("TSTORE", whole(C), ACC)]


def program(stream) -> Program:
    return Program("panels", (A, B, C, D, E), (ExecTask(0, 0, "AIC", (), 0, tuple(stream)),))


def arrays(rng):
    return {"a": rng.standard_normal((M, K)).astype(np.float16), "b": rng.standard_normal((K, N)).astype(np.float16),
            "d": rng.standard_normal((M, 48)).astype(np.float16), "e": rng.standard_normal((M, N)).astype(np.float32)}


def l1_writes(plan) -> int:
    return sum(1 for _, specs in plan.ops if getattr(specs[0], "key", None) == "L1")


def test_panel_blocks_read_from_gm(rng):
    p = program(two_steps())
    plan = plan_for(p, get_machine("a2a3"))
    assert l1_writes(plan) == 0                             # both panels' loads dropped
    factors = [s for _, specs in plan.ops for s in specs[-2:] if getattr(s, "key", None)
               and s.key[0] == "GM"]
    assert {s.key for s in factors} == {("GM", "a", "widened"), ("GM", "b", "widened")}
    assert all(s.dtype == np.float32 for s in factors)
    assert plan.widened == {"a": np.float32, "b": np.float32}
    x = arrays(rng)
    got = check_same(p, "a2a3", x)["c"]
    np.testing.assert_allclose(got, x["a"].astype(np.float64) @ x["b"].astype(np.float64), rtol=1e-5, atol=1e-4)


def test_a_panel_overwritten_in_part_before_its_last_block(rng):
    """A tail load over the panel's second half before that half's block is extracted: the block
    is the new data (b's, read from b), and the panel's load is dropped (its rest is never read)."""
    p = program(two_steps(between=[ins("TLOAD", TileRef("L1", 0x40, F16, (M, K), (M, 32)), GMRef(B, 0, (M, 32), (N, 1)))]))
    assert l1_writes(plan_for(p, get_machine("a2a3"))) == 0
    check_same(p, "a2a3", arrays(rng))


def test_a_panel_whose_rest_is_overwritten_before_it_is_read(rng):
    """As above, then a tail load over the panel's first half and a block of that: the panel's
    old bytes are all overwritten before anything reads them, so its load is still dropped."""
    lo = TileRef("L1", 0, F16, (M, K), (M, 32))
    acc2 = TileRef("L0C", 0x1000, F32, (M, N), (M, N))
    p = program([*two_steps(between=[ins("TLOAD", TileRef("L1", 0x40, F16, (M, K), (M, 32)), GMRef(B, 0, (M, 32), (N, 1)))]),
                 ins("TLOAD", lo, GMRef(D, 0, (M, 32), (48, 1))), extract(l0("L0A", 0), lo, 0, 0),
                 extract(l0("L0B", 0), PB, 0, 0), ins("TMATMUL", acc2, l0("L0A", 0), l0("L0B", 0)),
                 ins("TSTORE", GMRef(C, 0, (M, N), (N, 1)), acc2)])
    assert l1_writes(plan_for(p, get_machine("a2a3"))) == 0
    check_same(p, "a2a3", arrays(rng))


# a panel whose data a block would no longer find in GM, or whose blocks are not windows of GM
MUST_STAY = {
    # a tail load over the panel's first half; the second block reads the other half, the old data
    "rest-read-after-a-partial-overwrite": lambda: two_steps(between=[
        ins("TLOAD", TileRef("L1", 0, F16, (M, K), (M, 32)), GMRef(B, 0, (M, 32), (N, 1)))]),
    # the panel's source window is overwritten in GM after the load: the block is the old data
    "source-overwritten": lambda: two_steps(between=[ins("TSTORE", GMRef(A, 32, (M, 32), (K, 1)), ACC)]),
    # a tail panel (48 of 64 columns loaded, from d, over a whole one of a): the second block reads
    # 16 columns past it, which hold a's
    "block-past-a-tail-panel": lambda: [ins("TLOAD", PA, whole(A)), *two_steps(
        pa=TileRef("L1", 0, F16, (M, K), (M, 48)), load_a=GMRef(D, 0, (M, 48), (48, 1)))],
}


def test_a_written_buffer_is_read_as_it_is_then(rng):
    """A factor buffer the program writes (before the matmul reads it) is converted per matmul:
    a copy made when the run starts would hold the values from before the write."""
    p = program([ins("TLOAD", ACC, whole(E)), ins("TSTORE", GMRef(A, 32, (M, 32), (K, 1)), ACC), *two_steps()])
    plan = plan_for(p, get_machine("a2a3"))
    assert l1_writes(plan) == 0 and plan.widened == {"b": np.float32}
    check_same(p, "a2a3", arrays(rng))


def test_a_block_read_from_gm_is_read_before_a_later_write(rng):
    """The second block, read from a's window in GM, is read before a store over that window (the
    plan orders its numpy calls by what they touch: the block's window, not the panel's)."""
    acc2 = TileRef("L0C", 0x1000, F32, (M, N), (M, N))
    p = program([*two_steps(), ins("TLOAD", acc2, whole(E)), ins("TSTORE", GMRef(A, 32, (M, 32), (K, 1)), acc2)])
    plan = plan_for(p, get_machine("a2a3"))
    assert l1_writes(plan) == 0
    check_same(p, "a2a3", arrays(rng))


@pytest.mark.parametrize("name", list(MUST_STAY))
def test_panels_that_must_stay(name, rng):
    p = program(MUST_STAY[name]())
    plan = plan_for(p, get_machine("a2a3"))
    assert l1_writes(plan) >= 1
    x = arrays(rng)
    check_same(p, "a2a3", x)
    if name == "source-overwritten":                        # a buffer the program writes: no copy of it
        assert "a" not in plan.widened


def test_small_reads_of_a_large_buffer_are_converted_per_matmul(rng):
    """A copy of the whole buffer pays only when the factors read as many elements as it has."""
    big = GMBuffer("a", (M, 4 * K), F16, "input")
    src = GMRef(big, 0, (M, K), (4 * K, 1))
    stream = [ins("TLOAD", PA, src), *two_steps()[1:]]
    p = Program("panels", (big, B, C), (ExecTask(0, 0, "AIC", (), 0, tuple(stream)),))
    plan = plan_for(p, get_machine("a2a3"))
    assert l1_writes(plan) == 0 and "a" not in plan.widened and plan.widened == {"b": np.float32}
    x = {"a": rng.standard_normal((M, 4 * K)).astype(np.float16), "b": arrays(rng)["b"]}
    check_same(p, "a2a3", x)


@pytest.mark.parametrize("dt", [np.float16, np.float32], ids=["fp16", "fp32"])
def test_compiled_matmul_with_panels(dt, rng):
    """A compiled matmul whose L1 panels hold two K blocks (KL1 = 2 KL0), with and without tail
    tiles: no full panel is loaded, and the outputs are the interpreter's bits."""
    for m, k, n in [(256, 512, 384), (200, 320, 136)]:
        a = rng.standard_normal((m, k)).astype(dt)
        b = rng.standard_normal((k, n)).astype(dt)
        d = F16 if dt == np.float16 else F32
        ck = matmul.compile(pypto.Tensor([m, k], d), pypto.Tensor([k, n], d), pypto.Tensor([m, n], d),
                            machine="a2a3", ML0=128, NL0=128, KL0=64, KL1=128)
        plan = plan_for(ck.program, get_machine("a2a3"))
        full = sum(1 for _, specs in plan.ops if getattr(specs[0], "key", None) == "L1"
                   and specs[1].shape[-2:] == specs[0].shape[-2:] and (m, k, n) == (256, 512, 384))
        assert full == 0
        assert bool(plan.widened) == (dt == np.float16)
        got = check_same(ck.program, "a2a3", {"a": a, "b": b})["c"]
        tol = 3e-2 if dt == np.float16 else 1e-4
        np.testing.assert_allclose(got.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64),
                                   rtol=tol, atol=tol * 10)
