"""Graph views, timeline and explorer (pypto.viz)."""
import re
import subprocess
import sys

import numpy as np
import pytest

import pypto
from pypto.viz import graphs, static
from pypto.viz.explorer import TABS, Explorer
from pypto.viz.session import range_values, tiled_dims
from pypto.viz.roofline import plot_roofline, roofline_numbers
from pypto.viz.timeline import plot_timeline, timeline_png, timeline_rows, timeline_svg
from common import softmax

pytest.importorskip("graphviz")
pytest.importorskip("matplotlib")
pytest.importorskip("ipywidgets")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pypto.jit
def scaled(x, out, *, TM: int = 32):
    pypto.set_vec_tile_shapes(TM, 256)
    out[:] = pypto.exp(x) * 2.0


@pypto.jit
def mm_abs(a, b, out):
    pypto.set_cube_tile_shapes([64, 64], [64, 128], [128, 128])
    out[:] = pypto.abs(pypto.matmul(a, b, out_dtype=pypto.DT_FP32))   # a vector epilogue


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
    assert re.search(r'tooltip="exp\nfp32\[256,1024\]\ntile \[32,256\]\nline kernels\.py:\d+"', src)
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
    ck = mm_abs.compile(*mm_args)
    src = graphs.tile_graph(ck.tile_graph).source
    for space in ("L1", "L0A", "L0B", "L0C", "UB"):
        assert f'fillcolor="{graphs.SPACE_COLORS[space]}"' in src
    assert "group 0: cube on AIC" in src and "group 1: vector on AIV" in src


def test_block_graph_node_per_task_when_small(xo, mm_args):
    ck = mm_abs.compile(*mm_args)
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
    small = mm_abs.compile(*mm_args).exec_graph
    src = graphs.exec_graph(small).source
    assert len(re.findall(r"^\s*k\d+ \[", src, re.M)) == len(small.tasks)
    assert re.search(r"task 0 on AIC0\n.*M \d+.*\n\d+ sync", src)        # its core (assign_cores)


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
    res = mm_abs.compile(*mm_args).simulate(*mm_args)
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


def test_timeline_without_trace(xo):
    res = softmax.compile(*xo, TM=32).simulate(*xo, trace=False)
    fig = plot_timeline(res)
    assert len(fig.axes[0].get_yticks()) == 0
    assert timeline_png(res).startswith(PNG_MAGIC)
    assert "no trace events" in timeline_svg(res)


def test_timeline_svg_rows_bars_and_tooltips(teach_res):
    svg = timeline_svg(teach_res)
    assert svg.startswith("<svg class=\"pypto-timeline\"") and svg.endswith("</svg>")
    rows = sorted({(e.core, e.pipe) for e in teach_res.trace})
    for c, p in rows:                                   # a label per (core, pipe) row
        assert f">{c} {p}</text>" in svg
    bars = re.findall(r'<rect x="[\d.]+" y="\d+" width="[\d.]+" height="12"><title>', svg)
    assert len(bars) == len(teach_res.trace)            # one bar (with a tooltip) per instruction
    e = teach_res.trace[0]
    assert f"<title>{e.op} on {e.core} {e.pipe}: cycles {e.start}-{e.end}" in svg
    assert f"{teach_res.cycles} cycles" in svg and ">cycles</text>" in svg
    assert timeline_svg(teach_res) == svg               # deterministic
    wide = timeline_svg(teach_res, width=2000)
    assert 'width="2000"' in wide


# --- roofline ----------------------------------------------------------------------------------
def test_roofline_of_a_cube_kernel_has_both_roofs_and_the_point(mm_args):
    ck = mm_abs.compile(*mm_args)
    res = ck.simulate(*mm_args)
    n = roofline_numbers(res)
    assert n["flops"] == 2 * 256 * 512 * 256 and n["intensity"] == pytest.approx(
        res.stats["flops"] / res.stats["hbm_bytes"])
    fig = res.roofline()
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert any(lbl.startswith("HBM roof: 1600 GB/s") for lbl in labels)
    assert any(lbl.startswith("compute roof: cube peak") for lbl in labels)
    compute = next(line for line in ax.get_lines() if line.get_label().startswith("compute roof"))
    assert set(compute.get_ydata()) == {res.machine.peak_flops}
    hbm = next(line for line in ax.get_lines() if line.get_label().startswith("HBM roof"))
    x, y = hbm.get_xdata(), hbm.get_ydata()
    assert y[0] == pytest.approx(res.machine.hbm_gbps * 1e9 * x[0])
    point = next(line for line in ax.get_lines() if line.get_label().startswith("mm_abs:"))
    assert point.get_xdata()[0] == pytest.approx(n["intensity"])
    assert point.get_ydata()[0] == pytest.approx(n["flops"] / n["seconds"])
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "FLOP per HBM byte" in ax.get_xlabel()
    assert fig._repr_png_().startswith(PNG_MAGIC)
    # fp32 operands: the half-rate roof is drawn too
    labels = [line.get_label() for line in plot_roofline(res, half_rate=True).axes[0].get_lines()]
    assert any("fp32 operands" in lbl for lbl in labels)


