"""The Block level's fast paths against plain versions of what they compute.

`reused_loads` (its replay takes a shortcut when a load's slot is exactly one held already),
`select_instructions` (operands found by slot, not by a hashed key; tuples by operand count;
attribute maps shared by value) and `Footprint.add_all` (boxes of many windows worked out in one
loop, `gm._boxes`) are checked here against straightforward re-computations on compiled kernels
and on windows of many layouts: any difference fails.
"""
import itertools
import random

import pytest

import pypto
from pypto.compiler.l1reuse import reused_loads
from pypto.compiler.reuse import load_key
from pypto.ir.exec import TileRef
from pypto.ir.block import BlockGraph, Task
from pypto.ir.core import Attrs
from pypto.ir.gm import Footprint, GMBuffer, GMRef, natural_strides
from pypto.ir.tile import GroupInfo, TileGraph, TileNode, tile_bytes
from pypto.target.isa import ATTRS

from common import mm_128 as mm, mm_bias_gelu_128 as mm_bias_gelu, softmax_16x128 as softmax

T, F16, F32 = pypto.Tensor, pypto.DT_FP16, pypto.DT_FP32


def _snapshots(kernel, *specs):
    return dict(kernel.compile(*specs, snapshots=True).snapshots)


CASES = [
    (mm, (T([512, 1024], F16), T([1024, 512], F16), T([512, 512], F16))),
    (mm, (T([300, 520], F16), T([520, 391], F16), T([300, 391], F16))),        # tail tiles
    (mm_bias_gelu, (T([256, 512], F16), T([512, 384], F16), T([1, 384], F16), T([256, 384], F16))),
    (softmax, (T([100, 700], F32), T([100, 700], F32))),
]


def _plain_reused_loads(g) -> dict:
    """`reused_loads` as a plain replay: every slot compared with every write."""
    nodes = g.tiles.by_id()
    dup = {}
    for t in g.tasks:
        held = {}                                   # space -> lo -> (hi, key, load id)
        for i in t.nodes:
            n = nodes[i]
            if n.op == "TSTORE":
                w = n.attrs["gm"]
                for slots in held.values():
                    for a in [a for a, (_, key, ld) in slots.items()
                              if key[0] == w.buf.name and nodes[ld].attrs["gm"].overlaps(w)]:
                        del slots[a]
                continue
            if not n.space or "buf" not in n.attrs:
                continue
            slots = held.setdefault(n.space, {})
            lo = n.attrs["buf"]
            hi = lo + tile_bytes(n.shape, n.dtype)
            if n.op == "TLOAD":
                have = slots.get(lo)
                if have is not None and have[:2] == (hi, load_key(n)):
                    dup[i] = have[2]
                    continue
            for a in [a for a, (b, _, _) in slots.items() if a < hi and lo < b]:
                del slots[a]
            if n.op == "TLOAD":
                slots[lo] = (hi, load_key(n), i)
    return dup


@pytest.mark.parametrize("kernel,specs", CASES, ids=lambda c: getattr(c, "name", ""))
def test_reused_loads_is_the_plain_replay(kernel, specs):
    g = _snapshots(kernel, *specs)["partition"]
    assert reused_loads(g) == _plain_reused_loads(g)


