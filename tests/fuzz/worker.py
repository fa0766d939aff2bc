"""The child process that runs kernels: pypto is imported here only.

A request is the kernel's source, the file to write it to, the arrays and the machine.  The
worker writes the file, imports it as a module (so that tracebacks and pypto's errors name a
real file and line), then runs in order: compile, simulate (full, with pypto's own check),
simulate again (determinism), checked-mode simulation, and the call form `kernel(*arrays)`.
The first exception ends the case; it comes back as text (type, module, message, traceback).
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


def _exc(stage: str, e: BaseException) -> dict:
    import pypto
    return {"stage": stage, "type": type(e).__name__, "module": type(e).__module__,
            "pypto": isinstance(e, pypto.PyptoError), "msg": str(e),
            "tb": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-6000:]}


def run_one(req: dict) -> dict:
    import numpy as np
    import pypto
    path = req["path"]
    with open(path, "w") as f:
        f.write(req["source"])
    out: dict = {"times": {}}
    t0 = time.perf_counter()
    name = "fuzzcase_" + os.path.basename(path)[:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
        kernel = mod.fuzz_kernel
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
