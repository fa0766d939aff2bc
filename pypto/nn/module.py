"""`Parameter` and `Module`: torch.nn's model structure over numpy arrays, run as pypto kernels.

A module's `forward(self, x, ...)` is written with pypto ops, exactly as a kernel body, and reads
its parameters as attributes (`self.weight`).  Called

- inside a trace (its arguments are traced `pypto.Tensor` values: inside another module's
  forward, or inside a `@pypto.jit` kernel through `functional_call`), it runs `forward` on them;
  each `Parameter` it reads resolves to the traced tensor bound to it (`bind`);
- on numpy arrays (or torch tensors), it runs as one `pypto.JitKernel` (`to_kernel`): positional
  parameters the tensor arguments, then every parameter (its state-dict key with dots as
  underscores), then the outputs; compiled once per input shapes/dtypes, constants and machine
  (and shared by modules of the same structure: every layer of a Transformer runs one compile),
  simulated functionally, the outputs returned as numpy arrays.

To the user a parameter is a numpy array: `m.weight` is a `Parameter`, `m.weight.data` its array
(`np.asarray(m.weight)` is the same array, not a copy); `state_dict()` gives the arrays
themselves (as torch's shares storage), `load_state_dict` copies into them.
"""
from __future__ import annotations

import collections
import copy
import inspect
import keyword
import threading
import time
from typing import Iterator, NamedTuple

import numpy as np

from .. import dtypes as dt
from ..errors import DTypeError, KernelSignatureError, PyptoError, ShapeError, caller_loc, located
from ..frontend.jit import JitKernel
from ..frontend.tracer import Tensor, TraceContext, user_loc

_LOCAL = threading.local()


def _state():
    s = _LOCAL
    if not hasattr(s, "bindings"):
        s.bindings = []         # stack of {id(Parameter): (Parameter, traced Tensor)}
        s.calls = []            # the modules whose forward is running (outermost first)
        s.recorders = []        # profile_model's records of the kernels run
        s.machine = None        # profile_model's machine, overriding the modules'
    return s


class StateDictError(PyptoError):
    """A state dict that does not fit a module: a missing, unexpected or mis-shaped key."""


class UnboundParameterError(PyptoError):
    """A module's parameter read inside a kernel trace that has no tensor bound to it."""


# --- Parameter ----------------------------------------------------------------------------------

class Parameter:
    """A learnable tensor of a module: `data`, a numpy array (float64 data is stored as
    float32: pypto has no fp64), and `grad`, None until a gradient is set (same shape)."""

    __array_priority__ = 1000

    def __init__(self, data, requires_grad: bool = True):
        a = _numpy(data)
        if a.dtype == np.float64:
            a = a.astype(np.float32)
        elif not a.flags.writeable or a.base is not None:
            a = a.copy()
        self.data: np.ndarray = a
        self.grad: np.ndarray | None = None
        self.requires_grad = bool(requires_grad)

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)

    def numpy(self) -> np.ndarray:
        return self.data

    def __array__(self, dtype=None, copy=None):
        if dtype is not None and np.dtype(dtype) != self.data.dtype:
            return self.data.astype(dtype)
        return self.data.copy() if copy else self.data

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        return f"Parameter({self.data.dtype}{list(self.data.shape)})"


def _numpy(a) -> np.ndarray:
    if isinstance(a, Parameter):
        return a.data
    if hasattr(a, "detach") and hasattr(a, "numpy"):        # a torch tensor
        return a.detach().cpu().numpy()
    return np.asarray(a)


def _is_array(v) -> bool:
    return isinstance(v, (np.ndarray, Parameter)) or (hasattr(v, "detach") and hasattr(v, "numpy"))


def _is_traced(v) -> bool:
    return isinstance(v, Tensor) and v._node is not None


# --- binding parameters to traced tensors ------------------------------------------------------

class _Bound:
    """Parameters bound to traced tensors while a kernel is traced (the innermost binding of a
    parameter wins): a module's kernel binds its parameters to the kernel's proxies."""

    def __init__(self, params, tensors):
        self.table = {id(p): (p, t) for p, t in zip(params, tensors)}

    def __enter__(self):
        _state().bindings.append(self.table)
        return self

    def __exit__(self, *exc):
        _state().bindings.pop()


