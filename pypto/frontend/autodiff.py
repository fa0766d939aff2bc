"""Gradients: `pypto.grad(kernel, wrt=[...])` writes the backward kernel of a kernel.

The backward kernel is an ordinary `@pypto.jit` kernel (all five levels, the explorer, the
timeline).  Traced for the arguments' shapes, it replays the forward Tensor Graph, then walks it
backwards from the cotangents of the outputs, applying each op's gradient rule: the registry's
`grad` column (`pypto/ir/ops.py`), or a rule given with `pypto.def_gradient`; a composite op
without a rule is differentiated through its decomposition.  Every node it adds carries the
location of the forward op it comes from, so an error or a timeline bar names the user's line.

Its parameters: the forward kernel's (same names and order; outputs are written again when the
value is asked for, else unused), then `d_<output>` per output with a cotangent, then
`grad_<input>` per input differentiated.
"""
from __future__ import annotations

import hashlib
import inspect
import numbers
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import dtypes as dt
from ..errors import KernelSignatureError, PyptoError, SourceLoc, TileShapeError, UnsupportedError
from ..ir.core import Attrs
from ..ir.ops import OPS, Builder
from ..ir.tensor import TileSpec
from .dynamic import DYNAMIC
from .tracer import Tensor, TraceContext

# rules given with @pypto.def_gradient: op name -> f(*op arguments, dy) -> one gradient per argument
_OVERRIDES: dict[str, Callable] = {}
_GENERATION = [0]       # bumped when a rule is given or taken back: backward kernels are written anew


def _op_name(op) -> str:
    """The registry name of `op`: a name, a pypto op function (pypto.reciprocal -> "recip") or a
    registered op (its `.name`)."""
    if isinstance(op, str):
        name = op
    elif isinstance(getattr(op, "name", None), str):
        name = op.name
    elif callable(op):
        fn = getattr(op, "__name__", "")
        name = next((r.name for r in OPS.values() if r.api == fn), fn)
    else:
        name = repr(op)
    if name not in OPS:
        raise PyptoError(f"def_gradient: no op named {name!r}", expected="a registry op (pypto.relu, 'gelu', ...) "
                         "or an op made with pypto.register_op", got=repr(op))
    return name


def def_gradient(op):
    """`@pypto.def_gradient(op)`: the function below is the gradient rule of `op`, replacing its
    own (the seeds' form):

        @pypto.def_gradient(my_quantize)
        def my_quantize_grad(x, bits, dy):
            return dy * (x > 0), None

    It is called while the backward kernel is traced, with the op's arguments (its tensors, then
    its attributes: positionally for an op made with `register_op`, by keyword for the registry's
    own) and the cotangent of its result `dy`, and returns one gradient per argument (None where
    none flows: an attribute, an index).  The function is returned unchanged;
    `pypto.frontend.autodiff.del_gradient(op)` restores the op's own rule."""
    name = _op_name(op)

    def register(fn):
        _OVERRIDES[name] = fn
        _GENERATION[0] += 1
        return fn
    return register


def del_gradient(op) -> None:
    """Forget the rule `def_gradient` gave `op` (its own rule applies again)."""
    if _OVERRIDES.pop(_op_name(op), None) is not None:
        _GENERATION[0] += 1


class _Writer(Builder):
    """Writes nodes into the trace of the backward kernel (as the frontend's ops do)."""

    def __init__(self, ctx: TraceContext, extra=None):
        self.ctx = ctx
        self.extra = dict(extra or {})

    def emit(self, op, inputs, shape, dtype, attrs=None):
        return self.ctx.add(op, list(inputs), tuple(shape), dtype, **dict(attrs or {}))

    def shape(self, v):
        return tuple(v.shape)

    def dtype(self, v):
        return v.dtype


