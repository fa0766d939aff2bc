"""Graph views, timeline and explorer (pypto.viz)."""
import re
import subprocess
import sys

import numpy as np
import pytest

import pypto
from pypto.viz import graphs
from pypto.viz.explorer import TABS, Explorer
from pypto.viz.timeline import plot_timeline, timeline_png, timeline_rows

pytest.importorskip("graphviz")
pytest.importorskip("matplotlib")
pytest.importorskip("ipywidgets")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pypto.jit
def softmax(x, out, *, TM: int = 64, TN: int = 256):
    pypto.set_vec_tile_shapes(TM, TN)
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)


@pypto.jit
def scaled(x, out, *, TM: int = 32):
    pypto.set_vec_tile_shapes(TM, 256)
    out[:] = pypto.exp(x) * 2.0


@pypto.jit
def mm_relu(a, b, out):
    pypto.set_cube_tile_shapes([64, 64], [64, 128], [128, 128])
    out[:] = pypto.relu(pypto.matmul(a, b, out_dtype=pypto.DT_FP32))


@pytest.fixture(scope="module")
def xo():
    rng = np.random.default_rng(0)
    x = rng.random((256, 1024), dtype=np.float32)
    return x, np.zeros_like(x)


@pytest.fixture(scope="module")
def ck(xo):
    return softmax.compile(*xo, TM=32)


@pytest.fixture(scope="module")
def mm_args():
    rng = np.random.default_rng(1)
    a = rng.random((256, 512)).astype(np.float16)
    b = rng.random((512, 256)).astype(np.float16)
    return a, b, np.zeros((256, 256), np.float32)


def node_names(dg, prefix):
    """Names of the nodes (not edges) with this name prefix in a Digraph's source."""
    return re.findall(rf"^\s*({prefix}\d+\w*) \[", dg.source, re.M)


# --- graphs ------------------------------------------------------------------------------------
def test_tensor_graph_nodes_clusters_and_tooltips(ck):
    dg = graphs.tensor_graph(ck.tensor_graph)
    src = dg.source
    for op in ("amax", "sub", "exp", "sum", "div"):
        assert f'label="{op}\n' in src
    for k in range(3):
        assert f"subgraph cluster_group{k}" in src and f'label="group {k}"' in src
    assert 'label="x\nfp32[256,1024]"' in src                  # the parameter box
    assert "store out[0:256,0:1024]" in src                     # the output box
    assert "tile [32,256]" in src                               # tooltip names the tile
    assert re.search(r'tooltip="exp\nfp32\[256,1024\]\ntile \[32,256\]\nline test_viz.py:\d+"', src)
    # A node per op, but the parameter `out` only appears as the store box.
    ops = [n for n in ck.tensor_graph.nodes if n.op not in ("const",)]
    assert len(node_names(dg, "t")) == len(ops) - 1


def test_tensor_graph_folds_constants(xo):
    g = scaled.compile(*xo).tensor_graph
    consts = [n for n in g.nodes if n.op == "const"]
    assert consts, "the kernel should have a constant operand"
    src = graphs.tensor_graph(g).source
    assert 'label="mul(2)\n' in src
    assert all(f"t{c.id} [" not in src for c in consts)


def test_to_svg_has_cluster_titles(ck):
    svg = graphs.to_svg(graphs.tensor_graph(ck.tensor_graph))
    assert "<svg" in svg and "group 0" in svg and "group 2" in svg
    svg = graphs.to_svg(graphs.tile_graph(ck.tile_graph))
    assert "<svg" in svg
    assert "group 0: vector on AIV, tile [32,256], x 8 iterations" in svg
    assert "group 2: vector on AIV, tile [32,256], x 32 iterations" in svg


