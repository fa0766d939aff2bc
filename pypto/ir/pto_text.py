"""The PTO program's text form: parser (the printer is `Program.text()` / `Instr.text()`).

    // PTO program softmax: 2 tasks, 14 instructions
    .gm x fp32[64,256] input
    .gm out fp32[64,256] output
    .task 0 AIV group=0 deps=[]              (a vector epilogue adds `pair=CUBE_TASK:SLOT`)
      TLOAD              UB[0x0]:fp32[32,256], GM:x[0:32,0:256]  ; kernel.py:5
      SET_FLAG           MTE2 -> V, EVENT_ID0
      WAIT_FLAG          MTE2 -> V, EVENT_ID0
      TROWMAX            UB[0x8000]:fp32[32,1], UB[0x0]:fp32[32,256], dim=1  ; kernel.py:5
      ...

Operands: on-chip tiles `SPACE[addr]:dtype[shape]{valid}` (valid only when it differs from the
shape), GM windows `GM:name[lo:hi,...]` or `GM:name{off=..,shape=[..],strides=[..]}`, scalars;
then attributes `dim=`, `offsets=(..)`, `to=`.  The first operand is the destination.  A
trailing `; file:line` is the kernel source location.  Print -> parse -> print is the identity
for every program the compiler produces; `parse` also accepts hand-edited programs and checks
each instruction (operand spaces and counts, pipes of the task's core, 32-byte aligned tiles,
capacities when a machine is given), raising `PTOSyntaxError` naming the line, the task, the
instruction index within the task and the kernel line.
"""
from __future__ import annotations

import linecache
import re

from ..dtypes import BY_NAME
from ..errors import PyptoError, SourceLoc
from ..target.isa import COMPARE_MODES, INSTRUCTIONS, KINDS, ROUND_MODES
from ..target.machine import get_machine
from ..target.semantics import ACTIVATIONS
from .core import Attrs, pair_problem, prod
from .exec import (ADDR_RING, ADDR_STEP, AIC_PIPES, AIV_PIPES, EVENT_STEP, EVENTS_PER_PIPE_PAIR, GM_STEP, OFFSETS_STEP, TEXT_ATTRS, ExecTask, Instr, Loop, TileRef,
                   loop_problem, pipe_of, static_instrs)
from .gm import GMBuffer, GMRef, natural_strides
from .tile import ON_CHIP, tile_bytes

# ---------------------------------------------------------------------------------------
# the instruction set the parser knows: the instruction table's rows (op -> row; row.kind gives
# the operand spaces, KINDS[kind])

CORE_SPACES = {"AIV": ("UB",), "AIC": ("L1", "L0A", "L0B", "L0C", "BT")}
CORE_PIPES = {"AIC": AIC_PIPES, "AIV": AIV_PIPES}
ROLES = ("input", "output", "inout", "workspace")
ATTR_KEYS = TEXT_ATTRS          # the instruction table's attributes, then gm_step= (loops)
STORE_ACTIVATIONS = tuple(ACTIVATIONS)     # what the FIX pipe applies on its way out of L0C


class PTOSyntaxError(PyptoError):
    """PTO text that cannot be parsed, or an instruction that breaks the machine's rules.

    Attributes: `line` (1-based line of the text), `task` and `index` (the instruction's task
    id and index within the task, None when not inside one), `kernel_loc` (the `; file:line`
    of the instruction, None when absent)."""

    def __init__(self, message: str, *, line: int | None = None, task: int | None = None,
                 index: int | None = None, op: str | None = None, text: str | None = None,
                 kernel_loc: SourceLoc | None = None, expected=None, got=None):
        self.line, self.task, self.index, self.kernel_loc, self.text = line, task, index, kernel_loc, text
        ctx = []
        if task is not None:
            ctx.append(f"task {task}")
        if index is not None:
            ctx.append(f"instruction {index}" + (f": {op}" if op else ""))
        if kernel_loc is not None:
            ctx.append(f"kernel {kernel_loc.short()}")
        if line is not None:
            head = f"line {line}" + (f" ({', '.join(ctx)})" if ctx else "")
        else:
            head = ", ".join(ctx)
        full = f"{head}: {message}" if head else message
        if text is not None:
            full += f"\n    {text.strip()}"
        if kernel_loc is not None:
            src = _kernel_source(kernel_loc)
            if src:
                full += f"\n  kernel line {kernel_loc.line}: {src}"
        super().__init__(full, expected=expected, got=got)

    def _compose(self) -> str:
        """The program line first (`line 8 (task 0, ...): ...`), then where the user parsed it."""
        parts = [self.message]
        if self.loc is not None:
            from ..errors import format_location
            parts.append(f"  in {self.loc.display()}:\n" + format_location(self.loc))
        if self.expected is not None or self.got is not None:
            parts.append(f"  expected: {self.expected}\n  got:      {self.got}")
        if self.hint:
            parts.append(f"  hint:     {self.hint}")
        return "\n".join(parts)


def _kernel_source(loc: SourceLoc) -> str:
    try:
        return linecache.getline(loc.file, loc.line).strip()
    except Exception:  # pragma: no cover - linecache is best effort
        return ""


class _Problem(Exception):
    """An instruction-level problem; the caller adds the line/task/instruction context."""

    def __init__(self, message, expected=None, got=None):
        super().__init__(message)
        self.message, self.expected, self.got = message, expected, got


