"""Tiles on a ring of slots inside loops (`addr_ring`, ir.exec): a tile walked around a ring of
equal slots (a matmul's A panel, double-buffered loads) moves modulo the ring, so one turn of
a loop covers one slot whatever slot it starts in.

What must hold: at loop indices i a ring tile's address is lo + (addr + i*step - lo) mod (hi - lo);
the text parses back to itself and runs (values of numpy); a broken ring is a located error; the
`loops` pass folds a stream walking a ring into one loop, runs exactly the instructions it ran,
and writes a ring only where some iteration wraps around it (else the plain steps of before).
"""
from __future__ import annotations

import numpy as np
import pytest

import pypto
from pypto.compiler import loops
from pypto.ir.core import Attrs
from pypto.ir.exec import ADDR_RING, ADDR_STEP, Instr, Loop, TileRef, at_iteration, item_lines, unrolled
from pypto.ir.gm import GMBuffer, GMRef
from pypto.ir.pto_text import PTOSyntaxError

F32 = pypto.DT_FP32
SLOT = 0x1000                   # a fp32[4,256] tile
X = GMBuffer("x", (64, 256), F32, "input")
OUT = GMBuffer("out", (64, 256), F32, "output")


def _hand(body: str) -> str:
    return ("// PTO program k: 1 tasks\n.gm x fp32[64,256] input\n.gm out fp32[64,256] output\n"
            ".task 0 AIV group=0 deps=[]\n" + body)


# 16 row blocks loaded into a ring of four UB slots, each added to 1 and stored from one out tile
RING = """  .loop 16
    TLOAD              UB[0x0]:fp32[4,256], GM:x[0:4,0:256], gm_step=1024, addr_step=(4096), addr_ring=(0x0:0x4000)
    SET_FLAG           MTE2 -> V, EVENT_ID0, event_step=1
    WAIT_FLAG          MTE2 -> V, EVENT_ID0, event_step=1
    TADDS              UB[0x4000]:fp32[4,256], UB[0x0]:fp32[4,256], 1.0, addr_step=(0,4096), addr_ring=(-,0x0:0x4000)
    SET_FLAG           V -> MTE3, EVENT_ID0, event_step=1
    WAIT_FLAG          V -> MTE3, EVENT_ID0, event_step=1
    TSTORE             GM:out[0:4,0:256], UB[0x4000]:fp32[4,256], gm_step=1024
  .endloop
"""


def test_a_ring_tile_wraps_around_its_ring():
    p = pypto.Program.parse(_hand(RING), machine="a2a3")
    assert p.text().splitlines()[4:] == _hand(RING).splitlines()[4:]
    loads = [i for i in p.tasks[0].instrs if i.op == "TLOAD"]
    assert [i.dst.addr for i in loads] == [0, SLOT, 2 * SLOT, 3 * SLOT] * 4
    assert [i.srcs[0].offset for i in loads] == [1024 * r for r in range(16)]
    adds = [i for i in p.tasks[0].instrs if i.op == "TADDS"]
    assert [(i.dst.addr, i.srcs[0].addr) for i in adds[3:6]] == [(0x4000, 3 * SLOT), (0x4000, 0), (0x4000, SLOT)]
    assert all(ADDR_RING not in i.attrs and ADDR_STEP not in i.attrs for i in p.tasks[0].instrs)
    x = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)
    res = pypto.sim.simulate(p, x, np.zeros_like(x), machine="a2a3")
    np.testing.assert_array_equal(res.outputs["out"], x + 1)
    assert pypto.sim.simulate(p, machine="a2a3", mode="timing", progress=False).cycles > 0


def test_a_ring_in_decimal_reads_as_in_hex():
    text = _hand(RING.replace("addr_ring=(0x0:0x4000)", "addr_ring=(0:16384)"))
    assert pypto.Program.parse(text, machine="a2a3").text() == pypto.Program.parse(_hand(RING), machine="a2a3").text()


