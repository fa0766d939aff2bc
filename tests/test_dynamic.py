"""Dynamic shapes: one compile of a kernel with a pypto.DYNAMIC dim serves every size of it.

Values are checked against numpy written here (not the package's reference), the program of a
call (`program_for(n)`) is also run on its own, and the cycles of a call on exactly one chunk
are those of the kernel compiled for that size."""
import numpy as np
import pytest

import pypto
from pypto.compiler.dynamic import CHUNK, ladder
from pypto.ir.gm import GMRef
from pypto.sim.run import simulate as run_program

D, F = pypto.DYNAMIC, pypto.DT_FP32


def T(*shape, dtype=F):
    return pypto.Tensor(list(shape), dtype)


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pypto.jit
def softmax(x: T(D, 1024), out: T(D, 1024)):
    out[:] = pypto.softmax(x, dim=-1)


@pytest.fixture(scope="module")
def softmax_ck():
    x = np.zeros((5, 1024), np.float32)
    return softmax.compile(x, np.zeros_like(x))


def test_one_compile_serves_every_size():
    softmax.cache_clear()
    rng = np.random.default_rng(0)
    for n in (1, 7, 1000, 8192):
        x = rng.standard_normal((n, 1024)).astype(np.float32)
        out = np.full_like(x, np.nan)
        softmax(x, out)
        np.testing.assert_allclose(out, np_softmax(x), rtol=2e-6, atol=1e-9)
    assert softmax.cache_size == 1


def test_simulate_checks_and_times_each_size(softmax_ck):
    rng = np.random.default_rng(1)
    for n in (1, 7, 1000, 2049):
        x = rng.standard_normal((n, 1024)).astype(np.float32)
        res = softmax_ck.simulate(x, np.zeros_like(x))
        assert res.ok is True
        assert res.outputs["out"].shape == (n, 1024)
        assert res.program is softmax_ck.program_for(n)
        assert softmax_ck.simulate(mode="timing", size=n).cycles == res.cycles


def test_program_of_a_call_computes_the_same_on_its_own(softmax_ck):
    """The values of ck.simulate come from the chunk programs run piece by piece; the program of
    the call (all pieces, tasks past the rows left out, cores taken in turns) computes them too."""
    rng = np.random.default_rng(2)
    for n in (3, 1000, 2100):
        x = rng.standard_normal((n, 1024)).astype(np.float32)
        program = softmax_ck.program_for(n)
        rows = softmax_ck.dynamic.padded(softmax_ck.pieces_for(n))
        xp = np.zeros((rows, 1024), np.float32)
        xp[:n] = x
        got = run_program(program, {"x": xp, "out": np.zeros_like(xp)}, mode="functional").outputs["out"][:n]
        np.testing.assert_allclose(got, np_softmax(x), rtol=2e-6, atol=1e-9)


def test_pieces_of_a_call(softmax_ck):
    info = softmax_ck.dynamic
    assert info.chunk == CHUNK == 2048
    assert sorted(info.programs) == list(ladder()) == [1, 4, 16, 64, 256, 1024, 2048]
    assert info.pieces(1) == [(0, 1)]
    assert info.pieces(3) == [(0, 4)]
    assert info.pieces(3, "ladder") == [(0, 1), (1, 1), (2, 1)]
    assert info.pieces(100, "ladder") == [(0, 64), (64, 16), (80, 16), (96, 4)]
    assert info.pieces(1000) == [(0, 1024)]
    assert info.pieces(2048) == [(0, 2048)]
    assert info.pieces(2049) == [(0, 2048), (2048, 1)]
    assert info.pieces(8192) == [(0, 2048), (2048, 2048), (4096, 2048), (6144, 2048)]
    assert info.plans(2048) == {"cover": [(0, 2048)]}
    assert info.padded(info.pieces(1000)) == 1024
    # a loop of step 8 over the dim: no program smaller than a step
    assert ladder(8) == (16, 64, 256, 1024, 2048)


