"""The shortcuts of the `loops` pass fold exactly as folding from scratch does.

The pass describes each instruction once per pass (`_Tokens`), lets a stream whose instructions
have the ids of one folded before and move alike take its loops (`_folding`), gathers the loops
of an isomorphic task from a plan of its template (`_Template`), and tries the periods of a
stream on the positions where a token repeats only (`_fold_pass`).  What must hold: the folded
text, the steps and the attributes (in their order) are those a fold from scratch, or `replay`,
gives.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

import pypto
from pypto.compiler.loops import _candidate_periods, _long_runs, _Tokens, fold, moved, replay
from pypto.errors import SourceLoc
from pypto.ir.core import Attrs
from pypto.ir.exec import Instr, Loop, TileRef, item_lines, static_instrs, unrolled
from pypto.ir.gm import GMBuffer, GMRef

import common  # noqa: F401  (puts the benchmarks' kernels on the path)
from kernels import matmul_auto  # noqa: E402

F16, F32 = pypto.DT_FP16, pypto.DT_FP32
X = GMBuffer("x", (4096, 4096), F32, "input")
Y = GMBuffer("y", (4096, 4096), F32, "output")
Z = GMBuffer("z", (4096, 4096), F16, "input")
UB = [TileRef("UB", k * 0x1000, F32, (4, 256), (4, 256)) for k in range(4)]
L1 = TileRef("L1", 0, F16, (64, 256), (64, 256))
L0 = [TileRef("L0A", k * 0x4000, F16, (64, 32), (64, 32)) for k in (0, 1)]
LOC = SourceLoc("kernel.py", 7)


def _flag(op, src, dst, event):
    return Instr(op, src if op == "SET_FLAG" else dst, attrs=Attrs({"src": src, "dst": dst, "event": event}))


def _matmul_like(tiles: int, chunks: int, event0: int = 0, x0: int = 0, z0: int = 0) -> list[Instr]:
    """Per output tile: load a row block, then per K chunk a load into L1 and an extract from it,
    flags around the compute, a store: a matmul's stream, small."""
    out = []
    for t in range(tiles):
        ev = (event0 + t) % 8
        out += [Instr("TLOAD", "MTE2", UB[t % 2], (GMRef(X, x0 + t * 1024, (4, 256), (4096, 1)),), loc=LOC),
                _flag("SET_FLAG", "MTE2", "V", ev), _flag("WAIT_FLAG", "MTE2", "V", ev)]
        for k in range(chunks):
            out += [Instr("TLOAD", "MTE2", L1, (GMRef(Z, z0 + t * 4096 + k * 256, (64, 256), (4096, 1)),)),
                    Instr("TEXTRACT", "MTE1", L0[k % 2], (L1,), Attrs({"offsets": (0, 32 * (k % 4))}))]
        out += [Instr("TADDS", "V", UB[3], (UB[t % 2], 2.0), loc=LOC),
                _flag("SET_FLAG", "V", "MTE3", ev), _flag("WAIT_FLAG", "V", "MTE3", ev),
                Instr("TSTORE", "MTE3", GMRef(Y, t * 1024, (4, 256), (4096, 1)), (UB[3],))]
    return out


def _copied(stream, events: int = 0, by: dict | None = None, reorder: bool = False) -> list[Instr]:
    """The stream as another task has it: every instruction a copy (its attributes too, their
    order reversed with `reorder`), its event ids rotated by `events`, its windows moved by `by`."""
    by = by or {}

    def move(o):
        return GMRef(o.buf, o.offset + by.get(o.buf.name, 0), o.shape, o.strides) if isinstance(o, GMRef) else o
    out = []
    for x in stream:
        a = dict(x.attrs)
        if "event" in a:
            a["event"] = (a["event"] + events) % 8
        if reorder:
            a = dict(reversed(list(a.items())))
        out.append(Instr(x.op, x.pipe, move(x.dst), tuple(move(o) for o in x.srcs), Attrs(a), x.loc))
    return out


def _exactly(a, b):
    """The same items: text, structure, and each instruction's attributes in the same order."""
    assert item_lines(a) == item_lines(b) and a == b
    for (x, _), (y, _) in zip(static_instrs(a), static_instrs(b)):
        assert list(x.attrs.keys()) == list(y.attrs.keys())


@pytest.mark.parametrize("events, by", [(0, {}), (3, {"x": 4096, "z": 256, "y": 8192}), (5, {"z": 12})])
def test_a_stream_with_the_ids_of_one_folded_before_folds_as_from_scratch(events, by):
    first = _matmul_like(12, 6)
    other = _copied(first, events, by)
    known = _Tokens()
    fold(first, known)
    items = fold(other, known)                  # takes the loops of the first (`_folding`)
    assert any(isinstance(x, Loop) for x in items)
    _exactly(items, fold(other))
    assert [x.text() for x in unrolled(items)] == [x.text() for x in other]


