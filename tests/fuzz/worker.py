"""The child process that runs kernels: pypto is imported here only.

A request is the kernel's source, the file to write it to, the arrays and the machine.  The
worker writes the file, imports it as a module (so that tracebacks and pypto's errors name a
real file and line), then runs in order: compile, simulate (full, with pypto's own check),
simulate again (determinism), checked-mode simulation, the program's text parsed back, timed and run
(`pypto.Program.parse`: the same text, cycles and outputs), and the call form `kernel(*arrays)`.
The first exception ends the case; it comes back as text (type, module, message, traceback).

A request with "dynamic" (the runner's second request for a case, `run_dynamic`) compiles the
kernel again with `pypto.DYNAMIC` first dims for the parameters named there, then simulates it
at a few sizes N on the case's rows, repeated to N rows (`row_map`); each run also runs the
program of the call (`ck.program_for(N)`) on its own, which must give the same outputs; the
largest size runs once more in checked mode.
"""
from __future__ import annotations

import importlib.util
import os
import pickle
import struct
import sys
import time
import traceback
import warnings


# the printed program of a kernel of up to this many instructions read back is run functionally too
# (its timing run, decoded from its loops, is a fraction of a second even at a million)
TEXT_RUN_MAX = 200_000


def _exc(stage: str, e: BaseException) -> dict:
    import pypto
    return {"stage": stage, "type": type(e).__name__, "module": type(e).__module__,
            "pypto": isinstance(e, pypto.PyptoError), "msg": str(e),
            "tb": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-6000:]}


