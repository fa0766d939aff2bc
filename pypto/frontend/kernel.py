"""A compiled kernel: the five levels, the pass log, per-pass diffs, and simulation against a
numpy reference.

It lives in the frontend, above both the compiler (which made it) and the simulator (which it
runs).  Drawing is viz's: `PassDiff._repr_html_` and `PassDiff.graph` import it lazily, the only
upward imports of this module (allowed in tests/test_layering.py)."""
from __future__ import annotations

import collections
import difflib
import html
import re
from dataclasses import dataclass, field

import numpy as np

from ..compiler.dynamic import DynamicInfo
from ..compiler.pipeline import PassLog
from ..errors import KernelSignatureError, PyptoError
from ..gcpause import gc_paused
from ..ir.block import BlockGraph
from ..ir.exec import ExecGraph, item_lines
from ..ir.program import Program
from ..ir.tensor import TensorGraph
from ..ir.numerics import output_bounds, within_bound
from ..ir.tensor_eval import evaluate
from ..ir.tile import TileGraph
from ..progress import stage
from ..sim.result import SimResult
from ..sim.run import simulate as run_sim
from ..sim.run import no_step, steps as sim_steps
from ..target.machine import Machine
from . import profiling


@dataclass
class CompiledKernel:
    name: str
    machine: Machine
    consts: dict
    traced: TensorGraph             # as traced, before any pass
    tensor_graph: TensorGraph
    tile_graph: TileGraph
    block_graph: BlockGraph
    exec_graph: ExecGraph
    program: Program
    pass_log: PassLog
    snapshots: list | None = None
    kernel: object = field(default=None, repr=False)   # the JitKernel it came from
    # a kernel with pypto.DYNAMIC dims: its levels are those of one chunk of rows, and
    # `program_for(n)` is the program of a call on n rows (see pypto.compiler.dynamic)
    dynamic: DynamicInfo | None = None
    options: dict = field(default_factory=dict)        # the compile options it was compiled with
    _instances: dict = field(default_factory=dict, repr=False)

    @property
    def levels(self) -> dict:
        return {"tensor": self.tensor_graph, "tile": self.tile_graph, "block": self.block_graph,
                "exec": self.exec_graph, "pto": self.program}

    @property
    def params(self):
        return self.traced.params

    def bind(self, args) -> dict[str, np.ndarray]:
        """Map positional arrays to parameter names, checking shapes and dtypes (of a dynamic
        kernel: its static dims, and one size for every dynamic dim)."""
        params = self.traced.params
        if len(args) != len(params):
            raise KernelSignatureError(
                f"{self.name} takes {len(params)} tensor arguments",
                expected=", ".join(p.name for p in params), got=f"{len(args)} arguments")
        out = {}
        dyn = self.dynamic.params if self.dynamic else ()
        size = None
        for p, a in zip(params, args):
            a = as_array(a)
            if p.name in dyn and a.ndim == len(p.shape) and a.dtype == p.dtype.np_dtype \
                    and tuple(a.shape[1:]) == p.shape[1:]:
                if size is not None and a.shape[0] != size[1]:
                    raise KernelSignatureError(
                        f"the dynamic dims of {self.name}'s arguments differ", expected=(
                            f"one size N for every pypto.DYNAMIC dim ({', '.join(dyn)})"),
                        got=f"{size[0]} has {size[1]} rows, {p.name} has {a.shape[0]}")
                size = size or (p.name, a.shape[0])
                out[p.name] = a
                continue
            if p.name in dyn:
                raise KernelSignatureError(
                    f"argument '{p.name}' differs from the one {self.name} was compiled for",
                    expected=f"{p.dtype}[N,{','.join(map(str, p.shape[1:]))}]", got=f"{a.dtype}{list(a.shape)}")
            if tuple(a.shape) != p.shape or a.dtype != p.dtype.np_dtype:
                raise KernelSignatureError(
                    f"argument '{p.name}' differs from the one {self.name} was compiled for",
                    expected=f"{p.dtype}{list(p.shape)}", got=f"{a.dtype}{list(a.shape)}")
            out[p.name] = a
        return out

    def reference(self, *args) -> dict[str, np.ndarray]:
        """The kernel's outputs computed by the numpy reference interpreter of the Tensor level
        (of a dynamic kernel: the kernel traced at the arguments' size, not in chunks)."""
        arrays = self.bind(args)
        with np.errstate(all="ignore"):
            return evaluate(self.traced_for(self._size(arrays)), arrays)

    # --- dynamic dims ------------------------------------------------------------------------
    def _size(self, arrays) -> int | None:
        if self.dynamic is None:
            return None
        return arrays[self.dynamic.params[0]].shape[0]

    def traced_for(self, n: int | None) -> TensorGraph:
        """The Tensor Graph as traced (of a dynamic kernel: traced at n rows, what a call on n
        rows must compute, the reference and the honest check's bounds)."""
        if n is None or self.dynamic is None:
            return self.traced
        key = ("traced", n)
        got = self._instances.get(key)
        if got is None:
            from .tracer import Tensor
            specs = [Tensor((n,) + p.shape[1:] if p.name in self.dynamic.params else p.shape, p.dtype, p.name)
                     for p in self.traced.params]
            got = self._remember(key, self.kernel._trace(specs, self.consts, machine=self.machine))
        return got

    def program_for(self, n: int) -> Program:
        """The program of a call on n rows of the dynamic dim (`compiler.dynamic.instantiate` of
        `pieces_for(n)`); kept for the last few sizes."""
        if self.dynamic is None:
            return self.program
        key = ("program", self._rows(n))
        got = self._instances.get(key)
        if got is None:
            got = self._remember(key, self._instantiate(n, self.pieces_for(n)))
        return got

    def pieces_for(self, n: int) -> list[tuple[int, int]]:
        """The runs (first row, rows of the program) of a call on n rows: where the rows past the
        last whole chunk may run as one program that covers them or as several smaller ones
        (`DynamicInfo.plans`), the plan the timing model finds faster on those rows alone
        (fewer runs on a tie); the choice is kept per number of rows left."""
        n = self._rows(n)
        plans = self.dynamic.plans(n)
        if len(plans) == 1:
            return plans["cover"]
        c = self.dynamic.chunk
        rest, base = n % c, n - n % c
        key = ("plan", rest)
        best = self._instances.get(key)
        if best is None:
            def cycles(name):
                tail = [(start - base, rows) for start, rows in plans[name] if start >= base]
                prog = self._instantiate(rest, tail)
                return run_sim(prog, {}, machine=self.machine, mode="timing", trace=False,
                               progress=False).cycles, len(tail)
            best = self._remember(key, min(plans, key=cycles))
        return plans[best]

    def _rows(self, n) -> int:
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise KernelSignatureError(f"the size of {self.name}'s dynamic dim must be a positive integer",
                                       expected="size=N >= 1", got=repr(n))
        return int(n)

    def _instantiate(self, n: int, pieces) -> Program:
        from ..compiler.dynamic import instantiate
        return instantiate(self.dynamic, n, self.machine.n_aic, self.machine.n_aiv, pieces)

    def _remember(self, key, value):
        while len(self._instances) >= 16:
            self._instances.pop(next(iter(self._instances)))
        self._instances[key] = value
        return value

    def _padded(self, arrays: dict, n: int) -> dict:
        """The arrays of a call on n rows with the dynamic ones padded (zeros) to whole chunks."""
        rows = self.dynamic.padded(self.pieces_for(n))
        out = {}
        for name, a in arrays.items():
            if name in self.dynamic.params and rows != n:
                p = np.zeros((rows,) + a.shape[1:], a.dtype)
                p[:n] = a
                a = p
            out[name] = a
        return out

    def simulate(self, *args, machine=None, mode: str = "full", check: bool = True,
                 checked: bool = False, trace: bool = True, engine: str = "auto",
                 size: int | None = None) -> SimResult:
        """Simulate on a machine (default: the one compiled for).

        `check` compares the outputs with the numpy reference of the kernel (within the error
        bound of every step's rounding, see `pypto.ir.numerics`) and, in "full" mode, looks for
        races between pipes and tasks on the simulated times (`res.races`); both decide `res.ok`.
        `checked` runs the simulator's checked mode (races, uninitialised reads, event reuse
        raise SimulationError);
        `engine` picks the timing engine (see `pypto.sim.simulate`).
        A kernel with a pypto.DYNAMIC dim runs `program_for(N)` for the arrays' size N (or, in
        timing mode without arrays, for `size=N`).
        """
        if profiling.collecting():      # inside a pypto.profile() block: this run is recorded
            return profiling.watch(self, "simulate", lambda: self.simulate(
                *args, machine=machine, mode=mode, check=check, checked=checked, trace=trace, engine=engine,
                size=size), args=args, size=size)
        if machine is not None and machine != self.machine.name and machine != self.machine:
            return self.recompile(args, machine).simulate(*args, mode=mode, check=check, checked=checked,
                                                          trace=trace, engine=engine, size=size)
        # the steps of the call as a progress stage: a bar on stderr after a second (a 4096^3
        # matmul takes seconds, most of them the check), the explorer's busy bar in a notebook
        checking = check and mode != "timing"
        races = check and not checked and mode == "full"
        bar = stage(f"{'simulating and checking' if checking else 'simulating'} {self.name}",
                    sim_steps(mode, checked, races) + 3 * checking, "steps")
        step = _Steps(bar)
        try:
            with gc_paused():       # plans, traces and references: many small objects, no cycles
                res = self._simulate(args, mode, checking, checked, races, trace, engine, size, step)
        finally:
            bar.close(step.done)
        res.compiled = self     # what res.advise() recompiles
        return res

    def _simulate(self, args, mode, check, checked, races, trace, engine, size, step) -> SimResult:
        """`simulate`'s work: `check` the numpy check (of a mode with values), `races` the race
        search on the simulated times (a full mode's, unless checked mode raises on them)."""
        if self.dynamic is not None:
            return self._simulate_dynamic(args, mode, check, checked, races, trace, engine, size, step)
        if size is not None:
            raise KernelSignatureError(f"{self.name} has no dynamic dim: size= does not apply",
                                       expected="no size=", got=f"size={size}")
        arrays = self.bind(args) if mode != "timing" else {}
        res = run_sim(self.program, arrays, machine=self.machine, mode=mode, check=checked, trace=trace,
                      engine=engine, races=races, step=step)
        if check:
            res.check = compare(res.outputs, self.bind(args), self.traced, step)
        return res

    def _simulate_dynamic(self, args, mode, check, checked, races, trace, engine, size, step) -> SimResult:
        """`simulate` of a dynamic kernel on n rows: the values by the compiled program run on
        each chunk of rows in turn (chunks are independent: one functional plan serves every
        call), the times by the program of the call (`program_for(n)`: the chunks' tasks
        dispatched over the cores together)."""
        arrays = self.bind(args) if args or mode != "timing" else {}
        n = self._size(arrays) if arrays else size
        if n is None:
            raise KernelSignatureError(
                f"{self.name} has a dynamic dim: its size comes from the arrays or from size=",
                expected="ck.simulate(*arrays) or ck.simulate(mode='timing', size=N)", got="neither")
        if arrays and size is not None and size != n:
            raise KernelSignatureError(f"size={size} differs from the arrays' dynamic dim", expected=n, got=size)
        program = self.program_for(n)
        if mode == "timing" or mode == "full":
            res = run_sim(program, {}, machine=self.machine, mode="timing", check=checked, trace=trace,
                          engine=engine, races=races, step=step)
        else:
            res = SimResult(self.name, self.machine, None, program=program)
        res.size = f"{self.dynamic.symbol} = {n} row{'s' if n != 1 else ''}"
        if mode != "timing":
            step("values")
            res.outputs = self._chunked_outputs(arrays, n, checked)
            if check:
                res.check = compare(res.outputs, arrays, self.traced_for(n), step)
        return res

    def _chunked_outputs(self, arrays: dict, n: int, checked: bool) -> dict:
        """The outputs of a call on n rows: each piece of rows (`DynamicInfo.pieces`) run
        functionally by its program, the last one padded with zero rows."""
        dyn = self.dynamic.params
        padded = self._padded(arrays, n)
        outs: dict[str, list] = {}
        for start, rows in self.pieces_for(n):
            part = {k: a[start:start + rows] if k in dyn else a for k, a in padded.items()}
            got = run_sim(self.dynamic.programs[rows], part, machine=self.machine, mode="functional",
                          check=checked).outputs
            for k, v in got.items():
                outs.setdefault(k, []).append(v)
        return {k: np.concatenate(v)[:n] if k in dyn else v[-1] for k, v in outs.items()}

    def diff(self, pass_name: str | int, context: int = 3) -> "PassDiff":
        """What one pass changed: the unified diff of its level's text before and after it, and
        the node descriptions it added and removed (see `PassDiff`).

        `pass_name` names a pass of `pass_log` (the first one of that name), or is its index
        there.  Needs the snapshots kept by `compile(..., snapshots=True)` or
        `@pypto.jit(debug=True)`.
        """
        names = [r.name for r in self.pass_log]
        if isinstance(pass_name, int) and not isinstance(pass_name, bool):
            if not -len(names) <= pass_name < len(names):
                raise PyptoError(f"no pass #{pass_name} in the pass log of {self.name}",
                                 expected=f"an index below {len(names)} or a name: {', '.join(names)}",
                                 got=pass_name)
            k = pass_name % len(names)
        elif pass_name in names:
            k = names.index(pass_name)
        else:
            raise PyptoError(f"no pass named {pass_name!r} ran when compiling {self.name}",
                             expected="one of " + ", ".join(names), got=repr(pass_name))
        if not self.snapshots:
            raise PyptoError(
                f"{self.name} was compiled without snapshots, so what a pass changed is not known",
                expected="a kernel compiled with kernel.compile(..., snapshots=True) "
                         "or decorated with @pypto.jit(debug=True)",
                got="snapshots=None")
        name, after = self.snapshots[k]
        before = self.traced if k == 0 else self.snapshots[k - 1][1]
        return PassDiff.between(name, self.pass_log[k].level, before, after, context)

    def recompile(self, args, machine) -> "CompiledKernel":
        if self.kernel is None:
            raise KernelSignatureError("this kernel was compiled for one machine only",
                                       expected=self.machine.name, got=str(machine))
        return self.kernel.compile(*args, machine=machine, options=self.options or None, **self.consts)

    def __repr__(self):
        consts = ", ".join(f"{k}={v}" for k, v in self.consts.items())
        dyn = f"; dynamic: {self.dynamic.describe()}" if self.dynamic else ""
        return (f"CompiledKernel({self.name}({consts}) on {self.machine.name}: "
                f"{len(self.tensor_graph)} tensor nodes, {len(self.tile_graph)} tile ops, "
                f"{len(self.block_graph)} tasks, {len(self.program)} instructions{dyn})")


