"""`%load_ext pypto` and the %%pypto cell magic, on a real IPython shell."""
import linecache
import re

import numpy as np
import pytest

pytest.importorskip("IPython")
pytest.importorskip("ipywidgets")

import pypto  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

SOFTMAX_CELL = """%%pypto --args x,out
import pypto

@pypto.jit
def softmax(x, out, *, TM: int = 32, TN: int = 256):
    pypto.set_vec_tile_shapes(TM, TN)
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)
"""

BAD_TILE_CELL = """%%pypto --args x,out
@pypto.jit
def bad(x, out):
    pypto.set_vec_tile_shapes(8, 100)
    out[:] = pypto.exp(x)
"""


@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "pypto")
    shell.run_line_magic("colors", "nocolor")
    yield shell
    from pypto.magics import unload_ipython_extension
    unload_ipython_extension(shell)


@pytest.fixture(autouse=True)
def arrays(ip):
    rng = np.random.default_rng(0)
    ip.user_ns["x"] = rng.random((256, 1024), dtype=np.float32)
    ip.user_ns["out"] = np.zeros((256, 1024), np.float32)
    ip.user_ns["pypto"] = pypto
    ip.user_ns["np"] = np


def run(ip, cell):
    with capture_output() as cap:
        result = ip.run_cell(cell)
    return result, cap


def explorers(ip):
    return ip.magics_manager.registry["PyptoMagics"].explorers


def shows_one_message(cap, *needles):
    err = cap.stderr
    assert "Traceback" not in err + cap.stdout
    for n in needles:
        assert n in err, (n, err)
    return err


def test_cell_defines_kernel_and_shows_explorer(ip):
    result, cap = run(ip, SOFTMAX_CELL)
    assert result.success and cap.stderr == ""
    kernel = ip.user_ns["softmax"]
    assert isinstance(kernel, pypto.JitKernel)
    [ex] = explorers(ip)
    assert ex.kernel is kernel
    texts = [o.data["text/plain"] for o in cap.outputs]
    assert texts == [f"Explorer(softmax, machine=a2a3, TM=32, TN=256): {ex.res.cycles} cycles, "
                     f"{ex.res.time_us:.3f} us, check OK"]
    assert "application/vnd.jupyter.widget-view+json" in cap.outputs[0].data
    assert f"<b>{ex.res.cycles}</b> cycles" in cap.outputs[0].data["text/html"]   # static snapshot
    # The kernel stays usable from ordinary cells.
    result, _ = run(ip, "softmax(x, out)\nok = bool(np.allclose(out.sum(-1), 1, atol=1e-4))")
    assert result.success and ip.user_ns["ok"] is True


def test_cell_source_is_in_linecache_with_visible_line_numbers(ip):
    run(ip, SOFTMAX_CELL)
    code = ip.user_ns["softmax"].fn.__code__
    visible = SOFTMAX_CELL.splitlines()
    assert linecache.getline(code.co_filename, code.co_firstlineno).rstrip("\n") == \
        visible[code.co_firstlineno - 1] == "@pypto.jit"


def test_machine_and_show_options(ip):
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", "--args x,out --machine teach --show timeline"))
    assert result.success and cap.stderr == ""
    [ex] = explorers(ip)
    assert ex.text().startswith("Explorer(softmax, machine=teach, TM=32, TN=256)")
    assert ex.tab.titles[ex.tab.selected_index] == "Timeline"
    assert ex.timeline.data["runs"][0]["title"].startswith("softmax on teach: ")   # drawn at once


def test_missing_arg_names_the_variable(ip):
    ip.user_ns["x_in"] = ip.user_ns["x"]
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", "--args x_inn,out"))
    err = shows_one_message(cap, "MagicUsageError", "'x_inn' is not defined", "x_in")
    assert len(err.strip().splitlines()) <= 4
    assert not cap.outputs and explorers(ip) == []
    assert isinstance(ip.user_ns["softmax"], pypto.JitKernel)     # the cell itself did run


