"""The functional plan's levels of dependence (`functional_plan._dependence_levels`) against their
definition, pair by pair: a rule's level is 0, or one more than the highest level of an earlier
rule sharing a byte (an element of a GM buffer the stream writes) with it, one of the two writing;
a grouped loop's marker reads and writes all it touches.

The plan keeps levels per footprint in a memory whose footprints are each the very same or apart
(a matmul's L0C, its output's windows) and per byte where they overlap in part (an L1 panel, the
blocks extracted from it and a tail tile loaded over part of it): streams with both are checked."""
from __future__ import annotations

import numpy as np
import pytest

import pypto
import pypto.sim.functional_plan as fp

from common import matmul, softmax

F16, F32 = pypto.DT_FP16, pypto.DT_FP32
T = pypto.Tensor


def _streams(program, machine) -> list:
    """The (rules, caps) of every stream the plan of `program` orders by levels."""
    got = []
    real = fp._dependence_levels

    def spy(rules, caps):
        got.append((list(rules), caps))
        return real(rules, caps)
    fp._dependence_levels = spy
    try:
        program.__dict__.pop("_functional_plans", None)
        assert fp.plan_for(program, machine) is not None
    finally:
        fp._dependence_levels = real
    return got


def _touched(o, written: set, base: dict) -> int:
    """The bytes (elements of a written GM buffer) an operand covers, as bits of one integer: the
    memories one after the other from `base` (memory -> its first bit; extended as met)."""
    if isinstance(o, pypto.ir.exec.TileRef):
        mask = np.zeros(o.addr + o.nbytes, np.int8)
        fp._tile_bytes(mask, o)[...] = 1
        where, name = np.flatnonzero(mask), o.space
    elif isinstance(o, fp._GM) and o.ref.buf.name in written:
        r = o.ref
        where = np.full(r.shape, r.offset, np.int64)
        for d, (n, s) in enumerate(zip(r.shape, r.strides)):
            shape = [1] * len(r.shape)
            shape[d] = n
            where = where + (np.arange(n) * s).reshape(shape)
        where, name = where.reshape(-1), r.buf.name
    else:
        return 0
    if name not in base:
        base[name] = max(base.values(), default=0) + (1 << 24)     # (room for any space or buffer here)
    bits = np.zeros(base[name] + int(where.max()) + 1, np.uint8)
    bits[base[name] + where] = 1
    return int.from_bytes(np.packbits(bits, bitorder="little").tobytes(), "little")


def _by_definition(rules) -> list[int]:
    written = {d.ref.buf.name for _, (d, *_), _ in rules if isinstance(d, fp._GM)}
    written |= {o.ref.buf.name for f, (_, *hulls), _ in rules if fp._is_loop(f) for o in hulls}
    base: dict = {}
    reads, writes = [], []
    for f, (dst, *srcs), _ in rules:
        r = 0
        for o in srcs:
            r |= _touched(o, written, base)
        w = _touched(dst, written, base) | (r if fp._is_loop(f) else 0)
        reads.append(r)
        writes.append(w)
    levels = []
    for i in range(len(rules)):
        deps = [levels[j] + 1 for j in range(i)
                if (writes[j] & (reads[i] | writes[i])) or (reads[j] & writes[i])]
        levels.append(max(deps, default=0))
    return levels


def _panels():
    """A hand-written cube stream whose L1 panel stays (a block is read after a tail load over
    the panel's other half): its blocks and the tail tile overlap the panel in part."""
    import test_functional_panels as tp
    return tp.program(tp.MUST_STAY["rest-read-after-a-partial-overwrite"]())


def _kernels():
    mm = matmul.compile(T([256, 512], F16), T([512, 384], F16), T([256, 384], F16), machine="a2a3",
                        ML0=128, NL0=128, KL0=64, KL1=128)                    # L1 panels, extracted blocks
    tail = matmul.compile(T([200, 320], F16), T([320, 136], F16), T([200, 136], F16), machine="a2a3",
                          ML0=128, NL0=128, KL0=64, KL1=128)                  # tail tiles
    sm = softmax.compile(T([96, 512], F32), T([96, 512], F32), machine="a2a3", TM=8, TN=512)
    return {"matmul": mm, "matmul with tails": tail, "softmax": sm}


@pytest.mark.parametrize("name", ["matmul", "matmul with tails", "softmax", "panel kept"])
def test_levels_are_their_definition(name):
    if name == "panel kept":
        program, machine = _panels(), pypto.sim.get_machine("a2a3")
    else:
        ck = _kernels()[name]
        program, machine = ck.program, ck.machine
    streams = _streams(program, machine)
    assert streams
    for rules, caps in streams:
        assert fp._dependence_levels(rules, caps) == _by_definition(rules)


def test_both_ways_of_keeping_levels_are_met():
    """The kept panel's stream keeps some memory per footprint (L0C) and some per byte (L1, its
    panel, blocks and tail tile), else the test above would not check both.  (Compiled matmuls
    no longer keep L1 panels: their blocks are read from GM.)"""
    (rules, caps), *_ = _streams(_panels(), pypto.sim.get_machine("a2a3"))
    spaces = {o.space for _, ops, _ in rules for o in ops if isinstance(o, pypto.ir.exec.TileRef)}
    footprints = {s: {(o.addr, o.valid, o.shape, o.dtype) for _, ops, _ in rules for o in ops
                      if isinstance(o, pypto.ir.exec.TileRef) and o.space == s} for s in spaces}

    def apart_or_same(s):
        seen = np.zeros(caps[s], np.int32)
        for j, (addr, valid, shape, dtype) in enumerate(footprints[s], 1):
            v = fp._tile_bytes(seen, pypto.ir.exec.TileRef(s, addr, dtype, shape, valid))
            if v.any():
                return False
            v[...] = j
        return True
    kinds = {apart_or_same(s) for s in spaces}
    assert kinds == {True, False}