class bind(_Bound):
    """`with bind(module, {"weight": w, "bias": b}):` inside a kernel trace, the module's
    parameters (keys as in its state dict) read as those traced tensors; keys left out keep
    any outer binding.  `functional_call` is the one-call form."""

    def __init__(self, module: "Module", params: dict):
        own = dict(module.named_parameters(remove_duplicate=False))
        unknown = [k for k in params if k not in own]
        if unknown:
            raise located(PyptoError(
                f"bind: {type(module).__name__} has no parameter '{unknown[0]}'",
                expected=", ".join(own) or "no parameters", got=", ".join(map(str, params)),
                hint="keys are those of module.state_dict()"), 3)
        for k, t in params.items():
            p = own[k]
            if not _is_traced(t):
                raise located(UnboundParameterError(
                    f"bind: the value for '{k}' is not a tensor of the kernel being traced",
                    expected="a traced tensor (a kernel argument)", got=type(t).__name__,
                    hint="pass the parameter as one more tensor argument of the kernel"), 3)
            if tuple(t.shape) != tuple(p.shape):
                raise located(ShapeError(
                    f"bind: the tensor for '{k}' of {type(module).__name__} has the wrong shape",
                    expected=list(p.shape), got=list(t.shape)), 3)
        super().__init__([own[k] for k in params], params.values())


def _lookup(p: Parameter):
    for table in reversed(_state().bindings):
        hit = table.get(id(p))
        if hit is not None and hit[0] is p:
            return hit[1]
    return None


def functional_call(module: "Module", params: dict, *args, **kwargs):
    """Call `module` inside a kernel trace with its parameters read from `params` (state-dict
    key -> a traced tensor, e.g. the kernel's arguments), as torch.func.functional_call:

        @pypto.jit
        def k(x, w, b, out):
            out[:] = pypto.relu(pypto.nn.functional_call(lin, {"weight": w, "bias": b}, x))
    """
    with bind(module, params):
        return module(*args, **kwargs)


# --- Module -------------------------------------------------------------------------------------

class IncompatibleKeys(NamedTuple):
    missing_keys: list
    unexpected_keys: list


