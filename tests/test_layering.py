"""The import layering of pypto's packages: every import goes down the layer order.

    base (errors, dtypes, gcpause, progress, sweep, optim) < target < ir < {compiler, sim} < frontend < tuning < viz
    < magics < top < cli

`target` (machines, instruction table, cost model) is below both the compiler and the simulator,
which never import each other; the frontend (tracing, @jit, CompiledKernel) is above both; tuning
(sweeps of a kernel's configurations, the advisor) compiles and simulates through it; viz
draws what the others return; the IPython magics, the package's own `__init__` ("top") and the
command line (cli.py, __main__.py) are the entry points.  Every import counts: module-level and
function-level (lazy), relative and absolute.  ALLOWED lists the few upward imports there are,
each with its reason; each must still exist (a stale allowance fails) and be lazy (a module-level
one would be an import cycle at load time).  Leaving those out, the packages import each other
without a cycle.
"""
from __future__ import annotations

import ast
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pypto")

LAYERS = (("base",), ("target",), ("ir",), ("compiler", "sim"), ("frontend",), ("tuning", "nn"), ("viz",), ("magics",),
          ("top",), ("cli",))
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}

# (importing module, imported module, why): the upward imports there are, all lazy
ALLOWED = (
    ("pypto.sim.result", "pypto.viz.timeline",
     "SimResult.timeline(): the drawing convenience the tutorials call (res.timeline()); the simulator "
     "returns data, viz draws it"),
    ("pypto.sim.result", "pypto.viz.roofline",
     "SimResult.roofline(): the drawing convenience the tutorials call (mres.roofline())"),
    ("pypto.sim.result", "pypto.tuning.advisor",
     "SimResult.advise(): the advice on the kernel a result came from (res.advise()), as the README shows it"),
    ("pypto.tuning", "pypto.viz.tune",
     "TuneResult._repr_html_ and .plot(): a sweep shows its table and plot in a notebook; tuning returns data"),
    ("pypto.tuning.advisor", "pypto.viz.tune",
     "Advice._repr_html_: the advice as a table in a notebook"),
    ("pypto.frontend.kernel", "pypto.viz.static",
     "PassDiff._repr_html_: a notebook shows what a pass changed as an HTML diff"),
    ("pypto.frontend.kernel", "pypto.viz.graphs",
     "PassDiff.graph(): the graph after a pass with its new nodes coloured"),
    ("pypto.nn.profile", "pypto.viz.nn_report",
     "ModelProfile._repr_html_: a model's profile shows as tables in a notebook; pypto.nn returns data"),
    ("pypto.viz.report", "pypto",
     "the report names pypto's version, which pypto/__init__.py defines (until it moves to a base module)"),
)

# what the target may import besides pypto's base: it describes the machine, nothing more
TARGET_EXTERNAL = {"numpy", "tomli"}     # tomli: reading machine files on Python 3.10 (no tomllib)


def package_of(module: str) -> str:
    """pypto.sim.result -> "sim"; pypto.errors -> "base"; pypto -> "top"; pypto.__main__ -> "cli"."""
    parts = module.split(".")
    if len(parts) == 1:
        return "top"
    head = parts[1]
    if head in ("errors", "dtypes", "gcpause", "progress", "sweep", "optim"):
        return "base"
    if head in ("cli", "__main__"):
        return "cli"
    return head


def _modules(root: str = ROOT) -> dict[str, tuple[str, bool]]:
    """module name -> (path, is a package's __init__)."""
    out = {}
    base = os.path.dirname(root)
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith((".", "__pycache__")))
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, base)[:-3].split(os.sep)
                pkg = rel[-1] == "__init__"
                out[".".join(rel[:-1] if pkg else rel)] = (path, pkg)
    return out


MODULES = _modules()


class Import(tuple):
    """(importer, imported module, line, lazy: inside a function)."""
    importer = property(lambda s: s[0])
    module = property(lambda s: s[1])
    line = property(lambda s: s[2])
    lazy = property(lambda s: s[3])


