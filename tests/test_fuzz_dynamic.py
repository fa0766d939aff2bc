"""The fuzzer's dynamic stage (tests/fuzz/runner.py, `Runner(dynamic_every=K)`).

A case that ended correct is compiled again with pypto.DYNAMIC first dims for the parameters
whose first dim is that of its first output, and simulated at a few sizes on its arrays' rows
repeated to that size (its rows in order, then rows drawn at random: `worker.row_map`).  Here:
a row-parallel kernel compiles and is right at every size, a kernel that reduces over the rows
is refused at its line, and a wrong dynamic output (a result of the worker edited on its way
back) is caught, so that the check cannot pass vacuously.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from fuzz.gen import Case, InputSpec, Node, Store, from_seed
from fuzz.runner import Runner, dynamic_plan, report, rows_of
from fuzz.worker import row_map

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# seeds whose kernels compile dynamically and run right (found with the dynamic stage on every
# case, of the generator as it is: a new kind of step changes the kernel of a seed): a reduction
# over the last dim (9), a 1-D kernel (15), layernorm and rms_norm (425), layernorm and softmax
# (494), a batched matmul by a static weight (664)
ROW_PARALLEL_SEEDS = (9, 15, 425, 494, 664)


@pytest.fixture(scope="module")
def runner():
    r = Runner(timeout=60.0, dynamic_every=1)
    yield r
    r.close()


def _case(lines, nodes, inputs, stores, data_seed=3) -> Case:
    for st in stores:
        lines = lines + st.lines
    return Case("teach", inputs, nodes, lines, stores, data_seed, label="hand-written")


def softmax_case(rows: int = 40) -> Case:
    """out0 = exp(x0) / sum(exp(x0), -1) @ x1: rows apart, a static weight x1 (32 rows)."""
    f = "fp32"
    inputs = [InputSpec("x0", (rows, 64), f, -2.0, 2.0), InputSpec("x1", (64, 16), f, -1.0, 1.0)]
    nodes = [Node(0, "input", [], {"param": "x0"}, (rows, 64), f, -2.0, 2.0, "x0"),
             Node(1, "input", [], {"param": "x1"}, (64, 16), f, -1.0, 1.0, "x1"),
             Node(2, "un", [0], {"fn": "exp"}, (rows, 64), f, 0.1, 7.4, "pypto.exp(x0)"),
             Node(3, "red", [2], {"fn": "sum", "dim": -1, "keepdim": True}, (rows, 1), f, 6.0, 480.0,
                  "pypto.sum(v2, dim=-1, keepdim=True)"),
             Node(4, "bin", [2, 3], {"fn": "div"}, (rows, 64), f, 0.0, 1.0, "v2 / v3"),
             Node(5, "matmul", [4, 1], {"a_trans": False, "b_trans": False, "k": 64}, (rows, 16), f, -64.0, 64.0,
                  "pypto.matmul(v4, x1)")]
    lines = [f"{n.name} = {n.text}" for n in nodes[2:]]
    stores = [Store("out0", 5, "full", (rows, 16), f, (0, 0), lines=["out0[:] = v5"])]
    return _case(lines, nodes, inputs, stores)


def rows_sum_case(rows: int = 40) -> Case:
    """out0 = x0 - sum(x0, dim=0): every row depends on every other row (refused)."""
    f = "fp32"
    inputs = [InputSpec("x0", (rows, 64), f, -2.0, 2.0)]
    nodes = [Node(0, "input", [], {"param": "x0"}, (rows, 64), f, -2.0, 2.0, "x0"),
             Node(1, "red", [0], {"fn": "sum", "dim": 0, "keepdim": True}, (1, 64), f, -80.0, 80.0,
                  "pypto.sum(x0, dim=0, keepdim=True)"),
             Node(2, "bin", [0, 1], {"fn": "sub"}, (rows, 64), f, -82.0, 82.0, "x0 - v1")]
    lines = [f"{n.name} = {n.text}" for n in nodes[1:]]
    stores = [Store("out0", 2, "full", (rows, 64), f, (0, 0), lines=["out0[:] = v2"])]
    return _case(lines, nodes, inputs, stores)


def test_plan_takes_the_parameters_with_the_rows_of_the_first_output():
    plan = dynamic_plan(softmax_case())
    assert plan == {"params": ["x0", "out0"], "rows": 40, "big": True, "seed": 3}
    assert dynamic_plan(softmax_case(rows=1)) is None                  # one row: nothing to vary
    big = softmax_case()
    big.inputs[0].shape = (40, 4096)                                   # 2048 rows of it: 32 MiB
    assert dynamic_plan(big) is None
    every4 = Runner(dynamic_every=4)
    case = softmax_case()
    try:
        picked = set()
        for seed in range(8):
            case.data_seed = seed
            if every4.wants_dynamic(case):
                picked.add(seed)
        assert picked == {0, 4}
        assert Runner(dynamic_every=0).wants_dynamic(case) is None
    finally:
        every4.close()


def test_row_parallel_kernel_is_right_at_every_size(runner):
    case = softmax_case()
    o = runner.run(case)
    assert o.category == "correct" and o.dynamic == "correct", o.line()
    assert not o.builtin, o.line()
    # (its matmul by a static weight gives the kernel a chunk of 8192 rows: compiler.dynamic.chunk_for)
    assert o.extra["dynamic"]["sizes"] == [40, 1, 43, 8192 + 43]


@pytest.mark.parametrize("seed", ROW_PARALLEL_SEEDS)
def test_seeds_compile_dynamically_and_are_right(runner, seed):
    case = from_seed(seed)
    o = runner.run(case)
    assert o.category == "correct" and o.dynamic == "correct", o.line() + "\n" + report(case, o)
    assert not o.builtin, o.line()


def test_a_reduction_over_the_rows_is_refused_at_its_line(runner):
    case = rows_sum_case()
    o = runner.run(case)
    assert o.category == "correct" and o.dynamic == "refused", o.line()
    msg = o.extra["dynamic"]["refusal"]
    line = case.source().splitlines().index("    v1 = pypto.sum(x0, dim=0, keepdim=True)") + 1
    assert f".py:{line}:" in msg and "reduces over the rows of the dynamic dim" in msg, msg


class _Edited(Runner):
    """A runner whose worker's answers to the dynamic stage pass through `edit` first."""

    def __init__(self, edit):
        super().__init__(timeout=60.0, dynamic_every=1)
        run = self.worker.run

        def edited(req, timeout):
            res = run(req, timeout)
            if req.get("dynamic") and res and not res.get("error"):
                edit(res)
            return res
        self.worker.run = edited