def test_tile_graph_shows_outer_iteration_zero_only(xo):
    ck = softmax.compile(*xo, TM=8, TN=128)
    dg = graphs.tile_graph(ck.tile_graph)
    drawn = node_names(dg, "n")
    first = [n for n in ck.tile_graph.nodes if n.outer == 0]
    assert len(ck.tile_graph.nodes) > 10 * len(drawn)            # folded: far fewer nodes
    assert sorted(drawn) == sorted(f"n{n.id}" for n in first)
    src = dg.source
    assert re.search(r'label="TLOAD\nUB@0x[0-9a-f]+\nfp32\[8,128\]"', src)
    assert "GM x\nfp32[256,1024]\ninput" in src and "GM out\nfp32[256,1024]\noutput" in src
    assert re.search(r"gm_x -> n\d+", src) and re.search(r"n\d+ -> gm_out", src)
    assert f'fillcolor="{graphs.SPACE_COLORS["UB"]}"' in src


def test_tile_graph_valid_shape_of_tail_tiles():
    x = np.ones((40, 200), np.float32)
    ck = softmax.compile(x, np.zeros_like(x), TM=32, TN=128)
    src = graphs.tile_graph(ck.tile_graph).source
    assert "fp32[32,128] valid [32,72]" in src


def test_tile_graph_of_a_cube_kernel_colors_spaces(mm_args):
    ck = mm_relu.compile(*mm_args)
    src = graphs.tile_graph(ck.tile_graph).source
    for space in ("L1", "L0A", "L0B", "L0C", "UB"):
        assert f'fillcolor="{graphs.SPACE_COLORS[space]}"' in src
    assert "group 0: cube on AIC" in src and "group 1: vector on AIV" in src


def test_block_graph_node_per_task_when_small(xo, mm_args):
    ck = mm_relu.compile(*mm_args)
    tasks = ck.block_graph.tasks
    assert len(tasks) <= graphs.COLLAPSE_ABOVE
    dg = graphs.block_graph(ck.block_graph)
    assert len(node_names(dg, "k")) == len(tasks)
    n_edges = sum(len(t.deps) for t in tasks)
    assert len(re.findall(r"k\d+ -> k\d+", dg.source)) == n_edges
    assert f'fillcolor="{graphs.CORE_COLORS["AIC"]}"' in dg.source
    assert f'fillcolor="{graphs.CORE_COLORS["AIV"]}"' in dg.source
    assert "task 0\ngroup 0 on AIC" in dg.source


def test_block_graph_collapses_groups_and_waves(ck):
    tasks = ck.block_graph.tasks
    assert len(tasks) > graphs.COLLAPSE_ABOVE
    dg = graphs.block_graph(ck.block_graph)
    src = dg.source
    assert not node_names(dg, "k")
    n2 = sum(t.group == 2 for t in tasks)
    assert f"group 2: {n2} tasks on AIV" in src
    deps12 = sum(len(t.deps) for t in tasks if t.group == 2)
    assert f'g1w1 -> g2w2 [label="{deps12} deps"]' in src


def test_exec_graph_lists_pipe_and_sync_counts(ck, mm_args):
    src = graphs.exec_graph(ck.exec_graph).source
    t = next(t for t in ck.exec_graph.tasks if t.group == 2)
    syncs = sum(i.op in ("SET_FLAG", "WAIT_FLAG", "PIPE_BARRIER") for i in t.instrs)
    v = sum(i.pipe == "V" and i.op not in ("SET_FLAG", "WAIT_FLAG", "PIPE_BARRIER") for i in t.instrs)
    assert re.search(rf"group 2: \d+ tasks on AIV, wave \d+\nper task: .*V {v}\n{syncs} sync", src)
    small = mm_relu.compile(*mm_args).exec_graph
    src = graphs.exec_graph(small).source
    assert len(re.findall(r"^\s*k\d+ \[", src, re.M)) == len(small.tasks)
    assert re.search(r"task 0 on AIC\n.*M \d+.*\n\d+ sync", src)


def test_level_graph_dispatch(ck):
    for level in ("tensor", "tile", "block", "exec", "execution"):
        assert graphs.level_graph(ck, level).source.startswith("digraph softmax")
    with pytest.raises(ValueError, match="pto"):
        graphs.level_graph(ck, "pto")


