"""The cost of an instruction as a user asks for it, and the instruction table of the documentation.

The cost model itself is the target's (`pypto.target.cost.base_cycles`, reading the slopes and
fixed cycles of the instruction table `pypto.target.isa`):

- cube: 6 + c * ceil(M/16) * ceil(K/K0) * ceil(N/16), K0 = 32 bytes / sizeof(A), c = 2 for fp32;
- vector: head + slope * repeats + tail, a repeat being 256 bytes; an instruction that follows
  another on a busy V pipe shares its startup (no head);
- DMA: bytes / path bandwidth (GM traffic is additionally limited by the shared HBM, in timing).

`cost(op, machine, **shape)` builds a synthetic instruction and asks `base_cycles`;
`instruction_table(machine)` lists every instruction the compiler can emit with its pipe, its
rule and an example (docs/instructions.md is made from it).
"""
from __future__ import annotations

from typing import NamedTuple

from ..dtypes import BY_NAME, DType, from_numpy
from ..errors import PyptoError
from ..ir.core import Attrs
from ..ir.exec import Instr, TileRef
from ..ir.gm import GMBuffer, GMRef
from ..target.cost import base_cycles, calibrated_rule_class
from ..target.isa import (CAL_COL_STEP, CAL_HALF_CONVERT, CAL_ROW_STEP, CAL_ROWEXPAND_STEP, INDEXED_KINDS,
                          INDEXED_SECTOR, INSTRUCTIONS, KINDS, pipe_of)
from ..target.machine import get_machine


# ---------------------------------------------------------------------------------------
# the instruction vocabulary

def vocabulary() -> dict[str, str]:
    """Every instruction the compiler can emit -> its kind (load, store, extract, move, cube,
    unary, cvt, binary, scalar, expand, expand_binary, reduce, sync), in documentation order."""
    return {op: "sync" if r.cost == "sync" else r.kind for op, r in INSTRUCTIONS.items()}


def _dtype(d, what="dtype") -> DType:
    if isinstance(d, DType):
        return d
    if isinstance(d, str) and d in BY_NAME:
        return BY_NAME[d]
    try:
        dt = from_numpy(d)
    except TypeError:
        dt = None
    if dt is None:
        raise PyptoError(f"cost: unknown {what}", expected=" or ".join(BY_NAME), got=repr(d))
    return dt


def _shape(s, what="shape") -> tuple[int, ...]:
    if isinstance(s, int):
        s = (s,)
    try:
        t = tuple(int(x) for x in s)
    except TypeError:
        t = ()
    if not t or any(x <= 0 for x in t):
        raise PyptoError(f"cost: bad {what}", expected="a tuple of positive ints, e.g. (64, 256)", got=repr(s))
    return t


def _tile(space, dtype, shape, valid=None) -> TileRef:
    return TileRef(space, 0, dtype, shape, shape if valid is None else valid)


_ARGS = {
    "cube": ("m", "k", "n", "dtype"),
    "load": ("shape", "dtype", "src", "dst", "valid"),
    "store": ("shape", "dtype", "src", "dst", "valid"),
    "extract": ("shape", "dtype", "src", "dst", "valid"),
    "move": ("shape", "dtype", "src", "dst", "valid"),
    "cvt": ("shape", "dtype", "to", "valid"),
    "sync": ("src", "dst", "event", "pipes"),
}
_VECTOR_ARGS = ("shape", "dtype", "valid")