# ---------------------------------------------------------------------------------------
# operands

_INT = r"-?\d+"
_INT_RE, _DIGITS, _SIGNED_RE = re.compile(_INT), re.compile(r"\d+"), re.compile(r"[+-]?\d+")
_WORD = re.compile(r"\w+")
_RANGE = re.compile(r"(\d+)\s*:\s*(\d+)")
_ADDR_RE = re.compile(r"0x[0-9a-fA-F]+|0|[1-9]\d*")       # (what int(text, 0) reads)
_PAREN, _PAREN_FLAT = re.compile(r"\(([^)]*)\)"), re.compile(r"\(([^()]*)\)")
_PARENS = re.compile(r"\((\([^()]*\)(?:\s*,\s*\([^()]*\))*)\)")
_LOOP = re.compile(r"\.loop\s+(\d+)")
# comma-separated integers (non-negative, or signed), as `_ints` accepts them one by one
_INT_LIST = re.compile(r"\s*\d+\s*(?:,\s*\d+\s*)*")
_SIGNED_LIST = re.compile(r"\s*-?\d+\s*(?:,\s*-?\d+\s*)*")
_TILE = re.compile(r"^(?P<space>[A-Za-z0-9]+)\[(?P<addr>0[xX][0-9a-fA-F]+|\d+)\]:(?P<dtype>\w+)"
                   r"\[(?P<shape>[^\]]*)\](?:\{(?P<valid>[^}]*)\})?$")
_GM_SHORT = re.compile(r"^(?P<name>[^\[\]{}:,\s]+)\[(?P<ranges>[^\]]*)\]$")
_GM_LONG = re.compile(r"^(?P<name>[^\[\]{}:,\s]+)\{\s*off\s*=\s*(?P<off>-?\d+)\s*,\s*shape\s*=\s*\[(?P<shape>[^\]]*)\]"
                      r"\s*,\s*strides\s*=\s*\[(?P<strides>[^\]]*)\]\s*\}$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf|nan)$")
_ESTEP = r"(?:\s*,\s*event_step\s*=\s*(?P<estep>-?\d+|\([^)]*\)))?"
_FLAG = re.compile(r"^(?P<src>\w+)\s*->\s*(?P<dst>\w+)\s*,\s*EVENT_ID(?P<event>\d+)" + _ESTEP + "$")
_CROSS_SET = re.compile(r"^(?P<src>\w+)\s*->\s*AIV(?P<slot>\d+)\s*,\s*EVENT_ID(?P<event>\d+)" + _ESTEP + "$")
_CROSS_WAIT = re.compile(r"^AIC\s*->\s*(?P<dst>\w+)\s*,\s*EVENT_ID(?P<event>\d+)" + _ESTEP + "$")
_TASK = re.compile(r"^\.task\s+(?P<id>\d+)\s+(?P<core>\w+)\s+group=(?P<group>\d+)\s+deps=\[(?P<deps>[^\]]*)\]"
                   r"(\s+core=(?P<pin>\d+))?(\s+pair=(?P<cube>\d+):(?P<slot>\d+))?$")
_GM_DECL = re.compile(r"^\.gm\s+(?P<name>[^\[\]{}:,\s]+)\s+(?P<dtype>\w+)\[(?P<shape>[^\]]*)\]\s+(?P<role>\w+)$")
_HEADER = re.compile(r"^//\s*PTO program\s+(?P<name>\S+?):")
_LOC = re.compile(r"^(?P<file>.+):(?P<line>\d+)$")
# text whose brackets close in order of opening, one level deep at most (operands, windows, steps
# of one loop): what `split_comment` and `_split_top` split without walking it
_BALANCED = re.compile(r"[^\[\]{}()]*(?:[\[{(][^\[\]{}()]*[\]})][^\[\]{}()]*)*")
# a comma of such text outside its brackets: no closing bracket before the next opening one
_TOP_COMMA = re.compile(r",(?![^\[\]{}()]*[\]})])")


def _ints(text: str, what: str, allow_empty=False, allow_negative=False) -> tuple[int, ...]:
    if (_SIGNED_LIST if allow_negative else _INT_LIST).fullmatch(text):
        return tuple(map(int, text.split(",")))
    parts = [p.strip() for p in text.split(",")] if text.strip() else []
    if not parts and not allow_empty:
        raise _Problem(f"empty {what}", expected="comma-separated integers", got=f"[{text}]")
    out = []
    for p in parts:
        if not (_INT_RE if allow_negative else _DIGITS).fullmatch(p):
            raise _Problem(f"bad {what}", expected="comma-separated integers", got=f"[{text}]")
        out.append(int(p))
    return tuple(out)


def _dtype(name: str):
    if name not in BY_NAME:
        raise _Problem(f"unknown dtype '{name}'", expected=" or ".join(BY_NAME), got=name)
    return BY_NAME[name]


def parse_tile(text: str) -> TileRef:
    m = _TILE.match(text)
    if not m:
        raise _Problem("bad tile operand", expected="SPACE[addr]:dtype[shape]{valid}, e.g. UB[0x100]:fp32[64,256]",
                       got=text)
    space = m["space"]
    if space not in ON_CHIP:
        raise _Problem(f"unknown on-chip space '{space}'", expected=" or ".join(ON_CHIP), got=space)
    shape = _ints(m["shape"], "tile shape")
    if min(shape) <= 0:                 # (`_ints` gives one size at least)
        raise _Problem("tile shape must be positive", expected="sizes >= 1", got=list(shape))
    valid = shape if m["valid"] is None else _ints(m["valid"], "valid shape")
    if valid is not shape and (len(valid) != len(shape) or any(not 1 <= v <= s for v, s in zip(valid, shape))):
        raise _Problem("valid shape does not fit the tile", expected=f"1 <= valid <= {list(shape)}, same rank",
                       got=list(valid))
    return TileRef(space, int(m["addr"], 0), _dtype(m["dtype"]), shape, valid)


