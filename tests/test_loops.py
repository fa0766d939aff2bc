"""Loops in the Exec and PTO levels (ir.exec.Loop) and the `loops` pass that folds each task's
repeated instruction sequences into them.

What must hold: a folded task runs exactly the instructions it ran before (`ExecTask.instrs`
unrolls the loops: GM windows moved by gm_step, event ids rotated by event_step, TEXTRACT
offsets moved by offsets_step), so cycles and outputs do not change; the text shows the loops
and parses back to the same program; broken loops in hand-written text are located errors.
"""
from __future__ import annotations

import numpy as np
import pytest

import pypto
from pypto.compiler.loops import fold, moved, replay
from pypto.ir.core import Attrs
from pypto.ir.exec import GM_STEP, Instr, Loop, TileRef, item_lines, unrolled
from pypto.ir.gm import GMBuffer, GMRef
from pypto.ir.pto_text import PTOSyntaxError

from common import softmax

F32 = pypto.DT_FP32
T = pypto.Tensor

X = GMBuffer("x", (64, 256), F32, "input")
OUT = GMBuffer("out", (64, 256), F32, "output")
UB0 = TileRef("UB", 0, F32, (4, 256), (4, 256))
UB1 = TileRef("UB", 0x1000, F32, (4, 256), (4, 256))


def _flag(op, src, dst, event):
    return Instr(op, src if op == "SET_FLAG" else dst, attrs=Attrs({"src": src, "dst": dst, "event": event}))


def _tile_stream(n_tiles: int, rows: int = 4) -> list[Instr]:
    """Per tile: load x rows, flag, add 1, flag, store: the windows move by a tile, the events rotate."""
    out = []
    for t in range(n_tiles):
        win = GMRef(X, t * rows * 256, (rows, 256), (256, 1))
        out += [Instr("TLOAD", "MTE2", UB0, (win,)), _flag("SET_FLAG", "MTE2", "V", t % 8),
                _flag("WAIT_FLAG", "MTE2", "V", t % 8), Instr("TADDS", "V", UB1, (UB0, 1.0)),
                _flag("SET_FLAG", "V", "MTE3", t % 8), _flag("WAIT_FLAG", "V", "MTE3", t % 8),
                Instr("TSTORE", "MTE3", GMRef(OUT, t * rows * 256, (rows, 256), (256, 1)), (UB1,))]
    return out


def _texts(instrs):
    return [i.text() for i in instrs]


def test_a_repeated_tile_becomes_one_loop():
    stream = _tile_stream(16)
    items = fold(stream)
    assert len(items) == 1 and isinstance(items[0], Loop) and items[0].count == 16
    body = items[0].body
    assert len(body) == 7
    assert body[0].attrs[GM_STEP] == (4 * 256,) and body[6].attrs[GM_STEP] == (4 * 256,)
    assert body[1].attrs["event_step"] == (1,)
    assert _texts(unrolled(items)) == _texts(stream)
    text = "\n".join(item_lines(items))
    assert ".loop 16" in text and "gm_step=1024" in text and "event_step=1" in text


def test_windows_that_do_not_move_by_a_constant_step_are_not_folded():
    stream = _tile_stream(6)
    # the fourth tile's load reads the rows of the first again: no constant step over all six
    stream[3 * 7] = Instr("TLOAD", "MTE2", UB0, (GMRef(X, 0, (4, 256), (256, 1)),))
    items = fold(stream)
    assert _texts(unrolled(items)) == _texts(stream)
    assert not any(isinstance(i, Loop) and i.count == 6 for i in items)


def test_nested_loops_and_extract_offsets():
    a = GMBuffer("a", (64, 1024), pypto.DT_FP16, "input")
    l1 = TileRef("L1", 0, pypto.DT_FP16, (64, 256), (64, 256))
    l0 = [TileRef("L0A", k * 0x4000, pypto.DT_FP16, (64, 32), (64, 32)) for k in (0, 1)]
    stream = []
    for chunk in range(4):                  # a chunk of K in L1, then 8 kL0 extracts from it
        stream.append(Instr("TLOAD", "MTE2", l1, (GMRef(a, chunk * 256, (64, 256), (1024, 1)),)))
        for k in range(8):
            stream.append(Instr("TEXTRACT", "MTE1", l0[k % 2], (l1,), Attrs({"offsets": (0, 32 * k)})))
    items = fold(stream)
    assert _texts(unrolled(items)) == _texts(stream)
    outer = items[0]
    assert isinstance(outer, Loop) and outer.count == 4
    inner = next(i for i in outer.body if isinstance(i, Loop))
    assert inner.count == 4 and inner.body[0].attrs["offsets_step"] == ((0, 0), (0, 64))
    assert outer.body[0].attrs[GM_STEP] == (256,)
    text = "\n".join(item_lines(items))
    assert "offsets_step=((0,0),(0,64))" in text


