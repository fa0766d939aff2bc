"""`%load_ext pypto`, the `%%pypto` cell magic and the `%pypto_config` line magic.

    %%pypto --args x,out [--machine teach] [--show tile,timeline] [--range TM=16:256]
    @pypto.jit
    def softmax(x, out, *, TM: int = 64): ...

The cell runs in the notebook namespace (its kernels stay defined); every kernel the cell
defines or redefines is compiled with the named notebook variables and shown in an Explorer
(or, with --compare, in an A/B comparison).  A PyptoError, here or in any ordinary cell, is shown
as its message alone: file:line, the source line with a caret, expected vs got -- no traceback
through pypto's frames.  Bad options print the usage line; they never raise out of the magic.

Defaults live in traits of `PyptoMagics` (`%config PyptoMagics.machine = "teach"`, or
`%pypto_config machine=teach`), so a notebook can set them once.
"""
from __future__ import annotations

import difflib
import os
import re
import sys

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.display import display
from traitlets import Bool, TraitError, Unicode, validate

from ..errors import MagicUsageError, PyptoError, cell_number
from ..frontend.jit import JitKernel
from ..viz.explorer import Explorer
from ..viz.session import FLOAT_DTYPES, range_values
from ..viz.views import TAB_NAMES, tab_title

RED, RESET = "\x1b[0;31m", "\x1b[0m"


class CheckMismatchError(PyptoError):
    """`%%pypto --check`: the simulated outputs differ from the numpy reference."""


def error_text(e: BaseException) -> str:
    """The one short message shown for a PyptoError: its class name and its own text."""
    return f"{type(e).__name__}: {e}"


def show_error(e: BaseException) -> None:
    """Show one red message on stderr (the notebook renders stderr in red), no traceback."""
    _show_red(error_text(e))


def _show_red(text: str) -> None:
    print(f"{RED}{text}{RESET}", file=sys.stderr)


def _machines() -> str:
    from ..target.machine import MACHINES
    return "|".join(MACHINES)


_USAGE = (f"%%pypto --args x,out [--machine {_machines()}] [--show tensor,tile,block,exec,pto,passes,"
          "timeline,stats,roofline] [--dtype fp32|fp16|bf16] [--range TM=16:256 ...] "
          "[--compare TM=32,TM=128] [--no-sim] [--check] [--trace PATH]   (%%pypto? explains each)")
_CONFIG_USAGE = (f"%pypto_config [machine={_machines()}] [show=tile,timeline] [simulate=true|false] "
                 "[check=true|false] [reset]")
_IPYTHON_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "open"}


