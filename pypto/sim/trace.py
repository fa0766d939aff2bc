"""Chrome Trace Event JSON (opens in Perfetto / chrome://tracing).

A process per core; on it a "tasks" thread with one slice per task and a thread per pipe with
one slice per instruction (a pipe runs in order, so its slices never overlap); flow arrows from
each task to the tasks that depend on it; a counter of the on-chip bytes each core's task uses.
"""
from __future__ import annotations

import json
import os
import threading

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
    """The Chrome trace of a run as a dict (what `write_chrome_trace` writes, read back)."""
    return json.loads("".join(_json_parts(events, machine, name, task_times, program)))


def _json_parts(events, machine, name, task_times, program):
    """The text of the trace's JSON, in pieces: the cores' and pipes' names, a slice per
    instruction, the tasks' slices, counters and flow arrows, then the kernel's figures."""
    us = 1.0 / (machine.clock_ghz * 1e3)   # microseconds per cycle
    cores = {e.core for e in events} | {c for c, _, _ in (task_times or {}).values()}
    cores = sorted(cores, key=lambda c: (c[:3] != "AIC", int(c[3:])))
    pid = {c: i + 1 for i, c in enumerate(cores)}
    meta = []
    for c in cores:
        pipes = AIC_PIPES if c.startswith("AIC") else AIV_PIPES
        meta.append({"ph": "M", "name": "process_name", "pid": pid[c], "tid": 0, "args": {"name": c}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid[c], "tid": 0,
                     "args": {"sort_index": pid[c]}})
        meta.append({"ph": "M", "name": "thread_name", "pid": pid[c], "tid": 0, "args": {"name": "tasks"}})
        for k, p in enumerate(pipes):
            meta.append({"ph": "M", "name": "thread_name", "pid": pid[c], "tid": k + 1, "args": {"name": p}})
            meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid[c], "tid": k + 1,
                         "args": {"sort_index": k + 1}})
    tail = _task_events(task_times, program, pid, us) if task_times and program is not None else []
    yield '{"traceEvents": [\n'
    sep = ""
    for chunk in (map(json.dumps, meta), _instr_json(events, pid, us), map(json.dumps, tail)):
        for text in chunk:
            yield sep + text
            sep = ",\n"
    other = {"kernel": name, "machine": machine.name, "clock_ghz": machine.clock_ghz}
    yield f'\n], "displayTimeUnit": "ns", "otherData": {json.dumps(other)}}}\n'


_FLOAT = float.__repr__         # (JSON's text of a float: a numpy float's repr would name its type)


def _instr_json(events, pid: dict, us: float):
    """A slice per executed instruction on its core's pipe, as JSON text: made as text, not as a
    dict to encode (a million-instruction run: seconds instead of tens of seconds).  Its name,
    pipe, process and thread, and its source line, written once per kind."""
    heads: dict = {}        # (core, pipe, op) -> the slice's text up to its time stamp
    lines: dict = {}        # source location -> its JSON string
    tids = {p: k + 1 for k, p in enumerate(AIC_PIPES)}
    tidv = {p: k + 1 for k, p in enumerate(AIV_PIPES)}
    for core, pipe, op, start, end, task, index, line, ready in events:
        head = heads.get((core, pipe, op))
        if head is None:
            tid = (tids if core.startswith("AIC") else tidv)[pipe]
            head = heads[core, pipe, op] = (f'{{"ph": "X", "name": {json.dumps(op)}, "cat": {json.dumps(pipe)}, '
                                            f'"pid": {pid[core]}, "tid": {tid}, "ts": ')
        text = lines.get(line)
        if text is None:
            text = lines[line] = json.dumps(line)
        yield (f'{head}{_FLOAT(round(start * us, 6))}, "dur": {_FLOAT(round((end - start) * us, 6))}, '
               f'"args": {{"cycles": {end - start}, "start_cycle": {start}, "task": {task}, "instr": {index}, '
               f'"line": {text}' + (f', "data_ready_cycle": {ready}}}}}' if ready >= 0 else "}}"))


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
    """Write the Chrome trace of a run to `path` as it is made, a few thousand slices at a time,
    into a file beside it renamed to `path` when complete: an error leaves no half-written trace."""
    path = os.fspath(path)
    head, tail = os.path.split(os.path.abspath(path))
    tmp = os.path.join(head, f".{tail}.{os.getpid()}.{threading.get_ident()}.tmp")    # (open()'s mode)
    try:
        with open(tmp, "w") as f:
            chunk = []
            for text in _json_parts(events, machine, name, task_times, program):
                chunk.append(text)
                if len(chunk) >= _CHUNK:
                    f.write("".join(chunk))
                    chunk.clear()
            f.write("".join(chunk))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


_CHUNK = 1 << 14            # slices written at a time
