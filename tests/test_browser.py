"""The notebook experience in a real JupyterLab, in a real (headless) browser.

One JupyterLab server (tests/browser_support.py) serves a temporary directory holding a copy of
tutorials/01_first_kernel.ipynb (outputs removed), a small notebook with a mistake and a small
notebook exploring a kernel with a pypto.DYNAMIC dim; Debian's /usr/bin/chromium, driven by
Playwright, opens them, runs all cells through the Run menu and checks what a person sees: the
explorer's tabs, the graphs, the timeline image, the stats, the header's cycle count following a
slider (a tile size's, which recompiles, and the dynamic kernel's size slider, which only
re-simulates: the cycles it shows are those the same kernel gives in the test process), and short
error messages without tracebacks.

Screenshots go to artifacts/browser/ (one per view; artifacts/browser/end-of-test/ holds one of
each open page after every test, the first thing to look at when a test fails).  With
PYPTO_UPDATE_SCREENSHOT=1 the explorer screenshot (Timeline tab) is also copied to
docs/explorer.png:  PYPTO_UPDATE_SCREENSHOT=1 .venv/bin/python -m pytest tests/test_browser.py

Selectors rest on what JupyterLab and ipywidgets render, not on pypto's layout: an explorer is
the output VBox (.widget-vbox) holding a Tab (.widget-tab); tabs are found by their title
(role=tab), never by position; the visible panel is the tab contents' child without Lumino's
lm-mod-hidden class; sliders are found by their label.

The module is skipped only when /usr/bin/chromium or the playwright package is missing;
scripts/bootstrap.sh (so `make test`) installs both.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from browser_support import CHROMIUM

if not os.path.exists(CHROMIUM):
    pytest.skip(f"browser tests need Debian's Chromium at {CHROMIUM} "
                "(apt-get install chromium; scripts/bootstrap.sh does it as root)", allow_module_level=True)
try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:
    pytest.skip("browser tests need the playwright package (pip install -e '.[dev]')",
                allow_module_level=True)

from browser_support import (JupyterLab, Notebook, copy_file, copy_notebook_without_outputs,
                             launch_chromium, save_screenshot, write_notebook)

REPO = Path(__file__).resolve().parents[1]
TUTORIAL = "01_first_kernel.ipynb"
ERRORS = "mistakes.ipynb"
DYNAMIC = "dynamic.ipynb"
STORED = "00_tour.ipynb"         # a tutorial opened as stored, outputs and all
ARTIFACTS = REPO / "artifacts" / "browser"
DOCS_SCREENSHOT = REPO / "docs" / "explorer.png"
LEVEL_TABS = ("Tensor", "Tile", "Block", "Execution", "PTO", "Timeline", "Stats")
TIMEOUT = 60_000          # ms, for any one DOM condition (a recompile on a busy 2-core machine)

expect.set_options(timeout=TIMEOUT)

BAD_CELL = """%%pypto --args x,out --machine teach
@pypto.jit
def bad_softmax(x, out):
    pypto.set_vec_tile_shapes(8, 100)
    out[:] = pypto.softmax(x)
"""
BAD_LINE = "pypto.set_vec_tile_shapes(8, 100)"
ERROR_CELLS = [
    "import sys\nimport numpy as np\nimport pypto\nprint(sys.prefix)",
    "%load_ext pypto\nx = np.random.default_rng(0).random((64, 256), dtype=np.float32)\nout = np.zeros_like(x)",
    BAD_CELL,
    # The same mistake in an ordinary cell: the kernel defined above, called directly.
    "bad_softmax(x, out)",
]

# A kernel with a pypto.DYNAMIC dim, explored on arrays of DYN_ROWS rows.  The test process runs
# the same source (DYN_KERNEL) to know the cycles the explorer must show at each size.
DYN_ROWS = 300
DYN_KERNEL = f"""import numpy as np
import pypto

D, F = pypto.DYNAMIC, pypto.DT_FP32

@pypto.jit
def softmax(x: pypto.Tensor([D, 256], F), out: pypto.Tensor([D, 256], F)):
    out[:] = pypto.softmax(x, dim=-1)

