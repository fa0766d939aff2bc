"""`pypto` on the command line: compile a kernel from a file for given shapes, print a level, simulate.

    pypto compile FILE.py:KERNEL --arg x=256x1024:fp32 --arg out=256x1024:fp32 [--const TM=32]
                  [--emit tensor|tile|block|exec|pto|none] [--tasks N] [--machine a2a3|teach]
                  [--check] [--trace trace.json] [--html report.html]
    pypto report  FILE.py:KERNEL --arg ... [-o report.html] [--check]
    pypto advise  FILE.py:KERNEL --arg ... [--const TM=32] [--min-gain 2] [--workers N]
    pypto tune    FILE.py:KERNEL --arg ... --space TM=16,32,64 --space TN=256,512 [--workers N]
    pypto build   FILE.py:KERNEL_OR_OP --target a2a3 --arg ... [--const ...] [-o DIR] [--check]

`build` writes the compiled program text (KERNEL.pto), the HTML report (KERNEL.html) and the
Chrome trace (KERNEL.trace.json) into DIR; it also builds an op of `@pypto.register_op`, as a
kernel whose last parameter `out` receives the op's result (--arg for its tensors, --const for
its other arguments).

Kernels compile from shapes alone (`pypto.Tensor(shape, dtype)` specs), so no data is needed: the
simulation is then timing only.  `--check` runs it with seeded random inputs instead, so that
the outputs are also checked against numpy.

Errors are one message on stderr, `pypto: error: ...`: exit code 2 for a usage error (bad
FILE:KERNEL, missing file, unknown kernel, bad --arg or --const), 1 for an error in the kernel
(the compiler's message as is: file:line, caret, expected/got) or in the file it is defined in.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import traceback

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
LEVELS = ("tensor", "tile", "block", "exec", "pto", "none")
DTYPE_ALIASES = {"fp32": "fp32", "float32": "fp32", "f32": "fp32", "float": "fp32",
                 "fp16": "fp16", "float16": "fp16", "f16": "fp16", "half": "fp16",
                 "bf16": "bf16", "bfloat16": "bf16",
                 "int8": "int8", "i8": "int8", "int32": "int32", "i32": "int32"}
DEFAULT_PTO_TASKS = 4


class UsageError(Exception):
    """Bad command line: printed as `pypto: error: ...`, exit code 2."""


class UserCodeError(Exception):
    """The kernel's file failed to import: printed as `pypto: error: ...`, exit code 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):            # one line instead of usage + message + sys.exit
        raise UsageError(f"{message} (see '{self.prog} --help')")