class _Replay(_Writer):
    """A decomposition's ops replayed through the tape (each may carry a gradient in turn)."""

    def __init__(self, tape: "_Tape", extra):
        super().__init__(tape.w.ctx, extra)
        self.tape = tape

    def emit(self, op, inputs, shape, dtype, attrs=None):
        return self.tape.forward(op, list(inputs), tuple(shape), dtype, dict(attrs or {}))


@dataclass
class _Entry:
    op: str
    ins: list
    out: Tensor
    attrs: dict
    loc: SourceLoc | None
    rule: Callable
    user: bool              # a def_gradient rule (frontend ops on tensors, the op's arguments)


class _Tape:
    """The forward replay: which values carry a gradient of which inputs, the ops to walk back."""

    def __init__(self, ctx: TraceContext):
        self.w = _Writer(ctx)
        self.entries: list[_Entry] = []
        self.needs: dict[int, frozenset] = {}      # node -> the inputs it depends on differentiably
        self.depends: dict[int, frozenset] = {}    # node -> the inputs it depends on at all
        self.cut: dict[int, tuple] = {}            # node -> (op, loc) where a dependence lost its gradient

    def forward(self, op, ins, shape, dtype, attrs) -> Tensor:
        row = OPS[op]
        needs = frozenset().union(*(self.needs.get(h._node, ()) for h in ins))
        depends = frozenset().union(*(self.depends.get(h._node, ()) for h in ins))
        user = op in _OVERRIDES
        rule = _OVERRIDES.get(op) or row.grad
        if needs and dtype.is_float and rule is None and row.decompose is not None:
            extra = {"tile": attrs["tile"]} if "tile" in attrs else {}
            return row.decompose(_Replay(self, extra), ins, attrs)
        out = self.w.emit(op, ins, shape, dtype, attrs)
        if depends:
            self.depends[out._node] = depends
        carries = bool(needs) and dtype.is_float and rule is not None
        if carries:
            self.needs[out._node] = needs
            self.entries.append(_Entry(op, list(ins), out, dict(attrs), self.w.ctx.loc, rule, user))
        if depends - (needs if carries else frozenset()):       # a dependence without a gradient: where it was lost
            here = (op, self.w.ctx.loc) if needs and not carries else None
            self.cut[out._node] = here or next((self.cut[h._node] for h in ins if h._node in self.cut), None)
        return out


def _user_rule(e: _Entry, ct: Tensor):
    """Call a def_gradient rule with the op's arguments: a registered op's in its signature's
    order (tensors and attributes as the user called it, then dy), a registry op's tensors then
    dy, its attributes by keyword."""
    from .custom import registered
    attrs = {k: v for k, v in e.attrs.items() if k not in ("tile", "fuse", "target", "cube_tile")}
    op = registered().get(e.op)
    if op is not None:
        tensors = iter(e.ins)
        order = [(p, p not in attrs) for p in op.signature.parameters]
        args = [next(tensors) if is_t else attrs[p] for p, is_t in order]
        got = e.rule(*args, ct)
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        return [g for (p, is_t), g in zip(order, got) if is_t]
    got = e.rule(*e.ins, ct, **attrs)
    return list(got) if isinstance(got, (tuple, list)) else [got]


def _as_tensor(w: _Writer, g, like: Tensor, e: _Entry):
    """A rule's gradient for input `like` as a tensor of its shape and dtype."""
    if isinstance(g, numbers.Number):
        g = w.expand(w.const(g, like.dtype), like.shape) if like.shape else w.const(g, like.dtype)
    if not isinstance(g, Tensor) or g._node is None:
        raise PyptoError(f"the gradient rule of {e.op} returned {type(g).__name__}, not a tensor", loc=e.loc,
                         expected=f"a tensor of shape {list(like.shape)} (or None)", got=repr(g)[:80])
    if tuple(g.shape) != tuple(like.shape):
        try:
            g = w.sum_to(g, like.shape)
        except Exception:  # noqa: BLE001 - the shapes do not reduce: say which
            g = None
        if g is None or tuple(g.shape) != tuple(like.shape):
            raise PyptoError(f"the gradient rule of {e.op} returned a gradient of another shape", loc=e.loc,
                             expected=f"{list(like.shape)} (the input's shape)", got=repr(g)[:80])
    return w.cast(g, like.dtype)