def test_kernel_error_shows_source_line_and_caret(ip):
    result, cap = run(ip, BAD_TILE_CELL)
    assert result.success                  # the shell carries on
    err = shows_one_message(cap, "TileShapeError", "^", "expected:", "got:")
    # The message quotes a line of the kernel, with the caret on the next line, and the
    # line number it names is the line as seen in the cell (the %%pypto line is line 1).
    m = re.search(r'line (\d+), in bad\n    (.+)\n    \^', err)
    assert m, err
    lineno, text = int(m.group(1)), m.group(2)
    assert BAD_TILE_CELL.splitlines()[lineno - 1].strip() == text.strip()
    assert not cap.outputs
    result, cap = run(ip, "after = 41 + 1")
    assert result.success and ip.user_ns["after"] == 42 and cap.stderr == ""


def test_pypto_error_in_ordinary_cell_shows_only_the_message(ip):
    run(ip, BAD_TILE_CELL)
    result, cap = run(ip, "bad(x, out)")
    assert not result.success and isinstance(result.error_in_exec, pypto.TileShapeError)
    text = cap.stdout + cap.stderr
    assert "Traceback" not in text and "TileShapeError" in text and "^" in text
    assert "pypto/" not in text                   # no frame of pypto itself
    result, _ = run(ip, "after = 1")
    assert result.success


def test_cell_without_kernel(ip):
    result, cap = run(ip, "%%pypto --args x,out\ny = 2\n")
    shows_one_message(cap, "MagicUsageError", "defines no @pypto.jit kernel")
    assert ip.user_ns["y"] == 2


@pytest.mark.parametrize("line, needle", [
    ("%%pypto --args x,out --bogus", "unrecognized arguments: --bogus"),
    ("%%pypto --args x,out --show tiles", "unknown view 'tiles'"),
    ("%%pypto", "needs --args"),
    ("%%pypto --args x,out --machine tpu", "unknown machine 'tpu'"),
    ("%%pypto --args x,out --dtype fp64", "argument --dtype: invalid choice"),
    ("%%pypto --args x,out --range TM=64:16", "1 <= lo <= hi"),
    ("%%pypto --args x,out --range TM", "cannot read 'TM'"),
    ("%%pypto --args x,out --compare TM=32,TM=64,TM=128", "two configurations"),
    ("%%pypto --args x,out --compare TM=big", "cannot read 'TM=big'"),
    ("%%pypto --args x,out --no-sim --check", "--check needs a simulation"),
    ("%%pypto --args x,out --no-sim --trace t.json", "--trace needs a simulation"),
])
def test_bad_options(ip, line, needle):
    result, cap = run(ip, line + "\n@pypto.jit\ndef k(x, out):\n    out[:] = x\n")
    err = shows_one_message(cap, "MagicUsageError", needle)
    assert len(err.strip().splitlines()) <= 4                # short: message, expected, got
    assert not cap.outputs
    result, cap = run(ip, "still_alive = 1")                 # the shell carries on
    assert result.success and ip.user_ns["still_alive"] == 1


def test_bad_option_prints_the_usage(ip):
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", "--args x,out --bogus"))
    assert result.success
    err = shows_one_message(cap, "unrecognized arguments")
    assert "%%pypto --args x,out [--machine a2a3|teach" in err and "--compare" in err


def test_other_errors_are_not_swallowed(ip):
    result, cap = run(ip, "%%pypto --args x,out\ndef f():\n    return 1 / 0\nf()\n")
    text = cap.stdout + cap.stderr
    assert "ZeroDivisionError" in text and "Traceback" in text
    assert "magics/__init__.py" not in text       # the traceback starts at the cell
    assert "----> 4 f()" in text                  # visible line numbers


def test_signature_mismatch_is_a_short_message(ip):
    result, cap = run(ip, "%%pypto --args x\n@pypto.jit\ndef k(x, out):\n    out[:] = x\n")
    shows_one_message(cap, "KernelSignatureError", "takes 2 tensor arguments")


def test_option_lists_may_contain_spaces(ip):
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", "--args x, out --show tile, stats"))
    assert result.success and cap.stderr == ""
    [ex] = explorers(ip)
    assert ex.tab.titles[ex.tab.selected_index] == "Tile"
    assert "<table>" in ex.views["Stats"].value   # rendered eagerly too


# --- options -----------------------------------------------------------------------------------
def test_help_lists_options_with_examples(ip):
    doc = ip.find_cell_magic("pypto").__doc__
    for opt in ("--args", "--machine", "--show", "--dtype", "--range", "--compare", "--no-sim",
                "--check", "--trace"):
        assert opt in doc, opt
    assert "Examples" in doc and "%%pypto --args x,out --compare TM=32,TM=128" in doc
    assert "TM=32+TN=512" in doc and "%config PyptoMagics.machine" in doc
    result, cap = run(ip, "%%pypto?\n")
    assert result.success


