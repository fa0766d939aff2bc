"""Chrome Trace Event JSON (opens in Perfetto / chrome://tracing): a process per core, a thread per pipe."""
from __future__ import annotations

import json

from ..ir.exec import AIC_PIPES, AIV_PIPES


def chrome_trace(events, machine, name: str = "pypto") -> dict:
    us = 1.0 / (machine.clock_ghz * 1e3)   # microseconds per cycle
    cores = sorted({e.core for e in events}, key=lambda c: (c[:3] != "AIC", int(c[3:])))
    pid = {c: i + 1 for i, c in enumerate(cores)}
    out = []
    for c in cores:
        pipes = AIC_PIPES if c.startswith("AIC") else AIV_PIPES
        out.append({"ph": "M", "name": "process_name", "pid": pid[c], "tid": 0, "args": {"name": c}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid[c], "tid": 0,
                    "args": {"sort_index": pid[c]}})
        for k, p in enumerate(pipes):
            out.append({"ph": "M", "name": "thread_name", "pid": pid[c], "tid": k + 1, "args": {"name": p}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid[c], "tid": k + 1,
                        "args": {"sort_index": k + 1}})
    tids = {p: k + 1 for k, p in enumerate(AIC_PIPES)}
    tidv = {p: k + 1 for k, p in enumerate(AIV_PIPES)}
    for e in events:
        tid = (tids if e.core.startswith("AIC") else tidv)[e.pipe]
        out.append({"ph": "X", "name": e.op, "cat": e.pipe, "pid": pid[e.core], "tid": tid,
                    "ts": round(e.start * us, 6), "dur": round((e.end - e.start) * us, 6),
                    "args": {"cycles": e.end - e.start, "start_cycle": e.start, "task": e.task,
                             "instr": e.index, "line": e.line}})
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"kernel": name, "machine": machine.name, "clock_ghz": machine.clock_ghz}}


def write_chrome_trace(path, events, machine, name: str = "pypto") -> str:
    with open(path, "w") as f:
        json.dump(chrome_trace(events, machine, name), f)
    return str(path)