x = np.random.default_rng(0).standard_normal(({DYN_ROWS}, 256)).astype(np.float32)
out = np.zeros_like(x)
"""
# A mixed-dtype kernel (fp16 in, fp32 out); a matmul whose T slider, moved from 64 to 32, takes
# seconds to recompile (2048x2048x1024 fp16: 200k instructions at T=64, 1.6M at T=32, 1.7 s to
# compile on the 2-core machine, the busy bar showing from 0.3 s: 1024^3, 0.4 s since the
# compiler got faster, left it too little time); and the first render of a matmul twice as
# wide, which takes seconds (nothing cached: 0.4 s to compile, 1.9 s to simulate and check).
MORE = "more.ipynb"
MORE_CELLS = [
    "import numpy as np\nimport pypto\nrng = np.random.default_rng(0)",
    """@pypto.jit
def mm_mixed(a, b, c):
    c[:] = pypto.matmul(a, b, out_dtype=pypto.DT_FP32)

a = rng.standard_normal((64, 64)).astype(np.float16)
b = rng.standard_normal((64, 64)).astype(np.float16)
pypto.explore(mm_mixed, a, b, np.zeros((64, 64), np.float32), machine="teach")""",
    """@pypto.jit
def mm(a, b, c, *, T: int = 64):
    pypto.set_cube_tile_shapes([T, T], [T, T], [T, T])
    c[:] = pypto.matmul(a, b, out_dtype=pypto.DT_FP32)

A = rng.standard_normal((2048, 2048)).astype(np.float16)
B = rng.standard_normal((2048, 1024)).astype(np.float16)
pypto.explore(mm, A, B, np.zeros((2048, 1024), np.float32), ranges={"T": [32, 64, 128]})  # slider""",
    # a first render that takes seconds (nothing cached): its busy bar is in the cell's output
    """mm.cache_clear()
B2 = rng.standard_normal((2048, 2048)).astype(np.float16)
pypto.explore(mm, A, B2, np.zeros((2048, 2048), np.float32), ranges={"T": [32, 64, 128]})""",
]
DYN_LABEL = "N (rows of x, out)"     # the size slider: the dim's symbol and the parameters having it
DYN_CELLS = [DYN_KERNEL, "print(pypto.__file__)", "pypto.explore(softmax, x, out)"]


# --- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("jupyterlab")
    server = JupyterLab(base)
    server.root.mkdir(parents=True)
    copy_notebook_without_outputs(REPO / "tutorials" / TUTORIAL, server.root / TUTORIAL)
    copy_file(REPO / "tutorials" / STORED, server.root / STORED)      # as in the repository
    write_notebook(server.root / ERRORS, ERROR_CELLS)
    write_notebook(server.root / DYNAMIC, DYN_CELLS)
    write_notebook(server.root / MORE, MORE_CELLS)
    with server:
        yield server
    # (server.stop() ran: kernels shut down, process group killed)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    pw = sync_playwright().start()
    try:
        ctx = launch_chromium(pw, tmp_path_factory.mktemp("chromium-profile"))
        ctx.set_default_timeout(TIMEOUT)
        try:
            yield ctx
        finally:
            ctx.close()
    finally:
        pw.stop()


def _opened_and_run(browser, lab, name, workspace, timeout):
    """A notebook opened in JupyterLab and run from top to bottom (a fixture's body)."""
    nb = Notebook.open(browser, lab, name, workspace=workspace, timeout=120_000)
    nb.run_all(timeout=timeout)
    yield nb
    nb.page.close()


def _explorer_of(nb, source):
    """The explorer (a VBox holding a Tab) in the output of the code cell containing `source`."""
    box = nb.code_cell(source).locator(".jp-OutputArea-output .widget-vbox").filter(
        has=nb.page.locator(".widget-tab")).first
    expect(box).to_be_visible()
    box.scroll_into_view_if_needed()
    return box


@pytest.fixture(scope="module")
def tutorial(lab, browser):
    """The tutorial, opened in JupyterLab and run from top to bottom."""
    yield from _opened_and_run(browser, lab, TUTORIAL, "tutorial", 240_000)


@pytest.fixture(scope="module")
def explorer(tutorial):
    """The explorer shown by the tutorial's %%pypto cell (a VBox holding a Tab)."""
    return _explorer_of(tutorial, "%%pypto")


@pytest.fixture(scope="module")
def dynamic(lab, browser):
    """The dynamic-kernel notebook, opened and run from top to bottom."""
    yield from _opened_and_run(browser, lab, DYNAMIC, "dynamic", 180_000)


@pytest.fixture(scope="module")
def dyn_explorer(dynamic):
    """The explorer shown by the dynamic notebook's last cell."""
    return _explorer_of(dynamic, "pypto.explore(")


