"""The PTO instruction table: one row per instruction the compiler can emit and the simulators run.

A row says what the instruction is (`kind`, the math `fn` it applies and its operand `form`),
where it runs (its pipe, from the kind), which on-chip spaces its operands live in, what it
computes (`semantics`: a numpy function, see `semantics.py`) and what it costs (`cost`: the rule's
class and its constants).  Every pass and engine reads these rows: the tiling asks `find(fn, form)`
for an opcode instead of building its name, the PTO parser checks operands against `KINDS`, the
functional simulator applies `semantics`, the cost model reads `cost` -- so the structure of an
opcode is data, never a string parsed back.

Forms of the vector math: "" (tile op tile, or a unary op), "S" (tile op scalar), "ROWEXPAND" /
"COLEXPAND" (the second operand is a per-row [.., M, 1] / per-column [.., 1, N] vector broadcast
along the row / column), "ROW" / "COL" (a reduction along the last / second-to-last dim).

Adding an element-wise instruction is one entry in UNARY_FNS or BINARY_FNS (its numpy function
and cycles per repeat); the table, the parser, both simulators and docs/instructions.md follow.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import semantics as sem


@dataclass(frozen=True)
class Kind:
    """What all instructions of one kind share: the operand spaces (destination, sources; "num"
    is a scalar), the cost rule's class and how the documentation describes the operands."""
    dst: tuple[str, ...]
    srcs: tuple[tuple[str, ...], ...]
    cost: str                           # vector | cube | dma | sync
    operands: str                       # for docs/instructions.md
    pipe: str = "V"


KINDS: dict[str, Kind] = {
    "load": Kind(("UB", "L1"), (("GM",),), "dma", "UB/L1 <- GM", "MTE2"),
    "store": Kind(("GM",), (("UB", "L0C"),), "dma", "GM <- UB/L0C", "MTE3"),   # FIX from L0C
    "extract": Kind(("L0A", "L0B"), (("L1",),), "dma", "L0A/L0B <- L1", "MTE1"),
    "move": Kind(("BT",), (("L1",),), "dma", "BT <- L1", "MTE1"),
    "cube": Kind(("L0C",), (("L0A",), ("L0B",)), "cube", "L0C <- L0A x L0B", "M"),
    "unary": Kind(("UB",), (("UB",),), "vector", "UB <- UB"),
    "cvt": Kind(("UB",), (("UB",),), "vector", "UB <- UB (to=dtype)"),
    "binary": Kind(("UB",), (("UB",), ("UB",)), "vector", "UB <- UB, UB"),
    "scalar": Kind(("UB",), (("UB",), ("num",)), "vector", "UB <- UB, scalar"),
    "expand": Kind(("UB",), (("UB",), ("UB",)), "vector", "UB <- UB (row/col vector)"),
    "expand_binary": Kind(("UB",), (("UB",), ("UB",)), "vector", "UB <- UB, UB (row/col vector)"),
    "reduce": Kind(("UB",), (("UB",),), "vector", "UB <- UB (dim=)"),
    "select": Kind(("UB",), (("UB",), ("UB",), ("UB",)), "vector", "UB <- mask UB, UB, UB"),
    "select_scalar": Kind(("UB",), (("UB",), ("UB",), ("num",)), "vector", "UB <- mask UB, UB, scalar"),
    "fill": Kind(("UB",), (("num",),), "vector", "UB <- scalar"),
    "iota": Kind(("UB",), (), "vector", "UB <- start + i * step along dim (start=, step=, dim=)"),
    # indexed GM access (MGATHER / MSCATTER): per-element GM addresses from a UB index tile; the GM
    # window spans the indexed dim whole.  PTO-ISA runs them as SIMT kernels of the vector core
    # (A5), so on the V pipe (ordered behind the loads of their index tiles by flags); cost: one
    # 32-byte sector of GM traffic per element (INDEXED_SECTOR)
    "gather": Kind(("UB",), (("GM",), ("UB",)), "dma", "UB <- GM window, UB int32 index tile (dim=)"),
    "scatter": Kind(("GM",), (("UB",), ("UB",)), "dma", "GM window <- UB values, UB int32 index tile (dim=, "
                    "atomic=ADD)"),
    "flag": Kind((), (), "sync", "pipe -> pipe, EVENT_ID", ""),
    "barrier": Kind((), (), "sync", "pipe", "S"),
    "cross": Kind((), (), "sync", "pipe -> AIV slot / AIC -> pipe, EVENT_ID", ""),
}


