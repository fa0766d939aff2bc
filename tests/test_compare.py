"""A/B comparison of two compiled kernels: pypto.compare (pypto.viz.compare)."""
import re

import numpy as np
import pytest

import pypto
from pypto.viz.compare import Compare, config_labels
from common import softmax

pytest.importorskip("matplotlib")

PNG = "data:image/png;base64,iVBORw0KGgo"


@pytest.fixture(scope="module")
def xo():
    x = np.random.default_rng(0).random((256, 1024), dtype=np.float32)
    return x, np.zeros_like(x)


@pytest.fixture(scope="module")
def pair(xo):
    a = softmax.compile(*xo, machine="teach", TM=32)
    b = softmax.compile(*xo, machine="teach", TM=16, TN=1024)
    return a, b


@pytest.fixture(scope="module")
def cmp(pair, xo):
    return pypto.compare(*pair, *xo)


def test_text_shows_both_cycle_counts_equal_to_the_simulations(cmp, pair, xo):
    a, b = pair
    ca, cb = a.simulate(*xo).cycles, b.simulate(*xo).cycles
    assert cmp.cycles == (ca, cb)
    speed = ca / cb
    word = f"B is {speed:.2f}x faster" if speed > 1 else f"B is {1 / speed:.2f}x slower"
    assert cmp.text() == f"Compare(softmax: TM=32, TN=256 -> {ca} cycles | TM=16, TN=1024 -> {cb} cycles, {word})"
    assert repr(cmp) == cmp.text()
    assert cmp.speedup == pytest.approx(speed)
    bundle = cmp._repr_mimebundle_()
    assert bundle["text/plain"] == cmp.text() and {"text/plain", "text/html"} <= set(bundle)


def test_table_rows(cmp, pair):
    a, b = pair
    rows = {k: (va, vb) for k, va, vb in cmp.rows()}
    assert rows["cycles"] == (str(cmp.res_a.cycles), str(cmp.res_b.cycles))
    assert rows["instructions"] == (str(len(a.program)), str(len(b.program)))
    assert rows["tasks"] == (str(len(a.program.tasks)), str(len(b.program.tasks)))
    assert rows["bound"] == (cmp.res_a.stats["bound"], cmp.res_b.stats["bound"])
    assert rows["constants"] == ("TM=32, TN=256", "TM=16, TN=1024")
    assert rows["check vs numpy"] == ("OK", "OK")
    n_sync = sum(i.op in ("SET_FLAG", "WAIT_FLAG", "PIPE_BARRIER") for t in a.program.tasks for i in t.instrs)
    assert rows["  sync"][0] == str(n_sync)
    assert rows["time"] == (f"{cmp.res_a.time_us:.3f} us", f"{cmp.res_b.time_us:.3f} us")


def test_timelines_share_one_time_axis(cmp):
    fig = cmp.figure()
    top, bottom = fig.axes[0], fig.axes[1]
    end = max(cmp.cycles)
    assert top.get_xlim() == bottom.get_xlim() == (0, end)
    assert top.get_shared_x_axes().joined(top, bottom)
    assert top.get_title().startswith("A: TM=32, TN=256 -- ") and bottom.get_title().startswith("B: TM=16, TN=1024")
    assert bottom.get_xlabel() == "cycles"
    assert cmp.timeline_png().startswith(b"\x89PNG")


def test_pto_diff(cmp):
    diff = cmp.diff()
    assert diff[0] == "--- A (TM=32, TN=256)" and diff[1] == "+++ B (TM=16, TN=1024)"
    assert any(re.match(r"-\s+TLOAD\s+UB\[0x[0-9a-f]+\]:fp32\[32,256\]", d) for d in diff)
    assert any(re.match(r"\+\s+TLOAD\s+UB\[0x[0-9a-f]+\]:fp32\[16,1024\]", d) for d in diff)
    page = cmp.html()
    assert "PTO diff (first 2 tasks, A -&gt; B)" in page
    assert "background:#ffebe9" in page and "background:#e6ffec" in page


def test_html_is_static_and_deterministic(cmp, pair, xo):
    page = cmp.html()
    assert page.startswith("<div class='pypto-compare'>")
    assert PNG in page and "<table>" in page and "TROWEXPANDDIV" in page     # opcode mix table
    assert "model_id" not in page and " at 0x" not in page
    again = pypto.compare(*pair, *xo).html()
    assert again == page


def test_long_diffs_are_truncated(pair, xo):
    c = Compare(*pair, xo, max_diff_lines=10)
    assert "more diff lines not shown" in c.html()


def test_without_arguments_only_timing_runs(pair, cmp):
    c = pypto.compare(*pair)
    assert c.cycles == cmp.cycles                   # the same timing model
    assert c.res_a.ok is None and c.res_a.outputs == {}
    assert dict((k, v) for k, *v in c.rows())["check vs numpy"] == ["not checked", "not checked"]


def test_labels(xo):
    a = softmax.compile(*xo, TM=32)
    assert config_labels(a, softmax.compile(*xo, TM=32, machine="teach")) == ("a2a3", "teach")
    assert config_labels(a, softmax.compile(*xo, TM=16, machine="teach")) == ("TM=32, a2a3", "TM=16, teach")
    assert config_labels(a, a) == ("A", "B")
    x16 = xo[0].astype(np.float16)
    b = softmax.compile(x16, np.zeros_like(x16), TM=32)
    assert config_labels(a, b) == ("fp32", "fp16")
    c = pypto.compare(a, a, *xo)
    assert c.text().endswith(f"A -> {c.res_a.cycles} cycles | B -> {c.res_a.cycles} cycles, same cycles)")
    c = pypto.compare(a, b, *xo, args_b=(x16, np.zeros_like(x16)))
    assert c.res_b.ok and "fp32 ->" in c.text() and "fp16 ->" in c.text()


def test_in_a_notebook_both_runs_are_one_interactive_timeline(cmp):
    pytest.importorskip("anywidget")
    from pypto.viz.timeline_widget import TimelineWidget
    bundle = cmp._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/html"] == cmp.html() and bundle["text/plain"] == cmp.text()
    top, timeline, tail = cmp.widget().children
    assert isinstance(timeline, TimelineWidget) and cmp.widget() is cmp.widget()
    a, b = timeline.payload["runs"]
    assert (a["label"], b["label"]) == (f"A ({cmp.label_a})", f"B ({cmp.label_b})")
    assert (a["cycles"], b["cycles"]) == cmp.cycles and timeline.data["end"] == max(cmp.cycles)
    assert len(a["events"]["start"]) == len(cmp.res_a.trace) and len(b["events"]["start"]) == len(cmp.res_b.trace)
    assert "PTO diff" in tail.value and "<table>" in top.value and "Timelines" not in top.value + tail.value