@pytest.fixture(scope="module")
def dyn_cycles():
    """N -> the cycles of the dynamic kernel's call on N rows, from this process's pypto (the
    simulator is deterministic, so the explorer in the notebook's kernel must show the same)."""
    ns: dict = {}
    exec(compile(DYN_KERNEL, "<dynamic kernel>", "exec"), ns)
    ck = ns["softmax"].compile(ns["x"], ns["out"])
    assert ck.dynamic is not None, "the kernel of DYN_KERNEL is not dynamic"
    cache: dict[int, int] = {}

    def cycles(n: int) -> int:
        if n not in cache:
            cache[n] = ck.simulate(mode="timing", size=n).cycles
        return cache[n]
    return cycles


@pytest.fixture(autouse=True)
def _page_screenshots(request, browser):
    """After each test, a screenshot of every open page (the first thing to look at on failure)."""
    yield
    for i, page in enumerate(p for p in browser.pages if p.url.startswith("http")):
        try:
            save_screenshot(page, ARTIFACTS / "end-of-test" / f"{request.node.name}-{i}.png")
        except Exception:   # noqa: BLE001 (a closed page: nothing to show)
            pass


# --- helpers -------------------------------------------------------------------------------------
def tab_bar(explorer):
    return explorer.locator(".widget-tab").first


def show_tab(explorer, title):
    """Click the explorer tab titled `title`; return the tab's (now visible) content panel."""
    tab = tab_bar(explorer).get_by_role("tab", name=title, exact=True).first
    tab.click()
    expect(tab).to_have_attribute("aria-selected", "true")
    # Lumino hides the other panels with the lm-mod-hidden class.
    panel = tab_bar(explorer).locator(":scope > .widget-tab-contents > .lm-Widget:not(.lm-mod-hidden)")
    expect(panel).to_have_count(1)
    return panel


def timeline_canvas(explorer):
    """The interactive timeline's canvas in the visible tab panel."""
    return tab_bar(explorer).locator(":scope > .widget-tab-contents").locator("canvas.pypto-tl-canvas:visible").first


def header(explorer):
    """The explorer's header line ('softmax on teach | 29433 cycles | ...'): its first HTML."""
    return explorer.locator(".widget-html-content").first


def status(explorer):
    return explorer.locator(".widget-html-content").filter(has_text=re.compile(r"^\s*ready:|Error")).last


def cycles_in(text: str) -> int:
    m = re.search(r"([\d,]+)\s*cycles", text)
    assert m, f"no cycle count in {text!r}"
    return int(m.group(1).replace(",", ""))


def slider(explorer, name):
    """The slider whose label is exactly `name` ('TM', 'N (rows of x, out)')."""
    s = explorer.locator(".widget-slider").filter(
        has=explorer.page.locator(".widget-label", has_text=re.compile(rf"^\s*{re.escape(name)}\s*$")))
    expect(s).to_have_count(1)
    return s


def press(explorer, name, key):
    """Focus slider `name`'s handle and press `key` (as a person using the keyboard would)."""
    handle = slider(explorer, name).locator("[role=slider]")
    handle.focus()
    handle.press(key)


def expect_stats_cycles(panel, cycles: int) -> None:
    """The Stats table's 'cycles' row shows `cycles` (waiting: a tab shown after a change may
    still hold the previous configuration's table until its new one arrives from the kernel)."""
    row = panel.locator("tr").filter(has=panel.page.locator("th", has_text=re.compile(r"^\s*cycles\s*$")))
    expect(row).to_have_count(1)
    expect(row.locator("td")).to_have_text(re.compile(rf"^\s*({cycles:,}|{cycles})(\s+\(.*\))?\s*$"))


def expect_timeline_cycles(explorer, cycles: int) -> None:
    """The interactive timeline on display is the one of a run of `cycles` cycles (its title says
    'softmax on a2a3: 476 cycles (0.257 us)') and shows the whole run.  Waits: a move redraws it."""
    title = tab_bar(explorer).locator(".pypto-tl-title:visible").first
    expect(title).to_contain_text(f": {cycles} cycles (")
    expect(tab_bar(explorer).locator(".pypto-tl-range:visible").first).to_have_text(
        re.compile(rf"^cycles 0\u2013{cycles} of {cycles}$"))
    expect(timeline_canvas(explorer)).to_be_visible()


