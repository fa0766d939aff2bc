"""How well the cost model matches hardware: measured cycles of single instructions against
`pypto.sim.cost` under the calibrated and the public rules.

A case table is a Markdown table (benchmarks/data/hw_cycles_train.md, the set the calibrated
constants were fitted to, and hw_cycles_holdout.md, measured cases they were not fitted to)
with the columns `test | op | pypto call | hw cycles | pto-isa precision | notes`; the call is
one `cost(...)` query, or two joined by "then" (an instruction pair, costed back to back as
the measurement ran them).  `fidelity(path)` returns one `Case` per row and `summary(cases)`
the medians per op family; benchmarks/cost_fidelity.py prints them, the test suite checks them.
"""
from __future__ import annotations

import ast
import re
import statistics
from typing import NamedTuple

from ..errors import PyptoError
from .cost import cost

FAMILIES = (("binary", ("TADD", "TSUB", "TMUL", "TMAX", "TMIN")),
            ("scalar", ("TADDS", "TSUBS", "TMULS", "TMAXS", "TMINS")),
            ("division", ("TDIV", "TDIVS", "TRECIP")),
            ("unary", ("TABS", "TNEG", "TRELU", "TEXP", "TLOG", "TSQRT", "TRSQRT")),
            ("row reduction", ("TROWSUM", "TROWMAX", "TROWMIN")),
            ("column reduction", ("TCOLSUM", "TCOLMAX", "TCOLMIN")),
            ("broadcast", ("TROWEXPAND", "TCOLEXPAND")),
            ("conversion", ("TCVT",)),
            ("select", ("TSEL", "TSELS")),
            ("matmul", ("TMATMUL", "TMATMUL_ACC", "TMATMUL_BIAS")),
            ("load", ("TLOAD",)))
_FAMILY = {op: fam for fam, ops in FAMILIES for op in ops}


class Case(NamedTuple):
    test: str
    op: str
    family: str
    hw: int                  # measured cycles
    calibrated: int          # pypto.sim.cost under the calibrated rules
    public: int              # ... under the public formulas
    pto_isa_error: float     # 1 - the pto-isa test's precision for its own model
    notes: str

    @property
    def error(self) -> float:
        """Relative error of the calibrated rules."""
        return abs(self.calibrated - self.hw) / self.hw

    @property
    def public_error(self) -> float:
        return abs(self.public - self.hw) / self.hw


def _queries(call: str) -> list[tuple[str, dict]]:
    """`cost("TADD", shape=(64, 64), dtype="int32")` [then ...] -> [(op, kwargs), ...]."""
    out = []
    for part in call.split(" then "):
        try:
            node = ast.parse(part.strip(), mode="eval").body
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "cost"):
                raise ValueError(part)
            op = ast.literal_eval(node.args[0])
            kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        except (SyntaxError, ValueError, IndexError) as e:
            raise PyptoError("calibration table: a pypto call that is not a cost(...) query",
                             expected='cost("TADD", shape=(64, 64), dtype="fp32")', got=part) from e
        out.append((op, kw))
    return out


def read_cases(path: str) -> list[dict]:
    """The rows of a case table: {test, op, call, hw, precision, notes}."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 6 or not re.fullmatch(r"\d+", cells[3]):
                continue
            rows.append({"test": cells[0], "op": cells[1], "call": cells[2].strip("`"), "hw": int(cells[3]),
                         "precision": float(cells[4]), "notes": cells[5]})
    if not rows:
        raise PyptoError(f"calibration table {path}: no cases", expected="rows | test | op | `cost(...)` | cycles | "
                         "precision | notes |", got="none")
    return rows


def fidelity(path: str, machine="a2a3") -> list[Case]:
    """Every case of the table at `path`, costed under `machine`'s calibrated rules and under the
    public formulas (the same machine with cost_model="public")."""
    from ..target.machine import get_machine
    m = get_machine(machine)
    cal, pub = m.replace(cost_model="calibrated"), m.replace(cost_model="public")
    out = []
    for r in read_cases(path):
        qs = _queries(r["call"])
        first = qs[0][0].upper()
        out.append(Case(r["test"], r["op"], _FAMILY.get(first, first.lower()), r["hw"],
                        sum(cost(op, cal, **kw) for op, kw in qs), sum(cost(op, pub, **kw) for op, kw in qs),
                        min(1.0, 1.0 - r["precision"]), r["notes"]))
    return out


class FamilyError(NamedTuple):
    family: str
    cases: int
    calibrated: float        # median relative error
    public: float
    pto_isa: float
    # the calibrated median with each error capped at 100%, as the pto-isa tests cap theirs
    # (a precision of 0 is any error of 100% or more): the fair comparison with `pto_isa`
    calibrated_capped: float


def summary(cases: list[Case]) -> list[FamilyError]:
    """Median relative errors per op family (in FAMILIES order), then "all"."""
    fams = [f for f, _ in FAMILIES if any(c.family == f for c in cases)]
    fams += sorted({c.family for c in cases} - set(fams))
    out = []
    for fam in fams + ["all"]:
        cs = [c for c in cases if fam == "all" or c.family == fam]
        out.append(FamilyError(fam, len(cs), statistics.median(c.error for c in cs),
                               statistics.median(c.public_error for c in cs),
                               statistics.median(c.pto_isa_error for c in cs),
                               statistics.median(min(1.0, c.error) for c in cs)))
    return out