# --- timeline ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def teach_res(xo):
    return softmax.compile(*xo, TM=32, machine="teach").simulate(*xo)


def test_timeline_one_row_per_core_and_pipe(teach_res):
    fig = plot_timeline(teach_res)
    ax = fig.axes[0]
    rows = sorted({(e.core, e.pipe) for e in teach_res.trace})
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(ax.get_yticks()) == len(rows)
    assert sorted(labels) == sorted(f"{c} {p}" for c, p in rows)
    assert ax.get_xlabel() == "cycles"
    assert ax.get_xlim()[1] == teach_res.cycles
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "DMA load (MTE2)" in legend and "vector (V)" in legend and "sync" in legend
    assert "more cores" not in ax.get_title()


def test_timeline_limits_cores_and_says_so(ck, xo):
    res = ck.simulate(*xo)
    n_cores = len({e.core for e in res.trace})
    fig = plot_timeline(res, max_cores=3)
    ax = fig.axes[0]
    shown = {t.get_text().split()[0] for t in ax.get_yticklabels()}
    assert shown == {"AIV0", "AIV1", "AIV2"}
    assert f"({n_cores - 3} more cores not shown)" in ax.get_title()
    fig = plot_timeline(res, cores=["AIV5"], title="one core")
    assert {t.get_text().split()[0] for t in fig.axes[0].get_yticklabels()} == {"AIV5"}


def test_timeline_keeps_both_core_types_in_view(mm_args):
    res = mm_relu.compile(*mm_args).simulate(*mm_args)
    fig = plot_timeline(res, max_cores=4)
    cores = {t.get_text().split()[0][:3] for t in fig.axes[0].get_yticklabels()}
    assert cores == {"AIC", "AIV"}
    assert len(timeline_rows(res.trace, ["AIC0"])) == 4      # MTE2, MTE1, M, FIX


def test_timeline_into_given_axes_and_png(teach_res):
    from matplotlib.figure import Figure
    fig = Figure()
    ax = fig.add_subplot()
    assert plot_timeline(teach_res, ax=ax) is fig
    png = timeline_png(teach_res)
    assert png.startswith(PNG_MAGIC) and len(png) > 1000
    assert teach_res.timeline()._repr_png_().startswith(PNG_MAGIC)


# --- explorer ----------------------------------------------------------------------------------
@pytest.fixture()
def explorer(xo):
    return Explorer(softmax, xo, consts={"TM": 64})


def test_explorer_initial_view(explorer):
    assert explorer.consts == {"TM": 64, "TN": 256}
    assert list(explorer.tab.titles) == list(TABS)
    assert set(explorer.sliders) == {"TM", "TN"}
    s = explorer.sliders["TM"]
    assert s.value == 64 and not s.continuous_update
    assert [v for _, v in s.options][:2] == [8, 16] and s.options[-1][1] == 4096
    text = explorer.text()
    assert text == (f"Explorer(softmax, machine=a2a3, TM=64, TN=256): {explorer.res.cycles} cycles, "
                    f"{explorer.res.time_us:.3f} us, check OK")
    assert f"<b>{explorer.res.cycles}</b> cycles" in explorer.header.value
    bundle = explorer._repr_mimebundle_()
    assert bundle["text/plain"] == text
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "0x" not in text


def test_explorer_update_recompiles_and_renders_lazily(explorer):
    tabs = explorer.tab.children
    assert "<svg" in tabs[0].value                      # Tensor: the selected tab
    assert tabs[1].value == "" and tabs[6].value == ""  # others: not rendered yet
    before = explorer.res.cycles
    explorer.update(TM=32)
    assert explorer.ck.consts["TM"] == 32 and explorer.sliders["TM"].value == 32
    assert explorer.res.cycles != before
    assert f"{explorer.res.cycles} cycles" in explorer.text()
    assert f"<b>{explorer.res.cycles}</b> cycles" in explorer.header.value
    assert tabs[1].value == ""
    explorer.tab.selected_index = TABS.index("Tile")
    assert "group 0: vector on AIV, tile [32,256]" in tabs[1].value
    explorer.tab.selected_index = TABS.index("Stats")
    assert f"<td style='text-align:left'>{explorer.res.cycles}</td>" in tabs[6].value
    assert "check out" in tabs[6].value and "OK vs numpy" in tabs[6].value
    explorer.tab.selected_index = TABS.index("PTO")
    assert ".task 3" in tabs[4].value and ".task 4 " not in tabs[4].value
    explorer.tab.selected_index = TABS.index("Timeline")
    assert bytes(tabs[5].value).startswith(PNG_MAGIC)