class Module:
    """Base class of every model part (torch.nn.Module's structure): parameters and sub-modules
    registered as attributes, `forward` written with pypto ops on traced tensors.

    `m.machine` ("a2a3" by default; `m.to("teach")`) is the machine a call on arrays simulates."""

    # when called on arrays, run forward in Python so that each sub-module call is a kernel of
    # its own (a Transformer: one kernel per layer, one compile for all of them)
    _kernel_per_child = False

    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_kernels", {})
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "machine", "a2a3")

    # --- attributes ----------------------------------------------------------------------------
    def __setattr__(self, name, value):
        d = self.__dict__
        if "_parameters" not in d:
            raise PyptoError(f"{type(self).__name__}: call super().__init__() before setting attributes",
                             loc=caller_loc(), expected="super().__init__() first in __init__",
                             got=f"self.{name} = ... before it")
        params, mods = d["_parameters"], d["_modules"]
        if isinstance(value, Parameter):
            mods.pop(name, None)
            d.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            params.pop(name, None)
            d.pop(name, None)
            mods[name] = value
        elif name in params:
            if value is not None:
                raise PyptoError(f"{type(self).__name__}.{name} is a parameter: assign a pypto.nn.Parameter or None",
                                 loc=caller_loc(), expected="pypto.nn.Parameter(array) or None",
                                 got=type(value).__name__,
                                 hint=f"to change its values: m.{name}.data[...] = array")
            params[name] = None
        elif name in mods:
            if value is not None:
                raise PyptoError(f"{type(self).__name__}.{name} is a sub-module: assign a Module or None",
                                 loc=caller_loc(), expected="a pypto.nn.Module or None", got=type(value).__name__)
            mods[name] = None
        else:
            object.__setattr__(self, name, value)
        d["_kernels"].clear()           # what forward traces may have changed: the kernels are stale

    def __getattr__(self, name):
        d = self.__dict__
        params = d.get("_parameters")
        if params is not None and name in params:
            p = params[name]
            if p is None:
                return None
            t = _lookup(p)
            if t is not None:
                return t
            if TraceContext._stack:
                calls = _state().calls
                who = _path() if calls and calls[-1] is self else type(self).__name__
                raise UnboundParameterError(
                    f"parameter '{name}' of {who} is read inside the kernel "
                    f"'{TraceContext._stack[-1].name}', which has no tensor bound to it",
                    loc=user_loc(), expected="the parameter bound to a tensor of the kernel",
                    got=f"{name}: {p!r}",
                    hint="pass it as a kernel argument and call the module through pypto.nn.functional_call"
                         "(module, {'" + name + "': tensor, ...}, x); a sub-module must be an attribute "
                         "(or in a ModuleList) of the module called")
            return p
        mods = d.get("_modules")
        if mods is not None and name in mods:
            return mods[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for k in ("_parameters", "_modules"):
            if name in self.__dict__.get(k, {}):
                del self.__dict__[k][name]
                self._kernels.clear()
                return
        object.__delattr__(self, name)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_kernels"] = {}          # compiled kernels are not copied (nor pickled)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._modules))

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        if param is None:
            self._parameters[name] = None
            self._kernels.clear()
        else:
            setattr(self, name, param if isinstance(param, Parameter) else Parameter(param))

    def add_module(self, name: str, module: "Module | None") -> None:
        if module is None:
            self._modules[name] = None
            self._kernels.clear()
        else:
            setattr(self, name, module)

    register_module = add_module

    # --- structure ----------------------------------------------------------------------------
    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, Parameter), torch's order and names: own parameters, then each
        sub-module's; a parameter shared by two modules once (unless remove_duplicate=False)."""
        seen: set[int] = set()
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for mp, m in mods:
            for name, p in m._parameters.items():
                if p is None or (remove_duplicate and id(p) in seen):
                    continue
                seen.add(id(p))
                yield (f"{mp}.{name}" if mp else name), p

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator["Module"]:
        for _, m in self.named_children():
            yield m

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, m in self.named_children():
            yield from m.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def apply(self, fn) -> "Module":
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # --- state ----------------------------------------------------------------------------------
    def state_dict(self, prefix: str = "") -> "collections.OrderedDict[str, np.ndarray]":
        """Dotted key -> the parameter's numpy array (the array itself, not a copy), torch's keys."""
        return collections.OrderedDict((k, p.data) for k, p in
                                       self.named_parameters(prefix=prefix, remove_duplicate=False))

    def load_state_dict(self, state_dict, strict: bool = True) -> IncompatibleKeys:
        """Copy the arrays (numpy or torch) of `state_dict` into the parameters, cast to their
        dtypes.  A mis-shaped key is a StateDictError; with `strict`, so is a missing or an
        unexpected key.  Nothing is copied when there is an error.  Returns (missing_keys,
        unexpected_keys), as torch does."""
        try:
            return self._load(state_dict, strict)
        except PyptoError as e:
            raise located(e).with_traceback(None) from None

    def _load(self, state_dict, strict):
        if not hasattr(state_dict, "items"):
            raise StateDictError(f"load_state_dict of {type(self).__name__}: not a mapping",
                                 expected="a dict of key -> array (a state_dict())", got=type(state_dict).__name__)
        own = collections.OrderedDict(self.named_parameters(remove_duplicate=False))
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        arrays = {}
        for k, p in own.items():
            if k not in state_dict:
                continue
            v = state_dict[k]
            if not _is_array(v) and not isinstance(v, (list, tuple, float, int)):
                raise StateDictError(f"load_state_dict of {type(self).__name__}: '{k}' is not an array",
                                     expected=f"an array {list(p.shape)}", got=type(v).__name__)
            a = _numpy(v)
            if a.shape != p.shape:
                raise StateDictError(
                    f"load_state_dict of {type(self).__name__}: '{k}' has the wrong shape",
                    expected=f"{k}: {list(p.shape)}", got=f"{k}: {list(a.shape)}",
                    hint="the module was made with other sizes than the model the state dict comes from")
            arrays[k] = a
        if strict and (missing or unexpected):
            what = []
            if missing:
                what.append(f"missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
            if unexpected:
                what.append(f"unexpected key{'s' if len(unexpected) > 1 else ''} "
                            f"{', '.join(map(repr, unexpected))}")
            first = missing[0] if missing else unexpected[0]
            raise StateDictError(
                f"load_state_dict of {type(self).__name__}: {'; '.join(what)}",
                expected=(f"'{first}': {list(own[first].shape)}" if missing else f"no key '{first}'"),
                got=("no such key" if missing else f"'{first}': {list(_numpy(state_dict[first]).shape)}"),
                hint="strict=False loads the keys that match and returns the others")
        for k, a in arrays.items():
            p = own[k]
            p.data[...] = a.astype(p.data.dtype, copy=False)
        return IncompatibleKeys(missing, unexpected)

    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad[...] = 0

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad = bool(requires_grad)
        return self

    def to(self, what) -> "Module":
        """`m.to("teach")`: the machine calls on arrays simulate; `m.to(np.float16)` (or
        pypto.DT_FP16): every parameter cast to that dtype."""
        if isinstance(what, str) and what not in dt.BY_NAME:
            from ..target.machine import get_machine
            try:
                get_machine(what)
            except PyptoError:
                if not _is_dtype(what):
                    raise
            else:
                for m in self.modules():
                    object.__setattr__(m, "machine", what)
                    m._kernels.clear()
                return self
        if isinstance(what, str) and what in dt.BY_NAME:
            what = dt.BY_NAME[what]
        np_dtype = what.np_dtype if isinstance(what, dt.DType) else np.dtype(what)
        if dt.from_numpy(np_dtype) is None or not dt.from_numpy(np_dtype).is_float:
            raise located(DTypeError("Module.to: parameters must be floats", expected="fp32, fp16 or bf16",
                                     got=str(np_dtype)))
        for p in self.parameters():
            p.data = p.data.astype(np_dtype)
        for m in self.modules():
            m._kernels.clear()
        return self

    def half(self) -> "Module":
        return self.to(np.float16)

    def float(self) -> "Module":
        return self.to(np.float32)

    # --- repr -----------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def _config(self):
        """The hyperparameters that decide what forward traces (None: a module whose kernels
        are its own; built-in modules return their constructor's arguments, so that modules of
        one structure share their compiled kernels)."""
        return None

    def __repr__(self):
        extra = self.extra_repr()
        lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self._modules.items()
                 if m is not None]
        if not lines:
            return f"{type(self).__name__}({extra})"
        return f"{type(self).__name__}(\n  " + "\n  ".join(([extra] if extra else []) + lines) + "\n)"

    # --- calling --------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise PyptoError(f"{type(self).__name__} defines no forward", loc=caller_loc(),
                         expected="def forward(self, x): ... written with pypto ops", got="none")

    def __call__(self, *args, **kwargs):
        # in a trace its ops join it; a model of kernels per child (Transformer) calls them in turn
        if TraceContext._stack or self._kernel_per_child or any(_is_traced(v) for v in _flat(args, kwargs)):
            return _traced_call(self, None, args, kwargs)
        return self._run(args, kwargs)

    def to_kernel(self, *example_inputs, fn=None, **kwargs):
        """The kernel this module runs as for these inputs: `(jit_kernel, arrays, names)`.

        `arrays` are numpy arrays in the kernel's positional order: the inputs, every parameter
        (the module's own arrays) and a zero placeholder per output (forward may return a
        tuple; None items are left out); `names` maps each parameter's kernel argument name to
        its state-dict key.  `fn(module, *inputs) -> traced tensor`, when given, is traced
        instead of forward (a 0-d result becomes shape [1]).  `jit_kernel(*arrays)` fills the
        output placeholders; `jit_kernel.compile(*arrays)` gives the CompiledKernel."""
        try:
            runner, inputs = self._runner(example_inputs, kwargs, fn)
        except PyptoError as e:
            raise located(e).with_traceback(None) from None
        return runner.jit, runner.arrays(self, inputs), dict(runner.names)

    def _run(self, args, kwargs):
        try:
            runner, inputs = self._runner(args, kwargs, None)
        except PyptoError as e:
            raise located(e).with_traceback(None) from None
        return runner.run(self, inputs)

    def _runner(self, args, kwargs, fn):
        call = _Call.of(self, args, kwargs, fn)
        st = _state()
        machine = st.machine or self.machine
        key = (call.key, machine, self.training, fn)
        runner = self._kernels.get(key)
        if runner is None:
            shared = _structure(self)
            skey = None if shared is None else (shared, key)
            runner = _SHARED.get(skey) if skey is not None else None
            if runner is not None and runner.keys != [k for k, _ in _kernel_params(self)]:
                runner = None
            if runner is None:
                runner = _Runner(self, call, machine, shared=skey is not None)
                if skey is not None:
                    _SHARED[skey] = runner
                    while len(_SHARED) > _SHARED_MAX:
                        _SHARED.pop(next(iter(_SHARED)))
            self._kernels[key] = runner
        return runner, call.inputs