def test_the_faster_plan_runs(softmax_ck):
    """Where the rows past the whole chunks may run as one covering program or as the ladder's
    smaller ones, the call runs the one the timing model finds faster."""
    for n in (100, 1000, 2048 + 600):
        plans = softmax_ck.dynamic.plans(n)
        assert set(plans) == {"cover", "ladder"}
        cycles = {name: pypto.sim.run.simulate(softmax_ck._instantiate(n, p), mode="timing").cycles
                  for name, p in plans.items()}
        chosen = softmax_ck.pieces_for(n)
        assert chosen in plans.values()
        assert cycles[next(k for k, p in plans.items() if p == chosen)] <= min(cycles.values()) * 1.05
    assert softmax_ck.pieces_for(100) == softmax_ck.dynamic.pieces(100, "ladder")   # 4 runs spread over cores
    assert softmax_ck.pieces_for(1000) == [(0, 1024)]                              # one 1024-row run


def test_tasks_past_the_rows_are_left_out(softmax_ck):
    small = softmax_ck.dynamic.programs[16]
    one = softmax_ck._instantiate(3, [(0, 16)])
    assert 1 <= len(one.tasks) < len(small.tasks)
    # every task kept writes rows 0..2 of out (the tasks of the other rows of the 16 are left out)
    for t in one.tasks:
        assert any(isinstance(i.dst, GMRef) and i.dst.buf.name == "out" and i.dst.span()[0] < 3 * 1024
                   for i in t.instrs)


def test_one_chunk_runs_the_kernel_compiled_for_that_size(softmax_ck):
    @pypto.jit
    def softmax_static(x, out):
        out[:] = pypto.softmax(x, dim=-1)
    x = np.zeros((CHUNK, 1024), np.float32)
    static = softmax_static.compile(x, x).simulate(mode="timing").cycles
    assert softmax_ck.simulate(mode="timing", size=CHUNK).cycles == static
    # two chunks: the second chunk's tasks run on the cores after the first's
    assert softmax_ck.simulate(mode="timing", size=2 * CHUNK).cycles < 2.2 * static


def test_a_kernel_with_matmuls_gets_a_larger_chunk():
    from pypto.compiler.dynamic import chunk_for

    def mm(x: T(D, 1024, dtype=pypto.DT_FP16), w, out: T(D, 512, dtype=pypto.DT_FP16)):
        out[:] = pypto.matmul(x, w)
    k = pypto.jit(mm)
    ck = k.compile(T(D, 1024, dtype=pypto.DT_FP16), T(1024, 512, dtype=pypto.DT_FP16),
                   T(D, 512, dtype=pypto.DT_FP16))
    assert ck.dynamic.chunk == 8192 and max(ck.dynamic.programs) == 8192 and 4096 in ck.dynamic.programs
    f16 = pypto.DT_FP16
    assert chunk_for(softmax._trace([pypto.Tensor([2048, 1024], F, "x"), pypto.Tensor([2048, 1024], F, "out")], {}),
                     2048) == 2048
    big = pypto.jit(mm)._trace([pypto.Tensor([2048, 1024], f16, "x"), pypto.Tensor([1024, 8192], f16, "w"),
                                pypto.Tensor([2048, 8192], f16, "out")], {})
    assert chunk_for(big, 2048) == 2048          # 2^33 multiply-adds per 1024 rows: no larger chunk



