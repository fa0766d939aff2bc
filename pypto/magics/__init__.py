"""`%load_ext pypto` and the `%%pypto` cell magic.

    %%pypto --args x,out [--machine teach] [--show tile,timeline]
    @pypto.jit
    def softmax(x, out, *, TM: int = 64): ...

The cell runs in the notebook namespace (its kernels stay defined); every kernel the cell
defines or redefines is compiled with the named notebook variables and shown in an Explorer.
A PyptoError, here or in any ordinary cell, is shown as its message alone: file:line, the
source line with a caret, expected vs got -- no traceback through pypto's frames.
"""
from __future__ import annotations

import difflib
import sys

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.display import display

from ..errors import MagicUsageError, PyptoError
from ..frontend.jit import JitKernel
from ..viz.explorer import TAB_NAMES, Explorer, tab_title

RED, RESET = "\x1b[0;31m", "\x1b[0m"


def error_text(e: BaseException) -> str:
    """The one short message shown for a PyptoError: its class name and its own text."""
    return f"{type(e).__name__}: {e}"


def show_error(e: BaseException) -> None:
    """Show one red message on stderr (the notebook renders stderr in red), no traceback."""
    print(f"{RED}{error_text(e)}{RESET}", file=sys.stderr)


@magics_class
class PyptoMagics(Magics):
    """Holds the explorers of the last %%pypto cell in `explorers` (handy in tests and scripts)."""

    explorers: list

    def __init__(self, shell=None, **kw):
        super().__init__(shell=shell, **kw)
        self.explorers = []

    @magic_arguments.magic_arguments()
    @magic_arguments.argument("--args", default=None, nargs="+",
                              help="comma-separated notebook variables passed to each kernel, e.g. x,out")
    @magic_arguments.argument("--machine", default="a2a3", help="simulated machine: a2a3 (default) or teach")
    @magic_arguments.argument("--show", default=[], nargs="+",
                              help="views to render first, e.g. tile,timeline "
                                   "(tensor, tile, block, exec, pto, timeline, stats)")
    @cell_magic
    def pypto(self, line, cell):
        """Define kernels in this cell, then compile, simulate and explore each with --args."""
        self.explorers = []
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
        for name, kernel in kernels:
            try:
                ex = Explorer(kernel, args, machine=opts.machine, show=opts.show)
            except PyptoError as e:
                show_error(e)
                continue
            except Exception:            # a bug or a user error outside pypto: show it normally
                self.shell.showtraceback()
                continue
            self.explorers.append(ex)
            display(ex)

    # --- steps ------------------------------------------------------------------------------
    def _options(self, line):
        try:
            opts = magic_arguments.parse_argstring(self.pypto, line)
        except UsageError as e:
            raise MagicUsageError(f"%%pypto: {e}", expected=_USAGE, got=line.strip() or "no options") from None
        if not opts.args:
            raise MagicUsageError("%%pypto needs --args: the notebook variables passed to the kernel",
                                  expected=_USAGE, got=line.strip() or "no options")
        # "--args x,out", "--args x, out" and "--args x out" all mean the same.
        opts.args = _names(opts.args)
        opts.show = _names(opts.show)
        for s in opts.show:
            try:
                tab_title(s)
            except KeyError:
                raise MagicUsageError(f"%%pypto --show: unknown view '{s}'",
                                      expected=", ".join(sorted(set(TAB_NAMES))),
                                      got=", ".join(opts.show)) from None
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
        filename = shell.compile.cache(source, shell.execution_count, raw_code=cell)
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


def _names(tokens) -> list[str]:
    return [n.strip() for t in tokens or () for n in t.split(",") if n.strip()]


_USAGE = "%%pypto --args x,out [--machine a2a3|teach] [--show tensor,tile,block,exec,pto,timeline,stats]"
_IPYTHON_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "open"}


def _custom_exc(shell, etype, value, tb, tb_offset=None):
    """A PyptoError in an ordinary cell: show its message only (it already names file and line)."""
    stb = [f"{RED}{etype.__name__}{RESET}: {value}"]
    shell._showtraceback(etype, value, stb)   # the hook front ends override (error output in Jupyter)
    return stb


def load_ipython_extension(ip):
    """`%load_ext pypto`: the %%pypto magic and short PyptoError messages in every cell."""
    ip.register_magics(PyptoMagics)
    ip.set_custom_exc((PyptoError,), _custom_exc)


def unload_ipython_extension(ip):
    ip.set_custom_exc((), None)