def _is_dtype(v) -> bool:
    try:
        np.dtype(v)
    except TypeError:
        return False
    return True


def _flat(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, (list, tuple)):
            yield from v
        else:
            yield v


def _kernel_params(m: Module) -> list[tuple[str, Parameter]]:
    return list(m.named_parameters())


def _structure(m: Module):
    """A key equal for modules that trace the same forward (type, constructor arguments,
    parameter shapes, sub-modules'), or None when `m` (or a sub-module) has no `_config`."""
    cfg = m._config()
    if cfg is None:
        return None
    kids = []
    for name, c in m.named_children():
        s = _structure(c)
        if s is None:
            return None
        kids.append((name, s))
    own = tuple((k, p.shape, p.dtype.str) for k, p in m._parameters.items() if p is not None)
    return (type(m), cfg, own, tuple(kids))


def _structural_copy(m: Module) -> Module:
    """A copy of `m`'s modules sharing its Parameter objects: what a kernel shared by modules of
    one structure traces (changes to `m` made later do not reach it)."""
    memo = {id(p): p for _, p in m.named_parameters(remove_duplicate=False)}
    return copy.deepcopy(m, memo)


_SHARED: "collections.OrderedDict" = collections.OrderedDict()
_SHARED_MAX = 64


def _path() -> str:
    """The module being traced, named from the outermost module called: 'Transformer.layers.0
    .self_attn (MultiheadAttention)'."""
    calls = _state().calls
    if not calls:
        return "module"
    path = _dotted(calls)
    return path if len(calls) == 1 else f"{path} ({type(calls[-1]).__name__})"


