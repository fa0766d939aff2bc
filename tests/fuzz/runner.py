"""Run cases in a child process with a timeout, compare with the reference, classify.

Outcome categories (`Outcome.category`):

- correct      every output within the reference's bound, deterministic, checked mode silent,
               the call form fills the same outputs;
- clear        a PyptoError whose text names the kernel's file and line (raised while compiling);
- wrong        numbers outside the bound, the call form disagreeing, an invalid construct
               accepted, or the program's text parsed back printing otherwise, timed to other
               cycles or computing other outputs;
- crash        a non-pypto exception, or any error once the kernel compiled (simulate, checked
               mode flagging the compiler's own program, parsing or timing its text, the call form);
- hang         more than LIMIT seconds to compile and simulate (or the child killed at the timeout);
- unlocated    a PyptoError without the kernel's file and line;
- nondet       two simulations of one program with different cycles or outputs.

Separately, `Outcome.builtin` records pypto's own check (`res.ok`) disagreeing with the verdict:
"false alarm" (res.ok False on a correct kernel) or "missed" (res.ok True on wrong numbers).

The dynamic stage (`Runner(dynamic_every=K)`: a case in K, by its data seed; 0: none): a case
that ended correct, whose parameters include some whose first dim is R, the first dim of its
first output (R >= 2), is compiled again with `pypto.DYNAMIC` first dims for those (a second
request to the worker, `worker.run_dynamic`) and simulated at a few sizes N on its arrays' rows
taken to N rows (`a[idx]`, idx = `worker.row_map`: rows 0..R-1, then rows drawn at random); the
outputs must be the fuzz reference's rows taken the same way.  `Outcome.dynamic` says how it
went: "" (not run), "refused" (a PyptoError naming the kernel line at the dynamic compile: the
case stays correct), "correct", or the failure's category: "wrong" (what="dynamic": numbers;
"dynamic program of a call differs": `ck.program_for(N)` run functionally on its own disagrees
with `res.outputs`), "crash" (stages dynamic-compile, dynamic, dynamic-program, dynamic-checked:
checked mode on the largest size), "unlocated", "hang".  `res.ok` False on right dynamic
outputs is a "false alarm" (True on wrong ones "missed"), as in the static stage.
"""
from __future__ import annotations

import hashlib
import math
import os
import pickle
import re
import select
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from . import reference
from .gen import FLOATS, NP, Case, DataChooser, generate
from .worker import row_map

LIMIT = 30.0            # seconds to compile and simulate a kernel under 16 MiB
CATEGORIES = ("correct", "clear", "wrong", "crash", "hang", "unlocated", "nondet")
FAILURES = ("wrong", "crash", "hang", "unlocated", "nondet")
DYNAMIC_EVERY = 4       # the dynamic stage on one case in 4 (by data seed) unless told otherwise
CHUNK = 2048            # the rows a dynamic kernel is compiled for (pypto.compiler.dynamic.CHUNK)
DYNAMIC_CHUNK_BYTES = 16 << 20      # the dynamic stage only when CHUNK rows of its tensors fit this
DYNAMIC_BIG_ROW = 256   # a size above CHUNK only when a row of every dynamic tensor is this small


@dataclass
class Outcome:
    category: str
    detail: str = ""
    stage: str = ""
    exc_type: str = ""
    builtin: str = ""           # "" | "false alarm" | "missed"
    known: str = ""             # a known bug class (see known_class)
    seconds: float = 0.0
    cycles: object = None
    extra: dict = field(default_factory=dict)
    dynamic: str = ""           # the dynamic stage: "" not run | refused | correct | a failure category

    @property
    def failed(self) -> bool:
        return self.category in FAILURES

    @property
    def signature(self) -> str:
        """What makes two failures the same bug, roughly: category, exception, message head."""
        head = self.detail.splitlines()[0] if self.detail else ""
        head = re.sub(r"fuzzk_\w+\.py(:\d+)?:? ?", "", head)
        head = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", head)
        head = re.sub(r"'[^']*'", "'_'", head)[:90]
        if self.category == "wrong":
            head = self.extra.get("what", "numbers")
        return f"{self.category}|{self.exc_type}|{self.stage}|{head}"

    def line(self) -> str:
        s = f"{self.category}"
        if self.dynamic:
            s += f" [dynamic: {self.dynamic}]"
        if self.known:
            s += f" [known: {self.known}]"
        if self.builtin:
            s += f" [{self.builtin}]"
        return s + (f": {self.detail.splitlines()[0][:300]}" if self.detail else "")


