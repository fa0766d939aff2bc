"""The op table (docs/ops.md) as data and as markdown: every public op with the registry row it
builds, the dtypes it takes, its lowering and the PTO instructions that compute it.

Data first (`op_table()`: one `OpEntry` per public name group), text second
(`op_table_markdown()`); `scripts/gen_op_table.py` writes the file."""
from __future__ import annotations

import inspect
import re
from typing import NamedTuple

from .. import dtypes as dt
from ..ir.ops import OPS, Builder
from ..target import isa
from . import ops as fops

FORMS = ("", "S", "ROWEXPAND", "COLEXPAND", "ROW", "COL")


class OpEntry(NamedTuple):
    names: tuple[str, ...]       # the public names (aliases together), pypto.<name>
    op: str                      # the registry row ("" for an op built in the frontend)
    kind: str
    dtypes: str
    lowering: str                # "PTO" (instructions of its own) or "decomposition" or "frontend"
    instructions: tuple[str, ...]
    doc: str
    gradient: str = ""           # its rule (the registry's `grad` column), "decomposition" or "none"


class _Recorder(Builder):
    """Runs a decomposition on placeholder values, recording the primitive ops it uses."""

    def __init__(self, n_inputs):
        self.used: list[str] = []
        self.extra = {}
        self._vals = [("in", (4, 8), dt.DT_FP32)] * n_inputs

    def emit(self, op, inputs, shape, dtype, attrs=None):
        row = OPS[op]
        if row.kind == "composite":              # (decompositions may build on other composites)
            out = row.decompose(self, list(inputs), _Attrs(attrs or {}))
            return out
        if op != "const":
            self.used.append(op)
        return (op, tuple(shape) if shape is not None else (4, 8), dtype)

    def shape(self, v):
        return v[1]

    def dtype(self, v):
        return v[2]


class _Attrs(dict):
    """Example attrs for a decomposition (a dim, an eps, a slope, ...)."""
    DEFAULTS = {"dim": 1, "keepdim": False, "eps": 1e-5, "correction": 1, "has_weight": True, "has_bias": True,
                "min": 0.0, "max": 1.0, "exponent": 3, "negative_slope": 0.01, "alpha": 1.0, "value": 1.0,
                "lambd": 0.5, "p": 2, "diagonal": 0, "shape": (4, 8), "start": 0, "step": 1, "k": 2,
                "num_classes": 8, "decimals": 0}

    def __missing__(self, key):
        return self.DEFAULTS.get(key, 1)

    def get(self, key, default=None):
        return self[key] if key in self or key in self.DEFAULTS else default


def _instructions(row) -> tuple[str, ...]:
    out = []
    if row.tile:
        have = isa.opcodes(row.tile)
        out += [have[f] for f in FORMS if f in have]
    if row.kind == "cast":
        out.append("TCVT")
    if row.kind == "matmul":
        out += ["TMATMUL", "TMATMUL_ACC", "TMATMUL_BIAS"]
    return tuple(out)


def _primitives(row) -> tuple[str, ...]:
    rec = _Recorder(max(row.arity, 1))
    try:
        row.decompose(rec, list(rec._vals), _Attrs())
    except Exception:  # pragma: no cover - a decomposition that needs real attrs: shown without detail
        return ()
    return tuple(dict.fromkeys(rec.used))


def _gradient(row) -> str:
    """How `pypto.grad` differentiates the op: by its rule, through its decomposition, or not (its
    result is a mask or an index, or it has no operand)."""
    if row.grad is not None:
        return "0 (piecewise constant)" if getattr(row.grad, "__name__", "") == "_g_zero" else "rule"
    if row.decompose is not None:
        rec = _Recorder(max(row.arity, 1))
        try:
            out = row.decompose(rec, list(rec._vals), _Attrs())
        except Exception:  # pragma: no cover - a decomposition that needs real attrs
            return "decomposition"
        return "decomposition" if rec.dtype(out).is_float else "none"
    return "none"


def _first_sentence(doc: str) -> str:
    text = " ".join(doc.split("\n\n")[0].split())
    m = re.search(r"(?<!\.)\.\s", text)          # (not the ".." of "0 .. n-1")
    return text if m is None else text[:m.start() + 1]


