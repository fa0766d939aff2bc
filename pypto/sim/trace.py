"""Chrome Trace Event JSON (opens in Perfetto / chrome://tracing).

A process per core; on it a "tasks" thread with one slice per task and a thread per pipe with
one slice per instruction (a pipe runs in order, so its slices never overlap); flow arrows from
each task to the tasks that depend on it; a counter of the on-chip bytes each core's task uses.
"""
from __future__ import annotations

import json

from ..ir.exec import AIC_PIPES, AIV_PIPES, TileRef, static_instrs


def _onchip_bytes(task) -> dict[str, int]:
    """Highest byte used in each on-chip space by a task's tiles."""
    top: dict[str, int] = {}
    for ins, _ in static_instrs(task.code):
        for o in (ins.dst,) + tuple(ins.srcs):
            if isinstance(o, TileRef):
                top[o.space] = max(top.get(o.space, 0), o.addr + o.nbytes)
    return top


def chrome_trace(events, machine, name: str = "pypto", task_times=None, program=None) -> dict:
    us = 1.0 / (machine.clock_ghz * 1e3)   # microseconds per cycle
    cores = {e.core for e in events} | {c for c, _, _ in (task_times or {}).values()}
    cores = sorted(cores, key=lambda c: (c[:3] != "AIC", int(c[3:])))
    pid = {c: i + 1 for i, c in enumerate(cores)}
    out = []
    for c in cores:
        pipes = AIC_PIPES if c.startswith("AIC") else AIV_PIPES
        out.append({"ph": "M", "name": "process_name", "pid": pid[c], "tid": 0, "args": {"name": c}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid[c], "tid": 0,
                    "args": {"sort_index": pid[c]}})
        out.append({"ph": "M", "name": "thread_name", "pid": pid[c], "tid": 0, "args": {"name": "tasks"}})
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
                             "instr": e.index, "line": e.line,
                             **({"data_ready_cycle": e.ready} if e.ready >= 0 else {})}})
    if task_times and program is not None:
        out.extend(_task_events(task_times, program, pid, us))
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"kernel": name, "machine": machine.name, "clock_ghz": machine.clock_ghz}}


def _task_events(task_times, program, pid, us):
    out = []
    for tid, (core, start, end) in sorted(task_times.items()):
        task = program.tasks[tid]
        out.append({"ph": "X", "name": f"task {tid} (group {task.group})", "cat": "task", "pid": pid[core],
                    "tid": 0, "ts": round(start * us, 6), "dur": round(max(end - start, 1) * us, 6),
                    "args": {"task": tid, "group": task.group, "deps": list(task.deps),
                             "cycles": end - start, "start_cycle": start}})
        used = _onchip_bytes(task)
        for when, scale in ((start, 1), (end, 0)):
            out.append({"ph": "C", "name": "on-chip bytes", "pid": pid[core], "ts": round(when * us, 6),
                        "args": {space: b * scale for space, b in sorted(used.items())}})
        for d in task.deps:
            dcore, _, dend = task_times[d]
            flow = {"name": "dependency", "cat": "dependency", "id": d * 1_000_003 + tid}
            out.append({**flow, "ph": "s", "pid": pid[dcore], "tid": 0, "ts": round(max(dend - 1, 0) * us, 6)})
            out.append({**flow, "ph": "f", "bp": "e", "pid": pid[core], "tid": 0, "ts": round(start * us, 6)})
    return out


def write_chrome_trace(path, events, machine, name: str = "pypto", task_times=None, program=None) -> str:
    with open(path, "w") as f:
        json.dump(chrome_trace(events, machine, name, task_times, program), f)
    return str(path)