@magics_class
class PyptoMagics(Magics):
    """The %%pypto cell magic; its defaults are configurable traits.

    `%config PyptoMagics.machine = "teach"` (or `%pypto_config machine=teach`) changes the
    machine of the %%pypto cells that follow.  The explorers of the last cell are kept in
    `explorers`, its comparisons in `comparisons` (handy in tests and scripts).
    """

    machine = Unicode("a2a3", help="Default simulated machine of %%pypto cells (--machine).").tag(config=True)
    show = Unicode("", help="Default views rendered first, comma-separated, e.g. 'tile,timeline' (--show)."
                   ).tag(config=True)
    simulate = Bool(True, help="Simulate the kernels of %%pypto cells (False: like --no-sim).").tag(config=True)
    check = Bool(False, help="Print the numpy check verdict of each kernel (like --check).").tag(config=True)

    def __init__(self, shell=None, **kw):
        super().__init__(shell=shell, **kw)
        self.explorers: list = []
        self.comparisons: list = []

    @validate("machine")
    def _valid_machine(self, proposal):
        from ..target.machine import MACHINES
        if proposal["value"] not in MACHINES:
            raise TraitError(f"unknown machine {proposal['value']!r}; expected one of {', '.join(MACHINES)}")
        return proposal["value"]

    @validate("show")
    def _valid_show(self, proposal):
        for s in _names([proposal["value"]]):
            try:
                tab_title(s)
            except KeyError:
                raise TraitError(f"unknown view {s!r}; expected some of {', '.join(sorted(TAB_NAMES))}") from None
        return proposal["value"]

    # --- %%pypto -----------------------------------------------------------------------------
    @magic_arguments.magic_arguments()
    @magic_arguments.argument("--args", default=None, nargs="+", metavar="NAMES",
                              help="notebook variables passed to each kernel, comma-separated: x,out")
    @magic_arguments.argument("--machine", default=None,
                              help=f"simulated machine: {_machines().replace('|', ', ')} (a2a3: 24 AIC + "
                                   "48 AIV cores, teach: 2 + 4); default: PyptoMagics.machine")
    @magic_arguments.argument("--show", default=None, nargs="+", metavar="VIEWS",
                              help="views rendered first (and on every change): tensor, tile, block, exec, "
                                   "pto, passes, timeline, stats, roofline")
    @magic_arguments.argument("--dtype", default=None, choices=FLOAT_DTYPES,
                              help="cast the float arguments to this dtype (the explorer's dtype menu)")
    @magic_arguments.argument("--range", dest="ranges", default=None, nargs="+", action="append",
                              metavar="NAME=LO:HI",
                              help="slider values of a constant: TM=16:256 (powers of two from 16 to 256), "
                                   "TM=16:256:16 (steps of 16), TM=16,32,48 (these values); of a kernel "
                                   "with a pypto.DYNAMIC dim, N=1:65536 the values of its size slider")
    @magic_arguments.argument("--compare", default=None, nargs="+", metavar="CONFIGS",
                              help="A/B comparison instead of the explorer: two configurations separated by "
                                   "a comma, constants within one joined by + (or ;): TM=32,TM=128 or "
                                   "TM=32+TN=512,TM=16+TN=1024; 'default' is the kernel's defaults, and a "
                                   "single configuration is compared with the defaults")
    @magic_arguments.argument("--no-sim", dest="no_sim", action="store_true",
                              help="compile and show the levels only; no simulation")
    @magic_arguments.argument("--check", action="store_true",
                              help="print the numpy check verdict; a MISMATCH fails the cell")
    @magic_arguments.argument("--trace", default=None, metavar="PATH",
                              help="write the Chrome trace (Perfetto) of the simulation to PATH")
    @cell_magic
    def pypto(self, line, cell):
        """Define kernels in this cell; compile, simulate and explore each with --args.

        The cell is ordinary Python run in the notebook: the @pypto.jit kernels it defines stay
        defined.  Each is compiled with the notebook variables named by --args and shown in an
        explorer: a tab per IR level (Tensor, Tile, Block, Execution graphs; PTO text; Passes),
        the simulation (Timeline, Stats, Roofline, Advice) and a slider per keyword-only int constant.

        Examples::

            %%pypto --args x,out
            %%pypto --args x,out --machine teach --show tile,timeline
            %%pypto --args x,out --range TM=16:256 TN=256:1024
            %%pypto --args x,out --dtype fp16
            %%pypto --args x,out --compare TM=32,TM=128
            %%pypto --args x,out --compare TM=32+TN=512,TM=16+TN=1024
            %%pypto --args x,out --check --trace softmax_trace.json
            %%pypto --args x,out --no-sim

        --compare  compiles the kernel once per configuration and shows them side by side
                   (cycles, bound, instruction counts, timelines on one time axis, PTO diff).
                   Configurations are separated by ',', the constants of one by '+' or ';'.
        --range    NAME=LO:HI   powers of two in [LO, HI] (and LO, HI themselves);
                   NAME=LO:HI:STEP  LO, LO+STEP, ..., HI;  NAME=A,B,C  exactly these values.
                   Several: --range TM=16:256 TN=64:1024.  Without --range a slider offers the
                   powers of two from the smallest legal tile to the dim the constant tiles.
                   A kernel with a pypto.DYNAMIC dim also gets a size slider, N (rows of x, out):
                   moving it re-simulates on N rows without recompiling; --range N=1:65536
                   sets its values.
        --check    prints "check OK" per kernel; a MISMATCH against numpy fails the cell.
        --trace    with several kernels in the cell, PATH gets a -<kernel> suffix.

        Defaults (machine, show, simulate, check) are traits: `%config PyptoMagics.machine =
        "teach"` or `%pypto_config machine=teach`; `%pypto_config` alone lists them.
        """
        self.explorers = []
        self.comparisons = []
        try:
            opts = self._options(line)
            kernels = self._run_cell_body(cell)
            if kernels is None:          # the body raised a non-pypto error, already shown
                return
            if not kernels:
                raise MagicUsageError("this %%pypto cell defines no @pypto.jit kernel",
                                      expected="a function decorated with @pypto.jit", got="none")
            args = self._resolve_args(opts.args)
        except PyptoError as e:
            show_error(e)
            return
        mismatches: list[tuple[str, object]] = []      # (what, SimResult)
        for name, kernel in kernels:
            try:
                if opts.compare is not None:
                    mismatches += self._compare(kernel, args, opts)
                else:
                    ex = self._explore(kernel, args, opts, multi=len(kernels) > 1)
                    if opts.check and ex.res is not None and ex.res.ok is False:
                        mismatches.append((kernel.name, ex.res))
            except PyptoError as e:
                show_error(e)
            except Exception:            # a bug or a user error outside pypto: show it normally
                self.shell.showtraceback()
        if mismatches:
            # Fail the cell (so that "run all" stops here), with the short message only.
            raise CheckMismatchError(
                "check MISMATCH: the simulated outputs differ from numpy for "
                + ", ".join(what for what, _ in mismatches),
                expected="outputs within the dtype's tolerance of the numpy reference",
                got="; ".join(_verdict(r) for _, r in mismatches))

    def _explore(self, kernel, args, opts, multi, consts=None):
        try:
            ex = Explorer(kernel, args, machine=opts.machine, consts=consts, show=opts.show, ranges=opts.ranges,
                          simulate=opts.simulate, dtype=opts.dtype)
        except ValueError as e:
            raise MagicUsageError(f"%%pypto: {e.message if isinstance(e, PyptoError) else e}", expected=_USAGE,
                                  got=opts.line) from None
        self.explorers.append(ex)
        display(ex)
        if opts.trace:
            path = opts.trace
            if multi:
                root, ext = os.path.splitext(path)
                path = f"{root}-{kernel.name}{ext or '.json'}"
            ex.res.to_chrome_trace(path)
            print(f"{kernel.name}: Chrome trace written to {path} ({len(ex.res.trace)} instruction events)")
        if opts.check and ex.res is not None:
            print(f"{kernel.name}: check {'OK' if ex.res.ok else 'MISMATCH'} on {ex.machine} "
                  f"({_verdict(ex.res)})")
        return ex

    def _compare(self, kernel, args, opts):
        from ..viz.busy import first_render
        from ..viz.compare import compare
        cks, failed = [], []
        with first_render(f"{kernel.name}: compiling both configurations"):
            for label, cfg in zip("AB", opts.compare):
                try:
                    cks.append(kernel.compile(*args, machine=opts.machine, **cfg))
                except PyptoError as e:
                    failed.append((label, cfg, e))
        if len(failed) == 2:
            for label, cfg, e in failed:
                _show_red(f"%%pypto --compare: {label} ({_cfg_text(cfg)}) does not compile: {error_text(e)}")
            return []
        if failed:
            # show the side that works, in an explorer of its own, and why the other one is missing
            (label, cfg, e), = failed
            other = opts.compare[1 if label == "A" else 0]
            _show_red(f"%%pypto --compare: {label} ({_cfg_text(cfg)}) does not compile, so "
                      f"{'B' if label == 'A' else 'A'} ({_cfg_text(other)}) is shown alone: {error_text(e)}")
            ex = self._explore(kernel, args, opts, multi=False, consts=other)
            if opts.check and ex.res is not None and ex.res.ok is False:
                return [(kernel.name, ex.res)]
            return []
        cmp = compare(cks[0], cks[1], *args)
        self.comparisons.append(cmp)
        display(cmp)
        if opts.trace:
            root, ext = os.path.splitext(opts.trace)
            for label, res in (("a", cmp.res_a), ("b", cmp.res_b)):
                path = f"{root}-{label}{ext or '.json'}"
                res.to_chrome_trace(path)
                print(f"{kernel.name} {label.upper()}: Chrome trace written to {path}")
        bad = []
        if opts.check:
            for lbl, r in (("A", cmp.res_a), ("B", cmp.res_b)):
                print(f"{kernel.name} {lbl}: check {'OK' if r.ok else 'MISMATCH'} ({_verdict(r)})")
                if r.ok is False:
                    bad.append((f"{kernel.name} {lbl}", r))
        return bad

    # --- %pypto_config ------------------------------------------------------------------------
    @line_magic
    def pypto_config(self, line):
        """Show or set the defaults of %%pypto cells.

            %pypto_config                       list the defaults
            %pypto_config machine=teach         later cells simulate on 'teach'
            %pypto_config show=timeline check=true simulate=false
            %pypto_config reset                 back to the built-in defaults

        The same traits are set by `%config PyptoMagics.machine = "teach"`.
        """
        try:
            for tok in re.sub(r"\s*=\s*", "=", line).split():
                if tok == "reset":
                    for name in ("machine", "show", "simulate", "check"):
                        self.set_trait(name, self.trait_defaults(name))
                    continue
                if "=" not in tok:
                    raise MagicUsageError(f"%pypto_config: cannot read '{tok}'", expected=_CONFIG_USAGE, got=line)
                key, value = (s.strip() for s in tok.split("=", 1))
                if key not in ("machine", "show", "simulate", "check"):
                    raise MagicUsageError(f"%pypto_config: unknown setting '{key}'", expected=_CONFIG_USAGE,
                                          got=line)
                if key in ("simulate", "check"):
                    low = value.lower()
                    if low not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                        raise MagicUsageError(f"%pypto_config: {key} takes true or false",
                                              expected=_CONFIG_USAGE, got=line)
                    setattr(self, key, low in ("true", "1", "yes", "on"))
                else:
                    try:
                        setattr(self, key, value.strip("'\""))
                    except TraitError as e:
                        raise MagicUsageError(f"%pypto_config: {e}", expected=_CONFIG_USAGE, got=line) from None
        except PyptoError as e:
            show_error(e)
            return
        print(self.config_text())

    def config_text(self) -> str:
        return ("%%pypto defaults (set with %pypto_config key=value or %config PyptoMagics.key = value):\n"
                f"  machine  = {self.machine!r}\n  show     = {self.show!r}\n"
                f"  simulate = {self.simulate!r}\n  check    = {self.check!r}")

    # --- steps ------------------------------------------------------------------------------
    def _options(self, line):
        try:
            opts = magic_arguments.parse_argstring(self.pypto, line)
        except UsageError as e:
            raise MagicUsageError(f"%%pypto: {e}", expected=_USAGE, got=line.strip() or "no options") from None
        opts.line = line.strip() or "no options"
        if not opts.args:
            raise MagicUsageError("%%pypto needs --args: the notebook variables passed to the kernel",
                                  expected=_USAGE, got=opts.line)
        # "--args x,out", "--args x, out" and "--args x out" all mean the same.
        opts.args = _names(opts.args)
        opts.show = _names(opts.show) if opts.show is not None else _names([self.show])
        for s in opts.show:
            try:
                tab_title(s)
            except KeyError:
                raise MagicUsageError(f"%%pypto --show: unknown view '{s}'",
                                      expected=", ".join(sorted(set(TAB_NAMES))),
                                      got=", ".join(opts.show)) from None
        from ..target.machine import MACHINES
        opts.machine = opts.machine or self.machine
        if opts.machine not in MACHINES:
            raise MagicUsageError(f"%%pypto --machine: unknown machine '{opts.machine}'",
                                  expected=" or ".join(MACHINES), got=opts.machine)
        opts.simulate = self.simulate and not opts.no_sim
        opts.check = opts.check or (self.check and opts.simulate)
        if not opts.simulate and (opts.check or opts.trace or opts.compare):
            flag = "--check" if opts.check else "--trace" if opts.trace else "--compare"
            raise MagicUsageError(f"%%pypto: {flag} needs a simulation, --no-sim turns it off",
                                  expected=_USAGE, got=opts.line)
        opts.ranges = _parse_ranges(opts.ranges, opts.line)
        opts.compare = _parse_compare(opts.compare, opts.line)
        return opts

    def _run_cell_body(self, cell):
        """Run the cell like an ordinary cell; return the kernels it (re)defined, in source order.

        The source is registered in IPython's compile cache (and thereby in `linecache`) under
        the cell's own name, so tracebacks, `inspect.getsource` and pypto's error messages (which
        print the kernel's source line with a caret) all see this cell's lines.
        """
        shell = self.shell
        ns = shell.user_ns
        before = {k: v for k, v in ns.items() if isinstance(v, JitKernel)}
        # IPython syntax (%magics, !cmd) may be used inside the cell.  The transform drops leading
        # blank lines; put them back, plus one for the %%pypto line itself, so that line numbers
        # in messages are the line numbers the user sees in the cell.
        lines = cell.splitlines()
        lead = next((i for i, text in enumerate(lines) if text.strip()), len(lines))
        source = "\n" * (1 + lead) + shell.transform_cell(cell)
        filename = shell.compile.cache(source, cell_number(shell), raw_code=cell)
        try:
            code = shell.compile(source, filename, "exec")
            exec(code, shell.user_global_ns, ns)
        except PyptoError:
            raise
        except Exception:
            # A plain user error: the usual traceback, starting at the cell (not at this frame).
            etype, value, tb = sys.exc_info()
            shell.showtraceback((etype, value, tb.tb_next or tb))
            return None
        new = [(k, v) for k, v in ns.items()
               if isinstance(v, JitKernel) and before.get(k) is not v and not k.startswith("_")]
        in_cell = lambda kv: (kv[1].fn.__code__.co_filename != filename, kv[1].fn.__code__.co_firstlineno)
        return sorted(new, key=in_cell)

    def _resolve_args(self, names):
        ns = self.shell.user_ns
        values = []
        for name in names:
            if name not in ns:
                visible = [k for k in ns if not k.startswith("_") and k not in _IPYTHON_NAMES]
                similar = difflib.get_close_matches(name, visible, n=5, cutoff=0.5)
                arrays = sorted(k for k in visible if hasattr(ns[k], "shape") and hasattr(ns[k], "dtype"))
                got = f"similar names: {', '.join(similar)}" if similar else \
                    "no similar name; arrays defined: " + (", ".join(arrays[:12]) or "none")
                raise MagicUsageError(f"%%pypto --args: '{name}' is not defined in the notebook",
                                      expected=f"a notebook variable named '{name}' (an array)", got=got)
            values.append(ns[name])
        return values


