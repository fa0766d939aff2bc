"""pypto.progress: the compiler and the simulator report their stages; listeners draw them."""
import numpy as np

import pypto
from pypto import progress
from pypto.progress import listening, stage

from common import softmax


def test_a_listener_hears_every_pass_of_a_compile_in_order_and_nothing_goes_to_stderr(capsys):
    x = np.zeros((64, 256), np.float32)
    softmax.cache_clear()
    seen = []
    with listening(seen.append):
        ck = softmax.compile(x, x, TM=16)
    assert capsys.readouterr().err == ""
    assert {e.what for e in seen} == {"compiling softmax"} and {e.unit for e in seen} == {"passes"}
    names = [e.detail.removeprefix("pass ") for e in seen if e.detail]
    assert names == [r.name for r in ck.pass_log]            # every pass, in order
    assert [e.done for e in seen if e.detail] == list(range(len(names)))
    last = seen[-1]
    assert last.closed and last.done == last.total == len(names) and last.fraction == 1.0


def test_without_a_listener_a_long_stage_draws_a_bar_on_stderr(capsys, monkeypatch):
    monkeypatch.setattr(progress, "STDERR_AFTER_S", 0.0)
    s = stage("simulating k", 200, "instructions")
    s.update(50)
    s.update(100, "half")
    s.close()
    err = capsys.readouterr().err
    assert err.startswith("\rsimulating k [#######") and " 25.0% 50/200 instructions, " in err
    assert " 50.0% 100/200 instructions, half, " in err
    assert "100.0% 200/200 instructions" in err and err.endswith(" s\n")
    quiet = stage("compiling k", 3, "passes", quiet=True)     # the pipeline's
    quiet.update(1)
    quiet.close()
    assert capsys.readouterr().err == ""
    # compiles are quiet: in a notebook a timing-dependent stderr line would stay among the outputs
    softmax.cache_clear()
    x = np.zeros((64, 256), np.float32)
    softmax.compile(x, x, TM=8)
    assert capsys.readouterr().err == ""


def test_a_short_stage_writes_nothing(capsys):
    s = stage("simulating k", 10)
    s.update(5)
    s.close()
    assert capsys.readouterr().err == ""


def test_a_failing_listener_is_dropped_and_the_work_goes_on():
    calls = []

    def broken(ev):
        calls.append(ev)
        raise RuntimeError("a display that broke")
    x = np.zeros((64, 256), np.float32)
    softmax.cache_clear()
    with listening(broken):
        ck = softmax.compile(x, x, TM=32)
    assert len(calls) == 1 and ck.consts["TM"] == 32


def test_a_failed_compile_closes_its_stage_where_it_stopped():
    """TN=4096 does not fit UB: allocate fails; the stage ends there (the error's hint then
    compiles smaller tiles to name the largest that fits: stages of their own)."""
    seen = []
    x = np.zeros((256, 1024), np.float32)
    softmax.cache_clear()
    with listening(seen.append):
        try:
            softmax.compile(x, x, TN=4096, TM=256)
        except pypto.TileShapeError:
            pass
    first = next(i for i, e in enumerate(seen) if e.closed)
    failed = seen[first - 1].detail.removeprefix("pass ")
    assert failed == "allocate" and seen[first].done == seen[first - 1].done < seen[first].total


def test_in_a_jupyter_kernel_a_long_stage_writes_nothing_to_stderr():
    """A stderr bar there or not by the machine's speed would be a stored output nbval compares
    (tutorial 03's search cell got one on a loaded machine): a real kernel runs a long stage."""
    from jupyter_client.manager import start_new_kernel
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        code = ("import pypto.progress as p\np.STDERR_AFTER_S = 0.0\ns = p.stage('simulating k', 10)\n"
                "s.update(5)\ns.close()\nprint('done', type(__import__('sys').stderr).__module__)")
        streams = []
        kc.execute_interactive(code, timeout=60,
                               output_hook=lambda m: streams.append((m["content"].get("name"), m["content"].get("text")))
                               if m["msg_type"] == "stream" else None)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert ("stdout", "done ipykernel.iostream\n") in streams
    assert not [s for s in streams if s[0] == "stderr"], streams


def test_simulate_reports_its_steps_the_check_among_them():
    """`ck.simulate()` is a stage of steps (values, timing, races, then the check's reference,
    bounds and comparison), each announced as it starts, closed when all are done; other modes
    and check=False have fewer."""
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    ck = softmax.compile(x, x, TM=16)
    for kw, steps in [({}, ["values", "timing", "races", "numpy reference", "error bounds", "comparison"]),
                      ({"check": False}, ["values", "timing"]),
                      ({"mode": "functional"}, ["values", "numpy reference", "error bounds", "comparison"]),
                      ({"mode": "timing"}, ["timing"])]:
        seen = []
        with listening(seen.append):
            ck.simulate(x, np.zeros_like(x), **kw)
        mine = [e for e in seen if e.unit == "steps"]
        checking = kw.get("check", True) and kw.get("mode") != "timing"
        assert {e.what for e in mine} == {f"simulating{' and checking' if checking else ''} softmax"}
        assert [e.detail for e in mine if not e.closed] == steps
        assert [e.done for e in mine if not e.closed] == list(range(len(steps)))
        assert mine[-1].closed and mine[-1].done == mine[-1].total == len(steps)