def test_at_iteration_moves_around_the_ring_both_ways():
    t = TileRef("UB", 2 * SLOT, F32, (4, 256), (4, 256))
    for step, want in [(SLOT, [2, 3, 0, 1, 2]), (-SLOT, [2, 1, 0, 3, 2]), (3 * SLOT, [2, 1, 0, 3, 2])]:
        x = Instr("TADDS", "V", t, (t, 1.0), Attrs({ADDR_STEP: ((step, step),), ADDR_RING: ((0, 0x4000),) * 2}))
        got = [at_iteration(x, (i,)) for i in range(5)]
        assert [g.dst.addr // SLOT for g in got] == want == [g.srcs[0].addr // SLOT for g in got]
        assert all(ADDR_RING not in g.attrs for g in got)
        # the unrolling of a loop (`_Unroll`, shared work) gives what at_iteration gives
        assert list(unrolled((Loop(5, (x,)),))) == got


@pytest.mark.parametrize("change, message", [
    (("addr_step=(4096), addr_ring=(0x0:0x4000)", "addr_ring=(0x0:0x4000)"), "addr_ring= but no addr_step="),
    (("addr_ring=(0x0:0x4000)", "addr_ring=(0x1000:0x4000)"), "the range lo:hi of bytes its tile lies in"),
    (("addr_ring=(-,0x0:0x4000)", "addr_ring=(0x0:0x4000)"), "one entry per tile operand"),
    (("addr_ring=(0x0:0x4000)", "addr_ring=(0x0-0x4000)"), "bad addr_ring"),
    (("addr_ring=(0x0:0x4000)", "addr_ring=(010:0x4000)"), "bad addr_ring"),
])
def test_broken_rings_are_located_errors(change, message):
    with pytest.raises(PTOSyntaxError, match=message):
        pypto.Program.parse(_hand(RING.replace(*change)), machine="a2a3")


def _ring_stream(tiles: int, slots: int = 4, first: int = 0, addrs=None) -> list:
    """Per tile t: a load of x's rows 4t..4t+4 into slot (first + t) % slots of a ring (at
    `addrs`, else one slot apart from 0), flags, an add into one out tile, flags, a store (the
    instructions a pass would hand `loops`)."""
    out_tile = TileRef("UB", 0x8000, F32, (4, 256), (4, 256))
    ring = [TileRef("UB", a, F32, (4, 256), (4, 256)) for a in addrs or [k * SLOT for k in range(slots)]]
    slots = len(ring)
    stream = []
    for t in range(tiles):
        slot = ring[(first + t) % slots]
        e = t % 8
        stream += [Instr("TLOAD", "MTE2", slot, (GMRef(X, 1024 * t, (4, 256), (256, 1)),)),
                   Instr("SET_FLAG", "MTE2", attrs=Attrs({"src": "MTE2", "dst": "V", "event": e})),
                   Instr("WAIT_FLAG", "V", attrs=Attrs({"src": "MTE2", "dst": "V", "event": e})),
                   Instr("TADDS", "V", out_tile, (slot, 1.0)),
                   Instr("SET_FLAG", "V", attrs=Attrs({"src": "V", "dst": "MTE3", "event": e})),
                   Instr("WAIT_FLAG", "MTE3", attrs=Attrs({"src": "V", "dst": "MTE3", "event": e})),
                   Instr("TSTORE", "MTE3", GMRef(OUT, 1024 * t, (4, 256), (256, 1)), (out_tile,))]
    return stream


def _fold(stream, known=None, tiles=None):
    return loops._moving(stream, known or loops._Tokens(), {} if tiles is None else tiles).items


def test_a_stream_walking_a_ring_folds_into_one_loop():
    stream = _ring_stream(16)
    items = _fold(stream)
    assert len(items) == 1 and isinstance(items[0], Loop) and items[0].count == 16 and len(items[0].body) == 7
    assert list(unrolled(items)) == stream
    load = items[0].body[0]
    assert load.attrs[ADDR_STEP] == ((SLOT,),) and load.attrs[ADDR_RING] == ((0, 4 * SLOT),)
    # the text parses back to the same loop, which runs numpy's values
    p = pypto.Program.parse(_hand("\n".join(item_lines(items)) + "\n"), machine="a2a3")
    assert p.tasks[0].code == tuple(items)
    x = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)
    np.testing.assert_array_equal(pypto.sim.simulate(p, x, np.zeros_like(x), machine="a2a3").outputs["out"], x + 1)


def test_a_ring_walked_without_wrapping_keeps_its_plain_steps():
    """Four tiles in four slots: no iteration wraps, so the loop is written as without rings."""
    stream = _ring_stream(4)
    items = _fold(stream)
    assert list(unrolled(items)) == stream
    stepped = [i for it in items if isinstance(it, Loop) for i in it.body if ADDR_STEP in i.attrs]
    assert stepped and all(ADDR_RING not in i.attrs for i in stepped)
    assert stepped[0].attrs[ADDR_STEP] == ((SLOT,),)


def test_streams_of_one_ring_started_in_other_slots_fold_exactly():
    """Streams alike but for the slot they start in share the pass's descriptions (one ring
    table) and each runs exactly its own instructions."""
    known, tiles = loops._Tokens(), {}
    for first in (0, 1, 3, 2, 0):
        for n in (16, 6, 5):
            stream = _ring_stream(n, first=first)
            assert list(unrolled(_fold(stream, known, tiles))) == stream, (first, n)


def test_rings_are_found_only_where_slots_are_evenly_spaced():
    key = ("UB", F32, (4, 256), (4, 256))
    # (the out tile, at 0x8000, is of the same kind but no slot of the ring)
    assert dict(loops._rings(_ring_stream(8))) == {(*key, k * SLOT): (0, 4 * SLOT) for k in range(4)}
    # three slots with a gap (0, 1, 3): a ring of two, the addresses move by their plain steps
    stream = _ring_stream(6, addrs=[0, SLOT, 3 * SLOT])
    rings = dict(loops._rings(stream))
    assert rings[(*key, 0)] == rings[(*key, SLOT)] == (0, 2 * SLOT)
    assert rings[(*key, 3 * SLOT)] == rings[(*key, 0x8000)] == (3 * SLOT, 0x8000 + 0x8000 - 3 * SLOT)
    assert list(unrolled(_fold(stream))) == stream


def test_a_compiled_matmul_runs_its_instructions_with_rings():
    """A 1024^3 fp16 matmul (its A panel in four L1 slots, B and the L0 tiles double-buffered):
    its text has rings and shrinks, parses back to itself, and every task runs the instructions
    the unfolded program runs (cycles equal)."""
    import sys
    import os
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    from kernels import matmul_auto
    T = pypto.Tensor
    args = (T([1024, 1024], pypto.DT_FP16),) * 3
    ck, flat = matmul_auto.compile(*args), matmul_auto.compile(*args, options={"loops": False})
    text = ck.program.text()
    assert text.count("addr_ring=") > 50
    assert len(text.splitlines()) < 0.75 * len(flat.program.text().splitlines())
    for t, u in zip(ck.program.tasks, flat.program.tasks):
        assert [i.text() for i in unrolled(t.code)] == [i.text() for i in u.instrs]
    again = pypto.Program.parse(text, machine="a2a3")
    assert again.text() == text
    assert (pypto.sim.simulate(again, machine="a2a3", mode="timing", progress=False).cycles
            == flat.simulate(mode="timing").cycles)
