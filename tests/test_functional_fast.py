"""The functional simulator's batched plan against a plain instruction-by-instruction execution.

`oracle` below is the functional simulation as it was before the plan existed: every instruction
executed on its own, on zero-filled on-chip memory, tasks in program order.  The plan (unchecked
mode) and the reference interpreter (checked mode) must give bit-identical outputs on every kernel;
the kernels are also checked against numpy within the usual tolerance.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pypto
from pypto.ir.core import Attrs, prod
from pypto.ir.exec import SYNC_OPS, ExecTask, Instr, Loop, TileRef
from pypto.ir.gm import GMBuffer, GMRef
from pypto.ir.program import Program
from pypto.ir.tile import row_pitch
from pypto.sim import functional_plan
from pypto.sim.functional import _gm_arrays, _outputs, run_functional
from pypto.sim.functional_plan import plan_for
from pypto.target.machine import get_machine
from common import softmax

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32 = pypto.DT_FP16, pypto.DT_FP32
GELU_C = np.sqrt(2.0 / np.pi)


# --- the oracle ------------------------------------------------------------------------------

def oracle(program: Program, machine, arrays) -> dict[str, np.ndarray]:
    caps = get_machine(machine).capacities()
    onchip = {k: np.zeros(v, np.uint8) for k, v in caps.items()}
    gm = {b.name: np.ascontiguousarray(arrays[b.name], dtype=b.dtype.np_dtype).reshape(-1).copy()
          if b.name in arrays else np.zeros(prod(b.shape), b.dtype.np_dtype) for b in program.buffers}

    def view(o, valid=None):
        if isinstance(o, TileRef):
            strides, acc = [o.dtype.itemsize], row_pitch(o.shape, o.dtype)
            for s in reversed(o.shape[:-1]):
                strides.insert(0, acc)
                acc *= s
            return np.ndarray(valid or o.valid, o.dtype.np_dtype, onchip[o.space], o.addr, tuple(strides))
        if isinstance(o, GMRef):
            flat = gm[o.buf.name]
            return np.ndarray(o.shape, flat.dtype, flat, o.offset * flat.itemsize,
                              tuple(s * flat.itemsize for s in o.strides))
        return o

    def wide(x):            # fp16/bf16 steps of one instruction compute in fp32 and round once
        return x.astype(np.float32) if x.dtype.itemsize == 2 else x

    unary = {"TEXP": np.exp, "TLOG": np.log, "TSQRT": np.sqrt,
             "TRSQRT": lambda x: np.reciprocal(np.sqrt(wide(x))).astype(x.dtype),
             "TRECIP": np.reciprocal, "TABS": np.abs, "TNEG": np.negative,
             "TRELU": lambda x: np.maximum(x, np.zeros((), x.dtype))}
    binary = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide,
              "MAX": np.maximum, "MIN": np.minimum}
    reduce = {"SUM": lambda x, **kw: np.sum(wide(x), **kw).astype(x.dtype), "MAX": np.max, "MIN": np.min}
    with np.errstate(all="ignore"):
        for t in program.tasks:
            for ins in t.instrs:
                op = ins.op
                if op in SYNC_OPS:
                    continue
                dst, srcs = view(ins.dst), [view(s) for s in ins.srcs]
                if op in ("TLOAD", "TSTORE", "TMOV"):
                    act = ins.attrs.get("act")          # a store's ReLU on its way out of L0C
                    dst[...] = srcs[0] if act is None else unary["T" + act.upper()](srcs[0])
                elif op == "TEXTRACT":
                    whole = view(ins.srcs[0], ins.srcs[0].shape)
                    r0, c0 = ins.attrs["offsets"]
                    dst[...] = whole[r0:r0 + dst.shape[0], c0:c0 + dst.shape[1]]
                elif op == "TMATMUL":
                    dst[...] = np.matmul(srcs[0].astype(dst.dtype), srcs[1].astype(dst.dtype))
                elif op in ("TMATMUL_ACC", "TMATMUL_BIAS"):
                    dst[...] = srcs[0] + np.matmul(srcs[1].astype(dst.dtype), srcs[2].astype(dst.dtype))
                elif op in unary:
                    dst[...] = unary[op](srcs[0])
                elif op == "TCVT":
                    dst[...] = srcs[0].astype(dst.dtype)
                elif op in ("TROWEXPAND", "TCOLEXPAND"):
                    dst[...] = np.broadcast_to(srcs[0], dst.shape)
                elif op[:4] in ("TROW", "TCOL") and op[4:] in reduce:
                    dst[...] = reduce[op[4:]](srcs[0], axis=ins.attrs["dim"], keepdims=True)
                else:
                    body = op[1:]
                    for pre in ("ROWEXPAND", "COLEXPAND", ""):
                        if body.startswith(pre) and body[len(pre):] in binary:
                            dst[...] = binary[body[len(pre):]](srcs[0], srcs[1])
                            break
                    else:
                        assert body.endswith("S") and body[:-1] in binary, op
                        dst[...] = binary[body[:-1]](srcs[0], np.asarray(srcs[1], dtype=srcs[0].dtype))
    return {b.name: gm[b.name].reshape(b.shape) for b in program.buffers if b.role != "workspace"}


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    as_int = np.dtype(f"u{a.dtype.itemsize}")
    return np.array_equal(a.view(as_int), b.view(as_int))


def poison_scratch():
    """Fill the memory the plan reuses with NaN bytes: results must not depend on it."""
    for buf in getattr(functional_plan._pool, "buffers", {}).values():
        buf.fill(0xFF)


def run_plan(program: Program, machine, arrays) -> dict[str, np.ndarray]:
    """The plan alone (run_functional would hide a failing plan behind the reference interpreter),
    with NaN bytes wherever it may find stale data."""
    plan = plan_for(program, get_machine(machine))
    assert plan is not None
    gm = _gm_arrays(program, arrays, plan.unobserved)
    poison_scratch()
    for name in plan.unobserved:
        gm[name].view(np.uint8).fill(0xFF)
    plan.run(gm)
    return _outputs(program, gm)


def check_same(program: Program, machine, arrays) -> dict[str, np.ndarray]:
    """Plan, reference interpreter (checked) and oracle agree bit for bit; returns the outputs."""
    want = oracle(program, machine, arrays)
    fast = run_plan(program, machine, arrays)
    assert all(same_bits(v, fast[k]) for k, v in run_functional(program, get_machine(machine), arrays).items())
    checked = run_functional(program, get_machine(machine), arrays, checked=True)
    for name, w in want.items():
        assert same_bits(fast[name], w), f"plan: output {name} differs from the oracle"
        assert same_bits(checked[name], w), f"checked run: output {name} differs from the oracle"
    return fast


def compile_and_check(kernel, args, expected, rtol=1e-5, atol=1e-6, machine="a2a3", **consts):
    ck = kernel.compile(*args, machine=machine, **consts)
    names = [b.name for b in ck.program.buffers if b.role != "workspace"]
    arrays = dict(zip(names, args))
    out = check_same(ck.program, machine, arrays)
    for i, want in expected.items():
        np.testing.assert_allclose(out[names[i]].astype(np.float64), want, rtol=rtol, atol=atol)
    return ck


# --- kernels ----------------------------------------------------------------------------------

@pypto.jit
def layernorm(x, w, b, out, *, TM: int = 32, TN: int = 128):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = pypto.layernorm(x, w, b)


@pypto.jit
def matmul(a, b, c, *, T: int = 32):
    pypto.set_cube_tile_shapes([T, T], [T, 2 * T], [T, T])
    c[:] = pypto.matmul(a, b)


@pypto.jit
def matmul_bias_gelu(a, b, bias, c):
    pypto.set_cube_tile_shapes([32, 32], [32, 64], [32, 32])
    pypto.set_vec_tile_shapes(16, 64)
    c[:] = pypto.gelu(pypto.matmul(a, b) + bias)


def np_softmax(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# --- bit-identical outputs ---------------------------------------------------------------------

@pytest.mark.parametrize("shape,tm,tn", [((512, 256), 64, 128), ((100, 300), 32, 64), ((256, 512), 128, 128),
                                         ((33, 1000), 8, 256)], ids=["even", "tails", "128x128", "wide-tails"])
def test_softmax(shape, tm, tn, rng):
    x = rng.standard_normal(shape).astype(np.float32) * 4
    compile_and_check(softmax, [x, np.zeros_like(x)], {1: np_softmax(x)}, TM=tm, TN=tn)


def test_softmax_special_values(rng):
    """NaN, infinities and signed zeros go through reductions and broadcasts unchanged."""
    x = rng.standard_normal((96, 200)).astype(np.float32)
    x[3, 5], x[7, :] = np.nan, -0.0
    x[8, ::3], x[9, 10], x[10, :] = np.inf, -np.inf, 0.0
    x[11, ::2] = -0.0
    ck = softmax.compile(x, np.zeros_like(x), TM=32, TN=64)
    check_same(ck.program, "a2a3", {"x": x})


def test_layernorm(rng):
    x = rng.standard_normal((100, 300)).astype(np.float32)
    w = rng.standard_normal(300).astype(np.float32)
    b = rng.standard_normal(300).astype(np.float32)
    xd = x.astype(np.float64)
    want = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5) * w + b
    compile_and_check(layernorm, [x, w, b, np.zeros_like(x)], {3: want}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dt", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("m,k,n", [(128, 256, 96), (100, 130, 70)], ids=["even", "tails"])
def test_matmul(dt, m, k, n, rng):
    a = rng.standard_normal((m, k)).astype(dt)
    b = rng.standard_normal((k, n)).astype(dt)
    want = a.astype(np.float64) @ b.astype(np.float64)
    tol = 1e-4 if dt == np.float32 else 3e-2
    compile_and_check(matmul, [a, b, np.zeros((m, n), dt)], {2: want}, rtol=tol, atol=tol * 10)


def test_matmul_bias_gelu(rng):
    a = rng.standard_normal((96, 80)).astype(np.float16)
    b = rng.standard_normal((80, 100)).astype(np.float16)
    bias = rng.standard_normal(100).astype(np.float16)
    y = a.astype(np.float64) @ b.astype(np.float64) + bias
    want = 0.5 * y * (1.0 + np.tanh(GELU_C * (y + 0.044715 * y ** 3)))
    compile_and_check(matmul_bias_gelu, [a, b, bias, np.zeros((96, 100), np.float16)], {3: want},
                      rtol=2e-2, atol=5e-2)


BCAST = {"MN_MN": ((60, 200), (60, 200)), "MN_M1": ((60, 200), (60, 1)), "MN_N": ((60, 200), (200,)),
         "M1_MN": ((60, 1), (60, 200)), "N_MN": ((200,), (60, 200)), "M1_1N": ((60, 1), (1, 200))}


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum"])
@pytest.mark.parametrize("bcast", list(BCAST))
def test_broadcasting(op, bcast, rng):
    @pypto.jit
    def k(a, b, out):
        pypto.set_vec_tile_shapes(16, 64)
        out[:] = getattr(pypto, op)(a, b)
    sa, sb = BCAST[bcast]
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.uniform(0.5, 1.5, sb).astype(np.float32)
    want = getattr(np, {"add": "add", "sub": "subtract", "mul": "multiply", "div": "divide"}.get(op, op))(a, b)
    compile_and_check(k, [a, b, np.zeros(want.shape, np.float32)], {2: want})


@pytest.mark.parametrize("op", ["sum", "amax", "amin", "mean"])
@pytest.mark.parametrize("dim", [-1, 0])
def test_reductions(op, dim, rng):
    @pypto.jit
    def k(a, out):
        pypto.set_vec_tile_shapes(16, 64)
        out[:] = getattr(pypto, op)(a, dim=dim, keepdim=True) * 2.0 - a
    x = rng.uniform(-1, 3, (70, 150)).astype(np.float32)
    red = getattr(np, {"amax": "max", "amin": "min"}.get(op, op))(x.astype(np.float64), axis=dim, keepdims=True)
    compile_and_check(k, [x, np.zeros_like(x)], {1: red * 2.0 - x}, rtol=1e-5, atol=1e-5)


UNARY = ["exp", "log", "sqrt", "rsqrt", "reciprocal", "abs", "neg", "relu", "sigmoid", "tanh", "gelu"]


@pypto.jit
def unary_ops(a, o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11):
    pypto.set_vec_tile_shapes(16, 64)
    for fn, out in zip(UNARY, (o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10)):
        out[:] = getattr(pypto, fn)(a)
    o11[:] = pypto.maximum(2.0 - a * 3.0, 0.25) / 4.0 + pypto.cast(pypto.cast(a, pypto.DT_FP32) + 1.0, a.dtype)


@pytest.mark.parametrize("dt", [np.float32, np.float16, BF16], ids=["fp32", "fp16", "bf16"])
def test_unary_and_scalar_ops(dt, rng):
    """Every unary op, scalar operands and casts, in each float dtype (outputs compared bitwise)."""
    x = rng.uniform(0.1, 3.0, (40, 150)).astype(dt)
    ck = unary_ops.compile(x, *[np.zeros_like(x) for _ in range(len(UNARY) + 1)])
    check_same(ck.program, "a2a3", {"a": x})


def test_transposed_window(rng):
    """A transposed GM window (strides not row-major) is loaded, never read in place."""
    @pypto.jit
    def k(a, out):
        pypto.set_vec_tile_shapes(16, 32)
        out[:] = pypto.transpose(a, 0, 1) + pypto.sum(pypto.transpose(a, 0, 1), dim=-1, keepdim=True)
    x = rng.standard_normal((48, 80)).astype(np.float32)
    t = x.T.astype(np.float64)
    compile_and_check(k, [x, np.zeros((80, 48), np.float32)], {1: t + t.sum(-1, keepdims=True)}, rtol=1e-5, atol=1e-5)


# --- what the plan does with a program ----------------------------------------------------------

def test_plan_batches_tasks_and_drops_copies(rng):
    x = rng.standard_normal((1024, 256)).astype(np.float32)
    ck = softmax.compile(x, np.zeros_like(x), TM=64, TN=128)
    plan = plan_for(ck.program, get_machine("a2a3"))
    real = sum(i.op not in SYNC_OPS for t in ck.program.tasks for i in t.instrs)
    loads = sum(i.op == "TLOAD" for t in ck.program.tasks for i in t.instrs)
    assert plan.private and len(ck.program.tasks) >= 16
    assert len(plan.ops) * 8 <= real - loads            # tasks run together, loads read GM in place
    check_same(ck.program, "a2a3", {"x": x})


def test_runs_are_independent(rng):
    """Scratch memory is reused between runs: outputs are fresh arrays and do not depend on it."""
    x, y = (rng.standard_normal((200, 300)).astype(np.float32) for _ in range(2))
    ck = softmax.compile(x, np.zeros_like(x), TM=32, TN=64)
    m = get_machine("a2a3")
    first = run_functional(ck.program, m, {"x": x})["out"]
    kept = first.copy()
    poison_scratch()
    second = run_functional(ck.program, m, {"x": y})["out"]
    assert same_bits(first, kept) and not np.shares_memory(first, second)
    assert same_bits(second, oracle(ck.program, "a2a3", {"x": y})["out"])


def _edited(program: Program, task: int, k: int, **changes) -> Program:
    t = program.tasks[task]
    instrs = list(t.instrs)
    instrs[k] = Instr(**{**{f: getattr(instrs[k], f) for f in ("op", "pipe", "dst", "srcs", "attrs", "loc")},
                         **changes})
    tasks = list(program.tasks)
    tasks[task] = ExecTask(t.id, t.group, t.core_type, t.deps, t.level, tuple(instrs))
    return Program(program.name, program.buffers, tuple(tasks))


def test_task_reading_on_chip_data_of_an_earlier_task(rng):
    """A task that reads UB bytes it never wrote sees what the previous task left (zeros at first):
    the plan then runs one task at a time, in program order, on one zero-filled copy."""
    x = rng.standard_normal((64, 512)).astype(np.float32)
    ck = softmax.compile(x, np.zeros_like(x), TM=32, TN=256, machine="teach")
    t = next(t for t in ck.program.tasks if t.id > 0)
    k = next(k for k, i in enumerate(t.instrs) if i.op == "TROWMAX")
    src = t.instrs[k].srcs[0]
    moved = TileRef(src.space, 0x20000, src.dtype, src.shape, src.valid)
    bad = _edited(ck.program, t.id, k, srcs=(moved,) + t.instrs[k].srcs[1:])
    plan = plan_for(bad, get_machine("teach"))
    assert plan is not None and not plan.private
    want = oracle(bad, "teach", {"x": x})
    assert same_bits(run_plan(bad, "teach", {"x": x})["out"], want["out"])
    with pytest.raises(pypto.SimulationError, match="reads uninitialised UB data at 0x20000"):
        run_functional(bad, get_machine("teach"), {"x": x}, checked=True)


def test_conflicting_tasks_keep_program_order(rng):
    """Writes of the same GM with the dependencies removed: tasks of one stream that conflict with a
    task in between are not run together, and the last write wins as in program order."""
    @pypto.jit
    def k(x, out):
        pypto.set_vec_tile_shapes(16, 64)
        out[:] = x + 1.0
        out[0:50, :] = x[0:50, :] * 2.0
        out[0:48, :] = x[0:48, :] + 1.0
    x = rng.standard_normal((100, 128)).astype(np.float32)
    ck = k.compile(x, np.zeros_like(x))
    p = ck.program
    free = Program(p.name, p.buffers, tuple(ExecTask(t.id, t.group, t.core_type, (), t.level, t.instrs)
                                             for t in p.tasks))
    out = check_same(free, "a2a3", {"x": x})["out"]
    one, two = np.float32(1.0), np.float32(2.0)
    assert same_bits(out[:48], x[:48] + one) and same_bits(out[48:50], x[48:50] * two)
    assert same_bits(out[50:], x[50:] + one)


def test_out_of_bounds_window_is_reported_without_check(rng):
    x = rng.standard_normal((64, 256)).astype(np.float32)
    ck = softmax.compile(x, np.zeros_like(x), TM=32, TN=128)
    t = ck.program.tasks[-1]
    k = next(k for k, i in enumerate(t.instrs) if i.op == "TLOAD")
    w = t.instrs[k].srcs[0]
    bad = _edited(ck.program, t.id, k, srcs=(GMRef(w.buf, w.offset + 64 * 256, w.shape, w.strides),))
    assert plan_for(bad, get_machine("a2a3")) is None
    with pytest.raises(pypto.SimulationError, match=f"GM access outside buffer {w.buf.name}"):
        run_functional(bad, get_machine("a2a3"), {"x": x})


def test_checked_mode_reports_uninitialised_reads(rng):
    x = rng.standard_normal((64, 256)).astype(np.float32)
    ck = softmax.compile(x, np.zeros_like(x), TM=32, TN=128)
    t = next(t for t in ck.program.tasks if any(i.op == "TEXP" for i in t.instrs))
    k = next(k for k, i in enumerate(t.instrs) if i.op == "TEXP")
    src = t.instrs[k].srcs[0]
    bad = _edited(ck.program, t.id, k, srcs=(TileRef(src.space, 0x28000, src.dtype, src.shape, src.valid),))
    with pytest.raises(pypto.SimulationError, match=rf"task {t.id} instruction {k} \(TEXP\) reads uninitialised UB"):
        run_functional(bad, get_machine("a2a3"), {"x": x}, checked=True)
    # unchecked, the stale bytes are read as the oracle reads them
    assert same_bits(run_plan(bad, "a2a3", {"x": x})["out"], oracle(bad, "a2a3", {"x": x})["out"])


# --- hand-written streams: when a copy may not be dropped -------------------------------------

ROWS, COLS, BLOCK = 32, 64, 8
X = GMBuffer("x", (ROWS, COLS), F32, "input")
OUT = GMBuffer("out", (ROWS, COLS), F32, "output")
OUT2 = GMBuffer("out2", (ROWS, COLS), F32, "output")
WS = GMBuffer("ws", (ROWS, COLS), F32, "workspace")


def tile(k: int, rows: int = BLOCK, dtype=F32) -> TileRef:
    """The k-th [8, 64] UB tile slot (only its first `rows` rows valid)."""
    return TileRef("UB", k * BLOCK * COLS * 4, dtype, (BLOCK, COLS), (rows, COLS))


def rows(buf: GMBuffer, r: int, n: int = BLOCK) -> GMRef:
    return GMRef(buf, r * COLS, (n, COLS), (COLS, 1))


def half(addr: int) -> TileRef:
    """A [8, 32] fp32 UB tile."""
    return TileRef("UB", addr, F32, (BLOCK, 32), (BLOCK, 32))


def cols(buf: GMBuffer, r: int, c: int, w: int = 32) -> GMRef:
    """Columns c..c+w of the row block at r."""
    return GMRef(buf, r * COLS + c, (BLOCK, w), (COLS, 1))


def ins(op: str, dst, *srcs) -> Instr:
    pipe = {"TLOAD": "MTE2", "TSTORE": "MTE3"}.get(op, "V")
    return Instr(op, pipe, dst, srcs, Attrs())


def handmade(stream, buffers=(X, OUT, OUT2)) -> Program:
    """Four tasks running `stream(r)` on the row blocks r = 0, 8, 16, 24."""
    tasks = tuple(ExecTask(k, 0, "AIV", (), 0, tuple(stream(k * BLOCK))) for k in range(ROWS // BLOCK))
    return Program("handmade", buffers, tasks)


STREAMS = {
    # the store's buffer is read between the producer and the store: the producer keeps its tile
    "read-before-store": lambda r: [ins("TLOAD", tile(0), rows(X, r)), ins("TEXP", tile(1), tile(0)),
                                    ins("TLOAD", tile(2), rows(OUT, r)), ins("TSTORE", rows(OUT, r), tile(1)),
                                    ins("TADD", tile(3), tile(2), tile(0)), ins("TSTORE", rows(OUT2, r), tile(3))],
    # a loaded window is overwritten before the tile is read: the tile keeps the old data
    "source-overwritten": lambda r: [ins("TLOAD", tile(0), rows(OUT, r)), ins("TLOAD", tile(1), rows(X, r)),
                                     ins("TSTORE", rows(OUT, r), tile(1)), ins("TADD", tile(2), tile(0), tile(1)),
                                     ins("TSTORE", rows(OUT2, r), tile(2))],
    # part of a loaded tile is overwritten, then the whole tile is read
    "partly-overwritten": lambda r: [ins("TLOAD", tile(0), rows(X, r)), ins("TLOAD", tile(1), rows(X, r)),
                                     ins("TADDS", tile(0, 4), tile(1, 4), 1.0), ins("TADD", tile(2), tile(0), tile(0)),
                                     ins("TSTORE", rows(OUT, r), tile(2))],
    # part of a tile is read between its producer and its store
    "partly-read-before-store": lambda r: [ins("TLOAD", tile(0), rows(X, r)), ins("TEXP", tile(1), tile(0)),
                                           ins("TMULS", tile(2, 4), tile(1, 4), 2.0),
                                           ins("TSTORE", rows(OUT, r), tile(1)),
                                           ins("TSTORE", rows(OUT2, r, 4), tile(2, 4))],
}


# instructions repeated over column windows, which must not all run as one
LOOPS = {
    # the second addition reads what an instruction between the two writes
    "reads-a-later-write": lambda r: [ins("TADDS", cols(OUT, r, 0), cols(X, r, 0), 1.0),
                                      ins("TMULS", cols(X, r, 32), cols(OUT, r, 0), 2.0),
                                      ins("TADDS", cols(OUT, r, 32), cols(X, r, 32), 1.0)],
    # the second addition overwrites what an instruction between the two reads
    "overwrites-an-earlier-read": lambda r: [ins("TADDS", cols(OUT, r, 0), cols(X, r, 0), 1.0),
                                             ins("TMULS", cols(OUT2, r, 0), cols(OUT, r, 32), 2.0),
                                             ins("TADDS", cols(OUT, r, 32), cols(X, r, 32), 1.0)],
    # each addition reads what the previous one wrote
    "chained-iterations": lambda r: [ins("TADDS", cols(X, r, 16), cols(X, r, 0), 1.0),
                                     ins("TADDS", cols(X, r, 32), cols(X, r, 16), 1.0),
                                     ins("TADDS", cols(OUT, r, 0, 64), cols(X, r, 0, 64), 0.0)],
    # windows not evenly spaced, or other scalars: not one strided call
    "uneven-windows": lambda r: [ins("TADDS", cols(OUT, r, c, 16), cols(X, r, c, 16), 1.0) for c in (0, 16, 48)],
    "other-scalars": lambda r: [ins("TADDS", cols(OUT, r, c, 16), cols(X, r, c, 16), float(c)) for c in (0, 16, 32)],
    # a loop whose iterations may run as one, through tiles that die in each iteration
    "fusable": lambda r: [op for c in (0, 32) for op in (
        ins("TLOAD", half(c * 64), cols(X, r, c)), ins("TADDS", half(0x4000 + c * 64), half(c * 64), 1.0),
        ins("TEXP", half(0x8000), half(0x4000 + c * 64)), ins("TSTORE", cols(OUT, r, c), half(0x8000)))],
}


@pytest.mark.parametrize("name", list(LOOPS))
def test_repeated_instructions(name, rng):
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    check_same(handmade(LOOPS[name]), "a2a3", {"x": x})


# a tile passed from its producer to an element-wise instruction writing GM
CHAINS = {
    "window-read-in-between": lambda r: [ins("TADDS", tile(0), rows(X, r), 1.0),
                                         ins("TMULS", rows(OUT2, r), rows(OUT, r), 2.0),
                                         ins("TEXP", rows(OUT, r), tile(0))],
    "tile-read-in-between": lambda r: [ins("TADDS", tile(0), rows(X, r), 1.0),
                                       ins("TMULS", rows(OUT2, r), tile(0), 2.0),
                                       ins("TEXP", rows(OUT, r), tile(0))],
    "tile-read-after": lambda r: [ins("TADDS", tile(0), rows(X, r), 1.0), ins("TEXP", rows(OUT, r), tile(0)),
                                  ins("TMULS", rows(OUT2, r), tile(0), 2.0)],
    "window-also-read": lambda r: [ins("TLOAD", tile(1), rows(X, r)), ins("TSTORE", rows(OUT, r), tile(1)),
                                   ins("TADDS", tile(0), rows(X, r), 1.0),
                                   ins("TADD", rows(OUT, r), tile(0), rows(OUT, r))],
    "partial-producer": lambda r: [ins("TADDS", tile(0), rows(X, r), 1.0),
                                   ins("TMULS", tile(0, 4), rows(X, r, 4), 2.0),
                                   ins("TEXP", rows(OUT, r), tile(0))],
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_tiles_passed_to_gm_writes(name, rng):
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    check_same(handmade(CHAINS[name]), "a2a3", {"x": x})


def test_loop_iterations_run_as_one_call(rng):
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    program = handmade(LOOPS["fusable"])
    plan = plan_for(program, get_machine("a2a3"))
    assert len(plan.ops) == 2 and all(s.shape[:2] == (4, 2) for _, specs in plan.ops for s in specs[:2])
    check_same(program, "a2a3", {"x": x})


@pytest.mark.parametrize("name", list(STREAMS))
def test_copies_that_must_stay(name, rng):
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    program = handmade(STREAMS[name])
    assert plan_for(program, get_machine("a2a3")).private
    check_same(program, "a2a3", {"x": x})


def test_result_converted_to_the_destination_dtype(rng):
    """An fp32 sum written to an int32 tile is converted as an assignment converts (no out=)."""
    outi, ti = GMBuffer("outi", (ROWS, COLS), pypto.DT_INT32, "output"), tile(1, dtype=pypto.DT_INT32)
    program = handmade(lambda r: [ins("TLOAD", tile(0), rows(X, r)), ins("TADD", ti, tile(0), tile(0)),
                                  ins("TSTORE", rows(outi, r), ti)], (X, outi))
    x = rng.uniform(-100, 100, (ROWS, COLS)).astype(np.float32)
    assert same_bits(check_same(program, "a2a3", {"x": x})["outi"], (x + x).astype(np.int32))


def test_first_contents_of_gm_buffers(rng):
    """Buffers the program reads before writing, or leaves partly unwritten, start as given (or as
    zeros); the others are not filled at all."""
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    program = handmade(lambda r: [ins("TLOAD", tile(0), rows(WS, r)), ins("TADDS", tile(1), tile(0), 1.0),
                                  ins("TSTORE", rows(OUT, r), tile(1)),
                                  ins("TSTORE", rows(OUT2, r, 4), tile(1, 4))], (X, OUT, OUT2, WS))
    assert plan_for(program, get_machine("a2a3")).unobserved == {"out"}
    given = {"x": x, "out2": np.full((ROWS, COLS), 7.0, np.float32)}
    out = check_same(program, "a2a3", given)
    assert (out["out"] == 1.0).all() and (out["out2"].reshape(4, 8, COLS)[:, 4:] == 7.0).all()

    # windows of 100 out of every 128 elements: their bounding boxes cover all of out, they do not
    gaps = TileRef("UB", 0, F32, (4, 100), (4, 100))
    program = handmade(lambda r: [ins("TLOAD", gaps, GMRef(X, r * COLS, (4, 100), (128, 1))),
                                  ins("TSTORE", GMRef(OUT, r * COLS, (4, 100), (128, 1)), gaps)])
    assert not plan_for(program, get_machine("a2a3")).unobserved
    check_same(program, "a2a3", {"x": x})

    ck = softmax.compile(x, np.zeros_like(x), TM=8, TN=32)
    assert plan_for(ck.program, get_machine("a2a3")).unobserved == {"out"} | {
        b.name for b in ck.program.buffers if b.role == "workspace"}


def test_conflict_box_of_an_unusual_window():
    """A window whose strides are not the buffer's (a reshaped view), or whose rows run past the
    buffer's, is bounded by whole rows."""
    assert functional_plan._box(GMRef(X, 6 * COLS, (8, 32), (32, 1))) == ((6, 10), (0, COLS))
    assert functional_plan._box(GMRef(X, 6 * COLS, (2, 100), (COLS, 1))) == ((6, 9), (0, COLS))   # wraps
    assert functional_plan._box(rows(X, 8)) == ((8, 16), (0, COLS))