def test_roofline_of_a_vector_kernel_shows_bandwidth(teach_res):
    assert teach_res.stats["flops"] == 0
    fig = plot_roofline(teach_res)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["HBM roof", "achieved"]
    widths = sorted(p.get_width() for p in ax.patches)
    got = teach_res.stats["hbm_bytes"] / (teach_res.cycles / (teach_res.machine.clock_ghz * 1e9)) / 1e9
    assert widths == pytest.approx(sorted([teach_res.machine.hbm_gbps, got]))
    assert "vector-only" in ax.get_title() and "0 FLOP" in ax.get_title()
    assert ax.get_xlabel() == "HBM bandwidth (GB/s)"


# --- static HTML -------------------------------------------------------------------------------
def test_pto_html_colours_opcodes_operands_and_syncs(ck):
    text = ck.program.text(max_tasks=1)
    out = static.pto_html(text)
    assert "<span class='pto-op' style='color:#0b4f9c'>TLOAD</span>" in out
    assert "<span class='pto-sync' style='color:#b3261e'>SET_FLAG</span>" in out
    assert re.search(r"<span class='pto-space-UB' style='color:#1a5fb4'>UB\[0x[0-9a-f]+\]:fp32\[32,256\]</span>", out)
    assert "<span class='pto-space-GM' style='color:#5f5f5f'>GM:x[0:32,0:256]</span>" in out
    assert re.search(r"<span class='pto-comment' [^>]*>\s+; kernels\.py:\d+</span>", out)
    assert "<span class='pto-directive'" in out and "<span class='pto-event'" in out
    plain = re.sub(r"<[^>]+>", "", out.split("<pre", 1)[1].split(">", 1)[1])
    import html as _html
    assert _html.unescape(plain).rstrip("\n") == text          # colouring only adds markup


def test_diff_html_colours_and_truncates():
    a = "\n".join(f"line {i}" for i in range(50))
    b = a.replace("line 10", "line ten").replace("line 40", "line forty")
    out = static.diff_html(a, b, "A", "B")
    assert "background:#ffebe9; display:block'>-line 10<" in out
    assert "background:#e6ffec; display:block'>+line ten<" in out
    assert "@@ -" in out
    short = static.diff_html(a, b, max_lines=4)
    assert "more diff lines not shown" in short
    assert "no textual change" in static.diff_html(a, a)