def parse_gm(text: str, buffers: dict[str, GMBuffer]) -> GMRef:
    body = text[3:]
    m = _GM_LONG.match(body) or _GM_SHORT.match(body)
    if not m:
        raise _Problem("bad GM operand", expected="GM:name[lo:hi,...] or GM:name{off=..,shape=[..],strides=[..]}",
                       got=text)
    name = m["name"]
    if name not in buffers:
        raise _Problem(f"unknown GM buffer '{name}'",
                       expected="a buffer declared by a .gm line: " + (", ".join(buffers) or "(none declared)"),
                       got=name)
    buf = buffers[name]
    n = prod(buf.shape)
    if "off" in m.groupdict():
        shape = _ints(m["shape"], "GM window shape", allow_empty=True)
        strides = _ints(m["strides"], "GM window strides", allow_negative=True)
        if len(strides) != len(shape):
            raise _Problem("GM window shape and strides differ in rank", expected=f"{len(shape)} strides",
                           got=list(strides))
        ref = GMRef(buf, int(m["off"]), shape, strides)
    else:
        ranges = [r.strip() for r in m["ranges"].split(",")]
        for r in ranges:
            if not _RANGE.fullmatch(r):
                raise _Problem("bad GM range", expected="lo:hi, e.g. GM:x[0:64,0:256]", got=r)
        if len(ranges) != len(buf.shape):
            raise _Problem(f"GM window of '{name}' needs one range per dim", expected=f"{len(buf.shape)} ranges",
                           got=len(ranges))
        off, shape = 0, []
        nat = natural_strides(buf.shape)
        for r, dim, st in zip(ranges, buf.shape, nat):
            mm = _RANGE.fullmatch(r)
            if not mm:
                raise _Problem("bad GM range", expected="lo:hi", got=r)
            lo, hi = int(mm[1]), int(mm[2])
            if not 0 <= lo < hi <= dim:
                raise _Problem(f"GM range {lo}:{hi} outside buffer '{name}' dim of size {dim}",
                               expected=f"0 <= lo < hi <= {dim}", got=f"{lo}:{hi}")
            off += lo * st
            shape.append(hi - lo)
        ref = GMRef(buf, off, tuple(shape), nat)
    if ref.shape and min(ref.shape) <= 0:
        raise _Problem("GM window shape must be positive", expected="sizes >= 1", got=list(ref.shape))
    lo = ref.offset + sum((s - 1) * st for s, st in zip(ref.shape, ref.strides) if st < 0)
    hi = ref.offset + sum((s - 1) * st for s, st in zip(ref.shape, ref.strides) if st > 0) + 1
    if lo < 0 or hi > n:
        raise _Problem(f"GM window outside buffer '{name}'", expected=f"elements in [0, {n})", got=f"[{lo}, {hi})")
    return ref


def _split_top(body: str) -> list[str]:
    """Split at commas outside brackets, braces and parentheses."""
    if _BALANCED.fullmatch(body):       # (the usual operands: one level of brackets at most)
        return [p.strip() for p in _TOP_COMMA.split(body)] if body.strip() else []
    out, depth, cur = [], 0, []
    for ch in body:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
            if depth < 0:
                raise _Problem("unbalanced brackets", expected="operands with matching [] {} ()", got=body)
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise _Problem("unbalanced brackets", expected="operands with matching [] {} ()", got=body)
    last = "".join(cur).strip()
    if last or out:
        out.append(last)
    return out