def test_range_sets_the_slider_values(ip):
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", "--args x,out --range TM=16:128 TN=256,512"))
    assert result.success and cap.stderr == ""
    [ex] = explorers(ip)
    assert [v for _, v in ex.sliders["TM"].options] == [16, 32, 64, 128]
    assert [v for _, v in ex.sliders["TN"].options] == [256, 512]
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", "--args x,out --range TK=16:128"))
    shows_one_message(cap, "MagicUsageError", "TK is not an int constant of softmax")


def test_no_sim_compiles_only(ip):
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", "--args x,out --no-sim"))
    assert result.success and cap.stderr == ""
    [ex] = explorers(ip)
    assert ex.res is None
    text = cap.outputs[0].data["text/plain"]
    assert "not simulated" in text and "cycles" not in text
    ex.select("Timeline")
    assert "not simulated" in ex.views["Timeline"].value


def test_trace_writes_chrome_json(ip, tmp_path):
    import json
    path = tmp_path / "softmax_trace.json"
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", f"--args x,out --trace {path}"))
    assert result.success and cap.stderr == ""
    [ex] = explorers(ip)
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X" and e.get("cat") != "task"]
    assert len([e for e in trace["traceEvents"] if e["ph"] == "X"]) >= len(ex.res.trace) > 0
    assert events and f"Chrome trace written to {path}" in cap.stdout


def test_check_prints_the_verdict(ip):
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", "--args x,out --check"))
    assert result.success and cap.stderr == ""
    assert "softmax: check OK on a2a3 (out: OK vs numpy (max abs err" in cap.stdout


def test_check_mismatch_fails_the_cell_with_a_short_message(ip, monkeypatch):
    import pypto.frontend.kernel as kernel_mod

    def wrong(outputs, expected, traced, step=None):
        return {name: {"ok": False, "max_abs_err": 1.0, "max_err_ratio": 9.5, "worst": (0, 3)}
                for name in traced.output_names}

    monkeypatch.setattr(kernel_mod, "compare", wrong)
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", "--args x,out --check"))
    assert not result.success
    assert type(result.error_in_exec).__name__ == "CheckMismatchError"
    text = cap.stdout + cap.stderr
    assert "check MISMATCH" in text and "Traceback" not in text and "pypto/" not in text
    assert "9.5x its bound at out[0, 3]" in text
    monkeypatch.undo()
    result, cap = run(ip, "after_mismatch = 1")
    assert result.success


def test_dtype_option_casts_the_arguments(ip):
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", "--args x,out --dtype fp16"))
    assert result.success and cap.stderr == ""
    [ex] = explorers(ip)
    assert [str(p.dtype) for p in ex.ck.params] == ["fp16", "fp16"] and "dtype=fp16" in ex.text()
    assert ip.user_ns["x"].dtype == np.float32                 # the notebook's arrays are untouched


def test_config_sets_the_default_machine(ip, caplog):
    try:
        result, cap = run(ip, '%config PyptoMagics.machine = "teach"')
        assert result.success and cap.stderr == ""
        run(ip, SOFTMAX_CELL)
        [ex] = explorers(ip)
        assert ex.machine == "teach"
        run(ip, SOFTMAX_CELL.replace("--args x,out", "--args x,out --machine a2a3"))   # the option wins
        assert explorers(ip)[0].machine == "a2a3"
        result, cap = run(ip, '%config PyptoMagics.machine = "tpu"')    # rejected by the trait
        assert "unknown machine 'tpu'" in cap.stdout + cap.stderr + caplog.text
        assert ip.magics_manager.registry["PyptoMagics"].machine == "teach"
    finally:
        ip.run_line_magic("config", 'PyptoMagics.machine = "a2a3"')


