"""Block -> Execution lowering and the Execution-level pipeline: pipe binding (`select`),
scheduling (listsched.py), sync insertion (sync.py), buffer pressure (pressure.py), codegen."""
from __future__ import annotations

from ..ir.block import BlockGraph
from ..ir.core import Attrs
from ..ir.exec import ExecGraph, carry_streams, ExecTask, Instr, TileRef, pipe_of
from ..ir.program import Program
from ..target.isa import ATTRS, SYNC_OPS, gm_access
from .listsched import DynamicScheduler
from .pipeline import Pass, PassContext
from .pressure import BUFFER_PRESSURE
from .sync import insert_sync


def select_instructions(g: BlockGraph, ctx: PassContext | None = None) -> ExecGraph:
    nodes = g.tiles.by_id()
    refs: dict[int, TileRef] = {}           # node id -> the tile it produces, as an operand
    interned: dict[tuple, TileRef] = {}     # equal operands share one object (cheap to cache on)
    # space -> buf -> the last operand made there: a node of its shape, valid shape and dtype
    # object takes it without building a key of tuples to hash (its dtype's hash is a Python
    # `__hash__`); any other goes through `interned`
    placed: dict[str, dict[int, TileRef]] = {}

    def ref(n) -> TileRef:
        key = (n.space, n.attrs._dict["buf"], n.dtype, n.shape, n.valid)
        got = interned.get(key)
        if got is None:
            got = interned[key] = TileRef(*key)
        refs[n.id] = got
        at = placed.get(key[0])
        if at is None:
            at = placed[key[0]] = {}
        at[key[1]] = got
        return got

    ref_of = refs.__getitem__
    # per (op, attribute names), worked out once: (how its GM window is an operand, its pipe,
    # the names the instruction keeps in their order, whether one is a scalar operand, the name
    # when it keeps that one only and not a scalar, the `shared` entry of that name)
    plans: dict[tuple, tuple] = {}
    keep = set(ATTRS) | {"scalar"}
    empty = Attrs()                     # one shared by every instruction that keeps none
    of = Attrs.of                       # (the dicts built here are handed over, never changed)
    make = Instr._make                  # (op, pipe, dst, srcs, attrs, loc), all given
    # name -> value -> the Attrs of an instruction keeping that one name (not "scalar": a
    # TEXTRACT's offsets), shared by the instructions with that value when it is an int or a
    # flat tuple of ints (a value equal to one of other types (1.0, True, a numpy int) prints
    # differently: not shared)
    shared: dict[str, dict] = {}
    # equal on-chip instructions are one object (a matmul's extracts and MACs repeat from output
    # tile to output tile; a 4096x8192x4096 matmul: 228k instructions, 2k distinct), keyed on
    # the identities of their parts, which are interned (`made` keeps them alive)
    made: dict[tuple, Instr] = {}
    tasks = []
    for t in g.tasks:
        instrs = []
        append = instrs.append
        for i in t.nodes:
            n = nodes[i]
            op = n.op
            d = n.attrs._dict
            plan = plans.get((op, tuple(d)))     # ((op, *d) builds a list first: slower)
            if plan is None:
                plan = plans[(op, tuple(d))] = _plan(op, d, keep, shared)
            kind, pipe, kept, scalar, one, same = plan
            # its tile, made an operand here (a task's ops come in program order: its operands'
            # are made first); None for a store or a flag (`dst or refs[i]`: a KeyError for any
            # other op without a tile, as for a missing operand)
            space = n.space
            if space:
                at = placed.get(space)
                dst = None if at is None else at.get(d["buf"])
                if dst is None or dst.dtype is not n.dtype or dst.shape != n.shape or dst.valid != n.valid:
                    dst = ref(n)
                else:
                    refs[i] = dst
            else:
                dst = None
            if kind == "flag":      # a tile-level kernel's own flag (pypto.tile.set_flag / wait_flag)
                append(make(op, d["src"] if op == "SET_FLAG" else d["dst"], None, (),
                            Attrs({k: d[k] for k in ("src", "dst", "event")}), n.loc))
                continue
            # its operands (by count: a tuple of a few subscripts, not of a `map`)
            inputs = n.inputs
            try:
                count = len(inputs)
                if count == 1:
                    srcs = (refs[inputs[0]],)
                elif count == 2:
                    srcs = (refs[inputs[0]], refs[inputs[1]])
                elif count == 3:
                    srcs = (refs[inputs[0]], refs[inputs[1]], refs[inputs[2]])
                else:
                    srcs = tuple(map(ref_of, inputs)) if count else ()
            except KeyError:        # an operand not made yet (its op later in the task)
                srcs = tuple([refs[j] if j in refs or not nodes[j].space else ref(nodes[j]) for j in inputs])
            if one is not None:
                v = d[one]
                c = v.__class__
                if c is int or c is tuple and (len(v) == 2 and v[0].__class__ is int and v[1].__class__ is int
                                               or _INTS.issuperset(map(type, v))):
                    a = same.get(v)
                    if a is None:
                        a = same[v] = of({one: v})
                else:
                    a = of({one: v})
            elif not kept:
                a = empty
            else:
                a = {k: d[k] for k in kept}
                if scalar:
                    srcs += (a.pop("scalar"),)
                a = of(a)
            if kind == "tile":
                dst = dst or refs[i]
                k = (op, id(dst), id(a), id(n.loc), *map(id, srcs))
                ins = made.get(k)
                if ins is None:
                    ins = made[k] = make(op, pipe, dst, srcs, a, n.loc)
            elif kind == "load":
                ins = make("TLOAD", "MTE2", dst or refs[i], (d["gm"],), a, n.loc)
            elif kind == "store":
                ins = make("TSTORE", pipe_of("TSTORE", srcs[0].space), d["gm"], srcs, a, n.loc)
            elif kind == "read":     # MGATHER: dst <- GM window, index tile
                ins = make(op, pipe, dst or refs[i], (d["gm"],) + srcs, a, n.loc)
            else:                    # "write", MSCATTER: GM window <- values, index tile
                ins = make(op, pipe, d["gm"], srcs, a, n.loc)
            append(ins)
        tasks.append(ExecTask(t.id, t.group, t.core_type, t.deps, t.level, tuple(instrs), t.pair))
    return ExecGraph(g.name, g.tiles.buffers, tuple(tasks))