def _attr_value(key: str, text: str):
    text = text.strip()
    if key == "offsets":
        m = _PAREN.fullmatch(text)
        if not m:
            raise _Problem("bad offsets", expected="offsets=(row,col)", got=text)
        return _ints(m[1], "offsets")
    if key == "dim":
        if _INT_RE.fullmatch(text):
            return int(text)
        m = _PAREN.fullmatch(text)
        if m:
            return _ints(m[1], "dims", allow_negative=True)
        raise _Problem("bad dim", expected="dim=<int>", got=text)
    if key in (OFFSETS_STEP, ADDR_STEP):    # one tuple per loop around the instruction
        m = _PAREN_FLAT.fullmatch(text)
        if m:
            return (_ints(m[1], key, allow_negative=True),)
        m = _PARENS.fullmatch(text)
        if not m:
            raise _Problem(f"bad {key}", expected=f"{key}=(a,b) or {key}=((a,b),(a,b),..)", got=text)
        return tuple(_ints(x, key, allow_negative=True) for x in _PAREN_FLAT.findall(m[1]))
    if key == ADDR_RING:        # per tile operand: - or lo:hi
        m = _PAREN_FLAT.fullmatch(text)
        out = []
        for part in (m[1].split(",") if m else ()):
            part = part.strip()
            lo, colon, hi = part.partition(":")
            if part == "-":
                out.append(None)
            elif colon and _ADDR_RE.fullmatch(lo.strip()) and _ADDR_RE.fullmatch(hi.strip()):
                out.append((int(lo, 0), int(hi, 0)))
            else:
                m = None
                break
        if not m:
            raise _Problem("bad addr_ring", expected="addr_ring=(-,0x0:0x40000): per tile operand - or lo:hi",
                           got=text)
        return tuple(out)
    if key == GM_STEP:          # one step per loop around the instruction, outermost first
        if _INT_RE.fullmatch(text):
            return (int(text),)
        m = _PAREN.fullmatch(text)
        if m:
            return _ints(m[1], "gm_step", allow_negative=True)
        raise _Problem("bad gm_step", expected="gm_step=<elements> or gm_step=(outer,inner,..)", got=text)
    if key == "cmp":
        if text not in COMPARE_MODES:
            raise _Problem("unknown comparison", expected="cmp=" + " or cmp=".join(COMPARE_MODES), got=f"cmp={text}")
        return text
    if key == "round":
        if text not in ROUND_MODES:
            raise _Problem("unknown rounding mode", expected="round=" + " or round=".join(ROUND_MODES),
                           got=f"round={text}")
        return text
    if key in ("start", "step"):
        if _INT_RE.fullmatch(text):
            return int(text)
        try:
            return float(text)
        except ValueError:
            raise _Problem(f"bad {key}", expected=f"{key}=<number>", got=text) from None
    if key == "atomic":         # an indexed store's mode, as its row names them (MSCATTER: ADD)
        modes = sorted({mode for r in INSTRUCTIONS.values() if r.modes and r.modes[0] == "atomic"
                        for mode in r.modes[1] if mode is not None})
        if text not in modes:
            raise _Problem("unknown atomic mode", expected="atomic=" + " or atomic=".join(modes), got=f"atomic={text}")
        return text
    if key == "act":
        if text not in STORE_ACTIVATIONS:
            raise _Problem("unknown activation of a store", expected="act=" + " or act=".join(STORE_ACTIVATIONS),
                           got=f"act={text}")
        return text
    _dtype(text)          # to=
    return text


def _scalar(text: str):
    if _SIGNED_RE.fullmatch(text):
        return int(text)
    return float(text)


def split_comment(line: str) -> tuple[str, str]:
    """(body, comment): the comment starts at the first ';' outside brackets."""
    i = line.find(";")
    if i < 0:
        return line, ""
    head = line[:i]
    if _BALANCED.fullmatch(head):       # (the usual line: no bracket open at its first ';')
        return head, line[i + 1:].strip()
    depth = 0
    for i, ch in enumerate(line):
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == ";" and depth == 0:
            return line[:i], line[i + 1:].strip()
    return line, ""


def comment_loc(comment: str) -> SourceLoc | None:
    """The kernel location of a `; file:line` comment (None for any other comment)."""
    m = _LOC.match(comment)
    return SourceLoc(m["file"], int(m["line"])) if m else None


def _event_step(m) -> dict:
    """The event_step= of a flag inside loops ({} without one)."""
    text = m["estep"]
    if text is None:
        return {}
    return {EVENT_STEP: _attr_value(GM_STEP, text)}


def parse_instr(text: str, buffers: dict[str, GMBuffer]) -> Instr:
    """One instruction line (without the leading indentation), e.g.
    `TADDS  UB[0x0]:fp32[8,64], UB[0x800]:fp32[8,64], 1.0  ; k.py:3`."""
    body, comment = split_comment(text)
    loc = comment_loc(comment)
    parts = body.strip().split(None, 1)
    if not parts:
        raise _Problem("empty instruction", expected="OP operands", got=repr(text))
    op = parts[0]
    rest = parts[1].strip() if len(parts) > 1 else ""
    row = INSTRUCTIONS.get(op)
    if row is None:
        close = [k for k in INSTRUCTIONS if k.startswith(op[:3])] or list(INSTRUCTIONS)
        raise _Problem(f"unknown instruction '{op}'", expected="one of " + ", ".join(close), got=op)
    kind = row.kind
    if kind == "flag":
        m = _FLAG.match(rest)
        if not m:
            raise _Problem(f"bad {op} operands", expected="SRC_PIPE -> DST_PIPE, EVENT_ID<n>", got=rest)
        attrs = Attrs({"src": m["src"], "dst": m["dst"], "event": int(m["event"]), **_event_step(m)})
        return Instr(op, m["src"] if op == "SET_FLAG" else m["dst"], attrs=attrs, loc=loc)
    if kind == "cross":
        setting = op == "CROSS_SET_FLAG"
        m = (_CROSS_SET if setting else _CROSS_WAIT).match(rest)
        if not m:
            raise _Problem(f"bad {op} operands", got=rest,
                           expected="SRC_PIPE -> AIV<slot>, EVENT_ID<n>" if setting else "AIC -> DST_PIPE, EVENT_ID<n>")
        if setting:
            attrs = Attrs({"src": m["src"], "slot": int(m["slot"]), "event": int(m["event"]), **_event_step(m)})
        else:
            attrs = Attrs({"dst": m["dst"], "event": int(m["event"]), **_event_step(m)})
        return Instr(op, m["src"] if setting else m["dst"], attrs=attrs, loc=loc)
    if kind == "barrier":
        pipes = rest or "ALL"
        if not _WORD.fullmatch(pipes):
            raise _Problem("bad PIPE_BARRIER operand", expected="a pipe name or ALL", got=rest)
        attrs = Attrs({} if pipes == "ALL" else {"pipes": pipes})
        return Instr(op, "S" if pipes == "ALL" else pipes, attrs=attrs, loc=loc)
    operands, attrs = [], {}
    for piece in _split_top(rest):
        if not piece:
            raise _Problem("empty operand", expected="operands separated by single commas", got=rest)
        key, eq, val = piece.partition("=")
        if eq and key.strip() in ATTR_KEYS:
            if key.strip() in attrs:
                raise _Problem(f"attribute '{key.strip()}' given twice", expected="each attribute once", got=piece)
            attrs[key.strip()] = _attr_value(key.strip(), val)
        elif eq and _WORD.fullmatch(key.strip()):
            raise _Problem(f"unknown attribute '{key.strip()}'", expected=" or ".join(ATTR_KEYS), got=piece)
        elif attrs:
            raise _Problem("operand after an attribute", expected="operands first, then attributes", got=piece)
        elif piece.startswith("GM:"):
            operands.append(parse_gm(piece, buffers))
        elif _NUMBER.match(piece):
            operands.append(_scalar(piece))
        else:
            operands.append(parse_tile(piece))
    if not operands:
        raise _Problem(f"{op} has no operands", expected="a destination and sources", got=rest or "nothing")
    dst, srcs = operands[0], tuple(operands[1:])
    if isinstance(dst, (int, float)):
        raise _Problem(f"{op}: the destination must be a tile or GM window", expected="a tile or GM operand first",
                       got=str(dst))
    src_space = srcs[0].space if srcs and isinstance(srcs[0], TileRef) else None
    return Instr(op, pipe_of(op, src_space), dst, srcs, Attrs(attrs), loc)