# --- tests ---------------------------------------------------------------------------------------
def test_run_all_shows_explorer_with_a_tab_per_level(tutorial, explorer):
    titles = [t.strip() for t in tab_bar(explorer).get_by_role("tab").all_inner_texts()]
    for want in LEVEL_TABS:            # more tabs may come; these must be there
        assert want in titles, f"tab {want!r} missing; tabs are {titles}"
    assert "check OK" in header(explorer).inner_text()
    assert cycles_in(header(explorer).inner_text()) > 0


def test_tile_tab_shows_the_tile_graph(explorer):
    panel = show_tab(explorer, "Tile")
    nodes = panel.locator("svg g.node")
    expect(nodes.first).to_be_visible()
    assert nodes.count() >= 3
    assert "tile" in panel.locator("svg").first.text_content().lower()   # graphviz label "tile graph ..."
    save_screenshot(explorer, ARTIFACTS / "explorer_tile.png")


def test_graph_tabs_open_fitted_and_pan_zoom_and_search(explorer):
    """A graph opens fitted to its view (all of it visible, never enlarged); Ctrl + wheel zooms,
    a drag pans, the search box marks the nodes naming an op, fit goes back."""
    panel = show_tab(explorer, "Tile")
    view = panel.locator(".pypto-gv-view:visible")
    svg = view.locator("svg").first
    expect(svg).to_be_visible()
    v, g = view.bounding_box(), svg.bounding_box()
    assert g["x"] >= v["x"] - 1 and g["x"] + g["width"] <= v["x"] + v["width"] + 1, (v, g)
    assert g["y"] >= v["y"] - 1 and g["y"] + g["height"] <= v["y"] + v["height"] + 1, (v, g)
    scale = panel.locator(".pypto-gv-scale:visible")
    fitted = int(scale.inner_text().rstrip("%"))
    assert 0 < fitted <= 100
    # search: the nodes naming TLOAD are marked, the count says how many
    panel.locator(".pypto-gv-search:visible").fill("tload")
    count = panel.locator(".pypto-gv-count").first
    expect(count).to_have_text(re.compile(r"^\d+ nodes?$"))
    n = int(count.inner_text().split()[0])
    want = sum("tload" in (t or "").lower() for t in svg.locator("g.node").all_text_contents())
    assert n == want >= 1 and svg.locator("g.node.pypto-gv-hit").count() == n
    save_screenshot(explorer, ARTIFACTS / "explorer_tile_search.png")
    panel.locator(".pypto-gv-search:visible").fill("")
    expect(count).to_have_text("")
    # Ctrl + wheel zooms in around the pointer
    explorer.page.mouse.move(v["x"] + v["width"] / 2, v["y"] + v["height"] / 2)
    explorer.page.keyboard.down("Control")
    explorer.page.mouse.wheel(0, -400)
    explorer.page.keyboard.up("Control")
    expect(scale).not_to_have_text(f"{fitted}%")
    assert int(scale.inner_text().rstrip("%")) > fitted
    # a drag pans the drawing by as much
    before = svg.bounding_box()
    explorer.page.mouse.down()
    explorer.page.mouse.move(v["x"] + v["width"] / 2 + 80, v["y"] + v["height"] / 2 + 30, steps=4)
    explorer.page.mouse.up()
    after = svg.bounding_box()
    assert abs(after["x"] - before["x"] - 80) <= 2 and abs(after["y"] - before["y"] - 30) <= 2, (before, after)
    panel.get_by_role("button", name="fit").click()
    expect(scale).to_have_text(f"{fitted}%")


