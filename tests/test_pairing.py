"""Mixed cube/vector kernels: the 1 AIC : 2 AIV pairing of epilogue tasks with their cube tasks."""
import dataclasses
import re

import numpy as np
import pytest

import pypto
from pypto.compiler.partition import epilogue_pairs
from pypto.ir.exec import verify as exec_verify
from pypto.ir.program import Program
from pypto.ir.pto_text import PTOSyntaxError

T, F16, F32 = pypto.Tensor, pypto.DT_FP16, pypto.DT_FP32


@pypto.jit
def mm_bias_sigmoid(a, b, bias, c, *, VM: int = 32, VN: int = 64):
    """The bias joins the cube (TMATMUL_BIAS); the sigmoid is a vector epilogue."""
    pypto.set_cube_tile_shapes([64, 64], [32, 64], [64, 64])
    pypto.set_vec_tile_shapes(VM, VN)
    c[:] = pypto.sigmoid(pypto.matmul(a, b) + bias)


def _want(a, b, bias):
    return 1 / (1 + np.exp(-(a @ b + bias)))


@pypto.jit
def mm_only(a, b, c):
    pypto.set_cube_tile_shapes([64, 64], [32, 64], [64, 64])
    c[:] = pypto.matmul(a, b)


def _inputs(rng, m=256, k=128, n=256):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    return a, b, bias, np.zeros((m, n), np.float32)


def test_epilogue_tasks_pair_with_their_cube_task(rng):
    a, b, bias, c = _inputs(rng)
    ck = mm_bias_sigmoid.compile(a, b, bias, c, machine="teach")      # 2 AIC, 4 AIV
    tasks = ck.program.tasks
    cube = [t for t in tasks if t.core_type == "AIC"]
    vec = [t for t in tasks if t.core_type == "AIV"]
    assert len(cube) == 2 and all(t.pair is None for t in cube)
    # each cube task gets two epilogue tasks, slots 0 and 1, depending on that cube task alone
    assert sorted(t.pair for t in vec) == [(cube[0].id, 0), (cube[0].id, 1), (cube[1].id, 0), (cube[1].id, 1)]
    assert all(t.deps == (t.pair[0],) for t in vec)
    # the halves split the rows of the cube task's tiles: a 256 x 256 output is 16 cube tiles of
    # 64 x 64, 8 per cube task, read by 16 vector tiles of 32 x 64 each: 8 per AIV
    assert [len(ck.levels["block"].tasks[t.id].outer) for t in vec] == [8, 8, 8, 8]
    out = ck.simulate(a, b, bias, c).outputs["c"]
    np.testing.assert_allclose(out, _want(a, b, bias), rtol=1e-4, atol=1e-4)


def test_pairing_is_printed_parsed_and_shown(rng):
    ck = mm_bias_sigmoid.compile(*_inputs(rng), machine="teach")
    text = ck.program.text()
    assert ".task 2 AIV group=1 deps=[0] pair=0:0" in text
    assert Program.parse(text).text() == text
    assert "paired with task 0 (AIV slot 1)" in ck.levels["exec"].text()
    assert "paired with task 1 (AIV slot 0)" in ck.levels["block"].text()


@pytest.mark.parametrize("header, problem", [
    (".task 1 AIC group=1 deps=[0] pair=0:0", "only a vector (AIV) task can be paired"),
    (".task 1 AIV group=1 deps=[0] pair=1:0", "not an earlier cube (AIC) task"),
    (".task 1 AIV group=1 deps=[0] pair=0:2", "AIV slot 2 of the pair does not exist"),
])
def test_bad_pairs_are_parse_errors(header, problem):
    text = "\n".join(["// PTO program k: 2 tasks, 0 instructions", ".gm x fp32[16,16] input",
                      ".task 0 AIC group=0 deps=[]", header])
    with pytest.raises(PTOSyntaxError, match=re.escape(problem)) as e:
        Program.parse(text)
    assert e.value.line == 4 and e.value.task == 1


def test_a_bad_pair_from_a_pass_is_a_verification_error(rng):
    ck = mm_bias_sigmoid.compile(*_inputs(rng), machine="teach")
    g = ck.levels["exec"]
    bad = g.replace([dataclasses.replace(t, pair=(t.id - 1, 0)) if t.core_type == "AIV" else t for t in g.tasks])
    with pytest.raises(pypto.VerificationError, match=re.escape("task 3: paired with task 2")):
        exec_verify(bad)


def test_no_pairing_when_switched_off_or_not_an_epilogue(rng):
    args = _inputs(rng)
    off = mm_bias_sigmoid.compile(*args, machine="teach", options={"pairing": False})
    assert all(t.pair is None for t in off.program.tasks)
    # a vector tile spanning two cube tiles (64 wide) reads two cube tiles: not an epilogue pair
    wide = mm_bias_sigmoid.compile(*args, machine="teach", VN=128)
    assert all(t.pair is None for t in wide.program.tasks)
    assert epilogue_pairs(wide.levels["tile"]) == {}
    # and the values are the same either way
    want = _want(*args[:3])
    for ck in (off, wide):
        np.testing.assert_allclose(ck.simulate(*args).outputs["c"], want, rtol=1e-4, atol=1e-4)


def test_no_pairing_without_two_aivs_per_aic(rng):
    ck = mm_bias_sigmoid.compile(*_inputs(rng), machine=pypto.sim.get_machine("teach").replace(n_aiv=3))
    assert all(t.pair is None for t in ck.program.tasks)


def test_plain_matmul_has_no_pairs(rng):
    a, b, _, c = _inputs(rng)
    ck = mm_only.compile(a, b, c, machine="teach")
    assert all(t.pair is None for t in ck.program.tasks)


@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_paired_epilogues_run_on_the_aivs_of_their_aic(rng, engine):
    a, b, bias, c = _inputs(rng, m=512, k=128, n=512)
    ck = mm_bias_sigmoid.compile(a, b, bias, c)                 # a2a3: 24 AIC, 48 AIV
    res = pypto.sim.simulate(ck.program, machine=ck.machine, mode="timing", engine=engine)
    paired = [t for t in ck.program.tasks if t.pair]
    assert len(paired) == 2 * sum(t.core_type == "AIC" for t in ck.program.tasks)
    for t in paired:
        cube_core, cube_start, cube_end = res.task_times[t.pair[0]]
        core, start, _ = res.task_times[t.id]
        assert core == f"AIV{2 * int(cube_core[3:]) + t.pair[1]}"
        assert start >= cube_end + ck.machine.dispatch_cycles
    # the same program without pairing runs its epilogues on whichever AIV is free
    free = mm_bias_sigmoid.compile(a, b, bias, c, options={"pairing": False})
    res_free = pypto.sim.simulate(free.program, machine=free.machine, mode="timing", engine=engine)
    assert {core for core, _, _ in res_free.task_times.values()} >= {"AIV0", "AIV1", "AIV2"}


def test_a_paired_program_needs_two_aivs_per_aic(rng):
    ck = mm_bias_sigmoid.compile(*_inputs(rng), machine="teach")
    lopsided = pypto.sim.get_machine("teach").replace(n_aiv=3)
    with pytest.raises(PTOSyntaxError, match=re.escape("machine teach has no 1 AIC : 2 AIV pairs (2 AIC, 3 AIV)")):
        pypto.sim.simulate(ck.program, machine=lopsided, mode="timing")
