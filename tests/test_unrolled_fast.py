"""`unrolled` (and so `ExecTask.instrs`) moves every instruction of a loop body to all its
iterations at once, sharing the work between instructions alike (`ir.exec._Unroll`).

What must hold: it gives what one `at_iteration` per instruction run gives (the reference below,
the code it replaced): the same instructions, equal and with the same text and attribute order;
the very instruction object for one without steps, and the very tile object for a tile that does
not move at an iteration; errors where that raised them.  On random nested loops with every kind
of step (negative ones, event ids wrapping modulo 8, several kinds on one instruction, fewer or
more steps than loops), on hand-written text and on a compiled matmul.
"""
from __future__ import annotations

import random

import pytest

import pypto
from pypto.ir.core import Attrs
from pypto.ir.exec import (ADDR_STEP, EVENT_STEP, GM_STEP, MOVING_STEPS, OFFSETS_STEP,
                           Instr, Loop, TileRef, at_iteration, static_instrs, unrolled)
from pypto.ir.gm import GMBuffer, GMRef
from pypto.errors import SourceLoc

import common  # noqa: F401  (puts the benchmarks' kernels on the path)

F16, F32 = pypto.DT_FP16, pypto.DT_FP32


# ---- the reference: one at_iteration per instruction run (`unrolled` as it was) ----

def _ref_unrolled(items, _at: tuple = ()):
    for it in items:
        if isinstance(it, Loop):
            for i in range(it.count):
                yield from _ref_unrolled(it.body, _at + (i,))
        else:
            yield at_iteration(it, _at) if _at else it


def _static(items, _at: tuple = ()):
    """The static instruction each instruction run comes from, in order (as `_ref_unrolled`)."""
    for it in items:
        if isinstance(it, Loop):
            for i in range(it.count):
                yield from _static(it.body, _at + (i,))
        else:
            yield it


def _same(items, _at: tuple = ()):
    """`unrolled(items)` is the reference's: equal instructions with equal text and attribute
    order, and the very objects (instruction, tiles) where the reference keeps them."""
    new, old = list(unrolled(items, _at)), list(_ref_unrolled(items, _at))
    assert len(new) == len(old)
    for k, (x, y, s) in enumerate(zip(new, old, _static(items, _at))):
        assert x == y, k
        assert x.text() == y.text(), k
        assert list(x.attrs.items()) == list(y.attrs.items()), k            # the order too
        assert (x is s) == (y is s), k              # the instruction itself, when nothing of it moves
        assert x.loc is s.loc, k                    # its own place (equal ones may differ in columns)
        for xo, yo, so in zip((x.dst, *x.srcs), (y.dst, *y.srcs), (s.dst, *s.srcs)):
            if isinstance(so, TileRef):             # a tile that does not move: the same object
                assert (xo is so) == (yo is so), k
    return new


# ---- random loop nests ----

BUFS = [GMBuffer("a", (1 << 20,), F16, "input"), GMBuffer("b", (4096, 4096), F32, "output")]
SPACES = ["UB", "L1", "L0A", "L0B", "L0C"]
LOCS = [None, SourceLoc("k.py", 3), SourceLoc("k.py", 3, col=4)]     # the last two equal, not the same


