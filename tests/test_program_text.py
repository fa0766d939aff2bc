"""The PTO program text: print -> parse -> print is the identity, parsed programs simulate the
same, hand edits parse, and malformed text raises PTOSyntaxError naming line, task and
instruction."""
from __future__ import annotations

import numpy as np
import pytest

import pypto
from pypto.errors import PyptoError, SourceLoc
from pypto.ir.exec import TileRef
from pypto.ir.gm import GMRef
from pypto.ir.program import Program
from pypto.ir.pto_text import PTOSyntaxError
from pypto.target.machine import A2A3
from pypto.sim.run import simulate

# ---------------------------------------------------------------------------------------
# kernels


@pypto.jit
def softmax(x, out, *, TM: int = 32, TN: int = 128):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = pypto.softmax(x)


@pypto.jit
def layernorm(x, w, b, out):
    pypto.set_vec_tile_shapes(16, 128)
    out[:] = pypto.layernorm(x, w, b, eps=1e-5)


@pypto.jit
def mm_at(a, b, out):
    pypto.set_cube_tile_shapes([32, 32], [32, 64], [32, 32])
    out[:] = pypto.matmul(a, b, a_trans=True)


@pypto.jit
def bmm(a, b, out):
    pypto.set_cube_tile_shapes([32, 32], [32, 32], [32, 32])
    out[:] = pypto.matmul(a, b)


@pypto.jit
def cast_scale(x, out):
    out[:] = pypto.cast(x * 0.1 - 3.5e-8, pypto.DT_FP16)


@pypto.jit
def views(a, o1, o2, o3):
    o1[:] = pypto.transpose(a * 2.0, 0, 1)
    o2[:] = pypto.reshape(a + 1.0, [300, 100])
    o3[:] = a[:, 0:128] - 1.5


@pypto.jit
def transpose3d(a, o1):
    o1[:] = pypto.transpose(a, 0, 2) + 1.0


@pypto.jit
def column_to_row(x, out):
    out[:] = pypto.transpose(pypto.exp(x), -2, -1)      # a [3,1] workspace read back as [1,3]


@pypto.jit
def exp_add(x, out):
    out[:] = pypto.exp(x) + 1.0


@pypto.jit
def scatter_add(x, idx, src, out):
    out[:] = pypto.scatter_add(x, 1, idx, src)      # MSCATTER atomic=ADD


def _cases(rng):
    f32, f16 = np.float32, np.float16
    x = rng.standard_normal((100, 300)).astype(f32)
    w = rng.standard_normal((300,)).astype(f32)
    b = rng.standard_normal((300,)).astype(f32)
    a_t = rng.standard_normal((130, 100)).astype(f16)           # a_trans: A = a.T is [100, 130]
    b_m = rng.standard_normal((130, 70)).astype(f16)
    ba = rng.standard_normal((3, 40, 50)).astype(f16)
    bb = rng.standard_normal((3, 50, 60)).astype(f16)
    x3 = rng.standard_normal((4, 30, 40)).astype(f32)
    return {
        "softmax": (softmax, [x, np.zeros_like(x)]),
        "layernorm": (layernorm, [x, w, b, np.zeros_like(x)]),
        "matmul_tails_a_trans": (mm_at, [a_t, b_m, np.zeros((100, 70), f16)]),
        "batched_matmul": (bmm, [ba, bb, np.zeros((3, 40, 60), f16)]),
        "cast": (cast_scale, [x, np.zeros(x.shape, f16)]),
        "transposed_reshaped_views": (views, [x, np.zeros((300, 100), f32), np.zeros((300, 100), f32),
                                              np.zeros((100, 128), f32)]),
        "transpose3d": (transpose3d, [x3, np.zeros((40, 30, 4), f32)]),
        "column_to_row": (column_to_row, [x[:3, :1].copy(), np.zeros((1, 3), f32)]),
        "scatter_add": (scatter_add, [x[:4, :8].copy(), np.array([[0, 1, 1, 7]] * 4, np.int32),
                                      x[4:8, :4].copy(), np.zeros((4, 8), f32)]),
    }