def _cfg_text(cfg: dict) -> str:
    return "+".join(f"{k}={v}" for k, v in cfg.items()) or "default"


def _names(tokens) -> list[str]:
    return [n.strip() for t in tokens or () for n in t.split(",") if n.strip()]


def _verdict(res) -> str:
    if not res.check:
        return "not checked"
    from ..sim.result import check_text
    text = "; ".join(f"{name}: {check_text(name, c)}" for name, c in res.check.items())
    return text + (f"; {len(res.races)} race(s): {res.races[0]}" if res.races else "")


_ASSIGN = re.compile(r"^([A-Za-z_]\w*)\s*=\s*(.+)$")


def _parse_ranges(groups, line) -> dict:
    """--range TM=16:256 TN=64,128,256 (tokens may also be separated by commas)."""
    if not groups:
        return {}
    text = " ".join(t for g in groups for t in g)
    items = [s.strip(" ,") for s in re.split(r"[\s,]+(?=[A-Za-z_]\w*\s*=)", text.strip()) if s.strip(" ,")]
    out = {}
    for item in items:
        m = _ASSIGN.match(item)
        if not m:
            raise MagicUsageError(f"%%pypto --range: cannot read '{item}'",
                                  expected="NAME=LO:HI, NAME=LO:HI:STEP or NAME=A,B,C, e.g. TM=16:256", got=line)
        try:
            out[m.group(1)] = range_values(m.group(2).replace(" ", ""))
        except ValueError as e:
            raise MagicUsageError(f"%%pypto --range {item}: {e.message if isinstance(e, PyptoError) else e}",
                                  expected="NAME=LO:HI with 1 <= LO <= HI, e.g. TM=16:256", got=line) from None
    return out