def test_timeline_tab_is_interactive_hover_zoom_pan_and_click(explorer):
    """The Timeline tab draws every core and pipe on a canvas: hovering a bar shows its
    instruction, Ctrl + wheel zooms the cycle axis (the range shown narrows), fit goes back, and a
    click shows the instruction's PTO line and kernel line under it."""
    panel = show_tab(explorer, "Timeline")
    canvas = timeline_canvas(explorer)
    expect(canvas).to_be_visible()
    box = canvas.bounding_box()
    assert box["width"] > 300 and box["height"] > 50, box
    rng = panel.locator(".pypto-tl-range")
    end = cycles_in(panel.locator(".pypto-tl-title").inner_text())
    expect(rng).to_have_text(f"cycles 0\u2013{end} of {end}")
    # hover: find a bar by sweeping the first row (a person moves the mouse until a tooltip shows)
    tip = panel.locator(".pypto-tl-tip")
    y = box["y"] + 7
    for k in range(60):
        explorer.page.mouse.move(box["x"] + 100 + k * (box["width"] - 110) / 60, y)
        if tip.is_visible():
            break
    expect(tip).to_be_visible()
    expect(tip).to_contain_text(re.compile(r"^\w+ on AI[CV]\d+ \w+: cycles \d+\u2013\d+ \(\d+\), task \d+ instruction \d+"))
    hovered = tip.inner_text()
    save_screenshot(explorer, ARTIFACTS / "explorer_timeline_hover.png")
    # click that bar: its PTO line and kernel line appear under the timeline
    explorer.page.mouse.down()
    explorer.page.mouse.up()
    info = panel.locator(".pypto-timeline-selected")
    expect(info).to_be_visible()
    task, index = re.search(r"task (\d+) instruction (\d+)", hovered).groups()
    expect(info).to_contain_text(f"task {task} instruction {index}")
    expect(info).to_contain_text(re.compile(r"kernel line In\[\d+\]:\d+"))
    # Ctrl + wheel over the middle zooms in around the pointer
    explorer.page.mouse.move(box["x"] + box["width"] / 2, y)
    explorer.page.keyboard.down("Control")
    explorer.page.mouse.wheel(0, -600)
    explorer.page.keyboard.up("Control")
    expect(rng).not_to_have_text(f"cycles 0\u2013{end} of {end}")
    lo, hi = map(int, re.search(r"cycles (\d+)\u2013(\d+) of", rng.inner_text()).groups())
    assert hi - lo < end * 0.6, (lo, hi, end)
    save_screenshot(explorer, ARTIFACTS / "explorer_timeline_zoomed.png")
    # drag pans: the range moves, its width stays
    explorer.page.mouse.move(box["x"] + box["width"] / 2, y)
    explorer.page.mouse.down()
    explorer.page.mouse.move(box["x"] + box["width"] / 2 - 120, y, steps=4)
    explorer.page.mouse.up()
    lo2, hi2 = map(int, re.search(r"cycles (\d+)\u2013(\d+) of", rng.inner_text()).groups())
    assert lo2 > lo and abs((hi2 - lo2) - (hi - lo)) <= 2, (lo, hi, lo2, hi2)
    panel.get_by_role("button", name="fit").click()
    expect(rng).to_have_text(f"cycles 0\u2013{end} of {end}")
    save_screenshot(explorer, ARTIFACTS / "explorer_timeline.png")


def test_stats_tab_shows_the_cycles_of_the_header(explorer):
    panel = show_tab(explorer, "Stats")
    expect(panel.locator("table")).to_be_visible()
    expect_stats_cycles(panel, cycles_in(header(explorer).inner_text()))
    save_screenshot(explorer, ARTIFACTS / "explorer_stats.png")


def test_screenshots_of_the_explorer(tutorial, explorer):
    page = tutorial.page
    expect(show_tab(explorer, "Tile").locator("svg g.node").first).to_be_visible()
    explorer.scroll_into_view_if_needed()
    # the part of the notebook around the explorer, as a person sees it
    save_screenshot(page, ARTIFACTS / "notebook.png")
    show_tab(explorer, "Timeline")
    expect(timeline_canvas(explorer)).to_be_visible()
    shot = save_screenshot(explorer, ARTIFACTS / "explorer.png")
    assert shot.stat().st_size > 10_000
    if os.environ.get("PYPTO_UPDATE_SCREENSHOT") == "1":
        copy_file(shot, DOCS_SCREENSHOT)


def test_moving_the_TM_slider_recompiles_and_updates_the_cycles(explorer):
    tm = slider(explorer, "TM")
    readout = tm.locator(".widget-readout")
    expect(readout).to_have_text("64")      # the tutorial's default
    head = header(explorer)
    before_text = head.inner_text()
    before = cycles_in(before_text)

    press(explorer, "TM", "ArrowLeft")       # 64 -> 32; released at once (continuous_update=False)
    expect(readout).to_have_text("32")
    expect(head).not_to_have_text(before_text)
    after = cycles_in(head.inner_text())
    assert after != before, (before, after)
    expect(status(explorer)).to_contain_text("TM=32")
    # The tab on display follows the new configuration too.
    expect_stats_cycles(show_tab(explorer, "Stats"), after)
    save_screenshot(explorer, ARTIFACTS / "explorer_slider_TM32.png")

    press(explorer, "TM", "ArrowRight")      # back to 64: the cached result, the same cycles
    expect(readout).to_have_text("64")
    expect(status(explorer)).to_contain_text("TM=64")
    expect(head).to_contain_text(f"{before} cycles")


