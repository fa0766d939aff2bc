"""The work-saving paths of the `loops` pass decide as the plain computations they stand for.

`_Tokens.with_step` gives one instruction per (instruction object, depth, steps) and hands it
out again; `_Template.moves_alike` compares only the tokens whose moving components are not the
very tuples of its template's, and the rest by numpy; `_Template.moved` compares ops, source
lines and GM windows only where an instruction is not the very one of the first stream; `_lines`
counts the text without walking it.  What must hold: the same folded text, steps and attribute
order as without the shortcut, the same answers as the reference computations below.
"""
from __future__ import annotations

import itertools
import random

import pytest

import pypto
import pypto.compiler.loops as loops
from pypto.compiler.loops import _lines, _Template, _Tokens, fold, moved, replay
from pypto.errors import SourceLoc
from pypto.ir.core import Attrs
from pypto.ir.exec import EVENTS_PER_PIPE_PAIR, Instr, Loop, TileRef, item_lines, static_instrs, unrolled
from pypto.ir.gm import GMBuffer, GMRef

import common  # noqa: F401  (puts the benchmarks' kernels on the path)
from kernels import matmul_auto  # noqa: E402

F16, F32 = pypto.DT_FP16, pypto.DT_FP32
X = GMBuffer("x", (4096, 4096), F32, "input")
Y = GMBuffer("y", (4096, 4096), F32, "output")
Z = GMBuffer("z", (4096, 4096), F16, "input")
UB = [TileRef("UB", k * 0x1000, F32, (4, 256), (4, 256)) for k in range(4)]
L0 = [TileRef("L0A", k * 0x4000, F16, (64, 32), (64, 32)) for k in (0, 1)]
LOC = SourceLoc("kernel.py", 7)


def _flag(op, src, dst, event):
    return Instr(op, src if op == "SET_FLAG" else dst, attrs=Attrs({"src": src, "dst": dst, "event": event}))


def _stream(tiles: int, chunks: int, ring: int, event0: int = 0) -> list[Instr]:
    """A matmul's stream, small: per output tile a row load, per K chunk a load into the next of
    `ring` L1 slots and an extract from it, flags around the compute, a store."""
    out, slot = [], 0
    for t in range(tiles):
        ev = (event0 + t) % 8
        out += [Instr("TLOAD", "MTE2", UB[t % 2], (GMRef(X, t * 1024, (4, 256), (4096, 1)),), loc=LOC),
                _flag("SET_FLAG", "MTE2", "V", ev), _flag("WAIT_FLAG", "MTE2", "V", ev)]
        for k in range(chunks):
            l1 = TileRef("L1", slot * 0x8000, F16, (64, 256), (64, 256))
            slot = (slot + 1) % ring
            out += [Instr("TLOAD", "MTE2", l1, (GMRef(Z, t * 4096 + k * 256, (64, 256), (4096, 1)),)),
                    Instr("TEXTRACT", "MTE1", L0[k % 2], (l1,), Attrs({"offsets": (0, 32 * (k % 4))}))]
        out += [Instr("TADDS", "V", UB[3], (UB[t % 2], 2.0), loc=LOC),
                _flag("SET_FLAG", "V", "MTE3", ev), _flag("WAIT_FLAG", "V", "MTE3", ev),
                Instr("TSTORE", "MTE3", GMRef(Y, t * 1024, (4, 256), (4096, 1)), (UB[3],))]
    return out


def _exactly(a, b):
    """The same items: text, structure, and each instruction's attributes in the same order."""
    assert item_lines(a) == item_lines(b) and a == b
    for (x, _), (y, _) in zip(static_instrs(a), static_instrs(b)):
        assert list(x.attrs.keys()) == list(y.attrs.keys())


class _Forgetful(dict):
    """A `_Tokens.given` that keeps nothing: every `with_step` works its instruction out anew."""

    def __setitem__(self, key, value):
        pass


def _forgetful(tiles: bool = False, base: _Tokens | None = None, rings: dict | None = None) -> _Tokens:
    known = _Tokens(tiles=tiles, base=base, rings=rings)
    known.given = _Forgetful()
    return known


def test_instructions_given_a_step_once_fold_as_those_worked_out_each_time():
    rng = random.Random(3)
    for _ in range(30):
        stream = _stream(rng.randint(2, 12), rng.randint(1, 6), rng.choice([1, 2, 3, 4]), rng.randrange(8))
        first, plain = _Tokens(), _forgetful()
        _exactly(fold(stream, first), fold(stream, plain))
        _exactly(fold(stream, _Tokens(tiles=True, base=first)), fold(stream, _forgetful(True, plain)))


