"""`pypto.block`: the Block tier, tasks written by hand (`@pypto.jit(level="block")`).

A block-level kernel groups the `pypto.tile` instructions it traces into tasks, each a tile
program of its own run by one core type (MPMD):

    @pypto.jit(level="block")
    def k(x, rmax, out, *, TM: int = 16):
        for i in range(0, x.shape[0], TM):
            with pypto.block.task("AIV") as a:              # one task per iteration
                pypto.tile.tstore(rmax[i:i + TM, :], pypto.tile.trowmax(pypto.tile.tload(x[i:i + TM, :])))
        with pypto.block.task("AIV") as b:                  # loads what the tasks `a` stored
            ...
        b.after(a)                                          # a stated dependency (GM ones are found)

The tile ops of one task are one chain (one outer iteration of its group); the tasks of one
`with` statement that run the same instructions (the iterations of a loop) are one group.
A task depends on the earlier tasks whose GM windows it reads or writes over (in trace order,
the order of the numpy reference) and on those it is stated to run after; a stated dependency
on a later task reorders the two, and a cycle is an error at the `after` line.
`pair(cube_task, vec_a, vec_b)` runs the vector tasks on the two AIVs of the AIC that runs the
cube task (1 AIC : 2 AIV; `options={"pairing": False}` ignores it).

The pipeline runs the Tile-level passes (spaces, buffers) on the kernel's Tile Graph, then
lowers it to these tasks (`block_kernel`, instead of `partition`) with their dependencies.
"""
from __future__ import annotations

import dataclasses

from ..errors import UnsupportedError
from ..ir.block import BlockGraph, Task
from ..ir.core import topological_order
from ..ir.tile import TileGraph
from ..target import isa
from .tile import TileTrace, _probe
from .tracer import user_loc

CORE_TYPES = ("AIC", "AIV")


class TaskHandle:
    """One task of a block-level kernel (`with pypto.block.task("AIV") as t:`): its core type,
    its index in trace order, the line that opened it; `t.after(*tasks)` states dependencies."""

    def __init__(self, trace: "BlockTrace", index: int, core_type: str, loc):
        self._trace, self.index, self.core_type, self.loc = trace, index, core_type, loc
        self.ops: list[int] = []            # its tile ops (indices into the trace's ops)

    def __repr__(self):
        return f"<block task {self.index} on {self.core_type}>"

    def __enter__(self):
        self._trace.enter(self)
        return self

    def __exit__(self, kind, *exc):
        self._trace.leave(self, failed=kind is not None)

    def after(self, *tasks) -> "TaskHandle":
        """Run this task after `tasks` (handles, or lists of them: the tasks of a loop)."""
        loc = user_loc()
        for t in _flatten(tasks):
            self._trace.check_handle(t, "after", loc)
            self._trace.stated.append((t.index, self.index, loc))
        return self


def _flatten(items):
    for t in items:
        if isinstance(t, (list, tuple)):
            yield from _flatten(t)
        else:
            yield t