def test_a_batched_matmul_over_the_dynamic_dim_gets_a_small_chunk(rng):
    """Its batches share no weights: a chunk of at most 256 batches, not 8192 (a fuzzed [N, 1, 32] x
    [N, 32, 32] took 36 s to compile for a 8192-batch chunk, 0.2 s now), values right at any size."""
    f32 = pypto.DT_FP32

    @pypto.jit
    def bmm(x: T(D, 1, 32, dtype=f32), w: T(D, 32, 32, dtype=f32), out: T(D, 1, 32, dtype=f32)):
        out[:] = pypto.matmul(x, w) + 2.0

    ck = bmm.compile(T(D, 1, 32, dtype=f32), T(D, 32, 32, dtype=f32), T(D, 1, 32, dtype=f32))
    assert ck.dynamic.chunk == 256 and sorted(ck.dynamic.programs) == [1, 4, 16, 64, 256]
    for n in (1, 3, 300):
        x = rng.standard_normal((n, 1, 32)).astype(np.float32)
        w = rng.standard_normal((n, 32, 32)).astype(np.float32)
        res = ck.simulate(x, w, np.zeros((n, 1, 32), np.float32))
        np.testing.assert_allclose(res.outputs["out"], x @ w + 2.0, rtol=1e-5, atol=1e-5)
    assert bmm.cache_size == 1
    # a batch of 1000 x 32 outputs: 32 batches a chunk (2^20 output elements)
    from pypto.compiler.dynamic import chunk_for

    def big(x, w, out):
        out[:] = pypto.matmul(x, w)
    tr = pypto.jit(big)._trace([pypto.Tensor([1000, 17], f32, "x"), pypto.Tensor([2048, 17, 32], f32, "w"),
                                pypto.Tensor([2048, 1000, 32], f32, "out")], {})
    assert chunk_for(tr, 2048) == 32

def test_tiny_tiles_get_a_chunk_whose_program_stays_small(rng, monkeypatch):
    """Each row unrolls into many instructions (a 1 x 8 tile): the chunk is the largest ladder
    step whose program stays within MAX_CHUNK_INSTRS, the larger ones are never compiled (a fuzzed
    [N, 128, 5] fp16 kernel in 1 x 128 tiles took 44 s to compile for 2048 rows, 1 s now)."""
    import pypto.compiler.dynamic as dyn
    monkeypatch.setattr(dyn, "MAX_CHUNK_INSTRS", 6000)

    @pypto.jit
    def tiny(x: T(D, 64), out: T(D, 64)):
        pypto.set_vec_tile_shapes(1, 8)
        out[:] = pypto.exp(x) * 2.0

    ck = tiny.compile(T(D, 64), T(D, 64))
    sizes = {rows: len(p) for rows, p in ck.dynamic.programs.items()}
    assert sorted(sizes) == [1, 4, 16, 64] and ck.dynamic.chunk == 64
    # each program compiled when the one before it, scaled to its rows, stays within the budget
    assert sizes[16] * 4 <= 6000 < sizes[64] * 4
    assert len(ck.program) == sizes[64]               # the kernel's own levels are the chunk's
    for n in (1, 63, 200):
        x = rng.standard_normal((n, 64)).astype(np.float32)
        res = ck.simulate(x, np.zeros_like(x))
        assert res.ok is True
        np.testing.assert_allclose(res.outputs["out"], np.exp(x) * 2.0, rtol=2e-6)
    assert [r for _, r in ck.dynamic.pieces(200)] == [64, 64, 64, 16]


def test_loop_over_the_dynamic_dim():
    @pypto.jit
    def k(x: T(D, 64), out: T(D, 64)):
        for i in pypto.loop(0, x.shape[0], 8):
            out[i:i + 8] = pypto.exp(x[i:i + 8]) + 1.0
    rng = np.random.default_rng(3)
    for n in (5, 300):
        x = rng.standard_normal((n, 64)).astype(np.float32)
        out = np.zeros_like(x)
        k(x, out)
        np.testing.assert_allclose(out, np.exp(x) + 1, rtol=2e-6)
    assert k.cache_size == 1


def test_a_tensor_of_the_kernel_built_step_by_step():
    @pypto.jit
    def k(x: T(D, 64), out: T(D, 64)):
        buf = pypto.full(x.shape, 0.0, F)
        for i in pypto.loop(0, x.shape[0], 8):
            buf[i:i + 8] = x[i:i + 8] * 2.0
        out[:] = buf + 1.0

    rng = np.random.default_rng(5)
    for n in (5, 300):
        x = rng.standard_normal((n, 64)).astype(np.float32)
        out = np.zeros_like(x)
        k(x, out)
        np.testing.assert_array_equal(out, x * 2 + 1)


