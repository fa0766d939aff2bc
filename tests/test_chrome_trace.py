"""The Chrome trace file (`res.to_chrome_trace`): every executed instruction a slice on its core's
pipe at the cycles the run timed it, written as it is made (a million-instruction run's trace is
streamed, not built as a list of dicts first) and put in place only when complete."""
from __future__ import annotations

import json
import os

import pytest

import pypto
from pypto.sim.trace import write_chrome_trace

from common import matmul, softmax

F16, F32 = pypto.DT_FP16, pypto.DT_FP32
T = pypto.Tensor


def _runs():
    mm = matmul.compile(T([256, 512], F16), T([512, 256], F16), T([256, 256], F16), machine="a2a3",
                        ML0=128, NL0=128, KL0=64, KL1=128)
    sm = softmax.compile(T([64, 512], F32), T([64, 512], F32), machine="a2a3", TM=16, TN=512)
    return [mm.simulate(mode="timing"), sm.simulate(mode="timing")]


@pytest.mark.parametrize("which", [0, 1], ids=["matmul", "softmax"])
def test_every_instruction_is_a_slice_at_its_cycles(which, tmp_path):
    res = _runs()[which]
    path = res.to_chrome_trace(tmp_path / "t.json")
    assert path == str(tmp_path / "t.json")
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~mask      # as a file `open(path, "w")` makes
    data = json.loads(open(path).read())
    events = data["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    slices = [e for e in events if e["ph"] == "X" and e["cat"] != "task"]
    us = 1.0 / (res.machine.clock_ghz * 1e3)
    want = []
    for e in res.trace:                 # the reference: the run's own events, field by field
        args = {"cycles": e.end - e.start, "start_cycle": e.start, "task": e.task, "instr": e.index, "line": e.line}
        if e.ready >= 0:
            args["data_ready_cycle"] = e.ready
        want.append((e.core, e.pipe, e.op, round(e.start * us, 6), round((e.end - e.start) * us, 6), args))
    got = [(procs[s["pid"]], threads[s["pid"], s["tid"]], s["name"], s["ts"], s["dur"], s["args"]) for s in slices]
    assert got == want
    assert any("data_ready_cycle" in s["args"] for s in slices)      # (loads: data after their latency)
    assert data["otherData"] == {"kernel": res.kernel, "machine": "a2a3", "clock_ghz": res.machine.clock_ghz}
    assert [e["args"]["task"] for e in events if e["ph"] == "X" and e["cat"] == "task"] == \
        sorted(res.task_times)


def test_a_failed_write_leaves_the_old_file_and_no_other(tmp_path):
    res = _runs()[1]
    path = tmp_path / "t.json"
    path.write_text("before")

    def broken():
        yield from list(res.trace)[:5]
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        write_chrome_trace(path, broken(), res.machine, res.kernel)
    assert path.read_text() == "before"
    assert os.listdir(tmp_path) == ["t.json"]
    write_chrome_trace(path, res.trace, res.machine, res.kernel)
    assert len([e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]) == len(res.trace)
    assert os.listdir(tmp_path) == ["t.json"]