def test_zoom_svg_scales_the_drawing(ck):
    svg = static.svg_body(graphs.to_svg(graphs.tensor_graph(ck.tensor_graph)))
    w, h = map(float, re.match(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"', svg).groups())
    big = static.zoom_svg(svg, 2.0)
    assert big.startswith(f'<svg width="{2 * w:.0f}pt" height="{2 * h:.0f}pt"')
    assert static.zoom_svg(svg, 1.0) == svg
    assert re.search(r'viewBox="[^"]+"', big).group(0) == re.search(r'viewBox="[^"]+"', svg).group(0)


def test_graph_nodes_have_tooltips_in_svg(ck, mm_args):
    svg = graphs.to_svg(graphs.tensor_graph(ck.tensor_graph))
    assert re.search(r'xlink:title="exp&#10;fp32\[256,1024\]&#10;tile \[32,256\]&#10;line kernels\.py:\d+"', svg)
    svg = graphs.to_svg(graphs.tile_graph(ck.tile_graph))
    assert re.search(r'xlink:title="TLOAD&#10;UB@0x[0-9a-f]+ fp32\[32,256\]&#10;GM x\[0:32,0:256\]&#10;line kernels\.py:\d+"', svg)
    small = mm_abs.compile(*mm_args)
    svg = graphs.to_svg(graphs.exec_graph(small.exec_graph))
    assert re.search(r'xlink:title="task 0: group 0 on AIC&#10;deps \[\], wave 0&#10;line test_viz\.py:\d+"', svg)


def test_folded_tile_graph_says_how_often_tiles_repeat(ck):
    src = graphs.tile_graph(ck.tile_graph).source
    n_outer = {g.id: g.n_outer for g in ck.tile_graph.groups}
    assert f'label="x {n_outer[2]}"' in src and "expand all tiles" in src
    assert graphs.is_folded(ck, "tile") and graphs.is_folded(ck, "block")


def test_expanded_tile_graph_draws_every_tile_up_to_the_cap():
    x = np.ones((64, 512), np.float32)
    ck = softmax.compile(x, np.zeros_like(x), TM=32, TN=256)
    n = len(ck.tile_graph.nodes)
    dg = graphs.tile_graph(ck.tile_graph, expand=True)
    assert len(node_names(dg, "n")) == n <= graphs.MAX_EXPANDED_NODES
    capped = graphs.tile_graph(ck.tile_graph, expand=True, max_nodes=20)
    assert len(node_names(capped, "n")) == 20
    assert f"first 20 of {n} tile ops" in capped.source


def test_expanded_task_graph_has_a_node_per_task_and_a_cap(ck):
    tasks = ck.block_graph.tasks
    dg = graphs.level_graph(ck, "block", expand=True)
    assert len(node_names(dg, "k")) == len(tasks)
    capped = graphs.exec_graph(ck.exec_graph, expand=True, max_nodes=10)
    assert len(node_names(capped, "k")) == 10
    assert f"... {len(tasks) - 10} more tasks not drawn" in capped.source
    assert "capped at 10 nodes" in capped.source


# --- explorer ----------------------------------------------------------------------------------
@pytest.fixture()
def explorer(xo):
    return Explorer(softmax, xo, consts={"TM": 64})


def view(ex, title):
    """What a tab shows now (not rendering it): its HTML, and a graph tab's graph."""
    return ex.views[title].value + (ex.graphs[title].svg if title in ex.graphs else "")


def timeline_of(ex):
    """What the Timeline tab's interactive timeline draws (the tab rendered first)."""
    ex.view_value("Timeline")
    return ex.timeline.payload


def test_range_values():
    assert range_values((16, 256)) == [16, 32, 64, 128, 256]
    assert range_values("16:100") == [16, 32, 64, 100]
    assert range_values("16:64:16") == [16, 32, 48, 64]
    assert range_values("16,48,32") == [16, 32, 48]
    for bad in ("0:8", "64:16", (1, 2, 3, 4), "a:b"):
        with pytest.raises(ValueError):
            range_values(bad)


def test_slider_bounds_come_from_the_tiled_dims(xo):
    assert tiled_dims(softmax, xo, {}) == {"TM": (8, 256), "TN": (8, 1024)}
    x16 = np.zeros((64, 512), np.float16)
    assert tiled_dims(softmax, (x16, x16), {}) == {"TM": (8, 64), "TN": (16, 512)}


def test_explorer_initial_view(explorer):
    assert explorer.consts == {"TM": 64, "TN": 256}
    assert list(explorer.tab.titles) == list(TABS)
    for title in ("Tensor", "Tile", "Block", "Execution", "PTO", "Passes", "Timeline", "Stats", "Roofline"):
        assert title in explorer.tab.titles
    assert set(explorer.sliders) == {"TM", "TN"}
    s = explorer.sliders["TM"]
    assert s.value == 64 and not s.continuous_update
    assert [v for _, v in s.options] == [8, 16, 32, 64, 128, 256]           # x has 256 rows
    assert [v for _, v in explorer.sliders["TN"].options] == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert explorer.machine_dropdown.value == "a2a3" and "teach" in explorer.machine_dropdown.options
    assert explorer.dtype_dropdown.value == "fp32" and list(explorer.dtype_dropdown.options) == ["fp32", "fp16", "bf16"]
    text = explorer.text()
    assert text == (f"Explorer(softmax, machine=a2a3, TM=64, TN=256): {explorer.res.cycles} cycles, "
                    f"{explorer.res.time_us:.3f} us, check OK")
    assert f"<b>{explorer.res.cycles}</b> cycles" in explorer.header.value
    assert f"bound: {explorer.res.stats['bound']}" in explorer.header.value


def test_explorer_mimebundle_has_a_deterministic_static_snapshot(explorer, xo):
    bundle = explorer._repr_mimebundle_()
    assert bundle["text/plain"] == explorer.text() and "0x" not in bundle["text/plain"]
    assert "application/vnd.jupyter.widget-view+json" in bundle
    page = bundle["text/html"]
    assert f"<b>{explorer.res.cycles}</b> cycles" in page                  # header
    assert f"<td style='text-align:left'>{explorer.res.cycles}  (" in page  # stats table
    # pictures as CSS backgrounds: what the sanitizer of an untrusted notebook keeps (no <svg>,
    # no <img src=data:>); the graph without kernel lines (no cell number in a stored picture)
    assert "<svg" not in page and "<img" not in page
    pics = re.findall(r"<div role='img' aria-label='([^']*)' title='[^']*' style='width:(\d+)px; height:(\d+)px;"
                      r"[^']*background-image:url\(data:(image/[a-z+]+);base64,([A-Za-z0-9+/=]+)\)", page)
    assert [(p[0], p[3]) for p in pics] == [("Tensor graph of softmax", "image/svg+xml"),
                                            ("timeline of softmax", "image/png")]
    import base64
    graph = base64.b64decode(pics[0][4]).decode()
    assert graph.startswith("<svg width=") and "tensor graph softmax" in graph and "amax" in graph
    assert "<!--" not in graph and ".py:" not in graph and "line " not in graph
    w_pt = float(re.match(r'<svg width="([\d.]+)pt"', graph).group(1))
    assert int(pics[0][1]) == round(w_pt * 4 / 3)
    png = base64.b64decode(pics[1][4])
    assert png.startswith(PNG_MAGIC) and (int(pics[1][1]), int(pics[1][2])) == static.png_size(png)
    assert "model_id" not in page and "<?xml" not in page
    other = Explorer(softmax, xo, consts={"TM": 64})
    assert other._repr_mimebundle_()["text/html"] == page                   # deterministic


def test_explorer_update_recompiles_and_renders_lazily(explorer):
    assert "<svg" in view(explorer, "Tensor")              # the selected tab
    assert view(explorer, "Tile") == "" and view(explorer, "Stats") == ""   # others: not yet
    before = explorer.res.cycles
    explorer.update(TM=32)
    assert explorer.ck.consts["TM"] == 32 and explorer.sliders["TM"].value == 32
    assert explorer.res.cycles != before
    assert f"{explorer.res.cycles} cycles" in explorer.text()
    assert f"<b>{explorer.res.cycles}</b> cycles" in explorer.header.value
    assert explorer.res.trace == []                       # no view needed the trace
    assert view(explorer, "Tile") == ""
    explorer.select("Tile")
    assert "group 0: vector on AIV, tile [32,256]" in view(explorer, "Tile")
    explorer.select("Stats")
    assert f"<td style='text-align:left'>{explorer.res.cycles}  (" in view(explorer, "Stats")
    assert "check out" in view(explorer, "Stats") and "OK vs numpy" in view(explorer, "Stats")
    explorer.select("PTO")
    assert ".task 3" in view(explorer, "PTO") and ".task 4 " not in view(explorer, "PTO")
    assert "<span class='pto-op' style='color:#0b4f9c'>TLOAD</span>" in view(explorer, "PTO")
    explorer.select("Timeline")
    assert explorer.res.trace                             # simulated with the trace now
    [run] = timeline_of(explorer)["runs"]
    assert run["title"] == f"softmax on a2a3: {explorer.res.cycles} cycles ({explorer.res.time_us} us)"
    assert len(run["events"]["start"]) == len(explorer.res.trace)      # every bar, every core
    explorer.select("Roofline")
    assert "<img src='data:image/png;base64," in view(explorer, "Roofline")


def test_explorer_update_with_timeline_visible_traces_at_once(xo):
    ex = Explorer(softmax, xo, consts={"TM": 64}, show=["timeline"])
    ex.update(TM=16)
    assert ex.res.trace and f": {ex.res.cycles} cycles (" in timeline_of(ex)["runs"][0]["title"]


def test_explorer_passes_tab(explorer):
    explorer.select("Passes")
    page = view(explorer, "Passes")
    log = explorer.ck.pass_log
    for r in log:
        assert f"<td>{r.name}</td>" in page
        assert f"{r.nodes_before} -&gt; {r.nodes_after}" in page
    opts = explorer.pass_dropdown.options
    assert [v for _, v in opts] == list(range(len(log)))
    first = explorer.pass_dropdown.value
    assert log[first].name == "eliminate_redundant_loads"   # the first in-level pass that changes nodes
    diff = explorer.pass_diff.value
    assert "<b>eliminate_redundant_loads</b>" in diff and "-  [0.1] %" in diff and "TLOAD() GM ws0[0:64,0:1]" in diff
    explorer.pass_dropdown.value = [r.name for r in log].index("insert_sync")
    diff = explorer.pass_diff.value
    assert "<b>insert_sync</b>" in diff and "+  launch task 0 on AIV" in diff and "-  launch task 0" in diff
    k = [r.name for r in log].index("tiling")
    explorer.pass_dropdown.value = k                       # a lowering: both levels side by side
    assert "before: tensor" in explorer.pass_diff.value and "after: tile" in explorer.pass_diff.value
    assert "tile_graph softmax" in explorer.pass_diff.value
    explorer.update(TM=32)                                 # the selection survives a recompile
    assert explorer.pass_dropdown.value == k and "TLOAD() GM x[0:32" in explorer.pass_diff.value


def test_explorer_graphs_search_and_expand(explorer):
    """Each graph tab is a GraphWidget (pan, zoom and fit are the browser's: test_browser.py);
    its search counts the nodes naming an op; "expand all tiles" redraws the tile graph."""
    from pypto.viz.graph_widget import GraphWidget, node_texts
    g = explorer.graphs["Tensor"]
    explorer.select("Tensor")
    assert isinstance(g, GraphWidget) and g.svg.startswith("<svg width=") and "tensor graph softmax" in g.svg
    texts = node_texts(g.svg)
    assert any(t.startswith("amax ") for t in texts) and len(texts) == g.svg.count('class="node"')
    g.query = "EXP"                                          # any case
    assert g.matches == sum("exp" in t.lower() for t in texts) >= 1
    g.query = "no such op"
    assert g.matches == 0
    g.query = ""
    explorer.select("Tile")
    folded = view(explorer, "Tile")
    assert "folded view" in explorer.views["Tile"].value and 'class="node"' not in explorer.views["Tile"].value
    explorer.expand.value = True
    expanded = view(explorer, "Tile")
    assert "all tiles/tasks drawn" in expanded
    assert expanded.count('class="node"') > folded.count('class="node"')
    explorer.expand.value = False
    # the timeline zooms itself (its `view`)
    explorer.select("Timeline")
    data = timeline_of(explorer)
    assert explorer.timeline.visible_range == (0, data["end"])
    explorer.timeline.view = [100, 400]
    assert explorer.timeline.visible_range == (100, 400)


def test_explorer_machine_dropdown_recompiles(explorer):
    a2a3 = explorer.res.stats["cores_used"]["AIV"]
    explorer.machine_dropdown.value = "teach"
    assert explorer.ck.machine.name == "teach" and explorer.machine == "teach"
    assert explorer.res.stats["cores_used"]["AIV"] <= 4 < a2a3
    assert explorer.text().startswith("Explorer(softmax, machine=teach, TM=64, TN=256): ")
    assert "on teach" in explorer.header.value
    explorer.update(machine="a2a3")
    assert explorer.machine_dropdown.value == "a2a3" and "(cached)" in explorer.status.value


def test_explorer_dtype_dropdown_casts_the_float_args(explorer):
    explorer.dtype_dropdown.value = "fp16"
    assert explorer.error is None
    assert [str(p.dtype) for p in explorer.ck.params] == ["fp16", "fp16"]
    assert all(a.dtype == np.float16 for a in explorer.args)
    assert explorer.res.ok and "dtype=fp16" in explorer.text() and "(fp16)" in explorer.header.value
    explorer.update(dtype="fp32")
    assert [str(p.dtype) for p in explorer.ck.params] == ["fp32", "fp32"]
    assert "dtype" not in explorer.text() and explorer.dtype_dropdown.value == "fp32"
    explorer.update(dtype="bf16")
    assert [str(p.dtype) for p in explorer.ck.params] == ["bf16", "bf16"]


def test_explorer_ranges(xo):
    ex = Explorer(softmax, xo, consts={"TM": 32}, ranges={"TM": (16, 128), "TN": "256:1024"})
    assert [v for _, v in ex.sliders["TM"].options] == [16, 32, 64, 128]
    assert [v for _, v in ex.sliders["TN"].options] == [256, 512, 1024]
    ex = pypto.explore(softmax, *xo, machine="teach", ranges={"TM": (16, 48)})   # default 64: nearest
    assert [v for _, v in ex.sliders["TM"].options] == [16, 32, 48] and ex.consts["TM"] == 48
    with pytest.raises(ValueError, match="not an int constant"):
        Explorer(softmax, xo, ranges={"TK": (16, 64)})


def test_explorer_without_simulation(xo):
    ex = Explorer(softmax, xo, simulate=False)
    assert ex.res is None
    assert ex.text() == (f"Explorer(softmax, machine=a2a3, TM=64, TN=256): not simulated (compile only), "
                         f"{len(ex.ck.program)} instructions in {len(ex.ck.program.tasks)} tasks")
    assert "cycles" not in ex.header.value and "not simulated" in ex.header.value
    for title in ("Timeline", "Stats", "Roofline"):
        ex.select(title)
        assert "not simulated" in view(ex, title)
    ex.update(TM=32)
    assert ex.ck.consts["TM"] == 32 and ex.res is None
    assert "not simulated" in ex._repr_mimebundle_()["text/html"]


def test_explorer_slider_release_recompiles_and_caches(explorer):
    explorer.sliders["TM"].value = 16
    assert explorer.ck.consts["TM"] == 16
    assert explorer.error is None
    assert "ready: TM=16, TN=256 (compile" in explorer.status.value
    explorer.sliders["TM"].value = 64                  # seen before: no recompile
    assert explorer.ck.consts["TM"] == 64 and "(cached)" in explorer.status.value


def test_explorer_debounces_bursts_in_an_event_loop(explorer, monkeypatch):
    import asyncio
    calls = []
    compile_ = explorer.kernel.compile

    def counting(*args, **kw):
        calls.append(kw.get("TM"))
        return compile_(*args, **kw)

    monkeypatch.setattr(explorer.kernel, "compile", counting)

    async def burst():
        for v in (8, 16, 32):                          # three releases within a few ms
            explorer.sliders["TM"].value = v
        assert explorer.ck.consts["TM"] == 64          # nothing applied synchronously
        await asyncio.sleep(0.3)

    asyncio.run(burst())
    assert calls == [32]                               # only the last one was computed
    assert explorer.ck.consts["TM"] == 32 and explorer.sliders["TM"].value == 32

    async def single():
        explorer.sliders["TM"].value = 16              # after a quiet period: applied at once
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert explorer.ck.consts["TM"] == 16

    asyncio.run(single())


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
    explorer.sliders["TN"].value = 1024            # the same through the slider: no exception
    explorer.update(TN=128)                        # and a good change clears the error
    assert explorer.error is None and explorer.ck.consts["TN"] == 128
    assert "failed" not in explorer.text()


def test_explorer_error_of_a_moved_slider_is_shown_next_to_it_with_the_largest_value_that_fits(xo):
    """a2a3's UB is 192 KiB: at TN=1024 softmax's [TM, 1024] fp32 tiles fit up to TM=16 (the
    compiler's own hint says so too); the line under the controls names the slider, the value
    that fits, and a button moves the slider there."""
    ex = Explorer(softmax, xo, consts={"TM": 8, "TN": 1024})
    assert ex.control_error_box.layout.display == "none"
    ex.sliders["TM"].value = 64                    # a release of the TM slider
    assert isinstance(ex.error, pypto.TileShapeError) and ex.ck.consts["TM"] == 8
    assert ex.sliders["TM"].value == 8             # back to what is shown ...
    assert ex.sliders["TM"].style.handle_color == "#c00"        # ... and marked
    box = ex.control_error.value
    assert ex.control_error_box.layout.display == "flex"
    assert "<b>TM=64</b>: TileShapeError: the tiles of group 0 do not fit UB" in box
    assert "the largest TM that compiles (with TN=1024) is <b>16</b>" in box
    assert "showing TM=8, TN=1024" in box
    children = ex.widget.children
    assert children.index(ex.control_error_box) == children.index(ex.controls) + 1   # right under them
    assert ex.fit_button.description == "use TM=16" and ex.fit_button.layout.display == ""
    ex.fit_button.click()
    assert ex.error is None and ex.ck.consts["TM"] == 16 and ex.sliders["TM"].value == 16
    assert ex.control_error_box.layout.display == "none" and ex.control_error.value == ""
    assert ex.sliders["TM"].style.handle_color is None
    # two constants moved at once: no search
    ex.update(TM=256, TN=4096)
    assert "<b>TM=256, TN=4096</b>" in ex.control_error.value and "largest" not in ex.control_error.value
    assert ex.fit_button.layout.display == "none"


def test_explorer_shows_progress_while_it_compiles_and_simulates(xo, monkeypatch):
    """Work longer than busy.SHOW_AFTER_S shows a bar under the controls, fed by the compiler's
    passes (the timing run is the one assign_cores made), then by the steps of the numpy check;
    hidden again when the view is ready and when the check is done."""
    from pypto.viz import busy
    ex = Explorer(softmax, xo, consts={"TM": 32})
    assert not ex.busy.visible and ex.busy.shown == []
    children = ex.widget.children
    assert children.index(ex.busy.widget) == children.index(ex.controls) + 2
    monkeypatch.setattr(busy, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(busy, "REDRAW_S", 0.0)
    shown_on = []
    ex.busy.on_show = lambda: shown_on.append(ex.status.value)
    softmax.cache_clear()                          # compiled by other tests: compile it here
    ex.update(TM=16)
    assert shown_on and "updating: TM=16, TN=256 ..." in shown_on[0]   # stale views are marked at once
    passes = [t for t in ex.busy.shown if t.startswith("compiling softmax: pass ")]
    names = [t.split("pass ", 1)[1].split(",")[0] for t in passes]
    assert names[0] == "decompose" and {"tiling", "scheduling", "assign_cores"} <= set(names)
    drawn = next(i for i, t in enumerate(ex.busy.shown) if t.startswith("softmax (TM=16, TN=256): drawing the views"))
    # then the numpy check, after the view (run at once here: no event loop), with its steps
    check = [t.split(": ", 1)[1].split(",")[0] for t in ex.busy.shown[drawn + 1:]]
    assert ex.busy.shown[drawn + 1].startswith("simulating and checking softmax: ")
    assert check == ["values", "numpy reference", "error bounds", "comparison", "4/4 steps"]
    assert not ex.busy.visible and "ready: TM=16, TN=256" in ex.status.value
    ex.busy.shown.clear()
    ex.update(TM=32)                               # cached: nothing compiles or simulates
    assert not [t for t in ex.busy.shown if "compiling" in t or "simulating" in t]


def test_in_a_live_kernel_the_check_runs_beside_the_event_loop(xo, monkeypatch):
    """With an event loop (a notebook), a slider move shows the view, then the numpy check runs in
    a worker thread: the loop stays free meanwhile (another control could be moved), the header
    says "checking…" until the result is shown from the loop, and `text()` waits for a check
    still running, so a notebook's next cell reads the check as before."""
    import asyncio
    import time
    from pypto.viz.session import Session
    real = Session._check_values

    def slow(self, run):                # a large kernel's check: seconds
        time.sleep(0.5)
        return real(self, run)
    monkeypatch.setattr(Session, "_check_values", slow)
    from pypto.viz import busy
    monkeypatch.setattr(busy, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(busy, "REDRAW_S", 0.0)
    ex = Explorer(softmax, xo, consts={"TM": 32})

    async def move():
        ex.update(TM=16)
        assert "checking…" in ex.header.value and ex._checking
        ex.busy.shown.clear()
        t0 = time.perf_counter()
        await asyncio.sleep(0.05)       # the loop runs other work while the check runs
        free = time.perf_counter() - t0
        assert "checking…" in ex.header.value
        while ex._checking:
            await asyncio.sleep(0.02)
        assert "check OK" in ex.header.value
        # the check's steps reached the busy bar from the worker, through the loop; hidden at the end
        steps = [t.split(": ", 1)[1].split(",")[0] for t in ex.busy.shown]
        assert steps[:4] == ["values", "numpy reference", "error bounds", "comparison"], ex.busy.shown
        assert ex.busy.shown[0].startswith("simulating and checking softmax: ")
        await asyncio.sleep(0.02)       # (events posted before the end, run after it: dropped)
        assert not ex.busy.visible
        ex.update(TM=8)
        assert "checking…" in ex.header.value
        text = ex.text()                # waits for the check, shows it
        assert not ex._checking and "check OK" in ex.header.value
        return free, text
    free, text = asyncio.run(move())
    assert free < 0.3
    assert text.startswith("Explorer(softmax, machine=a2a3, TM=8, TN=256): ") and "check OK" in text


def test_explore_entry_point_and_show(xo):
    ex = pypto.explore(softmax, *xo, machine="teach", TM=32)
    assert isinstance(ex, Explorer)
    assert ex.text().startswith("Explorer(softmax, machine=teach, TM=32, TN=256): ")
    ex = Explorer(softmax, xo, consts={"TM": 32}, show=["timeline", "stats"])
    assert ex.tab.selected_index == TABS.index("Timeline")
    assert timeline_of(ex)["runs"][0]["title"].startswith("softmax on a2a3: ")
    assert "<table>" in view(ex, "Stats")


def test_explorer_initial_failure_raises_the_pypto_error(xo):
    with pytest.raises(pypto.TileShapeError):
        Explorer(softmax, xo, consts={"TN": 8192})


def test_import_pypto_stays_light():
    code = ("import sys, pypto, pypto.viz, pypto.viz.compare, pypto.viz.roofline, pypto.viz.static; "
            "heavy = [m for m in ('IPython', 'ipywidgets', 'matplotlib', 'graphviz') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_exec_graph_shows_the_loops_of_a_task():
    """A task whose repeated instructions the loops pass wrote once says how many lines its
    text has for the instructions it runs."""
    import numpy as np
    from pypto.ir.exec import loops_in, static_instrs

    @pypto.jit
    def sm(x, out):
        out[:] = pypto.softmax(x, dim=-1)
    x = np.zeros((4096, 1024), np.float32)
    g = sm.compile(x, x).exec_graph
    def text(tasks):
        loops = sum(1 for t in tasks for _ in loops_in(t.code))
        lines = sum(1 for t in tasks for _ in static_instrs(t.code))
        assert loops and lines < sum(t.n_instrs for t in tasks)
        return f"{loops} loop{'s' if loops > 1 else ''}: {lines:,} lines for {sum(t.n_instrs for t in tasks):,} instructions"
    t = next(t for t in g.tasks if any(True for _ in loops_in(t.code)))
    assert text([t]) in graphs.exec_graph(g, expand=True).source
    assert text(g.tasks) in graphs.exec_graph(g).source          # one node for the group: in total


def test_the_session_works_without_widgets(xo):
    """The explorer's session (session.py): compile, simulate, check, the largest value that
    compiles -- no ipywidgets imported (a separate interpreter sees what it loads)."""
    code = ("import sys, numpy as np; sys.path.insert(0, 'tests')\n"
            "from common import softmax\n"
            "from pypto.viz.session import Session\n"
            "x = np.random.default_rng(0).random((256, 1024), dtype=np.float32); o = np.zeros_like(x)\n"
            "s = Session(softmax, (x, o), consts={'TM': 32})\n"
            "ck, res, n = s._compute('a2a3', None, {'TM': 16, 'TN': 256})\n"
            "s._check(s._last_run)\n"
            "assert res.ok and ck.consts['TM'] == 16 and s.res.ok and s.consts['TM'] == 32\n"
            "print(s.text()); print(res.cycles, s.largest_fitting(('a2a3', None, {'TM': 256, 'TN': 1024}, None), 'TM'))\n"
            "heavy = [m for m in ('ipywidgets', 'anywidget', 'IPython') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": root})
    assert out.returncode == 0, out.stderr
    line, numbers = out.stdout.splitlines()
    cycles_16 = softmax.compile(*xo, TM=16).simulate(*xo).cycles
    assert line.startswith("Explorer(softmax, machine=a2a3, TM=32, TN=256): ") and line.endswith("check OK")
    assert numbers == f"{cycles_16} 16"      # [16, 1024] fp32 tiles are the largest that fit a2a3's UB