def test_pypto_config_line_magic(ip):
    magics = ip.magics_manager.registry["PyptoMagics"]
    try:
        result, cap = run(ip, "%pypto_config")
        assert "machine  = 'a2a3'" in cap.stdout and "check    = False" in cap.stdout
        result, cap = run(ip, "%pypto_config machine=teach show=timeline check=true")
        assert result.success and "machine  = 'teach'" in cap.stdout
        assert (magics.machine, magics.show, magics.check) == ("teach", "timeline", True)
        result, cap = run(ip, SOFTMAX_CELL)
        [ex] = explorers(ip)
        assert ex.machine == "teach" and ex.tab.titles[ex.tab.selected_index] == "Timeline"
        assert "check OK" in cap.stdout
        result, cap = run(ip, "%pypto_config colour=blue")
        shows_one_message(cap, "MagicUsageError", "unknown setting 'colour'", "%pypto_config [machine=")
        result, cap = run(ip, "%pypto_config machine=tpu")
        shows_one_message(cap, "MagicUsageError", "unknown machine 'tpu'")
    finally:
        run(ip, "%pypto_config reset")
    assert (magics.machine, magics.show, magics.check, magics.simulate) == ("a2a3", "", False, True)


def test_compare_option_shows_both_configurations(ip):
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", "--args x,out --machine teach --compare TM=16,TM=64"))
    assert result.success and cap.stderr == ""
    assert explorers(ip) == []
    [cmp] = ip.magics_manager.registry["PyptoMagics"].comparisons
    x, out = ip.user_ns["x"], ip.user_ns["out"]
    k = ip.user_ns["softmax"]
    ca = k.compile(x, out, machine="teach", TM=16).simulate(x, out).cycles
    cb = k.compile(x, out, machine="teach", TM=64).simulate(x, out).cycles
    text = cap.outputs[0].data["text/plain"]
    assert text.startswith(f"Compare(softmax: TM=16 -> {ca} cycles | TM=64 -> {cb} cycles, B is ")
    assert "<div class='pypto-compare'>" in cap.outputs[0].data["text/html"]
    # several constants per configuration, and 'default'
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", "--args x,out --machine teach "
                                                                "--compare default,TM=16+TN=1024"))
    assert result.success and cap.stderr == ""
    text = cap.outputs[0].data["text/plain"]
    assert text.startswith("Compare(softmax: TM=32, TN=256 -> ") and "| TM=16, TN=1024 -> " in text


MIXED_CELL = """%%pypto --args a,b,c
@pypto.jit
def mm_mixed(a, b, c):
    c[:] = pypto.matmul(a, b, out_dtype=pypto.DT_FP32)
"""