def _shifted_stream(stream, by: dict):
    """The stream with the windows of each buffer named in `by` moved by its offset."""
    def move(o):
        return GMRef(o.buf, o.offset + by.get(o.buf.name, 0), o.shape, o.strides) if isinstance(o, GMRef) else o
    return [Instr(i.op, i.pipe, move(i.dst), tuple(move(o) for o in i.srcs), i.attrs, i.loc) for i in stream]


def test_an_isomorphic_stream_moved_as_a_whole_takes_the_loops_of_the_first():
    first = _tile_stream(12)
    template = fold(first)
    other = _shifted_stream(first, {"x": 1024, "out": 2048})     # another task: its rows elsewhere
    items = moved(template, first, other)
    assert items is not None and items == replay(template, other)
    assert _texts(unrolled(items)) == _texts(other)
    assert items[0].body[0].srcs[0].offset == 1024 and items[0].body[6].dst.offset == 2048
    # one window moved by another offset than the rest of its buffer's: not taken (replay checks
    # every iteration, and here finds that the loop does not hold)
    odd = list(other)
    odd[7 * 5] = Instr("TLOAD", "MTE2", UB0, (GMRef(X, 0, (4, 256), (256, 1)),))
    assert moved(template, first, odd) is None and replay(template, odd) is None


def _compile(**kw):
    return softmax.compile(T([4096, 512], F32), T([4096, 512], F32), machine="a2a3", TM=8, TN=512, **kw)


def test_compiled_tasks_have_loops_and_run_the_same_instructions():
    ck, flat = _compile(), _compile(options={"loops": False})
    assert any(isinstance(i, Loop) for t in ck.program.tasks for i in t.code)
    assert not any(isinstance(i, Loop) for t in flat.program.tasks for i in t.code)
    for t, u in zip(ck.program.tasks, flat.program.tasks):
        # the loops unroll to the very instructions (the task keeps those it ran: t.instrs)
        assert _texts(unrolled(t.code)) == _texts(u.instrs) == _texts(t.instrs)
    assert len(ck.program) == len(flat.program)
    text = ck.program.text()
    assert len(text.splitlines()) * 2 < len(flat.program.text().splitlines())
    assert "loop" in ck.exec_graph.text()
    x = np.random.default_rng(0).standard_normal((4096, 512)).astype(np.float32)
    r1, r2 = ck.simulate(x, np.zeros_like(x)), flat.simulate(x, np.zeros_like(x))
    assert r1.ok and r2.ok and r1.cycles == r2.cycles
    assert r1.outputs["out"].tobytes() == r2.outputs["out"].tobytes()
    checked = ck.simulate(x, np.zeros_like(x), checked=True)        # races, event reuse: none
    assert checked.cycles == r1.cycles


def test_print_parse_print_with_loops():
    ck = _compile()
    text = ck.program.text()
    again = pypto.Program.parse(text, machine="a2a3")
    assert again.text() == text
    assert pypto.sim.simulate(again, machine="a2a3", mode="timing", progress=False).cycles == \
        ck.simulate(mode="timing").cycles


def _hand(body: str) -> str:
    return ("// PTO program k: 1 tasks\n.gm x fp32[64,256] input\n.gm out fp32[64,256] output\n"
            ".task 0 AIV group=0 deps=[]\n" + body)


LOOP = """  .loop 16
    TLOAD              UB[0x0]:fp32[4,256], GM:x[0:4,0:256], gm_step={step}
    SET_FLAG           MTE2 -> V, EVENT_ID0, event_step=1
    WAIT_FLAG          MTE2 -> V, EVENT_ID0, event_step=1
    TADDS              UB[0x1000]:fp32[4,256], UB[0x0]:fp32[4,256], 1.0
    SET_FLAG           V -> MTE3, EVENT_ID0, event_step=1
    WAIT_FLAG          V -> MTE3, EVENT_ID0, event_step=1
    TSTORE             GM:out[0:4,0:256], UB[0x1000]:fp32[4,256], gm_step={step}
  .endloop
"""


