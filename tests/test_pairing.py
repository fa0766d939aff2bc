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
    # the block level depends on the whole cube task; the program instead streams tile by tile:
    # after each stored tile the AIC sets a cross-core flag of both AIVs, each waits for it
    assert all(ck.levels["block"].tasks[t.id].deps == (t.pair[0],) for t in vec)
    assert all(t.deps == () for t in vec)
    assert all(sum(i.op == "CROSS_WAIT_FLAG" for i in t.instrs) == 8 for t in vec)
    assert all(sum(i.op == "CROSS_SET_FLAG" for i in t.instrs) == 16 for t in cube)
    stores = [k for k, i in enumerate(cube[0].instrs) if i.op == "TSTORE"]
    assert [cube[0].instrs[k + 1].text().split()[:4] for k in stores[:1]] == [["CROSS_SET_FLAG", "FIX", "->", "AIV0,"]]
    # the halves split the rows of the cube task's tiles: a 256 x 256 output is 16 cube tiles of
    # 64 x 64, 8 per cube task, read by 16 vector tiles of 32 x 64 each: 8 per AIV
    assert [len(ck.levels["block"].tasks[t.id].outer) for t in vec] == [8, 8, 8, 8]
    out = ck.simulate(a, b, bias, c).outputs["c"]
    np.testing.assert_allclose(out, _want(a, b, bias), rtol=1e-4, atol=1e-4)


def test_pairing_is_printed_parsed_and_shown(rng):
    ck = mm_bias_sigmoid.compile(*_inputs(rng), machine="teach")
    text = ck.program.text()
    assert ".task 2 AIV group=1 deps=[] core=0 pair=0:0" in text
    assert "CROSS_SET_FLAG     FIX -> AIV1, EVENT_ID0" in text and "CROSS_WAIT_FLAG    AIC -> MTE2, EVENT_ID0" in text
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
        assert start >= cube_start                  # dispatched once its cube task has started
        # the n-th cross-core wait ends after the n-th set for this AIV
        sets = [e for e in res.trace if e.task == t.pair[0] and e.op == "CROSS_SET_FLAG"
                and ck.program.tasks[t.pair[0]].instrs[e.index].attrs["slot"] == t.pair[1]]
        waits = [e for e in res.trace if e.task == t.id and e.op == "CROSS_WAIT_FLAG"]
        assert len(sets) == len(waits) > 0
        assert all(w.end > s.end - 1 and w.start >= s.start for s, w in zip(sets, waits))
    # with whole-task dependencies instead, an epilogue starts after its cube task ends, later
    whole = mm_bias_sigmoid.compile(a, b, bias, c, options={"cross_core_sync": False})
    res_whole = pypto.sim.simulate(whole.program, machine=whole.machine, mode="timing", engine=engine)
    for t in whole.program.tasks:
        if t.pair:
            assert res_whole.task_times[t.id][1] >= res_whole.task_times[t.pair[0]][2] + ck.machine.dispatch_cycles
    assert res.cycles < res_whole.cycles
    # the same program without pairing runs its epilogues on whichever AIV is free
    free = mm_bias_sigmoid.compile(a, b, bias, c, options={"pairing": False})
    res_free = pypto.sim.simulate(free.program, machine=free.machine, mode="timing", engine=engine)
    assert {core for core, _, _ in res_free.task_times.values()} >= {"AIV0", "AIV1", "AIV2"}


def test_a_paired_program_needs_two_aivs_per_aic(rng):
    ck = mm_bias_sigmoid.compile(*_inputs(rng), machine="teach")
    lopsided = pypto.sim.get_machine("teach").replace(n_aiv=3)
    with pytest.raises(PTOSyntaxError, match=re.escape("machine teach has no 1 AIC : 2 AIV pairs (2 AIC, 3 AIV)")):
        pypto.sim.simulate(ck.program, machine=lopsided, mode="timing")


def _without(program, op, nth):
    """The program text with the nth instruction `op` of the whole program left out."""
    lines, seen = [], 0
    for line in program.text().splitlines():
        if line.strip().startswith(op + " "):
            seen += 1
            if seen == nth:
                continue
        lines.append(line)
    return Program.parse("\n".join(lines))


@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_checked_mode_catches_a_missing_cross_core_wait_and_a_missing_set(rng, engine):
    args = _inputs(rng)
    ck = mm_bias_sigmoid.compile(*args, machine="teach")
    ok = pypto.sim.simulate(ck.program, *args, machine="teach", check=True, engine=engine)
    np.testing.assert_allclose(ok.outputs["c"], _want(*args[:3]), rtol=1e-4, atol=1e-4)
    # without its first wait, the epilogue reads the first cube tile before it is stored
    with pytest.raises(pypto.SimulationError, match=r"race between paired tasks: task 2 instruction 0 TLOAD on MTE2"
                       r".* before task 0 instruction \d+ TSTORE on FIX .*a cross-core flag is missing"):
        pypto.sim.simulate(_without(ck.program, "CROSS_WAIT_FLAG", 1), *args, machine="teach", check=True,
                           engine=engine)
    # without a set, the last wait of that AIV is never satisfied
    with pytest.raises(pypto.SimulationError, match=r"deadlock: 1 of 6 tasks cannot finish(.|\n)*\n  AIV0 task 2: "
                       r"pipe MTE2 waits for flag AIC->MTE2 event 0, which no instruction will set"):
        pypto.sim.simulate(_without(ck.program, "CROSS_SET_FLAG", 1), machine="teach", mode="timing", engine=engine)


@pypto.jit
def mm_sigmoid_untiled(a, b, c):
    pypto.set_cube_tile_shapes([64, 64], [32, 64], [64, 64])
    c[:] = pypto.sigmoid(pypto.matmul(a, b))