def test_matmul_layernorm_and_an_inout_with_static_operands():
    @pypto.jit
    def mm(x: T(D, 64), w, out: T(D, 32)):
        out[:] = pypto.matmul(x, w)

    @pypto.jit
    def ln(x: T(D, 128), g, b, out: T(D, 128)):
        out[:] = pypto.layernorm(x, g, b)

    @pypto.jit
    def acc(x: T(D, 64), out: T(D, 64)):
        out[:] = out + x * 2.0
    rng = np.random.default_rng(4)
    for n in (1, 77, 2050):
        x = rng.standard_normal((n, 64)).astype(np.float32)
        w = rng.standard_normal((64, 32)).astype(np.float32)
        out = np.zeros((n, 32), np.float32)
        mm(x, w, out)
        np.testing.assert_allclose(out, x @ w, rtol=1e-4, atol=1e-4)
        x2 = rng.standard_normal((n, 128)).astype(np.float32)
        g, b = rng.standard_normal(128).astype(np.float32), rng.standard_normal(128).astype(np.float32)
        o2 = np.zeros_like(x2)
        ln(x2, g, b, o2)
        mu, var = x2.mean(-1, keepdims=True), x2.var(-1, keepdims=True)
        np.testing.assert_allclose(o2, (x2 - mu) / np.sqrt(var + 1e-5) * g + b, rtol=1e-4, atol=1e-4)
        o3 = rng.standard_normal((n, 64)).astype(np.float32)
        want = o3 + x * 2
        acc(x, o3)
        np.testing.assert_allclose(o3, want, rtol=1e-6)
    assert (mm.cache_size, ln.cache_size, acc.cache_size) == (1, 1, 1)


def test_a_spec_with_dynamic_compiles_a_dynamic_kernel():
    @pypto.jit
    def neg(x, out):
        out[:] = -x
    ck = neg.compile(T(D, 64), T(D, 64))
    assert ck.dynamic.params == ("x", "out")
    assert "dynamic" in repr(ck) and "2048 rows" in repr(ck)
    x = np.arange(3 * 64, dtype=np.float32).reshape(3, 64)
    assert np.array_equal(ck.simulate(x, np.zeros_like(x)).outputs["out"], -x)
    # the graph holds plain ints: no symbol leaks into the compiler
    assert all(type(d) is int for n in ck.traced.nodes for d in n.shape)


def test_symbolic_size_prints_and_shapes():
    seen = {}

    @pypto.jit
    def k(x: T(D, 64), out: T(D, 64)):
        seen["shape"] = x.shape
        seen["view"] = x[:, 0:32].shape
        out[:] = x
    k.compile(T(D, 64), T(D, 64))
    n = seen["shape"][0]
    assert isinstance(n, pypto.SymbolicScalar) and repr(n) == "N" and seen["shape"][1] == 64
    assert repr(seen["view"][0]) == "N"
    assert pypto.cond(3 > 2) is True


def _error(fn, *specs, match):
    k = pypto.jit(fn)
    with pytest.raises(pypto.PyptoError) as e:
        k.compile(*specs)
    text = str(e.value)
    assert match in text, text
    return e.value


