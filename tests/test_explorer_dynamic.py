"""The explorer of a dynamic kernel (a pypto.DYNAMIC first dim): a size slider that re-simulates
the program of a call on N rows without recompiling (pypto.viz.explorer)."""
import asyncio

import numpy as np
import pytest

import pypto
from pypto.compiler import Pipeline
from pypto.viz.explorer import Explorer
from pypto.viz.session import ExplorerOptionError, sized_args, size_values

pytest.importorskip("graphviz")
pytest.importorskip("matplotlib")
pytest.importorskip("ipywidgets")

D, F = pypto.DYNAMIC, pypto.DT_FP32
ROWS = 100                                       # the user's arrays


@pypto.jit
def dsoftmax(x: pypto.Tensor([D, 256], F), out: pypto.Tensor([D, 256], F)):
    out[:] = pypto.softmax(x, dim=-1)


@pypto.jit
def dtiled(x: pypto.Tensor([D, 256], F), out: pypto.Tensor([D, 256], F), *, TM: int = 16):
    pypto.set_vec_tile_shapes(TM, 256)
    out[:] = pypto.exp(x) * 2.0


@pypto.jit
def plain(x, out):                               # no DYNAMIC dim
    out[:] = pypto.exp(x) * 2.0


@pytest.fixture(scope="module")
def xo():
    x = np.random.default_rng(3).standard_normal((ROWS, 256)).astype(np.float32)
    return x, np.zeros_like(x)


@pytest.fixture()
def ex(xo):
    return Explorer(dsoftmax, xo)


@pytest.fixture()
def fresh(xo):
    """An explorer whose kernel compiled once for it (an empty compile cache before)."""
    dsoftmax.cache_clear()
    ex = Explorer(dsoftmax, xo)
    assert dsoftmax.cache_size == 1
    return ex


@pytest.fixture()
def counted(monkeypatch):
    """Calls of the kernel's compile (JitKernel._compile) and of any compiler pipeline run."""
    calls = {"compile": 0, "pipeline": 0}
    compile_, run = dsoftmax._compile, Pipeline.run

    def counting_compile(*a, **k):
        calls["compile"] += 1
        return compile_(*a, **k)

    def counting_run(self, *a, **k):
        calls["pipeline"] += 1
        return run(self, *a, **k)

    monkeypatch.setattr(dsoftmax, "_compile", counting_compile)
    monkeypatch.setattr(Pipeline, "run", counting_run)
    return calls