CASES = ["softmax", "layernorm", "matmul_tails_a_trans", "batched_matmul", "cast", "transposed_reshaped_views",
         "transpose3d", "column_to_row", "scatter_add"]


def _compile(name, rng, machine="teach"):
    k, args = _cases(rng)[name]
    ck = k.compile(*args, machine=machine)
    arrays = {p.name: a for p, a in zip(ck.params, args)}
    return ck, arrays


def _same_instr(a, b):
    assert (a.op, a.pipe, a.dst, a.srcs, a.attrs) == (b.op, b.pipe, b.dst, b.srcs, b.attrs), (a.text(), b.text())
    assert (a.loc is None) == (b.loc is None)
    if a.loc is not None:
        assert a.loc.short() == b.loc.short() and b.loc == SourceLoc(a.loc.file.rsplit("/", 1)[-1], a.loc.line)


# ---------------------------------------------------------------------------------------
# round trip


@pytest.mark.parametrize("name", CASES)
def test_print_parse_print_is_identity(name, rng):
    ck, _ = _compile(name, rng)
    p = ck.program
    text = p.text()
    q = Program.parse(text)
    assert q.text() == text
    assert Program.parse(q.text()).text() == text
    assert q.name == p.name and q.buffers == p.buffers
    assert len(q.tasks) == len(p.tasks) and len(q) == len(p)
    for tp, tq in zip(p.tasks, q.tasks):
        assert (tq.id, tq.group, tq.core_type, tq.deps, tq.level) == (tp.id, tp.group, tp.core_type, tp.deps, tp.level)
        for a, b in zip(tp.instrs, tq.instrs):
            _same_instr(a, b)


def test_round_trip_covers_both_gm_forms_and_all_operand_kinds(rng):
    texts = {n: _compile(n, rng)[0].program.text() for n in CASES}
    assert "{off=" in texts["matmul_tails_a_trans"] and "strides=[1, 100]" in texts["matmul_tails_a_trans"]
    assert "{off=" in texts["batched_matmul"]                    # 2-D windows of 3-D buffers
    assert "{off=" in texts["transposed_reshaped_views"]          # the transposed store
    assert "GM:x[0:" in texts["softmax"]                           # short form
    assert "]{4,128}, GM:x[96:100," in texts["softmax"]            # a tail tile's valid shape
    assert "to=fp16" in texts["cast"] and "0.1" in texts["cast"] and "3.5e-08" in texts["cast"]
    assert "offsets=(" in texts["matmul_tails_a_trans"] and "TMATMUL_ACC" in texts["matmul_tails_a_trans"]
    assert "dim=1" in texts["softmax"] and "TROWEXPAND" in texts["layernorm"]
    assert "TSTORE" in texts["batched_matmul"]
    # a window over the elements of a box but of another shape (a [3,1] buffer read as [1,3]):
    # the box form would read back as the box's shape
    assert "GM:ws0{off=0,shape=[1, 3],strides=[1, 1]}" in texts["column_to_row"]
    assert "dim=1, atomic=ADD" in texts["scatter_add"]          # (read back as a dtype before)


def test_an_unknown_atomic_mode_is_named(rng):
    text = _compile("scatter_add", rng)[0].program.text().replace("atomic=ADD", "atomic=SUB")
    with pytest.raises(PTOSyntaxError) as e:
        Program.parse(text)
    assert "unknown atomic mode" in str(e.value) and "atomic=ADD" in str(e.value) and "atomic=SUB" in str(e.value)


@pytest.mark.parametrize("name", CASES)
def test_parsed_program_simulates_the_same(name, rng):
    ck, arrays = _compile(name, rng)
    q = Program.parse(ck.program.text(), machine="teach")
    r1 = simulate(ck.program, arrays, machine="teach", mode="full")
    r2 = simulate(q, arrays, machine="teach", mode="full")
    assert r1.cycles == r2.cycles > 0
    assert set(r1.outputs) == set(r2.outputs)
    for k in r1.outputs:
        np.testing.assert_array_equal(r1.outputs[k], r2.outputs[k])
    key = lambda e: (e.core, e.pipe, e.op, e.start, e.end, e.task, e.index, e.line)
    assert [key(e) for e in r1.trace] == [key(e) for e in r2.trace]