# ---------------------------------------------------------------------------------------
# what a pass changed

ADDED_COLOR = "#c6efce"       # light green: a node the pass added
REMOVED_COLOR = "#ffc7ce"     # light red: a node the pass removed
MAX_LISTED = 40               # node descriptions shown in HTML and in the graph's note


@dataclass(frozen=True, repr=False)
class PassDiff:
    """What one pass changed (`CompiledKernel.diff(name)`).

    `text` is the unified diff (difflib) of the level's printed text before and after the pass
    (`str(diff)` is the same).  `added` and `removed` are the descriptions of the nodes the pass
    added and removed, in graph order: a node's text line without its id, its inputs named by
    what produces them (`sub(x, amax)`; a tile op also by its group and iteration:
    `group 1 [0.2] TROWEXPANDSUB(TLOAD[0.2], TLOAD[0.0]) ...`), so that renumbering alone is no
    change and a rewired input is.  A node whose line changed is one removed plus one added.
    Block, execution and PTO levels compare their printed lines (tasks, instructions); a block
    pass that also edits the tile ops (l1_reuse drops loads) lists those too.

    A lowering (level "a->b") goes from one level to another: a line diff would mean nothing, so
    `is_lowering` is True, `text` holds both texts one after the other, and `added`/`removed`
    are empty.
    """

    pass_name: str
    level: str
    before: object
    after: object
    before_text: str
    after_text: str
    text: str
    added: tuple[str, ...]
    removed: tuple[str, ...]
    context: int = 3

    @classmethod
    def between(cls, name: str, level: str, before, after, context: int = 3) -> "PassDiff":
        a, b = level_text(before), level_text(after)
        if "->" in level or getattr(before, "level", None) != getattr(after, "level", None):
            src, dst = getattr(before, "level", "?"), getattr(after, "level", "?")
            text = (f"pass {name!r} is a lowering ({src} -> {dst}): the levels differ, so there is no "
                    f"line diff; the {src} text before it, then the {dst} text after it.\n"
                    f"--- before {name} ({src})\n{a}\n+++ after {name} ({dst})\n{b}")
            return cls(name, level, before, after, a, b, text, added=(), removed=(), context=context)
        lines = difflib.unified_diff(a.splitlines(), b.splitlines(), f"before {name}", f"after {name}",
                                     lineterm="", n=context)
        db, da = describe_nodes(before), describe_nodes(after)
        tiles_b, tiles_a = getattr(before, "tiles", None), getattr(after, "tiles", None)
        if tiles_b is not None and tiles_b is not tiles_a:     # a block pass that edits tile ops
            db, da = db + describe_nodes(tiles_b), da + describe_nodes(tiles_a)
        gone = collections.Counter(d for _, d in db) - collections.Counter(d for _, d in da)
        new = collections.Counter(d for _, d in da) - collections.Counter(d for _, d in db)
        return cls(name, level, before, after, a, b, "\n".join(lines), added=tuple(_take(da, new)),
                   removed=tuple(_take(db, gone)), context=context)

    @property
    def is_lowering(self) -> bool:
        return "->" in self.level or getattr(self.before, "level", None) != getattr(self.after, "level", None)

    @property
    def changed(self) -> bool:
        return self.is_lowering or self.before_text != self.after_text or bool(self.added or self.removed)

    def added_ids(self) -> list:
        """Ids of the after graph's nodes (tensor, tile) or tasks (block, exec, pto) that are new."""
        if self.is_lowering:
            return []
        new = collections.Counter(self.added)
        out = []
        for i, d in describe_nodes(self.after):
            if new[d] > 0:
                new[d] -= 1
                out.append(i)
        return out

    def summary(self) -> str:
        if self.is_lowering:
            return f"{self.pass_name} ({self.level}): a lowering"
        return (f"{self.pass_name} ({self.level}): {len(self.added)} added, {len(self.removed)} removed, "
                f"{sum(1 for ln in self.text.splitlines() if ln[:1] in '+-' and ln[:3] not in ('+++', '---'))}"
                f" changed lines")

    def __str__(self):
        return self.text

    def __repr__(self):
        return f"<PassDiff {self.summary()}>"

    def _repr_pretty_(self, p, cycle):
        p.text(self.text or f"{self.summary()}: no textual change")

    def _repr_html_(self) -> str:
        from ..viz.static import diff_html, side_by_side_html   # lazily: plain strings, stdlib only
        title = f"<b>{html.escape(self.pass_name)}</b> ({html.escape(self.level)})"
        if self.is_lowering:
            return (f"{title}: a lowering, the levels differ"
                    + side_by_side_html(self.before_text, self.after_text,
                                        f"before: {getattr(self.before, 'level', '?')}",
                                        f"after: {getattr(self.after, 'level', '?')}"))
        body = diff_html(self.before_text, self.after_text, f"before {self.pass_name}",
                         f"after {self.pass_name}", context=self.context)
        lists = "".join(_html_list(what, items, color) for what, items, color in
                        (("added", self.added, ADDED_COLOR), ("removed", self.removed, REMOVED_COLOR)))
        return f"<div>{title}: {len(self.added)} added, {len(self.removed)} removed{body}{lists}</div>"

    def graph(self):
        """A graphviz.Digraph of the graph after the pass, its new nodes filled light green and
        the removed ones listed in a note (the tile graph draws outer iteration 0 of each group;
        big block/exec graphs fold tasks of one group and wave into one node)."""
        from ..viz import graphs as vg                       # lazily: imports graphviz when drawing
        g = self.after
        kind = getattr(g, "level", None)
        if kind == "tensor":
            dg, name = vg.tensor_graph(g), "t{}"
        elif kind == "tile":
            dg, name = vg.tile_graph(g), "n{}"
        elif kind == "block":
            dg, name = vg.block_graph(g), "k{}"
        elif kind in ("exec", "pto"):
            dg, name = vg.exec_graph(g), "k{}"
        else:
            raise PyptoError(f"no graph view of a {kind} graph", expected="tensor, tile, block, exec or pto",
                             got=kind)
        drawn = set(re.findall(r"^\s*(\w+) \[", "\n".join(dg.body), flags=re.M))
        hidden = 0
        for i in dict.fromkeys(self.added_ids()):
            node = name.format(i)
            if node not in drawn and kind in ("block", "exec", "pto"):
                t = next(t for t in g.tasks if t.id == i)
                node = f"g{t.group}w{t.level}"             # folded view: the node holding the task
            if node in drawn:
                dg.node(node, fillcolor=ADDED_COLOR, color="#2e7d32", penwidth="2")
            else:
                hidden += 1
        note = []
        if self.is_lowering:
            note.append(f"{self.pass_name}: a lowering ({self.level}); every node is new")
        else:
            note.append(f"{self.pass_name}: {len(self.added)} added (green), {len(self.removed)} removed")
            if hidden:
                note.append(f"{hidden} added nodes are not drawn in this view")
            if self.removed:
                note.append("removed:")
                note.extend(_clip(d) for d in self.removed[:12])
                if len(self.removed) > 12:
                    note.append(f"... {len(self.removed) - 12} more")
        dg.node("pass_diff_note", label="\\l".join(note) + "\\l", shape="note", style="filled",
                fillcolor=REMOVED_COLOR if self.removed else "#f6f8fa", fontsize="9")
        return dg