def _with(edit, case=None):
    case = case or softmax_case()
    r = _Edited(edit)
    try:
        return case, r.run(case)
    finally:
        r.close()


def _last_run(res):
    return res["dynamic"]["runs"][-1]


def test_a_wrong_dynamic_row_is_caught():
    """Row 45 of the call on 8192 + 43 rows (the kernel's chunk: 8192 rows, it has a matmul) (one of the case's rows drawn at random) made wrong."""
    def edit(res):
        out = _last_run(res)["outputs"]["out0"]
        out[45] = out[45] + 0.5
    case, o = _with(edit)
    assert o.category == "wrong" and o.dynamic == "wrong" and o.stage == "dynamic", o.line()
    assert o.extra["what"] == "dynamic" and "N=8235" in o.detail and "[45, " in o.detail, o.detail
    assert o.builtin == "missed"                   # res.ok was True on the numbers made wrong
    assert o.signature.startswith("wrong||dynamic|dynamic")


def test_a_dynamic_output_of_the_case_size_is_checked_too():
    def edit(res):
        run = res["dynamic"]["runs"][0]
        assert run["n"] == 40
        run["outputs"]["out0"] = run["outputs"]["out0"][:39]
    _, o = _with(edit)
    assert o.category == "wrong" and "N=40" in o.detail and "shape" in o.detail, o.detail


def test_the_program_of_a_call_differing_is_caught():
    def edit(res):
        _last_run(res)["program_differs"] = ["out0"]
    _, o = _with(edit)
    assert o.category == "wrong" and o.extra["what"] == "dynamic program of a call differs", o.line()
    assert "program_for(8235)" in o.detail


def test_res_ok_false_on_right_dynamic_outputs_is_a_false_alarm():
    def edit(res):
        _last_run(res)["ok"] = False
    _, o = _with(edit)
    assert o.category == "correct" and o.dynamic == "correct" and o.builtin == "false alarm", o.line()
    assert "N=8235" in o.detail


def test_a_crash_in_the_dynamic_stage_is_a_crash():
    def edit(res):
        res["error"] = {"stage": "dynamic", "type": "IndexError", "module": "builtins", "pypto": False,
                        "msg": "index 7 is out of bounds", "tb": "Traceback ...", "size": 43}
    _, o = _with(edit)
    assert o.category == "crash" and o.stage == "dynamic" and "(N=43)" in o.detail, o.line()


def test_the_repro_of_a_dynamic_failure_runs_the_dynamic_stage(tmp_path):
    def edit(res):
        out = _last_run(res)["outputs"]["out0"]
        out[45] = out[45] + 0.5
    case, o = _with(edit)
    text = report(case, o)
    assert "pypto.Tensor([pypto.DYNAMIC, 64], pypto.DT_FP32), x1, pypto.Tensor([pypto.DYNAMIC, 16]" in text
    assert "for n in [8235]:" in text
    path = tmp_path / "repro.py"
    path.write_text(text)
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=300,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("N=8235 out0"))
    assert "res.ok True" in line and "program alone identical True" in line, line


def test_a_piece_reading_rows_a_multiple_of_the_case_rows_off_is_caught():
    """16 rows in the case, 8192 + 19 in the call: the second piece's rows made those of the first
    piece (what a piece whose GM windows were not moved would compute).  Rows cycled with period
    16 would be the same there; the rows drawn at random are not."""
    def edit(res):
        run = _last_run(res)
        assert run["n"] == 8192 + 19
        out = run["outputs"]["out0"]
        out[8192:] = out[:19]
    _, o = _with(edit, softmax_case(rows=16))
    assert o.category == "wrong" and o.extra["what"] == "dynamic" and "N=8211" in o.detail, o.line()


def test_row_map_and_the_reference_rows():
    from fuzz.reference import V
    idx = row_map(2048 + 19, 16, 5)
    assert np.array_equal(idx[:16], np.arange(16)) and idx.min() >= 0 and idx.max() < 16
    assert not np.array_equal(idx[2048:2064], np.arange(16))
    assert np.array_equal(row_map(1, 16, 5), [0]) and np.array_equal(row_map(40, 16, 5), row_map(40, 16, 5))
    v = V(np.arange(6.0).reshape(3, 2), np.array([[0.0, 1.0]]))
    c = rows_of(v, np.array([0, 1, 2, 2, 0]))
    assert c.v.shape == (5, 2) and np.array_equal(c.v[3], v.v[2]) and np.array_equal(c.v[4], v.v[0])
    assert np.array_equal(c.e[:, 1], np.ones(5)) and np.array_equal(c.e[:, 0], np.zeros(5))