def test_reused_loads_sees_a_slot_overwritten_in_part_or_whole():
    # one task's UB: a window loaded, its slot rewritten whole, loaded again (kept), again (dropped
    # twice, a write elsewhere in between), rewritten in part, stored to: each write clears it
    x = GMBuffer("x", (64, 128), F32, "inout")
    w = GMRef.whole(x).window((16, 0), (16, 128))
    nbytes = tile_bytes((16, 128), F32)
    steps = [("TLOAD", 0, (16, 128)), ("TEXP", 0, (16, 128)), ("TLOAD", 0, (16, 128)),
             ("TLOAD", 0, (16, 128)), ("TEXP", nbytes, (16, 128)), ("TLOAD", 0, (16, 128)),
             ("TEXP", nbytes // 2, (8, 128)), ("TLOAD", 0, (16, 128)), ("TLOAD", 0, (16, 128)),
             ("TSTORE", None, (16, 128)), ("TLOAD", 0, (16, 128))]
    nodes = []
    for i, (op, buf, shape) in enumerate(steps):
        if op == "TSTORE":
            attrs, space, inputs = {"gm": w}, "", (i - 1,)
        else:
            attrs = {"gm": w, "buf": buf} if op == "TLOAD" else {"buf": buf}
            space, inputs = "UB", () if op == "TLOAD" else (i - 1,)
        nodes.append(TileNode(i, op, inputs, shape, shape, F32, space, 0, 0, 0, Attrs(attrs)))
    tiles = TileGraph("k", (x,), (GroupInfo(0, "vector", (64, 128), (16, 128), 1, 1),), tuple(nodes))
    g = BlockGraph("k", tiles, (Task(0, 0, "AIV", (0,), tuple(range(len(nodes)))),))
    assert reused_loads(g) == _plain_reused_loads(g) == {3: 2, 5: 2, 8: 7}


@pytest.mark.parametrize("kernel,specs", CASES, ids=lambda c: getattr(c, "name", ""))
def test_select_binds_the_operands_of_each_tile_op(kernel, specs):
    snaps = _snapshots(kernel, *specs)
    g, ex = snaps["wavefronts"], snaps["select"]
    nodes = g.tiles.by_id()
    made = {}

    def ref(j):
        n = nodes[j]
        return TileRef(n.space, n.attrs["buf"], n.dtype, n.shape, n.valid)

    for t, et in zip(g.tasks, ex.tasks):
        assert len(et.instrs) == len(t.nodes)
        for i, ins in zip(t.nodes, et.instrs):
            n = nodes[i]
            gm = n.attrs.get("gm")
            if n.op == "TLOAD":
                assert (ins.dst, ins.srcs) == (ref(i), (gm,))
                continue
            srcs = tuple(ref(j) for j in n.inputs)
            if n.op == "TSTORE":
                assert (ins.dst, ins.srcs) == (gm, srcs)
                continue
            kept = {k: v for k, v in n.attrs.items() if k in ATTRS}
            if "scalar" in n.attrs:
                srcs += (n.attrs["scalar"],)
            assert (ins.op, ins.dst, ins.srcs, dict(ins.attrs)) == (n.op, ref(i), srcs, kept)
            for r in (ins.dst, *ins.srcs):
                if isinstance(r, TileRef):          # equal operands are one object
                    assert made.setdefault(r, r) is r


def _windows(rng: random.Random) -> list:
    """Windows of many layouts: row-major, transposed, strided, 1-d and 3-d, some wrapping past
    their buffer's rows, some whose strides are no permutation of the buffer's (no box)."""
    bufs = [GMBuffer("a", (64, 48), F16, "input"), GMBuffer("b", (8, 16, 24), F32, "input"),
            GMBuffer("c", (4096,), F16, "output")]
    out = []
    for _ in range(400):
        buf = rng.choice(bufs)
        full = GMRef.whole(buf)
        shape = tuple(rng.randint(1, d) for d in buf.shape)
        offsets = [rng.randint(0, d - s) for d, s in zip(buf.shape, shape)]
        w = full.window(offsets, shape)
        kind = rng.random()
        if kind < 0.2 and len(shape) > 1:
            w = w.transpose(0, len(shape) - 1)
        elif kind < 0.3:
            w = full.window(offsets, shape, [2] * len(shape))       # strided: no box
        elif kind < 0.4 and len(shape) > 1:
            w = GMRef(buf, w.offset + rng.randint(0, 40), w.shape, w.strides)   # may wrap
        out.append(w)
        if rng.random() < 0.3:          # the same shape next, in another layout
            out.append(full.window(offsets, shape, [1] * (len(shape) - 1) + [2]))
    return out


def _fresh(ws):
    return [GMRef(w.buf, w.offset, tuple(w.shape), w.strides) for w in ws]


def test_boxes_of_many_windows_are_those_of_each():
    ws = _windows(random.Random(7))
    one_by_one = [w.box() for w in _fresh(ws)]
    batch = _fresh(ws)
    from pypto.ir.gm import _boxes
    assert _boxes(batch) == one_by_one
    assert [w.span() for w in batch] == [w.span() for w in _fresh(ws)]
    for w, box in zip(_fresh(ws), one_by_one):      # the plain rule, from the offset alone
        nat = natural_strides(w.buf.shape)
        assert box == w._compute_box()
        assert w.span() == (w.offset, w.offset + sum((s - 1) * st for s, st in zip(w.shape, w.strides)) + 1)
        if box is not None and len(nat) == 2:
            assert box[0][0] == w.offset // nat[0]


def test_footprint_of_many_windows_is_that_of_each():
    rng = random.Random(11)
    ws = _windows(rng)
    for k in (1, 3, 4, 17, 400):
        for part in (ws[:k], ws[-k:], rng.sample(ws, k)):
            a, b = Footprint(), Footprint()
            a.add_all(_fresh(part))
            for w in _fresh(part):
                b.add(w)
            assert (a.span, a.box) == (b.span, b.box)
            assert a.overlaps(b) == bool(part)
    # a footprint grown by several calls, windows known already or not
    a, b = Footprint(), Footprint()
    for lo, hi in itertools.pairwise([0, 5, 90, 200, 400]):
        a.add_all(ws[lo:hi])
        for w in _fresh(ws[lo:hi]):
            b.add(w)
    assert (a.span, a.box) == (b.span, b.box)