def test_a_hand_written_loop_runs():
    p = pypto.Program.parse(_hand(LOOP.format(step=1024)), machine="a2a3")
    assert len(p) == 16 * 7 and p.tasks[0].instrs[-1].dst.offset == 15 * 1024
    x = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)
    res = pypto.sim.simulate(p, x, np.zeros_like(x), machine="a2a3")
    np.testing.assert_array_equal(res.outputs["out"], x + 1)
    # the loop has no flag that keeps the next load off the tile TADDS still reads: checked
    # simulation reports the race with the instructions of the iterations involved
    with pytest.raises(pypto.SimulationError, match="instruction 7 TLOAD on MTE2 overwrites UB"):
        pypto.sim.simulate(p, x, np.zeros_like(x), machine="a2a3", check=True)


@pytest.mark.parametrize("text, message", [
    (_hand(LOOP.format(step=1024).replace("  .endloop\n", "")), "a .loop is not closed"),
    (_hand("  .endloop\n"), ".endloop without a .loop"),
    (_hand(LOOP.format(step=2048)), "leaves buffer x"),
    (_hand(LOOP.format(step="(1024,0)")), "one step per loop"),
    (_hand("  .loop 0\n    TADDS UB[0x1000]:fp32[4,256], UB[0x0]:fp32[4,256], 1.0\n  .endloop\n"), "bad .loop"),
    (_hand("  TLOAD UB[0x0]:fp32[4,256], GM:x[0:4,0:256], gm_step=1024\n"), "gm_step"),
])
def test_broken_loops_are_located_errors(text, message):
    with pytest.raises(PTOSyntaxError, match=message):
        pypto.Program.parse(text, machine="a2a3")


# a ring of four UB buffers walked in turn: the load of iteration i fills slot i % 4 (addr_step moves
# the tile's address by one slot per iteration; two loops: four rounds of the ring)
RING = """  .loop 4
    .loop 4
      TLOAD              UB[0x0]:fp32[1,256], GM:x[0:1,0:256], gm_step=(1024,256), addr_step=((0),(1024))
      SET_FLAG           MTE2 -> V, EVENT_ID0, event_step=(4,1)
      WAIT_FLAG          MTE2 -> V, EVENT_ID0, event_step=(4,1)
      TADDS              UB[0x4000]:fp32[1,256], UB[0x0]:fp32[1,256], 1.0, addr_step=((0,0),(0,1024))
      SET_FLAG           V -> MTE3, EVENT_ID0, event_step=(4,1)
      WAIT_FLAG          V -> MTE3, EVENT_ID0, event_step=(4,1)
      TSTORE             GM:out[0:1,0:256], UB[0x4000]:fp32[1,256], gm_step=(1024,256)
    .endloop
  .endloop
"""


def test_tiles_that_move_from_iteration_to_iteration():
    """addr_step: each tile operand's address moves by its step per iteration (`at_iteration`);
    the text parses back to itself, and the program runs as its unrolled instructions."""
    text = _hand(RING).replace("fp32[64,256]", "fp32[16,256]")
    p = pypto.Program.parse(text, machine="a2a3")
    assert p.text().splitlines()[4:] == text.splitlines()[4:]
    loads = [i for i in p.tasks[0].instrs if i.op == "TLOAD"]
    assert [i.dst.addr for i in loads] == [0, 1024, 2048, 3072] * 4
    assert [i.srcs[0].offset for i in loads] == [256 * r for r in range(16)]
    adds = [i for i in p.tasks[0].instrs if i.op == "TADDS"]
    assert [(i.dst.addr, i.srcs[0].addr) for i in adds[:5]] == [(0x4000, a) for a in (0, 1024, 2048, 3072, 0)]
    # the ring's turns are a few objects, met again and again (an unrolled program shares them)
    assert adds[0] is adds[4] and adds[0].srcs[0] is adds[4].srcs[0] and adds[0] is not adds[1]
    assert loads[0].dst is loads[4].dst
    x = np.arange(16 * 256, dtype=np.float32).reshape(16, 256)
    res = pypto.sim.simulate(p, x, np.zeros_like(x), machine="a2a3")
    np.testing.assert_array_equal(res.outputs["out"], x + 1)