def _dotted(chain) -> str:
    """'Transformer.layers.0.linear1': the outermost module's class, then each module's dotted
    name inside the one before it (its class when it is not inside it)."""
    names = [type(chain[0]).__name__]
    for parent, child in zip(chain, chain[1:]):
        name = next((k for k, v in parent.named_modules() if v is child and k), None)
        names.append(name if name is not None else type(child).__name__)
    return ".".join(names)


def check_input(ok: bool, what: str, expected, got, error=ShapeError, hint: str | None = None):
    """A module's check of its input: an error naming the module and the user's line."""
    if not ok:
        raise error(f"{_path()}: {what}", loc=user_loc(), expected=expected, got=got, hint=hint)


# --- a module call on arrays: the kernel ---------------------------------------------------------

class _Call:
    """A call's arguments split into tensor inputs (arrays: kernel arguments, named after
    forward's parameters) and constants (everything else: part of the compile's key)."""

    def __init__(self, sig, arguments, inputs, names, specs, key, fn):
        self.sig, self.arguments, self.inputs, self.names = sig, arguments, inputs, names
        self.specs, self.key, self.fn = specs, key, fn

    @classmethod
    def of(cls, module, args, kwargs, fn):
        target = fn if fn is not None else module.forward
        sig = inspect.signature(target)
        if fn is not None:
            params = list(sig.parameters.values())
            if not params:
                raise KernelSignatureError("to_kernel: fn takes the module as its first argument",
                                           loc=caller_loc(), expected="fn(module, *inputs)", got="fn()")
            sig = sig.replace(parameters=params[1:])
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise KernelSignatureError(f"{type(module).__name__} called with arguments that do not fit its "
                                       f"forward: {e}",
                                       loc=caller_loc(), expected=f"forward{sig}",
                                       got=f"{len(args)} positional, keywords {sorted(kwargs)}") from None
        arguments, c = {}, _Collect()
        for name, v in bound.arguments.items():
            kind = sig.parameters[name].kind
            if kind == inspect.Parameter.VAR_POSITIONAL or (isinstance(v, (list, tuple)) and v
                                                             and all(_is_array(x) for x in v)):
                items = [c.item(f"{name}_{i}", x) for i, x in enumerate(v)]
                arguments[name] = tuple(items) if kind == inspect.Parameter.VAR_POSITIONAL else type(v)(items)
            elif kind == inspect.Parameter.VAR_KEYWORD:
                arguments[name] = {k: c.item(k, x) for k, x in v.items()}
            else:
                arguments[name] = c.item(name, v)
        if not c.inputs:
            raise KernelSignatureError(f"{type(module).__name__} called without a tensor", loc=caller_loc(),
                                       expected="numpy arrays (or torch tensors)", got="no array argument")
        return cls(sig, arguments, c.inputs, c.names, c.specs, (tuple(c.specs), tuple(c.consts)), fn)

    def rebuild(self, tensors):
        """forward's (args, kwargs) with the inputs replaced by `tensors`."""
        def sub(v):
            if isinstance(v, _Slot):
                return tensors[v.index]
            if isinstance(v, (tuple, list)):
                return type(v)(sub(x) for x in v)
            if isinstance(v, dict):
                return {k: sub(x) for k, x in v.items()}
            return v
        ba = inspect.BoundArguments(self.sig, collections.OrderedDict(
            (k, sub(v)) for k, v in self.arguments.items()))
        return ba.args, ba.kwargs


