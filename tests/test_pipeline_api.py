"""The pass API users write against: OptimizationPass, CompilerPipeline, AutoTilingPass, DynamicScheduler."""
import numpy as np
import pytest

import pypto
from pypto.compiler import (PASSES, AutoTilingPass, CompilerPipeline, DynamicScheduler, OptimizationPass,
                            default_pipeline)
from pypto.ir.tensor import TNode


@pypto.jit
def softmax(x, out):
    out[:] = pypto.softmax(x)


@pytest.fixture
def xo():
    x = np.random.default_rng(0).random((64, 512), dtype=np.float32)
    return x, np.zeros_like(x)


class CustomFusionPass(OptimizationPass):
    """A user's fusion pass that leaves the graph as it is (no fusion groups at all)."""
    level = "tensor"

    def __init__(self):
        self.seen = 0

    def apply(self, graph):
        self.seen = len(graph.nodes)
        return graph


def test_the_seeds_three_entry_example_compiles_a_working_kernel(xo):
    fusion = CustomFusionPass()
    pipeline = CompilerPipeline([("fusion", fusion), ("tiling", AutoTilingPass(tile_size=128)),
                                 ("scheduling", DynamicScheduler())])
    ck = pipeline.compile(softmax, *xo)
    assert fusion.seen > 0                                 # the user's pass ran in place of 'fusion'
    assert [r.name for r in ck.pass_log] == pipeline.names
    res = ck.simulate(*xo)
    assert res.ok
    # tile_size=128 gave the ops tiles 128 elements wide
    assert {n.shape[-1] for n in ck.tile_graph.nodes if n.op == "TLOAD" and len(n.shape) == 2} <= {1, 128}


def test_entries_replace_builtins_by_name_or_join_their_level():
    class Nop(OptimizationPass):
        level = "tile"

        def apply(self, graph):
            return graph
    p = CompilerPipeline([("my_tile_pass", Nop())])
    names = p.names
    assert names.index("my_tile_pass") == names.index("allocate") + 1      # end of the tile level
    assert names.index("my_tile_pass") < names.index("partition")
    assert default_pipeline().names == [q.name for q in pypto.compiler.default_passes()]
    p.insert_before("allocate", "first", Nop()).insert_after("allocate", "second", Nop())
    assert p.names[p.names.index("allocate") - 1] == "first" and p.names[p.names.index("allocate") + 1] == "second"
    p.remove("first").replace("second", Nop())
    assert "first" not in p.names and "second" in p.names


def test_a_pass_at_the_wrong_level_or_a_missing_lowering_is_refused():
    class TilePass(OptimizationPass):
        level = "tile"

        def apply(self, graph):
            return graph
    with pytest.raises(pypto.PyptoError) as ei:
        default_pipeline().insert_before("fusion", "misplaced", TilePass())
    assert "'misplaced' works on the tile level" in str(ei.value) and "tensor level" in str(ei.value)
    with pytest.raises(pypto.PyptoError) as ei:
        default_pipeline().remove("tiling")
    assert "omits the lowering tensor->tile" in str(ei.value)
    with pytest.raises(pypto.PyptoError) as ei:
        default_pipeline().remove("nonexistent")
    assert "no pass named 'nonexistent'" in str(ei.value) and "expected" in str(ei.value)


def test_a_failing_user_pass_is_named_and_leaves_no_cache_entry(xo):
    class Broken(OptimizationPass):
        level = "tensor"

        def apply(self, graph):
            raise ValueError("oops")

    before = softmax.cache_size
    with pytest.raises(pypto.PyptoError) as ei:
        CompilerPipeline([("broken", Broken())]).compile(softmax, *xo)
    assert "pass 'broken' (tensor) failed: ValueError: oops" in str(ei.value)
    assert softmax.cache_size == before
    assert softmax.compile(*xo).simulate(*xo).ok          # the kernel still works


def test_the_pipeline_pauses_the_cyclic_gc_and_restores_it_on_any_exit(xo):
    import gc
    seen = []

    class Probe(OptimizationPass):
        level = "tensor"

        def __init__(self, fail=False):
            self.fail = fail

        def apply(self, graph):
            seen.append(gc.isenabled())
            if self.fail:
                raise ValueError("oops")
            return graph

    assert gc.isenabled()
    CompilerPipeline([("probe", Probe())]).compile(softmax, *xo)
    assert seen == [False] and gc.isenabled()
    with pytest.raises(pypto.PyptoError):
        CompilerPipeline([("probe", Probe(fail=True))]).compile(softmax, *xo)
    assert seen == [False, False] and gc.isenabled()
    gc.disable()                    # a caller that paused the GC itself keeps it paused
    try:
        CompilerPipeline([("probe", Probe()), ("tiling", AutoTilingPass(tile_size=64))]).compile(softmax, *xo)
        assert not gc.isenabled()
    finally:
        gc.enable()
    # the objects a compile leaves go to the oldest generation (no young collection walks them)
    # without unfreezing what a process froze itself
    gc.collect()
    ck = CompilerPipeline([("probe", Probe()), ("tiling", AutoTilingPass(tile_size=32))]).compile(softmax, *xo)
    assert any(o is ck.program for o in gc.get_objects(generation=2)) and gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        CompilerPipeline([("probe", Probe()), ("tiling", AutoTilingPass(tile_size=16))]).compile(softmax, *xo)
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_a_user_pass_that_breaks_the_graph_is_caught_by_the_verifier(xo):
    class Dangling(OptimizationPass):
        level = "tensor"

        def apply(self, graph):
            n = graph.nodes[-1]
            bad = TNode(n.id, n.op, (10_000,), n.shape, n.dtype, n.attrs, n.loc)
            return graph.replace(list(graph.nodes[:-1]) + [bad])

    with pytest.raises(pypto.VerificationError) as ei:
        CompilerPipeline([("dangling", Dangling())]).compile(softmax, *xo)
    assert "after pass 'dangling'" in str(ei.value) and "not defined before use" in str(ei.value)