# the attributes an instruction may carry, in the order the PTO text prints them: the reduced
# dim, an extract's offsets, a conversion's target dtype, a store's activation, a comparison,
# a conversion's rounding mode, an integer sequence's first value and step, an indexed store's
# atomic mode
ATTRS = ("dim", "offsets", "to", "act", "cmp", "round", "start", "step", "atomic")
INDEXED_KINDS = ("gather", "scatter")
# the cost rule of MGATHER / MSCATTER: every element is its own GM access, and the DMA engines
# move GM in 32-byte sectors (the Ascend MTE's access granule; a gathered fp32 element costs the
# bandwidth of 8): n elements cost n * 32 bytes over the path's bandwidth (GM -> UB, UB -> GM)
INDEXED_SECTOR = 32


@dataclass(frozen=True)
class Instruction:
    name: str
    kind: str
    fn: str = ""                        # the math: "ADD", "EXP", "SUM", ...
    form: str = ""                      # "", "S", "ROWEXPAND", "COLEXPAND", "ROW", "COL"
    semantics: Callable | None = None   # numpy function of the math (None: a move or a sync)
    slope: int = 1                      # vector: cycles per 256-byte repeat
    cycles: int = 0                     # sync: fixed cycles
    doc: str = ""
    modes: tuple = ()                   # (attr, {value: numpy function}): the math is chosen by an attr
    # the calibrated rule's constants (vector: startup cycles, cycles per repeat; see CALIBRATED)
    cal: tuple = ()

    def math(self, attrs) -> Callable | None:
        """The numpy function of this instruction with these attrs (TCMP: by its cmp= mode)."""
        if not self.modes:
            return self.semantics
        attr, table = self.modes
        return table.get(attrs.get(attr))

    @property
    def spec(self) -> Kind:
        return KINDS[self.kind]

    @property
    def cost(self) -> str:
        return KINDS[self.kind].cost


# element-wise math: fn -> (numpy function, cycles per repeat, what it computes)
UNARY_FNS: dict[str, tuple[Callable, int, str]] = {
    "EXP": (np.exp, 4, "exp(x)"),
    "LOG": (np.log, 4, "natural log"),
    "SQRT": (np.sqrt, 4, "square root"),
    "RSQRT": (sem.rsqrt, 4, "1 / sqrt(x)"),
    "ABS": (np.abs, 1, "|x|"),
    "NEG": (sem.negative, 1, "-x"),
    "RELU": (sem.relu, 1, "max(x, 0)"),
    "RECIP": (np.reciprocal, 4, "1 / x"),
}
BINARY_FNS: dict[str, tuple[Callable, int, str]] = {
    "ADD": (np.add, 1, "a + b"),
    "SUB": (np.subtract, 1, "a - b"),
    "MUL": (np.multiply, 1, "a * b"),
    "DIV": (np.divide, 4, "a / b"),
    "MAX": (np.maximum, 1, "max(a, b)"),
    "MIN": (np.minimum, 1, "min(a, b)"),
    "REM": (np.remainder, 4, "a mod b with the sign of b (Python's %, floored)"),
    "FMOD": (np.fmod, 4, "a mod b with the sign of a (C's fmod, truncated)"),
}
# the comparisons of TCMP / TCMPS (attr cmp=): a mask (bool) per element
COMPARE_MODES: dict[str, Callable] = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
                                      "GT": np.greater, "GE": np.greater_equal}