def softmax_np(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_size_slider_values_label_and_default(ex):
    s = ex.size_slider
    assert s is not None and s.description == "N (rows of x, out)"
    assert [v for _, v in s.options] == [1, 2, 4, 8, 16, 32, 64, 100, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert s.value == ROWS and ex.size == ROWS and ex.size_name == "N"
    assert s in ex.controls.children and set(ex.sliders) == set()      # no int constants
    assert "<b>N = 100</b> rows" in ex.header.value
    assert ex.text().startswith("Explorer(dsoftmax, machine=a2a3, N=100): ")
    assert ex.text().endswith("check OK on your arrays (100 rows)")
    assert ex.ck.dynamic is not None


def test_size_values_reach_the_arrays_rows_and_a_passed_value(xo):
    assert size_values(10000) == [2 ** k for k in range(14)] + [10000]       # up to the arrays' rows
    assert size_values(100, 3000) == sorted({2 ** k for k in range(14)} | {100, 3000})
    ex = pypto.explore(dsoftmax, *xo, N=3000)                   # the size by its symbol
    assert ex.size == 3000 and ex.size_slider.value == 3000
    assert [v for _, v in ex.size_slider.options] == sorted(set(size_values(ROWS)) | {3000})
    assert Explorer(dsoftmax, xo, size=16).size == 16           # or by size=
    ex = Explorer(dsoftmax, xo, ranges={"N": (1, 64)})
    assert [v for _, v in ex.size_slider.options] == [1, 2, 4, 8, 16, 32, 64, 100]
    with pytest.raises(ValueError, match="not an int constant.*expected one of N"):
        Explorer(dsoftmax, xo, ranges={"TM": (16, 64)})


def test_update_N_resimulates_without_recompiling(fresh, counted):
    ex = fresh
    ck = ex.ck
    ex.update(N=7)
    assert ex.error is None and ex.size == 7 and ex.size_slider.value == 7
    assert ex.res.cycles == ck.simulate(mode="timing", size=7).cycles
    assert ex.res.program is ck.program_for(7) and ex.res.ok
    assert ex.ck is ck and dsoftmax.cache_size == 1
    assert counted == {"compile": 0, "pipeline": 0}
    assert "ready: no constants, N=7 (no recompile, simulate" in ex.status.value
    assert f"<b>{ex.res.cycles}</b> cycles" in ex.header.value and "<b>N = 7</b> rows" in ex.header.value
    assert ex.text().startswith(f"Explorer(dsoftmax, machine=a2a3, N=7): {ex.res.cycles} cycles")
    ex.size_slider.value = 4096                 # through the slider, like a release
    assert ex.size == 4096 and ex.res.cycles == ck.simulate(mode="timing", size=4096).cycles
    assert ex.res.cycles > ck.simulate(mode="timing", size=7).cycles and ex.res.ok
    ex.update(size=ROWS)                        # size= is the same keyword; back to the arrays
    assert ex.size == ROWS and ex.res.ok and ex.args[0] is ex._orig_args[0]
    ex.update(N=7)
    assert "(cached)" in ex.status.value and ex.size == 7
    assert counted == {"compile": 0, "pipeline": 0} and ex.ck is ck and dsoftmax.cache_size == 1
    ex.update(machine="teach")                  # a real recompile is counted (and keeps N)
    assert counted["compile"] == 1 and counted["pipeline"] >= 1 and ex.size == 7 and ex.ck is not ck
    assert ex.res.cycles == ex.ck.simulate(mode="timing", size=7).cycles and ex.res.ok


def test_arrays_made_at_another_size_are_checked_and_user_arrays_untouched(ex, xo):
    x, out = xo
    ex.update(N=7)
    assert np.array_equal(ex.args[0], x[:7]) and ex.args[0] is not x
    assert ex.res.ok and np.allclose(ex.res.outputs["out"], softmax_np(x[:7]), rtol=1e-5, atol=1e-6)
    assert "check OK</span> <span style='color:#555'>on rows 0:7 of your arrays" in ex.header.value
    ex.update(N=300)
    made = ex.args[0]
    assert made.shape == (300, 256) and made.dtype == np.float32
    assert np.array_equal(made[:ROWS], x)
    assert all((made[i] == x).all(axis=1).any() for i in range(ROWS, 300))   # rows of the user's
    assert not np.array_equal(made[ROWS:2 * ROWS], x)                         # drawn, not cycled
    again = sized_args(xo, ("x", "out"), ("x", "out"), 300)
    assert np.array_equal(again[0], made) and again[1].shape == (300, 256)    # deterministic
    assert ex.res.ok and np.allclose(ex.res.outputs["out"], softmax_np(made), rtol=1e-5, atol=1e-6)
    assert "on 300 rows made from your arrays: their 100, then 200 drawn from them (seed 0)" in ex.header.value
    assert not out.any()                                                      # never written


def test_graph_tabs_show_the_chunk_and_sim_tabs_the_call(ex):
    note = f"The levels of the program for {ex.ck.dynamic.chunk} rows (the compiled chunk). "
    tensor = ex.view_value("Tensor")
    svg = ex.graphs["Tensor"].svg
    assert note + ex.ck.dynamic.describe() in tensor.replace("&#x27;", "'")
    ex.select("PTO")
    assert note in ex.view_value("PTO")
    ex.select("Stats")
    ex.update(N=5)
    stats = ex.view_value("Stats")
    assert f"<td style='text-align:left'>{ex.res.cycles}  (" in stats
    assert ex.ck.pieces_for(5) == [(0, 4), (4, 1)]             # the faster plan: a 4-row and a 1-row run
    assert "5 rows (runs 1 × 4 + 1 × 1 rows)" in stats and "rows 0:5 of your arrays" in stats
    ex.select("Tensor")
    assert ex.view_value("Tensor") == tensor and ex.graphs["Tensor"].svg is svg     # not redrawn
    ex.select("Timeline")
    ex.view_value("Timeline")
    assert ex.res.trace and ex.timeline.data["runs"][0]["title"].startswith("dsoftmax on a2a3, N = 5 rows: ")
    ex.update(N=2100)                                          # two pieces: 2048 + 64 rows
    assert ex.ck.pieces_for(2100) == [(0, 2048), (2048, 64)]
    assert ex.res.trace and len(ex.res.program.tasks) > len(ex.ck.program.tasks)
    [run] = ex.timeline.payload["runs"]                        # redrawn for the call on 2100 rows
    assert ", N = 2100 rows: " in run["title"] and len(run["events"]["start"]) == len(ex.res.trace)
    assert "runs 1 × 2048 + 1 × 64 rows" in ex.header.value
    ex.select("Roofline")
    assert "<img src='data:image/png;base64," in ex.view_value("Roofline")


@pytest.mark.parametrize("bad", [0, -4, 2.5, "7", True])
def test_bad_size_is_shown_in_the_status_line(ex, bad):
    res = ex.res
    ex.update(N=bad)                                           # does not raise
    assert isinstance(ex.error, ExplorerOptionError) and ex.res is res and ex.size == ROWS
    assert "ExplorerOptionError: N (rows of x, out) must be a positive integer" in ex.status.value
    assert "color:#c00" in ex.status.value and ex.size_slider.value == ROWS
    assert ex.text().endswith("[last update failed: ExplorerOptionError]")
    ex.update(N=8)
    assert ex.error is None and ex.size == 8


def test_constant_sliders_of_a_dynamic_kernel_keep_the_size(xo):
    ex = Explorer(dtiled, xo)
    # the tile constant's bounds come from the kernel traced at the compiled chunk's rows
    assert [v for _, v in ex.sliders["TM"].options] == [8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    ex.update(N=7)
    ex.sliders["TM"].value = 32                               # a recompile, at the same size
    assert ex.consts["TM"] == 32 and ex.size == 7 and ex.res.ok
    assert ex.res.cycles == ex.ck.simulate(mode="timing", size=7).cycles
    assert "ready: TM=32, N=7 (compile" in ex.status.value


def test_bad_initial_size_raises(xo):
    with pytest.raises(ExplorerOptionError, match="must be a positive integer"):
        pypto.explore(dsoftmax, *xo, N=0)
    with pytest.raises(ValueError, match="two sizes given"):
        Explorer(dsoftmax, xo, consts={"N": 4}, size=5)


def test_static_snapshot_at_a_size(ex):
    ex.update(N=7)
    bundle = ex._repr_mimebundle_()
    assert bundle["text/plain"] == ex.text() and "N=7" in bundle["text/plain"]
    page = bundle["text/html"]
    assert "<b>N = 7</b> rows" in page and "on rows 0:7 of your arrays" in page
    assert "The levels of the program for 2048 rows" in page and "aria-label='Tensor graph of dsoftmax'" in page
    assert f"<td style='text-align:left'>{ex.res.cycles}  (" in page and "aria-label='timeline of dsoftmax'" in page
    assert Explorer(dsoftmax, ex._orig_args, size=7).static_html() == page     # deterministic


def test_size_slider_moves_are_debounced_in_an_event_loop(ex, monkeypatch):
    sizes = []
    run = ex._timing_run
    monkeypatch.setattr(ex, "_timing_run", lambda ck, n, trace: sizes.append(n) or run(ck, n, trace))

    async def burst():
        for v in (16, 32, 64):
            ex.size_slider.value = v
        assert ex.size == ROWS
        await asyncio.sleep(0.3)

    asyncio.run(burst())
    assert sizes == [64] and ex.size == 64 and ex.res.ok


def test_a_kernel_without_a_dynamic_dim_has_no_size_slider():
    x = np.random.default_rng(0).random((64, 256), dtype=np.float32)
    ex = Explorer(plain, (x, np.zeros_like(x)))
    assert ex.size_slider is None and ex.size is None and ex.size_name is None
    assert not any("rows of" in getattr(c, "description", "") for c in ex.controls.children)
    assert "N=" not in ex.text() and "N =" not in ex.header.value and "rows of" not in ex.text()
    ex.update(size=5)
    assert isinstance(ex.error, ExplorerOptionError) and "no pypto.DYNAMIC dim" in ex.status.value
    with pytest.raises(ExplorerOptionError, match="no pypto.DYNAMIC dim"):
        Explorer(plain, (x, np.zeros_like(x)), size=5)


def test_pypto_magic_explores_a_dynamic_kernel(xo):
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "pypto")
    ip.user_ns.update(x=xo[0], out=xo[1], pypto=pypto)
    cell = ("%%pypto --args x,out --range N=1:64 --check\n"
            "@pypto.jit\n"
            "def dsm(x: pypto.Tensor([pypto.DYNAMIC, 256], pypto.DT_FP32),\n"
            "        out: pypto.Tensor([pypto.DYNAMIC, 256], pypto.DT_FP32)):\n"
            "    out[:] = pypto.softmax(x, dim=-1)\n")
    with capture_output() as cap:
        ip.run_cell(cell)
    assert "dsm: check OK" in cap.stdout, cap.stderr
    ex = ip.magics_manager.registry["PyptoMagics"].explorers[0]
    assert [v for _, v in ex.size_slider.options] == [1, 2, 4, 8, 16, 32, 64, ROWS]
    kernel = ip.user_ns["dsm"]
    ex.update(N=33)
    assert ex.res.ok and ex.res.cycles == ex.ck.simulate(mode="timing", size=33).cycles
    assert kernel.cache_size == 1


def test_one_row_reads_right_and_the_timeline_names_its_size():
    from pypto.viz.timeline import timeline_svg
    x = np.random.default_rng(3).standard_normal((7, 256)).astype(np.float32)
    ex = pypto.explore(dsoftmax, x, np.zeros_like(x), show=["tensor"])
    ex.update(N=1)
    assert "N = 1</b> row <span" in ex.header.value and "(runs 1 × 1 row)" in ex.header.value
    assert "N = 1 row:" in timeline_svg(ex.res)
    ex.update(N=7)
    assert "N = 7 rows:" in timeline_svg(ex.res)