def _clip(s: str, n: int = 90) -> str:
    s = s.replace("\\", "/").replace('"', "'")
    return s if len(s) <= n else s[:n - 3] + "..."


def _take(described, counts: collections.Counter) -> list[str]:
    """The descriptions in `counts`, as many times as counted, in graph order."""
    left = collections.Counter(counts)
    out = []
    for _, d in described:
        if left[d] > 0:
            left[d] -= 1
            out.append(d)
    return out


def _html_list(what: str, items, color: str) -> str:
    if not items:
        return ""
    rows = "".join(f"<span style='background:{color}; display:block'>{html.escape(d)}</span>"
                   for d in items[:MAX_LISTED])
    more = f"<span style='color:#555'>... {len(items) - MAX_LISTED} more</span>" if len(items) > MAX_LISTED else ""
    return (f"<details><summary>{len(items)} {what} nodes</summary>"
            f"<pre style='font-size:11px; margin:0'>{rows}{more}</pre></details>")


def level_text(g) -> str:
    """The printed text of one level's IR, as diffed by `PassDiff`."""
    return g.text() if hasattr(g, "text") else str(g)


def describe_nodes(g) -> list[tuple[int, str]]:
    """(id, description) of every node of a tensor or tile graph; of every task of a block
    graph; of every task and instruction (with its task's id) of an execution graph or program."""
    kind = getattr(g, "level", None)
    if kind == "tensor":
        return _describe_tensor(g)
    if kind == "tile":
        return _describe_tile(g)
    if kind in ("block", "exec", "pto"):
        return _describe_tasks(g, kind)
    return []