def op_table() -> list[OpEntry]:
    funcs = {n: getattr(fops, n) for n in fops.__all__}
    groups: dict[object, list[str]] = {}
    for n, f in funcs.items():
        groups.setdefault(f, []).append(n)
    by_op = {}
    for f, names in groups.items():
        src = inspect.getsource(f) if callable(f) else ""
        target = next((n for n in names if n in OPS), None) or next(
            (row.name for row in OPS.values() if row.api and row.api in names), None)
        if target is None:      # the op it adds, read from its source: ctx.add("name", ...) / _unary("name", ...)
            target = next((op for op in OPS if f'"{op}"' in src and op not in ("const", "input", "store")), None)
            if target is not None and target in by_op:
                target = None
        key = target or names[0]
        by_op.setdefault(key, []).extend(names)
    entries = []
    for key, names in by_op.items():
        row = OPS.get(key)
        names = tuple(sorted(dict.fromkeys(names), key=lambda n: (n != key, n)))
        f = funcs[names[0]]
        doc = row.doc if row is not None else _first_sentence(inspect.getdoc(f) or "")
        if row is None:
            entries.append(OpEntry(names, "", "frontend", "as its parts", "frontend", (), doc))
            continue
        kinds = "floats" if row.float_only else "all"
        if row.kind == "composite":
            prims = _primitives(row)
            instrs = tuple(dict.fromkeys(i for p in prims for i in _instructions(OPS[p])[:1]))
            grad = _gradient(row)
            if row.name == "top_index":          # pypto.topk: its rounds pick indices; its values are a gather
                grad = "values: gather's rule; indices: none"
            entries.append(OpEntry(names, row.name, row.kind, kinds, "decomposition: " + ", ".join(prims), instrs, doc,
                                   grad))
        else:
            entries.append(OpEntry(names, row.name, row.kind, kinds, "PTO", _instructions(row), doc, _gradient(row)))
    return sorted(entries, key=lambda e: (e.lowering == "frontend", e.names[0]))


def op_table_markdown() -> str:
    entries = op_table()
    n_ops = sum(1 for e in entries if e.names[0] not in ("loop", "set_vec_tile_shapes", "set_cube_tile_shapes"))
    rows = [e for e in entries if e.lowering != "frontend"]
    built = [e for e in entries if e.lowering == "frontend" and e.names[0] not in
             ("loop", "set_vec_tile_shapes", "set_cube_tile_shapes")]
    out = ["# Ops", "",
           "Generated by `scripts/gen_op_table.py` from the op registry (`pypto/ir/ops.py`) and the instruction "
           "table (`pypto/target/isa.py`); do not edit by hand.", "",
           f"{n_ops} ops ({sum(len(e.names) for e in entries) - 3} public names with their aliases): "
           f"{len(rows)} are rows of the registry, {len(built)} are built in the frontend from them; "
           f"the registry has {len(OPS)} rows in all (with the internal ones: input, const, store, copy, ...).", "",
           "`dtypes`: `floats` for ops that need fp32/fp16/bf16, `all` for those that also take int8/int32 "
           "(and masks, where it makes sense).  `instructions`: the PTO instructions its lowering can emit "
           "(for a decomposition, those of its parts).  `gradient`: how `pypto.grad` differentiates it: by its "
           "rule (the registry's `grad` column), through its decomposition, or `none` (its result is a mask or "
           "an index: no gradient flows through it).", "",
           "| op | kind | dtypes | lowering | instructions | gradient | what |", "|---|---|---|---|---|---|---|"]
    for e in rows:
        names = ", ".join(f"`{n}`" for n in e.names)
        out.append(f"| {names} | {e.kind} | {e.dtypes} | {e.lowering} | {' '.join(e.instructions)} | {e.gradient} "
                   f"| {e.doc} |")
    out += ["", "## Built in the frontend", "",
            "Shape and layout ops (views, transposes and reshapes of GM tensors, free until a copy is needed), "
            "concatenation and padding (writes into a tensor of the kernel), convolution (matmuls per kernel "
            "position), and the reductions over several dims.  Their gradients are those of their parts.", "",
            "| op | what |", "|---|---|"]
    for e in built:
        out.append(f"| {', '.join(f'`{n}`' for n in e.names)} | {e.doc} |")
    out.append("")
    return "\n".join(out)