# --- loops of a task: a body run once per rule over its iterations -----------------------------

def stepped(op: str, step: int, dst, *srcs) -> Instr:
    """An instruction of a loop body whose GM window moves by `step` elements per iteration."""
    return Instr(op, {"TLOAD": "MTE2", "TSTORE": "MTE3"}.get(op, "V"), dst, srcs, Attrs({"gm_step": (step,)}))


def looped(code) -> Program:
    """Four tasks running `code(r)` (instructions and loops) on the row blocks r = 0, 8, 16, 24."""
    tasks = tuple(ExecTask(k, 0, "AIV", (), 0, tuple(code(k * BLOCK))) for k in range(ROWS // BLOCK))
    return Program("looped", (X, OUT, OUT2), tasks)


def quarter(addr: int) -> TileRef:
    """An [8, 16] fp32 UB tile."""
    return TileRef("UB", addr, F32, (BLOCK, 16), (BLOCK, 16))


def test_a_loop_runs_as_one_call_per_rule_of_its_body(rng):
    """Four column windows of 16, loaded, shifted, exponentiated and stored: the body's rules
    (copies dropped) run once over the four iterations, for the four tasks together."""
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    program = looped(lambda r: [Loop(4, (stepped("TLOAD", 16, quarter(0), cols(X, r, 0, 16)),
                                         ins("TADDS", quarter(0x1000), quarter(0), 1.0),
                                         ins("TEXP", quarter(0x2000), quarter(0x1000)),
                                         stepped("TSTORE", 16, cols(OUT, r, 0, 16), quarter(0x2000))))])
    plan = plan_for(program, get_machine("a2a3"))
    assert len(plan.ops) == 2 and all(s.shape[:2] == (4, 4) for _, specs in plan.ops for s in specs[:2])
    out = check_same(program, "a2a3", {"x": x})
    np.testing.assert_allclose(out["out"], np.exp(x + 1.0), rtol=1e-6)


def test_a_software_pipelined_loop_is_started_where_its_tile_is_loaded(rng):
    """The body loads the next window at its end (the first load before the loop, the last
    iteration's work after it): the loop is taken one instruction earlier, then it is
    self-contained and runs grouped."""
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)

    def code(r):
        return [ins("TLOAD", quarter(0), cols(X, r, 0, 16)),
                Loop(3, (ins("TMULS", quarter(0x1000), quarter(0), 3.0),
                         stepped("TSTORE", 16, cols(OUT, r, 0, 16), quarter(0x1000)),
                         stepped("TLOAD", 16, quarter(0), cols(X, r, 16, 16)))),
                ins("TMULS", quarter(0x1000), quarter(0), 3.0), ins("TSTORE", cols(OUT, r, 48, 16), quarter(0x1000))]
    program = looped(code)
    # (MIN_GROUPED iterations: four with the rotation, taken from three in the text and the two ends)
    plan = plan_for(program, get_machine("a2a3"))
    assert len(plan.ops) == 1 and plan.ops[0][1][0].shape[:2] == (4, 4)
    out = check_same(program, "a2a3", {"x": x})
    np.testing.assert_allclose(out["out"], x * 3.0, rtol=1e-6)


LOOPED = {
    # an accumulator carried from one iteration to the next on chip: not self-contained
    "carried-on-chip": lambda r: [ins("TLOAD", quarter(0), cols(X, r, 0, 16)),
                                  Loop(4, (stepped("TLOAD", 16, quarter(0x1000), cols(X, r, 0, 16)),
                                           ins("TADD", quarter(0), quarter(0), quarter(0x1000)))),
                                  ins("TSTORE", cols(OUT, r, 0, 16), quarter(0))],
    # each iteration reads the window of out the next one writes (before it writes it)
    "reads-the-next-iterations-output": lambda r: [Loop(4, (
        stepped("TADDS", 8, cols(OUT, r, 0, 8), cols(X, r, 0, 8), 1.0),
        stepped("TMULS", 8, cols(OUT2, r, 0, 8), cols(OUT, r, 8, 8), 2.0)))],
    # each iteration adds its window of x to the same window of out (which does not move)
    "accumulated-in-gm": lambda r: [Loop(4, (
        stepped("TLOAD", 16, quarter(0), cols(X, r, 0, 16)),
        stepped("TADD", 0, cols(OUT, r, 0, 16), cols(OUT, r, 0, 16), quarter(0))))],
    # a tile the loop writes is read after it
    "tile-read-after-the-loop": lambda r: [Loop(4, (
        stepped("TLOAD", 16, quarter(0), cols(X, r, 0, 16)), ins("TEXP", quarter(0x1000), quarter(0)),
        stepped("TSTORE", 16, cols(OUT, r, 0, 16), quarter(0x1000)))),
        ins("TSTORE", cols(OUT2, r, 0, 16), quarter(0x1000))],
}


@pytest.mark.parametrize("name", list(LOOPED))
def test_loops_that_cannot_run_grouped(name, rng):
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    check_same(looped(LOOPED[name]), "a2a3", {"x": x, "out": np.full((ROWS, COLS), 5.0, np.float32)})


def test_compiled_tiny_tiles_run_grouped(rng):
    """A kernel in 1 x 16 tiles: the loops pass folds each task into a loop, the plan runs it as
    a few numpy calls, with the bits of the unrolled program's plan."""
    x = rng.standard_normal((256, 64)).astype(np.float32)

    @pypto.jit
    def tiny(x, out):
        pypto.set_vec_tile_shapes(1, 16)
        out[:] = pypto.sqrt(pypto.abs(x) + 0.5) * 2.0

    ck = tiny.compile(x, np.zeros_like(x))
    flat = tiny.compile(x, np.zeros_like(x), options={"loops": False})
    plan = plan_for(ck.program, get_machine("a2a3"))
    assert len(plan.ops) * 50 < len(ck.program)
    got = check_same(ck.program, "a2a3", {"x": x})["out"]
    assert same_bits(got, run_plan(flat.program, "a2a3", {"x": x})["out"])
    np.testing.assert_allclose(got, np.sqrt(np.abs(x) + 0.5) * 2.0, rtol=1e-6)