class _Collect:
    """The tensor inputs and constants of a call, in order; one array object passed twice
    (mha(x, x, x)) is one input, so forward sees one tensor (and shares its projection)."""

    def __init__(self):
        self.inputs, self.names, self.specs, self.consts, self.seen = [], [], [], [], []

    def item(self, name, v):
        if _is_array(v):
            for i, o in enumerate(self.seen):
                if o is v:
                    self.specs.append((name, "same as", i))
                    return _Slot(i)
            a = _input_array(name, v)
            self.seen.append(v)
            self.inputs.append(a)
            self.names.append(name)
            self.specs.append((name, a.shape, a.dtype.str))
            return _Slot(len(self.inputs) - 1)
        self.consts.append((name, _frozen(v)))
        return v


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


def _frozen(v):
    try:
        hash(v)
        return (type(v).__name__, v)
    except TypeError:
        return (type(v).__name__, repr(v))


def _input_array(name: str, v) -> np.ndarray:
    """An argument as the kernel takes it: float64 as float32 and int64 as int32 (pypto has
    neither: torch's default index dtype is int64)."""
    a = _numpy(v)
    if a.dtype == np.float64:
        return a.astype(np.float32)
    if a.dtype.kind in "iu" and a.dtype.itemsize > 4 or a.dtype in (np.uint32, np.uint16, np.int16, np.uint8):
        if a.size and (a.min() < -2 ** 31 or a.max() >= 2 ** 31):
            raise DTypeError(f"argument '{name}' does not fit int32", loc=caller_loc(),
                             expected="integers in int32's range", got=f"{a.dtype} from {a.min()} to {a.max()}")
        return a.astype(np.int32)
    return np.ascontiguousarray(a)


def _identifier(name: str, taken: set) -> str:
    n = name.replace(".", "_")
    if not n.isidentifier() or keyword.iskeyword(n):
        n = "p_" + n
    base, i = n, 1
    while n in taken:
        n = f"{base}_{i}"
        i += 1
    taken.add(n)
    return n