class BlockTrace(TileTrace):
    """The tile ops of a block-level kernel, each in the task that traced it."""

    _UNSIGNED = ("task",)       # (a group is the tasks of one `with`: `_signature`)

    def __init__(self, ctx):
        super().__init__(ctx)
        self.tasks: list[TaskHandle] = []
        self.task: TaskHandle | None = None          # the open task
        self.task_of: list[int] = []                 # op -> its task's index
        self.stated: list[tuple[int, int, object]] = []   # (before, after, line of .after)
        self.pairs: dict[int, tuple[int, int, object]] = {}   # vector task -> (cube task, slot, line)
        self.order: list[int] = []                   # final task id -> trace index

    @classmethod
    def current_block(cls, what: str) -> "BlockTrace":
        tr = TileTrace._stack[-1] if TileTrace._stack else None
        if not isinstance(tr, BlockTrace):
            raise UnsupportedError(f"pypto.block.{what} works only inside a @pypto.jit(level=\"block\") kernel",
                                   loc=user_loc(), expected='@pypto.jit(level="block")',
                                   got='a @pypto.jit(level="tile") kernel' if tr else "no block-level kernel",
                                   hint='decorate the kernel with @pypto.jit(level="block")')
        return tr

    def check_handle(self, t, what: str, loc) -> None:
        if not isinstance(t, TaskHandle) or t._trace is not self:
            raise UnsupportedError(f"pypto.block: {what} takes tasks of this kernel", loc=loc,
                                   expected='a task: with pypto.block.task("AIV") as t', got=repr(t)[:80])

    # --- tasks ---------------------------------------------------------------------------------
    def enter(self, t: TaskHandle) -> None:
        if self.task is not None:
            raise UnsupportedError("a task inside a task", loc=t.loc, expected="tasks one after another",
                                   got=f"a task opened inside task {self.task.index} (line {self.task.loc.line})")
        self.task = t

    def leave(self, t: TaskHandle, failed: bool) -> None:
        self.task = None
        if failed:
            return
        if not any(self.ops[k].op == "TSTORE" for k in t.ops):
            raise UnsupportedError(f"task {t.index} stores nothing", loc=t.loc,
                                   expected="a task that writes its results to GM with pypto.tile.tstore",
                                   got="no tstore in the task" if t.ops else "no tile instruction in the task",
                                   hint="tasks share no on-chip buffers: a result reaches another task through GM")

    # --- recording ---------------------------------------------------------------------------
    def add(self, op, inputs, shape, dtype, space, loc, value=None, win=None, **attrs):
        t = self.task
        if t is None:
            raise UnsupportedError(f"pypto.tile.{op.lower()} outside a task", loc=loc,
                                   expected='tile instructions inside `with pypto.block.task("AIV"):`',
                                   got="an instruction outside every task",
                                   hint="a block-level kernel is made of tasks; or write it at the tile level")
        for i in inputs:
            if self.task_of[i.id] != t.index:
                raise UnsupportedError(f"pypto.tile.{op.lower()} reads a tile of another task", loc=loc,
                                       expected="tiles of this task", got=f"a tile of task {self.task_of[i.id]}",
                                       hint="tasks share no on-chip buffers: tstore it in one task, tload it "
                                            "in the other")
        need = _core_of(op, space, inputs)
        if need is not None and need != t.core_type:
            what = "a vector instruction" if need == "AIV" else "a cube instruction"
            raise UnsupportedError(f"pypto.tile.{op.lower()} is {what}, and this task runs on an {t.core_type}",
                                   loc=loc, expected=f"instructions of an {t.core_type} core",
                                   got=f"{op} ({need})",
                                   hint=f"put it in a task on {need}: with pypto.block.task(\"{need}\")")
        k = len(self.ops)
        out = super().add(op, inputs, shape, dtype, space, loc, value=value, win=win, **attrs)
        self.task_of.append(t.index)
        if t.ops:
            self._union(k, t.ops[0])         # a task is one chain: one outer iteration of its group
        t.ops.append(k)
        return out

    def reloads_refused(self, name: str) -> list:
        """The open task's stores into `name` (tasks pass data through GM)."""
        if self.task is None:
            return []
        return [o.win for o in map(self.ops.__getitem__, self.task.ops) if o.op == "TSTORE" and o.win[0] == name]

    def _check_round_trips(self, group_of) -> None:
        """(the tasks are ordered by their GM windows themselves: `_ordered`)"""

    # --- the Tile Graph and the tasks --------------------------------------------------------
    def graph(self, g) -> TileGraph:
        """The Tile Graph, each node with the id of its task (`task` attr) in execution order."""
        self.order = self._ordered()
        final = {ix: tid for tid, ix in enumerate(self.order)}
        for k, o in enumerate(self.ops):
            o.attrs = {**o.attrs, "task": final[self.task_of[k]]}
        tg = super().graph(g)
        first: dict[int, object] = {}           # group -> its first node
        for n in tg.nodes:
            first.setdefault(n.group, n)
        for info in tg.groups:
            t = self.tasks[self.order[first[info.id].attrs["task"]]]
            if info.core_type != t.core_type:
                raise UnsupportedError(f"task {t.index} on {t.core_type} has no "
                                       f"{'matmul' if t.core_type == 'AIC' else 'vector work'}", loc=t.loc,
                                       expected="an AIC task around tmatmul; AIV tasks for vector instructions",
                                       got=f"a {info.kind} chain")
        return tg

    def _signature(self, members):
        sig = super()._signature(members)
        t = self.tasks[self.task_of[members[0]]]
        return (t.core_type, t.loc.file, t.loc.line, sig)    # a group: the tasks of one `with`

    def _ordered(self) -> list[int]:
        """The tasks in execution order: trace order, except where a stated dependency or a pair
        puts a later task first; a cycle is an error at the line of the edge that closes it."""
        n = len(self.tasks)
        if not n:
            raise UnsupportedError("a block-level kernel without tasks", loc=user_loc(),
                                   expected='with pypto.block.task("AIV"): ... around its tile instructions',
                                   got="no task")
        edges: dict[int, dict[int, object]] = {i: {} for i in range(n)}     # before -> after -> line (None: GM)
        reads, writes = [], []
        for t in self.tasks:
            r, w = [], []
            for k in t.ops:
                o = self.ops[k]
                if o.win is not None:
                    (w if o.op == "TSTORE" else r).append(_probe(self, *o.win))
            reads.append(r)
            writes.append(w)
        for b in range(n):
            for a in range(b):
                if _meet(writes[a], reads[b]) or _meet(writes[a], writes[b]) or _meet(reads[a], writes[b]):
                    edges[a].setdefault(b, None)
        for a, b, loc in self.stated:
            edges[a][b] = loc
        for v, (c, _, loc) in self.pairs.items():
            edges[c].setdefault(v, loc)
        order = topological_order(edges)
        if len(order) < n:
            self._cycle(edges, set(range(n)) - set(order))
        return order

    def _cycle(self, edges, left: set[int]):
        preds = {b: [a for a in left if b in edges[a]] for b in left}
        path, at = [], min(left)
        while at not in path:
            path.append(at)
            at = next(a for a in preds[at] if a in left)
        cycle = path[path.index(at):][::-1]                  # each task runs after the one before it
        hops = list(zip(cycle, cycle[1:] + cycle[:1]))
        loc = next((edges[a][b] for a, b in hops if edges[a][b] is not None), None)
        text = " -> ".join(f"task {t} (line {self.tasks[t].loc.line})" for t in cycle + cycle[:1])
        raise UnsupportedError("the tasks' dependencies form a cycle", loc=loc, expected="dependencies without a cycle",
                               got=text, hint="a task runs after the tasks whose GM data it reads (in trace order) "
                                              "and after those it is stated to follow: drop one of the stated ones")

    # --- the pipeline ------------------------------------------------------------------------
    def pipeline(self, pipeline, tile_graph: TileGraph):
        """The tile-level pipeline with `partition` replaced by these tasks and `dependencies` by
        theirs (GM ones between any two tasks, and the stated ones)."""
        from ..compiler.pipeline import Pass, Pipeline
        stated: dict[int, set[int]] = {}
        final = {ix: tid for tid, ix in enumerate(self.order)}
        for a, b, _ in self.stated:
            stated.setdefault(final[b], set()).add(final[a])
        pairs = {final[v]: (final[c], slot) for v, (c, slot, _) in self.pairs.items()}
        core = {final[t.index]: t.core_type for t in self.tasks}
        passes = []
        for p in super().pipeline(pipeline, tile_graph).passes:
            if p.level == "tile->block":
                p = Pass("block_kernel", "tile->block", lambda g, ctx: _tasks(g, ctx, core, pairs),
                         "the tasks the block-level kernel wrote (no partitioning)")
            elif p.name == "dependencies":
                p = Pass("dependencies", "block", lambda g, ctx: _dependencies(g, ctx, stated),
                         "task dependencies from the GM regions tasks read and write, and the stated ones")
            passes.append(p)
        return Pipeline(passes)