def test_a_slider_to_a_tile_that_does_not_fit_says_why_and_keeps_the_view(explorer):
    tm = slider(explorer, "TM")
    readout = tm.locator(".widget-readout")
    if readout.inner_text().strip() != "64":     # the previous test failed half-way
        pytest.skip("TM slider not at 64")
    head = header(explorer)
    before_text = head.inner_text()
    press(explorer, "TM", "ArrowRight")          # 64 -> 128: 128x256 fp32 tiles overflow UB
    err = explorer.locator("pre").filter(has_text="TileShapeError").first
    expect(err).to_be_visible()
    expect(err).to_contain_text("previous configuration")
    expect(readout).to_have_text("64")           # the slider went back to what is shown
    assert head.inner_text() == before_text
    # next to the slider (not 800 px below, under the views): what failed and what fits
    near = explorer.locator(".pypto-control-error")
    expect(near).to_be_visible()
    expect(near).to_contain_text("TM=128: TileShapeError: ")
    expect(near).to_contain_text("the largest TM that compiles (with TN=256) is 64")
    expect(explorer.get_by_role("button", name="use TM=64")).to_be_visible()
    s_box, e_box = tm.bounding_box(), near.bounding_box()
    assert 0 <= e_box["y"] - (s_box["y"] + s_box["height"]) < 80, (s_box, e_box)
    save_screenshot(explorer, ARTIFACTS / "explorer_slider_error.png")

    press(explorer, "TM", "ArrowLeft")           # a good value again: the error goes away
    expect(readout).to_have_text("32")
    expect(status(explorer)).to_contain_text("TM=32")
    expect(err).to_have_count(0)
    expect(near).to_be_hidden()


def test_a_mistake_in_a_pypto_cell_shows_a_short_error_with_its_line(lab, browser):
    nb = Notebook.open(browser, lab, ERRORS, workspace="mistakes", timeout=120_000)
    try:
        nb.run_all(timeout=180_000)
        # The notebook runs on this interpreter (the project's .venv).
        assert nb.output_text(nb.code_cell("print(sys.prefix)")).strip() == sys.prefix

        magic_cell = nb.code_cell("%%pypto")
        call_cell = nb.page.locator(".jp-Notebook .jp-CodeCell").last     # bad_softmax(x, out)
        for cell in (magic_cell, call_cell):
            # (a %%pypto cell's first output is the empty one its busy bar stood on: busy.py)
            out = cell.locator(".jp-OutputArea-output").filter(has_text="TileShapeError")
            expect(out.first).to_be_visible()
            text = nb.output_text(cell)
            assert "TileShapeError" in text, text
            assert BAD_LINE in text, text
            lines = text.splitlines()                   # carets under the failing call
            at = next((i for i, ln in enumerate(lines) if ln.strip() == BAD_LINE), None)
            assert at is not None and at + 1 < len(lines), f"no source line in:\n{text}"
            src, caret = lines[at], lines[at + 1]
            assert caret.strip() == "^" * len(BAD_LINE) and caret.index("^") == src.index(BAD_LINE), \
                f"no caret line under the call in:\n{text}"
            assert re.search(r"\bline 4\b|:4:", text), f"the kernel's line (4) is not named in:\n{text}"
            assert "Traceback" not in text, text
            assert "pypto/" not in text, f"pypto's own frames leak into:\n{text}"
            assert not cell.locator(".widget-tab").count(), "no explorer for a kernel that does not compile"
        save_screenshot(nb.page.locator(".jp-Notebook"), ARTIFACTS / "error_cells.png")

        # The error names the cell by the number its prompt shows, also after a re-run.
        numbers = []
        for _ in range(2):
            n = prompt_number(magic_cell)
            numbers.append(n)
            text = nb.output_text(magic_cell)
            assert f"In[{n}]:4: " in text and f"Cell In[{n}], line 4, in bad_softmax" in text, (n, text)
            magic_cell.locator(".jp-InputArea-editor").click()
            nb.page.keyboard.press("Control+Enter")          # run it again, in place
            nb.page.wait_for_function(      # a number again, another one (not [*], not [n])
                """([cell, n]) => { const p = cell.querySelector('.jp-InputPrompt');
                                    const m = p && /\\[(\\d+)\\]/.exec(p.textContent);
                                    return m !== null && Number(m[1]) !== n; }""",
                arg=[magic_cell.element_handle(), n], timeout=TIMEOUT, polling=200)
            nb.wait_ready()
        assert numbers[1] > numbers[0]
    finally:
        nb.page.close()