# ---------------------------------------------------------------------------------------
# checks of one instruction against the rules of the machine

def _space_of(o) -> str:
    if isinstance(o, GMRef):
        return "GM"
    if isinstance(o, TileRef):
        return o.space
    return "scalar"


def _describe(operands) -> str:
    return ", ".join(_space_of(o) for o in operands)


def _sig_text(dsts, srcs) -> str:
    return "/".join(dsts) + " <- " + ", ".join("/".join(s).replace("num", "scalar") for s in srcs)


def check_instr(ins: Instr, core_type: str, capacities: dict[str, int] | None = None) -> None:
    """Raise _Problem when the instruction breaks a rule (operands, pipe, alignment, capacity)."""
    op, row = ins.op, INSTRUCTIONS.get(ins.op)
    if row is None:
        raise _Problem(f"unknown instruction '{op}'", expected="one of " + ", ".join(INSTRUCTIONS), got=op)
    kind = row.kind
    pipes = CORE_PIPES.get(core_type)
    if pipes is None:
        raise _Problem(f"unknown core type '{core_type}'", expected="AIC or AIV", got=core_type)
    if kind == "flag":
        a = ins.attrs
        for p in (a["src"], a["dst"]):
            if p not in pipes:
                raise _Problem(f"pipe {p} does not exist on an {core_type} core", expected=" ".join(pipes), got=p)
        if a["src"] == a["dst"]:
            raise _Problem("a flag links two different pipes", expected="SRC -> DST with SRC != DST",
                           got=f"{a['src']} -> {a['dst']}")
        if not 0 <= a["event"] < EVENTS_PER_PIPE_PAIR:
            raise _Problem("event id out of range", expected=f"EVENT_ID0..EVENT_ID{EVENTS_PER_PIPE_PAIR - 1}",
                           got=f"EVENT_ID{a['event']}")
        return
    if kind == "cross":
        a, setting = ins.attrs, op == "CROSS_SET_FLAG"
        if core_type != ("AIC" if setting else "AIV"):
            raise _Problem(f"{op} runs on the {'cube' if setting else 'vector'} core of a pair",
                           expected="AIC" if setting else "AIV", got=core_type)
        if ins.pipe not in pipes:
            raise _Problem(f"pipe {ins.pipe} does not exist on an {core_type} core", expected=" ".join(pipes),
                           got=ins.pipe)
        if setting and a["slot"] not in (0, 1):
            raise _Problem("an AIC has two AIVs", expected="AIV0 or AIV1", got=f"AIV{a['slot']}")
        if not 0 <= a["event"] < EVENTS_PER_PIPE_PAIR:
            raise _Problem("event id out of range", expected=f"EVENT_ID0..EVENT_ID{EVENTS_PER_PIPE_PAIR - 1}",
                           got=f"EVENT_ID{a['event']}")
        return
    if kind == "barrier":
        if ins.pipe not in pipes:
            raise _Problem(f"pipe {ins.pipe} does not exist on an {core_type} core", expected=" ".join(pipes) + " or ALL",
                           got=ins.pipe)
        return
    operands = [ins.dst] + list(ins.srcs)
    spec = KINDS[kind]          # operand spaces: (dst spaces, [src spaces...]); "num" = a scalar
    dsts, srcs = spec.dst, list(spec.srcs)
    if kind == "cube":          # the accumulator or the bias row comes first
        srcs = {"TMATMUL_ACC": [("L0C",)], "TMATMUL_BIAS": [("BT",)]}.get(op, []) + srcs
    got_spaces = [_space_of(o) for o in operands]
    ok = len(operands) == 1 + len(srcs) and got_spaces[0] in dsts and all(
        g in w or (g == "scalar" and "num" in w) for g, w in zip(got_spaces[1:], srcs))
    if not ok:
        what = {"cube": "matmul operands must be L0A x L0B -> L0C", "load": "TLOAD moves GM -> UB/L1",
                "store": "TSTORE moves UB/L0C -> GM", "extract": "TEXTRACT moves L1 -> L0A/L0B",
                "move": "TMOV moves a bias row L1 -> BT"}.get(
                    kind, f"{op} works on UB tiles" + (" and a scalar" if kind == "scalar" else ""))
        raise _Problem(f"wrong operands for {op}: {what}", expected="dst <- srcs: " + _sig_text(dsts, srcs),
                       got=" <- ".join([got_spaces[0], ", ".join(got_spaces[1:])]))
    for o in operands:
        if isinstance(o, TileRef):
            if o.space not in CORE_SPACES[core_type]:
                raise _Problem(f"an {core_type} core has no {o.space}", expected="/".join(CORE_SPACES[core_type]),
                               got=o.space)
            if o.addr % 32:
                raise _Problem(f"tile rows must be 32-byte aligned: address {o.addr:#x} in {o.space} is not",
                               expected="an address that is a multiple of 32 (0x20)", got=f"{o.addr:#x}")
            if capacities is not None and o.space in capacities and o.addr + o.nbytes > capacities[o.space]:
                raise _Problem(f"tile {o.text()} ends beyond {o.space} ({o.nbytes} bytes at {o.addr:#x})",
                               expected=f"end <= {capacities[o.space]} ({capacities[o.space] // 1024} KiB)",
                               got=o.addr + tile_bytes(o.shape, o.dtype))
    if ins.pipe not in pipes:
        raise _Problem(f"{op} runs on pipe {ins.pipe}, which an {core_type} core does not have",
                       expected=" ".join(pipes), got=ins.pipe)
    _check_shapes(ins, kind)