def test_a_compiled_matmul_folds_alike_with_and_without_the_instructions_given_steps(monkeypatch):
    T = pypto.Tensor
    args = (T([1024, 1024], F16), T([1024, 1024], F16), T([1024, 1024], F16))
    matmul_auto.cache_clear()
    shared = matmul_auto.compile(*args).program.text()
    matmul_auto.cache_clear()
    monkeypatch.setattr(loops, "_Tokens", _forgetful)
    try:
        alone = matmul_auto.compile(*args).program.text()
    finally:
        matmul_auto.cache_clear()
    assert ".loop" in shared and shared == alone


def _reference_moves_alike(keys, a, b) -> bool:
    """Whether the components `b` are `a` moved by one step per (id, component): by dicts."""
    if list(map(len, a)) != list(map(len, b)):
        return False
    want: dict = {}
    for key, x, y in zip(keys, a, b):
        for slot, (u, v) in enumerate(zip(x, y)):
            if u[0] != v[0] or type(u[1]) is not int or type(v[1]) is not int:
                return False
            move = (v[1] - u[1]) % EVENTS_PER_PIPE_PAIR if u[0] == 1 else v[1] - u[1]
            if want.setdefault((key, slot), move) != move:
                return False
    return True


def test_moves_alike_answers_as_comparing_every_component():
    """Components of ids of one to three kinds; the other stream the template's moved per id
    and component, some tokens the very tuples, some spoilt (a step, a kind, a length, a float)."""
    rng = random.Random(5)
    agree = {True: 0, False: 0}
    for _ in range(300):
        n_ids = rng.randint(1, 6)
        kinds = {i: tuple(rng.choice([0, 1, 2, 3]) for _ in range(rng.randint(0, 3))) for i in range(n_ids)}
        keys = [rng.randrange(n_ids) for _ in range(rng.randint(1, 40))]
        moving = [tuple((k, rng.randrange(1000)) for k in kinds[key]) for key in keys]
        shift = {(i, s): rng.randrange(-50, 50) for i in range(n_ids) for s in range(3)}
        other = []
        for key, comps in zip(keys, moving):
            if rng.random() < 0.4 and all(shift[key, s] % (8 if k == 1 else 1 << 30) == 0
                                          for s, (k, _) in enumerate(comps)):
                other.append(comps)             # the very tuple (it moves by nothing)
                continue
            other.append(tuple((k, v + shift[key, s]) for s, (k, v) in enumerate(comps)))
        if rng.random() < 0.5 and other:
            j = rng.randrange(len(other))
            c = list(other[j])
            spoil = rng.choice(["step", "kind", "length", "float"])
            if spoil == "length":
                c.append((0, 1))
            elif c:
                k, v = c[0]
                c[0] = {"step": (k, v + 1), "kind": ((k + 1) % 4, v), "float": (k, float(v))}[spoil]
            other[j] = tuple(c)
        template = _Template(None, (), moving)
        got = template.moves_alike(keys, other)
        assert got == _reference_moves_alike(keys, moving, other)
        assert template.moves_alike(keys, moving)          # (every tuple the very one)
        agree[got] += 1
    assert agree[True] > 30 and agree[False] > 30


def test_an_isomorphic_stream_whose_instruction_differs_in_op_or_line_is_not_moved():
    first = _stream(8, 4, 2)
    template = fold(first)
    other = [Instr(x.op, x.pipe, x.dst, x.srcs, x.attrs, x.loc) if k % 5 == 0 else x for k, x in enumerate(first)]
    items = moved(template, first, other)
    assert items is not None
    assert [x.text() for x in unrolled(items)] == [x.text() for x in other]
    _exactly(items, replay(template, other))
    k = next(k for k, x in enumerate(first) if x.op == "TADDS")
    x = first[k]
    for changed in (Instr(x.op, x.pipe, x.dst, x.srcs, x.attrs, SourceLoc("kernel.py", 8)),
                    Instr("TMULS", x.pipe, x.dst, x.srcs, x.attrs, x.loc)):
        assert moved(template, first, [*other[:k], changed, *other[k + 1:]]) is None


def test_lines_counts_the_instructions_of_the_text():
    rng = random.Random(9)
    for _ in range(20):
        stream = _stream(rng.randint(1, 10), rng.randint(1, 5), rng.choice([1, 2, 3]))
        for items in (fold(stream), fold(stream, _Tokens(tiles=True)), tuple(stream)):
            assert _lines(items) == sum(1 for _ in static_instrs(items))
    nested = (Loop(2, (Loop(3, tuple(_stream(1, 1, 1))),)), *_stream(1, 2, 1))
    assert _lines(nested) == sum(1 for _ in static_instrs(nested))