def _parse_compare(tokens, line):
    """--compare TM=32,TM=128 or TM=32+TN=512,TM=16+TN=1024 -> [{...}, {...}] (two configs)."""
    if tokens is None:
        return None
    text = "".join(tokens)
    configs = [c for c in text.split(",")]
    if len(configs) == 1:
        configs = ["default"] + configs
    if len(configs) != 2 or not all(c.strip() for c in configs):
        raise MagicUsageError("%%pypto --compare takes two configurations separated by a comma",
                              expected="e.g. --compare TM=32,TM=128 or --compare TM=32+TN=512,TM=16+TN=1024",
                              got=text)
    out = []
    for c in configs:
        cfg = {}
        if c.strip().lower() not in ("default", "defaults"):
            for part in re.split(r"[+;]", c):
                m = _ASSIGN.match(part.strip())
                if not m or not re.fullmatch(r"-?\d+", m.group(2).strip()):
                    raise MagicUsageError(f"%%pypto --compare: cannot read '{part.strip()}'",
                                          expected="NAME=INT, several joined by +, e.g. TM=32+TN=512",
                                          got=text)
                cfg[m.group(1)] = int(m.group(2))
        out.append(cfg)
    return out


def _custom_exc(shell, etype, value, tb, tb_offset=None):
    """A PyptoError in an ordinary cell: show its message only (it already names file and line)."""
    stb = [f"{RED}{etype.__name__}{RESET}: {value}"]
    shell._showtraceback(etype, value, stb)   # the hook front ends override (error output in Jupyter)
    return stb


def load_ipython_extension(ip):
    """`%load_ext pypto`: the %%pypto and %pypto_config magics, short PyptoError messages."""
    ip.register_magics(PyptoMagics)
    ip.set_custom_exc((PyptoError,), _custom_exc)


def unload_ipython_extension(ip):
    ip.set_custom_exc((), None)