def _meet(xs, ys) -> bool:
    return any(a.overlaps(b) for a in xs for b in ys)


def _core_of(op: str, space: str, inputs) -> str | None:
    """The core type an instruction needs (None: either)."""
    if op == "TLOAD":
        return "AIV" if space == "UB" else "AIC"
    if op == "TSTORE":
        return "AIC" if inputs and inputs[0].space == "L0C" else "AIV"
    if op in isa.SYNC_OPS:
        return None
    pipe = isa.pipe_of(op)
    return "AIV" if pipe == "V" else "AIC" if pipe in ("M", "MTE1", "FIX") else None


def _tasks(g: TileGraph, ctx, core: dict[int, str], pairs) -> BlockGraph:
    """Tile -> Block: one task per `task` attr, its nodes in program order."""
    by_task: dict[int, list] = {}
    for n in g.nodes:
        by_task.setdefault(n.attrs["task"], []).append(n)
    pairing = ctx is None or ctx.options.get("pairing", True)
    tasks = [Task(tid, ns[0].group, core[tid], (ns[0].outer,), tuple(n.id for n in ns),
                  pair=pairs.get(tid) if pairing else None)
             for tid, ns in sorted(by_task.items())]
    return BlockGraph(g.name, g, tuple(tasks))


def _dependencies(g: BlockGraph, ctx, stated: dict[int, set[int]]) -> BlockGraph:
    from ..compiler.partition import dependencies
    alone = dependencies(g.replace([dataclasses.replace(t, group=-1 - t.id) for t in g.tasks]), ctx)
    return g.replace([dataclasses.replace(t, deps=tuple(sorted(set(f.deps) | stated.get(t.id, set()))))
                      for t, f in zip(g.tasks, alone.tasks)])