def test_parsed_program_recovers_pipes(rng):
    ck, _ = _compile("matmul_tails_a_trans", rng)
    q = Program.parse(ck.program.text())
    pipes = {}
    for t in q.tasks:
        for i in t.instrs:
            pipes.setdefault(i.op, set()).add(i.pipe)
    assert pipes["TLOAD"] == {"MTE2"} and pipes["TEXTRACT"] == {"MTE1"}
    assert pipes["TMATMUL"] == pipes["TMATMUL_ACC"] == {"M"}
    assert pipes["TSTORE"] == {"FIX"}                            # from L0C
    ck2, _ = _compile("softmax", rng)
    q2 = Program.parse(ck2.program.text())
    stores = {i.pipe for t in q2.tasks for i in t.instrs if i.op == "TSTORE"}
    assert stores == {"MTE3"}                                     # from UB
    for t in q2.tasks:
        for i in t.instrs:
            if i.op == "SET_FLAG":
                assert i.pipe == i.attrs["src"]
            if i.op == "WAIT_FLAG":
                assert i.pipe == i.attrs["dst"]


def test_verify_accepts_compiled_programs(rng):
    for n in CASES:
        ck, _ = _compile(n, rng)
        ck.program.verify()
        ck.program.verify("teach")


def test_program_without_header_comment_is_named_program():
    text = ".gm x fp32[8,64] input\n.task 0 AIV group=0 deps=[]\n  TLOAD UB[0x0]:fp32[8,64], GM:x[0:8,0:64]\n"
    p = Program.parse(text)
    assert p.name == "program" and len(p) == 1 and p.tasks[0].instrs[0].loc is None
    assert p.tasks[0].instrs[0].srcs[0] == GMRef(p.buffer("x"), 0, (8, 64), (64, 1))


def test_extra_whitespace_decimal_addresses_and_comments_parse():
    text = """// a hand-written program
.gm x  fp32[8, 64] input
.gm y fp32[8,64] output

.task 0 AIV group=0 deps=[]
   TLOAD   UB[0]:fp32[8, 64] ,  GM:x[0:8, 0:64]   ; hand.py:3
   SET_FLAG MTE2->V , EVENT_ID0
   WAIT_FLAG MTE2 -> V, EVENT_ID0
   TMULS UB[4096]:fp32[8,64], UB[0x0]:fp32[8,64], -2   ; just a note
   SET_FLAG V -> MTE3, EVENT_ID0
   WAIT_FLAG V -> MTE3, EVENT_ID0
   TSTORE GM:y{off=0,shape=[8,64],strides=[64,1]}, UB[0x1000]:fp32[8,64]
"""
    p = Program.parse(text, machine="a2a3")
    ins = p.tasks[0].instrs
    assert ins[0].loc == SourceLoc("hand.py", 3) and ins[3].loc is None
    assert ins[3].srcs[1] == -2 and ins[3].dst == TileRef("UB", 4096, pypto.DT_FP32, (8, 64), (8, 64))
    x = np.arange(512, dtype=np.float32).reshape(8, 64)
    r = simulate(p, {"x": x}, machine="teach", mode="full")
    np.testing.assert_array_equal(r.outputs["y"], x * -2)
    # the canonical print parses to the same program
    assert Program.parse(p.text()).text() == p.text()
    assert "GM:y[0:8,0:64]" in p.text()                           # natural window: short form


# ---------------------------------------------------------------------------------------
# hand edits (the race checker edits programs this way)


def _exp_add_text(rng):
    x = rng.standard_normal((8, 64)).astype(np.float32)
    ck = exp_add.compile(x, np.zeros_like(x), machine="teach")
    return ck, x, ck.program.text()


def test_moving_a_tile_everywhere_keeps_the_result(rng):
    ck, x, text = _exp_add_text(rng)
    assert "UB[0x0]:" in text
    edited = text.replace("UB[0x0]:", "UB[0x10000]:")
    q = Program.parse(edited, machine="teach")
    assert q.text() == edited
    r0 = simulate(ck.program, {"x": x}, machine="teach")
    r1 = simulate(q, {"x": x}, machine="teach")
    np.testing.assert_array_equal(r1.outputs["out"], r0.outputs["out"])
    assert r1.cycles == r0.cycles


