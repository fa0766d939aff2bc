"""The static HTML report: one self-contained file with every level, the timeline and the stats."""
from __future__ import annotations

import base64
import re

import numpy as np
import pytest

import pypto
from pypto.viz import report as report_mod


@pypto.jit
def softmax(x, out, *, TM: int = 64, TN: int = 256):
    # a comment with markup that must be escaped: <b>bold</b> & more
    pypto.set_vec_tile_shapes(TM, TN)
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)


@pypto.jit
def mm(a, b, out):
    pypto.set_cube_tile_shapes([32, 32], [32, 64], [32, 32])
    out[:] = pypto.matmul(a, b, out_dtype=pypto.DT_FP32)


SECTIONS = ("overview", "stats", "source", "passes", "tensor", "tile", "block", "exec", "pto", "timeline")


@pytest.fixture
def softmax_args(rng):
    x = rng.standard_normal((64, 512)).astype(np.float32)
    return x, np.zeros_like(x)


def assert_self_contained(page: str):
    assert page.startswith("<!DOCTYPE html>")
    assert page.rstrip().endswith("</html>")
    low = page.lower()
    for bad in ('src="http', "src='http", "<link", "<script", "@import", "url(http", 'href="http',
                "<!doctype svg"):
        assert bad not in low, f"external resource {bad!r} in the report"
    # every src= is a data URI
    assert all(s.startswith("data:") for s in re.findall(r'src="([^"]*)"', page))


def assert_sections(page: str):
    for anchor in SECTIONS:
        assert f'<section id="{anchor}">' in page, anchor
        assert f'href="#{anchor}"' in page, anchor          # in the table of contents
    for title in ("Tensor graph", "Tile graph", "Block graph", "Execution graph", "PTO program", "Timeline"):
        assert f"<h2>{title}</h2>" in page
    # a graphviz SVG for each of the four graph levels, inlined
    assert page.count("<svg") >= 4
    assert "<?xml" not in page


def png_of(page: str) -> bytes:
    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert m, "no timeline PNG"
    png = base64.b64decode(m.group(1))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    return png


def test_report_with_data(tmp_path, softmax_args):
    x, out = softmax_args
    ck = softmax.compile(x, out, TM=16)
    path = tmp_path / "softmax.html"
    got = pypto.report(ck, path, x, out)
    assert got == str(path)
    page = path.read_text(encoding="utf-8")
    assert_self_contained(page)
    assert_sections(page)
    png_of(page)
    res = ck.simulate(x, out)                       # the same simulation the report ran
    assert res.ok
    assert f'<div class="v ">{res.cycles}</div>' in page
    assert f"{res.time_us:.3f} us" in page
    assert res.stats["bound"] in page
    assert '<div class="v ok">OK vs numpy</div>' in page
    assert "check out</th><td>OK vs numpy" in page
    # header: kernel, machine, constants
    assert "softmax(x: fp32[64,512], out: fp32[64,512]) on a2a3" in page
    assert "TM=16, TN=256" in page
    # the printed text of every level and the pass log
    assert html_escaped(ck.tensor_graph.text()) in page
    assert html_escaped(ck.block_graph.text()) in page
    assert html_escaped(ck.exec_graph.text()) in page
    assert html_escaped(ck.tile_graph.text()) in page
    assert html_escaped(ck.program.text()) in page    # small: every task
    assert html_escaped(ck.pass_log.text().splitlines()[1]) in page
    for op in ("TROWMAX", "TROWEXPANDSUB", "TEXP", "TSTORE"):
        assert op in page
    # the source is shown, escaped
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; more" in page
    assert "<b>bold</b>" not in page


def html_escaped(text: str) -> str:
    import html
    return html.escape(text)


def test_report_without_data_is_timing_only(tmp_path):
    specs = [pypto.Tensor((64, 512), pypto.DT_FP32), pypto.Tensor((64, 512), pypto.DT_FP32)]
    ck = softmax.compile(*specs, TM=32)
    path = pypto.report(ck, tmp_path / "r.html")
    page = open(path, encoding="utf-8").read()
    assert_self_contained(page)
    assert_sections(page)
    png_of(page)
    res = ck.simulate(mode="timing")
    assert f'<div class="v ">{res.cycles}</div>' in page
    assert "not checked" in page
    assert "OK vs numpy" not in page


