"""A/B comparison of two compiled kernels: `pypto.compare(ck_a, ck_b, *args)`.

Side by side: the configurations (constants, machine, dtypes), cycles, time, bound, instruction
counts (per pipe and per opcode), the two timelines stacked on the SAME time axis, and the
unified diff of the two PTO programs.  With arguments both are simulated in full (outputs checked
against numpy); without, only the timing model runs (no arrays needed).

The `text/plain` form is one deterministic line, e.g.

    Compare(softmax: TM=32 -> 24921 cycles | TM=64 -> 32104 cycles, B is 1.29x slower)

and `text/html` is a static, deterministic page (tables, PNG timelines, diff), so a comparison
reads the same in nbconvert HTML, on GitHub and in untrusted notebooks; where a widget front end
runs, the two runs are one interactive timeline instead (`Compare.widget()`).
"""
from __future__ import annotations

import html
from collections import Counter

from ..ir.exec import SYNC_OPS, run_sources

DIFF_TASKS = 2            # the PTO diff covers the first tasks of each program
MAX_DIFF_LINES = 300
TIMELINE_DPI = 80


def compare(ck_a, ck_b, *args, **kw) -> "Compare":
    """Compare two CompiledKernels (see `Compare`); `args` are the arrays to simulate with."""
    return Compare(ck_a, ck_b, args, **kw)


def _dtypes(ck) -> str:
    return ", ".join(f"{p.name}: {p.dtype}" for p in ck.params)


def config_labels(ck_a, ck_b) -> tuple[str, str]:
    """Short labels naming what differs between two compiled kernels (constants, machine,
    argument dtypes); 'A' and 'B' when nothing does."""
    la, lb = [], []
    if ck_a.name != ck_b.name:
        la.append(ck_a.name)
        lb.append(ck_b.name)
    keys = list(dict.fromkeys(list(ck_a.consts) + list(ck_b.consts)))
    for k in keys:
        va, vb = ck_a.consts.get(k), ck_b.consts.get(k)
        if va != vb:
            la.append(f"{k}={va}")
            lb.append(f"{k}={vb}")
    if ck_a.machine.name != ck_b.machine.name:
        la.append(ck_a.machine.name)
        lb.append(ck_b.machine.name)
    da, db = _dtypes(ck_a), _dtypes(ck_b)
    if da != db:
        ta = sorted({str(p.dtype) for p in ck_a.params})
        tb = sorted({str(p.dtype) for p in ck_b.params})
        la.append("/".join(ta))
        lb.append("/".join(tb))
    if not la:
        return "A", "B"
    return ", ".join(la), ", ".join(lb)


def _verdict(res) -> str:
    ok = res.ok
    return {True: "OK", False: "MISMATCH", None: "not checked"}[ok]


def _pipe_counts(program) -> Counter:
    c: Counter = Counter()
    for t in program.tasks:
        for i in run_sources(t.code):
            c["sync" if i.op in SYNC_OPS else i.pipe] += 1
    return c


def _op_counts(program) -> Counter:
    return Counter(i.op for t in program.tasks for i in run_sources(t.code))