@pytest.mark.parametrize("step, message", [
    ("addr_step=((0),(1024),(0))", "addr_step= needs one step per loop"),
    ("addr_step=((0,0),(1024,0))", "one value per tile operand"),
    ("addr_step=((0),(-1024))", "tile address is below 0"),
])
def test_broken_tile_steps_are_located_errors(step, message):
    text = _hand(RING.replace("addr_step=((0),(1024))", step)).replace("fp32[64,256]", "fp32[16,256]")
    with pytest.raises(PTOSyntaxError, match=message):
        pypto.Program.parse(text, machine="a2a3")


def test_a_matmul_whose_tiles_move_folds_with_addr_step():
    """The second stage of the pass: a matmul whose A panel has one L1 copy per K chunk (its K
    too long for the panel to stay in L1) repeats with moving tiles only.  It folds with
    `addr_step`, runs the very instructions it ran (cycles and outputs unchanged), and its text
    parses back to itself."""
    from kernels import matmul_auto
    from pypto.ir.exec import ADDR_RING, ADDR_STEP, static_instrs
    args = (T([512, 2048], pypto.DT_FP16), T([2048, 512], pypto.DT_FP16), T([512, 512], pypto.DT_FP16))
    ck, flat = matmul_auto.compile(*args), matmul_auto.compile(*args, options={"loops": False})
    text_instrs = [i for t in ck.program.tasks for i, _ in static_instrs(t.code)]
    assert sum(ADDR_STEP in i.attrs for i in text_instrs) > 100
    for t, u in zip(ck.program.tasks, flat.program.tasks):
        assert _texts(unrolled(t.code)) == _texts(u.instrs) == _texts(t.instrs)
    # 4302 instructions in 1532 lines (without the second stage: 4302, nothing folds; with it but
    # without rings, 3343: the A panel's four L1 slots and the double-buffered B and L0 tiles
    # are walked around their rings, `addr_ring`, so one K chunk is a loop body)
    assert len(ck.program) == len(flat.program) == 4302
    assert len(text_instrs) == 1532
    assert sum(ADDR_RING in i.attrs for i in text_instrs) > 20
    text = ck.program.text()
    again = pypto.Program.parse(text, machine="a2a3")
    assert again.text() == text
    assert _texts(again.tasks[5].instrs) == _texts(flat.program.tasks[5].instrs)
    cycles = flat.simulate(mode="timing").cycles
    assert ck.simulate(mode="timing").cycles == cycles
    assert pypto.sim.simulate(again, machine="a2a3", mode="timing", progress=False).cycles == cycles
    rng = np.random.default_rng(1)
    a = rng.standard_normal((512, 2048)).astype(np.float16)
    b = rng.standard_normal((2048, 512)).astype(np.float16)
    r1, r2 = ck.simulate(a, b, np.zeros((512, 512), np.float16)), flat.simulate(a, b, np.zeros((512, 512), np.float16))
    assert r1.ok and r2.ok
    assert r1.outputs["c"].tobytes() == r2.outputs["c"].tobytes()


def _shared(stream):
    """The stream with equal instructions made one object (as a pass that interns them would)."""
    one: dict = {}
    return [one.setdefault(i, i) for i in stream]


def _two_loads_stream() -> list[Instr]:
    """Per tile: two loads of x, at tile t's rows and at row 8t (equal windows at t = 0), with
    eight adds between them (an inner loop)."""
    add = Instr("TADDS", "V", UB1, (UB0, 1.0))
    out = []
    for t in range(6):
        out.append(Instr("TLOAD", "MTE2", UB0, (GMRef(X, t * 4 * 256, (4, 256), (256, 1)),)))
        out += [add] * 8
        out.append(Instr("TLOAD", "MTE2", UB0, (GMRef(X, t * 8 * 256, (4, 256), (256, 1)),)))
    return out


@pytest.mark.parametrize("make", [
    _two_loads_stream,
    lambda: [i for t in _matmul_flat().tasks[:3] for i in t.instrs],
    lambda: list(_matmul_flat().tasks[5].instrs)])
