"""The rest of the seeds' API: `profile()` (kernel runs as a table), `check_graph` (findings, not
exceptions), `target_specific` (an implementation per machine, chosen while tracing) and the
`pypto build` command (program text, report and trace of a kernel or a registered op)."""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pypto
from pypto.cli import main
from pypto.frontend import custom
from pypto.frontend.custom import register_op, target_specific, unregister_op
from pypto.frontend.graph_check import check_graph
from pypto.ir.program import Program
from pypto.viz.profile import profile

from common import fresh_registry, line_of  # noqa: F401  (the fixture, used by every test)

pytestmark = pytest.mark.usefixtures("fresh_registry")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))




@pypto.jit
def softmax(x, out, *, TM: int = 16):
    pypto.set_vec_tile_shapes(TM, 256)
    out[:] = pypto.softmax(x)


@pypto.jit
def add_one(x, out):
    out[:] = x + 1.0


# ---------------------------------------------------------------------------------------
# profile

def test_profile_counts_runs_with_their_cycles(rng):
    x = rng.standard_normal((64, 256)).astype(np.float32)
    out = np.zeros_like(x)
    softmax(x, out)                                   # outside: not collected
    ck = softmax.compile(x, out)
    cycles = ck.simulate(x, out).cycles
    with profile() as prof:
        for _ in range(3):
            softmax(x, out)
        with profile(timing=False) as inner:
            add_one(x, out)
        res = ck.simulate(x, out, mode="timing")
    softmax(x, out)                                   # after: not collected
    np.testing.assert_allclose(out, np.exp(x) / np.exp(x).sum(-1, keepdims=True), rtol=1e-5)
    rows = {r["kernel"]: r for r in prof.rows}
    assert rows["softmax"]["calls"] == 4 and rows["add_one"]["calls"] == 1
    assert rows["softmax"]["cycles"] == cycles == res.cycles
    assert rows["softmax"]["config"] == "TM=16" and rows["softmax"]["machine"] == "a2a3"
    assert rows["softmax"]["total_us"] == pytest.approx(4 * ck.machine.cycles_to_us(cycles), rel=1e-3)
    assert rows["softmax"]["bound"] == res.stats["bound"]
    assert prof.rows[0]["kernel"] == "softmax"        # the longest total time first
    # the inner block saw its own run only, without timing it
    assert [(r["kernel"], r["calls"], r["cycles"]) for r in inner.rows] == [("add_one", 1, None)]
    text = prof.text()
    assert "softmax(TM=16)" in text and f"{cycles:,}" in text and "5 runs of 2 kernels" in text
    assert "functional runs only" in inner.text()
    html = prof._repr_html_()
    assert "<table" in html and "softmax(TM=16)" in html and str(prof) == text


# ---------------------------------------------------------------------------------------
# check_graph

def test_check_graph_of_a_clean_kernel_is_empty(rng):
    x = rng.standard_normal((64, 256)).astype(np.float32)
    assert check_graph(softmax, x, np.zeros_like(x)) == []
    assert check_graph(softmax, pypto.Tensor([64, 256]), pypto.Tensor([64, 256])) == []


def test_check_graph_finds_what_compiles_silently(rng):
    @pypto.jit
    def sloppy(x, y, out):
        e = pypto.exp(x)
        dead = pypto.log(x) * 2.0                    # dead
        out[0:32] = e[0:32] * 0.0                    # overwritten
        out[0:32] = e[0:32]                          # partly
    x = rng.standard_normal((64, 256)).astype(np.float32)
    found = check_graph(sloppy, x, x, np.zeros_like(x))
    kinds = {f.kind: f for f in found}
    assert set(kinds) == {"unused-input", "dead-value", "overwritten-write", "partial-output"}
    assert all(f.severity == "warning" for f in found) and found.ok
    assert "'y'" in kinds["unused-input"].message and kinds["unused-input"].loc.line == line_of(sloppy.fn, "def sloppy")
    assert kinds["dead-value"].loc.line == line_of(sloppy.fn, "# dead")
    assert "log, mul" in kinds["dead-value"].message
    assert kinds["overwritten-write"].loc.line == line_of(sloppy.fn, "# overwritten")
    assert kinds["partial-output"].loc.line == line_of(sloppy.fn, "# overwritten")
    assert "8192 of its 16384 elements" in kinds["partial-output"].message
    assert "unused-input" in found.text()


def test_check_graph_reports_errors_as_findings():
    @pypto.jit
    def big_tile(x, out):
        pypto.set_vec_tile_shapes(256, 1024)
        out[:] = pypto.softmax(x)                    # too big
    spec = pypto.Tensor([256, 1024])
    found = check_graph(big_tile, spec, spec)
    assert [f.kind for f in found] == ["TileShapeError"] and not found.ok
    assert found[0].severity == "error" and found[0].loc.line == line_of(big_tile.fn, "# too big")
    assert "set_vec_tile_shapes(16, 1024)" in found[0].hint

    @pypto.jit
    def mismatch(x, y, out):
        out[:] = x + y                               # shapes
    found = check_graph(mismatch, pypto.Tensor([8, 16]), pypto.Tensor([8, 8]), pypto.Tensor([8, 16]))
    assert [f.kind for f in found] == ["ShapeError"]
    assert found[0].loc.line == line_of(mismatch.fn, "# shapes")
    with pytest.raises(pypto.KernelSignatureError):            # a wrong call of check_graph itself
        check_graph(mismatch, pypto.Tensor([8, 16]))