def test_changing_one_tload_address_parses_and_changes_the_data(rng):
    ck, x, text = _exp_add_text(rng)
    lines = text.splitlines()
    (k,) = [i for i, l in enumerate(lines) if l.lstrip().startswith("TLOAD")]
    lines[k] = lines[k].replace("UB[0x0]:", "UB[0x8000]:")
    edited = "\n".join(lines)
    q = Program.parse(edited)
    assert q.text() == edited
    assert q.tasks[0].instrs[0].dst.addr == 0x8000
    r = simulate(q, {"x": x}, machine="teach")
    # TEXP now reads a tile nobody wrote: the output is exp(0) + 1 = 2, not exp(x) + 1
    np.testing.assert_array_equal(r.outputs["out"], np.full_like(x, 2.0))


def test_removing_a_wait_flag_parses(rng):
    ck, x, text = _exp_add_text(rng)
    lines = text.splitlines()
    waits = [i for i, l in enumerate(lines) if l.lstrip().startswith("WAIT_FLAG")]
    assert len(waits) == 2
    del lines[waits[0]]
    edited = "\n".join(lines)
    q = Program.parse(edited)
    assert len(q) == len(ck.program) - 1
    assert [i.op for i in q.tasks[0].instrs].count("WAIT_FLAG") == 1
    # the header's instruction count is recomputed; every other line prints as edited
    out = q.text().splitlines()
    assert out[0] == lines[0].replace(f"{len(ck.program)} instructions", f"{len(q)} instructions")
    assert out[1:] == lines[1:]


# ---------------------------------------------------------------------------------------
# errors: each names the line, the task, the instruction index and the kernel line


SMALL = """// PTO program k: 2 tasks, 9 instructions
.gm x fp32[8,64] input
.gm out fp32[8,64] output
.task 0 AIV group=0 deps=[]
  TLOAD              UB[0x0]:fp32[8,64], GM:x[0:8,0:64]  ; kern.py:5
  SET_FLAG           MTE2 -> V, EVENT_ID0
  WAIT_FLAG          MTE2 -> V, EVENT_ID0
  TEXP               UB[0x1000]:fp32[8,64], UB[0x0]:fp32[8,64]  ; kern.py:5
  TADDS              UB[0x0]:fp32[8,64], UB[0x1000]:fp32[8,64], 1.0  ; kern.py:6
  SET_FLAG           V -> MTE3, EVENT_ID0
  WAIT_FLAG          V -> MTE3, EVENT_ID0
  TSTORE             GM:out[0:8,0:64], UB[0x0]:fp32[8,64]  ; kern.py:6
.task 1 AIC group=1 deps=[0]
  TEXTRACT           L0A[0x0]:fp16[32,32], L1[0x0]:fp16[32,64], offsets=(0,32)  ; kern.py:9
  TMATMUL            L0C[0x0]:fp32[32,32], L0A[0x0]:fp16[32,32], L0B[0x0]:fp16[32,32]  ; kern.py:9
"""


def test_small_program_is_valid():
    p = Program.parse(SMALL, machine="a2a3")
    assert p.text() == SMALL.replace("9 instructions", "10 instructions").rstrip("\n")


def _line_no(text, needle):
    return next(i for i, l in enumerate(text.splitlines(), 1) if needle in l)


def _bad(old, new, *, machine=None, text=SMALL):
    assert old in text
    edited = text.replace(old, new, 1)
    with pytest.raises(PTOSyntaxError) as e:
        Program.parse(edited, machine=machine)
    err = e.value
    assert isinstance(err, PyptoError)
    return err, str(err), _line_no(edited, new.splitlines()[0]) if new.strip() else None