class Compare:
    """Two configurations of a kernel side by side.

    `ck_a`, `ck_b`: CompiledKernels; `args`: the arrays to simulate both with (`args_b` when B
    needs other arrays, e.g. another dtype); `res_a`/`res_b`: reuse simulations already run.
    """

    def __init__(self, ck_a, ck_b, args=(), args_b=None, res_a=None, res_b=None, labels=None,
                 max_cores: int = 8, diff_tasks: int = DIFF_TASKS, max_diff_lines: int = MAX_DIFF_LINES):
        self.ck_a, self.ck_b = ck_a, ck_b
        args = tuple(args)
        args_b = args if args_b is None else tuple(args_b)
        self.res_a = res_a if res_a is not None else self._simulate(ck_a, args)
        self.res_b = res_b if res_b is not None else self._simulate(ck_b, args_b)
        self.label_a, self.label_b = labels if labels else config_labels(ck_a, ck_b)
        self.max_cores = max_cores
        self.diff_tasks = diff_tasks
        self.max_diff_lines = max_diff_lines
        self._sections = None
        self._widget = None

    @staticmethod
    def _simulate(ck, args):
        if args:
            res = ck.simulate(*args)
        else:
            res = ck.simulate(mode="timing")
        if not res.trace:
            res.trace = ck.simulate(mode="timing", trace=True).trace
        return res

    # --- numbers --------------------------------------------------------------------------
    @property
    def cycles(self) -> tuple[int, int]:
        return self.res_a.cycles, self.res_b.cycles

    @property
    def speedup(self) -> float:
        """cycles(A) / cycles(B): above 1 when B is faster."""
        a, b = self.cycles
        return a / b if b else float("inf")

    def verdict(self) -> str:
        a, b = self.cycles
        if a == b:
            return "same cycles"
        s = self.speedup
        return f"B is {s:.2f}x faster" if s > 1 else f"B is {1 / s:.2f}x slower"

    def text(self) -> str:
        """One deterministic line for `text/plain` (what nbval compares)."""
        a, b = self.ck_a, self.ck_b
        name = a.name if a.name == b.name else f"{a.name} vs {b.name}"
        return (f"Compare({name}: {self.label_a} -> {self.res_a.cycles} cycles | "
                f"{self.label_b} -> {self.res_b.cycles} cycles, {self.verdict()})")

    def __repr__(self):
        return self.text()

    def rows(self) -> list[tuple[str, str, str]]:
        """The comparison table: (what, A, B)."""
        a, b = self.res_a, self.res_b
        pa, pb = self.ck_a.program, self.ck_b.program
        rows = [
            ("configuration", self.label_a, self.label_b),
            ("constants", ", ".join(f"{k}={v}" for k, v in self.ck_a.consts.items()) or "none",
             ", ".join(f"{k}={v}" for k, v in self.ck_b.consts.items()) or "none"),
            ("machine", self.ck_a.machine.name, self.ck_b.machine.name),
            ("arguments", _dtypes(self.ck_a), _dtypes(self.ck_b)),
            ("cycles", str(a.cycles), str(b.cycles)),
            ("time", f"{a.time_us:.3f} us", f"{b.time_us:.3f} us"),
            ("bound", a.stats.get("bound", ""), b.stats.get("bound", "")),
            ("instructions", str(len(pa)), str(len(pb))),
            ("tasks", str(len(pa.tasks)), str(len(pb.tasks))),
        ]
        ca, cb = _pipe_counts(pa), _pipe_counts(pb)
        for pipe in sorted(set(ca) | set(cb), key=lambda p: (p == "sync", p)):
            rows.append((f"  {pipe}" if pipe == "sync" else f"  on {pipe}", str(ca.get(pipe, 0)),
                         str(cb.get(pipe, 0))))
        rows.append(("HBM traffic", f"{a.stats['hbm_bytes'] / 2**20:.2f} MiB",
                     f"{b.stats['hbm_bytes'] / 2**20:.2f} MiB"))
        rows.append(("check vs numpy", _verdict(a), _verdict(b)))
        return rows

    # --- drawing ----------------------------------------------------------------------------
    def figure(self):
        """The two timelines, stacked, sharing one time axis (cycles)."""
        from .timeline import (ROW_IN, _figure_class, _pick_cores, fit_margins, plot_timeline,
                               timeline_rows)
        n = []
        for res in (self.res_a, self.res_b):
            shown, _ = _pick_cores(res.trace, None, self.max_cores)
            n.append(max(len(timeline_rows(res.trace, shown)), 1))
        height = 1.2 + 0.55 * 2 + ROW_IN * sum(n)
        fig = _figure_class()(figsize=(11, height))
        axes = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": n})
        for ax, res, label in ((axes[0], self.res_a, f"A: {self.label_a}"),
                               (axes[1], self.res_b, f"B: {self.label_b}")):
            plot_timeline(res, ax=ax, max_cores=self.max_cores,
                          title=f"{label} -- {res.cycles} cycles ({res.time_us} us)")
        end = max(self.res_a.cycles or 1, self.res_b.cycles or 1)
        for ax in axes:
            ax.set_xlim(0, end)          # the SAME time axis: the shorter run ends early
        axes[0].set_xlabel("")
        fit_margins(fig, top_in=0.32, bottom_in=0.45, hspace_in=0.45)
        return fig

    def timeline_png(self, dpi: int = TIMELINE_DPI) -> bytes:
        from .static import fig_png
        return fig_png(self.figure(), dpi)

    def diff(self) -> list[str]:
        """The unified diff of the two PTO programs (their first `diff_tasks` tasks)."""
        from .static import unified_diff
        return unified_diff(self.ck_a.program.text(max_tasks=self.diff_tasks),
                            self.ck_b.program.text(max_tasks=self.diff_tasks),
                            f"A ({self.label_a})", f"B ({self.label_b})")

    def html(self) -> str:
        """The comparison as static, deterministic HTML."""
        return "<div class='pypto-compare'>" + "".join(self.sections()) + "</div>"

    def sections(self) -> tuple[str, str, str]:
        """The page's three parts, HTML: the tables, the timelines (a picture), the PTO diff."""
        if self._sections is not None:
            return self._sections
        from .static import diff_html, png_picture_html
        rows = "".join(
            f"<tr><th style='text-align:left; padding-right:1em'>{html.escape(k)}</th>"
            f"<td style='text-align:left; padding-right:1.5em'>{html.escape(va)}</td>"
            f"<td style='text-align:left'>{html.escape(vb)}</td></tr>" for k, va, vb in self.rows())
        head = "<tr><th></th><th style='text-align:left'>A</th><th style='text-align:left'>B</th></tr>"
        oa, ob = _op_counts(self.ck_a.program), _op_counts(self.ck_b.program)
        ops = sorted(set(oa) | set(ob), key=lambda op: (-(oa.get(op, 0) + ob.get(op, 0)), op))
        mix = "".join(f"<tr><td>{html.escape(op)}</td><td style='text-align:right'>{oa.get(op, 0)}</td>"
                      f"<td style='text-align:right'>{ob.get(op, 0)}</td>"
                      f"<td style='text-align:right'>{ob.get(op, 0) - oa.get(op, 0):+d}</td></tr>" for op in ops)
        mix = (f"<table><tr><th style='text-align:left'>opcode</th><th>A</th><th>B</th><th>B-A</th></tr>"
               f"{mix}</table>")
        a_text = self.ck_a.program.text(max_tasks=self.diff_tasks)
        b_text = self.ck_b.program.text(max_tasks=self.diff_tasks)
        n_tasks = max(len(self.ck_a.program.tasks), len(self.ck_b.program.tasks))
        scope = f"first {self.diff_tasks} tasks" if n_tasks > self.diff_tasks else "all tasks"
        diff = diff_html(a_text, b_text, f"A ({self.label_a})", f"B ({self.label_b})",
                         max_lines=self.max_diff_lines)
        summary = (f"<div><b>{html.escape(self.text())}</b></div>"
                   f"<div style='display:flex; gap:24px; align-items:flex-start; flex-wrap:wrap'>"
                   f"<table>{head}{rows}</table>{mix}</div>")
        timelines = (f"<h4 style='margin:8px 0 2px 0'>Timelines (one time axis)</h4>"
                     f"{png_picture_html(self.timeline_png(), 'timelines A and B')}")
        tail = f"<h4 style='margin:8px 0 2px 0'>PTO diff ({scope}, A -&gt; B)</h4>{diff}"
        self._sections = (summary, timelines, tail)
        return self._sections

    def widget(self):
        """The comparison as widgets: the tables, the two runs on one interactive timeline
        (every core; zoom, pan, hover: timeline_widget.py) and the PTO diff."""
        if self._widget is None:
            import ipywidgets as w
            from .timeline_widget import timeline_widget
            summary, _, tail = self.sections()
            self.timeline = timeline_widget(self.res_a, self.res_b, labels=[f"A ({self.label_a})",
                                                                            f"B ({self.label_b})"])
            self._widget = w.VBox([w.HTML(f"<div class='pypto-compare'>{summary}</div>"), self.timeline,
                                   w.HTML(f"<div class='pypto-compare'>{tail}</div>")])
        return self._widget

    def _repr_html_(self):
        return self.html()

    def _repr_mimebundle_(self, include=None, exclude=None):
        """The widgets where a widget front end runs; the static page elsewhere (nbconvert,
        GitHub, untrusted notebooks) and one line of text."""
        data = {}
        try:
            data.update(self.widget()._repr_mimebundle_(include=include, exclude=exclude) or {})
        except ImportError:             # no ipywidgets / anywidget: the static page only
            pass
        data["text/plain"] = self.text()
        data["text/html"] = self.html()
        return data