@pytest.mark.parametrize("chunks", [1, 3])
def test_streams_folded_after_others_take_the_same_loops(chunks):
    """One `_Tokens` for several streams (what the pass learnt of the first ones: its ids, its
    instructions given steps, the descriptions of the instruction objects streams share, kept for
    the whole pass) and a fresh one per stream fold alike."""
    streams = [_stream(t, chunks, ring, ev) for t, ring, ev in itertools.product((4, 9), (1, 2, 4), (0, 3))]
    # (and streams of the very instruction objects of earlier ones: folded again, and spliced)
    streams += [streams[0], streams[3], streams[1] + streams[4], streams[5][::-1]]
    known = _Tokens()
    tiles = _Tokens(tiles=True, base=known)
    for stream in streams:
        _exactly(fold(stream, known), fold(stream))
        _exactly(fold(stream, tiles), fold(stream, _Tokens(tiles=True)))


def test_an_instruction_given_one_step_at_two_depths_is_two_instructions():
    """(An `addr_step` new inside inner loops has a step of 0 for each of them.)"""
    l1 = TileRef("L1", 0, F16, (64, 256), (64, 256))
    x = Instr("TEXTRACT", "MTE1", L0[0], (l1,), Attrs({"offsets": (0, 0)}))
    steps = [0, 32, 0, 0x8000]      # its offsets, then its tiles' addresses (dst first)
    for known in (_Tokens(tiles=True), _forgetful(True)):
        y0, y1 = known.with_step(x, iter(steps), 0), known.with_step(x, iter(steps), 1)
        assert known.with_step(x, iter(steps), 0) is y0 or isinstance(known.given, _Forgetful)
        assert y0.attrs["offsets_step"] == y1.attrs["offsets_step"] == ((0, 32),)
        assert y0.attrs["addr_step"] == ((0, 0x8000),) and y1.attrs["addr_step"] == ((0, 0x8000), (0, 0))


def test_steps_equal_but_of_another_type_give_their_own_instruction():
    """(1.0 == 1 as keys, but prints otherwise.)"""
    l1 = TileRef("L1", 0, F16, (64, 256), (64, 256))
    x = Instr("TEXTRACT", "MTE1", L0[0], (l1,), Attrs({"offsets": (0, 0)}))
    known = _Tokens(tiles=True)
    floats = known.with_step(x, iter([0, 32.0, 0, 0]), 0)
    ints = known.with_step(x, iter([0, 32, 0, 0]), 0)
    assert [type(s) for s in floats.attrs["offsets_step"][0]] == [int, float]
    assert [type(s) for s in ints.attrs["offsets_step"][0]] == [int, int]


def test_periods_compared_all_at_once_or_one_by_one_agree(monkeypatch):
    """A short stream compares every candidate period at once (`ALL_PERIODS_AT_ONCE`), a long
    one period by period: the same best period and saving at each position, the same folds."""
    import numpy as np
    rng = np.random.default_rng(4)
    for _ in range(200):
        n = int(rng.integers(1, 300))
        if rng.random() < 0.7:      # a body repeated (the ids of a periodic stream), cut anywhere
            keys = np.resize(rng.integers(0, int(rng.integers(1, 9)), int(rng.integers(1, 40))), n)
        else:
            keys = rng.integers(0, 5, n)
        keys = keys.astype(np.int16)
        periods = loops._candidate_periods(keys, bool(rng.random() < 0.5))
        monkeypatch.setattr(loops, "ALL_PERIODS_AT_ONCE", 1 << 30)
        at_once = loops._best_periods(keys, periods)
        monkeypatch.setattr(loops, "ALL_PERIODS_AT_ONCE", 0)
        one_by_one = loops._best_periods(keys, periods)
        assert at_once[0].tolist() == one_by_one[0].tolist() and at_once[1].tolist() == one_by_one[1].tolist()
    streams = [_stream(t, c, ring) for t, c, ring in itertools.product((3, 8), (1, 4), (1, 3))]
    monkeypatch.setattr(loops, "ALL_PERIODS_AT_ONCE", 1 << 30)
    at_once = [(fold(s), fold(s, _Tokens(tiles=True))) for s in streams]
    monkeypatch.setattr(loops, "ALL_PERIODS_AT_ONCE", 0)
    for s, (a, b) in zip(streams, at_once):
        _exactly(fold(s), a)
        _exactly(fold(s, _Tokens(tiles=True)), b)
