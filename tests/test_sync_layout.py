"""insert_sync's C-level fast paths against the plain loops they replace: the flagged stream
`_flag_layout` gathers (flags shared between positions) and `stream_accesses` (worked out per
distinct instruction object)."""
import pytest

import pypto
from pypto.compiler.sync import _flag_layout, _sync_task, plan_flags
from pypto.dtypes import DT_FP16, DT_FP32
from pypto.ir.core import Attrs
from pypto.ir.exec import SYNC_OPS, Instr, TileRef, accesses, stream_accesses, written_gm
from pypto.ir.gm import GMBuffer, GMRef
from common import matmul, softmax

T = pypto.Tensor


def _plain_flagged(instrs, plan) -> list[str]:
    """The flagged stream's text, position by position: the plan's operations before, the
    instruction, its operations after, each flag a new instruction."""
    before, after, _ = plan
    out = []

    def flag(op, pipe, key):
        return Instr(op, pipe, None, (), Attrs({"src": key[0], "dst": key[1], "event": key[2]})).text()
    for k, ins in enumerate(instrs):
        out += [flag(*o) for o in before.get(k, ())]
        out.append(ins.text())
        out += [flag(*o) for o in after.get(k, ())]
    return out


def _streams():
    """Unsynced streams of a few compiled kernels (AIC and AIV) and a hand-made one whose event
    ids run out (flags back, several flags at one position)."""
    out = []
    for kernel, specs, consts in [(matmul, (T([256, 256], DT_FP16),) * 3, {}),
                                  (softmax, (T([256, 256], DT_FP32),) * 2, dict(TM=64, TN=256))]:
        ck = kernel.compile(*specs, **consts, options={"loops": False})
        out += [tuple(i for i in t.instrs if i.op not in SYNC_OPS) for t in ck.exec_graph.tasks[:3]]
    big = GMBuffer("big", (32, 1024), DT_FP32, "input")
    xs = GMBuffer("xs", (12, 8, 64), DT_FP32, "input")
    res = GMBuffer("out", (8, 64), DT_FP32, "output")
    ub = lambda addr, shape: TileRef("UB", addr, DT_FP32, shape, shape)    # noqa: E731
    tb = ub(0, (32, 1024))
    s = [Instr("TLOAD", "MTE2", tb, (GMRef.whole(big),))] + [Instr("TEXP", "V", tb, (tb,))] * 3
    tiles = [ub(0x21000 + k * 0x800, (8, 64)) for k in range(12)]
    s += [Instr("TLOAD", "MTE2", t, (GMRef(xs, k * 512, (8, 64), (64, 1)),)) for k, t in enumerate(tiles)]
    acc = ub(0x20000, (8, 64))
    s += [Instr("TADD", "V", acc, (tiles[0], tiles[1]))] + [Instr("TADD", "V", acc, (acc, t)) for t in tiles[2:]]
    s.append(Instr("TSTORE", "MTE3", GMRef.whole(res), (acc,)))
    return out + [tuple(s)]


@pytest.mark.parametrize("k", range(7))
def test_flag_layout_is_the_plain_flagged_stream(k):
    instrs = _streams()[k]
    plan = plan_flags([i.pipe for i in instrs], [accesses(i, written_gm(instrs)) for i in instrs])
    assert plan[0] or plan[1]
    synced = _sync_task(instrs)
    assert [i.text() for i in synced] == _plain_flagged(instrs, plan)
    # equal flags are one object: as many flag objects as distinct flag texts
    flags = [i for i in synced if i.op in ("SET_FLAG", "WAIT_FLAG")]
    assert len({id(i) for i in flags}) == len({i.text() for i in flags})
    flag_objs, gather = _flag_layout(plan, len(instrs))
    assert len(flag_objs) == len({id(i) for i in flags})


@pytest.mark.parametrize("k", range(7))
def test_stream_accesses_are_accesses(k):
    instrs = _streams()[k]
    written = {i.dst.buf.name for i in instrs if isinstance(i.dst, GMRef)}
    assert stream_accesses(instrs) == [accesses(i, written) for i in instrs]
    # distinct but equal instruction objects get equal answers
    copies = tuple(Instr(i.op, i.pipe, i.dst, i.srcs, i.attrs, i.loc) for i in instrs)
    assert stream_accesses(copies) == stream_accesses(instrs)


def test_equal_flags_are_shared():
    # (a stream whose flags repeat: fewer flag objects than flags)
    repeats = 0
    for instrs in _streams():
        flags = [i for i in _sync_task(instrs) if i.op in ("SET_FLAG", "WAIT_FLAG")]
        repeats += len({id(i) for i in flags}) < len(flags)
    assert repeats