def test_an_epilogue_without_tile_shapes_gets_a_tile_nested_in_the_cube_tile(rng):
    from pypto.compiler.tileshape import epilogue_vec_tile
    assert epilogue_vec_tile((1024, 1024), pypto.DT_FP32, (128, 128)) == (32, 128)       # 16 KiB
    assert epilogue_vec_tile((1024, 1024), pypto.DT_FP16, (128, 256)) == (32, 256)
    assert epilogue_vec_tile((1024, 1024), pypto.DT_FP32, (64, 64)) == (32, 64)          # half a cube tile
    assert epilogue_vec_tile((100, 40), pypto.DT_FP32, (112, 48)) == (8, 40)            # rows divide mL0 / 2
    a, b, _, c = _inputs(rng)
    ck = mm_sigmoid_untiled.compile(a, b, c, machine="teach")
    vec = next(g for g in ck.tile_graph.groups if g.kind == "vector")
    assert vec.tile == (32, 64)                          # half a cube tile: one for each AIV
    assert sum(1 for t in ck.program.tasks if t.pair) == 4
    np.testing.assert_allclose(ck.simulate(a, b, c).outputs["c"], 1 / (1 + np.exp(-(a @ b))), rtol=1e-4, atol=1e-4)


@pypto.jit
def mm_two_epilogues(a, b, c, d):
    pypto.set_cube_tile_shapes([64, 64], [32, 64], [64, 64])
    pypto.set_vec_tile_shapes(32, 64)
    m = pypto.matmul(a, b)
    c[:] = pypto.sigmoid(m)
    d[:] = pypto.exp(m * 0.1)


@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_a_cube_task_pairs_with_one_epilogue_group(rng, engine):
    a, b, _, c = _inputs(rng)
    d = np.zeros_like(c)
    ck = mm_two_epilogues.compile(a, b, c, d, machine="teach")
    vector_groups = {t.group for t in ck.program.tasks if t.core_type == "AIV"}
    paired_groups = {t.group for t in ck.program.tasks if t.pair}
    assert len(vector_groups) == 2 and len(paired_groups) == 1
    res = pypto.sim.simulate(ck.program, a, b, c, d, machine="teach", check=True, engine=engine)
    np.testing.assert_allclose(res.outputs["c"], 1 / (1 + np.exp(-(a @ b))), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(res.outputs["d"], np.exp((a @ b) * 0.1), rtol=1e-4, atol=1e-4)


@pypto.jit
def overwrite_cube_rows(a, out):
    p = pypto.matmul(a, a, b_trans=True)
    out[:] = p
    out[:13] = pypto.neg(p[:13])


def test_a_vector_group_writing_over_a_cube_store_is_not_paired_and_follows_it(rng):
    """A write after the cube's write into its output needs the cube task finished: the group
    gets a task dependency, not a flag per tile (fuzz seeds 174, 215, 501 raced here)."""
    a = rng.uniform(0.25, 4, (16, 1000)).astype(np.float16)
    out = np.zeros((16, 16), np.float16)
    ck = overwrite_cube_rows.compile(a, out, machine="teach")
    assert all(t.pair is None for t in ck.program.tasks)
    vec = [t for t in ck.program.tasks if t.core_type == "AIV"]
    cube = [t for t in ck.program.tasks if t.core_type == "AIC"]
    assert vec and all(set(c.id for c in cube) <= set(t.deps) for t in vec)
    res = ck.simulate(a, out, checked=True)
    p = (a.astype(np.float64) @ a.T.astype(np.float64))
    want = np.concatenate([-p[:13], p[13:]]).astype(np.float16)
    np.testing.assert_allclose(res.outputs["out"].astype(np.float64), want, rtol=2e-3)
    assert ck.simulate(a, out).ok


def test_cross_core_flags_keep_isomorphic_tasks_isomorphic(rng):
    """Tasks of one stream shape that get their cross-core flags at the same positions share a
    shape after the pass (the passes after it and the simulator work out each shape once); the
    shapes tell apart streams whose flags went elsewhere."""
    from pypto.compiler.crosscore import cross_core_sync
    from pypto.ir.exec import stream_shape

    a, b, bias, c = _inputs(rng, m=1024, k=256, n=512)
    off = {"cross_core_sync": False, "core_assignment": False, "loops": False}
    g = mm_bias_sigmoid.compile(a, b, bias, c, options=off).levels["exec"]
    before = [stream_shape(g, t.instrs) for t in g.tasks]
    assert None not in before and len(set(before)) < len(before)
    out = cross_core_sync(g)
    after = [stream_shape(out, t.instrs) for t in out.tasks]
    assert None not in after

    def form(t):        # a stream but for its GM windows
        return [(i.op, i.pipe, i.text().split("GM:")[0] if "GM:" in i.text() else i.text()) for i in t.instrs]

    def flags_at(t):
        return [k for k, i in enumerate(t.instrs) if i.op.startswith("CROSS_")]

    for s in set(after):
        alike = [t for t, x in zip(out.tasks, after) if x == s]
        assert all(form(t) == form(alike[0]) for t in alike)
    # the same shape before and the flags at the same places: the same shape after, and only then
    for (t, s0, s1) in zip(out.tasks, before, after):
        for (u, r0, r1) in zip(out.tasks, before, after):
            assert (s1 == r1) == (s0 == r0 and flags_at(t) == flags_at(u) and
                                  [i.text() for i in t.instrs if i.op.startswith("CROSS_")]
                                  == [i.text() for i in u.instrs if i.op.startswith("CROSS_")])
    assert sum(1 for t in out.tasks if flags_at(t)) == len(out.tasks)
    assert len(set(after)) < len(after)
