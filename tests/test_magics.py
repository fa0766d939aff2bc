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
    assert bytes(ex.tab.children[ex.tab.selected_index].value).startswith(b"\x89PNG")


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
])
def test_bad_options(ip, line, needle):
    result, cap = run(ip, line + "\n@pypto.jit\ndef k(x, out):\n    out[:] = x\n")
    shows_one_message(cap, "MagicUsageError", needle)
    assert not cap.outputs


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
    assert "<table>" in ex.tab.children[ex.tab.titles.index("Stats")].value   # rendered eagerly too