def imports_of(name: str, path: str, is_pkg: bool, modules=MODULES) -> list[Import]:
    """Every import of pypto (and, for the external check, of other packages: their top-level
    name) in one module, module-level and inside functions."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    out: list[Import] = []

    def visit(node, lazy):
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend(Import((name, a.name, child.lineno, lazy)) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    package = name if is_pkg else name.rpartition(".")[0]
                    parts = package.split(".")
                    parts = parts[:len(parts) - (child.level - 1)]
                    src = ".".join(parts + ([child.module] if child.module else []))
                else:
                    src = child.module
                for a in child.names:     # `from . import ops`: the submodule pypto.frontend.ops
                    sub = f"{src}.{a.name}"
                    out.append(Import((name, sub if sub in modules else src, child.lineno, lazy)))
            visit(child, inner)
    visit(tree, False)
    return out


def all_imports(modules=MODULES) -> list[Import]:
    return [i for name, (path, pkg) in modules.items() for i in imports_of(name, path, pkg, modules)]


def _internal(i: Import) -> bool:
    return i.module == "pypto" or i.module.startswith("pypto.")


def violations(imports, allowed=ALLOWED) -> list[str]:
    ok = {(a, b) for a, b, _ in allowed}
    out = []
    for i in imports:
        if not _internal(i) or (i.importer, i.module) in ok:
            continue
        a, b = package_of(i.importer), package_of(i.module)
        if a == b:
            continue
        if RANK[b] >= RANK[a]:
            how = "imports its peer" if RANK[b] == RANK[a] else "imports the higher layer"
            out.append(f"{i.importer} (line {i.line}, {a}) {how} {i.module} ({b})"
                       + (" in a function" if i.lazy else ""))
    return out


def package_cycles(imports, allowed=ALLOWED) -> list[list[str]]:
    """Cycles of the package graph (one per strongly connected component of more than one
    package), the allowed edges left out."""
    ok = {(a, b) for a, b, _ in allowed}
    graph: dict[str, set[str]] = {}
    for i in imports:
        if _internal(i) and (i.importer, i.module) not in ok:
            a, b = package_of(i.importer), package_of(i.module)
            if a != b:
                graph.setdefault(a, set()).add(b)
    index, low, stack, on, comps = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return comps


IMPORTS = all_imports()


def test_every_module_is_in_a_layer():
    assert len(MODULES) > 50
    unknown = sorted({m for m in MODULES if package_of(m) not in RANK})
    assert not unknown, f"modules outside every layer (add their package to LAYERS): {unknown}"
    assert any(i.lazy for i in IMPORTS) and sum(_internal(i) for i in IMPORTS) > 200


def test_imports_go_down_the_layers():
    bad = violations(IMPORTS)
    assert not bad, "imports against the layering (pypto/ " + " < ".join("{" + ", ".join(x) + "}" for x in LAYERS) \
        + "):\n  " + "\n  ".join(bad)


def test_compiler_and_sim_never_import_each_other():
    both = [i for i in IMPORTS if _internal(i) and {package_of(i.importer), package_of(i.module)} == {"compiler", "sim"}]
    assert not both, both


def test_every_allowance_still_exists_and_is_lazy():
    for importer, module, why in ALLOWED:
        assert why
        found = [i for i in IMPORTS if i.importer == importer and i.module == module]
        assert found, f"stale allowance: {importer} no longer imports {module}; remove it from ALLOWED"
        eager = [i for i in found if not i.lazy]
        assert not eager, f"{importer} imports {module} at module level (line {eager[0].line}): only a lazy " \
                          "upward import is allowed"
        assert RANK[package_of(module)] >= RANK[package_of(importer)], \
            f"{importer} -> {module} goes down the layers: it needs no allowance"


def test_no_import_cycle_between_packages():
    assert package_cycles(IMPORTS) == []


def test_target_imports_only_the_base_numpy_and_the_standard_library():
    bad = []
    for i in IMPORTS:
        if package_of(i.importer) != "target":
            continue
        if _internal(i):
            if package_of(i.module) not in ("base", "target"):
                bad.append(f"{i.importer} line {i.line}: {i.module}")
        else:
            top = i.module.split(".")[0]
            if top != "__future__" and top not in TARGET_EXTERNAL and top not in sys.stdlib_module_names:
                bad.append(f"{i.importer} line {i.line}: {i.module}")
    assert not bad, bad


@pytest.mark.parametrize("line,where", [
    ("from ..sim import run", "pypto.compiler.fake"),                   # compiler -> sim (peer)
    ("def f():\n    from ..sim.timing import run_timing", "pypto.compiler.fake"),   # lazily too
    ("import pypto.compiler.tiling", "pypto.sim.fake"),                  # sim -> compiler, absolute
    ("from ..compiler import kernel", "pypto.ir.fake"),                  # ir -> compiler
    ("from ..ir.exec import Instr", "pypto.target.fake"),                # target -> ir
    ("from .. import viz", "pypto.frontend.fake"),                       # frontend -> viz (a submodule)
])
def test_an_upward_import_fails(tmp_path, line, where):
    """The checker itself: a module with one upward import is reported."""
    path = tmp_path / "fake.py"
    path.write_text(line + "\n")
    mods = dict(MODULES)
    mods[where] = (str(path), False)
    found = imports_of(where, str(path), False, mods)
    assert violations(found), found


def test_a_cycle_fails():
    fake = [Import(("pypto.compiler.x", "pypto.sim.run", 1, False)), Import(("pypto.sim.y", "pypto.compiler.x", 1, True))]
    assert package_cycles(IMPORTS + fake) == [["compiler", "sim"]]
