"""A matmul group at the Tile level is a loop (ir.tile.NodeLoop in a LoopTileGraph): tiling
makes the first output tile of each kind, assign_spaces and allocate decide on those, the
verifier checks them, and the nodes are made once, when first read.  These tests hold the
loop to the unrolled graph it stands for, and the verifier to what it must catch."""
from __future__ import annotations

import pytest

import pypto
from pypto.compiler import PASSES
from pypto.compiler.pipeline import PassContext
from pypto.errors import VerificationError
from pypto.ir.tile import LoopPart, LoopTileGraph, NodeLoop, TileGraph, _shape_of, verify

from common import matmul as mm      # (128x128 output tiles, 256-deep K chunks of 64-deep steps)

F16 = pypto.DT_FP16
T = pypto.Tensor


@pypto.jit
def mm_bias_relu(a, b, bias, c):
    pypto.set_cube_tile_shapes([128, 128], [64, 256], [128, 128])
    c[:] = pypto.relu(pypto.matmul(a, b) + bias)


def _tile_level(kern, args, options=None):
    """The graphs tiling, assign_spaces and allocate make, and the pass context."""
    ck = kern.compile(*args, options=options)
    ctx = PassContext(ck.machine, dict(options or {}))
    out = [PASSES["tiling"](ck.tensor_graph, ctx)]
    for name in ("assign_spaces", "eliminate_redundant_loads", "allocate"):
        out.append(PASSES[name](out[-1], ctx))
    return out, ctx


def _plain(g: TileGraph) -> TileGraph:
    return TileGraph(g.name, g.buffers, g.groups, tuple(g.nodes))


# tails in M, N and K; K walked both ways (L1 reuse); a bias row and a ReLU
SIZES = [((300, 520, 390), None), ((300, 520, 390), {"l1_reuse": False}), ((256, 256, 256), {"double_buffer": False})]


@pytest.mark.parametrize("sizes,options", SIZES, ids=["tails", "tails_no_l1_reuse", "single_buffer"])
@pytest.mark.parametrize("kern", [mm, mm_bias_relu], ids=["matmul", "bias_relu"])
def test_each_pass_makes_the_nodes_of_the_unrolled_graph(kern, sizes, options):
    m, k, n = sizes
    args = (T([m, k], F16), T([k, n], F16)) + ((T([n], F16),) if kern is mm_bias_relu else ()) + (T([m, n], F16),)
    graphs, ctx = _tile_level(kern, args, options)
    assert all(isinstance(g, LoopTileGraph) for g in graphs)
    plain = [graphs[0]]
    for name in ("assign_spaces", "eliminate_redundant_loads", "allocate"):
        plain.append(PASSES[name](_plain(plain[-1]), ctx))
    for loop_g, plain_g in zip(graphs, plain):
        assert not isinstance(plain_g, LoopTileGraph) or plain_g is graphs[0]
        assert loop_g.nodes == plain_g.nodes
        assert [x.attrs._dict for x in loop_g.nodes] == [x.attrs._dict for x in plain_g.nodes]
        assert len(loop_g) == len(plain_g.nodes)
    # the templates are the first outer iteration of each kind, one per kind the loop has
    loop = graphs[0].parts[0][0]
    outer = {}
    for x in graphs[0].nodes:
        outer.setdefault(x.outer, []).append(x)
    kinds = {}
    for o, nodes in outer.items():
        kinds.setdefault(_shape_of(nodes), o)
    # (the loop tells its kinds apart by K's direction and the tails in M and N: two of its kinds
    # may look alike, as with one K chunk, whose direction changes nothing)
    assert set(kinds.values()) <= {t[0].outer for t in loop.templates}
    assert len(loop.templates) <= 8


def test_the_nodes_are_made_once_when_first_read():
    graphs, ctx = _tile_level(mm, (T([512, 512], F16), T([512, 512], F16), T([512, 512], F16)))
    final = graphs[-1]
    for g in graphs:                    # tiling and the tile passes made no node of the loop
        assert "_nodes" not in g.__dict__
    verify(final, ctx.machine.capacities())
    assert "_nodes" not in final.__dict__
    assert len(final) == 4 * 4 * (2 * 2 + 3 * 8 + 1)    # 16 tiles of 2 K chunks (8 kL0 steps), 1 store
    assert final.nodes is final.nodes                   # made once
    assert type(final.replace()) is TileGraph and final.replace().nodes == final.nodes
    # a compile hands the made nodes on: the Block level's tasks read them
    ck = mm.compile(T([512, 512], F16), T([512, 512], F16), T([512, 512], F16))
    tiles = ck.levels["block"].tiles
    assert sum(len(t.nodes) for t in ck.levels["block"].tasks) == len(tiles.nodes) == 464


def _with_place(g: LoopTileGraph, place) -> LoopTileGraph:
    return g.with_parts([LoopPart(p[0], p[1], place) if isinstance(p, LoopPart) else p for p in g.parts])


def test_the_verifier_checks_every_copy_of_a_loops_slots():
    # one K chunk a tile and no L1 reuse: every tile's A panel is copy `tile index % 2` of its
    # slot, and the templates (the first tile: one kind) hold copy 0 only
    graphs, ctx = _tile_level(mm, (T([256, 128], F16), T([128, 256], F16), T([256, 256], F16)),
                              {"l1_reuse": False})
    final = graphs[-1]
    assert len(final.parts[0][0].templates) == 1
    caps = ctx.machine.capacities()
    verify(final, caps)
    place = final.parts[0][2]

    def bad(a, par):                    # copy 1 of the A panel's slot past the end of L1
        got = place(a, par)
        return got.replace(buf=caps["L1"]) if a["key"] == "a1" and par % 2 else got

    with pytest.raises(VerificationError, match="tile overflows L1"):
        verify(_with_place(final, bad), caps)
    # (made node by node, the same graph fails the same way)
    with pytest.raises(VerificationError, match="tile overflows L1"):
        verify(_plain(_with_place(final, bad)), caps)