class _Gen:
    def __init__(self, seed: int):
        self.r = random.Random(seed)
        r = self.r
        # a few operand objects, used by many instructions (as the compiler's are), and equal copies
        self.tiles = [TileRef(r.choice(SPACES), r.randrange(0, 64) * 0x400, r.choice([F16, F32]),
                              (16, 32), (16, 32) if r.random() < 0.8 else (8, 32)) for _ in range(5)]
        self.tiles += [TileRef(t.space, t.addr, t.dtype, t.shape, t.valid) for t in self.tiles[:2]]
        self.wins = [GMRef(r.choice(BUFS), r.randrange(0, 1 << 16), (16, 32), (4096, 1)) for _ in range(3)]
        self.made: dict = {}                        # depth -> the instructions made for it

    def step(self):
        return self.r.choice([0, 0, 1, -1, 3, -5, 7, 9, 64, -256, 1024])

    def steps(self, depth: int, per=None):
        """One step per loop (sometimes one fewer or more, which zip truncates); `per`: a tuple of
        that many steps per loop."""
        r = self.r
        n = depth if r.random() < 0.8 else max(1, depth + r.choice([-1, 1]))
        one = (lambda: self.step()) if per is None else (lambda: tuple(self.step() for _ in range(per)))
        return tuple(one() for _ in range(n))

    def attrs(self, d: dict) -> Attrs:
        items = list(d.items())
        self.r.shuffle(items)                       # the attribute order is kept, whatever it is
        return Attrs(dict(items))

    def instr(self, depth: int) -> Instr:
        r = self.r
        made = self.made.setdefault(depth, [])
        if made and r.random() < 0.3:               # one made before (in another loop, maybe), or its twin
            ins = r.choice(made)
            return ins if r.random() < 0.5 else self.twin(ins)
        made.append(self._instr(depth))
        return made[-1]

    def twin(self, ins: Instr) -> Instr:
        """An instruction equal to `ins` with other objects: equal operands, an equal place."""
        def copy(o):
            if isinstance(o, TileRef):
                return TileRef(o.space, o.addr, o.dtype, o.shape, o.valid)
            return GMRef(o.buf, o.offset, o.shape, o.strides) if isinstance(o, GMRef) else o
        loc = LOCS[2] if ins.loc is LOCS[1] else LOCS[1] if ins.loc is LOCS[2] else None
        return Instr(ins.op, ins.pipe, copy(ins.dst), tuple(map(copy, ins.srcs)), ins.attrs, loc)

    def _instr(self, depth: int) -> Instr:
        r = self.r
        kind = r.randrange(7)
        loc = r.choice(LOCS)
        if kind == 0 or depth == 0:                 # nothing moves
            return Instr("TADDS", "V", r.choice(self.tiles), (r.choice(self.tiles), 1.0), loc=loc)
        if kind in (1, 2):                          # a flag, its event id rotating (wrapping modulo 8)
            op = r.choice(["SET_FLAG", "WAIT_FLAG"])
            src, dst = r.choice([("MTE2", "V"), ("V", "MTE3"), ("MTE1", "M")])
            return Instr(op, src if op == "SET_FLAG" else dst, loc=loc, attrs=self.attrs(
                {"src": src, "dst": dst, "event": r.randrange(8), EVENT_STEP: self.steps(depth)}))
        if kind == 3:                               # a load: the window moves, the tile may
            a = {GM_STEP: self.steps(depth)}
            if r.random() < 0.5:
                a[ADDR_STEP] = self.steps(depth, 1)
            return Instr("TLOAD", "MTE2", r.choice(self.tiles), (r.choice(self.wins),), self.attrs(a), loc)
        if kind == 4:                               # a store: the window is the destination
            return Instr("TSTORE", "MTE3", r.choice(self.wins), (r.choice(self.tiles),),
                         self.attrs({GM_STEP: self.steps(depth)}), loc)
        if kind == 5:                               # an extract: offsets and tiles move
            a = {"offsets": (r.randrange(4) * 16, r.randrange(4) * 16), OFFSETS_STEP: self.steps(depth, 2)}
            if r.random() < 0.6:
                a[ADDR_STEP] = self.steps(depth, 2)
            return Instr("TEXTRACT", "MTE1", r.choice(self.tiles), (r.choice(self.tiles),), self.attrs(a), loc)
        # every kind of step at once, on an instruction with tiles, windows and a scalar
        a = {"event": r.randrange(8), "offsets": (r.randrange(8), r.randrange(8)), "dim": 1,
             GM_STEP: self.steps(depth), EVENT_STEP: self.steps(depth),
             OFFSETS_STEP: self.steps(depth, 2), ADDR_STEP: self.steps(depth, 3)}
        return Instr("TMATMUL_ACC", "M", r.choice(self.tiles),
                     (r.choice(self.tiles), r.choice(self.wins), r.choice(self.tiles), 2.5), self.attrs(a), loc)

    def items(self, depth: int, budget: int) -> list:
        r = self.r
        out = []
        for _ in range(r.randrange(0 if depth else 1, budget)):
            if depth < 3 and r.random() < 0.25:
                out.append(Loop(r.choice([1, 2, 2, 3, 4, 5]), tuple(self.items(depth + 1, max(2, budget // 2)))))
            elif out and r.random() < 0.3:          # one of this body again, or its twin
                again = r.choice(out)
                out.append(again if isinstance(again, Loop) or r.random() < 0.5 else self.twin(again))
            else:
                out.append(self.instr(depth))
        return out


@pytest.mark.parametrize("seed", range(100))
def test_random_loop_nests_unroll_as_at_iteration_does(seed):
    items = _Gen(seed).items(0, 9)
    _same(items)
    _same([Loop(3, tuple(items))])                  # all inside one more loop
    inner = [it for it in items if isinstance(it, Loop)]
    if inner:                                       # a body at given outer indices (`_at`)
        _same(inner[0].body, (2,))


def test_the_cases_one_by_one():
    g = _Gen(0)
    t0, t1 = g.tiles[0], g.tiles[1]
    w = GMRef(BUFS[1], 4096, (16, 32), (4096, 1))
    flag = Instr("SET_FLAG", "MTE2", attrs=Attrs({"src": "MTE2", "dst": "V", "event": 6, EVENT_STEP: (3, -1)}))
    load = Instr("TLOAD", "MTE2", t0, (w,), Attrs({ADDR_STEP: ((0,), (1024,)), GM_STEP: (-64, 32)}))
    ext = Instr("TEXTRACT", "MTE1", t1, (t0,), Attrs({OFFSETS_STEP: ((0, 0), (0, 16)), "offsets": (0, 16)}))
    plain = Instr("TMATMUL", "M", t0, (t1, t0))
    out = _same([Loop(3, (Loop(2, (flag, load, ext, plain)),))])
    assert [i.attrs["event"] for i in out[::4]] == [6, 5, 1, 0, 4, 3]          # (6 + 3*i - j) % 8
    assert [i.srcs[0].offset for i in out[1::4]] == [4096 + 32 * j - 64 * i for i in range(3) for j in range(2)]
    assert [i.dst.addr - t0.addr for i in out[1::4]] == [0, 1024] * 3
    assert [i.attrs["offsets"] for i in out[2::4]] == [(0, 16), (0, 32)] * 3
    assert all(i is plain for i in out[3::4])
    # the tile that does not move at j = 0 is the load's own; the steps are gone
    assert all(i.dst is t0 for i in out[1::8]) and not any(k in i.attrs for i in out for k in MOVING_STEPS)
    # an instruction with steps outside any loop is itself; inside, at fixed indices: `_at`
    assert list(unrolled([flag])) == [flag] and next(iter(unrolled([flag]))) is flag
    assert list(unrolled([flag], (1, 1))) == [at_iteration(flag, (1, 1))]
    assert list(unrolled([Loop(0, (flag,)), Loop(1, ())])) == []


def test_steps_that_do_not_fit_fail_as_before():
    t = _Gen(1).tiles
    bad = Instr("TMATMUL_ACC", "M", t[0], (t[1], t[2]), Attrs({ADDR_STEP: ((0, 1024),)}))    # 3 tiles, 2 steps
    with pytest.raises(RuntimeError):
        list(_ref_unrolled([Loop(2, (bad,))]))
    with pytest.raises(RuntimeError):
        list(unrolled([Loop(2, (bad,))]))
    nothing = Instr("SET_FLAG", "MTE2", attrs=Attrs({"src": "MTE2", "dst": "V", EVENT_STEP: (1,)}))   # no event
    for f in (_ref_unrolled, unrolled):
        with pytest.raises(KeyError):
            list(f([Loop(2, (nothing,))]))


RING = """// PTO program k: 1 tasks
.gm x fp32[16,256] input
.gm out fp32[16,256] output
.task 0 AIV group=0 deps=[]
  .loop 4
    .loop 4
      TLOAD              UB[0x0]:fp32[1,256], GM:x[0:1,0:256], gm_step=(1024,256), addr_step=((0),(1024))
      SET_FLAG           MTE2 -> V, EVENT_ID0, event_step=(4,1)
      WAIT_FLAG          MTE2 -> V, EVENT_ID0, event_step=(4,1)
      TADDS              UB[0x4000]:fp32[1,256], UB[0x0]:fp32[1,256], 1.0, addr_step=((0,0),(0,1024))
      SET_FLAG           V -> MTE3, EVENT_ID0, event_step=(4,-1)
      WAIT_FLAG          V -> MTE3, EVENT_ID0, event_step=(4,-1)
      TSTORE             GM:out[0:1,0:256], UB[0x4000]:fp32[1,256], gm_step=(1024,256)
    .endloop
  .endloop
"""


def test_hand_written_loops():
    p = pypto.Program.parse(RING, machine="a2a3")
    t = p.tasks[0]
    assert t.instrs == tuple(_same(t.code))
    assert [i.attrs["event"] for i in t.instrs if i.op == "SET_FLAG" and i.pipe == "V"] == \
        [(4 * i - j) % 8 for i in range(4) for j in range(4)]


def test_a_compiled_matmul():
    """A matmul whose tiles move (addr_step), flags rotate and windows move: every task unrolls
    to the instructions the compiler folded (`t.instrs`, its own objects)."""
    from kernels import matmul_auto
    args = (pypto.Tensor([512, 2048], F16), pypto.Tensor([2048, 512], F16), pypto.Tensor([512, 512], F16))
    ck = matmul_auto.compile(*args)
    kinds = set()
    for t in ck.program.tasks:
        new = _same(t.code)
        assert len(new) == len(t.instrs)
        for x, y in zip(new, t.instrs):
            assert x == y and x.text() == y.text() and list(x.attrs.items()) == list(y.attrs.items())
        kinds |= {k for i, depth in static_instrs(t.code) if depth for k in i.attrs}
    assert {GM_STEP, EVENT_STEP, OFFSETS_STEP, ADDR_STEP} <= kinds


def test_steps_of_other_number_types_are_not_taken_for_ints():
    """Alike instructions share their work only when their steps are ints: a step of 1.0 (equal
    to 1) moves its window to float offsets, as at_iteration does, not to the int ones."""
    w = GMRef(BUFS[1], 0, (16, 32), (4096, 1))
    t0 = _Gen(0).tiles[0]
    ints = Instr("TLOAD", "MTE2", t0, (w,), Attrs({GM_STEP: (32,)}))
    floats = Instr("TLOAD", "MTE2", t0, (w,), Attrs({GM_STEP: (32.0,)}))
    out = _same([Loop(3, (ints, floats))])
    assert [i.srcs[0].offset for i in out] == [0, 0, 32, 32, 64, 64]
    assert [type(i.srcs[0].offset) for i in out] == [int, float] * 3