def test_streams_whose_equal_instructions_are_one_object_fold_the_same(make):
    """A stream may hold one instruction object at many positions (equal instructions shared):
    it folds exactly as the stream of distinct copies, and unrolls to it."""
    # (distinct copies first: a compiled stream may share its equal instructions already)
    stream = [Instr(i.op, i.pipe, i.dst, i.srcs, i.attrs, i.loc) for i in make()]
    shared = _shared(stream)
    assert len({id(i) for i in shared}) < len({id(i) for i in stream})
    items, again = fold(stream), fold(shared)
    assert item_lines(again) == item_lines(items)
    assert _texts(unrolled(again)) == _texts(stream)


def _matmul_flat():
    from kernels import matmul_auto
    args = (T([512, 2048], pypto.DT_FP16), T([2048, 512], pypto.DT_FP16), T([512, 512], pypto.DT_FP16))
    return matmul_auto.compile(*args, options={"loops": False}).program


def test_a_long_stream_folds_with_its_tiles_moving_first(monkeypatch):
    """A task scheduled tile by tile (longer than REGION_MIN) is folded with its tiles moving
    first, output tile by output tile (the regions it was scheduled by): its output tiles take
    turns in double-buffered slots.  The fold with the tiles fixed runs only when that one
    leaves more than a quarter of the instructions (then the shorter text wins, as for any
    task).  The folded tasks run their very instructions."""
    from kernels import matmul_auto
    from pypto.compiler import loops
    from pypto.compiler.listsched import REGION_MIN
    from pypto.ir.exec import ADDR_STEP, static_instrs
    args = (T([2048, 2048], pypto.DT_FP16),) * 3
    flat = matmul_auto.compile(*args, options={"loops": False})
    calls = []
    real_folding, real_moving = loops._folding, loops._moving

    def folding(instrs, known):
        if len(instrs) > REGION_MIN:
            calls.append((len(instrs), "fixed" if not known.tiles else "moving, whole"))
        return real_folding(instrs, known)

    def moving(instrs, known, tiles, by_tiles=False):
        calls.append((len(instrs), "moving, by tiles" if by_tiles else "moving"))
        return real_moving(instrs, known, tiles, by_tiles)

    monkeypatch.setattr(loops, "_folding", folding)
    monkeypatch.setattr(loops, "_moving", moving)
    g = loops.fold_loops(flat.exec_graph)
    assert calls and all(n > REGION_MIN for n, _ in calls)
    firsts = {}
    for n, stage in calls:
        firsts.setdefault(n, []).append(stage)
    for n, stages in firsts.items():
        assert stages[0] == "moving, by tiles" and "moving, whole" not in stages
    fixed_too = {n for n, stages in firsts.items() if "fixed" in stages}
    for t, u in zip(g.tasks, flat.exec_graph.tasks):
        assert _texts(unrolled(t.code)) == _texts(u.instrs)
        lines = sum(1 for _ in static_instrs(t.code))
        if len(u.instrs) in firsts and len(u.instrs) not in fixed_too:
            assert lines * loops.LEFT <= len(u.instrs)
            assert any(ADDR_STEP in i.attrs for i, _ in static_instrs(t.code))
            # (a loop's body is at most two output tiles: K folded inside each)
            assert max(sum(i.op == "TSTORE" for i in unrolled(x.body)) for x in t.code if isinstance(x, Loop)) <= 2
    assert fixed_too != set(firsts)


def test_a_repeated_line_is_parsed_once_and_checked_where_it_stands():
    """A program's lines repeat (a 4096^3 matmul's 52k instruction lines are 1.5k distinct): a
    line is parsed and checked once and its instruction shared, but where it stands is checked at
    each place: its steps against the loops around it, with that place's line number."""
    line = "    TADDS              UB[0x1000]:fp32[4,256], UB[0x0]:fp32[4,256], 1.0\n"
    p = pypto.Program.parse(_hand(LOOP.format(step=1024) + line.strip() + "\n"), machine="a2a3")
    adds = [i for i in p.tasks[0].code if not isinstance(i, Loop) and i.op == "TADDS"]
    body = [i for i in p.tasks[0].code[0].body if i.op == "TADDS"]
    assert adds[0] is body[0]
    stepped = "    TLOAD              UB[0x0]:fp32[4,256], GM:x[0:4,0:256], gm_step=1024\n"
    text = _hand(LOOP.format(step=1024) + stepped.strip() + "\n")
    with pytest.raises(PTOSyntaxError, match="gm_step= needs one step per loop") as e:
        pypto.Program.parse(text, machine="a2a3")
    assert e.value.line == text.splitlines().index(stepped.strip()) + 1