def test_a_stream_that_moves_otherwise_is_folded_on_its_own():
    first = _matmul_like(12, 6)
    other = _copied(first, 0, {"x": 4096})
    other[3] = Instr(other[3].op, other[3].pipe, other[3].dst,         # one load of Z elsewhere
                     (GMRef(Z, 7, (64, 256), (4096, 1)),), other[3].attrs, other[3].loc)
    known = _Tokens()
    fold(first, known)
    items = fold(other, known)
    _exactly(items, fold(other))
    assert [x.text() for x in unrolled(items)] == [x.text() for x in other]


def _floats(stream):
    """The stream with its extract offsets as floats: equal values of another type."""
    return [Instr(x.op, x.pipe, x.dst, x.srcs, x.attrs.replace(offsets=tuple(map(float, x.attrs["offsets"]))), x.loc)
            if "offsets" in x.attrs else x for x in stream]


def test_equal_values_of_other_types_are_not_taken_for_one_another():
    """What moves is each instruction's own (0.0 prints otherwise than 0), and ids are equal as
    the keys are (a nan is not equal to another)."""
    known = _Tokens()
    ext = Instr("TEXTRACT", "MTE1", L0[0], (L1,), Attrs({"offsets": (0, 32)}))
    flag = _flag("SET_FLAG", "MTE2", "V", 1)
    ids, moving = known.describe_all([ext, *_floats([ext]), flag, _flag("SET_FLAG", "MTE2", "V", 1.0)])
    assert ids[0] == ids[1] and ids[2] == ids[3]
    assert [type(v) for c in moving for _, v in c] == [int, int, float, float, int, float]
    nan = [Instr("TADDS", "V", UB[0], (UB[1], 1.0), Attrs({"value": float("nan")})) for _ in range(2)]
    ids, _ = known.describe_all(nan)
    assert ids[0] != ids[1]
    first = _matmul_like(8, 4)
    other = _floats(_copied(first, 0, {"x": 1024}))
    fold(first, known)
    _exactly(fold(other, known), fold(other))


@pytest.mark.parametrize("reorder", [False, True])
def test_an_isomorphic_task_of_copied_instructions_takes_the_loops_of_the_first(reorder):
    first = _matmul_like(10, 4)
    template = fold(first)
    # some instructions the very ones of the first (streams of a shape share them), the others
    # copies: equal attributes, maybe in another order, or other event ids
    other = _copied(first, 0, {"x": 1024, "z": 4096, "y": 2048}, reorder)
    other = [x if k % 3 == 0 and not isinstance(x.dst, GMRef) and not any(isinstance(o, GMRef) for o in x.srcs)
             else y for k, (x, y) in enumerate(zip(first, other))]
    items = moved(template, first, other)
    assert items is not None
    _exactly(items, replay(template, other))
    assert [x.text() for x in unrolled(items)] == [x.text() for x in other]
    # the extracts' own offsets (floats), with the steps of the first (as `moved` has them)
    got = [x for x, _ in static_instrs(moved(template, first, _floats(other))) if x.op == "TEXTRACT"]
    want = [x for x, _ in static_instrs(template) if x.op == "TEXTRACT"]
    assert [x.attrs["offsets_step"] for x in got] == [x.attrs["offsets_step"] for x in want]
    assert all(type(o) is float for x in got for o in x.attrs["offsets"])


def test_long_runs_and_candidate_periods():
    rng = np.random.default_rng(1)
    for _ in range(50):
        same = rng.random(int(rng.integers(1, 200))) < rng.random()
        p = int(rng.integers(1, 6))
        run = [next((j for j in range(i, len(same)) if not same[j]), len(same)) - i for i in range(len(same))]
        at, got = _long_runs(same, p)
        assert at.tolist() == [i for i in range(len(same)) if run[i] >= p]
        assert got.tolist() == [run[i] for i in at.tolist()]
    for _ in range(50):
        keys = [int(k) for k in rng.integers(0, int(rng.integers(1, 12)), int(rng.integers(1, 300)))]
        assert _candidate_periods(np.asarray(keys, np.int64)) == _reference_periods(keys)


