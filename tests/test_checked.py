"""Checked simulation: races, deadlocks, uninitialised reads and event reuse in edited programs."""
import numpy as np
import pytest

import pypto
from pypto.sim import simulate


@pypto.jit
def softmax(x, out, *, TM: int = 32, TN: int = 256):
    pypto.set_vec_tile_shapes(TM, TN)
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)


@pytest.fixture(scope="module")
def compiled():
    x = np.random.default_rng(0).random((64, 512), dtype=np.float32)
    out = np.zeros_like(x)
    return softmax.compile(x, out, machine="teach"), x, out


def _edit(program, drop=None, dup=None, replace=None):
    """The program's text with one line dropped, duplicated or replaced, parsed back."""
    lines = program.text().splitlines()
    if drop is not None:
        del lines[drop]
    if dup is not None:
        lines.insert(dup, lines[dup])
    if replace is not None:
        i, old, new = replace
        lines[i] = lines[i].replace(old, new, 1)
    return pypto.Program.parse("\n".join(lines))


def _first(lines, op, start=0):
    return next(i for i, line in enumerate(lines) if i >= start and line.strip().startswith(op))


def test_compiled_programs_pass_the_checks(compiled):
    ck, x, out = compiled
    res = simulate(ck.program, x, out, machine="teach", check=True)
    want = ck.simulate(x, out)
    assert res.cycles == want.cycles
    np.testing.assert_array_equal(res.outputs["out"], want.outputs["out"])


def test_removed_wait_flag_is_reported_as_a_race(compiled):
    ck, x, out = compiled
    lines = ck.program.text().splitlines()
    wait = _first(lines, "WAIT_FLAG")
    bad = _edit(ck.program, drop=wait)
    simulate(bad, x, out, machine="teach")              # unchecked: runs, silently wrong timing
    with pytest.raises(pypto.SimulationError) as ei:
        simulate(bad, x, out, machine="teach", check=True)
    msg = str(ei.value)
    assert "race in task 0" in msg
    # both instructions, their task and the kernel's source line are named
    assert "TLOAD on MTE2" in msg and "TROWMAX on V" in msg
    assert "test_checked.py" in msg and "pypto.amax(x, dim=-1, keepdim=True)" in msg


def test_removed_set_flag_is_a_deadlock_not_a_hang(compiled):
    ck, x, out = compiled
    lines = ck.program.text().splitlines()
    bad = _edit(ck.program, drop=_first(lines, "SET_FLAG"))
    with pytest.raises(pypto.SimulationError) as ei:
        simulate(bad, mode="timing", machine="teach")
    msg = str(ei.value)
    assert "deadlock" in msg and "waits for flag MTE2->V event 0" in msg


def test_read_of_uninitialised_tile_is_reported(compiled):
    ck, x, out = compiled
    lines = ck.program.text().splitlines()
    i = _first(lines, "TROWMAX")
    # make the first TROWMAX read a UB region nothing wrote
    bad = _edit(ck.program, replace=(i, "UB[0x0]:fp32[32,256]", "UB[0x20000]:fp32[32,256]"))
    with pytest.raises(pypto.SimulationError) as ei:
        simulate(bad, x, out, machine="teach", mode="functional", check=True)
    assert "reads uninitialised UB data at 0x20000" in str(ei.value)
    assert "instruction" in str(ei.value) and "expected" in str(ei.value)


def test_event_reused_before_its_wait():
    x = np.ones((32, 2048), np.float32)
    ck = softmax.compile(x, np.zeros_like(x), machine="teach")
    lines = ck.program.text().splitlines()
    # V frees a buffer for MTE2, which is still busy loading the next tile: a second set of the
    # same event id arrives while the first is pending
    i = next(k for k, line in enumerate(lines) if line.strip().startswith("SET_FLAG") and "V -> MTE2" in line)
    bad = _edit(ck.program, dup=i)
    with pytest.raises(pypto.SimulationError) as ei:
        simulate(bad, mode="timing", machine="teach", check=True)
    assert "event id reused before its wait" in str(ei.value)


def test_race_between_tasks_when_a_dependency_is_removed(compiled):
    ck, x, out = compiled
    text = ck.program.text()
    consumer = next(t for t in ck.program.tasks if t.deps)
    head = f".task {consumer.id} AIV group={consumer.group} deps={list(consumer.deps)} core={consumer.core}"
    assert head in text
    # without its dependency and its core (it would wait for the producer's core), the consumer
    # starts at once on a free core, while the producer still writes what it reads
    bad = pypto.Program.parse(text.replace(head, f".task {consumer.id} AIV group={consumer.group} deps=[]"))
    with pytest.raises(pypto.SimulationError) as ei:
        simulate(bad, x, out, machine="teach", check=True)
    assert "race between tasks" in str(ei.value) and "a dependency is missing" in str(ei.value)
    # pinned to the producer's core, the consumer waits for it: no race (no SimulationError)
    assert len(consumer.deps) == 1
    pinned = pypto.Program.parse(text.replace(head, f".task {consumer.id} AIV group={consumer.group} deps=[] "
                                                    f"core={ck.program.tasks[consumer.deps[0]].core}"))
    simulate(pinned, x, out, machine="teach", check=True)


def test_set_flag_never_waited_for(compiled):
    ck, x, out = compiled
    lines = ck.program.text().splitlines()
    end_of_task0 = next(k for k, ln in enumerate(lines) if ln.startswith(".task 1"))
    lines.insert(end_of_task0, "  SET_FLAG           V -> MTE3, EVENT_ID7")
    bad = pypto.Program.parse("\n".join(lines))
    simulate(bad, mode="timing", machine="teach")          # unchecked: nobody notices
    with pytest.raises(pypto.SimulationError) as ei:
        simulate(bad, mode="timing", machine="teach", check=True)
    assert "V -> MTE3, EVENT_ID7 set but never waited for" in str(ei.value)