LOGIC_FNS: dict[str, tuple[Callable, int, str]] = {
    "AND": (np.logical_and, 1, "a and b"),
    "OR": (np.logical_or, 1, "a or b"),
    "XOR": (np.logical_xor, 1, "a xor b"),
}
REDUCE_FNS: dict[str, tuple[Callable, int, str]] = {
    "SUM": (sem.reduce_sum, 2, "sum"),
    "MAX": (sem.reduce_max, 2, "maximum"),
    "MIN": (sem.reduce_min, 2, "minimum"),
    "PROD": (sem.reduce_prod, 2, "product"),
}
# the rounding modes of TCVT (attr round=; PTO's CAST_RINT, ...): to an integral value, kept in
# the destination's dtype (RINT: to nearest, ties to even; ROUND: ties away from zero)
ROUND_MODES: dict[str, Callable] = {"RINT": np.rint, "ROUND": sem.round_half_away, "FLOOR": np.floor,
                                    "CEIL": np.ceil, "TRUNC": np.trunc}
EXPAND_FORMS = ("ROWEXPAND", "COLEXPAND")
REDUCE_FORMS = ("ROW", "COL")


# ---------------------------------------------------------------------------------------------
# The calibrated vector costs (machines with cost_model = "calibrated"; pypto.target.cost reads
# them), fitted to hardware-measured cycles of single instructions on an A2/A3 core
# (docs/cost_model.md, benchmarks/cost_fidelity.py).  Per math fn and form: (startup cycles,
# cycles per repeat).  A repeat is 256 bytes of the largest operand, except for the divisions,
# which run per element in fp32 (CAL_FP32_FNS: a repeat is 64 elements whatever the dtype, and a
# 2-byte dtype pays CAL_HALF_CONVERT cycles of conversion).  The forms' rules:
#   element-wise, scalar, select, fill, cvt:  startup + slope x repeats (a tile of more rows than
#                   the 8-bit repeat count holds, CAL_MAX_REPEAT, takes at least a repeat per row)
#   ROW reductions: startup + CAL_ROW_STEP per row + slope per repeat beyond one a row
#   COL reductions: startup + slope x repeats, + CAL_COL_STEP per row after the first (a chain
#                   of dependent steps; SUM adds rows pairwise: CAL_COL_STEP per halving)
#   TROWEXPAND: startup + CAL_ROWEXPAND_STEP per row; TROWEXPAND<op>: the op's element-wise
#               cost plus one repeat per 8 rows (the broadcast of the row values)
CAL_ROW_STEP = 7.5
CAL_MAX_REPEAT = 255
CAL_COL_STEP = 34.4
CAL_ROWEXPAND_STEP = 14.5
CAL_HALF_CONVERT = 16
CAL_FP32_FNS = ("DIV", "RECIP", "REM", "FMOD")
CALIBRATED: dict[tuple[str, str], tuple[float, float]] = {
    # unary
    ("ABS", ""): (4, 1), ("NEG", ""): (4, 1), ("RELU", ""): (4, 1), ("NOT", ""): (4, 1),
    ("EXP", ""): (31, 2), ("LOG", ""): (31, 2), ("SQRT", ""): (38, 2), ("RSQRT", ""): (26, 1),
    ("RECIP", ""): (10, 4), ("CVT", ""): (29, 1), ("CI", ""): (26, 1), ("FILL", ""): (26, 1),
    # tile op tile (also the element-wise part of the ROWEXPAND / COLEXPAND forms)
    **{(fn, ""): (26, 2) for fn in ("ADD", "SUB", "MUL", "MAX", "MIN", "AND", "OR", "XOR", "CMP", "SEL")},
    ("DIV", ""): (32, 4), ("REM", ""): (32, 4), ("FMOD", ""): (32, 4),
    # tile op scalar
    **{(fn, "S"): (26, 1) for fn in ("ADD", "SUB", "MUL", "MAX", "MIN", "AND", "OR", "XOR", "CMP", "SEL")},
    ("DIV", "S"): (70, 4), ("REM", "S"): (70, 4), ("FMOD", "S"): (70, 4),   # the scalar made a tile first
    # reductions and broadcasts
    **{(fn, "ROW"): (6, 2) for fn in ("SUM", "MAX", "MIN", "PROD")},
    **{(fn, "COL"): (294, 2) for fn in ("SUM", "MAX", "MIN", "PROD")},
    ("", "ROWEXPAND"): (5, 0), ("", "COLEXPAND"): (26, 1),
}