def test_jit_with_a_pipeline(xo):
    calls = []

    class Count(OptimizationPass):
        level = "block"

        def apply(self, graph):
            calls.append(len(graph))
            return graph

    @pypto.jit(pipeline=CompilerPipeline([("count_tasks", Count())]))
    def k(x, out):
        out[:] = x * 2.0

    x, out = xo
    k(x, out)
    np.testing.assert_allclose(out, x * 2.0)
    assert calls and calls[0] > 0


def test_automatic_tiling_search_beats_or_matches_the_default(xo):
    x = np.random.default_rng(1).random((256, 2048), dtype=np.float32)
    out = np.zeros_like(x)
    auto = AutoTilingPass()
    searched = CompilerPipeline([("tiling", auto)]).compile(softmax, x, out)
    default = softmax.compile(x, out)
    r_auto, r_default = searched.simulate(x, out), default.simulate(x, out)
    assert r_auto.ok
    assert r_auto.cycles <= r_default.cycles
    tried = [c for _, c in auto.tried if c is not None]
    assert len(tried) >= 3 and min(tried) == r_auto.cycles   # the cost model's best is what runs


def test_the_tiling_search_runs_on_an_executor_with_progress():
    import concurrent.futures as cf
    from pypto.progress import listening
    x = np.random.default_rng(1).random((256, 2048), dtype=np.float32)
    out = np.zeros_like(x)
    here, events = AutoTilingPass(), []
    with listening(events.append):
        a = CompilerPipeline([("tiling", here)]).compile(softmax, x, out)
    with cf.ThreadPoolExecutor(2) as pool:
        there = AutoTilingPass(executor=pool)
        b = CompilerPipeline([("tiling", there)]).compile(softmax, x, out)
    assert there.tried == here.tried and a.program.text() == b.program.text()
    search = [e for e in events if e.what == "searching tile shapes"]
    assert search and search[0].unit == "candidates" and search[-1].closed
    assert sum(e.total for e in search if e.closed) == len(here.tried) == 18    # 17 vector tiles, then 1


def test_user_tile_shapes_are_kept_by_the_search(xo):
    @pypto.jit
    def k(x, out):
        pypto.set_vec_tile_shapes(16, 128)
        out[:] = x + 1.0

    auto = AutoTilingPass()
    ck = CompilerPipeline([("tiling", auto)]).compile(k, *xo)
    assert auto.tried == []                                 # nothing to choose
    assert all(g.tile == (16, 128) for g in ck.tile_graph.groups)


def test_builtin_passes_have_a_level_and_a_description():
    assert {"decompose", "fusion", "tiling", "allocate", "partition", "scheduling", "insert_sync",
            "codegen"} <= set(PASSES)
    for name, p in PASSES.items():
        assert p.level and p.doc and p.name == name


def test_options_turn_fusion_and_double_buffering_off(xo):
    @pypto.jit
    def k(x, out, *, TN: int = 512):
        pypto.set_vec_tile_shapes(8, TN)
        out[:] = pypto.softmax(x)

    x = np.random.default_rng(0).random((512, 512), dtype=np.float32)    # many tiles per core
    out = np.zeros_like(x)
    base = k.compile(x, out, machine="teach")
    unfused = k.compile(x, out, machine="teach", options={"fusion": False})
    single = k.compile(x, out, machine="teach", options={"double_buffer": False})
    assert len(base.tile_graph.groups) == 1 and len(unfused.tile_graph.groups) == 5
    assert {n.attrs["nbuf"] for n in single.tile_graph.nodes if "nbuf" in n.attrs} == {1}
    assert 2 in {n.attrs["nbuf"] for n in base.tile_graph.nodes if "nbuf" in n.attrs}
    cycles = {name: c.simulate(x, out) for name, c in (("base", base), ("unfused", unfused), ("single", single))}
    assert all(r.ok for r in cycles.values())
    assert cycles["base"].cycles < cycles["unfused"].cycles and cycles["base"].cycles < cycles["single"].cycles


def test_a_misspelt_option_is_an_error_naming_the_known_ones(xo):
    with pytest.raises(pypto.PyptoError, match="unknown compile option 'l1reuse'") as e:
        softmax.compile(*xo, options={"l1reuse": False})
    assert "l1_reuse" in e.value.expected and "core_assignment" in e.value.expected
    assert set(pypto.compiler.OPTIONS) >= {"fusion", "double_buffer", "l1_reuse", "core_assignment"}


def test_a_user_pass_may_read_options_of_its_own(xo):
    class ReadsOption(OptimizationPass):
        level = "tensor"
        seen = None

        def apply(self, graph, ctx):
            ReadsOption.seen = ctx.options.get("my_option")
            return graph

    CompilerPipeline([("reads_option", ReadsOption())]).compile(softmax, *xo, options={"my_option": 3})
    assert ReadsOption.seen == 3