def _describe_tensor(g) -> list[tuple[int, str]]:
    from ..ir.tensor import node_text
    by_id = {n.id: n for n in g.nodes}

    def ref(i):
        n = by_id.get(i)
        if n is None:
            return "?"
        if n.op == "input":
            return n.attrs["param"]
        if n.op == "const":
            return str(n.attrs.get("value"))
        return n.op

    out = []
    for n in g.nodes:
        text = node_text(n)
        if n.op == "store":
            text = text.replace(f"<- %{n.inputs[0]}", f"<- {ref(n.inputs[0])}", 1)
        else:
            text = text[len(f"%{n.id} = "):]
            text = text.replace(_call(n.op, n.inputs), f"{n.op}({', '.join(ref(i) for i in n.inputs)})", 1)
        out.append((n.id, text))
    return out


def _describe_tile(g) -> list[tuple[int, str]]:
    from ..ir.tile import node_text
    by_id = g.by_id()

    def ref(i):
        n = by_id.get(i)
        return "?" if n is None else f"{n.op}[{n.outer}.{n.inner}]"

    out = []
    for n in g.nodes:
        text = node_text(n)
        if text.startswith(f"%{n.id} = "):
            text = text[len(f"%{n.id} = "):]
        text = text.replace(_call(n.op, n.inputs), f"{n.op}({', '.join(ref(i) for i in n.inputs)})", 1)
        out.append((n.id, f"group {n.group} [{n.outer}.{n.inner}] {text}"))
    return out


