"""The explorer's Advice tab: the advisor's findings for the configuration on display, and a
button that moves the sliders to the top suggestion (one recompile)."""
import numpy as np
import pytest

import pypto
from pypto.tuning.advisor import advise

pytest.importorskip("ipywidgets")
from pypto.viz.explorer import Explorer  # noqa: E402


@pypto.jit
def softmax(x, out, *, TM: int = 8, TN: int = 256):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = pypto.softmax(x)


@pytest.fixture
def arrays():
    x = np.random.default_rng(0).random((1024, 1024), dtype=np.float32)
    return x, np.zeros_like(x)


def test_the_advice_tab_shows_the_advice_and_applies_the_top_suggestion(arrays):
    ex = Explorer(softmax, arrays)
    assert ex.advice_button.layout.display == "none"          # nothing computed until the tab opens
    ex.select("advice")
    want = advise(softmax.compile(*arrays))
    html = ex.views["Advice"].value
    assert f"{want.cycles:,} cycles, <b>bound: {want.bound}</b>" in html and "TN=1024 (now 256)" in html
    assert ex.advice_button.description == f"use TN=1024 ({want.best.cycles:,} cycles)"
    assert ex.advice_button.layout.display != "none"
    ex.advice_button.click()
    assert ex.consts == {"TM": 8, "TN": 1024} and ex.sliders["TN"].value == 1024
    assert ex.res.cycles == want.best.cycles                  # what the advice claimed
    assert ex.advice_button.layout.display == "none"          # at its bound now: no suggestion
    assert "No suggestion" in ex.views["Advice"].value


def test_the_advice_of_a_configuration_is_computed_once(arrays, monkeypatch):
    ex = Explorer(softmax, arrays)
    calls = []
    import pypto.tuning.advisor as advisor
    real = advisor.advise
    monkeypatch.setattr(advisor, "advise", lambda *a, **k: calls.append(1) or real(*a, **k))
    ex.select("advice")
    ex.select("stats")
    ex.select("advice")
    assert len(calls) == 1