_INTS = frozenset([int])


def _plan(op: str, d: dict, keep: set, shared: dict) -> tuple:
    """How `select_instructions` turns a tile op with these attribute names into an instruction:
    (how its GM window is an operand, its pipe, the names it keeps, whether one is "scalar", the
    name when it keeps that one only and it is not "scalar", and then `shared`'s dict of the
    Attrs of that name by value)."""
    acc = gm_access(op)
    kind = "load" if op == "TLOAD" else "store" if op == "TSTORE" else acc or (
        "flag" if op in SYNC_OPS else "tile")
    pipe = None if op == "TSTORE" else "MTE2" if op == "TLOAD" else pipe_of(op)
    kept = tuple(k for k in d if k in keep)
    scalar = "scalar" in kept
    one = kept[0] if len(kept) == 1 and not scalar else None
    return kind, pipe, kept, scalar, one, None if one is None else shared.setdefault(one, {})


def codegen(g: ExecGraph, ctx: PassContext | None = None) -> Program:
    program = Program(g.name, g.buffers, g.tasks)
    carry_streams(g, program)           # isomorphic task streams: the simulator decodes each shape once
    # the Execution level's verifier and the compiler's construction vouch for it: the simulator
    # need not re-check it as it checks hand-written programs
    program.__dict__["_verified_for"] = {ctx.machine} if ctx is not None else set()
    return program


SELECT = Pass("select", "block->exec", select_instructions, "bind every tile op to a pipe with resolved operands")
EXEC_PASSES = [
    DynamicScheduler().as_pass("scheduling"),
    Pass("insert_sync", "exec", insert_sync, "SET_FLAG/WAIT_FLAG between pipes where data or buffers are shared"),
    BUFFER_PRESSURE,
]
CODEGEN = Pass("codegen", "exec->pto", codegen, "emit the PTO program")
