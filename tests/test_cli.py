"""The `pypto` command line: compile / report a kernel from a file for given shapes.

Every test writes its kernel file into tmp_path and runs `pypto.cli.main([...])` in-process
(capsys captures what it prints), except one that runs `python -m pypto` as a real subprocess.
"""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap

import pytest

import pypto
from pypto.cli import main

KERNELS = '''\
import pypto


@pypto.jit
def softmax(x, out, *, TM: int = 64, TN: int = 256):
    pypto.set_vec_tile_shapes(TM, TN)
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)


@pypto.jit
def add_one(x, out):
    out[:] = x + 1.0


@pypto.jit
def mismatch(x, out):
    out[:] = x[0:16, :] * 2.0       # the region written is smaller than the value


def helper(x):
    return x
'''

SHAPE = (64, 512)
ARGS = ["--arg", "x=64x512:fp32", "--arg", "out=64x512:fp32"]


@pytest.fixture
def kfile(tmp_path):
    path = tmp_path / "kernels.py"
    path.write_text(KERNELS)
    return path


def load(path):
    """The kernel file imported by the test itself (independently of the CLI)."""
    spec = importlib.util.spec_from_file_location(f"_test_cli_{path.parent.name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def expected_timing(path, name="softmax", **consts):
    kernel = getattr(load(path), name)
    specs = [pypto.Tensor(SHAPE, pypto.DT_FP32) for _ in kernel.tensor_params]
    return kernel.compile(*specs, **consts).simulate(mode="timing")


def printed_cycles(text: str) -> int:
    m = re.search(r"^\s*cycles\s+(\d+)", text, re.M)
    assert m, f"no cycles line in:\n{text}"
    return int(m.group(1))


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- compile -------------------------------------------------------------------------------
def test_compile_prints_pto_and_timing(kfile, capsys):
    code, out, err = run(capsys, "compile", f"{kfile}:softmax", *ARGS, "--const", "TM=16",
                         "--const", "TN=256")
    assert code == 0, err
    assert err == ""
    # default level: the PTO program, first tasks only
    assert out.startswith("// PTO program softmax:")
    for op in ("TLOAD", "TROWMAX", "TSTORE", "SET_FLAG"):
        assert op in out
    assert "more tasks" in out
    assert out.count(".task ") == 4
    # the timing simulation, equal to the one of the library
    want = expected_timing(kfile, TM=16, TN=256)
    assert printed_cycles(out) == want.cycles
    assert f"({want.time_us} us" in out
    assert re.search(r"^\s*bound\s+" + re.escape(want.stats["bound"]) + "$", out, re.M)
    assert re.search(r"^\s*pipe busy\s+AIV\.MTE2 [\d.]+%\s+AIV\.V [\d.]+%", out, re.M)
    assert "check" not in out              # timing only: nothing to check


def test_constants_change_the_compilation(kfile, capsys):
    code, out16, _ = run(capsys, "compile", f"{kfile}:softmax", *ARGS, "-c", "TM=16", "--emit", "none")
    assert code == 0
    code, out32, _ = run(capsys, "compile", f"{kfile}:softmax", *ARGS, "-c", "TM=32", "--emit", "none")
    assert code == 0
    assert printed_cycles(out16) == expected_timing(kfile, TM=16).cycles
    assert printed_cycles(out32) == expected_timing(kfile, TM=32).cycles
    assert "// PTO program" not in out16      # --emit none: only the simulation


@pytest.mark.parametrize("level, expected", [
    ("tensor", ["tensor_graph softmax(x: fp32[64,512], out: fp32[64,512])", "amax", "exp", "sum", "div"]),
    ("tile", ["tile_graph softmax", "TLOAD", "TROWMAX", "TEXP", "TSTORE"]),
    ("block", ["block_graph softmax", "task 0: group 0 on AIV"]),
    ("exec", ["exec_graph softmax", "launch task 0 on AIV"]),
    ("pto", ["// PTO program softmax", ".task 0 AIV", "TROWMAX"]),
])
def test_emit_each_level(kfile, capsys, level, expected):
    code, out, err = run(capsys, "compile", f"{kfile}:softmax", *ARGS, "--emit", level)
    assert code == 0, err
    for text in expected:
        assert text in out, f"{text!r} not in the {level} level"
    assert printed_cycles(out) == expected_timing(kfile).cycles


def test_all_pto_tasks(kfile, capsys):
    ck = load(kfile).softmax.compile(*[pypto.Tensor(SHAPE, pypto.DT_FP32)] * 2, TM=16)
    code, out, _ = run(capsys, "compile", f"{kfile}:softmax", *ARGS, "-c", "TM=16", "--tasks", "0")
    assert code == 0
    assert out.count(".task ") == len(ck.program.tasks)
    assert ck.program.text() in out


def test_arguments_in_any_order_with_dtype_default_and_single_kernel_file(tmp_path, capsys):
    path = tmp_path / "one.py"
    path.write_text(textwrap.dedent('''\
        import pypto

        @pypto.jit
        def scale(x, y, out):
            out[:] = pypto.cast(x * y, pypto.DT_FP32)
    '''))
    code, out, err = run(capsys, "compile", path, "--arg", "out=32x256", "--arg", "y=32x256:fp16",
                         "--arg", "x=32x256:float16", "--emit", "tensor")
    assert code == 0, err
    # no :KERNEL needed when the file has one kernel; parameters bound by name, not order
    assert "scale(x: fp16[32,256], y: fp16[32,256], out: fp32[32,256])" in out


def test_machine_option(kfile, capsys):
    code, out, _ = run(capsys, "compile", f"{kfile}:softmax", *ARGS, "--machine", "teach", "--emit", "none")
    assert code == 0
    kernel = load(kfile).softmax
    want = kernel.compile(*[pypto.Tensor(SHAPE, pypto.DT_FP32)] * 2, machine="teach").simulate(mode="timing")
    assert "kernel softmax on teach" in out
    assert printed_cycles(out) == want.cycles


def test_check_runs_with_data(kfile, capsys):
    code, out, err = run(capsys, "compile", f"{kfile}:softmax", *ARGS, "--check", "--emit", "none")
    assert code == 0, err
    assert re.search(r"check out\s+OK vs numpy", out)
    assert printed_cycles(out) == expected_timing(kfile).cycles   # data does not change the timing


def test_trace_and_html(kfile, tmp_path, capsys):
    trace, report = tmp_path / "t.json", tmp_path / "r.html"
    code, out, err = run(capsys, "compile", f"{kfile}:softmax", *ARGS, "--trace", trace, "--html", report)
    assert code == 0, err
    assert f"wrote Chrome trace {trace}" in out
    assert f"wrote report {report}" in out
    data = json.loads(trace.read_text())
    events = data["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    assert spans and all({"name", "ts", "dur", "pid", "tid"} <= set(e) for e in spans)
    assert {e["name"] for e in spans} >= {"TLOAD", "TROWMAX", "TSTORE"}
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert f">{printed_cycles(out)}<" in page


def test_report_command(kfile, tmp_path, capsys, monkeypatch):
    report = tmp_path / "soft.html"
    code, out, err = run(capsys, "report", f"{kfile}:softmax", *ARGS, "-o", report, "--title", "My <report>")
    assert code == 0, err
    cycles = expected_timing(kfile).cycles
    assert f"wrote report {report}: softmax on a2a3, {cycles} cycles" in out
    page = report.read_text()
    assert "<title>My &lt;report&gt;</title>" in page
    assert "not checked" in page
    # default output name: KERNEL.html in the current directory; --check adds the verdict
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "report", f"{kfile}:softmax", *ARGS, "--check")
    assert code == 0, err
    assert "check OK" in out
    assert "OK vs numpy" in (tmp_path / "softmax.html").read_text()


def test_python_dash_m_subprocess(kfile, tmp_path):
    trace = tmp_path / "sub.json"
    proc = subprocess.run([sys.executable, "-m", "pypto", "compile", f"{kfile.name}:softmax", *ARGS,
                           "--trace", str(trace)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "TROWMAX" in proc.stdout and "TLOAD" in proc.stdout
    assert printed_cycles(proc.stdout) == expected_timing(kfile).cycles
    assert json.loads(trace.read_text())["traceEvents"]
    # an error in a real process: one message, exit code, no traceback
    proc = subprocess.run([sys.executable, "-m", "pypto", "compile", f"{kfile.name}:nope", *ARGS],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("pypto: error: no kernel 'nope'")
    assert "Traceback" not in proc.stderr


# --- errors --------------------------------------------------------------------------------
def assert_one_error(err, *fragments):
    assert err.startswith("pypto: error: "), err
    assert err.count("pypto: error:") == 1
    assert "Traceback" not in err
    for f in fragments:
        assert f in err, f"{f!r} not in {err!r}"


@pytest.mark.parametrize("argv, fragments", [
    (["compile", "{k}:nope", *ARGS], ["no kernel 'nope' in", "kernels found: softmax, add_one, mismatch"]),
    (["compile", "{k}:helper", *ARGS], ["'helper'", "not a @pypto.jit kernel", "kernels found: softmax"]),
    (["compile", "{k}", *ARGS], ["defines several kernels", "softmax, add_one, mismatch"]),
    (["compile", "{k}:", *ARGS], ["bad kernel reference", "FILE.py:KERNEL"]),
    (["compile", "{d}/missing.py:softmax", *ARGS], ["no such file", "missing.py"]),
    (["compile", "{k}:softmax", "--arg", "x=64x512:fp64", "--arg", "out=64x512"],
     ["unknown dtype 'fp64'", "fp32 fp16 bf16 int8 int32"]),
    (["compile", "{k}:softmax", "--arg", "x=64by512", "--arg", "out=64x512"], ["bad shape '64by512'"]),
    (["compile", "{k}:softmax", "--arg", "x=64x0", "--arg", "out=64x512"], ["bad shape '64x0'"]),
    (["compile", "{k}:softmax", "--arg", "64x512:fp32", "--arg", "out=64x512"],
     ["bad --arg 64x512:fp32", "NAME=DIMS:DTYPE"]),
    (["compile", "{k}:softmax", "--arg", "x=64x512"], ["missing --arg for out of softmax(x, out)"]),
    (["compile", "{k}:softmax", *ARGS, "--arg", "y=4x4"], ["no tensor parameter 'y'", "x, out"]),
    (["compile", "{k}:softmax", *ARGS, "--arg", "x=4x4"], ["--arg x is given twice"]),
    (["compile", "{k}:softmax", *ARGS, "--const", "TQ=3"], ["no constant 'TQ'", "TM, TN"]),
    (["compile", "{k}:softmax", *ARGS, "--const", "TM"], ["bad --const TM", "NAME=VALUE"]),
    (["compile", "{k}:softmax", *ARGS, "--emit", "asm"], ["invalid choice: 'asm'"]),
    (["compile", "{k}:softmax", *ARGS, "--machine", "h100"], ["invalid choice: 'h100'"]),
    (["compile"], ["required: FILE.py:KERNEL"]),
    (["frobnicate"], ["invalid choice: 'frobnicate'"]),
])
def test_usage_errors(kfile, capsys, argv, fragments):
    argv = [a.format(k=kfile, d=kfile.parent) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert_one_error(err, *fragments)
    assert len(err.strip().splitlines()) == 1


def test_compile_error_is_the_pypto_message(kfile, capsys):
    """A tile that does not fit UB: the compiler's message as is (file:line, caret, expected/got)."""
    code, out, err = run(capsys, "compile", f"{kfile}:softmax", *ARGS, "-c", "TM=64", "-c", "TN=4096")
    assert code == 1
    assert out == ""
    with pytest.raises(pypto.PyptoError) as info:
        load(kfile).softmax.compile(*[pypto.Tensor(SHAPE, pypto.DT_FP32)] * 2, TM=64, TN=4096)
    assert err == f"pypto: error: {info.value}\n"
    assert_one_error(err, "kernels.py:", "do not fit UB", "expected:", "got:", "^")


def test_shape_error_in_the_kernel(kfile, capsys):
    code, out, err = run(capsys, "compile", f"{kfile}:mismatch", *ARGS)
    assert code == 1
    assert_one_error(err, "kernels.py:", "x[0:16, :] * 2.0", "expected:", "got:")


def test_bad_constant_value_is_a_kernel_error(kfile, capsys):
    code, _, err = run(capsys, "compile", f"{kfile}:softmax", *ARGS, "-c", "TM=big")
    assert code == 1
    assert_one_error(err, "constant 'TM' of softmax must be an integer", "expected: int")


def test_errors_in_the_kernel_file(tmp_path, capsys):
    bad = tmp_path / "broken.py"
    bad.write_text("import pypto\n\n@pypto.jit\ndef k(x, out):\n    out[:] = x +\n")
    code, _, err = run(capsys, "compile", f"{bad}:k", *ARGS)
    assert code == 1
    assert_one_error(err, f"{bad}:5: SyntaxError")
    boom = tmp_path / "boom.py"
    boom.write_text("import pypto\n\nraise ValueError('no data here')\n")
    code, _, err = run(capsys, "compile", f"{boom}:k", *ARGS)
    assert code == 1
    assert_one_error(err, f"{boom}:3: ValueError while importing boom.py: no data here")


def test_unwritable_output(kfile, tmp_path, capsys):
    code, _, err = run(capsys, "report", f"{kfile}:softmax", *ARGS, "-o", tmp_path / "no" / "such" / "r.html")
    assert code == 1
    assert_one_error(err, "cannot write", "r.html")


def test_kernel_file_can_import_its_neighbours(tmp_path, capsys):
    (tmp_path / "tiles.py").write_text("TM = 16\nTN = 128\n")
    (tmp_path / "uses.py").write_text(textwrap.dedent('''\
        import pypto
        import tiles

        @pypto.jit
        def k(x, out):
            pypto.set_vec_tile_shapes(tiles.TM, tiles.TN)
            out[:] = pypto.exp(x)
    '''))
    path_before = list(sys.path)
    code, out, err = run(capsys, "compile", f"{tmp_path / 'uses.py'}:k", *ARGS, "--emit", "tensor")
    assert code == 0, err
    assert "tile=[16,128]" in out
    assert sys.path == path_before             # main() leaves sys.path as it found it


def test_help_and_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"pypto {pypto.__version__}"
    code, out, _ = run(capsys, "compile", "--help")
    assert code == 0 and "--arg" in out and "--emit" in out


# --- advise and tune ------------------------------------------------------------------------
def test_advise_prints_the_bound_and_proven_suggestions(kfile, capsys):
    from pypto.tuning.advisor import advise
    code, out, err = run(capsys, "advise", f"{kfile}:softmax", *ARGS, "--const", "TM=8")
    assert code == 0, err
    kernel = load(kfile).softmax
    specs = [pypto.Tensor(SHAPE, pypto.DT_FP32) for _ in kernel.tensor_params]
    want = advise(kernel.compile(*specs, TM=8))
    assert out.strip() == want.text()
    assert out.startswith(f"advice for softmax on a2a3: {want.cycles:,} cycles, bound: ")
    assert want.best is not None and f"1. {want.best.title}: {want.best.cycles:,} cycles" in out


def test_tune_prints_the_configurations_fastest_first(kfile, capsys):
    code, out, err = run(capsys, "tune", f"{kfile}:softmax", *ARGS, "--space", "TM=8,16", "--space", "TN=256,512",
                         "--space", "double_buffer=on,off", "--top", "3")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "softmax: 8 configurations on a2a3 (in process, 0 from the cache)"
    assert lines[1].split() == ["TM", "TN", "double_buffer", "cycles", "us", "bound", "instructions", "tasks"]
    rows = [ln.split() for ln in lines[2:5]]
    cycles = [int(r[3]) for r in rows]
    assert cycles == sorted(cycles) and lines[5] == "... 5 more"
    tm, tn, db = int(rows[0][0]), int(rows[0][1]), rows[0][2] == "True"
    assert cycles[0] == expected_timing(kfile, TM=tm, TN=tn, options={"double_buffer": db}).cycles


@pytest.mark.parametrize("argv, message", [
    (["--space", "TM"], "bad --space 'TM': expected NAME=V1,V2,..."),
    ([], "tune needs at least one --space"),
])
def test_tune_usage_errors(kfile, capsys, argv, message):
    code, out, err = run(capsys, "tune", f"{kfile}:softmax", *ARGS, *argv)
    assert code == 2 and message in err


def test_tune_names_what_cannot_be_tuned(kfile, capsys):
    code, out, err = run(capsys, "tune", f"{kfile}:softmax", *ARGS, "--space", "TK=1,2")
    assert code == 1 and "'TK' is not something softmax can be tuned by" in err