def calibrated(fn: str, form: str) -> tuple:
    """(startup, slope) of the calibrated rule of math `fn` in operand form `form`; the expand
    forms of a binary op (TROWEXPANDSUB) take the op's tile-op-tile constants."""
    c = CALIBRATED.get((fn, form))
    if c is None and form in ("ROWEXPAND", "COLEXPAND"):
        c = CALIBRATED.get((fn, ""))
    return c if c is not None else ()


def _rows() -> list[Instruction]:
    rows = [
        Instruction("TLOAD", "load", doc="GM window -> tile"),
        Instruction("TSTORE", "store", doc="tile -> GM window (from L0C on FIX, optionally act=relu)"),
        Instruction("TEXTRACT", "extract", doc="a window of an L1 tile -> L0A/L0B"),
        Instruction("TMOV", "move", doc="a bias row L1 -> BT"),
        Instruction("TMATMUL", "cube", doc="L0C = A x B"),
        Instruction("TMATMUL_ACC", "cube", doc="L0C += A x B"),
        Instruction("TMATMUL_BIAS", "cube", doc="L0C = bias row + A x B"),
    ]
    rows += [Instruction(f"T{fn}", "unary", fn, "", f, slope, doc=d) for fn, (f, slope, d) in UNARY_FNS.items()]
    rows.append(Instruction("TNOT", "unary", "NOT", "", np.logical_not, 1, doc="not x (a mask)"))
    rows.append(Instruction("TCVT", "cvt", "CVT", modes=("round", ROUND_MODES),
                            doc="dtype conversion; with round= (RINT ROUND FLOOR CEIL TRUNC) to an integral value"))
    rows.append(Instruction("TCI", "iota", "CI", "", sem.iota, 1,
                            doc="an arithmetic sequence: start + i * step, i the index along dim (start=, step=, dim=)"))
    rows += [Instruction(f"T{fn}", "binary", fn, "", f, slope, doc=d) for fn, (f, slope, d) in BINARY_FNS.items()]
    rows += [Instruction(f"T{fn}S", "scalar", fn, "S", f, slope, doc=d.replace("b", "scalar"))
             for fn, (f, slope, d) in BINARY_FNS.items()]
    rows += [Instruction(f"T{fn}", "binary", fn, "", f, slope, doc=d) for fn, (f, slope, d) in LOGIC_FNS.items()]
    rows += [Instruction(f"T{fn}S", "scalar", fn, "S", f, slope, doc=d.replace("b", "scalar"))
             for fn, (f, slope, d) in LOGIC_FNS.items()]
    rows += [Instruction("TCMP", "binary", "CMP", "", slope=1, modes=("cmp", COMPARE_MODES),
                         doc="a mask: a cmp b (cmp=EQ NE LT LE GT GE)"),
             Instruction("TCMPS", "scalar", "CMP", "S", slope=1, modes=("cmp", COMPARE_MODES),
                         doc="a mask: a cmp scalar"),
             Instruction("TSEL", "select", "SEL", "", sem.select, 1, doc="mask ? a : b"),
             Instruction("TSELS", "select_scalar", "SEL", "S", sem.select, 1, doc="mask ? a : scalar"),
             Instruction("TEXPANDS", "fill", "FILL", "", sem.fill, 1, doc="every element the scalar")]
    for rc, form in zip(REDUCE_FORMS, EXPAND_FORMS):
        along = "row" if rc == "ROW" else "column"
        rows.append(Instruction(f"T{form}", "expand", "", form, doc=f"a per-{along} vector broadcast along the {along}"))
        rows += [Instruction(f"T{form}{fn}", "expand_binary", fn, form, f, slope, doc=f"{d}, b per {along}")
                 for fn, (f, slope, d) in BINARY_FNS.items()]
        rows += [Instruction(f"T{rc}{fn}", "reduce", fn, rc, f, slope, doc=f"{d} of each {along}")
                 for fn, (f, slope, d) in REDUCE_FNS.items()]
    rows += [Instruction("MGATHER", "gather", "GATHER", "", sem.gather,
                         doc="gather-load: dst[..., j, ...] = src[..., index[..., j, ...], ...] along dim (an index "
                             "out of range is clipped; checked mode refuses it)"),
             Instruction("MSCATTER", "scatter", "SCATTER", "", modes=("atomic", {None: sem.scatter,
                                                                                "ADD": sem.scatter_add}),
                         doc="scatter-store: dst[..., index[..., j, ...], ...] = values[..., j, ...] along dim; "
                             "atomic=ADD adds into GM (duplicates accumulate, across cores too); an index out of "
                             "range is dropped (checked mode refuses it)")]
    rows += [Instruction("SET_FLAG", "flag", cycles=1, doc="signal an event from one pipe to another"),
             Instruction("WAIT_FLAG", "flag", cycles=1, doc="block a pipe until the event is set"),
             Instruction("PIPE_BARRIER", "barrier", cycles=1, doc="block until a pipe has drained"),
             Instruction("CROSS_SET_FLAG", "cross", cycles=1, doc="count up a flag of an AIV of the pair"),
             Instruction("CROSS_WAIT_FLAG", "cross", cycles=1, doc="block until the paired AIC has set the flag")]
    return rows