def _check_shapes(ins: Instr, kind: str) -> None:
    op, dst, srcs, a = ins.op, ins.dst, ins.srcs, ins.attrs
    if kind in ("load", "store"):
        tile, gm = (dst, srcs[0]) if kind == "load" else (srcs[0], dst)
        if prod(tile.valid) != prod(gm.shape):
            raise _Problem(f"{op}: tile and GM window hold different numbers of elements",
                           expected=f"{list(tile.valid)} ({prod(tile.valid)} elements)",
                           got=f"{list(gm.shape)} ({prod(gm.shape)} elements)")
        if "act" in a and not (kind == "store" and tile.space == "L0C"):
            raise _Problem(f"{op}: act= is applied by the FIX pipe, on stores from L0C only",
                           expected="TSTORE GM <- L0C", got=f"{op} from {tile.space}")
    elif kind == "extract":
        if "offsets" not in a or len(a["offsets"]) != len(srcs[0].shape):
            raise _Problem("TEXTRACT needs offsets=(row,col) into its L1 tile", expected="offsets=(r,c)",
                           got=a.get("offsets"))
        if any(o + v > s for o, v, s in zip(a["offsets"], dst.valid, srcs[0].shape)):
            raise _Problem("TEXTRACT reads beyond its L1 tile", expected=f"offsets + {list(dst.valid)} <= "
                           f"{list(srcs[0].shape)}", got=a["offsets"])
    elif kind == "move":
        if dst.valid != srcs[0].valid:
            raise _Problem("TMOV copies its source tile", expected=f"destination valid {list(srcs[0].valid)}",
                           got=list(dst.valid))
    elif kind == "cube":
        x, y = srcs[-2], srcs[-1]
        if x.valid[-1] != y.valid[0] or dst.valid != (x.valid[0], y.valid[-1]):
            raise _Problem("matmul shapes do not fit: [M,K] x [K,N] -> [M,N]",
                           expected=f"[{x.valid[0]},{x.valid[-1]}] x [{x.valid[-1]},N] -> [{x.valid[0]},N]",
                           got=f"{list(x.valid)} x {list(y.valid)} -> {list(dst.valid)}")
        if op == "TMATMUL_BIAS" and srcs[0].valid != (1, y.valid[-1]):
            raise _Problem("the bias of TMATMUL_BIAS is one row of N values", expected=f"[1,{y.valid[-1]}]",
                           got=list(srcs[0].valid))
    elif kind == "cvt":
        if a.get("to") != dst.dtype.name:
            raise _Problem("TCVT's to= must be its destination dtype", expected=f"to={dst.dtype.name}",
                           got=f"to={a.get('to')}")
    elif kind == "reduce":
        if "dim" not in a:
            raise _Problem(f"{op} needs dim=", expected="dim=<int>", got="no dim")


# ---------------------------------------------------------------------------------------
# the program

def parse_program(text: str, machine=None):
    """Program text -> Program.  With a machine (name, Machine or .toml path), tiles are also
    checked against its buffer capacities.  Errors name the program line and the user's line
    that parsed it."""
    from ..errors import PyptoError, located
    try:
        if not isinstance(text, str):
            raise PTOSyntaxError("a program text must be a string", expected="str (e.g. ck.program.text())",
                                 got=type(text).__name__)
        return _parse_program(text, machine)
    except PyptoError as e:
        raise located(e).with_traceback(None) from None


