"""The timing engines read a program with loops, one read from its text, without unrolling it
(`timing.Decoder`): the instructions of the text are decoded once and every iteration's row and
GM window worked out from their steps (a flag's event id moves around its 8 ids, a transfer's
window by its offset; tiles moving on the chip change no row).

What must hold: the rows (op kind, pipe, cycles, flag key, bytes, path, bandwidth, window) of
every instruction run, the FLOPs, and the run's cycles and stats are those of the unrolled
instructions, and no instruction is made (nor for the run's trace, whose pipes, ops and source
lines the compiled engine reads off the text: `ir.exec.run_sources`)."""
from __future__ import annotations

import pytest

import pypto
from pypto.ir.exec import has_loops
from pypto.sim.timing import Decoder
from pypto.target.machine import get_machine

from common import matmul, softmax

F16, F32 = pypto.DT_FP16, pypto.DT_FP32
T = pypto.Tensor


def _hand(body: str) -> str:
    return ("// PTO program k: 1 tasks\n.gm x fp32[64,256] input\n.gm out fp32[64,256] output\n"
            ".task 0 AIV group=0 deps=[]\n" + body)


# 4 x 4 row blocks, loops nested: the outer step moves the flags 3 ids (they wrap past EVENT_ID7)
# and the window 4 blocks on; the inner one walks a ring of four UB slots, one id and block each
NESTED = _hand("""  .loop 4
    .loop 4
      TLOAD              UB[0x0]:fp32[4,256], GM:x[0:4,0:256], gm_step=(4096,1024), addr_step=((0),(4096)), addr_ring=(0x0:0x4000)
      SET_FLAG           MTE2 -> V, EVENT_ID5, event_step=(3,1)
      WAIT_FLAG          MTE2 -> V, EVENT_ID5, event_step=(3,1)
      TADDS              UB[0x4000]:fp32[4,256], UB[0x0]:fp32[4,256], 1.0, addr_step=((0,0),(0,4096)), addr_ring=(-,0x0:0x4000)
      SET_FLAG           V -> MTE3, EVENT_ID0, event_step=(-3,-1)
      WAIT_FLAG          V -> MTE3, EVENT_ID0, event_step=(-3,-1)
      TSTORE             GM:out[0:4,0:256], UB[0x4000]:fp32[4,256], gm_step=(4096,1024)
    .endloop
  .endloop
""")


def _mm():
    return matmul.compile(T([512, 2048], F16), T([2048, 512], F16), T([512, 512], F16), machine="a2a3",
                          ML0=128, NL0=128, KL0=64, KL1=128)


def _sm():
    return softmax.compile(T([8192, 512], F32), T([8192, 512], F32), machine="a2a3", TM=8, TN=512)


def _decoded_both_ways(text: str):
    """(the rows of every task of the program `text`, decoded from its loops, and from its
    instructions made first; the FLOPs each way; the program decoded from its loops)."""
    looped, made = pypto.Program.parse(text, machine="a2a3"), pypto.Program.parse(text, machine="a2a3")
    for t in made.tasks:
        assert len(t.instrs) == t.n_instrs
    machine = get_machine("a2a3")
    a, b = Decoder(machine), Decoder(machine)
    rows_a = [a.task(t, looped) for t in looped.tasks]
    rows_b = [b.task(t, made) for t in made.tasks]
    return rows_a, rows_b, a.flops, b.flops, looped


@pytest.mark.parametrize("case", ["nested", "matmul", "softmax"])
def test_loops_decode_to_the_rows_of_their_instructions(case):
    text = NESTED if case == "nested" else (_mm() if case == "matmul" else _sm()).program.text()
    rows_a, rows_b, flops_a, flops_b, looped = _decoded_both_ways(text)
    assert rows_a == rows_b and flops_a == flops_b
    assert sum(map(len, rows_a)) == len(looped)
    assert any(has_loops(t.code) for t in looped.tasks)
    assert not any("instrs" in t.__dict__ for t in looped.tasks if has_loops(t.code))    # none made
    if case == "nested":        # the flags' ids as the loops move them, wrapping around the 8
        sets = [r[3][2] for r in rows_a[0] if r[3] is not None and r[3][:2] == ("MTE2", "V")][::2]
        assert sets == [(5 + 3 * i + j) % 8 for i in range(4) for j in range(4)]
        assert [r[7].offset for r in rows_a[0] if r[7] is not None][:4] == [0, 0, 1024, 1024]
        assert flops_a == 0
    if case == "matmul":
        assert flops_a == 2 * 512 * 2048 * 512


@pytest.mark.parametrize("make", [_mm, _sm], ids=["matmul", "softmax"])
@pytest.mark.parametrize("engine", ["compiled", "python"])
def test_a_parsed_program_times_as_the_compiled_one(make, engine):
    ck = make()
    want = ck.simulate(mode="timing")
    p = pypto.Program.parse(ck.program.text(), machine="a2a3")
    got = pypto.sim.simulate(p, machine="a2a3", mode="timing", progress=False, engine=engine)
    if engine == "compiled":        # (its trace is made when read; the Python engine makes it as it runs)
        assert not any("instrs" in t.__dict__ for t in p.tasks if has_loops(t.code))
    assert got.cycles == want.cycles and got.task_times == want.task_times
    assert got.stats["flops"] == want.stats["flops"] and got.stats["hbm_bytes"] == want.stats["hbm_bytes"]
    assert list(got.trace) == list(want.trace)          # (pipe, op and line read off the text)
    if engine == "compiled":
        assert not any("instrs" in t.__dict__ for t in p.tasks if has_loops(t.code))
