"""The pass API users write against (the seeds' `OptimizationPass` / `CompilerPipeline`).

    class CustomFusionPass(pypto.compiler.OptimizationPass):
        level = "tensor"
        def apply(self, graph):
            ...
            return graph

    pipeline = pypto.CompilerPipeline([("fusion", CustomFusionPass()),
                                       ("tiling", pypto.compiler.AutoTilingPass(tile_size=128)),
                                       ("scheduling", pypto.compiler.DynamicScheduler())])
    ck = pipeline.compile(kernel, x, out)

A `CompilerPipeline` starts from the default pipeline; each (name, pass) entry replaces the
built-in pass of that name, or joins the end of its level (before the lowering to the next one).
"""
from __future__ import annotations

import inspect
import re

from ..errors import PyptoError, at_caller
from .pipeline import LEVELS, Pass, Pipeline


class OptimizationPass:
    """Base class of a user pass: set `level` ("tensor", "tile", "block" or "exec"; a lowering
    is "a->b") and implement `apply(self, graph)` (or `apply(self, graph, ctx)`) returning a graph."""

    level: str = "tensor"
    description: str = ""

    def apply(self, graph):  # pragma: no cover - subclasses implement it
        raise NotImplementedError(f"{type(self).__name__}.apply(graph) must return a graph")

    @property
    def default_name(self) -> str:
        return re.sub(r"(?<!^)(?=[A-Z])", "_", type(self).__name__).lower()

    def as_pass(self, name: str | None = None) -> Pass:
        takes_ctx = len(inspect.signature(self.apply).parameters) >= 2

        def run(graph, ctx):
            return self.apply(graph, ctx) if takes_ctx else self.apply(graph)
        run.user_fn = self.apply
        doc = self.description or (inspect.getdoc(type(self)) or "").split("\n")[0]
        return Pass(name or self.default_name, self.level, run, doc)


def as_pass(name: str, p) -> Pass:
    """A pipeline entry as a Pass: a Pass, an OptimizationPass, or a function with a `level`."""
    if isinstance(p, Pass):
        return p if p.name == name else Pass(name, p.level, p.fn, p.doc)
    if isinstance(p, OptimizationPass):
        return p.as_pass(name)
    if isinstance(p, type) and issubclass(p, OptimizationPass):
        raise PyptoError(f"pipeline entry '{name}' is a pass class, not a pass",
                         expected="an instance of the pass", got=f"the class {p.__name__}",
                         hint=f"write ({name!r}, {p.__name__}())")
    if callable(p) and isinstance(getattr(p, "level", None), str):
        def run(g, ctx):
            return p(g)
        run.user_fn = p
        return Pass(name, p.level, run, (inspect.getdoc(p) or "").split("\n")[0])

    raise PyptoError(f"pipeline entry '{name}' is not a pass",
                     expected="a pypto.compiler.OptimizationPass (or a function with a .level)",
                     got=type(p).__name__,
                     hint="subclass pypto.compiler.OptimizationPass, set `level` and define apply(self, graph)")


def _level_of(p: Pass) -> tuple[str, str]:
    """(level it reads, level it returns)."""
    a, _, b = p.level.partition("->")
    return a, (b or a)