def _backward(tape: _Tape, seeds: list[tuple[Tensor, Tensor]]) -> dict[int, Tensor]:
    """The cotangent of every value that carries a gradient, from (value, cotangent) seeds."""
    w, ctx = tape.w, tape.w.ctx
    ct: dict[int, Tensor] = {}

    def add(h: Tensor, g: Tensor):
        prev = ct.get(h._node)
        ct[h._node] = g if prev is None else w.bin("add", prev, g)
    for h, g in seeds:
        add(h, w.cast(g, h.dtype))
    for e in reversed(tape.entries):
        c = ct.get(e.out._node)
        if c is None:
            continue
        ctx.loc = e.loc
        grads = _user_rule(e, c) if e.user else list(e.rule(w, e.ins, e.out, c, e.attrs))
        for h, g in zip(e.ins, grads):
            if g is None or h._node not in tape.needs:
                continue
            add(h, _as_tensor(w, g, h, e))
    return ct


def _name(base: str, taken: set) -> str:
    while base in taken:
        base += "_"
    taken.add(base)
    return base


class GradFn:
    """`pypto.grad(kernel, wrt)`: call it with the kernel's arguments (outputs too) and the
    cotangents of its outputs; it returns {input name: gradient} as numpy arrays, computed by the
    backward kernel on the simulator.  `value=True` (as `pypto.value_and_grad` makes it) also
    writes the outputs, returning (outputs, gradients)."""

    def __init__(self, kernel, wrt, value: bool = False):
        from .jit import JitKernel
        if not isinstance(kernel, JitKernel):
            raise PyptoError("pypto.grad takes a @pypto.jit kernel", expected="a kernel made with @pypto.jit",
                             got=type(kernel).__name__)
        wrt = [wrt] if isinstance(wrt, str) else list(wrt)
        for name in wrt:
            if name not in kernel.tensor_params:
                close = [p for p in kernel.tensor_params if p.lower() == name.lower()]
                raise KernelSignatureError(f"pypto.grad: {kernel.name} has no tensor parameter {name!r}",
                                           loc=kernel.sig_loc(), expected=", ".join(kernel.tensor_params),
                                           got=name, hint=f"did you mean {close[0]!r}?" if close else None)
        if not wrt:
            raise KernelSignatureError("pypto.grad: wrt names no input", loc=kernel.sig_loc(),
                                       expected="wrt=['x', ...]", got="[]")
        self.kernel, self.wrt, self.value = kernel, tuple(wrt), value
        self._kernels: dict = {}
        self.backward_kernel = None     # the backward kernel of the last call (a JitKernel)
        self.backward_args = None       # and the arrays it was called with

    def __repr__(self):
        return f"<pypto.grad of {self.kernel.name} with respect to {', '.join(self.wrt)}>"

    # --- the backward kernel ----------------------------------------------------------------
    def _graph(self, args, consts):
        k = self.kernel
        specs = k._specs(args)
        if any(s.shape and s.shape[0] is DYNAMIC for s in specs):
            raise UnsupportedError(f"pypto.grad of {k.name}: pypto.DYNAMIC dims are not supported yet",
                                   loc=k.sig_loc(), expected="arguments of fixed shapes", got="a DYNAMIC dim",
                                   hint="call it with numpy arrays of the sizes to differentiate at")
        return k._trace(specs, k._constants(consts))

    def prepare(self, *args, cotangents=None, machine="a2a3", **consts):
        """(the backward kernel, its arguments) for these forward arguments and cotangents, compiled
        for `machine` (cached).  The backward kernel keeps the forward's tile shapes; where its
        groups, which hold more tiles than the forward's, do not fit a buffer with them, it is
        written again with automatic tiles (`.auto_tiles` on the kernel says so)."""
        from .jit import JitKernel
        from .kernel import as_array
        k = self.kernel
        try:
            g = self._graph(args, consts)
        except PyptoError as e:
            from ..errors import located
            raise located(e).with_traceback(None) from None
        outs = g.output_names
        used = {g.node(i).attrs["param"] for n in g.nodes for i in n.inputs if g.node(i).op == "input"}
        for name in self.wrt:
            p = g.param(name)
            if name not in used and name in outs:
                raise KernelSignatureError(f"pypto.grad: {name!r} is not read by {k.name}", loc=k.sig_loc(name),
                                           expected="an input the kernel reads", got="an output")
            if not p.dtype.is_float:
                raise KernelSignatureError(f"pypto.grad: {name!r} is {p.dtype}: not differentiable",
                                           loc=k.sig_loc(name), expected="a float input (fp32, fp16, bf16)",
                                           got=str(p.dtype))
        cots = self._cotangents(g, outs, cotangents)
        arrays = [as_array(a) for a in args]
        arrays += [cots[o] for o in cots]
        arrays += [np.zeros(g.param(w).shape, g.param(w).dtype.np_dtype) for w in self.wrt]
        key = (tuple(cots), tuple(sorted(consts)), _GENERATION[0])
        jk = self._kernels.get(key)
        if jk is None:
            jk = self._kernels[key] = self._make(tuple(cots), outs, consts)
        try:
            jk.compile(*arrays, machine=machine, **consts)
        except TileShapeError as e:
            if "do not fit" not in e.message:
                raise
            jk = self._kernels.get(key + ("auto",))
            if jk is None:
                jk = self._kernels[key + ("auto",)] = self._make(tuple(cots), outs, consts, auto_tiles=True)
        return jk, arrays

    def _cotangents(self, g, outs, given) -> dict:
        k = self.kernel
        if given is None:
            big = [o for o in outs if int(np.prod(g.param(o).shape)) != 1]
            if big:
                raise KernelSignatureError(
                    f"pypto.grad: {k.name} writes {', '.join(big)}, not a single number: its cotangent is needed",
                    loc=k.sig_loc(big[0]), expected="cotangents={'%s': dy} (an array of its shape)" % big[0],
                    got="no cotangents", hint="for a loss, write one number (out of shape [1]) and its cotangent "
                                              "is 1")
            return {o: np.ones(g.param(o).shape, g.param(o).dtype.np_dtype) for o in outs}
        unknown = [c for c in given if c not in outs]
        if unknown:
            raise KernelSignatureError(f"pypto.grad: {unknown[0]!r} is not an output of {k.name}",
                                       loc=k.sig_loc(), expected="cotangents of " + (", ".join(outs) or "no output"),
                                       got=", ".join(map(repr, given)))
        res = {}
        for o in outs:
            if o not in given:
                continue
            p = g.param(o)
            a = np.asarray(given[o])
            if tuple(a.shape) != tuple(p.shape):
                raise KernelSignatureError(f"pypto.grad: the cotangent of {o!r} has another shape than {o}",
                                           loc=k.sig_loc(o), expected=list(p.shape), got=list(a.shape))
            res[o] = a.astype(p.dtype.np_dtype, copy=False)
        if not res:
            raise KernelSignatureError("pypto.grad: no cotangent given", loc=k.sig_loc(),
                                       expected="cotangents of " + ", ".join(outs), got="{}")
        return res

    def _make(self, cots: tuple, outs: tuple, consts, auto_tiles: bool = False):
        from .jit import JitKernel, _DefInfo
        k, wrt, value = self.kernel, self.wrt, self.value
        taken = set(k.tensor_params) | set(k.const_params)
        d_names = [_name(f"d_{o}", taken) for o in cots]
        g_names = [_name(f"grad_{w}", taken) for w in wrt]
        nf = len(k.tensor_params)

        def backward(*tensors, **values):
            ctx = TraceContext.current("the backward kernel")
            fwd, dys, grads = tensors[:nf], tensors[nf:nf + len(cots)], tensors[nf + len(cots):]
            specs = [Tensor(t.shape, t.dtype, name) for t, name in zip(fwd, k.tensor_params)]
            g = k._trace(specs, values)
            tape = _Tape(ctx)
            val: dict[int, Tensor] = {}
            stores = []
            for n in g.nodes:
                ctx.loc = n.loc
                if n.op == "input":
                    h = val[n.id] = fwd[k.tensor_params.index(n.attrs["param"])]
                    if n.attrs["param"] in wrt:
                        tape.needs[h._node] = tape.depends[h._node] = frozenset([n.attrs["param"]])
                elif n.op == "store":
                    stores.append(n)
                else:
                    attrs = {a: v for a, v in n.attrs.items() if not (auto_tiles and a == "tile")}
                    val[n.id] = tape.forward(n.op, [val[i] for i in n.inputs], n.shape, n.dtype, attrs)
            seeds, later = [], {}
            for n in reversed(stores):      # a later store wins: an earlier one's value gets the rest
                ctx.loc = n.loc
                p = n.attrs["param"]
                over = _overwritten(n, later.setdefault(p, []))
                later[p].append(n)
                v = val[n.inputs[0]]
                if p in cots and v._node in tape.needs and over is not None:
                    dy = tape.w.view(dys[cots.index(p)], n.shape, n.attrs["offsets"], n.attrs.get("steps"))
                    for offsets, shape in over:
                        dy = tape.w.write(dy, tape.w.zeros(shape, dy.dtype), offsets, shape)
                    seeds.append((v, dy))
            ct = _backward(tape, seeds)
            for name, out in zip(wrt, grads):
                x = fwd[k.tensor_params.index(name)]
                ctx.loc = k.sig_loc(name)
                gx = ct.get(x._node)
                if gx is None:
                    _check_reached(tape, name, stores, cots, val)
                    gx = tape.w.zeros(x.shape, x.dtype)
                out[...] = tape.w.cast(gx, x.dtype) if gx.dtype != x.dtype else gx
            if value:
                from .ops import _store
                for n in stores:
                    ctx.loc = n.loc
                    dst = fwd[k.tensor_params.index(n.attrs["param"])]
                    _store(dst, val[n.inputs[0]], n.attrs["offsets"], n.shape, n.attrs.get("steps"))
            ctx.loc = None
            _prune(ctx)

        params = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                  for p in (*k.tensor_params, *d_names, *g_names)]
        params += [inspect.Parameter(c, inspect.Parameter.KEYWORD_ONLY, default=v)
                   for c, v in k.const_params.items()]
        backward.__name__ = backward.__qualname__ = f"{k.name}_grad"
        backward.__doc__ = f"The backward kernel of {k.name}: gradients with respect to {', '.join(wrt)}."
        backward.__signature__ = inspect.Signature(params)
        jk = JitKernel(backward, pipeline=k.pipeline, debug=k.debug)
        jk.loc = k.loc
        jk._def = _DefInfo()            # its signature errors point at the forward kernel's def line
        jk._source_hash = hashlib.sha1(repr((k._source_hash, wrt, cots, value, _GENERATION[0])).encode()).hexdigest()
        jk.forward_kernel = k
        jk.forward_outputs = outs
        jk.auto_tiles = auto_tiles
        return jk

    # --- running it --------------------------------------------------------------------------
    def __call__(self, *args, cotangents=None, machine="a2a3", **consts):
        jk, arrays = self.prepare(*args, cotangents=cotangents, machine=machine, **consts)
        self.backward_kernel, self.backward_args = jk, arrays
        jk(*arrays, machine=machine, **consts)
        n = len(arrays) - len(self.wrt)
        grads = {w: arrays[n + i] for i, w in enumerate(self.wrt)}
        if not self.value:
            return grads
        outs = {p: arrays[i] for i, p in enumerate(self.kernel.tensor_params) if p in jk.forward_outputs}
        return outs, grads