class _Runner:
    """The JitKernel of one module call (input shapes and dtypes, constants, machine), with
    what maps a module's arrays to its arguments and its outputs back."""

    def __init__(self, module: Module, call: _Call, machine: str, shared: bool = False):
        module_type = type(module).__name__
        self.machine = machine              # in the key it is kept under: every run of it is on this machine
        params = _kernel_params(module)
        self.keys = [k for k, _ in params]
        taken: set = set()
        in_names = [_identifier(n, taken) for n in call.names]
        p_names = [_identifier(k, taken) for k in self.keys]
        self.names = dict(zip(p_names, self.keys))
        template = [p for _, p in params]
        outs, structure = _probe(module, call, in_names, p_names, template)
        if shared:                          # what the kernel traces from now on: a copy of it
            module = _structural_copy(module)
        self.structure = structure          # None | "one" | tuple of bools (a tensor / None)
        self.outs = outs                    # [(shape, np dtype)]
        out_names = [_identifier("out" if len(outs) == 1 else f"out{i}", taken) for i in range(len(outs))]
        n_in, n_p = len(in_names), len(p_names)
        fn_call = call.fn

        def kernel(*ts):
            ins, ps, dsts = ts[:n_in], ts[n_in:n_in + n_p], ts[n_in + n_p:]
            args, kwargs = call.rebuild(list(ins))
            with _Bound(template, ps):
                result = _traced_call(module, fn_call, args, kwargs)
            for dst, v in zip(dsts, _tensors(result)):
                if tuple(v.shape) != tuple(dst.shape):
                    v = v.reshape(dst.shape)
                dst[:] = v
        kernel.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in in_names + p_names + out_names])
        name = (getattr(fn_call, "__name__", "fn") if fn_call is not None else module_type)
        kernel.__name__ = kernel.__qualname__ = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
        kernel.__doc__ = f"The kernel of {module_type}: {', '.join(in_names)} -> {', '.join(out_names)}."
        self.jit = JitKernel(kernel)
        self.out_names = out_names
        self.compile_s: float | None = None     # seconds of the first compile (a run's)

    def arrays(self, module: Module, inputs) -> list:
        params = [p.data for _, p in _kernel_params(module)]
        return list(inputs) + params + [np.zeros(s, d) for s, d in self.outs]

    def compile(self, arrays):
        t0 = time.perf_counter()
        ck = self.jit.compile(*arrays, machine=self.machine)        # cached after the first
        if self.compile_s is None:
            self.compile_s = time.perf_counter() - t0
        return ck

    def run(self, module: Module, inputs):
        arrays = self.arrays(module, inputs)
        try:
            ck = self.compile(arrays)
            res = ck.simulate(*arrays, mode="functional", check=False)
        except PyptoError as e:
            raise located(e).with_traceback(None) from None
        outs = [np.asarray(res.outputs[n]) for n in self.out_names]
        recorders = _state().recorders
        if recorders:
            record = _Record(_path_of_call(module), self, ck)
            for rec in recorders:
                rec.append(record)
        return self.unflatten(outs)

    def unflatten(self, outs):
        if self.structure == "one":
            return outs[0]
        it = iter(outs)
        return tuple(next(it) if present else None for present in self.structure)


class _Record(NamedTuple):
    name: str
    runner: _Runner
    compiled: object


def _path_of_call(module: Module) -> str:
    return _dotted(_state().calls + [module])


def _traced_call(module, fn, args, kwargs):
    st = _state()
    st.calls.append(module)
    try:
        return fn(module, *args, **kwargs) if fn is not None else module.forward(*args, **kwargs)
    finally:
        st.calls.pop()


def _tensors(result) -> list:
    """The traced tensors a forward returned (a tensor, or a tuple with None items)."""
    items = result if isinstance(result, (tuple, list)) else (result,)
    return [v for v in items if v is not None]


def _probe(module, call: _Call, in_names, p_names, template):
    """Trace the call once (without compiling) for its outputs' shapes and dtypes."""
    for n, a in zip(in_names, call.inputs):
        if dt.from_numpy(a.dtype) is None:
            raise DTypeError(f"{type(module).__name__}: argument '{n}' has an unsupported dtype",
                             loc=caller_loc(), expected=dt.supported_names(), got=str(a.dtype))
    with TraceContext(f"{type(module).__name__}") as ctx:
        ins = [ctx.input(n, a.shape, dt.from_numpy(a.dtype)) for n, a in zip(in_names, call.inputs)]
        ps = [ctx.input(n, p.shape, dt.from_numpy(p.dtype)) for n, p in zip(p_names, template)]
        args, kwargs = call.rebuild(ins)
        with _Bound(template, ps):
            result = _traced_call(module, call.fn, args, kwargs)
    if _is_traced(result):
        structure = "one"
    elif isinstance(result, (tuple, list)) and all(v is None or _is_traced(v) for v in result) and \
            any(v is not None for v in result):
        structure = tuple(v is not None for v in result)
    else:
        raise PyptoError(f"{type(module).__name__}: {'fn' if call.fn else 'forward'} must return a traced tensor "
                         "(or a tuple of them)", loc=caller_loc(),
                         expected="a pypto tensor computed from the inputs",
                         got=type(result).__name__ if not isinstance(result, (tuple, list)) else
                         f"({', '.join(type(v).__name__ for v in result)})")
    outs = [(tuple(int(s) for s in v.shape) or (1,), v.dtype.np_dtype) for v in _tensors(result)]
    return outs, structure