class Worker:
    """One child process running tests/fuzz/worker.py; requests and answers are pickled frames
    on its stdin / stdout, so a hang is a timeout on a pipe and a crash a closed one."""

    def __init__(self):
        self.proc = None
        self.dir = tempfile.mkdtemp(prefix="pypto-fuzz-")

    def start(self):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "worker.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, cwd=root)

    def stop(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def _read(self, n: int, deadline: float) -> bytes | None:
        fd = self.proc.stdout.fileno()
        buf = b""
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                return None
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def run(self, req: dict, timeout: float):
        """The worker's answer, or None when it did not answer in time (it is then killed)."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        data = pickle.dumps(req, protocol=pickle.HIGHEST_PROTOCOL)
        deadline = time.monotonic() + timeout
        try:
            self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
            self.proc.stdin.flush()
            head = self._read(8, deadline)
            body = None if head is None else self._read(struct.unpack("<Q", head)[0], deadline + 60)
        except (EOFError, OSError):
            code = self.proc.wait(5)
            self.proc = None
            return {"error": {"stage": "worker", "type": "WorkerDied", "module": "", "pypto": False,
                              "msg": f"the process running the kernel died (exit code {code})", "tb": ""},
                    "times": {}}
        if body is None:
            self.proc.kill()
            self.proc.wait(5)
            self.proc = None
            return None
        return pickle.loads(body)


def _mismatches(expected: dict, outputs: dict, dtypes: dict) -> list[str]:
    """What differs between the reference's outputs (V values) and a run's, one line each."""
    bad = []
    for name, exp in expected.items():
        got = outputs.get(name)
        if got is None:
            bad.append(f"{name}: missing from res.outputs")
            continue
        ok, why = reference.compare(exp, got, dtypes[name])
        if not ok:
            bad.append(f"{name} ({dtypes[name]}): {why}")
    return bad


def kernel_path(case: Case, directory: str) -> str:
    h = hashlib.sha1((case.source() + case.describe()).encode()).hexdigest()[:10]
    return os.path.join(directory, f"fuzzk_{h}.py")


def _located(msg: str, path: str, nlines: int) -> bool:
    base = re.escape(os.path.basename(path))
    for m in re.finditer(base + r'(?::(\d+)|", line (\d+))', msg):
        line = int(m.group(1) or m.group(2))
        if 1 <= line <= nlines:
            return True
    return False


def dynamic_plan(case: Case) -> dict | None:
    """The dynamic stage of a case: {"params": the parameters whose first dim is R, the first dim
    of the first output; "rows": R; "big": whether a size above CHUNK is run; "seed": the data
    seed, which `worker.row_map` draws the rows past R with}, or None (R < 2, a
    case that must fail, or CHUNK rows of the dynamic tensors over DYNAMIC_CHUNK_BYTES)."""
    if case.expect_error or not case.stores:
        return None
    shapes = {i.name: (tuple(i.shape), i.dtype) for i in case.inputs}
    shapes.update({s.out: (tuple(s.out_shape), s.dtype) for s in case.stores})
    rows = case.stores[0].out_shape[0] if case.stores[0].out_shape else 0
    if rows < 2:
        return None
    params = [p for p in case.params if shapes[p][0] and shapes[p][0][0] == rows]
    row_elems = {p: math.prod(shapes[p][0][1:]) for p in params}
    row_bytes = sum(row_elems[p] * NP[shapes[p][1]].itemsize for p in params)
    if CHUNK * row_bytes > DYNAMIC_CHUNK_BYTES:
        return None
    return {"params": params, "rows": rows, "big": max(row_elems.values()) <= DYNAMIC_BIG_ROW,
            "seed": case.data_seed}


def rows_of(v: "reference.V", idx) -> "reference.V":
    """A reference value (float64 values and their bounds) with its rows taken by `idx`."""
    return reference.V(v.v[idx], np.broadcast_to(v.e, v.v.shape)[idx])


class Runner:
    def __init__(self, limit: float = LIMIT, timeout: float | None = None, dynamic_every: int = DYNAMIC_EVERY):
        self.worker = Worker()
        self.limit = limit
        self.timeout = timeout or 3 * limit
        self.dynamic_every = dynamic_every
        self.memo: dict[str, Outcome] = {}

    def wants_dynamic(self, case: Case) -> dict | None:
        """The dynamic stage's plan for a case (see `dynamic_plan`) when this runner runs it."""
        if not self.dynamic_every or case.data_seed % self.dynamic_every:
            return None
        return dynamic_plan(case)

    def close(self):
        self.worker.stop()

    def run(self, case: Case) -> Outcome:
        key = case.source() + case.describe()
        if key in self.memo:
            return self.memo[key]
        out = self._run(case)
        out.known = known_class(case, out)
        self.memo[key] = out
        return out

    def _run(self, case: Case) -> Outcome:
        o = self._run_static(case)
        plan = self.wants_dynamic(case) if o.category == "correct" else None
        if plan is not None:
            self._run_dynamic(case, plan, o)
        return o

    def _run_dynamic(self, case: Case, plan: dict, o: Outcome) -> None:
        """The dynamic stage (see the module docstring): updates the static stage's outcome `o`."""
        arrays = case.arrays()
        path = kernel_path(case, self.worker.dir)
        nlines = case.source().count("\n") + 1
        req = {"source": case.source(), "path": path, "arrays": arrays, "machine": case.machine,
               "params": case.params, "dynamic": plan}
        o.extra["dynamic"] = dict(plan)
        t0 = time.perf_counter()
        res = self.worker.run(req, self.timeout)
        dt = time.perf_counter() - t0
        o.seconds += dt
        o.extra["dynamic"]["seconds"] = dt

        def fail(category, detail, stage="dynamic", exc_type="", what=""):
            o.category, o.dynamic, o.stage, o.exc_type = category, category, stage, exc_type
            o.detail = detail
            if what:
                o.extra["what"] = what

        if res is None:
            return fail("hang", f"dynamic stage: no answer after {self.timeout:.0f} s (child killed)")
        times = res.get("times", {})
        o.extra["dynamic"]["times"] = times
        o.extra["dynamic"]["sizes"] = res.get("dynamic", {}).get("sizes", [])
        err = res.get("error")
        if err:
            stage, msg = err["stage"], err["msg"]
            if stage == "dynamic-compile" and err["pypto"] and _located(msg, path, nlines):
                o.dynamic = "refused"
                o.extra["dynamic"]["refusal"] = msg
                return
            o.extra["tb"] = err["tb"]
            if "size" in err:
                o.extra["dynamic"]["size"] = err["size"]
            if stage == "dynamic-compile" and err["pypto"]:
                return fail("unlocated", f"dynamic compile: {msg}", stage, err["type"])
            at = f" (N={err['size']})" if "size" in err else ""
            return fail("crash", f"{stage}{at}: {err['type']}: {msg}", stage, err["type"])
        if times.get("compile", 0) > self.limit and case.nbytes() < 16 << 20:
            return fail("hang", f"the dynamic compile took {times['compile']:.1f} s (limit {self.limit:.0f} s)")
        expected = reference.evaluate(case, arrays)
        dtypes = {s.out: s.dtype for s in case.stores}
        dyn = set(plan["params"])
        runs = res["dynamic"]["runs"]
        for run in runs:                                    # the numbers, at every size
            n = run["n"]
            idx = row_map(n, plan["rows"], plan["seed"])
            bad = _mismatches({k: rows_of(v, idx) if k in dyn else v for k, v in expected.items()},
                              run["outputs"], dtypes)
            if bad:
                fail("wrong", f"dynamic N={n}: " + "; ".join(bad), what="dynamic")
                o.extra["dynamic"]["size"] = n
                if run.get("ok"):
                    o.builtin = "missed"
                return
        for run in runs:                                    # the program of the call, on its own
            if run["program_differs"]:
                fail("wrong", f"dynamic N={run['n']}: ck.program_for({run['n']}) run functionally on its own "
                              f"gives other {', '.join(run['program_differs'])} than ck.simulate(...).outputs",
                     what="dynamic program of a call differs")
                o.extra["dynamic"]["size"] = run["n"]
                return
        o.dynamic = "correct"
        for run in runs:
            if run.get("ok") is False and not o.builtin:
                o.builtin = "false alarm"
                o.stage = "dynamic"
                o.extra["dynamic"]["size"] = run["n"]
                o.detail = f"dynamic N={run['n']}: res.ok is False: " + ", ".join(
                    f"{k}: max abs err {c.get('max_abs_err'):.3g} (rtol {c.get('rtol')}, atol {c.get('atol')})"
                    for k, c in run.get("check", {}).items() if not c.get("ok"))
                return

    def _run_static(self, case: Case) -> Outcome:
        arrays = case.arrays()
        path = kernel_path(case, self.worker.dir)
        src = case.source()
        nlines = src.count("\n") + 1
        req = {"source": src, "path": path, "arrays": arrays, "machine": case.machine, "params": case.params}
        t0 = time.perf_counter()
        res = self.worker.run(req, self.timeout)
        dt = time.perf_counter() - t0
        if res is None:
            big = case.nbytes() >= 16 << 20      # the 30 s promise is for kernels under 16 MiB
            return Outcome("correct" if big else "hang", f"no answer after {self.timeout:.0f} s (child killed)"
                           + (f"; {case.nbytes() >> 20} MiB, not counted as a hang" if big else ""), seconds=dt)
        err = res.get("error")
        times = res.get("times", {})
        if err:
            stage, msg = err["stage"], err["msg"]
            o = Outcome("", msg if err["pypto"] else f"{err['type']}: {msg}", stage, err["type"], seconds=dt,
                        extra={"tb": err["tb"]})
            if stage == "load":
                o.category = "crash"
                o.detail = "the generated kernel file does not load (a fuzzer bug): " + o.detail
            elif not err["pypto"]:
                o.category = "crash"
            elif stage == "compile":
                o.category = "clear" if _located(msg, path, nlines) else "unlocated"
            else:
                o.category = "crash"     # the compiler's program must run (and pass checked mode)
                o.detail = f"{stage}: {err['type']}: {msg}"
            return o
        o = Outcome("correct", seconds=dt, cycles=res.get("cycles"), extra={"times": times})
        if case.expect_error:
            o.category, o.extra["what"] = "wrong", "accepted invalid construct"
            o.detail = f"an invalid construct compiled and ran: {case.expect_error}"
            return o
        spent = times.get("compile", 0) + times.get("simulate", 0)
        if spent > self.limit and case.nbytes() < 16 << 20:
            o.category, o.detail = "hang", f"compile + simulate took {spent:.1f} s (limit {self.limit:.0f} s)"
            return o
        expected = reference.evaluate(case, arrays)
        dtypes = {s.out: s.dtype for s in case.stores}
        bad = _mismatches(expected, res["outputs"], dtypes)
        builtin_ok = res.get("ok")
        if bad:
            special = re.search(r"(got|expected) np\.float64\(-?(nan|inf)\)", bad[0])
            what = f"numbers ({'NaN/inf' if special else 'finite'}, {dtypes[bad[0].split()[0]]})"
            o.category, o.detail, o.extra["what"] = "wrong", "; ".join(bad), what
            if builtin_ok:
                o.builtin = "missed"
            return o
        for name, got in res.get("call_outputs", {}).items():
            if not np.array_equal(np.asarray(got), np.asarray(res["outputs"][name]), equal_nan=True):
                o.category, o.extra["what"] = "wrong", "call form differs"
                o.detail = f"kernel(*arrays) filled {name} differently from ck.simulate(*arrays).outputs"
                return o
        if res.get("cycles") != res.get("cycles2") or not res.get("same_outputs", True):
            o.category = "nondet"
            o.detail = f"two simulations: cycles {res.get('cycles')} and {res.get('cycles2')}, " \
                       f"same outputs {res.get('same_outputs')}"
            return o
        if (not res.get("text_same", True) or res.get("text_cycles", res.get("cycles")) != res.get("cycles")
                or not res.get("text_outputs", True)):
            o.category, o.extra["what"] = "wrong", "program text"
            o.detail = (f"the printed program parsed back: the same text {res.get('text_same')}, timed to "
                        f"{res.get('text_cycles')} cycles against {res.get('cycles')}, the same outputs "
                        f"{res.get('text_outputs')}")
            return o
        if builtin_ok is False:
            o.builtin = "false alarm"
            o.detail = "res.ok is False: " + ", ".join(
                f"{k}: max abs err {c.get('max_abs_err'):.3g} (rtol {c.get('rtol')}, atol {c.get('atol')})"
                for k, c in res.get("check", {}).items() if not c.get("ok"))
        return o


# ---------------------------------------------------------------------------------------
# the bug classes other engineers are fixing (so that a bounded test run marks them xfail)

def _ops(case: Case):
    return [(n.op, n.attrs.get("fn")) for n in case.nodes]


def known_class(case: Case, o: Outcome) -> str:
    """The known bug class an outcome belongs to, or ''."""
    d = o.detail + o.extra.get("tb", "")
    if o.builtin == "false alarm" and not o.failed and any(
            n.dtype in ("fp16", "bf16") for n in case.nodes):
        return "res.ok MISMATCH on a correct fp16/bf16 kernel"
    if not o.failed:
        return ""
    if o.stage == "checked" and "race" in d and any(st.kind == "overlap" for st in case.stores):
        return "new: a later write over part of an output races with the cube store before it (no dependency)"
    if any(n.op == "bin" and n.attrs["fn"] == "div" and n.dtype == "fp32" and any(
            not isinstance(a, tuple) and case.nodes[a].dtype in ("int8", "int32") for a in n.args)
           for n in case.nodes):
        return "int division"
    if o.exc_type == "IndexError" and any(n.shape == () for n in case.nodes):
        return "0-d intermediate crashes fusion/scheduling (IndexError)"
    if o.exc_type in ("ValueError", "SimulationError") and ("broadcast" in d or "EXPAND" in d) and any(
            n.op == "bin" and len({len(case.nodes[a].shape) for a in n.args if not isinstance(a, tuple)}) == 2
            for n in case.nodes):
        return "broadcast [..., M, 1] against lower-rank [N]: raw ValueError"
    if o.category == "hang":        # every tile is unrolled into the program (issue 12)
        return "scale: a program of several 100k instructions (every tile unrolled) takes over 30 s"
    if o.exc_type == "TypeError" and o.stage == "compile":
        return "raw TypeError for unsupported Python"
    return ""


# ---------------------------------------------------------------------------------------
# hypothesis: search and shrink

class FuzzFailure(AssertionError):
    pass


def search(runner: Runner, seed: int, examples: int, max_ops: int = 7, skip=frozenset(),
           on_case=None, shrink_seconds: float = 300.0, derandomize: bool = False, skip_known: bool = False,
           log=None, deadline: float | None = None):
    """One hypothesis run of `examples` generated kernels.  The first failure whose signature
    is not in `skip` is shrunk (for at most `shrink_seconds`; only failures with the same
    signature count while shrinking) and returned as (case, outcome); None when none failed.
    `on_case(case, outcome)` sees every generated (not shrinking) kernel; `skip_known`: failures
    of a known bug class are not shrunk either.  A hang is not shrunk (each try would cost the
    timeout).  `log(text)` hears when shrinking starts.  `deadline` (`time.monotonic()`): no
    kernel starts after it, generated or shrinking (a campaign's budget)."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings, strategies as st
    from hypothesis import seed as hseed

    state = {"target": None, "best": None, "t_shrink": None}

    @settings(max_examples=examples, database=None, deadline=None, derandomize=derandomize,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink],
              report_multiple_bugs=False, print_blob=False, verbosity=Verbosity.quiet)
    @given(st.data())
    def prop(data):
        case = generate(DataChooser(data), max_ops)
        key = case.source() + case.describe()
        fail = False
        late = deadline is not None and time.monotonic() > deadline
        if state["target"] is not None:           # shrinking: only the same kind of failure counts
            if (late or time.perf_counter() - state["t_shrink"] > shrink_seconds) and key not in runner.memo:
                return
            o = runner.run(case)
            fail = o.failed and o.signature == state["target"]
            if fail and _size(case) <= _size(state["best"][0]):
                state["best"] = (case, o)
        else:
            if late:                              # (the budget is spent: the run's other examples pass)
                return
            o = runner.run(case)
            if on_case is not None:
                on_case(case, o)
            if o.failed and o.signature not in skip and not (skip_known and o.known):
                state["target"], state["best"], state["t_shrink"] = o.signature, (case, o), time.perf_counter()
                if o.category == "hang":
                    state["t_shrink"] -= 10 * shrink_seconds + 1e6
                elif log is not None:
                    log(f"  shrinking: {o.line()[:200]}")
                fail = True
        if fail:                                  # one raise site: one 'interesting origin'
            raise FuzzFailure(o.signature)

    if not derandomize:
        prop = hseed(seed)(prop)
    try:
        prop()
    except FuzzFailure:
        return state["best"]
    except Exception as e:  # noqa: BLE001 - hypothesis own complaints (Flaky, ...): keep the case found
        if state["best"] is not None:
            return state["best"]
        raise e
    return None


def _size(case: Case) -> tuple:
    return (len(case.lines), sum(len(ln) for ln in case.lines), case.nbytes())


def report(case: Case, o: Outcome) -> str:
    """The minimal kernel, its inputs and the failure, as a runnable reproducer."""
    head = [f"# pypto fuzz failure: {o.category}" + (f" (known: {o.known})" if o.known else ""),
            f"# {case.describe()}"]
    for ln in (o.detail or "").splitlines()[:12]:
        head.append(f"# {ln}")
    tb = o.extra.get("tb", "")
    if tb and o.category in ("crash", "unlocated"):
        head.append("# traceback (tail):")
        head += [f"#   {ln}" for ln in tb.strip().splitlines()[-12:]]
    dyn = o.extra.get("dynamic")
    if dyn and o.stage.startswith("dynamic"):       # a failure of the dynamic stage: reproduce that
        head.append(f"# dynamic stage: pypto.DYNAMIC first dims for {', '.join(dyn['params'])} "
                    f"({dyn['rows']} rows in the case), sizes {dyn.get('sizes') or '(not reached)'}")
        sizes = [dyn["size"]] if dyn.get("size") else dyn.get("sizes") or None
        return "\n".join(head) + "\n" + case.repro(dynamic={"params": dyn["params"], "rows": dyn["rows"],
                                                             "seed": dyn["seed"], "sizes": sizes})
    return "\n".join(head) + "\n" + case.repro()


def is_lowp(case: Case) -> bool:
    return any(n.dtype in FLOATS[1:] for n in case.nodes)