def test_errors_name_the_kernel_line():
    def red(x: T(D, 64), out):
        out[:] = pypto.sum(x, dim=0, keepdim=True)
    e = _error(red, T(D, 64), T(1, 64), match="reduces over the rows of the dynamic dim")
    assert e.loc.line == red.__code__.co_firstlineno + 1

    def div(x: T(D, 64), out: T(D, 64)):
        out[:] = x / x.shape[0]
    e = _error(div, T(D, 64), T(D, 64), match="known only when the kernel is called")
    assert e.loc.line == div.__code__.co_firstlineno + 1 and "div(tensor, N)" in str(e)

    def per_element(x: T(D, 64), out: T(D, 64)):
        out[:] = x / x.numel()
    _error(per_element, T(D, 64), T(D, 64), match="`x.numel()`: the size N of a pypto.DYNAMIC dim")

    def by_len(x: T(D, 64), out: T(D, 64)):
        out[:] = x * len(x)
    _error(by_len, T(D, 64), T(D, 64), match="`len(x)`: the size N")

    def by_int(x: T(D, 64), out: T(D, 64)):
        out[:] = x * float(int(x.shape[0]))
    _error(by_int, T(D, 64), T(D, 64), match="`int(N)`: the size N")

    def branch(x: T(D, 64), out: T(D, 64)):
        if x.shape[0] > 4:
            out[:] = x
    _error(branch, T(D, 64), T(D, 64), match="`N > 4`")

    def fixed(x: T(D, 64), out: T(D, 64)):
        out[0:4] = x[0:4]
    _error(fixed, T(D, 64), T(D, 64), match="rows 0:4 of it depends on where the kernel's chunks fall")

    def squeezed(x: T(D, 1), out: T(D)):         # (make fuzz, 2026-12-03: computed per chunk)
        v = pypto.squeeze(x, 1)
        z = pypto.zeros_like(v)
        z[0:1] = v[0:1]
        out[:] = z
    e = _error(squeezed, T(D, 1), T(D), match="rows 0:1 of it depends on where the kernel's chunks fall")
    assert e.loc.line == squeezed.__code__.co_firstlineno + 3

    def pyrange(x: T(D, 64), out: T(D, 64)):
        for i in range(0, x.shape[0], 8):
            out[i:i + 8] = x[i:i + 8]
    _error(pyrange, T(D, 64), T(D, 64), match="pypto.loop(0, x.shape[0], 8)")

    def contract(x: T(D, 64), out):
        out[:] = pypto.matmul(pypto.transpose(x, 0, 1), x)
    _error(contract, T(D, 64), T(64, 64), match="it is the K dim of the product")

    def odd_step(x: T(D, 64), out: T(D, 64)):
        for i in pypto.loop(0, x.shape[0], 3):
            out[i:i + 3] = x[i:i + 3]
    _error(odd_step, T(D, 64), T(D, 64), match="a power of two")

    def static_out(x: T(D, 64), out):
        out[:] = pypto.full([4, 64], 1.0, pypto.DT_FP32) if hasattr(pypto, "full") else x[0:4]
    _error(static_out, T(D, 64), T(4, 64), match="has no dynamic dim")

    def second_dim(x: T(64, D), out: T(64, D)):
        out[:] = x
    _error(second_dim, T(64, D), T(64, D), match="pypto.DYNAMIC as the first dim only")


def test_a_tile_too_large_for_the_compiled_rows_says_so():
    def big(x: T(D, 64), out: T(D, 64)):
        pypto.set_vec_tile_shapes(4096, 64)
        out[:] = pypto.exp(x)
    e = _error(big, T(D, 64), T(D, 64), match="do not fit UB")
    # the programs are compiled smallest first: the first whose rows the tile cannot fit says so
    assert "the kernel is compiled for 1024 rows of its pypto.DYNAMIC dim" in e.hint
    assert e.loc.line == big.__code__.co_firstlineno + 2


def test_call_errors():
    x = np.zeros((10, 1024), np.float32)
    with pytest.raises(pypto.KernelSignatureError, match="does not fit its annotation"):
        softmax(np.zeros((10, 512), np.float32), np.zeros((10, 512), np.float32))
    ck = softmax.compile(x, x)
    with pytest.raises(pypto.KernelSignatureError, match="the dynamic dims of softmax's arguments differ"):
        ck.simulate(x, np.zeros((11, 1024), np.float32))
    with pytest.raises(pypto.KernelSignatureError, match="size="):
        ck.simulate(mode="timing")
    with pytest.raises(pypto.KernelSignatureError, match="positive integer"):
        ck.program_for(0)