def prompt_number(cell) -> int:
    m = re.search(r"\[(\d+)\]", cell.locator(".jp-InputPrompt").inner_text())
    assert m, cell.locator(".jp-InputPrompt").inner_text()
    return int(m.group(1))


def test_a_stored_tutorial_opens_unmodified_and_untrusted_shows_pictures(lab, browser):
    """Opened as stored (its kernel started, its outputs and saved widgets shown), a tutorial is
    not marked modified: nothing to save, no prompt on closing.  It is not trusted here (this
    server's own trust database), so JupyterLab sanitizes its HTML outputs: the explorer's
    snapshot still shows its Tensor graph and timeline as pictures, not as a blob of labels."""
    nb = Notebook.open(browser, lab, STORED, workspace="stored", timeout=120_000)
    try:
        nb.page.wait_for_timeout(2000)               # anything that would touch the model has run
        tab = nb.page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").filter(has_text=STORED)
        expect(tab).to_have_count(1)
        assert "jp-mod-dirty" not in (tab.get_attribute("class") or ""), tab.get_attribute("class")
        snap = nb.code_cell("pypto.explore(").locator(".pypto-explorer-static")
        expect(snap).to_be_visible()
        assert snap.locator("svg").count() == 0               # sanitized: the inline form would be gone
        pics = snap.locator("div[style*='background-image']")
        expect(pics).to_have_count(2)
        for k, kind in enumerate(("image/svg+xml", "image/png")):
            pic = pics.nth(k)
            pic.scroll_into_view_if_needed()
            bg = pic.evaluate("el => getComputedStyle(el).backgroundImage")
            assert bg.startswith(f'url("data:{kind};base64,'), bg[:60]
            box = pic.bounding_box()
            assert box["width"] > 100 and box["height"] > 100, box
        text = snap.inner_text()
        assert "tensor graph" not in text and "fp32[" not in text, text[:300]    # no labels as text
        save_screenshot(snap, ARTIFACTS / "untrusted_snapshot.png")
    finally:
        nb.page.close()


# --- a kernel with a pypto.DYNAMIC dim: the size slider ---------------------------------------------
def test_a_dynamic_kernel_shows_a_size_slider_at_the_rows_of_its_arrays(dynamic, dyn_explorer, dyn_cycles):
    import pypto
    # The notebook's kernel imports the pypto this process tests (and computes the expected cycles).
    assert dynamic.output_text(dynamic.code_cell("print(pypto.__file__)")).strip() == pypto.__file__
    size = slider(dyn_explorer, DYN_LABEL)
    expect(size.locator(".widget-readout")).to_have_text(str(DYN_ROWS))
    head = header(dyn_explorer)
    expect(head).to_contain_text(re.compile(rf"\bN = {DYN_ROWS} rows\b.*\b{dyn_cycles(DYN_ROWS)} cycles\b"))
    expect(head).to_contain_text(re.compile(rf"check OK\s+on your arrays \({DYN_ROWS} rows\)"))
    expect(status(dyn_explorer)).to_contain_text(re.compile(rf"^\s*ready: .*\bN={DYN_ROWS} \(compile "))
    save_screenshot(dyn_explorer, ARTIFACTS / f"explorer_dynamic_N{DYN_ROWS}.png")


def test_moving_the_size_slider_resimulates_without_recompiling(dynamic, dyn_explorer, dyn_cycles):
    readout = slider(dyn_explorer, DYN_LABEL).locator(".widget-readout")
    if readout.inner_text().strip() != str(DYN_ROWS):        # the previous test failed half-way
        pytest.skip(f"size slider not at {DYN_ROWS}")
    head, line = header(dyn_explorer), status(dyn_explorer)
    # Home / End: the slider's first and last values (1 and 8192, the largest power of two shown).
    for key, n, data in (("Home", 1, "on rows 0:1 of your arrays"),
                         ("End", 8192, f"on 8192 rows made from your arrays: their {DYN_ROWS}, then "
                                       f"{8192 - DYN_ROWS} drawn from them")):
        press(dyn_explorer, DYN_LABEL, key)
        expect(readout).to_have_text(str(n))
        # the header in one update: the size, the cycles of a call on n rows
        expect(head).to_contain_text(re.compile(rf"\bN = {n} {'row' if n == 1 else 'rows'}\b.*\b{dyn_cycles(n)} cycles\b"))
        # the status line as after a TM move, but the one compile serves this size too
        expect(line).to_contain_text(re.compile(rf"^\s*ready: .*\bN={n} \(no recompile, simulate "))
        # the numpy check follows (deferred in a live kernel), on arrays made from the user's
        expect(head).to_contain_text(re.compile(r"check OK\s+" + re.escape(data)))
        dynamic.wait_ready()                           # the kernel is idle again
        save_screenshot(dyn_explorer, ARTIFACTS / f"explorer_dynamic_N{n}.png")
    # The Stats tab shows the same run and says which data it checked.
    panel = show_tab(dyn_explorer, "Stats")
    expect_stats_cycles(panel, dyn_cycles(8192))
    data_row = panel.locator("tr").filter(has=panel.page.locator("th", has_text=re.compile(r"^\s*data\s*$")))
    expect(data_row.locator("td")).to_contain_text("outputs not written to your arrays")