@pytest.mark.parametrize("old, new, task, index, kernel, words", [
    ("TEXP      ", "TEXQ      ", 0, 3, "kern.py:5", ["unknown instruction 'TEXQ'", "TEXP"]),
    ("TEXP               UB[0x1000]", "TEXP               L1[0x1000]", 0, 3, "kern.py:5",
     ["wrong operands for TEXP", "UB", "L1 <- UB"]),
    ("L0C[0x0]:fp32[32,32], L0A[0x0]:fp16[32,32], L0B[0x0]", "L0C[0x0]:fp32[32,32], L0B[0x0]:fp16[32,32], L0A[0x0]",
     1, 1, "kern.py:9", ["matmul operands must be L0A x L0B -> L0C", "L0C <- L0B, L0A"]),
    ("TMATMUL            L0C[0x0]", "TMATMUL            L1[0x0]", 1, 1, "kern.py:9", ["L0C", "L1 <- L0A, L0B"]),
    ("TEXP               UB[0x1000]", "TEXP               UB[0x1010]", 0, 3, "kern.py:5",
     ["32-byte aligned", "0x1010", "multiple of 32"]),
    ("GM:x[0:8,0:64]", "GM:y[0:8,0:64]", 0, 0, "kern.py:5", ["unknown GM buffer 'y'", "x, out"]),
    ("GM:x[0:8,0:64]", "GM:x[0:8,0:65]", 0, 0, "kern.py:5", ["outside buffer 'x'", "<= 64"]),
    ("GM:x[0:8,0:64]", "GM:x{off=10,shape=[8, 64],strides=[64, 1]}", 0, 0, "kern.py:5",
     ["GM window outside buffer 'x'", "[0, 512)", "[10, 522)"]),
    ("GM:x[0:8,0:64]", "GM:x[0:8;0:64]", 0, 0, "kern.py:5", ["bad GM range", "0:8;0:64"]),
    ("UB[0x1000]:fp32[8,64], UB[0x0]", "UB[0x1000]fp32[8,64], UB[0x0]", 0, 3, "kern.py:5", ["bad tile operand"]),
    ("UB[0x1000]:fp32[8,64], UB[0x0]", "UB[0x1000]:fp64[8,64], UB[0x0]", 0, 3, "kern.py:5", ["unknown dtype 'fp64'"]),
    ("UB[0x1000]:fp32[8,64], UB[0x0]", "UB[0x1000]:fp32[8,64]{9,64}, UB[0x0]", 0, 3, "kern.py:5",
     ["valid shape does not fit"]),
    ("UB[0x1000]:fp32[8,64], UB[0x0]", "XB[0x1000]:fp32[8,64], UB[0x0]", 0, 3, "kern.py:5", ["unknown on-chip space 'XB'"]),
    ("TEXTRACT           L0A[0x0]:fp16[32,32], L1[0x0]", "TEXTRACT           L0A[0x0]:fp16[32,32], UB[0x0]", 1, 0,
     "kern.py:9", ["TEXTRACT moves L1 -> L0A/L0B"]),
    ("offsets=(0,32)", "offsets=(0,48)", 1, 0, "kern.py:9", ["reads beyond its L1 tile"]),
    ("offsets=(0,32)", "offset=(0,32)", 1, 0, "kern.py:9", ["unknown attribute 'offset'"]),
    ("1.0  ; kern.py:6", "UB[0x0]:fp32[8,64]  ; kern.py:6", 0, 4, "kern.py:6",
     ["wrong operands for TADDS", "UB <- UB, scalar"]),
    ("TLOAD              UB[0x0]", "TLOAD              L1[0x0]", 0, 0, "kern.py:5", ["an AIV core has no L1"]),
])
def test_malformed_instruction(old, new, task, index, kernel, words):
    err, msg, line = _bad(old, new)
    assert (err.line, err.task, err.index) == (line, task, index)
    assert msg.startswith(f"line {line} (task {task}, instruction {index}")
    assert f"kernel {kernel}" in msg
    assert err.kernel_loc == SourceLoc(kernel.split(":")[0], int(kernel.split(":")[1]))
    assert "expected:" in msg and "got:" in msg
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize("old, new, task, index, words", [
    ("SET_FLAG           MTE2 -> V, EVENT_ID0", "SET_FLAG           MTE2 -> V, EVENT_ID9", 0, 1,
     ["event id out of range", "EVENT_ID0..EVENT_ID7"]),
    ("SET_FLAG           MTE2 -> V, EVENT_ID0", "SET_FLAG           MTE1 -> V, EVENT_ID0", 0, 1,
     ["pipe MTE1 does not exist on an AIV core"]),
    ("SET_FLAG           MTE2 -> V, EVENT_ID0", "SET_FLAG           MTE2 => V, EVENT_ID0", 0, 1,
     ["bad SET_FLAG operands", "SRC_PIPE -> DST_PIPE"]),
    ("WAIT_FLAG          MTE2 -> V, EVENT_ID0", "WAIT_FLAG          V -> V, EVENT_ID0", 0, 2, ["two different pipes"]),
])
def test_malformed_flags(old, new, task, index, words):
    err, msg, line = _bad(old, new)
    assert (err.line, err.task, err.index) == (line, task, index)
    assert msg.startswith(f"line {line} (task {task}, instruction {index}")
    for w in words:
        assert w in msg