def test_command_line(tmp_path, capsys):
    from pypto.cli import main
    f = tmp_path / "k.py"
    f.write_text("import pypto\n\n@pypto.jit\ndef softmax(x, out):\n    out[:] = pypto.softmax(x, dim=-1)\n")
    args = [f"{f}:softmax", "--arg", "x=Nx1024", "--arg", "out=Nx1024", "--emit", "none"]
    assert main(["compile", *args, "--size", "1000", "--check"]) == 0
    text = capsys.readouterr().out
    assert "kernel softmax on a2a3, N = 1000 rows" in text and "OK vs numpy" in text
    want = pypto.jit(softmax.fn).compile(T(D, 1024), T(D, 1024)).simulate(mode="timing", size=1000).cycles
    assert f"cycles        {want}" in text
    assert main(["compile", *args]) == 2
    assert "give the rows to simulate with --size N" in capsys.readouterr().err
    assert main(["compile", f"{f}:softmax", "--arg", "x=8x1024", "--arg", "out=8x1024", "--size", "3"]) == 2
    assert "has no pypto.DYNAMIC dim" in capsys.readouterr().err


def test_an_annotation_that_cannot_be_read_is_an_error(tmp_path):
    """With `from __future__ import annotations` an annotation naming a local alias cannot be
    evaluated: a clear error at the parameter, not a kernel silently compiled for one size."""
    import importlib.util
    f = tmp_path / "fut.py"
    f.write_text("from __future__ import annotations\nimport pypto\n\n\ndef make():\n    D = pypto.DYNAMIC\n\n"
                 "    @pypto.jit\n    def k(x: pypto.Tensor([D, 64], pypto.DT_FP32), out):\n        out[:] = x\n"
                 "    return k\n")
    spec = importlib.util.spec_from_file_location("fut_annotations", f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(pypto.KernelSignatureError, match="the annotation of 'x' of k cannot be evaluated") as e:
        mod.make()
    assert e.value.loc.line == 9 and "define its names at module level" in str(e.value)


def test_dynamic_params_without_compiling():
    x = np.zeros((3, 1024), np.float32)
    assert softmax.dynamic_params(x, x) == ("x", "out")
    assert softmax.dynamic_params(x) == ()                   # does not fit: the compile says why

    @pypto.jit
    def neg(x, out):
        out[:] = -x
    assert neg.dynamic_params(x, x) == () and neg.dynamic_params(T(D, 1024), x) == ("x",)


def test_squeeze_and_unsqueeze_keep_the_dynamic_dim(rng):
    @pypto.jit
    def sq(x: T(D, 1, 8), out: T(D, 8, 1)):
        v = pypto.squeeze(x, 1)
        out[:] = pypto.unsqueeze(v * 2.0, 2)

    ck = sq.compile(T(D, 1, 8), T(D, 8, 1))
    for n in (1, 5, 2051):
        x = rng.standard_normal((n, 1, 8)).astype(np.float32)
        res = ck.simulate(x, np.zeros((n, 8, 1), np.float32))
        np.testing.assert_array_equal(res.outputs["out"], (x * 2.0).reshape(n, 8, 1))
    assert sq.cache_size == 1


def test_the_program_of_a_call_gives_the_same_bits_for_a_batched_matmul():
    """(make fuzz, 2026-12-03.)  A call on 2 batches runs the 4-batch program with two tasks left
    out; the program of the call alone computed the second batch's product one ulp apart (numpy
    summed a strided view of a padded tile in another order): factors are laid out alike now."""
    f16, f32 = pypto.DT_FP16, pypto.DT_FP32

    @pypto.jit
    def bmm(x1, x2: T(D, 16, 1, dtype=f16), out: T(D, 1, 1, dtype=f32)):
        out[:] = pypto.matmul(x1, x2, out_dtype=f32)

    rng = np.random.default_rng(0)
    rng.uniform(-2, 2, (1,))
    x1 = rng.uniform(-1, 1, (1, 16)).astype(np.float16)
    ck = bmm.compile(x1, T(D, 16, 1, dtype=f16), T(D, 1, 1, dtype=f32), machine="teach")
    for n in (1, 2):
        x2 = rng.uniform(-1, 1, (n, 16, 1)).astype(np.float16)
        out = np.zeros((n, 1, 1), np.float32)
        got = ck.simulate(x1, x2, out).outputs["out"]
        alone = run_program(ck.program_for(n), {"x1": x1, "x2": x2, "out": out.copy()}, machine=ck.machine,
                            mode="functional").outputs["out"]
        assert got.tobytes() == alone.tobytes(), (n, got.ravel(), alone.ravel())