def _reference_periods(keys, most: int = 16) -> list[int]:
    """`_candidate_periods` by dicts and loops (the gaps between consecutive occurrences of each
    id up to SMALL_PERIOD and twice them, then the commonest gaps of the rarer ids)."""
    n = len(keys)
    where: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        where.setdefault(key, []).append(i)
    small, gaps = set(), {}
    for occ in where.values():
        for a, b in zip(occ, occ[1:]):
            if b - a <= 48:
                small |= {b - a, 2 * (b - a)}
            if len(occ) <= max(2, n // 16):
                gaps[b - a] = gaps.get(b - a, 0) + 1
                gaps.setdefault(2 * (b - a), 0)
    structural = sorted(gaps, key=lambda g: (-gaps[g], g))[:most]
    return list(dict.fromkeys(sorted(p for p in small if p <= n // 2) + [p for p in structural if p <= n // 2]))


def test_random_streams_fold_alike_with_and_without_what_the_pass_learnt():
    rng = random.Random(7)
    for _ in range(40):
        first = _matmul_like(rng.randint(2, 16), rng.randint(1, 5), rng.randrange(8), rng.randrange(4) * 256)
        if rng.random() < 0.5:                  # an irregular tile: its load elsewhere
            k = rng.randrange(len(first))
            x = first[k]
            if x.op == "TLOAD":
                first[k] = Instr(x.op, x.pipe, x.dst, (GMRef(x.srcs[0].buf, 1, x.srcs[0].shape, x.srcs[0].strides),),
                                 x.attrs, x.loc)
        other = _copied(first, rng.randrange(8), {b: rng.choice([0, 256, 4096]) for b in "xyz"}, rng.random() < 0.3)
        known = _Tokens()
        for stream in (first, other):
            items = fold(stream, known)
            _exactly(items, fold(stream))
            assert [x.text() for x in unrolled(items)] == [x.text() for x in stream]


def test_a_compiled_matmul_runs_the_same_instructions():
    """Its tasks: a few shapes, the others isomorphic to one (`moved`), some of another shape
    but the same instructions (`_folding`)."""
    T = pypto.Tensor
    ck = matmul_auto.compile(T([1024, 1024], F16), T([1024, 1024], F16), T([1024, 1024], F16))
    flat = matmul_auto.compile(T([1024, 1024], F16), T([1024, 1024], F16), T([1024, 1024], F16),
                               options={"loops": False})
    assert any(isinstance(i, Loop) for t in ck.program.tasks for i in t.code)
    for t, u in zip(ck.program.tasks, flat.program.tasks):
        assert [x.text() for x in unrolled(t.code)] == [x.text() for x in u.instrs]


def _ring_like(tiles: int, chunks: int, ring: int, serpentine: bool, event0: int = 0) -> list[Instr]:
    """A matmul's stream whose tiles move: per output tile, per K chunk a load into the next of
    `ring` L1 slots and an extract from it (K walked back and forth with `serpentine`), flags
    around the compute, a store from one of two UB buffers."""
    out, slot = [], 0
    for t in range(tiles):
        ev = (event0 + t) % 8
        ks = range(chunks) if not serpentine or t % 2 == 0 else range(chunks - 1, -1, -1)
        for k in ks:
            l1 = TileRef("L1", slot * 0x8000, F16, (64, 256), (64, 256))
            slot = (slot + 1) % ring
            out += [Instr("TLOAD", "MTE2", l1, (GMRef(Z, t * 4096 + k * 256, (64, 256), (4096, 1)),)),
                    Instr("TEXTRACT", "MTE1", L0[k % 2], (l1,), Attrs({"offsets": (0, 32 * (k % 4))}))]
        out += [Instr("TADDS", "V", UB[t % 2], (UB[3], 2.0), loc=LOC),
                _flag("SET_FLAG", "V", "MTE3", ev), _flag("WAIT_FLAG", "V", "MTE3", ev),
                Instr("TSTORE", "MTE3", GMRef(Y, t * 1024, (4, 256), (4096, 1)), (UB[t % 2],))]
    return out


def test_streams_whose_tiles_move_fold_with_addr_step_and_unroll_to_themselves():
    """The second stage (`_Tokens(tiles=True)`): tile addresses are moving components; what is
    folded unrolls to the very stream, with or without the first stage's descriptions, and an
    isomorphic stream (another task's windows) takes its loops."""
    from pypto.ir.exec import ADDR_STEP
    rng = random.Random(11)
    stepped = 0
    for _ in range(40):
        stream = _ring_like(rng.randint(2, 12), rng.randint(1, 6), rng.choice([1, 2, 3, 4, 6]),
                            rng.random() < 0.5, rng.randrange(8))
        first = _Tokens()
        fold(stream, first)
        alone = fold(stream, _Tokens(tiles=True))
        based = fold(stream, _Tokens(tiles=True, base=first))
        _exactly(based, alone)
        assert [x.text() for x in unrolled(alone)] == [x.text() for x in stream]
        stepped += any(ADDR_STEP in x.attrs for x, _ in static_instrs(alone))
        other = _copied(stream, 0, {"z": 8192, "y": 4096})
        taken = moved(alone, stream, other)
        assert taken is not None
        assert [x.text() for x in unrolled(taken)] == [x.text() for x in other]
        again = replay(alone, other)
        assert [x.text() for x in unrolled(again)] == [x.text() for x in other]
    assert stepped >= 20