def _overwritten(n, later) -> list | None:
    """The parts of store n's region that later stores to the same output overwrite, as
    (offsets, shape) boxes relative to the region (their cotangent is not n's); None when they
    cover all of it.  Stepped regions that overlap are refused (their intersection is no box)."""
    off, shape, steps = n.attrs["offsets"], tuple(n.shape), n.attrs.get("steps")
    boxes, covered = [], np.zeros(shape, bool)
    for m in later:
        m_off, m_shape, m_steps = m.attrs["offsets"], tuple(m.shape), m.attrs.get("steps")
        lo = [max(a, b) for a, b in zip(off, m_off)]
        hi = [min(a + s, b + t) for a, s, b, t in zip(off, shape, m_off, m_shape)]
        if any(h <= l for l, h in zip(lo, hi)):
            continue
        if any(k != 1 for k in (steps or ())) or any(k != 1 for k in (m_steps or ())):
            raise UnsupportedError(f"pypto.grad: {n.attrs['param']} is written twice in overlapping stepped regions",
                                   loc=n.loc, expected="overlapping writes of whole boxes (steps of 1)",
                                   got="a stepped write over an earlier one")
        rel = tuple(l - a for l, a in zip(lo, off))
        box = tuple(h - l for l, h in zip(lo, hi))
        boxes.append((rel, box))
        covered[tuple(slice(r, r + b) for r, b in zip(rel, box))] = True
    return None if covered.all() else boxes