# ---------------------------------------------------------------------------------------------
# the public functions

def task(core_type: str = "AIV") -> TaskHandle:
    """A task on `core_type` ("AIV": vector, "AIC": cube): `with pypto.block.task("AIV") as t:`
    makes the tile instructions traced inside it one task."""
    tr = BlockTrace.current_block("task")
    loc = user_loc()
    if core_type not in CORE_TYPES:
        raise UnsupportedError(f"a task on {core_type!r}", loc=loc, expected="'AIV' (vector) or 'AIC' (cube)",
                               got=repr(core_type))
    t = TaskHandle(tr, len(tr.tasks), core_type, loc)
    tr.tasks.append(t)
    return t


def pair(cube_task: TaskHandle, *vector_tasks: TaskHandle) -> None:
    """Run `vector_tasks` (one or two AIV tasks) on the AIVs paired with the AIC that runs
    `cube_task` (slots 0 and 1 of the 1 AIC : 2 AIV pair)."""
    tr = BlockTrace.current_block("pair")
    loc = user_loc()
    for t in (cube_task, *vector_tasks):
        tr.check_handle(t, "pair", loc)
    if cube_task.core_type != "AIC":
        raise UnsupportedError("pair: the first task is the cube task", loc=loc, expected="an AIC task",
                               got=f"task {cube_task.index} on {cube_task.core_type}")
    if not 1 <= len(vector_tasks) <= 2:
        raise UnsupportedError("pair: an AIC has two AIVs", loc=loc, expected="one or two vector tasks",
                               got=f"{len(vector_tasks)} tasks")
    for slot, v in enumerate(vector_tasks):
        if v.core_type != "AIV":
            raise UnsupportedError(f"pair: task {v.index} is not a vector task", loc=loc, expected="an AIV task",
                                   got=f"task {v.index} on {v.core_type}")
        if v.index in tr.pairs:
            raise UnsupportedError(f"pair: task {v.index} is paired already", loc=loc,
                                   expected="each vector task in one pair",
                                   got=f"paired with task {tr.pairs[v.index][0]}")
        tr.pairs[v.index] = (cube_task.index, slot, loc)


__all__ = ["TaskHandle", "pair", "task"]