def test_tile_beyond_capacity_depends_on_the_machine():
    old, new = "TEXP               UB[0x1000]", "TEXP               UB[0x2ff00]"
    edited = SMALL.replace(old, new)
    Program.parse(edited)                                    # no machine: no capacity check
    Program.parse(edited, machine="a5")                      # 256 KiB UB: fits
    err, msg, line = _bad(old, new, machine="a2a3")          # 192 KiB: 0x2ff00 + 2048 > 196608
    assert (err.line, err.task, err.index) == (8, 0, 3) == (line, 0, 3)
    assert "ends beyond UB" in msg and "196608" in msg and "198400" in msg
    with pytest.raises(PTOSyntaxError, match="ends beyond UB"):
        Program.parse(edited, machine=A2A3.replace(name="x", ub_kib=128))
    # an in-memory program is checked the same way by verify
    with pytest.raises(PTOSyntaxError) as e:
        Program.parse(edited).verify("a2a3")
    assert e.value.task == 0 and e.value.index == 3 and e.value.line is None
    assert str(e.value).startswith("task 0, instruction 3: TEXP, kernel kern.py:5: tile UB[0x2ff00]")


@pytest.mark.parametrize("old, new, line, task, words", [
    (".task 0 AIV group=0 deps=[]\n", "", 4, None, ["outside a task (missing .task header)"]),
    (".task 0 AIV group=0 deps=[]", ".task 0 AIX group=0 deps=[]", 4, 0, ["unknown core type 'AIX'"]),
    (".task 0 AIV group=0 deps=[]", ".task 0 AIV group=0 deps=[1]", 4, 0, ["depends on a later or unknown task"]),
    (".task 1 AIC group=1 deps=[0]", ".task 2 AIC group=1 deps=[0]", 13, 2, ["task ids must count", ".task 1"]),
    (".task 0 AIV group=0 deps=[]", ".task zero AIV", 4, None, ["bad .task line"]),
    (".gm x fp32[8,64] input", ".gm x fp32[8,64] scratch", 2, None, ["unknown role 'scratch'"]),
    (".gm x fp32[8,64] input", ".gm x fp99[8,64] input", 2, None, ["unknown dtype 'fp99'"]),
    (".gm out fp32[8,64] output", ".gm x fp32[8,64] output", 3, None, ["declared twice"]),
    (".gm x fp32[8,64] input", ".gm x", 2, None, ["bad .gm line"]),
    (".gm x fp32[8,64] input", ".buffer x", 2, None, ["unknown directive '.buffer'"]),
])
def test_malformed_structure(old, new, line, task, words):
    edited = SMALL.replace(old, new, 1)
    with pytest.raises(PTOSyntaxError) as e:
        Program.parse(edited)
    err, msg = e.value, str(e.value)
    assert err.line == line and err.task == task and err.index is None
    assert msg.startswith(f"line {line}")
    for w in words:
        assert w in msg


def test_truncated_text_is_rejected(rng):
    ck, _ = _compile("softmax", rng)
    with pytest.raises(PTOSyntaxError, match="truncated"):
        Program.parse(ck.program.text(max_tasks=1))