def synthetic_instr(op: str, **kw) -> Instr:
    """An instruction with the given shapes and dtype, as the compiler would emit it."""
    op = op.upper()
    vocab = vocabulary()
    kind = vocab.get(op)
    if kind is None:
        raise PyptoError(f"cost: unknown instruction {op}", expected="one of " + ", ".join(vocab), got=op)
    allowed = _ARGS.get(kind, _VECTOR_ARGS)
    bad = [k for k in kw if k not in allowed]
    if bad:
        raise PyptoError(f"cost: {op} takes no argument '{bad[0]}'", expected=", ".join(allowed),
                         got=", ".join(bad))
    if kind == "sync":
        if op == "PIPE_BARRIER":
            return Instr(op, "S", attrs=Attrs({"pipes": kw["pipes"]} if "pipes" in kw else {}))
        if op == "CROSS_SET_FLAG":
            return Instr(op, kw.get("src", "FIX"), attrs=Attrs({"src": kw.get("src", "FIX"), "slot": 0,
                                                               "event": kw.get("event", 0)}))
        if op == "CROSS_WAIT_FLAG":
            return Instr(op, kw.get("dst", "MTE2"), attrs=Attrs({"dst": kw.get("dst", "MTE2"),
                                                                "event": kw.get("event", 0)}))
        a = Attrs({"src": kw.get("src", "MTE2"), "dst": kw.get("dst", "V"), "event": kw.get("event", 0)})
        return Instr(op, a["src"] if op == "SET_FLAG" else a["dst"], attrs=a)
    if kind == "cube":
        missing = [k for k in ("m", "k", "n") if k not in kw]
        if missing:
            raise PyptoError(f"cost: {op} needs m, k and n", expected="m=, k=, n= (and dtype=)",
                             got="missing " + ", ".join(missing))
        m_, k, n = (_shape(kw[x], x)[0] for x in ("m", "k", "n"))
        dt = _dtype(kw.get("dtype", "fp16"))
        acc = BY_NAME["int32"] if dt.name == "int8" else BY_NAME["fp32"]
        a, b, c = _tile("L0A", dt, (m_, k)), _tile("L0B", dt, (k, n)), _tile("L0C", acc, (m_, n))
        first = {"TMATMUL_ACC": (c,), "TMATMUL_BIAS": (_tile("BT", acc, (1, n)),)}.get(op, ())
        srcs = first + (a, b)
        return Instr(op, pipe_of(op), c, srcs)
    if "shape" not in kw:
        raise PyptoError(f"cost: {op} needs shape=", expected="shape=(rows, cols), dtype=", got="no shape")
    shape = _shape(kw["shape"])
    valid = _shape(kw["valid"], "valid") if "valid" in kw else shape
    if len(valid) != len(shape) or any(v > s for v, s in zip(valid, shape)):
        raise PyptoError(f"cost: valid shape of {op} exceeds its shape", expected=f"<= {list(shape)}",
                         got=list(valid))
    dt = _dtype(kw.get("dtype", "fp32"))
    if kind in ("load", "store", "extract", "move"):
        default = {"load": ("GM", "UB"), "store": ("UB", "GM"), "extract": ("L1", "L0A"), "move": ("L1", "BT")}[kind]
        src, dst = kw.get("src", default[0]), kw.get("dst", default[1])
        legal = {"load": (("GM",), ("UB", "L1")), "store": (("UB", "L0C"), ("GM",)),
                 "extract": (("L1",), ("L0A", "L0B")),
                 "move": (("L1",), ("BT",))}[kind]
        if src not in legal[0] or dst not in legal[1]:
            raise PyptoError(f"cost: {op} cannot move {src} -> {dst}",
                             expected=f"src in {'/'.join(legal[0])}, dst in {'/'.join(legal[1])}",
                             got=f"src={src!r}, dst={dst!r}")
        if kind == "load":
            gm = GMRef.whole(GMBuffer("x", valid, dt, "input"))
            return Instr(op, pipe_of(op), _tile(dst, dt, shape, valid), (gm,))
        if kind == "store":
            gm = GMRef.whole(GMBuffer("y", valid, dt, "output"))
            tdt = (BY_NAME["int32"] if dt.name in ("int8", "int32") else BY_NAME["fp32"]) if src == "L0C" else dt
            return Instr(op, pipe_of(op, src), gm, (_tile(src, tdt, shape, valid),))
        attrs = Attrs({"offsets": (0,) * len(shape)}) if kind == "extract" else Attrs()
        return Instr(op, pipe_of(op), _tile(dst, dt, shape, valid), (_tile(src, dt, shape),), attrs)
    rows_shape = shape[:-1] + (1,)
    rows_valid = valid[:-1] + (1,)
    cols_shape = shape[:-2] + (1, shape[-1]) if len(shape) >= 2 else shape
    cols_valid = valid[:-2] + (1, valid[-1]) if len(valid) >= 2 else valid
    full = _tile("UB", dt, shape, valid)
    if kind in INDEXED_KINDS:       # MGATHER / MSCATTER: a GM table of the valid shape, an int32 index tile
        gm = GMRef.whole(GMBuffer("x", valid, dt, "input" if kind == "gather" else "output"))
        idx = _tile("UB", BY_NAME["int32"], shape, valid)
        return Instr(op, pipe_of(op), *((full, (gm, idx)) if kind == "gather" else (gm, (full, idx))),
                     Attrs({"dim": 0}))
    if kind == "unary":
        return Instr(op, "V", full, (full,))
    if kind == "cvt":
        to = _dtype(kw.get("to", "fp16" if dt.name == "fp32" else "fp32"), "to dtype")
        return Instr(op, "V", _tile("UB", to, shape, valid), (full,), Attrs({"to": to.name}))
    if kind == "binary":
        return Instr(op, "V", full, (full, full))
    if kind == "scalar":
        return Instr(op, "V", full, (full, 1.0))
    row = INSTRUCTIONS[op].form in ("ROW", "ROWEXPAND")     # else per column
    part = _tile("UB", dt, rows_shape, rows_valid) if row else _tile("UB", dt, cols_shape, cols_valid)
    if kind == "expand":
        return Instr(op, "V", full, (part, full))
    if kind == "expand_binary":
        return Instr(op, "V", full, (full, part))
    # reduce: shape is the input's
    return Instr(op, "V", part, (full,), Attrs({"dim": len(shape) - 1 if row else len(shape) - 2}))


