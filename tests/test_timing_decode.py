"""The timing decoder's shortcuts give the rows of decoding every instruction on its own.

`timing.Decoder` works a row out once per key (the op, pipe and operand objects; a GM transfer's
window by its buffer, shape and strides, not its offset), maps the instructions to those rows
with C-level passes, and copies the rows of the first task of a stream shape to the others but
for their GM windows; the compiled engine numbers the GM windows with numpy.  Each is checked
here against the plain way: every instruction decoded alone, every window compared as a GMRef.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import pypto
from pypto.ir.exec import STREAM_SHAPES, stream_shape
from pypto.ir.gm import GMBuffer, GMRef
from pypto.ir.program import Program
from pypto.sim import simulate, timing, timing_fast

from common import matmul, matmul_bias_gelu, softmax

F16, F32 = pypto.DT_FP16, pypto.DT_FP32
T = pypto.Tensor


def _plain_rows(task, machine) -> list[tuple]:
    """Each instruction decoded by a decoder of its own: no key, form or stream shape shared."""
    rows = []
    for ins in task.instrs:
        d = timing.Decoder(machine)
        if ins.op in ("SET_FLAG", "WAIT_FLAG", "CROSS_SET_FLAG", "CROSS_WAIT_FLAG"):
            rows.append(d._flag_row(ins)[1])
        elif ins.op in ("TLOAD", "TSTORE") and (isinstance(ins.dst, GMRef) or isinstance(ins.srcs[0], GMRef)):
            rows.append(d._gm_row(ins))
        else:
            rows.append(d._compute_row(ins)[1])
    return rows


def _plain_flops(program) -> int:
    return sum(timing.matmul_flops(i) for t in program.tasks for i in t.instrs if i.op.startswith("TMATMUL"))


KERNELS = {
    "matmul": lambda: matmul.compile(T([512, 512], F16), T([512, 512], F16), T([512, 512], F16)),
    "matmul+bias+gelu": lambda: matmul_bias_gelu.compile(T([256, 512], F16), T([512, 512], F16), T([512], F16),
                                                         T([256, 512], F16)),
    "softmax": lambda: softmax.compile(T([512, 1024], F32), T([512, 1024], F32), TM=64, TN=256),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_rows_are_those_of_every_instruction_decoded_alone(name):
    ck = KERNELS[name]()
    program = ck.program
    decoder = timing.Decoder(ck.machine)
    for t in program.tasks:
        assert decoder.task(t, program) == _plain_rows(t, ck.machine)
    assert decoder.flops == _plain_flops(program)
    # GM transfers of windows of one buffer, shape and strides share a row but for the window
    assert len(decoder.forms) < sum(len(t.instrs) for t in program.tasks)


def _with_window(program, tid: int, k: int, window: GMRef):
    """The program with instruction k of task tid reading / writing `window`, its stream shape
    kept (as if the compiler found it isomorphic to the others of its shape)."""
    shapes = dict(program.__dict__[STREAM_SHAPES])
    t = program.tasks[tid]
    ins = t.instrs[k]
    new = dataclasses.replace(ins, srcs=(window,) + ins.srcs[1:]) if ins.op == "TLOAD" else \
        dataclasses.replace(ins, dst=window)
    code = t.instrs[:k] + (new,) + t.instrs[k + 1:]
    shapes[id(code)] = (code, stream_shape(program, t.code))
    tasks = list(program.tasks)
    tasks[tid] = dataclasses.replace(t, code=code)
    out = Program(program.name, program.buffers, tuple(tasks))
    out.__dict__[STREAM_SHAPES] = shapes
    # (not verified: a window of half the tile's elements is timed by its bytes all the same)
    out.__dict__["_verified_for"] = program.__dict__.get("_verified_for", set())
    return out


def _strides(w):
    return GMRef(w.buf, w.offset, w.shape, tuple(reversed(w.strides)))      # a transposed view


def _buffer(w):
    buf = GMBuffer(w.buf.name, w.buf.shape, w.buf.dtype, w.buf.role)         # equal, not the same object
    return GMRef(buf, w.offset, w.shape, w.strides)


def _shape(w):
    return GMRef(w.buf, w.offset, (w.shape[0] // 2,) + w.shape[1:], w.strides)


@pytest.mark.parametrize("change", [_strides, _buffer, _shape])
@pytest.mark.parametrize("which", ["first", "last"])
def test_a_window_of_another_buffer_shape_or_strides_gets_its_own_row(change, which):
    """The first task of a shape decodes a transfer of such a window on its own, and a task
    isomorphic to it does not take the first task's row there (nor its window classes)."""
    ck = KERNELS["matmul"]()
    program = ck.program
    shape_of = [stream_shape(program, t.code) for t in program.tasks]
    tid = (min if which == "first" else max)(i for i, s in enumerate(shape_of) if shape_of.count(s) > 1)
    loads = [j for j, i in enumerate(program.tasks[tid].instrs) if i.op == "TLOAD"]
    k = loads[len(loads) // 2]          # a load after others of the same buffer and tile
    changed = _with_window(program, tid, k, change(program.tasks[tid].instrs[k].srcs[0]))
    decoder = timing.Decoder(ck.machine)
    for t in changed.tasks:
        assert decoder.task(t, changed) == _plain_rows(t, ck.machine)
    got = [timing.Decoder(ck.machine).decoded(t, changed) for t in changed.tasks][tid]
    assert got.like is None
    # both engines run it as they run it without the stream shapes (every task decoded alone)
    bare = Program(changed.name, changed.buffers, changed.tasks)
    bare.__dict__["_verified_for"] = changed.__dict__["_verified_for"]
    for engine in ("python", "compiled") if timing_fast.AVAILABLE else ("python",):
        a = simulate(changed, machine=ck.machine, mode="timing", engine=engine)
        b = simulate(bare, machine=ck.machine, mode="timing", engine=engine)
        assert (a.cycles, a.task_times, a.stats) == (b.cycles, b.task_times, b.stats)


def _same_partition(ids, windows):
    """ids[i] == ids[j] exactly when windows[i] == windows[j] (GMRef equality)."""
    first: dict = {}
    for i, w in zip(ids, windows):
        assert first.setdefault(w, i) == i
    assert len(set(ids)) == len(first)


@pytest.mark.skipif(not timing_fast.AVAILABLE, reason="numba is not installed")
def test_window_ids_number_the_windows_as_gmref_equality_does():
    ck = KERNELS["matmul+bias+gelu"]()
    program = ck.program
    numbered = timing_fast._WindowIds()
    decoder = timing.Decoder(ck.machine)
    windows = []
    for t in program.tasks:
        d = decoder.decoded(t, program)
        numbered.add(d)
        windows += d.windows
    ids = numbered.ids().tolist()
    assert numbered.n == len(set(windows)) and len(ids) == len(windows)
    _same_partition(ids, windows)


@pytest.mark.skipif(not timing_fast.AVAILABLE, reason="numba is not installed")
def test_window_ids_of_equal_buffers_far_offsets_and_other_objects():
    a = GMBuffer("a", (1 << 40, 4), F16, "input")
    a2 = GMBuffer("a", (1 << 40, 4), F16, "input")          # equal to a: the same windows
    b = GMBuffer("b", (64, 64), F16, "input")

    def decoded(ws):
        return timing.Decoded(np.zeros(0, np.int32), np.zeros(len(ws), np.int64), ws)

    windows = [GMRef(a, 0, (2, 4), (4, 1)), GMRef(a2, 0, (2, 4), (4, 1)), GMRef(a, 1 << 61, (2, 4), (4, 1)),
               GMRef(a, 0, (2, 4), (1, 2)), GMRef(b, 0, (2, 4), (4, 1)), GMRef(a2, 1 << 61, (2, 4), (4, 1)),
               GMRef(b, 8, (2, 4), (4, 1))]
    for split in ([windows], [windows[:3], windows[3:]]):
        numbered = timing_fast._WindowIds()        # offsets that span 2^42 elements: numbered in pairs
        for ws in split:
            numbered.add(decoded(ws))
        _same_partition(numbered.ids().tolist(), windows)
        assert numbered.n == 5
    # offsets spanning 2^62 elements over five classes: a (class, offset) pair does not fit one
    # int64 (class 4 at offset 0 would wrap onto class 0 at offset 4)
    far = [GMRef(a, 4, (1, 1), (4, 1)), GMRef(a, 1 << 62, (1, 2), (4, 1))] + \
        [GMRef(a, 0, (1, n), (4, 1)) for n in (3, 4, 1, 5)]
    numbered = timing_fast._WindowIds()
    numbered.add(decoded(far))
    _same_partition(numbered.ids().tolist(), far)
    assert numbered.n == 6
    # a transfer whose window is not a GMRef: every window numbered by its own equality
    odd = ("not a window",)
    numbered = timing_fast._WindowIds()
    numbered.add(decoded(windows[:2]))
    numbered.add(decoded([odd, odd, windows[0]]))
    _same_partition(numbered.ids().tolist(), windows[:2] + [odd, odd, windows[0]])