def _prune(ctx: TraceContext) -> None:
    """Drop the nodes no output needs (the rules write the cotangents of every operand, also of
    those no gradient is asked of) and number the rest in order, so the backward kernel's traced
    graph holds what it computes."""
    live = {n.id for n in ctx.nodes if n.op in ("input", "store")}
    for n in reversed(ctx.nodes):
        if n.id in live:
            live.update(n.inputs)
    new = {}
    kept = []
    for n in ctx.nodes:
        if n.id in live:
            new[n.id] = len(kept)
            kept.append(n.replace(id=len(kept), inputs=tuple(new[i] for i in n.inputs)))
    # a forward tile spec whose higher-rank ops are gone keeps the dims of the ops left (the
    # forward's own check passed on all of them: this is the backward's, not the user's, doing)
    shape = {n.id: n.shape for n in kept}
    rank: dict[int, int] = {}
    for n in kept:
        t = n.attrs.get("tile")
        if hasattr(t, "dims") and n.op != "matmul":
            rank[id(t)] = max(rank.get(id(t), 0), len(n.shape), *(len(shape[i]) for i in n.inputs))
    for k, n in enumerate(kept):
        t = n.attrs.get("tile")
        if hasattr(t, "dims") and n.op != "matmul" and len(t.dims) > rank[id(t)]:
            trimmed = TileSpec(t.dims[len(t.dims) - max(rank[id(t)], 1):], t.loc)
            kept[k] = n.replace(attrs=Attrs({**n.attrs, "tile": trimmed}))
    ctx.nodes[:] = kept


