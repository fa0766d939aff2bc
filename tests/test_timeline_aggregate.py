"""The aggregate timeline: all cores of a 48-core run in one row per core type and pipe."""
import numpy as np
import pytest

import pypto
from pypto.viz.timeline import occupancy

pytest.importorskip("matplotlib")


@pypto.jit
def scale(x, out):
    pypto.set_vec_tile_shapes(8, 256)
    out[:] = x * 2.0


def test_occupancy_counts_busy_cores_per_pipe():
    x = np.ones((1024, 256), np.float32)
    res = scale.compile(x, np.zeros_like(x)).simulate(x, np.zeros_like(x))
    occ = occupancy(res.trace, {"AIC": 24, "AIV": 48})
    assert set(occ) == {("AIV", "MTE2"), ("AIV", "V"), ("AIV", "MTE3")}
    for t, busy in occ.values():
        assert busy.min() >= 0 and busy.max() <= 1 and busy[-1] == 0     # all done at the end
    # all 48 vector cores load at once at the start (one task each)
    t, busy = occ[("AIV", "MTE2")]
    assert busy.max() == 1.0
    # the area under the curve is the busy cycles of that pipe over all cores
    area = float(np.sum(np.diff(t) * busy[:-1])) * 48
    assert area == pytest.approx(sum(e.end - e.start for e in res.trace if e.pipe == "MTE2"))
    fig = res.timeline(aggregate=True)
    labels = [tick.get_text() for tick in fig.axes[0].get_yticklabels()]
    assert labels == ["AIV MTE2", "AIV V", "AIV MTE3"]
    assert "all 48 AIV cores" in fig.axes[0].get_title()
