"""Dynamic dims: which axis of every value is the run-time dim, and the program of a call.

A kernel with `pypto.DYNAMIC` dims is compiled once, for a *chunk* of `c` rows of that dim (the
first dim of every parameter that has one; `chunk_for`, cut to keep its program within
MAX_CHUNK_INSTRS) and for a ladder of smaller numbers of rows; a call on N rows runs the chunk's program once per whole chunk, on the rows [j * c, (j + 1) * c)
of every dynamic tensor, and the ladder's programs on the rest (`DynamicInfo.pieces`), the last one
on rows padded past N (whose results are dropped).  That computes what the kernel traced at
N rows computes exactly when every output row depends on the same row of the inputs, computed the
same way for every row: `row_axes` checks that on the Tensor Graph (op by op, from the registry's
kinds) and names the kernel line of the first op that reduces over, or mixes, rows of the dim.
`instantiate` makes the program of a call: the chunk's tasks once per chunk, their GM windows on
dynamic tensors moved by the chunk's rows, a workspace of their own per chunk, the tasks whose
rows all lie past N left out.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UnsupportedError
from ..ir.core import ceil_div, prod
from ..ir.exec import GM_STEP, ExecTask, Instr, Loop, static_instrs
from ..ir.gm import GMBuffer, GMRef
from ..ir.ops import OPS
from ..ir.program import Program
from ..ir.tensor import TensorGraph

# The rows a dynamic kernel's programs are compiled for: the chunk, the program a call runs once per
# whole chunk of rows (large enough that its tiles keep every core's pipes busy), and a ladder of
# smaller ones, 4^k rows, for the rest: a call's last rows run the smallest program that covers
# them (its tasks past them left out) or several of the ladder's, so that a call on a few rows
# runs a few small tiles.  All are powers of two, the steps a pypto.loop over the dim may take (a
# ladder program smaller than the largest step is not made).  A chunk of a kernel with matmuls is
# larger while its multiply-adds stay within CUBE_CHUNK_MACS: each run of the chunk's program
# fills and drains the cube pipeline and reloads the weights' tiles (a [N, 1024] x [1024, 512]
# fp16 matmul on 8192 rows, a2a3: 65,622 cycles in chunks of 2048, 62,281 of 4096, 55,149 of
# 8192, as the kernel compiled for 8192 rows).
CHUNK = 2048
# a batched matmul over the dynamic dim (its batches its rows) is at least a cube task per batch:
# a chunk of at most 256 batches keeps every cube core busy and its programs small, fewer when a
# batch's output is large (at most BATCH_ELEMENTS output elements a chunk, a power of two batches)
BATCH_CHUNK = 256
BATCH_ELEMENTS = 2 ** 20
CUBE_CHUNKS = (8192, 4096)
CUBE_CHUNK_MACS = 2 ** 32
LADDER = (1, 4, 16, 64, 256, 1024, 4096)
# a chunk whose program would run more instructions than this (tiny tiles: every tile is unrolled
# into the program) is cut to the largest ladder step within it: the programs are compiled
# smallest first, each one's size estimated from the one before, so that no compile makes a
# program of millions of instructions a call on a few rows never needs (a call on many rows runs
# the smaller chunk more often: simulation time stays the same per row)
MAX_CHUNK_INSTRS = 1 << 18


def chunk_for(g: TensorGraph, rows: int) -> int:
    """The chunk for a kernel traced (`g`) with `rows` rows of its dynamic dim."""
    macs = 0
    for n in g.nodes:
        if n.op != "matmul":
            continue
        if len(n.shape) > 2:        # batched: the batches share no weights, see BATCH_CHUNK
            fit = max(1, BATCH_ELEMENTS // max(1, prod(n.shape[1:])))
            return min(BATCH_CHUNK, 1 << (fit.bit_length() - 1))
        # a 2-D matmul's rows share its weights' tiles
        a = g.node(n.inputs[0]).shape
        macs += prod(n.shape) * (a[-2] if n.attrs.get("a_trans") else a[-1])
    if macs:
        for c in CUBE_CHUNKS:
            if macs * c <= CUBE_CHUNK_MACS * rows:
                return c
    return CHUNK


def ladder(max_step: int = 1, chunk: int = CHUNK) -> tuple[int, ...]:
    """The rows of every program a dynamic kernel is compiled for, smallest first (the chunk last)."""
    return tuple(r for r in LADDER if r >= max_step and r < chunk) + (chunk,)


@dataclass(frozen=True)
class DynamicInfo:
    """How a dynamic kernel's programs cover a call: `params` are the parameters with a dynamic
    (first) dim; `programs` maps the rows of each program compiled (see `ladder`) to it, the
    largest (`chunk`) being the kernel's own; `symbol` is the name the size prints as."""
    params: tuple[str, ...]
    programs: dict = field(compare=False, repr=False)
    symbol: str = "N"

    @property
    def chunk(self) -> int:
        return max(self.programs)

    def pieces(self, n: int, plan: str = "cover") -> list[tuple[int, int]]:
        """(first row, rows of the program) of each run a call on n rows makes: the chunk's program
        once per whole chunk; the rows left run, by `plan`, the smallest program that covers them
        ("cover": one run, its tasks past the rows left out) or the ladder's programs largest
        first, each as often as it fits the rows still left (at most three times, the ladder
        growing by 4), then the smallest that covers the last ones ("ladder": small runs that
        spread over the cores)."""
        c = self.chunk
        out = [(j * c, c) for j in range(n // c)]
        start = len(out) * c
        if plan == "ladder":
            for size in sorted(self.programs, reverse=True)[1:]:
                while n - start >= size:
                    out.append((start, size))
                    start += size
        if start < n:
            out.append((start, min(r for r in self.programs if r >= n - start)))
        return out

    def plans(self, n: int) -> dict[str, list[tuple[int, int]]]:
        """The different `pieces` a call on n rows may run, by plan name."""
        cover, ladder = self.pieces(n, "cover"), self.pieces(n, "ladder")
        return {"cover": cover} if cover == ladder else {"cover": cover, "ladder": ladder}

    @staticmethod
    def padded(pieces) -> int:
        """The rows `pieces` cover (the call's rows padded to whole runs)."""
        start, rows = pieces[-1]
        return start + rows

    def describe(self) -> str:
        s = self.symbol
        small = sorted(self.programs)[:-1]
        rest = (f", programs for {'/'.join(map(str, small))} rows the rest" if small
                else f", the last time on rows padded to {self.chunk}")
        return (f"{', '.join(self.params)}: {s} rows known at the call; a program for {self.chunk} rows runs "
                f"{s} // {self.chunk} times" + rest)


# --- the analysis -------------------------------------------------------------------------
# A value's label: None (does not depend on the rows: a weight, a constant), UNIFORM (the same
# along every dim: a constant, a scratch buffer's zeros), ("axis", a, off): its axis a holds rows
# off, off+1, .. of the chunk, or ("row", off): it is row `off` of the chunk (the dim indexed away)

UNIFORM = "uniform"


def _problem(n, what: str, hint: str | None = None):
    raise UnsupportedError(f"{n.op}: {what}", loc=n.loc,
                           expected="ops that keep the rows of a pypto.DYNAMIC dim apart (element-wise ops, "
                                    "reductions and matmuls over other dims)",
                           got=f"{n.op} {list(n.shape)}", hint=hint or (
                               "a dynamic dim's rows are computed in chunks; reduce over it in a second kernel "
                               "or give it a static size"))


def row_axes(g: TensorGraph, dynamic: dict[str, int]) -> dict[int, object]:
    """The label of every value of `g` (see above), given the dynamic axis of each parameter;
    raises UnsupportedError at the first op that would make a row of the outputs depend on
    other rows or on where the chunks fall."""
    labels: dict[int, object] = {}
    shapes = {n.id: n.shape for n in g.nodes}
    written: dict[str, list] = {}
    for n in g.nodes:
        kind = OPS[n.op].kind
        ins = [labels[i] for i in n.inputs]
        if kind == "input":
            a = dynamic.get(n.attrs["param"])
            lab = None if a is None else ("axis", a, 0)
        elif kind in ("const", "fill"):
            lab = UNIFORM
        elif kind == "scratch":
            lab = UNIFORM
        elif kind == "iota":
            lab = None
        elif kind in ("unary", "cast", "binary", "compare", "select"):
            lab = _elementwise(n, ins, [shapes[i] for i in n.inputs])
        elif kind == "reduce":
            lab = ins[0]
            if _is_axis(lab):
                d = n.attrs["dim"] % len(shapes[n.inputs[0]])
                if d == lab[1]:
                    _problem(n, "reduces over the rows of the dynamic dim")
                if not n.attrs.get("keepdim", True) and d < lab[1]:
                    lab = ("axis", lab[1] - 1, lab[2])
        elif kind == "matmul":
            lab = _matmul(n, ins, [shapes[i] for i in n.inputs])
        elif n.op == "view":
            lab = ins[0]
            if _is_axis(lab):
                a = lab[1]
                steps = n.attrs.get("steps") or (1,) * len(n.shape)
                if steps[a] != 1:
                    _problem(n, "takes every k-th row of the dynamic dim")
                lab = ("axis", a, lab[2] + n.attrs["offsets"][a])
        elif n.op == "transpose":
            lab = ins[0]
            if _is_axis(lab):
                d0, d1 = (n.attrs["dim0"] % len(n.shape), n.attrs["dim1"] % len(n.shape))
                a = lab[1]
                lab = ("axis", d1 if a == d0 else d0 if a == d1 else a, lab[2])
        elif n.op == "reshape":
            lab = _reshape(n, ins[0], shapes[n.inputs[0]])
        elif kind == "broadcast":
            lab = ins[0]
            if _is_axis(lab):
                src = shapes[n.inputs[0]]
                a = lab[1] + len(n.shape) - len(src)
                if src[lab[1]] != n.shape[a]:
                    _problem(n, "broadcasts one row of the dynamic dim over others")
                lab = ("axis", a, lab[2])
        elif kind == "gather":
            lab = _gather(n, ins, shapes)
        elif kind == "write":
            lab = _write(n, ins, shapes)
        elif kind == "store":
            _store(n, ins[0], dynamic, written)
            lab = None
        else:
            _problem(n, "is not supported on a pypto.DYNAMIC dim yet")
        labels[n.id] = lab
    for name, spans in written.items():        # every row of a dynamic output is written
        covered = 0
        for lo, size in sorted(spans):
            if lo > covered:
                break
            covered = max(covered, lo + size)
        total = g.params[[p.name for p in g.params].index(name)].shape[dynamic[name]]
        if covered < total:
            store = next(n for n in g.nodes if n.op == "store" and n.attrs["param"] == name)
            raise UnsupportedError(f"the kernel writes rows 0:{covered} of '{name}' but not rows {covered}:N",
                                   loc=store.loc, expected="every row of a dynamic output written",
                                   got=f"rows 0:{covered} of the {total} of a chunk",
                                   hint="write the whole dim: out[:] = ..., or every step of pypto.loop(0, N, step)")
    return labels


def _is_axis(lab) -> bool:
    return isinstance(lab, tuple) and lab[0] == "axis"


def _elementwise(n, ins, in_shapes):
    out = None
    rank = len(n.shape)
    for lab, shape in zip(ins, in_shapes):
        if _is_axis(lab):
            lab = ("axis", lab[1] + rank - len(shape), lab[2])
        if lab is None or lab == UNIFORM:
            continue
        if out is None:
            out = lab
        elif out != lab:
            _problem(n, f"combines different rows of the dynamic dim ({_rows(out)} with {_rows(lab)})",
                     hint="slice both operands with the same pypto.loop index")
    if out is None:
        return UNIFORM if all(lab == UNIFORM for lab in ins) else None
    if _is_axis(out):                   # a value independent of the rows must be 1 along their axis
        for lab, shape in zip(ins, in_shapes):
            d = out[1] - (rank - len(shape))
            if lab is None and 0 <= d < len(shape) and shape[d] != 1:
                _problem(n, f"combines the rows of the dynamic dim with a tensor of {shape[d]} rows that do "
                            "not follow them (a fixed-size tensor, or indices made by iota)",
                         hint="make the other operand 1 along the dynamic dim (it is broadcast to every row)")
    return out


def _rows(lab) -> str:
    return f"rows from {lab[2]}" if lab[0] == "axis" else f"row {lab[1]}"


def _matmul(n, ins, in_shapes):
    r = len(n.shape)
    out = None
    for lab, shape, trans, side in zip(ins, in_shapes, (n.attrs.get("a_trans"), n.attrs.get("b_trans")), (0, 1)):
        if not _is_axis(lab):
            continue
        rank, a = len(shape), lab[1]
        # the operand's (kept, contracted) axes: A's M and K, B's N and K
        kept, k = ((rank - 1, rank - 2) if trans else (rank - 2, rank - 1)) if side == 0 else \
            ((rank - 2, rank - 1) if trans else (rank - 1, rank - 2))
        if a == k:
            _problem(n, "sums over the rows of the dynamic dim (it is the K dim of the product)")
        mine = ("axis", r - 2 + side if a == kept else a + r - rank, lab[2])
        if out is not None and out != mine:
            _problem(n, "multiplies rows of the dynamic dim by other rows of it")
        out = mine
    for lab in ins:
        if isinstance(lab, tuple) and lab[0] == "row":
            if out is not None:
                _problem(n, "combines different rows of the dynamic dim")
            out = lab
    if out is None:
        return UNIFORM if ins == [UNIFORM, UNIFORM] else None
    return out


def _reshape(n, lab, src):
    if not _is_axis(lab):
        return lab
    a = lab[1]
    if src[a] == 1:                     # one row of the chunk, its axis size 1: a row, axis-free
        return ("row", lab[2])
    before = prod(src[:a])
    acc = 1
    for b, s in enumerate(n.shape):
        if acc == before and s == src[a]:
            return ("axis", b, lab[2])
        acc *= s
    _problem(n, "merges or splits the dynamic dim with other dims",
             hint="keep the dynamic dim a dim of its own (reshape the other dims only)")


def _gather(n, ins, shapes):
    lx, li = ins
    d = n.attrs["dim"] % len(n.shape)
    if _is_axis(lx):
        if lx[1] == d:
            _problem(n, "gathers along the dynamic dim (rows picked by value)")
        if li != lx:
            _problem(n, "gathers rows of the dynamic dim with indices that do not follow them")
        return lx
    if _is_axis(li) and li[1] == d and lx is not None:
        return li
    return li if li not in (None, UNIFORM) else lx


def _write(n, ins, shapes):
    target, value = ins[0], ins[1]
    if n.op != "write":                 # scatter / scatter_add: x, src, index along dim
        d = n.attrs["dim"] % len(n.shape)
        labs = [lab for lab in ins if lab not in (None, UNIFORM)]
        if any(_is_axis(lab) and lab[1] == d for lab in labs):
            _problem(n, "scatters along the dynamic dim (rows picked by value)")
        if any(lab != labs[0] for lab in labs):
            _problem(n, "scatters between different rows of the dynamic dim")
        return labs[0] if labs else target
    offsets, region = n.attrs["offsets"], n.attrs["shape"]
    if value in (None, UNIFORM):        # the same values written whatever the rows
        return None if value is None and target == UNIFORM else target
    if value[0] == "axis":
        a = value[1] + len(n.shape) - len(shapes[n.inputs[1]])
        row = value[2]
    else:                               # one row, its dim indexed away: the dim of the region it fills
        dims = [target[1]] if _is_axis(target) else [d for d in range(len(n.shape))
                                                       if region[d] == 1 and offsets[d] == value[1]]
        if len(dims) != 1:
            _problem(n, "writes a row of the dynamic dim where it is not clear which dim holds the rows",
                     hint="write x[i:i+1] (keeping the dim) rather than x[i]")
        a, row = dims[0], value[1]
    if offsets[a] != row:
        _problem(n, "writes rows of the dynamic dim to other rows of it",
                 hint="write the result of x[i:i+step] to y[i:i+step]")
    got = ("axis", a, 0)
    if target not in (None, UNIFORM) and target != got:
        _problem(n, "writes rows of the dynamic dim into a tensor that holds other rows")
    return got


def _store(n, lab, dynamic, written):
    param = n.attrs["param"]
    a = dynamic.get(param)
    offsets, shape = n.attrs["offsets"], n.attrs["shape"]
    if a is None:
        if lab not in (None, UNIFORM):
            _problem(n, f"writes rows of the dynamic dim into '{param}', which has no dynamic dim",
                     hint=f"annotate '{param}' with pypto.DYNAMIC as its first dim too")
        _problem(n, f"every chunk of the dynamic dim would write '{param}' (it has no dynamic dim)",
                 hint=f"make '{param}' an output with the dynamic dim, or compute it in a kernel of its own")
    if lab == UNIFORM:
        return
    if lab is None:
        _problem(n, f"writes '{param}' with values that do not follow the rows of the dynamic dim",
                 hint="the rows written must be computed from the same rows of the inputs")
    want = ("axis", a, offsets[a]) if lab[0] == "axis" else ("row", offsets[a])
    if lab[0] == "axis" and lab[1] != a:
        _problem(n, f"writes the dynamic dim of the value into another dim of '{param}'")
    if lab != want:
        _problem(n, f"writes rows of the dynamic dim to other rows of '{param}' ({_rows(lab)} to rows from "
                    f"{offsets[a]})", hint="store x[i:i+step]'s result to out[i:i+step]")
    written.setdefault(param, []).append((offsets[a], shape[a]))


# --- the program of a call ------------------------------------------------------------------

def instantiate(info: DynamicInfo, n: int, n_aic: int, n_aiv: int, pieces=None) -> Program:
    """The program that runs a dynamic kernel on `n` rows of its dynamic dim: its programs
    once per piece of `pieces` (default: `DynamicInfo.pieces(n)`), each run's GM windows on the
    dynamic tensors moved to its rows (of tensors padded to whole pieces), each with workspaces
    of its own; a run's task whose GM writes all fall on rows past `n` is left out (with the
    flags and dependencies on it)."""
    pieces = pieces or info.pieces(n)
    program = info.programs[info.chunk]
    dyn = set(info.params)
    rows = info.padded(pieces)
    bufs = {b.name: GMBuffer(b.name, (rows,) + tuple(b.shape[1:]), b.dtype, b.role)
            for b in program.buffers if b.name in dyn}
    row_elems = {b.name: prod(b.shape[1:]) for b in program.buffers if b.name in dyn}
    out_bufs = [bufs.get(b.name, b) for b in program.buffers if b.role != "workspace"]
    tasks: list[ExecTask] = []
    turn = 0
    for k, (start, size) in enumerate(pieces):
        prog = info.programs[size]
        if len(pieces) == 1 and rows == size:           # the compiled program itself
            return _dropped(prog, n, size, dyn, row_elems)
        ws = {b.name: GMBuffer(f"{b.name}.{k}", b.shape, b.dtype, b.role)
              for b in prog.buffers if b.role == "workspace"}
        out_bufs.extend(ws.values())
        memo: dict[int, object] = {}

        def move(o):
            if not isinstance(o, GMRef):
                return o
            got = memo.get(id(o))
            if got is None:
                name = o.buf.name
                if name in dyn:
                    got = GMRef(bufs[name], o.offset + start * row_elems[name], o.shape, o.strides)
                elif name in ws:
                    got = GMRef(ws[name], o.offset, o.shape, o.strides)
                else:
                    got = o
                memo[id(o)] = got
            return got

        def mapped(items):
            out = []
            for it in items:
                if isinstance(it, Loop):
                    out.append(Loop(it.count, tuple(mapped(it.body))))
                elif any(isinstance(o, GMRef) for o in (it.dst, *it.srcs)):
                    out.append(Instr(it.op, it.pipe, move(it.dst), tuple(move(o) for o in it.srcs), it.attrs,
                                     it.loc))
                else:
                    out.append(it)
            return out

        _kept(prog, _past(prog, n - start, size, dyn, row_elems), tasks,
              lambda t: tuple(mapped(t.code)), lambda t: _turned(t, turn, n_aic, n_aiv))
        # the runs take turns over the cores: the next one's tasks run `turn` cube cores (twice
        # as many vector cores) further on, so that a cube task and its vector partners stay a
        # pair (AIV 2c + slot of AIC c) and a call on many rows spreads over the machine
        turn += max(len({t.core for t in prog.tasks if t.core_type == "AIC"}),
                    ceil_div(len({t.core for t in prog.tasks if t.core_type == "AIV"}), 2), 1)
    return Program(program.name, tuple(out_bufs), tuple(tasks))


def _dropped(prog: Program, n: int, size: int, dyn: set, row_elems: dict) -> Program:
    """`prog` (for its own `size` rows) without the tasks past row `n`."""
    past = _past(prog, n, size, dyn, row_elems)
    if not past:
        return prog
    return Program(prog.name, prog.buffers, tuple(_kept(prog, past, [], lambda t: t.code, lambda t: t.core)))


def _kept(prog: Program, past: set, tasks: list, code_of, core_of) -> list:
    """`tasks` with the tasks of `prog` not in `past` appended, numbered on from its end (their
    dependencies and pairs renumbered, those on tasks left out dropped), their code and core
    `code_of(t)` and `core_of(t)`."""
    new_id: dict[int, int] = {}
    for t in prog.tasks:
        if t.id in past:
            continue
        new_id[t.id] = len(tasks)
        tasks.append(ExecTask(len(tasks), t.group, t.core_type, tuple(new_id[d] for d in t.deps if d in new_id),
                              t.level, code_of(t), None if t.pair is None else (new_id[t.pair[0]], t.pair[1]),
                              core_of(t)))
    return tasks


def _past(prog: Program, valid: int, size: int, dyn: set, row_elems: dict) -> set[int]:
    """The tasks of `prog` (for `size` rows) whose GM writes all fall on rows >= `valid` of the
    dynamic tensors; a cube task and its vector partners only together (their flags pair up)."""
    if valid >= size:
        return set()
    past = {t.id for t in prog.tasks if _past_end(t, dyn, row_elems, valid)}
    pairs: dict[int, set] = {}
    for t in prog.tasks:
        if t.pair is not None:
            pairs.setdefault(t.pair[0], {t.pair[0]}).add(t.id)
    for members in pairs.values():
        if not members <= past:
            past -= members
    return past


def _turned(t: ExecTask, by: int, n_aic: int, n_aiv: int) -> int | None:
    if t.core is None or by == 0:
        return t.core
    return (t.core + by) % n_aic if t.core_type == "AIC" else (t.core + 2 * by) % n_aiv


def _past_end(task: ExecTask, dyn: set, row_elems: dict, valid: int) -> bool:
    """Whether every GM window the task writes lies on rows >= `valid` of a dynamic tensor
    (in the chunk's own coordinates), so that nothing it computes is kept."""
    wrote = False
    for ins, depth in static_instrs(task.code):
        o = ins.dst
        if not isinstance(o, GMRef):
            continue
        name = o.buf.name
        if name not in dyn:
            return False
        lo = o.span()[0]
        step = ins.attrs.get(GM_STEP)
        if step and any(s < 0 for s in step):
            return False
        if lo < valid * row_elems[name]:
            return False
        wrote = True
    return wrote