def _check_reached(tape: _Tape, name: str, stores, cots, val) -> None:
    """No gradient reached input `name`: a located error when an output with a cotangent depends
    on it only through ops without a gradient (argmax, a comparison, a cast to an integer);
    nothing when it does not depend on it at all (its gradient is zero)."""
    for n in stores:
        v = val[n.inputs[0]]
        if n.attrs["param"] in cots and name in tape.depends.get(v._node, ()):
            op, loc = tape.cut.get(v._node) or ("an op", n.loc)
            raise UnsupportedError(
                f"pypto.grad: {n.attrs['param']} depends on {name} only through {op}, which has no gradient",
                loc=loc, expected=f"a differentiable path from {name} to {n.attrs['param']}",
                got=f"{op} (its result is {'an integer or a mask' if op != 'an op' else 'not differentiable'})",
                hint="comparisons, argmax/argmin and casts to integers pass no gradient; "
                     "use a smooth form (softmax instead of argmax, a product with a mask instead of a cast)")


def grad(kernel, wrt) -> GradFn:
    """The gradient of a kernel's outputs with respect to its inputs `wrt` (names):
    `pypto.grad(k, wrt=["x", "w"])(*args, cotangents={"out": dout})` -> {"x": dx, "w": dw}."""
    return GradFn(kernel, wrt)