def test_error_shows_the_kernel_source_line(rng):
    """When the kernel's file can be found, the error quotes its line."""
    x = np.ones((8, 64), np.float32)
    ck = exp_add.compile(x, np.zeros_like(x), machine="teach")
    text = ck.program.text()
    loc = ck.program.tasks[0].instrs[-1].loc
    # give the parser the full path so the source is found wherever the tests run from
    text = text.replace(f"; {loc.short()}", f"; {loc.file}:{loc.line}")
    bad = text.replace("TEXP               UB", "TEXP               L0A", 1)
    with pytest.raises(PTOSyntaxError) as e:
        Program.parse(bad)
    assert "out[:] = pypto.exp(x) + 1.0" in str(e.value)


def test_pipe_barrier_round_trip():
    text = SMALL.replace("  TSTORE ", "  PIPE_BARRIER       ALL\n  PIPE_BARRIER       MTE3\n  TSTORE ", 1)
    p = Program.parse(text)
    bars = [i for i in p.tasks[0].instrs if i.op == "PIPE_BARRIER"]
    assert [b.pipe for b in bars] == ["S", "MTE3"]
    assert p.text() == text.replace("9 instructions", "12 instructions").rstrip("\n")
    with pytest.raises(PTOSyntaxError, match="pipe M does not exist on an AIV core"):
        Program.parse(SMALL.replace("  TSTORE ", "  PIPE_BARRIER       M\n  TSTORE ", 1))


@pypto.jit
def _scale(x, out, *, TM: int = 32, TN: int = 1024):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = x * 2.0


def test_a5_program_does_not_fit_a2a3(rng):
    """Tiles allocated for a5's 256 KiB UB: fine for a5, too big for a2a3's 192 KiB."""
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    ck = _scale.compile(x, np.zeros_like(x), machine="a5")
    text = ck.program.text()
    assert Program.parse(text, machine="a5").text() == text
    with pytest.raises(PTOSyntaxError) as e:
        Program.parse(text, machine="a2a3")
    assert "ends beyond UB" in str(e.value) and "196608" in str(e.value)
    assert e.value.line is not None and e.value.task is not None and e.value.index is not None
    with pytest.raises(PTOSyntaxError):
        ck.program.verify("a2a3")
    ck.program.verify("a5")


def test_the_operand_splitters_agree_with_a_walk_over_the_text():
    """`split_comment`, `_split_top` and `_ints` take their usual inputs with a regular expression;
    on any text they give what walking it character by character gives, errors included."""
    import random
    import re
    from pypto.ir import pto_text as P

    def split_top(body):
        out, depth, cur = [], 0, []
        for ch in body:
            depth += ch in "[{("
            depth -= ch in "]})"
            if depth < 0:
                return "error"
            if ch == "," and depth == 0:
                out.append("".join(cur).strip())
                cur = []
            else:
                cur.append(ch)
        last = "".join(cur).strip()
        return "error" if depth else out + [last] if last or out else out

    def split_comment(line):
        depth = 0
        for i, ch in enumerate(line):
            depth += (ch in "[{(") - (ch in "]})")
            if ch == ";" and depth == 0:
                return line[:i], line[i + 1:].strip()
        return line, ""

    def ints(text, empty, negative):
        parts = [p.strip() for p in text.split(",")] if text.strip() else []
        if (not parts and not empty) or not all(re.fullmatch(r"-?\d+" if negative else r"\d+", p) for p in parts):
            return "error"
        return tuple(map(int, parts))

    def error(f, *a, **k):
        try:
            return f(*a, **k)
        except P._Problem:
            return "error"

    rng = random.Random(7)
    for _ in range(20000):
        s = "".join(rng.choice("ab1 ,;[](){}:x") for _ in range(rng.randint(0, 14)))
        assert error(P._split_top, s) == split_top(s), s
        assert P.split_comment(s) == split_comment(s), s
        t = "".join(rng.choice("12 ,-\u0663x\t") for _ in range(rng.randint(0, 10)))
        for empty in (False, True):
            for negative in (False, True):
                assert error(P._ints, t, "x", allow_empty=empty, allow_negative=negative) == \
                    ints(t, empty, negative), (t, empty, negative)