# --- argument parsing ------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .target.machine import MACHINES
    p = _Parser(prog="pypto", description="Compile pypto tile kernels through the five IR levels "
                                          "and simulate them.")
    p.add_argument("--version", action="version", version=f"pypto {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def common(sp):
        sp.add_argument("target", metavar="FILE.py:KERNEL",
                        help="the file defining the kernel and the kernel's name (the name may be "
                             "left out when the file defines one kernel)")
        sp.add_argument("--arg", "-a", action="append", default=[], metavar="NAME=DIMS:DTYPE",
                        help="a tensor parameter's shape and dtype, e.g. x=256x1024:fp32 (dtype one "
                             "of fp32 fp16 bf16 int8 int32; default fp32); one per tensor parameter")
        sp.add_argument("--const", "-c", action="append", default=[], metavar="NAME=VALUE",
                        help="a compile-time constant (keyword-only parameter), e.g. TM=32")
        sp.add_argument("--machine", "-m", default="a2a3", choices=sorted(MACHINES),
                        help="the simulated machine (default a2a3)")
        sp.add_argument("--check", action="store_true",
                        help="simulate with seeded random inputs and check the outputs against numpy "
                             "(default: timing-only simulation from the shapes)")
        sp.add_argument("--seed", type=int, default=0, help="seed of the --check inputs (default 0)")
        sp.add_argument("--size", type=_size, metavar="N",
                        help="the rows of a pypto.DYNAMIC dim to simulate (a kernel annotated with one, or "
                             "an --arg written Nx...; default: the rows an --arg gives it)")

    c = sub.add_parser("compile", help="compile, print one level, simulate and print the cycles",
                       description="Compile a kernel for the given shapes, print one IR level, "
                                   "simulate it and print cycles, time, bound and pipe use.")
    common(c)
    c.add_argument("--emit", "-e", default="pto", choices=LEVELS,
                   help="the level to print (default pto; 'none' prints only the simulation)")
    c.add_argument("--tasks", type=_count, default=DEFAULT_PTO_TASKS, metavar="N",
                   help=f"PTO tasks to print (default {DEFAULT_PTO_TASKS}; 0 = all)")
    c.add_argument("--full", action="store_true", help="print the tile level in full")
    c.add_argument("--trace", metavar="TRACE.json", help="write the Chrome trace (Perfetto) here")
    c.add_argument("--html", metavar="REPORT.html", help="write the HTML report here")

    r = sub.add_parser("report", help="write a self-contained HTML report of a kernel",
                       description="Compile a kernel for the given shapes, simulate it and write one "
                                   "self-contained HTML file: every level, the timeline, the stats.")
    common(r)
    r.add_argument("--output", "-o", metavar="REPORT.html",
                   help="the report file (default KERNEL.html in the current directory)")
    r.add_argument("--title", help="the report's title")

    def workers(sp):
        sp.add_argument("--workers", "-j", type=_size, metavar="N",
                        help="time the configurations on N local worker processes (a Dask LocalCluster; "
                             "default: in this process)")

    a = sub.add_parser("advise", help="name what bounds a kernel and the changes that make it faster",
                       description="Compile a kernel for the given shapes, name what bounds it with the "
                                   "figures that show it, and re-simulate changes of its constants and "
                                   "compile options: only those that measurably help are printed.")
    common(a)
    a.add_argument("--min-gain", type=float, default=2.0, metavar="PCT",
                   help="suggest a change only when it saves this share of the cycles (default 2%%)")
    workers(a)
    t = sub.add_parser("tune", help="time every configuration of a space of constants and options",
                       description="Compile and time (timing mode) every combination of the --space "
                                   "values; print them fastest first.")
    common(t)
    t.add_argument("--space", "-s", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="a constant, a compile option (true/false) or 'machine' and its values")
    t.add_argument("--top", type=_count, default=20, metavar="N", help="rows to print (default 20; 0 = all)")
    workers(t)
    b = sub.add_parser("build", help="write a kernel's program text, HTML report and Chrome trace into a directory",
                       description="Compile a kernel (or an op of @pypto.register_op, wrapped in a kernel whose "
                                   "last parameter `out` receives its result) for the given shapes and machine, "
                                   "simulate it, and write NAME.pto (the program text), NAME.html (the report) "
                                   "and NAME.trace.json (the Chrome trace) into a directory.")
    common(b)
    b.add_argument("--target", "-t", dest="machine", default="a2a3", choices=sorted(MACHINES),
                   help="the machine to build for (the same as --machine; default a2a3)")
    b.add_argument("--output", "-o", metavar="DIR", default="build",
                   help="the directory to write into (default ./build; made when missing)")
    return p


def _size(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number of rows >= 1, got '{text}'")
    return n


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number of tasks >= 0, got '{text}'")
    return n


def parse_target(target: str) -> tuple[str, str | None]:
    """'path/to/file.py:kernel' -> (path, kernel); the kernel may be left out ('file.py')."""
    path, sep, name = target.rpartition(":")
    if not sep:
        path, name = target, None
    elif not path or not name.isidentifier():
        raise UsageError(f"bad kernel reference '{target}': expected FILE.py:KERNEL, e.g. "
                         f"kernels.py:softmax")
    if not os.path.exists(path):
        raise UsageError(f"no such file: {path}")
    if os.path.isdir(path):
        raise UsageError(f"{path} is a directory, expected a Python file")
    return path, name


def parse_dtype(text: str, where: str):
    from . import dtypes
    name = DTYPE_ALIASES.get(text.strip().lower())
    if name is None:
        raise UsageError(f"unknown dtype '{text}' in {where}: expected one of "
                         f"{' '.join(d.name for d in dtypes.ALL_DTYPES)}")
    return dtypes.parse(name)


def parse_arg(text: str):
    """'x=256x1024:fp32' -> ('x', (256, 1024), DT_FP32); 'x=Nx1024' -> a pypto.DYNAMIC first dim."""
    from . import dtypes
    where = f"--arg {text}"
    name, eq, spec = text.partition("=")
    name = name.strip()
    if not eq or not name.isidentifier() or not spec:
        raise UsageError(f"bad {where}: expected NAME=DIMS:DTYPE, e.g. x=256x1024:fp32")
    from .frontend.dynamic import DYNAMIC
    dims, colon, dtype = spec.partition(":")
    d = parse_dtype(dtype, where) if colon else dtypes.DT_FP32
    try:
        shape = tuple(DYNAMIC if s == "n" and k == 0 else int(s) for k, s in enumerate(dims.lower().split("x")))
    except ValueError:
        shape = ()
    if not shape or any(s is not DYNAMIC and s <= 0 for s in shape):
        raise UsageError(f"bad shape '{dims}' in {where}: expected positive sizes separated by 'x', "
                         f"e.g. 256x1024 (or Nx1024: a pypto.DYNAMIC first dim)")
    return name, shape, d


def parse_const(text: str):
    """'TM=32' -> ('TM', 32); ints (also 0x..), floats, True/False, else the string."""
    name, eq, value = text.partition("=")
    name = name.strip()
    if not eq or not name.isidentifier() or not value.strip():
        raise UsageError(f"bad --const {text}: expected NAME=VALUE, e.g. TM=32")
    value = value.strip()
    try:
        return name, int(value, 0)
    except ValueError:
        pass
    try:
        return name, float(value)
    except ValueError:
        pass
    return name, {"True": True, "False": False}.get(value, value)


# --- loading the kernel ----------------------------------------------------------------------
def load_module(path: str):
    """Import a Python file as a fresh module (its directory first on sys.path)."""
    path = os.path.abspath(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    modname = "_pypto_cli_" + "".join(ch if ch.isalnum() else "_" for ch in stem)
    spec = importlib.util.spec_from_file_location(modname, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(modname, None)
        where = f"{e.filename}:{e.lineno}: " if e.lineno else ""
        text = (e.text or "").rstrip("\n")
        caret = f"\n    {text.strip()}\n    ^" if text.strip() else ""
        raise UserCodeError(f"{where}SyntaxError: {e.msg}{caret}") from None
    except Exception as e:
        sys.modules.pop(modname, None)
        from .errors import PyptoError
        if isinstance(e, PyptoError):
            raise
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
        where = f"{path}:{frames[-1].lineno}: " if frames else ""
        raise UserCodeError(f"{where}{type(e).__name__} while importing {os.path.basename(path)}: "
                            f"{e}") from None
    return module


def find_kernel(module, path: str, name: str | None):
    from .frontend.jit import JitKernel
    kernels = [k for k, v in vars(module).items() if isinstance(v, JitKernel)]
    found = ", ".join(kernels) if kernels else "none (no @pypto.jit function)"
    if name is None:
        if len(kernels) == 1:
            return getattr(module, kernels[0])
        raise UsageError(f"{path} defines {'several kernels' if kernels else 'no kernel'}; name one "
                         f"as {path}:KERNEL (kernels found: {found})")
    obj = getattr(module, name, None)
    if obj is None:
        raise UsageError(f"no kernel '{name}' in {path} (kernels found: {found})")
    if not isinstance(obj, JitKernel):
        raise UsageError(f"'{name}' in {path} is not a @pypto.jit kernel but a "
                         f"{type(obj).__name__} (kernels found: {found})")
    return obj


def find_buildable(module, path: str, name: str | None):
    """A kernel or a registered op (`@pypto.register_op`) of the module, by its variable's name
    (or the op's registered name)."""
    from .frontend.custom import CustomOp
    from .frontend.jit import JitKernel
    found = {k: v for k, v in vars(module).items() if isinstance(v, (JitKernel, CustomOp))}
    names = ", ".join(found) if found else "none (no @pypto.jit function or @pypto.register_op)"
    if name is None:
        if len(found) == 1:
            return next(iter(found.values()))
        raise UsageError(f"{path} defines {'several kernels and ops' if found else 'no kernel or op'}; name one as "
                         f"{path}:NAME (found: {names})")
    obj = found.get(name) or next((v for v in found.values() if isinstance(v, CustomOp) and v.name == name), None)
    if obj is None:
        what = f" ('{name}' is a {type(getattr(module, name)).__name__})" if hasattr(module, name) else ""
        raise UsageError(f"no kernel or registered op '{name}' in {path}{what} (found: {names})")
    return obj


def op_kernel(op, arg_texts, const_texts, machine: str):
    """(kernel, specs, constants) of a registered op built alone: its tensors from --arg, its
    other arguments from --const, and `out` shaped by the op's result."""
    from .frontend.dynamic import DYNAMIC
    from .frontend.tracer import Tensor
    params = op.signature.parameters
    sig = f"{op.name}({', '.join(params)})"
    given = {}
    for text in arg_texts:
        name, shape, d = parse_arg(text)
        if name in given:
            raise UsageError(f"--arg {name} is given twice")
        if name not in params:
            raise UsageError(f"{op.name} has no parameter '{name}' (parameters of {sig})")
        if DYNAMIC in shape:
            raise UsageError(f"--arg {text}: a registered op is built for static shapes")
        given[name] = Tensor(shape, d, name)
    consts = {}
    for text in const_texts:
        name, value = parse_const(text)
        if name not in params or name in given:
            raise UsageError(f"{op.name} has no other argument '{name}' (parameters of {sig}; tensors by --arg)")
        consts[name] = value
    missing = [p for p, v in params.items() if p not in given and p not in consts and v.default is v.empty]
    if missing:
        raise UsageError(f"missing --arg (a tensor) or --const (a number) for {', '.join(missing)} of {sig}")
    if not given:
        raise UsageError(f"{op.name} needs at least one tensor: --arg NAME=DIMS:DTYPE for one of {sig}")
    names = [p for p in params if p in given]
    kernel = op.kernel(names)
    specs = [given[n] for n in names]
    result = op.result_spec(specs, consts, machine)
    return kernel, specs + [Tensor(result.shape, result.dtype, kernel.tensor_params[-1])], consts


def tensor_specs(kernel, arg_texts):
    """pypto.Tensor specs in the kernel's parameter order from the --arg values."""
    from .frontend.tracer import Tensor
    given = {}
    for text in arg_texts:
        name, shape, d = parse_arg(text)
        if name in given:
            raise UsageError(f"--arg {name} is given twice")
        if name not in kernel.tensor_params:
            raise UsageError(f"{kernel.name} has no tensor parameter '{name}' "
                             f"(parameters: {', '.join(kernel.tensor_params)})")
        given[name] = (shape, d)
    missing = [p for p in kernel.tensor_params if p not in given]
    if missing:
        sig = f"{kernel.name}({', '.join(kernel.tensor_params)})"
        raise UsageError(f"missing --arg for {', '.join(missing)} of {sig}, e.g. "
                         f"--arg {missing[0]}=256x1024:fp32")
    return [Tensor(given[p][0], given[p][1], p) for p in kernel.tensor_params]


def constants(kernel, const_texts) -> dict:
    consts = {}
    for text in const_texts:
        name, value = parse_const(text)
        if name not in kernel.const_params:
            have = ", ".join(kernel.const_params) or "none"
            raise UsageError(f"{kernel.name} has no constant '{name}' (constants: {have})")
        consts[name] = value
    return consts


def random_inputs(ck, seed: int, size: int | None = None):
    """Seeded random arrays for the parameters of `ck`: inputs random, outputs zero (the dynamic
    dim of a dynamic kernel `size` rows)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    outputs = set(ck.traced.output_names)
    dyn = ck.dynamic.params if ck.dynamic else ()
    arrays = []
    for p in ck.params:
        dt = p.dtype.np_dtype
        shape = (size,) + p.shape[1:] if p.name in dyn else p.shape
        if p.name in outputs:
            arrays.append(np.zeros(shape, dt))
        elif p.dtype.is_float:
            arrays.append(rng.standard_normal(shape).astype(dt))
        else:
            arrays.append(rng.integers(-4, 5, size=shape).astype(dt))
    return arrays


# --- commands ----------------------------------------------------------------------------------
def _prepare(ns, ops: bool = False):
    path, name = parse_target(ns.target)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    module = load_module(path)
    kernel = find_buildable(module, path, name) if ops else find_kernel(module, path, name)
    from .frontend.custom import CustomOp
    if isinstance(kernel, CustomOp):
        kernel, specs, consts = op_kernel(kernel, ns.arg, ns.const, ns.machine)
    else:
        specs = tensor_specs(kernel, ns.arg)
        consts = constants(kernel, ns.const)
    ck = kernel.compile(*specs, machine=ns.machine, **consts)
    size = _dynamic_size(ck, specs, ns.size)
    if ns.check:
        data = random_inputs(ck, ns.seed, size)
        res = ck.simulate(*data, mode="full")
    else:
        res = ck.simulate(mode="timing", size=size)
    return ck, res


def _dynamic_size(ck, specs, size: int | None) -> int | None:
    """The rows to simulate a dynamic kernel on: --size, else those its --arg values give."""
    from .frontend.dynamic import DYNAMIC
    if ck.dynamic is None:
        if size is not None:
            raise UsageError(f"--size {size}: {ck.name} has no pypto.DYNAMIC dim")
        return None
    given = {s.shape[0] for s in specs if s.name in ck.dynamic.params and s.shape[0] is not DYNAMIC}
    if size is None:
        if len(given) != 1:
            raise UsageError(f"{ck.name} has a pypto.DYNAMIC dim ({', '.join(ck.dynamic.params)}): give the rows "
                             "to simulate with --size N" + (f" (the --arg values disagree: {sorted(given)})"
                                                             if given else ""))
        size = given.pop()
    return size


def level_text(ck, level: str, tasks: int = DEFAULT_PTO_TASKS, full: bool = False) -> str:
    if level == "pto":
        return ck.program.text(max_tasks=tasks or None)
    if level == "tile":
        return ck.tile_graph.text(full=full)
    return ck.levels[level].text()


def cmd_compile(ns, out) -> int:
    ck, res = _prepare(ns)
    if ns.emit != "none":
        print(level_text(ck, ns.emit, ns.tasks, ns.full), file=out)
        print(file=out)
    print(res.summary(), file=out)
    if ns.trace:
        print(f"wrote Chrome trace {_write(lambda: res.to_chrome_trace(ns.trace), ns.trace)}", file=out)
    if ns.html:
        from .viz.report import write_report
        print(f"wrote report {_write(lambda: write_report(ck, ns.html, res=res), ns.html)}", file=out)
    return EXIT_OK


def cmd_report(ns, out) -> int:
    from .viz.report import write_report
    ck, res = _prepare(ns)
    path = ns.output or f"{ck.name}.html"
    _write(lambda: write_report(ck, path, res=res, title=ns.title), path)
    print(f"wrote report {path}: {ck.name} on {ck.machine.name}, {_outcome(res)}", file=out)
    return EXIT_OK


def _outcome(res) -> str:
    """`1234 cycles (1.2 us), bound vector, check OK`: a simulation in one line."""
    verdict = {True: ", check OK", False: ", check MISMATCH", None: ""}[res.ok]
    return f"{res.cycles} cycles ({res.time_us} us), bound {res.stats.get('bound')}{verdict}"


def cmd_build(ns, out) -> int:
    from .viz.report import write_report
    ck, res = _prepare(ns, ops=True)
    try:
        os.makedirs(ns.output, exist_ok=True)
    except OSError as e:
        raise UserCodeError(f"cannot make directory {ns.output}: {e.strerror or e}") from None
    base = os.path.join(ns.output, ck.name)
    program = res.program or ck.program       # (of a dynamic kernel: the program of the call simulated)

    def text():
        with open(base + ".pto", "w", encoding="utf-8") as f:
            f.write(program.text() + "\n")
    _write(text, base + ".pto")
    _write(lambda: write_report(ck, base + ".html", res=res), base + ".html")
    _write(lambda: res.to_chrome_trace(base + ".trace.json"), base + ".trace.json")
    print(f"built {ck.name} for {ck.machine.name}{f' ({res.size})' if res.size else ''}: {_outcome(res)}",
          file=out)
    print(f"wrote {base}.pto: the program, {len(program)} instructions in {len(program.tasks)} tasks", file=out)
    print(f"wrote {base}.html: the report (every level, the timeline, the stats)", file=out)
    print(f"wrote {base}.trace.json: the Chrome trace (chrome://tracing or ui.perfetto.dev)", file=out)
    return EXIT_OK


def _executor(n):
    """A Dask client on a LocalCluster of n worker processes (None: in this process)."""
    if not n:
        return None
    try:
        import distributed
    except ImportError:
        raise UsageError("--workers needs dask.distributed (pip install distributed)") from None
    cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1, dashboard_address=None, silence_logs=40)
    return distributed.Client(cluster)


def _closing(client):
    if client is not None:
        cluster = client.cluster
        client.close()
        cluster.close()


def cmd_advise(ns, out) -> int:
    from .tuning.advisor import advise
    if ns.check:
        raise UsageError("advise times the kernel (no data); --check does not apply")
    ck, res = _prepare(ns)
    client = _executor(ns.workers)
    try:
        print(advise(ck, res=res, executor=client, min_gain_pct=ns.min_gain).text(), file=out)
    finally:
        _closing(client)
    return EXIT_OK


def parse_space(kernel, texts) -> dict:
    space = {}
    for text in texts:
        name, sep, values = text.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise UsageError(f"bad --space '{text}': expected NAME=V1,V2,... e.g. TM=16,32,64")
        vals = []
        for v in values.split(","):
            v = v.strip()
            low = v.lower()
            if low in ("true", "false", "on", "off"):
                vals.append(low in ("true", "on"))
            else:
                try:
                    vals.append(int(v))
                except ValueError:
                    vals.append(v)          # a machine name
        space[name.strip()] = vals
    if not space:
        raise UsageError("tune needs at least one --space NAME=V1,V2,...")
    return space


def cmd_tune(ns, out) -> int:
    from .tuning import tune
    path, name = parse_target(ns.target)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    kernel = find_kernel(load_module(path), path, name)
    specs = tensor_specs(kernel, ns.arg)
    space = parse_space(kernel, ns.space)
    fixed = constants(kernel, ns.const)
    if fixed:
        space = {**{k: [v] for k, v in fixed.items()}, **space}
    client = _executor(ns.workers)
    try:
        res = tune(kernel, space, *specs, machine=ns.machine, executor=client)
    finally:
        _closing(client)
    print(res.text(limit=ns.top or None), file=out)
    return EXIT_OK


def _write(fn, path):
    try:
        fn()
    except OSError as e:
        raise UserCodeError(f"cannot write {path}: {e.strerror or e}") from None
    return path


def main(argv=None) -> int:
    """The `pypto` command; returns the exit code (0 ok, 1 error in the kernel, 2 usage error)."""
    from .errors import PyptoError
    out, err = sys.stdout, sys.stderr
    saved_path = list(sys.path)
    try:
        try:
            ns = build_parser().parse_args(argv)
        except SystemExit as e:          # --help / --version
            return e.code if isinstance(e.code, int) else EXIT_OK
        if ns.command is None:
            build_parser().print_help(file=out)
            return EXIT_USAGE
        return {"compile": cmd_compile, "report": cmd_report, "advise": cmd_advise,
                "tune": cmd_tune, "build": cmd_build}[ns.command](ns, out)
    except UsageError as e:
        print(f"pypto: error: {e}", file=err)
        return EXIT_USAGE
    except (UserCodeError, PyptoError) as e:
        print(f"pypto: error: {e}", file=err)
        return EXIT_ERROR
    except BrokenPipeError:              # `pypto compile ... | head`: stop quietly
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("pypto: interrupted", file=err)
        return 130
    except Exception as e:               # a bug in pypto: still one message, unless asked for more
        if os.environ.get("PYPTO_TRACEBACK"):
            raise
        print(f"pypto: internal error: {type(e).__name__}: {e} "
              f"(set PYPTO_TRACEBACK=1 to see the traceback)", file=err)
        return EXIT_ERROR
    finally:
        sys.path[:] = saved_path
