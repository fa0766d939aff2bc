"""Shared pieces of the IR levels: immutable attribute maps, fast node construction, shape helpers."""
from __future__ import annotations

import dataclasses
from operator import itemgetter
from typing import Any, Iterable, Mapping


def topological_order(edges: Mapping[int, Iterable[int]]) -> list[int]:
    """The nodes of a graph (node -> its successors, every node a key) in a topological order,
    the smallest ready node first (an order that already is one is kept); when there is a
    cycle, the nodes on it and after it are left out."""
    import heapq
    indeg = dict.fromkeys(edges, 0)
    for bs in edges.values():
        for b in bs:
            indeg[b] += 1
    ready = [a for a, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        a = heapq.heappop(ready)
        order.append(a)
        for b in edges[a]:
            indeg[b] -= 1
            if indeg[b] == 0:
                heapq.heappush(ready, b)
    return order


def quick_init(cls):
    """Give a frozen dataclass a faster `__init__`, with the same signature and defaults.

    The generated `__init__` of a frozen dataclass sets each field through
    `object.__setattr__`, a call per field: building a node of a dozen fields costs about four
    times what filling its `__dict__` directly does, and the compiler builds hundreds of
    thousands of them (tile nodes, GM windows, instructions).  A slotted dataclass
    (`slots=True`: no `__dict__`, about half the memory) gets each slot set through its member
    descriptor, as fast.  The defaults (default factories included) and everything else of the
    dataclass stay as they are.  Use as the outer decorator: `@quick_init` above
    `@dataclass(frozen=True)`.  A slotted class also gets `cls._make(*fields)`, faster still
    (see `_maker`), for the compiler's hot loops.
    """
    fields = [f for f in dataclasses.fields(cls) if f.init]
    slotted = "__dict__" not in dir(cls) and "__slots__" in cls.__dict__
    env: dict[str, Any] = {"_MISSING": dataclasses.MISSING}
    params, body = [], [] if slotted else ["    d = self.__dict__"]
    for f in fields:
        if f.default is not dataclasses.MISSING:
            env[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            env[f"_f_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_MISSING")
            body.append(f"    if {f.name} is _MISSING:\n        {f.name} = _f_{f.name}()")
        else:
            params.append(f.name)
        if slotted:
            env[f"_s_{f.name}"] = cls.__dict__[f.name].__set__
            body.append(f"    _s_{f.name}(self, {f.name})")
        else:
            body.append(f"    d[{f.name!r}] = {f.name}")
    if hasattr(cls, "__post_init__"):  # pragma: no cover - none of the IR nodes has one
        raise TypeError(f"quick_init: {cls.__name__} has a __post_init__")
    src = f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(src, env)                      # noqa: S102 - code built from the class's own field names
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init
    if slotted:
        cls._make = staticmethod(_maker(cls, [f.name for f in fields]))
    return cls


def _maker(cls, names: list[str]):
    """`cls._make(*fields)`: every field positional, no defaults, for the compiler's hot loops.
    The object is built as an instance of a twin class with the same slots but no frozen
    `__setattr__`, whose plain attribute stores are about ten times cheaper than a call through
    each slot's descriptor, and then becomes a `cls` (`__class__` assignment, allowed between
    classes of one layout): twice as fast as `cls(...)` for a tile node."""
    args = ", ".join(names)
    make = _built(cls, "_make", args, {n: n for n in names})
    make.__qualname__ = f"{cls.__qualname__}._make"
    return make


def field_copiers(cls) -> dict:
    """field name -> `fn(obj, value)`: a copy of `obj`, an instance of a `quick_init` slotted
    class, with that one field changed (the others passed on), built as `_make` builds (no call
    per field, no keyword dict): what a pass that changes one field of every node wants."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    return {name: _built(cls, f"with_{name}", "obj, value",
                         {n: "value" if n == name else f"obj.{n}" for n in names})
            for name in names}


_TWINS: dict[type, type] = {}


def _twin(cls):
    """The twin class `_make` builds `cls` objects as (see `_maker`): one per class."""
    twin = _TWINS.get(cls)
    if twin is None:
        twin = _TWINS[cls] = type(f"_{cls.__name__}Builder", (), {"__slots__": tuple(cls.__slots__)})
    return twin


def _built(cls, fname: str, params: str, values: dict[str, str]):
    """A function `fname(params)` building a `cls` object, slot by slot from `values` (slot ->
    the expression it gets), through its twin class."""
    # (`_twin()`, the class called: a fifth cheaper than `object.__new__(_twin)`, whose call
    # takes the slower path of a builtin with an argument)
    src = (f"def {fname}({params}):\n    o = _twin()\n"
           + "".join(f"    o.{n} = {v}\n" for n, v in values.items())
           + "    o.__class__ = _cls\n    return o\n")
    env = {"_twin": _twin(cls), "_cls": cls}
    exec(src, env)                      # noqa: S102 - code built from the class's own field names
    return env[fname]


class cached:
    """`functools.cached_property` without its lock: a value worked out on first use and kept in
    the instance's `__dict__` (later reads find it there, not here).  Python 3.11's takes an
    RLock on every first use, about half the cost of the windows' boxes and spans."""

    def __init__(self, fn):
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


class Attrs(Mapping[str, Any]):
    """An immutable, hashable, ordered-by-key attribute map (nodes never change after build).

    The sorted item tuple (for hashing, equality and printing) is built on first use: most
    attribute maps are only ever read by key.  The compiler's per-node loops read the
    underlying dict (`_dict`) directly, never changing it.
    """

    __slots__ = ("_dict", "_sorted")

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()):
        self._dict = dict(items)
        self._sorted = None

    @classmethod
    def of(cls, d: dict) -> "Attrs":
        """The Attrs of a dict the caller hands over (no copy: it must not change it after)."""
        new = object.__new__(cls)
        new._dict = d
        new._sorted = None
        return new

    @property
    def _items(self) -> tuple:
        if self._sorted is None:
            self._sorted = tuple(sorted(self._dict.items()))
        return self._sorted

    def __getitem__(self, key):
        return self._dict[key]

    def get(self, key, default=None):
        return self._dict.get(key, default)

    def __contains__(self, key):
        return key in self._dict

    def items(self):
        return self._dict.items()

    def keys(self):
        return self._dict.keys()

    def values(self):
        return self._dict.values()

    def __iter__(self):
        return (k for k, _ in self._items)

    def __len__(self):
        return len(self._dict)

    def __hash__(self):
        return hash(self._items)

    def __eq__(self, other):
        return isinstance(other, Attrs) and self._dict == other._dict

    def replace(self, **changes) -> "Attrs":
        d = self._dict.copy()
        d.update(changes)
        return Attrs.of(d)

    def text(self) -> str:
        return " ".join(f"{k}={_fmt(v)}" for k, v in self._items)

    def __repr__(self):
        return f"Attrs({self.text()})"


class TextForm:
    """The one textual form of an IR level: `text()` is what `str()`, `print` and IPython show."""

    def text(self) -> str:  # pragma: no cover - each level defines it
        raise NotImplementedError

    def __str__(self):
        return self.text()

    def _repr_pretty_(self, p, cycle):
        p.text(self.text())


def _fmt(v) -> str:
    if isinstance(v, tuple):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    return str(v)


def region_slices(offsets, shape, steps=None) -> tuple[slice, ...]:
    """The numpy index of a window: `shape` elements from `offsets`, every `steps`-th (default 1)."""
    steps = steps or (1,) * len(shape)
    return tuple(slice(o, o + (s - 1) * k + 1, k) for o, s, k in zip(offsets, shape, steps))


def region_text(offsets, shape, steps=None) -> str:
    """`[0:8,0:64:2]`: a window as slices (a step only where it is not 1)."""
    steps = steps or (1,) * len(shape)
    return "[" + ",".join(f"{o}:{o + s * k - (k - 1)}" + (f":{k}" if k != 1 else "")
                          for o, s, k in zip(offsets, shape, steps)) + "]"


def fmt_shape(shape) -> str:
    return "[" + ",".join(str(s) for s in shape) + "]"


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """numpy broadcasting of two shapes, or None when they do not broadcast."""
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == y:                  # (a dim that is not a plain int, the frontend's symbolic size
            out.append(x if type(x) is not int else y)      # of a dynamic dim, is kept)
        elif y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


def pair_problem(core_type: str, pair, core_of: dict[int, str]) -> str | None:
    """Why a task's 1 AIC : 2 AIV pairing is invalid (None when it is fine): only a vector task
    pairs, with an earlier cube task, on AIV slot 0 or 1.  `core_of` maps earlier task ids to
    their core type."""
    if pair is None:
        return None
    cube, slot = pair
    if core_type != "AIV":
        return "only a vector (AIV) task can be paired with a cube task"
    if core_of.get(cube) != "AIC":
        return f"paired with task {cube}, which is not an earlier cube (AIC) task"
    if slot not in (0, 1):
        return f"AIV slot {slot} of the pair does not exist (an AIC has two AIVs: slots 0 and 1)"
    return None


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def prod(xs) -> int:
    r = 1
    for x in xs:
        r *= x
    return r


def gatherer(positions):
    """A C-level gather of these positions (or keys) of a sequence (or mapping): a function of it
    that returns their items as a tuple, of one or no position too (`itemgetter` gives one item
    bare and takes no empty list)."""
    if len(positions) > 1:
        return itemgetter(*positions)
    if len(positions):
        p = positions[0]
        return lambda seq: (seq[p],)
    return lambda seq: ()


def gather(seq, positions) -> tuple:
    """`seq[p]` of each position p, as a tuple, by one C-level call (`gatherer`)."""
    return gatherer(positions)(seq)