def cost(op: str, machine="a2a3", *, cost_model: str | None = None, **shape_and_dtype) -> int:
    """Cycles of one instruction alone on its pipe (vector: with its head and tail; a GM load:
    until its data is there, under the calibrated rules).

        cost("TMATMUL", m=40, k=50, n=60, dtype="fp16")              # 54
        cost("TEXP", shape=(64, 256), dtype="fp32")                   # a2a3: 31 + 2 x 256 repeats
        cost("TLOAD", shape=(64, 256), dtype="fp32", src="GM", dst="UB")
        cost("TSTORE", shape=(64, 256), dtype="fp16", src="L0C")      # on FIX
        cost("TEXTRACT", shape=(128, 64), dtype="fp16", dst="L0B")
        cost("SET_FLAG")

    Shapes are tile shapes (`valid=` for a tail tile); reductions take their input's shape,
    expansions their output's.  `machine` is a Machine, a name or a .toml path; `cost_model`
    ("calibrated" or "public") overrides the machine's rules (docs/cost_model.md):

        cost("TEXP", shape=(64, 256), dtype="fp32")                         # 543 on a2a3
        cost("TEXP", shape=(64, 256), dtype="fp32", cost_model="public")    # 1052
    """
    m = get_machine(machine)
    if cost_model is not None and cost_model != m.cost_model:
        m = m.replace(cost_model=cost_model)
    return base_cycles(synthetic_instr(op, **shape_and_dtype), m)


# ---------------------------------------------------------------------------------------
# the instruction table (docs/instructions.md)

class InstrRow(NamedTuple):
    op: str
    pipe: str
    operands: str        # e.g. "UB <- GM"
    rule: str            # the cost rule, with this machine's numbers
    example: str         # the example's arguments
    cycles: int          # cost(op, machine, **example)


EXAMPLE_SHAPE = (64, 256)


def _fmt_bw(x: float) -> str:
    return f"{x:g}"