def _load(req: dict):
    """The kernel of a request: its source written to the request's file, imported as a module."""
    path = req["path"]
    with open(path, "w") as f:
        f.write(req["source"])
    name = "fuzzcase_" + os.path.basename(path)[:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.fuzz_kernel


def run_one(req: dict) -> dict:
    if req.get("dynamic"):
        return run_dynamic(req)
    import numpy as np
    out: dict = {"times": {}}
    t0 = time.perf_counter()
    try:
        kernel = _load(req)
    except BaseException as e:  # noqa: BLE001 - a kernel file that does not even load
        out["error"] = _exc("load", e)
        return out
    arrays = [np.array(a, copy=True) for a in req["arrays"]]
    machine = req["machine"]
    try:
        ck = kernel.compile(*arrays, machine=machine)
    except BaseException as e:  # noqa: BLE001
        out["error"] = _exc("compile", e)
        return out
    out["times"]["compile"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    try:
        res = ck.simulate(*arrays)
    except BaseException as e:  # noqa: BLE001
        out["error"] = _exc("simulate", e)
        return out
    out["times"]["simulate"] = time.perf_counter() - t1
    out["outputs"] = {k: np.asarray(v) for k, v in res.outputs.items()}
    out["cycles"] = res.cycles
    out["ok"] = res.ok
    out["check"] = {k: {kk: (bool(vv) if kk == "ok" else vv) for kk, vv in c.items()
                        if kk in ("ok", "max_abs_err", "rtol", "atol")} for k, c in (res.check or {}).items()}
    out["instructions"] = res.instructions
    try:
        res2 = ck.simulate(*arrays, check=False)
        out["cycles2"] = res2.cycles
        out["same_outputs"] = all(np.array_equal(np.asarray(res2.outputs[k]), np.asarray(v), equal_nan=True)
                                  for k, v in res.outputs.items())
    except BaseException as e:  # noqa: BLE001
        out["error"] = _exc("simulate-again", e)
        return out
    try:
        ck.simulate(*arrays, checked=True, check=False)
    except BaseException as e:  # noqa: BLE001
        out["error"] = _exc("checked", e)
        return out
    try:                # the printed program read back: the same text, timed to the same cycles
        import pypto
        text = ck.program.text()
        parsed = pypto.Program.parse(text, machine=machine)
        out["text_same"] = parsed.text() == text
        out["text_cycles"] = pypto.sim.simulate(parsed, machine=machine, mode="timing", progress=False).cycles
        if len(ck.program) <= TEXT_RUN_MAX:         # (a larger one's second run would be its hang)
            given = {p: np.array(a, copy=True) for p, a in zip(req["params"], req["arrays"])}
            got = pypto.sim.simulate(parsed, given, machine=machine, mode="functional").outputs
            out["text_outputs"] = all(np.array_equal(np.asarray(got[k]), np.asarray(v), equal_nan=True)
                                      for k, v in res.outputs.items())
    except BaseException as e:  # noqa: BLE001
        out["error"] = _exc("text", e)
        return out
    if req.get("call", True):
        copies = [np.array(a, copy=True) for a in req["arrays"]]
        t2 = time.perf_counter()
        try:
            kernel(*copies, machine=machine)
        except BaseException as e:  # noqa: BLE001
            out["error"] = _exc("call", e)
            return out
        out["times"]["call"] = time.perf_counter() - t2
        out["call_outputs"] = {p: copies[i] for i, p in enumerate(req["params"]) if p in out["outputs"]}
    return out


def dynamic_sizes(rows: int, chunk: int, big: bool) -> list[int]:
    """The sizes a dynamic stage runs: the case's own rows, one row, a few more rows than the
    case (another program of the ladder, or a padded last piece), and with `big` one whole chunk
    and then some (two pieces, the second one's rows moved)."""
    sizes = [rows, 1, rows + 3] + ([chunk + rows + 3] if big else [])
    return list(dict.fromkeys(sizes))


def row_map(n: int, rows: int, seed: int):
    """Which row of the case each of the n rows of a call is: the case's rows in order, then rows
    drawn at random (seeded by the case's data seed and n).  Not a plain cycle: rows cycled with
    period `rows` would hide a piece or a tile reading rows off by a multiple of it (2048 rows
    further on are the same rows when `rows` is a power of two)."""
    import numpy as np
    idx = np.random.default_rng([seed, n]).integers(0, rows, n)
    k = min(n, rows)
    idx[:k] = np.arange(k)
    return idx


def run_dynamic(req: dict) -> dict:
    """The dynamic stage: compile with pypto.DYNAMIC first dims for req["dynamic"]["params"]
    (arrays for the other parameters), then, per size N of `dynamic_sizes`, ck.simulate on the
    arrays' rows taken to N rows by `row_map`, and the program of the call run functionally on
    its own, and its text read back (`pypto.Program.parse`) too."""
    import numpy as np
    import pypto
    from pypto.dtypes import from_numpy
    from pypto.sim.run import simulate as run_program
    dyn = req["dynamic"]
    names = list(dyn["params"])
    out: dict = {"times": {}, "dynamic": {"params": names, "runs": []}}
    t0 = time.perf_counter()
    try:
        kernel = _load(req)
    except BaseException as e:  # noqa: BLE001
        out["error"] = _exc("load", e)
        return out
    arrays = [np.array(a, copy=True) for a in req["arrays"]]
    specs = [pypto.Tensor([pypto.DYNAMIC, *a.shape[1:]], from_numpy(a.dtype)) if p in names else a
             for p, a in zip(req["params"], arrays)]
    try:
        ck = kernel.compile(*specs, machine=req["machine"])
    except BaseException as e:  # noqa: BLE001 - a PyptoError here is a refusal (located or not)
        out["error"] = _exc("dynamic-compile", e)
        return out
    out["times"]["compile"] = time.perf_counter() - t0
    if ck.dynamic is None or set(ck.dynamic.params) != set(names):
        out["error"] = {"stage": "dynamic-compile", "type": "NotDynamic", "module": "", "pypto": False,
                        "msg": f"compiled with DYNAMIC specs for {names}, got a kernel whose dynamic params are "
                               f"{None if ck.dynamic is None else list(ck.dynamic.params)}", "tb": ""}
        return out
    rows = dyn["rows"]
    sizes = dynamic_sizes(rows, ck.dynamic.chunk, dyn.get("big", False))
    out["dynamic"]["sizes"] = sizes
    t1 = time.perf_counter()

    def args_for(n):
        idx = row_map(n, rows, dyn["seed"])
        return [a[idx] if p in names else np.array(a, copy=True) for p, a in zip(req["params"], arrays)]

    for n in sizes:
        args = args_for(n)
        try:
            res = ck.simulate(*args)
        except BaseException as e:  # noqa: BLE001
            out["error"] = _exc("dynamic", e)
            out["error"]["size"] = n
            return out
        check = {k: {kk: (bool(vv) if kk == "ok" else vv) for kk, vv in c.items()
                     if kk in ("ok", "max_abs_err", "rtol", "atol")} for k, c in (res.check or {}).items()}
        run = {"n": n, "outputs": {k: np.asarray(v) for k, v in res.outputs.items()}, "ok": res.ok,
               "cycles": res.cycles, "check": check}
        try:      # the program of the call, run functionally on its own, computes the same
            program = ck.program_for(n)
            got = run_program(program, ck._padded(ck.bind(args), n), machine=ck.machine, mode="functional").outputs
            got = {k: np.asarray(v)[:n] if k in ck.dynamic.params else np.asarray(v) for k, v in got.items()}
            run["program_differs"] = [k for k, v in run["outputs"].items()
                                      if k not in got or not np.array_equal(got[k], v, equal_nan=True)]
            # ... and so does its text read back (printing the same)
            text = program.text()
            parsed = pypto.Program.parse(text, machine=ck.machine)
            if parsed.text() != text:
                run["program_differs"].append("(its text read back prints otherwise)")
            if len(program) <= TEXT_RUN_MAX:
                again = run_program(parsed, ck._padded(ck.bind(args), n), machine=ck.machine,
                                    mode="functional").outputs
                again = {k: np.asarray(v)[:n] if k in ck.dynamic.params else np.asarray(v) for k, v in again.items()}
                run["program_differs"] += [f"{k} (its text read back)" for k, v in got.items()
                                           if k not in again or not np.array_equal(again[k], v, equal_nan=True)]
        except BaseException as e:  # noqa: BLE001
            out["error"] = _exc("dynamic-program", e)
            out["error"]["size"] = n
            return out
        out["dynamic"]["runs"].append(run)
    n = max(sizes)
    try:          # checked mode on the largest call (its pieces' tasks together on the cores)
        ck.simulate(*args_for(n), checked=True, check=False)
    except BaseException as e:  # noqa: BLE001
        out["error"] = _exc("dynamic-checked", e)
        out["error"]["size"] = n
        return out
    out["times"]["simulate"] = time.perf_counter() - t1
    return out


def _send(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def _recv(f):
    head = f.read(8)
    if len(head) < 8:
        raise EOFError
    (n,) = struct.unpack("<Q", head)
    return pickle.loads(f.read(n))


def main() -> None:
    """Serve requests framed on stdin, answers on (the original) stdout, until stdin closes."""
    warnings.filterwarnings("ignore")
    sys.setrecursionlimit(10000)
    # pypto from the tree this file is in (a git worktree's, not an installed copy's): the runner
    # starts this script with that tree as its working directory
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    proto_in, proto_out = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                       # anything a kernel or pypto prints goes to stderr
    import pypto  # noqa: F401 - import once, before the first request is timed
    while True:
        try:
            req = _recv(proto_in)
        except (EOFError, OSError):
            return
        try:
            res = run_one(req)
        except BaseException as e:  # noqa: BLE001 - never die on a case
            res = {"error": {"stage": "worker", "type": type(e).__name__, "module": "", "pypto": False,
                             "msg": str(e), "tb": traceback.format_exc()[-6000:]}, "times": {}}
        try:
            _send(proto_out, res)
        except Exception as e:  # noqa: BLE001 - an unpicklable result
            _send(proto_out, {"error": {"stage": "worker", "type": type(e).__name__, "module": "",
                                        "pypto": False, "msg": f"result not picklable: {e}", "tb": ""},
                              "times": {}})


if __name__ == "__main__":
    main()