INSTRUCTIONS: dict[str, Instruction] = {r.name: (r if r.cost != "vector" else
                                                  dataclasses.replace(r, cal=calibrated(r.fn, r.form)))
                                        for r in _rows()}
_BY_MATH: dict[tuple[str, str], Instruction] = {(r.fn, r.form): r for r in INSTRUCTIONS.values() if r.fn or r.form}
_FORMS: dict[str, dict[str, str]] = {}      # math -> form -> opcode (the tiling asks per tile)
for (_fn, _form), _r in _BY_MATH.items():
    _FORMS.setdefault(_fn, {})[_form] = _r.name
del _fn, _form, _r
SYNC_OPS = tuple(r.name for r in INSTRUCTIONS.values() if r.cost == "sync")
MOVE_OPS = tuple(r.name for r in INSTRUCTIONS.values() if r.cost == "dma")


def opcodes(fn: str) -> dict[str, str]:
    """Every form of math `fn` the table has -> its opcode (`opcodes("CMP")` is
    {"": "TCMP", "S": "TCMPS"})."""
    return dict(_FORMS.get(fn, ()))


def find(fn: str, form: str = "") -> str:
    """The opcode applying math `fn` in operand form `form` (`find("SUB", "ROWEXPAND")` is
    "TROWEXPANDSUB"); KeyError naming what exists when there is none."""
    row = _BY_MATH.get((fn, form))
    if row is None:
        forms = sorted(f for g, f in _BY_MATH if g == fn)
        raise KeyError(f"no PTO instruction applies {fn!r} in form {form!r}"
                       + (f" (it exists in forms {forms})" if forms else ""))
    return row.name


def row(op: str) -> Instruction:
    """The table row of an opcode; KeyError for an unknown one."""
    return INSTRUCTIONS[op]


def pipe_of(op: str, src_space: str | None = None) -> str:
    """The pipe that executes an instruction (TSTORE: FIX from L0C, else MTE3)."""
    kind = INSTRUCTIONS[op].kind if op in INSTRUCTIONS else "unary"
    if kind == "store" and src_space == "L0C":
        return "FIX"
    return KINDS[kind].pipe


def gm_access(op: str) -> str | None:
    """Of an indexed DMA (MGATHER, MSCATTER): "read" when it reads a GM window, "write" when it
    writes one; None for any other instruction (TLOAD / TSTORE are named where they are read)."""
    r = INSTRUCTIONS.get(op)
    if r is None or r.kind not in INDEXED_KINDS:
        return None
    return "write" if KINDS[r.kind].dst == ("GM",) else "read"


def is_vector(op: str) -> bool:
    r = INSTRUCTIONS.get(op)
    return r is not None and r.cost == "vector"