class CompilerPipeline:
    """An editable list of named passes, checked so that levels follow each other."""

    @at_caller
    def __init__(self, entries=(), base: bool = True):
        from . import default_passes
        self._passes: list[Pass] = default_passes() if base else []
        for name, p in entries:
            self.add(name, p)

    # --- editing ----------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [p.name for p in self._passes]

    def _index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise PyptoError(f"no pass named '{name}' in the pipeline", expected=", ".join(self.names),
                             got=name) from None

    @at_caller
    def add(self, name: str, p) -> "CompilerPipeline":
        """Replace the pass of that name, or put the pass at the end of its level."""
        new = as_pass(name, p)
        if name in self.names:
            return self.replace(name, new)
        src, dst = _level_of(new)
        if src != dst:
            raise PyptoError(f"pass '{name}' is a lowering ({new.level}) with no built-in of that name to replace",
                             expected="the name of the lowering it replaces (e.g. 'tiling')", got=name)
        pos = max((i + 1 for i, q in enumerate(self._passes) if _level_of(q)[1] == src), default=0)
        return self._edit(lambda ps: ps.insert(pos, new))

    @at_caller
    def insert_before(self, name: str, new_name: str, p) -> "CompilerPipeline":
        i = self._index(name)
        return self._edit(lambda ps: ps.insert(i, as_pass(new_name, p)))

    @at_caller
    def insert_after(self, name: str, new_name: str, p) -> "CompilerPipeline":
        i = self._index(name)
        return self._edit(lambda ps: ps.insert(i + 1, as_pass(new_name, p)))

    @at_caller
    def remove(self, name: str) -> "CompilerPipeline":
        i = self._index(name)
        return self._edit(lambda ps: ps.pop(i))

    @at_caller
    def replace(self, name: str, p) -> "CompilerPipeline":
        i = self._index(name)
        return self._edit(lambda ps: ps.__setitem__(i, as_pass(name, p)))

    def _edit(self, change) -> "CompilerPipeline":
        """Apply an edit to a copy; keep it only when the levels still follow each other."""
        passes = list(self._passes)
        change(passes)
        check_levels(passes)
        self._passes = passes
        return self

    # --- use --------------------------------------------------------------------------------
    def pipeline(self) -> Pipeline:
        return Pipeline(list(self._passes))

    @at_caller
    def compile(self, kernel, *args, machine="a2a3", snapshots: bool = False, options=None, **consts):
        """Compile `kernel` (a @pypto.jit kernel) with this pipeline: a CompiledKernel."""
        return kernel.compile(*args, machine=machine, snapshots=snapshots, pipeline=self, options=options,
                              **consts)

    def __iter__(self):
        return iter(self._passes)

    def __len__(self):
        return len(self._passes)

    def text(self) -> str:
        return "\n".join(f"{p.level:>12}  {p.name:<27} {p.doc}" for p in self._passes)

    def __repr__(self):
        return f"CompilerPipeline({', '.join(self.names)})"

    def _repr_pretty_(self, p, cycle):
        p.text(self.text())


def check_levels(passes: list[Pass]) -> None:
    """Each pass must see the level it works on; every lowering must be there, in order."""
    level = LEVELS[0]
    for i, p in enumerate(passes):
        src, dst = _level_of(p)
        if src not in LEVELS or dst not in LEVELS:
            raise PyptoError(f"pass '{p.name}' has an unknown level",
                             expected=" / ".join(LEVELS[:-1]) + " (or a lowering 'a->b')", got=p.level)
        nxt = LEVELS[LEVELS.index(level) + 1] if level != LEVELS[-1] else None
        lowering_later = any(_level_of(q) == (level, nxt) for q in passes[i + 1:])
        if LEVELS.index(src) > LEVELS.index(level) and not lowering_later:
            raise PyptoError(f"the pipeline omits the lowering {level}->{nxt} before pass '{p.name}'",
                             expected=f"a pass with level '{level}->{nxt}'", got=" -> ".join(q.name for q in passes))
        if src != level:
            raise PyptoError(f"pass '{p.name}' works on the {src} level but is placed where the graph "
                             f"is at the {level} level", expected=f"a {level} pass here", got=p.level)
        level = dst
    if level != LEVELS[-1]:
        nxt = LEVELS[LEVELS.index(level) + 1]
        raise PyptoError(f"the pipeline omits the lowering {level}->{nxt}",
                         expected=f"a pass with level '{level}->{nxt}'", got=" -> ".join(q.name for q in passes))


def default_pipeline() -> CompilerPipeline:
    """The default pipeline, as an editable CompilerPipeline."""
    return CompilerPipeline()