def test_kernel_with_mixed_float_dtypes(ip):
    """fp16 inputs and an fp32 output: the dtype drop-down offers "as given" (no TraitError)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((32, 32)).astype(np.float16)
    b = rng.standard_normal((32, 32)).astype(np.float16)
    ip.user_ns.update(a=a, b=b, c=np.zeros((32, 32), np.float32))
    result, cap = run(ip, MIXED_CELL)
    assert result.success and cap.stderr == "", cap.stderr
    [ex] = explorers(ip)
    assert [str(p.dtype) for p in ex.ck.params] == ["fp16", "fp16", "fp32"]
    assert ex.dtype_dropdown is not None and ex.dtype_dropdown.value == "as given"
    assert ex.res.ok and "check OK" in ex.text()
    # choosing a dtype casts every float argument; "as given" goes back to the arguments' own
    ex.update(dtype="fp32")
    assert [str(p.dtype) for p in ex.ck.params] == ["fp32", "fp32", "fp32"] and ex.res.ok
    ex.update(dtype="as given")
    assert [str(p.dtype) for p in ex.ck.params] == ["fp16", "fp16", "fp32"]
    # and pypto.explore directly
    kernel = ip.user_ns["mm_mixed"]
    ex2 = pypto.explore(kernel, a, b, np.zeros((32, 32), np.float32))
    assert ex2.dtype_dropdown.value == "as given" and ex2.res.ok
    np.testing.assert_allclose(ex2.res.outputs["c"], a.astype(np.float32) @ b.astype(np.float32),
                               rtol=1e-3, atol=1e-3)


def test_cells_are_named_by_their_own_number_also_after_a_rerun(ip, monkeypatch):
    """As in Jupyter: the history on (IPython 9 counts a cell before running it) and ipykernel's
    compiler, which names a cell's file by a hash of its text, so a re-run is the same file.
    Errors, printed IR and PTO listings name the cell as its prompt does: In[N]:line."""
    from ipykernel.compiler import XCachingCompiler
    monkeypatch.setattr(ip, "compile", XCachingCompiler())
    seen = []
    for _ in range(2):
        with capture_output() as cap:
            result = ip.run_cell(BAD_TILE_CELL, store_history=True)
        n = result.execution_count
        seen.append(n)
        err = cap.stderr
        assert f"In[{n}]:4: " in err and f"Cell In[{n}], line 4, in bad" in err, (n, err)
        assert f"In[{n + 1}]" not in err
        # an ordinary cell calling the kernel names both cells by their own numbers
        with capture_output() as cap:
            call = ip.run_cell("bad(x, out)", store_history=True)
        assert isinstance(call.error_in_exec, pypto.TileShapeError)
        assert f"In[{n}]:4: " in cap.stdout + cap.stderr
    assert seen[1] == seen[0] + 2                 # the re-run has a number of its own
    with capture_output():
        result = ip.run_cell(SOFTMAX_CELL, store_history=True)
    n = result.execution_count
    ck = explorers(ip)[0].ck
    assert f"@In[{n}]:7" in ck.tile_graph.text()          # pypto.exp(x - m) is line 7 of the cell
    assert f"; In[{n}]:7" in ck.program.text()
    assert "ipykernel" not in ck.program.text()
    from pypto.ir.program import Program
    assert Program.parse(ck.program.text()).text() == ck.program.text()


def test_compare_shows_the_side_that_compiles_when_the_other_does_not(ip):
    """--compare TM=16,TM=512 on teach: TM=512 does not fit UB; the TM=16 side is explored
    alone, with the other side's error above it."""
    line = "--args x,out --machine teach --compare TM=16,TM=512"
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", line))
    assert result.success and "Traceback" not in cap.stderr
    assert "%%pypto --compare: B (TM=512) does not compile, so A (TM=16) is shown alone: TileShapeError: " \
        in cap.stderr and "do not fit UB" in cap.stderr
    [ex] = explorers(ip)
    assert ex.consts["TM"] == 16 and ex.res.ok
    assert cap.outputs[0].data["text/plain"].startswith("Explorer(softmax, machine=teach, TM=16, TN=256): ")
    result, cap = run(ip, SOFTMAX_CELL.replace("--args x,out", "--args x,out --machine teach --compare "
                                                                "TM=512,TM=1024+TN=512"))
    assert result.success and not cap.outputs and explorers(ip) == []
    assert "A (TM=512) does not compile: TileShapeError" in cap.stderr
    assert "B (TM=1024+TN=512) does not compile: TileShapeError" in cap.stderr


def test_the_first_render_shows_a_busy_bar_in_the_cell_that_leaves_no_trace(ip, monkeypatch):
    """In a kernel, an explorer's first compile shows a progress bar in the cell's output: one
    empty output at once, the bar displayed over it once the work has run busy.SHOW_AFTER_S, and
    the empty output back at the end -- the stored notebook is the same however long the compile
    took."""
    from pypto.viz import busy
    monkeypatch.setattr(busy, "in_kernel", lambda: True)
    monkeypatch.setattr(busy, "SHOW_AFTER_S", 0.0)
    with capture_output() as cap:
        result = ip.run_cell(SOFTMAX_CELL.replace("TM: int = 32", "TM: int = 8"))
    assert result.success, cap.stderr
    outs = cap.outputs
    first, shown, back, explorer = outs[0], outs[1], outs[2], outs[3]
    assert first.data == busy.HIDDEN and not first.update
    assert shown.update and shown.data["application/vnd.jupyter.widget-view+json"]["model_id"] != ""
    assert back.update and back.data == busy.HIDDEN
    assert first.transient["display_id"] == shown.transient["display_id"] == back.transient["display_id"]
    assert explorer.data["text/plain"].startswith("Explorer(softmax, machine=a2a3, TM=8, TN=256)")
    # quick work (the default threshold): the hidden output alone, never replaced
    monkeypatch.setattr(busy, "SHOW_AFTER_S", 60.0)
    with capture_output() as cap:
        run_ok = ip.run_cell(SOFTMAX_CELL.replace("TM: int = 32", "TM: int = 16")).success
    assert run_ok and cap.outputs[0].data == busy.HIDDEN and not any(o.update for o in cap.outputs)