def _parse_program(text: str, machine=None):
    from .program import Program
    capacities = None
    if machine is not None:
        capacities = get_machine(machine).capacities()
    name = None
    buffers: dict[str, GMBuffer] = {}
    tasks: list[ExecTask] = []
    cur: dict | None = None
    levels: dict[int, int] = {}
    parsed: dict[tuple, Instr] = {}         # (instruction line, core type) -> its instruction

    def close(lineno):
        if cur is None:
            return
        if len(cur["stack"]) > 1:
            raise PTOSyntaxError(f"task {cur['id']}: a .loop is not closed", line=cur["stack"][-1][1],
                                 task=cur["id"], expected=".endloop before the next .task or the end",
                                 got=f"{len(cur['stack']) - 1} open loop(s)")
        items = tuple(cur["stack"][0][0])
        problem = loop_problem(items)
        if problem:
            raise PTOSyntaxError(f"task {cur['id']}: {problem[0]}", task=cur["id"], kernel_loc=problem[1])
        tasks.append(ExecTask(cur["id"], cur["group"], cur["core"], cur["deps"], cur["level"],
                              items, cur["pair"], cur["pin"]))

    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("//"):
            m = _HEADER.match(line)
            if m and name is None and not buffers and cur is None:
                name = m["name"]
            elif re.match(r"^//\s*\.\.\.\s*\d+ more tasks", line):
                raise PTOSyntaxError("the program text is truncated (printed with max_tasks)",
                                     line=lineno, text=raw, expected="the whole program: program.text()",
                                     got=line)
            continue
        if line.startswith(".gm"):
            m = _GM_DECL.match(line)
            if not m:
                raise PTOSyntaxError("bad .gm line", line=lineno, text=raw,
                                     expected=".gm NAME DTYPE[shape] input|output|inout|workspace", got=line)
            try:
                dt = _dtype(m["dtype"])
                shape = _ints(m["shape"], "buffer shape", allow_empty=True)
            except _Problem as e:
                raise PTOSyntaxError(e.message, line=lineno, text=raw, expected=e.expected, got=e.got) from None
            if m["role"] not in ROLES:
                raise PTOSyntaxError(f"unknown role '{m['role']}' of GM buffer {m['name']}", line=lineno, text=raw,
                                     expected=" or ".join(ROLES), got=m["role"])
            if m["name"] in buffers:
                raise PTOSyntaxError(f"GM buffer '{m['name']}' declared twice", line=lineno, text=raw,
                                     expected="one .gm line per buffer", got=m["name"])
            buffers[m["name"]] = GMBuffer(m["name"], shape, dt, m["role"])
            parsed.clear()          # (a line's windows are of the buffers declared so far)
            continue
        if line.startswith(".task"):
            m = _TASK.match(line)
            if not m:
                raise PTOSyntaxError("bad .task line", line=lineno, text=raw,
                                     expected=".task ID AIC|AIV group=G deps=[..] [core=K] [pair=T:S]", got=line)
            close(lineno)
            tid, core = int(m["id"]), m["core"]
            if core not in CORE_PIPES:
                raise PTOSyntaxError(f"task {tid}: unknown core type '{core}'", line=lineno, task=tid, text=raw,
                                     expected="AIC or AIV", got=core)
            if tid != len(tasks):
                raise PTOSyntaxError("task ids must count 0, 1, 2, ... in program order", line=lineno, task=tid,
                                     text=raw, expected=f".task {len(tasks)}", got=f".task {tid}")
            try:
                deps = _ints(m["deps"], "deps", allow_empty=True)
            except _Problem as e:
                raise PTOSyntaxError(f"task {tid}: {e.message}", line=lineno, task=tid, text=raw,
                                     expected=e.expected, got=e.got) from None
            bad = [d for d in deps if d not in levels]
            if bad:
                raise PTOSyntaxError(f"task {tid} depends on a later or unknown task", line=lineno, task=tid,
                                     text=raw, expected=f"ids < {tid}", got=list(deps))
            pair = (int(m["cube"]), int(m["slot"])) if m["cube"] is not None else None
            problem = pair_problem(core, pair, {t.id: t.core_type for t in tasks})
            if problem:
                raise PTOSyntaxError(problem, line=lineno, task=tid, text=raw,
                                     expected="pair=CUBE_TASK:0|1 on an AIV task", got=f"pair={m['cube']}:{m['slot']}")
            level = 1 + max((levels[d] for d in deps), default=-1)
            levels[tid] = level
            cur = {"id": tid, "group": int(m["group"]), "core": core, "deps": deps, "level": level,
                   "stack": [([], lineno, None)], "n": 0,     # (items, line, loop count) per open loop
                   "pair": pair, "pin": int(m["pin"]) if m["pin"] is not None else None}
            continue
        if line.startswith(".loop") or line == ".endloop":
            if cur is None:
                raise PTOSyntaxError(f"{line.split()[0]} outside a task", line=lineno, text=raw,
                                     expected="loops inside a .task", got=line)
            if line == ".endloop":
                if len(cur["stack"]) == 1:
                    raise PTOSyntaxError(".endloop without a .loop", line=lineno, task=cur["id"], text=raw,
                                         expected=".loop N before it", got=line)
                body, start, count = cur["stack"].pop()
                if not body:
                    raise PTOSyntaxError("an empty loop", line=start, task=cur["id"],
                                         expected="instructions between .loop and .endloop", got="none")
                cur["stack"][-1][0].append(Loop(count, tuple(body)))
                continue
            m = _LOOP.fullmatch(line)
            if not m or int(m[1]) < 1:
                raise PTOSyntaxError("bad .loop line", line=lineno, task=cur["id"], text=raw,
                                     expected=".loop N (N >= 1 iterations)", got=line)
            cur["stack"].append(([], lineno, int(m[1])))
            continue
        if line.startswith("."):
            raise PTOSyntaxError(f"unknown directive '{line.split()[0]}'", line=lineno, text=raw,
                                 expected=".gm, .task, .loop or .endloop", got=line.split()[0])
        op = line.split(None, 1)[0]
        if cur is None:
            raise PTOSyntaxError(f"instruction {op} outside a task (missing .task header)", line=lineno, text=raw,
                                 expected=".task ID AIC|AIV group=G deps=[..] before the instructions",
                                 got="an instruction before any .task line")
        index = cur["n"]
        try:
            # (a program's lines repeat: a 4096^3 matmul's 52k are 1.5k distinct; an instruction
            # is immutable, so a line parsed and checked once gives its instruction again)
            seen = (line, cur["core"])
            ins = parsed.get(seen)
            if ins is None:
                ins = parse_instr(line, buffers)
                check_instr(ins, cur["core"], capacities)
                parsed[seen] = ins
            depth = len(cur["stack"]) - 1
            for key in (GM_STEP, EVENT_STEP, OFFSETS_STEP, ADDR_STEP):
                if key in ins.attrs and len(ins.attrs[key]) != depth:
                    raise _Problem(f"{key}= needs one step per loop around the instruction ({depth})",
                                   expected=f"{depth} step{'s' if depth != 1 else ''}" if depth else
                                   f"no {key} outside a loop", got=len(ins.attrs[key]))
        except _Problem as e:
            raise PTOSyntaxError(e.message, line=lineno, task=cur["id"], index=index, op=op, text=raw,
                                 kernel_loc=comment_loc(split_comment(line)[1]), expected=e.expected,
                                 got=e.got) from None
        cur["stack"][-1][0].append(ins)
        cur["n"] += 1
    close(None)
    if name is None:
        name = "program"
    return Program(name, tuple(buffers.values()), tuple(tasks))