def instruction_table(machine="a2a3") -> list[InstrRow]:
    """One row per instruction (and data path) the compiler can emit, computed from the cost
    model's own rules: the instruction table's slopes and cycles, its pipes, the cube formula
    and the machine's DMA paths."""
    m = get_machine(machine)
    head, tail, rep = m.vec_head, m.vec_tail, m.vec_repeat_bytes
    rows: list[InstrRow] = []

    def add(op, operands, rule, example_text, **kw):
        ins = synthetic_instr(op, **kw)
        rows.append(InstrRow(op, ins.pipe, operands, rule, example_text, base_cycles(ins, m)))

    calibrated = m.cost_model == "calibrated"

    def dma_rule(src, dst):
        if calibrated and src == "GM":
            return (f"DMAs x {m.dma_burst_cycles} + bytes / ({_fmt_bw(m.gm_load_peak_gibps)} GiB/s) x "
                    f"{m.clock_ghz:g} GHz; a DMA per 2-D slice of the window (dims of size 1 left out)")
        return f"ceil(bytes / ({_fmt_bw(m.bandwidth_gibps[(src, dst)])} GiB/s) x {m.clock_ghz:g} GHz)"

    ex = f"fp32{list(EXAMPLE_SHAPE)}".replace(" ", "")
    ex16 = f"fp16{list(EXAMPLE_SHAPE)}".replace(" ", "")
    for op, kind in vocabulary().items():
        if kind == "load":
            for dst in ("UB", "L1"):
                add(op, f"{dst} <- GM", dma_rule("GM", dst) + " (+ shared HBM)", ex, shape=EXAMPLE_SHAPE, dtype="fp32", dst=dst)
        elif kind == "store":
            add(op, "GM <- UB", dma_rule("UB", "GM") + " (+ shared HBM)", ex, shape=EXAMPLE_SHAPE, dtype="fp32", src="UB")
            add(op, "GM <- L0C", dma_rule("L0C", "GM") + " (+ shared HBM); bytes in the GM dtype", ex16 + " (from fp32 L0C)",
                shape=EXAMPLE_SHAPE, dtype="fp16", src="L0C")
        elif kind == "extract":
            for dst in ("L0A", "L0B"):
                add(op, f"{dst} <- L1", dma_rule("L1", dst) + "; bytes of the extracted tile",
                    "fp16[128,64]", shape=(128, 64), dtype="fp16", dst=dst)
        elif kind == "move":
            add(op, "BT <- L1", dma_rule("L1", "BT") + "; the bias row of TMATMUL_BIAS", "fp32[1,128]",
                shape=(1, 128), dtype="fp32", src="L1", dst="BT")
        elif kind == "cube":
            rule = f"{m.cube_startup} + c x ceil(M/16) x ceil(K/K0) x ceil(N/16); K0 = 32 B / sizeof(A), c = 2 for fp32"
            operands = {"TMATMUL_ACC": "L0C <- L0C + L0A x L0B",
                        "TMATMUL_BIAS": "L0C <- BT row + L0A x L0B"}.get(op, "L0C <- L0A x L0B")
            add(op, operands, rule, "M=40 K=50 N=60 fp16", m=40, k=50, n=60, dtype="fp16")
        elif kind in INDEXED_KINDS:
            path = ("GM", "UB") if kind == "gather" else ("UB", "GM")
            rule = (dma_rule(*path).replace("bytes", f"elements x {INDEXED_SECTOR} B")
                    + "; a 32-byte GM sector per element (SIMT on the vector core)")
            add(op, KINDS[kind].operands, rule, ex, shape=EXAMPLE_SHAPE, dtype="fp32")
        elif kind == "sync":
            operands = {"PIPE_BARRIER": "pipe", "CROSS_SET_FLAG": "pipe -> AIV slot, EVENT_ID",
                        "CROSS_WAIT_FLAG": "AIC -> pipe, EVENT_ID"}.get(op, "pipe -> pipe, EVENT_ID")
            note = {"SET_FLAG": "", "WAIT_FLAG": ", then blocks until the matching SET_FLAG has run",
                    "PIPE_BARRIER": ", then blocks until the pipe has drained",
                    "CROSS_SET_FLAG": "; counts up a flag of an AIV of the pair",
                    "CROSS_WAIT_FLAG": ", then blocks until the paired AIC has set the flag"}[op]
            ins = synthetic_instr(op)
            pipe = {"SET_FLAG": "source pipe", "WAIT_FLAG": "waiting pipe", "PIPE_BARRIER": "its pipe",
                    "CROSS_SET_FLAG": "AIC pipe", "CROSS_WAIT_FLAG": "AIV pipe"}[op]
            rows.append(InstrRow(op, pipe, operands, f"{INSTRUCTIONS[op].cycles}{note}", "-", base_cycles(ins, m)))
        else:
            rule = (calibrated_rule(INSTRUCTIONS[op], rep) if calibrated
                    else f"{head} + {INSTRUCTIONS[op].slope} x ceil(bytes / {rep}) + {tail}")
            operands = KINDS[kind].operands
            extra = {"to": "fp16"} if kind == "cvt" else {}
            text = ex + (" -> fp16" if kind == "cvt" else "") + (" input" if kind == "reduce" else "")
            add(op, operands, rule, text, shape=EXAMPLE_SHAPE, dtype="fp32", **extra)
    return rows


