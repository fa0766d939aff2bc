"""`pypto.check_graph(kernel, *args, **consts)`: a kernel traced, compiled with every level's
verifier after every pass, and looked over for mistakes that compile silently; the problems as
data (`Finding`s) instead of an exception.

Found on the Tensor Graph as traced:

- "unused-input" (warning): a parameter the kernel neither reads nor writes;
- "partial-output" (warning): an output of which the kernel writes only some elements (the
  others keep the array's contents);
- "overwritten-write" (warning): a write into an output that later writes cover entirely;
- "dead-value" (warning): values computed and never used (one finding per line).

Any error of tracing, verifying or compiling (a shape error, a tile that does not fit its
buffer, a `pypto.fuse()` region that cannot stay one group, a broken invariant) is a finding of
severity "error" (its kind the error's class).  Wrong arguments to `check_graph` itself (their
number, an unknown constant) still raise.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..compiler.tensor_passes import live_values
from ..errors import PyptoError, SourceLoc, VerificationError, at_caller
from ..ir.core import region_slices
from ..ir.tensor import TensorGraph, verify
from ..target.machine import get_machine
from .dynamic import DYNAMIC

SEVERITIES = ("error", "warning", "info")
MAX_MASK = 1 << 26              # elements of an output whose writes are checked element by element


@dataclass(frozen=True)
class Finding:
    severity: str               # error | warning | info
    kind: str                   # unused-input, partial-output, ... or the error's class name
    message: str
    loc: SourceLoc | None = None
    hint: str | None = None
    expected: object = None
    got: object = None

    def text(self) -> str:
        where = f"{self.loc.short()}: " if self.loc is not None else ""
        lines = [f"{self.severity}: {where}{self.message} [{self.kind}]"]
        if self.expected is not None or self.got is not None:
            lines.append(f"  expected: {self.expected}\n  got:      {self.got}")
        if self.hint:
            lines.append(f"  hint:     {self.hint}")
        return "\n".join(lines)

    def __str__(self):
        return self.text()


class Findings(list):
    """The findings of `check_graph`, errors first (a list: empty when the kernel is clean)."""

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self if f.severity == "error"]

    @property
    def ok(self) -> bool:
        """No error (warnings allowed)."""
        return not self.errors

    def text(self) -> str:
        if not self:
            return "check_graph: no findings"
        return "\n".join(f.text() for f in self)

    def __str__(self):
        return self.text()

    def _repr_pretty_(self, p, cycle):
        p.text(self.text())


def _from_error(e: PyptoError) -> Finding:
    return Finding("error", type(e).__name__, e.message, e.loc, e.hint, e.expected, e.got)


@at_caller
def check_graph(kernel, *args, machine="a2a3", options=None, **consts) -> Findings:
    """Trace `kernel` for `args` (arrays or `pypto.Tensor` specs) and constants, verify and
    compile it for `machine`, and return what is wrong or suspicious (see the module's doc)."""
    from ..compiler.dynamic import CHUNK
    from .jit import JitKernel
    if not isinstance(kernel, JitKernel):
        raise PyptoError("check_graph checks a @pypto.jit kernel", expected="a @pypto.jit function",
                         got=type(kernel).__name__)
    specs = kernel._specs(args)
    values = kernel._constants(consts)
    m = get_machine(machine)
    dynamic = any(s.shape and s.shape[0] is DYNAMIC for s in specs)
    found: list[Finding] = []
    try:
        traced = kernel._trace(specs, values, chunk=CHUNK if dynamic else None, machine=m)
    except PyptoError as e:
        return Findings([_from_error(e)])
    try:
        verify(traced)
    except VerificationError as e:
        found.append(_from_error(e))
    found += _unused_inputs(kernel, traced) + _writes(traced) + _dead_values(traced)
    try:
        ck = JitKernel(kernel.fn, pipeline=kernel.pipeline, debug=True, level=kernel.level)._compile(
            args, m, False, consts, None, options)
        ck.program.verify(m)
    except PyptoError as e:
        found.insert(0, _from_error(e))
    order = {s: k for k, s in enumerate(SEVERITIES)}
    return Findings(sorted(found, key=lambda f: order[f.severity]))


def _unused_inputs(kernel, g: TensorGraph) -> list[Finding]:
    users = g.users()
    outputs = set(g.output_names)
    out = []
    for n in g.nodes:
        if n.op == "input" and not users[n.id] and n.attrs["param"] not in outputs:
            name = n.attrs["param"]
            out.append(Finding("warning", "unused-input", f"parameter '{name}' is never read nor written",
                               kernel.sig_loc(name), hint=f"remove '{name}' from the kernel's parameters, or use it"))
    return out


def _writes(g: TensorGraph) -> list[Finding]:
    """Outputs written only in part, and writes that later writes cover entirely."""
    out = []
    for name in g.output_names:
        p = g.param(name)
        stores = [n for n in g.nodes if n.op == "store" and n.attrs["param"] == name]
        if int(np.prod(p.shape)) > MAX_MASK:
            continue
        later = np.zeros(p.shape, bool)
        for k in range(len(stores) - 1, -1, -1):
            s = stores[k]
            region = region_slices(s.attrs["offsets"], s.shape, s.attrs.get("steps"))
            if later[region].all():
                after = sorted({t.loc.short() for t in stores[k + 1:] if t.loc is not None})
                out.append(Finding("warning", "overwritten-write",
                                   f"this write into '{name}' is overwritten by later writes"
                                   + (f" ({', '.join(after)})" if after else ""), s.loc,
                                   hint="remove it, or write a region the later writes leave alone"))
            later[region] = True
        written = int(later.sum())
        if written < later.size:
            out.append(Finding("warning", "partial-output",
                               f"'{name}' is written in {written} of its {later.size} elements "
                               f"({100 * written / later.size:.1f}%); the others keep the array's contents",
                               stores[0].loc if stores else None,
                               hint=f"write every element ({name}[:] = ...), or pass an array whose other "
                                    "elements are meant to stay"))
    return out


def _dead_values(g: TensorGraph) -> list[Finding]:
    """Values no write depends on, one finding per line."""
    live = live_values(g)
    by_line: dict = {}
    for n in g.nodes:
        if n.id not in live and n.op not in ("input", "const", "store"):
            by_line.setdefault(n.loc, []).append(n.op)
    out = []
    for loc, ops in by_line.items():
        names = ", ".join(dict.fromkeys(ops))
        out.append(Finding("warning", "dead-value", f"the value{'s' if len(ops) > 1 else ''} computed here "
                           f"({names}) {'are' if len(ops) > 1 else 'is'} never used", loc,
                           hint="write it into an output, or remove it (the compiler drops it)"))
    return out