def test_report_of_a_given_result_and_title(tmp_path, softmax_args):
    x, out = softmax_args
    ck = softmax.compile(x, out)
    res = ck.simulate(x, out)
    res.check = {"out": dict(res.check["out"], ok=False)}      # pretend a mismatch
    path = report_mod.write_report(ck, tmp_path / "r.html", res=res, title="Softmax <tuned>")
    page = open(path, encoding="utf-8").read()
    assert "<title>Softmax &lt;tuned&gt;</title>" in page
    assert "<h1>Softmax &lt;tuned&gt;</h1>" in page
    assert '<div class="v bad">MISMATCH vs numpy (out)</div>' in page


def test_matmul_report(tmp_path, rng):
    a = rng.standard_normal((64, 128)).astype(np.float16)
    b = rng.standard_normal((128, 96)).astype(np.float16)
    c = np.zeros((64, 96), np.float32)
    ck = mm.compile(a, b, c)
    page = open(pypto.report(ck, tmp_path / "mm.html", a, b, c), encoding="utf-8").read()
    assert_self_contained(page)
    assert_sections(page)
    png_of(page)
    res = ck.simulate(a, b, c)
    assert f'<div class="v ">{res.cycles}</div>' in page
    assert '<div class="v ok">OK vs numpy</div>' in page
    for op in ("TMATMUL", "TEXTRACT", "TLOAD", "TSTORE"):
        assert op in page
    assert "AIC" in page
    assert "TFLOP/s" in page                         # cube kernels report their compute rate


def test_report_html_fragment_for_notebooks(softmax_args):
    x, out = softmax_args
    ck = softmax.compile(x, out)
    res = ck.simulate(x, out)
    frag = report_mod.report_html(ck, res, full_document=False)
    assert frag.startswith('<div class="pypto-report"><style>')
    assert frag.endswith("</div>")
    assert "<html" not in frag and "<body" not in frag
    css = frag[frag.index("<style>"):frag.index("</style>")]
    # the CSS is scoped to the report: it cannot restyle the rest of a notebook
    selectors = re.sub(r"\{[^}]*\}", ",", css.removeprefix("<style>")).split(",")
    selectors = [s.strip() for s in selectors if s.strip()]
    assert len(selectors) > 10
    for selector in selectors:
        assert selector.startswith(".pypto-report"), selector
    assert "<svg" in frag and "data:image/png;base64," in frag
    assert report_mod.report_html(ck, res).startswith("<!DOCTYPE html>")


def test_long_program_is_cut_with_a_note(tmp_path):
    specs = [pypto.Tensor((1024, 1024), pypto.DT_FP32)] * 2
    ck = softmax.compile(*specs, TM=16, TN=128)
    total = len(ck.program.text().splitlines())
    assert total > report_mod.MAX_PTO_LINES           # the case under test
    text, shown = report_mod.pto_text(ck.program)
    assert 0 < shown < len(ck.program.tasks)
    assert len(text.splitlines()) <= report_mod.MAX_PTO_LINES
    assert text == ck.program.text(max_tasks=shown)
    page = open(pypto.report(ck, tmp_path / "big.html"), encoding="utf-8").read()
    assert f"showing the first {shown} of {len(ck.program.tasks)} tasks" in page
    assert f".task {shown - 1} " in page and f".task {shown} " not in page


def test_pto_text_keeps_small_programs_whole():
    ck = softmax.compile(*[pypto.Tensor((64, 512), pypto.DT_FP32)] * 2)
    text, shown = report_mod.pto_text(ck.program)
    assert shown == len(ck.program.tasks) and text == ck.program.text()
    text, shown = report_mod.pto_text(ck.program, max_lines=5)
    assert shown == 1                                # always at least one whole task


def test_report_survives_a_missing_dot(tmp_path, monkeypatch):
    from pypto.viz import graphs

    def no_dot(_):
        raise RuntimeError("failed to execute 'dot', make sure the Graphviz executables are on your PATH")

    monkeypatch.setattr(graphs, "to_svg", no_dot)
    ck = softmax.compile(*[pypto.Tensor((64, 512), pypto.DT_FP32)] * 2)
    page = open(pypto.report(ck, tmp_path / "r.html"), encoding="utf-8").read()
    assert "<svg" not in page
    assert page.count("graph not drawn: RuntimeError: failed to execute") == 4
    assert "data:image/png;base64," in page            # the rest of the report is there
    assert '<section id="pto">' in page