class LossGrad:
    """`pypto.value_and_grad(loss_fn)`: `(model, *inputs) -> (loss, {state-dict key: gradient})`,
    each parameter's `.grad` set.  `loss_fn(model, *inputs)` is written with pypto ops and
    returns one number (a tensor of one element); the model (a `pypto.nn.Module`) turns it into
    a kernel over its parameters (`model.to_kernel(*inputs, fn=loss_fn)`), and one backward
    kernel computes the loss and the gradients of every parameter that requires one."""

    def __init__(self, fn):
        self.fn = fn
        self._grads: dict = {}              # forward kernel -> its GradFn
        self.grad_fn: GradFn | None = None  # of the last call: .backward_kernel, .backward_args

    def __repr__(self):
        return f"<pypto.value_and_grad of {getattr(self.fn, '__name__', self.fn)!r}>"

    @property
    def backward_kernel(self):
        return None if self.grad_fn is None else self.grad_fn.backward_kernel

    @property
    def backward_args(self):
        return None if self.grad_fn is None else self.grad_fn.backward_args

    def __call__(self, model, *inputs, machine="a2a3"):
        if not hasattr(model, "to_kernel") or not hasattr(model, "named_parameters"):
            raise PyptoError("value_and_grad(loss_fn) is called with a model first: vg(model, *inputs)",
                             expected="a pypto.nn.Module", got=type(model).__name__,
                             hint="for a @pypto.jit kernel use pypto.value_and_grad(kernel, wrt=[...])")
        jk, arrays, names = model.to_kernel(*inputs, fn=self.fn)
        params = dict(model.named_parameters())
        wrt = [k for k, key in names.items() if getattr(params[key], "requires_grad", True)]
        if not wrt:
            raise PyptoError("value_and_grad: no parameter of the model requires a gradient",
                             expected="a model with parameters", got=f"{type(model).__name__} with none")
        g = self._grads.get(jk)
        if g is None or g.wrt != tuple(wrt):
            g = self._grads[jk] = GradFn(jk, wrt, value=True)
        self.grad_fn = g
        outs, grads = g(*arrays, machine=machine)
        (loss,) = outs.values()
        by_key = {}
        for k, gr in grads.items():
            params[names[k]].grad = gr
            by_key[names[k]] = gr
        return (float(loss.reshape(-1)[0]) if loss.size == 1 else loss), by_key


def value_and_grad(fn, wrt=None):
    """The value and the gradients in one backward kernel.

    - `pypto.value_and_grad(kernel, wrt=["w"])(*args, cotangents=...)` -> (outputs, gradients),
      the outputs also written into the output arrays passed, as a kernel call does;
    - `pypto.value_and_grad(loss_fn)(model, *inputs)` -> (loss, {parameter key: gradient}) for a
      scalar loss of a `pypto.nn.Module`, each parameter's `.grad` set (see `LossGrad`)."""
    from .jit import JitKernel
    if isinstance(fn, JitKernel):
        if wrt is None:
            raise KernelSignatureError(f"value_and_grad({fn.name}) needs wrt: the inputs to differentiate",
                                       loc=fn.sig_loc(), expected="wrt=['x', ...]", got="no wrt")
        return GradFn(fn, wrt, value=True)
    if not callable(fn):
        raise PyptoError("value_and_grad takes a @pypto.jit kernel or a loss function (model, *inputs) -> loss",
                         expected="a callable", got=type(fn).__name__)
    return LossGrad(fn)