def test_explorer_slider_release_recompiles(explorer):
    explorer.sliders["TM"].value = 16
    assert explorer.ck.consts["TM"] == 16
    assert explorer.error is None
    assert "ready: TM=16, TN=256 (compile" in explorer.status.value
    explorer.sliders["TM"].value = 64                  # seen before: no recompile
    assert explorer.ck.consts["TM"] == 64 and "(cached)" in explorer.status.value


def test_explorer_slider_callback_never_raises(explorer, monkeypatch):
    def broken(*args, **kw):
        raise RuntimeError("compiler bug")
    monkeypatch.setattr(explorer.kernel, "compile", broken)
    ck = explorer.ck
    explorer.sliders["TM"].value = 8                   # must not raise
    assert explorer.ck is ck and "RuntimeError: compiler bug" in explorer.status.value
    with pytest.raises(RuntimeError):                  # update() lets real bugs through
        explorer.update(TM=8)
    with pytest.raises(ValueError, match="unknown view"):   # checked before compiling
        Explorer(softmax, (np.zeros((8, 64), np.float32),) * 2, show=["tiles"])


def test_explorer_bad_update_keeps_previous_result(explorer):
    explorer.update(TM=32)
    ck, res = explorer.ck, explorer.res
    with pytest.raises(pypto.TileShapeError):
        softmax.compile(np.zeros((256, 1024), np.float32), np.zeros((256, 1024), np.float32),
                        TM=32, TN=4096)
    explorer.update(TN=4096)                       # does not raise: shown in the status line
    assert explorer.ck is ck and explorer.res is res
    assert isinstance(explorer.error, pypto.TileShapeError)
    assert "TileShapeError" in explorer.status.value and "color:#c00" in explorer.status.value
    assert "do not fit UB" in explorer.status.value
    assert explorer.sliders["TN"].value == 256     # the slider goes back to what is shown
    assert explorer.text().endswith("[last update failed: TileShapeError]")
    explorer.sliders["TN"].value = 4096            # the same through the slider: no exception
    assert explorer.ck is ck
    explorer.update(TN=128)                        # and a good change clears the error
    assert explorer.error is None and explorer.ck.consts["TN"] == 128
    assert "failed" not in explorer.text()


def test_explore_entry_point_and_show(xo):
    ex = pypto.explore(softmax, *xo, machine="teach", TM=32)
    assert isinstance(ex, Explorer)
    assert ex.text().startswith("Explorer(softmax, machine=teach, TM=32, TN=256): ")
    ex = Explorer(softmax, xo, consts={"TM": 32}, show=["timeline", "stats"])
    assert ex.tab.selected_index == TABS.index("Timeline")
    assert bytes(ex.tab.children[5].value).startswith(PNG_MAGIC)
    assert "<table>" in ex.tab.children[6].value


def test_explorer_initial_failure_raises_the_pypto_error(xo):
    with pytest.raises(pypto.TileShapeError):
        Explorer(softmax, xo, consts={"TN": 8192})


def test_import_pypto_stays_light():
    code = ("import sys, pypto, pypto.viz; "
            "heavy = [m for m in ('IPython', 'ipywidgets', 'matplotlib', 'graphviz') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_timeline_without_trace(xo):
    res = softmax.compile(*xo, TM=32).simulate(*xo, trace=False)
    fig = plot_timeline(res)
    assert len(fig.axes[0].get_yticks()) == 0
    assert timeline_png(res).startswith(PNG_MAGIC)
