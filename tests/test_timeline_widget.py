"""The interactive timeline: its data (every bar of the trace, every core), its selection, and
what the explorer shows for a clicked instruction.  What a person sees of it (hover, zoom) is
tested in a real browser (test_browser.py)."""
import importlib.resources

import numpy as np
import pytest

pytest.importorskip("anywidget")

from pypto.viz.explorer import Explorer  # noqa: E402
from pypto.viz.timeline import timeline_data  # noqa: E402
from pypto.viz.timeline_widget import TimelineWidget, timeline_widget  # noqa: E402

from common import softmax  # noqa: E402


@pytest.fixture(scope="module")
def xo():
    x = np.random.default_rng(0).random((512, 1024), dtype=np.float32)
    return x, np.zeros_like(x)


@pytest.fixture(scope="module")
def res(xo):
    return softmax.compile(*xo, TM=16).simulate(*xo)       # 32 tasks on the 48 AIV cores of a2a3


def bars(run):
    """The bars of a run back as (core, pipe, op, start, end, task, index, line) tuples."""
    ev = run["events"]
    return [(*run["rows"][r], run["ops"][o], s, e, t, i, run["lines"][ln])
            for r, o, s, e, t, i, ln in zip(ev["row"], ev["op"], ev["start"], ev["end"], ev["task"],
                                             ev["index"], ev["line"])]


def test_every_bar_of_every_core_is_there(res):
    cores = {e.core for e in res.trace}
    assert len(cores) > 8                                  # more than the static picture's 8 cores
    [run] = timeline_data([res])["runs"]
    assert {c for c, _ in run["rows"]} == cores and run["hidden_cores"] == 0
    assert sorted(bars(run)) == sorted((e.core, e.pipe, e.op, e.start, max(e.end, e.start + 1), e.task, e.index,
                                        e.line) for e in res.trace)
    # rows in core order, each core's pipes in the machine's order
    order = [int(c[3:]) for c, _ in run["rows"]]
    assert order == sorted(order)
    assert run["critical"] == [c["task"] for c in res.stats["critical_path"]]
    assert run["cycles"] == res.cycles and run["title"].startswith(f"softmax on a2a3: {res.cycles} cycles")


def test_dependency_arrows_go_from_the_end_of_a_task_to_the_start_of_its_dependent(xo):
    res = softmax.compile(*xo, TM=16, machine="teach").simulate(*xo)
    [run] = timeline_data([res])["runs"]
    by_task: dict = {}
    for e in res.trace:
        by_task.setdefault(e.task, []).append(e)
    want = []
    for t in res.program.tasks:
        for d in t.deps:
            last = max(by_task[d], key=lambda e: e.end)
            first = min(by_task[t.id], key=lambda e: e.start)
            want.append(((last.core, last.pipe), last.end, (first.core, first.pipe), first.start))
    assert want, "the kernel has no dependencies: a useless test"
    got = [(tuple(run["rows"][ra]), ta, tuple(run["rows"][rb]), tb) for ra, ta, rb, tb in run["arrows"]]
    assert got == want


def test_too_many_bars_leave_the_last_cores_out_and_say_so(res):
    [run] = timeline_data([res], max_events=len(res.trace) // 3)["runs"]
    assert 0 < len(run["events"]["start"]) <= len(res.trace) // 3
    shown = {c for c, _ in run["rows"]}
    assert run["hidden_cores"] == len({e.core for e in res.trace}) - len(shown) > 0


def test_two_runs_on_one_axis(xo, res):
    other = softmax.compile(*xo, TM=64).simulate(*xo)
    w = timeline_widget(res, other)
    a, b = w.data["runs"]
    assert (a["label"], b["label"]) == ("A", "B")
    assert w.data["end"] == max(res.cycles, other.cycles) and w.visible_range == (0, w.data["end"])


def test_the_javascript_ships_in_the_package():
    js = importlib.resources.files("pypto.viz") / "js" / "timeline.js"
    assert js.is_file() and "export default" in js.read_text()
    assert (importlib.resources.files("pypto.viz") / "js" / "timeline.css").is_file()
    text = js.read_text()
    assert "http" not in text and "import " not in text      # nothing fetched: works offline
    assert str(TimelineWidget._esm) == text


def test_a_clicked_instruction_shows_its_pto_line_and_kernel_line(xo):
    ex = Explorer(softmax, xo, consts={"TM": 32}, show=["timeline"])
    assert ex.timeline.data["runs"][0]["title"].startswith("softmax on a2a3")
    e = next(e for e in ex.res.trace if e.op == "TROWMAX")
    # what the JavaScript sets on a click
    ex.timeline.selected = {"run": 0, "label": "", "task": e.task, "index": e.index, "op": e.op, "core": e.core,
                            "pipe": e.pipe, "start": e.start, "end": e.end, "line": e.line}
    info = ex.timeline_info.value
    ins = ex.ck.program.tasks[e.task].instrs[e.index]
    assert f"<b>task {e.task} instruction {e.index}</b> on {e.core} V, cycles {e.start}&ndash;{e.end}" in info
    assert "TROWMAX" in info and ins.loc is not None
    assert f"kernel line {ins.loc.short()}: <code>m = pypto.amax(x, dim=-1, keepdim=True)</code>" in info
    ex.timeline.selected = {}
    assert ex.timeline_info.value == ""
    # a change redraws the timeline and forgets the selection
    ex.timeline.selected = {"run": 0, "label": "", "task": e.task, "index": e.index, "op": e.op, "core": e.core,
                            "pipe": e.pipe, "start": e.start, "end": e.end, "line": e.line}
    ex.update(TM=16)
    assert ex.timeline.selected == {} and ex.timeline_info.value == ""
    assert ex.timeline.data["runs"][0]["cycles"] == ex.res.cycles


def test_the_bars_go_to_the_browser_as_binary_columns(res):
    """The synced `data` holds each bar column as one float64 buffer (no per-number walk by
    ipywidgets, a tenth of the JSON); `payload` the lists; both say the same."""
    w = timeline_widget(res)
    [wire], [run] = w.data["runs"], w.payload["runs"]
    assert {k: type(v) for k, v in wire["events"].items()} == {k: memoryview for k in run["events"]}
    for k, col in run["events"].items():
        assert np.frombuffer(wire["events"][k], np.float64).tolist() == col
    assert {k: v for k, v in wire.items() if k != "events"} == {k: v for k, v in run.items() if k != "events"}