# ---------------------------------------------------------------------------------------
# target_specific

def test_target_specific_picks_by_the_machine_compiled_for(rng):
    def direct(x):
        return pypto.exp(x)

    def halves(x):
        h = pypto.exp(x * 0.5)
        return h * h

    exp_for = target_specific({"a2a3": direct, "default": halves})
    strict = target_specific({"a5": direct, "teach": halves})

    @pypto.jit
    def k(x, out):
        out[:] = exp_for(x)

    @pypto.jit
    def k_strict(x, out):
        out[:] = strict(x)                           # no a2a3

    x = rng.standard_normal((16, 128)).astype(np.float32)
    out = np.zeros_like(x)
    graphs = {}
    for m in ("a2a3", "a5"):
        ck = k.compile(x, out, machine=m)
        graphs[m] = [n.op for n in ck.traced.nodes]
        res = ck.simulate(x, out)
        np.testing.assert_allclose(res.outputs["out"], np.exp(x), rtol=1e-5)
    assert graphs["a2a3"] == ["input", "input", "exp", "store"]
    assert graphs["a5"] == ["input", "input", "const", "mul", "exp", "mul", "store"]
    assert [n.op for n in k_strict.compile(x, out, machine="teach").traced.nodes].count("mul") == 2
    with pytest.raises(pypto.UnsupportedError) as info:
        k_strict.compile(x, out, machine="a2a3")
    e = info.value
    assert e.loc.line == line_of(k_strict.fn, "# no a2a3") and "'a5', 'teach'" in str(e.expected)
    assert "'a2a3'" in e.message
    with pytest.raises(pypto.PyptoError, match="not callable"):
        target_specific({"a2a3": 3})
    with pytest.raises(pypto.PyptoError, match="inside a @pypto.jit kernel"):
        exp_for(x)

    @register_op                                      # a registered op keeps its machine
    def my_exp(x):
        return exp_for(x)

    @pypto.jit
    def k_op(x, out):
        out[:] = my_exp(x)
    for m, n_mul in (("a2a3", 0), ("a5", 2)):
        ck = k_op.compile(x, out, machine=m)
        assert [n.op for n in ck.tensor_graph.nodes].count("mul") == n_mul
        assert ck.traced.nodes[2].attrs["target"] == m


# ---------------------------------------------------------------------------------------
# pypto build

KERNELS = textwrap.dedent('''
    import pypto
    from pypto.frontend.custom import register_op

    @register_op
    def my_quantize(x, bits: int = 8):
        scale = 2**bits - 1
        return pypto.round(x * scale) / scale

    @pypto.jit
    def softmax(x, out, *, TM: int = 16):
        pypto.set_vec_tile_shapes(TM, 256)
        out[:] = pypto.softmax(x)
''')


@pytest.fixture
def kfile(tmp_path):
    path = tmp_path / "kernels.py"
    path.write_text(KERNELS)
    return path


def _built(out_dir, name):
    files = {ext: out_dir / f"{name}{ext}" for ext in (".pto", ".html", ".trace.json")}
    assert all(f.is_file() for f in files.values()), sorted(os.listdir(out_dir))
    program = Program.parse(files[".pto"].read_text())
    trace = json.loads(files[".trace.json"].read_text())
    assert trace and name in files[".html"].read_text()
    return program


def test_build_a_registered_op_and_a_kernel(kfile, tmp_path, capsys):
    out_dir = tmp_path / "out"
    rc = main(["build", f"{kfile}:my_quantize", "--target", "a5", "--arg", "x=64x256:fp32", "--const", "bits=4",
               "-o", str(out_dir)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    program = _built(out_dir, "my_quantize")
    assert ".gm out fp32[64,256] output" in program.text()
    assert "built my_quantize for a5" in printed.out
    assert printed.out.count("wrote ") == 3 and str(out_dir / "my_quantize.trace.json") in printed.out
    rc = main(["build", f"{kfile}:softmax", "-t", "teach", "--arg", "x=64x256", "--arg", "out=64x256",
               "--const", "TM=8", "-o", str(out_dir), "--check"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "check OK" in printed.out
    _built(out_dir, "softmax")
    # mistakes of the command line
    assert main(["build", str(kfile), "--arg", "x=64x256", "-o", str(out_dir)]) == 2
    assert "name one" in capsys.readouterr().err
    assert main(["build", f"{kfile}:my_quantize", "--arg", "y=64x256", "-o", str(out_dir)]) == 2
    assert "has no parameter 'y'" in capsys.readouterr().err


def test_build_through_python_dash_m(kfile, tmp_path):
    out_dir = tmp_path / "sub"
    proc = subprocess.run([sys.executable, "-m", "pypto", "build", f"{kfile.name}:my_quantize", "--target", "a2a3",
                           "--arg", "x=32x256:fp16", "-o", str(out_dir)], cwd=kfile.parent, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout
    _built(out_dir, "my_quantize")