def _call(op: str, inputs) -> str:
    return f"{op}({', '.join(f'%{i}' for i in inputs)})"


def _describe_tasks(g, kind: str) -> list[tuple[int, str]]:
    if kind == "block":
        return [(t.id, f"task {t.id}: group {t.group} on {t.core_type}, iterations {list(t.outer)}, "
                       f"{len(t.nodes)} tile ops, deps {list(t.deps)}, wave {t.level}") for t in g.tasks]
    out = []
    for t in g.tasks:
        out.append((t.id, f"task {t.id} on {t.core_type} after {list(t.deps)}"))
        out.extend((t.id, f"task {t.id}: {line.strip()}") for line in item_lines(t.code))
    return out


def as_array(a) -> np.ndarray:
    if hasattr(a, "detach") and hasattr(a, "numpy"):   # a torch tensor
        return a.detach().numpy()
    return np.asarray(a)


def compare(outputs, arrays: dict[str, np.ndarray], traced: TensorGraph, step=no_step) -> dict:
    """Outputs vs the numpy reference of the traced graph, within the error bound that the
    rounding of every step allows (`pypto.ir.numerics`): a mismatch reported is a real one.
    `step(what)` is called as each of its three parts starts (see `CompiledKernel.simulate`)."""
    values: dict = {}
    with np.errstate(all="ignore"):
        step("numpy reference")
        expected = evaluate(traced, arrays, values)
        step("error bounds")
        bound = output_bounds(traced, values, expected)
    step("comparison")
    return {name: within_bound(outputs[name], expected[name], bound[name], traced.param(name).dtype)
            for name in traced.output_names}


class _Steps:
    """`step(what)` of a progress stage: each call is the next step, `what` its detail."""

    def __init__(self, bar):
        self.bar, self.done = bar, 0

    def __call__(self, what: str) -> None:
        self.bar.update(self.done, what)
        self.done += 1