def test_a_debug_verify_checks_each_outer_iteration_is_one_of_the_templates():
    graphs, ctx = _tile_level(mm, (T([300, 256], F16), T([256, 256], F16), T([300, 256], F16)))
    g = graphs[0]
    verify(g)                                           # (carries facts: the loop is checked too)
    loop = g.parts[0][0]

    def make(spaces, place, *rest):                     # tile 3's first node with another valid shape
        nodes = loop.make(spaces, place, *rest)
        at = next(k for k, n in enumerate(nodes) if n.outer == 3)
        nodes[at] = nodes[at].replace(valid=(1, 1))
        return nodes

    wrong = NodeLoop(loop.start, loop.count, loop.templates, loop.longest, loop.distinct_loads, make)
    bad = g.with_parts([LoopPart(wrong)]).noted(g.facts())
    with pytest.raises(VerificationError, match="outer iteration 3 of its loop is none of the loop's templates"):
        verify(bad)
    short = NodeLoop(loop.start, loop.count, loop.templates, loop.longest, loop.distinct_loads,
                     lambda *args: loop.make(*args)[1:] + loop.make(*args)[:1])
    with pytest.raises(VerificationError, match="does not make nodes"):
        verify(g.with_parts([LoopPart(short)]).noted(g.facts()))


@pytest.mark.parametrize("sizes,options", [((640, 520, 1030), None), ((640, 520, 1030), {"l1_reuse": False}),
                                           ((1024, 512, 1024), None)], ids=["tails", "no_l1_reuse", "even"])
@pytest.mark.parametrize("kern", [mm, mm_bias_relu], ids=["matmul", "bias_relu"])
def test_the_block_passes_read_the_loop_as_they_read_the_nodes(kern, sizes, options):
    from pypto.compiler.l1reuse import reused_loads
    m, k, n = sizes
    args = (T([m, k], F16), T([k, n], F16)) + ((T([n], F16),) if kern is mm_bias_relu else ()) + (T([m, n], F16),)
    graphs, ctx = _tile_level(kern, args, options)
    fast = [PASSES["partition"](graphs[-1], ctx)]
    for name in ("l1_reuse", "dependencies"):
        fast.append(PASSES[name](fast[-1], ctx))
    # partition, l1_reuse and dependencies made no node of the loop: the tasks say which they hold
    assert "_nodes" not in fast[-1].tiles.__dict__ and isinstance(fast[-1].tiles, LoopTileGraph)
    dup = reused_loads(fast[0])
    slow = [PASSES["partition"](_plain(_tile_level(kern, args, options)[0][-1]), ctx)]
    for name in ("l1_reuse", "dependencies"):
        slow.append(PASSES[name](slow[-1], ctx))
    assert dup == reused_loads(slow[0])
    if options is None:
        assert dup                              # (a matmul of several output tiles a task reuses panels)
    for f, s in zip(fast, slow):
        assert f.tasks == s.tasks
    # the nodes made at last, without the loads l1_reuse dropped, are the node-by-node graph's
    assert fast[-1].tiles.nodes == slow[-1].tiles.nodes
    assert len(fast[-1].tiles) == len(slow[-1].tiles.nodes)
    assert [x.attrs._dict for x in fast[-1].tiles.nodes] == [x.attrs._dict for x in slow[-1].tiles.nodes]


def test_the_text_of_a_loop_is_that_of_its_nodes_without_making_them():
    args = (T([640, 520], F16), T([520, 1030], F16), T([1030], F16), T([640, 1030], F16))
    graphs, ctx = _tile_level(mm_bias_relu, args)
    block = PASSES["l1_reuse"](PASSES["partition"](graphs[-1], ctx), ctx)
    texts = [g.text() for g in graphs + [block.tiles]]
    assert not any("_nodes" in g.__dict__ for g in graphs)       # (the Block level's drops: made)
    for g, text in zip(graphs + [block.tiles], texts):
        assert text == _plain(g).text() and g.text(full=True) == _plain(g).text(full=True)
        assert "more tile ops in 44 more outer iterations" in text       # (5 x 9 output tiles)


def test_tasks_split_by_a_pass_of_the_users_are_read_from_the_loop_or_node_by_node():
    from pypto.compiler.schedule import select_instructions
    from pypto.ir.block import Task
    args = (T([1024, 512], F16), T([512, 1024], F16), T([1024, 1024], F16))
    graphs, ctx = _tile_level(mm, args, {"l1_reuse": False})
    block = PASSES["partition"](graphs[-1], ctx)
    t0 = block.tasks[0]
    per = block.tiles.parts[0][0].per
    assert len(t0.outer) > 1
    for cut, from_loop in ((per, True), (per + 5, False)):        # at a tile's end, inside one
        head = Task(t0.id, t0.group, t0.core_type, t0.outer[:1], t0.nodes[:cut])
        tail = Task(len(block.tasks), t0.group, t0.core_type, t0.outer[1:], t0.nodes[cut:])
        split = block.replace([head, *block.tasks[1:], tail])
        assert (split.tiles.loop_tasks(split.tasks) is not None) == from_loop
        plain = split.replace(split.tasks)
        plain = type(plain)(plain.name, _plain(_tile_level(mm, args, {"l1_reuse": False})[0][-1]), plain.tasks)
        deps = PASSES["dependencies"](split, ctx)
        assert [t.deps for t in deps.tasks] == [t.deps for t in PASSES["dependencies"](plain, ctx).tasks]
        assert select_instructions(deps).text() == select_instructions(PASSES["dependencies"](plain, ctx)).text()