def verify_program(program, machine=None) -> None:
    """Check every instruction of an in-memory program (as `parse` does for text): operand
    spaces and counts, pipes, 32-byte alignment and, with a machine, capacities.  Raises
    PTOSyntaxError naming the task and instruction index (line = None)."""
    capacities = m = None
    if machine is not None:
        m = get_machine(machine)
        capacities = m.capacities()
    core_of: dict[int, str] = {}
    for pos, t in enumerate(program.tasks):
        if t.id != pos:
            raise PTOSyntaxError("task ids must count 0, 1, 2, ... in program order", task=t.id,
                                 expected=pos, got=t.id)
        if any(d not in core_of for d in t.deps):
            raise PTOSyntaxError(f"task {t.id} depends on a later or unknown task", task=t.id,
                                 expected=f"ids < {t.id}", got=list(t.deps))
        problem = pair_problem(t.core_type, t.pair, core_of)
        if problem is None and t.pair and m is not None and m.n_aiv < 2 * m.n_aic:
            problem = f"machine {m.name} has no 1 AIC : 2 AIV pairs ({m.n_aic} AIC, {m.n_aiv} AIV)"
        if problem:
            raise PTOSyntaxError(problem, task=t.id, expected="pair=CUBE_TASK:0|1 on an AIV task", got=t.pair)
        _check_core(program, t, m)
        problem = loop_problem(t.code)
        if problem:
            raise PTOSyntaxError(f"task {t.id}: {problem[0]}", task=t.id, kernel_loc=problem[1])
        for k, (ins, _) in enumerate(static_instrs(t.code)):
            try:
                check_instr(ins, t.core_type, capacities)
                if ins.op == "CROSS_WAIT_FLAG" and t.pair is None:
                    raise _Problem("CROSS_WAIT_FLAG waits for the cube task of a pair; this task has none",
                                   expected="a task header with pair=CUBE_TASK:SLOT", got="no pair")
            except _Problem as e:
                raise PTOSyntaxError(e.message, task=t.id, index=k, op=ins.op, text=ins.text(),
                                     kernel_loc=ins.loc, expected=e.expected, got=e.got) from None
        core_of[t.id] = t.core_type


def _check_core(program, t, m) -> None:
    """A task's `core=` must exist on the machine, and a paired epilogue's must be the AIV of its
    cube task's AIC (2k + slot)."""
    if t.core is None:
        return
    if m is not None:
        n = m.n_aic if t.core_type == "AIC" else m.n_aiv
        if t.core >= n:
            raise PTOSyntaxError(f"task {t.id} is assigned to {t.core_type}{t.core}, which machine {m.name} "
                                 f"does not have", task=t.id, expected=f"core < {n} (or compile for {m.name})",
                                 got=f"core={t.core}")
    cube = program.tasks[t.pair[0]] if t.pair else None
    if cube is not None and cube.core is not None and t.core != 2 * cube.core + t.pair[1]:
        raise PTOSyntaxError(f"task {t.id} is paired with task {cube.id} on AIC{cube.core}, so it runs on "
                             f"AIV{2 * cube.core + t.pair[1]}", task=t.id,
                             expected=f"core={2 * cube.core + t.pair[1]}", got=f"core={t.core}")