def calibrated_rule(row, rep: int = 256) -> str:
    """The calibrated rule of a vector instruction, with its constants (isa.CALIBRATED)."""
    startup, slope = row.cal
    reps = f"ceil(bytes / {rep})"
    extra = " + ceil(rows / 8)" if row.form == "ROWEXPAND" else ""
    return {
        "fp32": f"{startup:g} + {slope:g} x ceil(elements x 4 / {rep}) (+ {CAL_HALF_CONVERT} for 2-byte dtypes)"
                + extra,
        "row_reduce": f"{startup:g} + {CAL_ROW_STEP:g} x rows + {slope:g} x ({reps} - rows)",
        "col_sum": f"{startup:g} + {slope:g} x {reps} + {CAL_COL_STEP:g} x ceil(log2 rows)",
        "col_chain": f"{startup:g} + {slope:g} x {reps} + {CAL_COL_STEP:g} x (rows - 1)",
        "row_broadcast": f"{startup:g} + {CAL_ROWEXPAND_STEP:g} x rows",
        "elementwise": f"{startup:g} + {slope:g} x {reps}" + extra,
    }[calibrated_rule_class(row)]


def instruction_table_markdown(machines=("a2a3", "teach", "a5")) -> str:
    """docs/instructions.md: the instruction table of each machine."""
    out = ["# PTO instructions: pipes and costs", "",
           "Generated by `scripts/gen_instruction_table.py` from `pypto.sim.cost.instruction_table` "
           "(do not edit by hand).", "",
           "`cycles` is the cost of the example alone on its pipe: `pypto.sim.cost(op, machine, **example)`.", "",
           "Each machine follows one of two cost models (`Machine.cost_model`, see docs/cost_model.md):",
           "",
           "- public (teach, a5): vector (pipe V) head + slope x repeats + tail; a repeat is 256 bytes of the "
           "largest operand (rows padded to 32 bytes); DMA: bytes over the path's bandwidth per core;",
           "- calibrated (a2a3): constants fitted to hardware-measured cycles of single instructions: a startup "
           "and a slope per op, divisions per element in fp32, row reductions and row broadcasts per row, column "
           "reductions a chain of steps (a tile of more than 255 rows takes a repeat per row at least); GM loads "
           "a startup per 2-D DMA plus the bytes at the measured peak;",
           "- both: an instruction issued right after another on a busy V pipe shares its startup (`vec_head` "
           "cycles less); cube (pipe M): the public formula, M, K, N the valid sizes of the operands; TLOAD/TSTORE "
           "also share the machine's HBM and L2 with all cores in the timing simulation (bytes of the GM window);",
           "- SET_FLAG runs on the producer's pipe, WAIT_FLAG on the consumer's.", ""]
    for name in machines:
        m = get_machine(name)
        out += [f"## {m.name}", "",
                f"{m.n_aic} AIC + {m.n_aiv} AIV cores at {m.clock_ghz:g} GHz; UB {m.ub_kib} KiB, L1 {m.l1_kib} KiB, "
                f"L0A/L0B {m.l0a_kib}/{m.l0b_kib} KiB, L0C {m.l0c_kib} KiB; HBM {m.hbm_gbps:g} GB/s; "
                f"L2 {m.l2_mib} MiB ({m.l2_line_bytes}-byte lines, {m.l2_hit_cycles}-cycle hit, "
                f"+{m.l2_miss_extra_cycles} on a miss); cost model: {m.cost_model}.", "",
                "| op | pipe | operands | cost rule (cycles) | example | cycles |",
                "|---|---|---|---|---|---:|"]
        for r in instruction_table(m):
            out.append(f"| {r.op} | {r.pipe} | {r.operands} | {r.rule} | {r.example} | {r.cycles} |")
        out.append("")
    return "\n".join(out)