def test_the_timeline_follows_the_size_slider(dyn_explorer, dyn_cycles):
    readout = slider(dyn_explorer, DYN_LABEL).locator(".widget-readout")
    if readout.inner_text().strip() != "8192":      # the previous test failed half-way
        pytest.skip("size slider not at 8192")
    show_tab(dyn_explorer, "Timeline")            # selected after a move: drawn for the size shown
    expect_timeline_cycles(dyn_explorer, dyn_cycles(8192))
    # A move while the Timeline is on display redraws it for the new size.
    press(dyn_explorer, DYN_LABEL, "ArrowLeft")     # 8192 -> 4096
    expect(readout).to_have_text("4096")
    head = header(dyn_explorer)
    expect(head).to_contain_text(re.compile(rf"\bN = 4096 rows\b.*\b{dyn_cycles(4096)} cycles\b"))
    expect_timeline_cycles(dyn_explorer, dyn_cycles(4096))
    expect(head).to_contain_text("check OK")
    save_screenshot(dyn_explorer, ARTIFACTS / "explorer_dynamic_timeline_N4096.png")


# --- a mixed-dtype kernel; a change that takes seconds -------------------------------------------
def test_a_mixed_dtype_kernel_opens_and_slow_work_shows_progress(lab, browser):
    nb = Notebook.open(browser, lab, MORE, workspace="more", timeout=120_000)
    try:
        nb.run_all(timeout=240_000)
        mixed = _explorer_of(nb, "pypto.explore(mm_mixed")
        expect(header(mixed)).to_contain_text("check OK")
        expect(mixed.locator("select").filter(has=nb.page.locator("option", has_text="as given"))).to_have_count(1)
        slow = _explorer_of(nb, "# slider")
        readout = slider(slow, "T").locator(".widget-readout")
        expect(readout).to_have_text("64")
        busy = slow.locator(".pypto-busy")
        expect(busy).to_be_hidden()
        press(slow, "T", "ArrowLeft")                # 64 -> 32: seconds of compiling
        expect(busy).to_be_visible()
        expect(busy).to_contain_text(re.compile(r"compiling mm: pass \w+, \d+/\d+ passes, \d+\.\d s"))
        # the old view is marked stale at once
        expect(slow.locator(".widget-html-content").filter(has_text="updating: T=32")).to_have_count(1)
        save_screenshot(slow, ARTIFACTS / "explorer_busy.png")
        expect(busy).to_be_hidden(timeout=120_000)
        expect(status(slow)).to_contain_text(re.compile(r"ready: T=32 \(compile \d+\.\d\d s"))

        # a slow first render: the bar shows in the cell's output, then the explorer replaces it
        cell = nb.code_cell("mm.cache_clear()")
        first = cell.locator(".pypto-busy-first")
        expect(first).to_have_count(0)                   # after Run All: nothing left of it
        cell.locator(".jp-InputArea-editor").click()
        nb.page.keyboard.press("Control+Enter")
        expect(first).to_be_visible()
        expect(first).to_contain_text(re.compile(r"^mm: first compile and simulation: |compiling mm: pass \w+"))
        save_screenshot(cell, ARTIFACTS / "first_render_busy.png")
        expect(first).to_have_count(0, timeout=120_000)
        explorer = _explorer_of(nb, "mm.cache_clear()")
        expect(header(explorer)).to_contain_text(re.compile(r"\d+ cycles"))
        expect(slider(explorer, "T").locator(".widget-readout")).to_have_text("64")
    finally:
        nb.page.close()
