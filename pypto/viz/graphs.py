"""Graphviz views of the four graph levels (the PTO program is text, see `Program.text`).

Each function takes one level's IR and returns a `graphviz.Digraph`; `to_svg` renders it with
the `dot` binary.  Big graphs are folded so that a view stays readable whatever the problem size:
the tile graph shows one outer iteration per fusion group ("x 64 iterations" in the group's
title), the block and execution graphs merge the tasks of one (group, wave) into one node once
there are more than `COLLAPSE_ABOVE` tasks.  `expand=True` draws every tile op / every task, up to
`MAX_EXPANDED_NODES` nodes (a note node says how many were left out).

Every node has a tooltip (SVG <title>, shown on hover): the op, its shapes, its memory space or
core, and the kernel source line it comes from.
"""
from __future__ import annotations

from ..ir.core import fmt_shape, region_text
from ..ir.exec import SYNC_OPS, loops_in, run_sources, static_instrs

COLLAPSE_ABOVE = 32          # more tasks than this: one node per (group, wave)
MAX_TILE_NODES = 160         # per group, so that a long inner (K) loop cannot swamp the view
MAX_EXPANDED_NODES = 400     # expanded views: dot stays interactive (about a second) up to here

# Colors are muted pastels so that black labels stay legible.
GROUP_COLORS = ("#e8f0fe", "#fde9d9", "#e6f4ea", "#fef7e0", "#f3e8fd", "#e0f7fa", "#fce8f3", "#eeeeee")
SPACE_COLORS = {"UB": "#cfe2ff", "L1": "#d1f0d8", "L0A": "#fff3bf", "L0B": "#ffe0b3", "L0C": "#f8c9d4",
                "GM": "#e0e0e0"}
CORE_COLORS = {"AIC": "#f8c9d4", "AIV": "#cfe2ff"}
LEVELS = ("tensor", "tile", "block", "exec")


def _digraph(name: str, **graph_attr):
    import graphviz   # lazily: importing pypto must not import graphviz
    g = graphviz.Digraph(name=name)
    g.attr(rankdir="TB", fontname="Helvetica", fontsize="11", **graph_attr)
    g.attr("node", shape="box", style="rounded,filled", fillcolor="white", fontname="Helvetica",
           fontsize="10")
    g.attr("edge", fontname="Helvetica", fontsize="8", color="#555555")
    return g


def _group_color(k) -> str:
    return GROUP_COLORS[int(k) % len(GROUP_COLORS)]


def to_svg(digraph) -> str:
    """The SVG text of a Digraph, laid out by `dot`."""
    return digraph.pipe(format="svg", encoding="utf-8")


def level_graph(ck, level: str, expand: bool = False):
    """The Digraph of one level of a CompiledKernel: 'tensor' | 'tile' | 'block' | 'exec'.

    `expand=True` draws every tile op (tile level) or every task (block, exec levels) instead of
    the folded view, capped at MAX_EXPANDED_NODES nodes."""
    key = {"execution": "exec"}.get(level, level)
    if key not in LEVELS:
        raise ValueError(f"no graph view for level {level!r}; expected one of {', '.join(LEVELS)}")
    ir = {"tensor": ck.tensor_graph, "tile": ck.tile_graph, "block": ck.block_graph,
          "exec": ck.exec_graph}[key]
    if key == "tensor":
        return tensor_graph(ir)
    return {"tile": tile_graph, "block": block_graph, "exec": exec_graph}[key](ir, expand=expand)


def is_folded(ck, level: str) -> bool:
    """Whether the default view of this level folds repeated tiles or tasks (so that expanding
    it would draw more)."""
    key = {"execution": "exec"}.get(level, level)
    if key == "tile":
        return any(n.outer != 0 for n in ck.tile_graph.nodes)
    if key in ("block", "exec"):
        return len(ck.block_graph.tasks) > COLLAPSE_ABOVE
    return False


# --- level 1: tensor graph ----------------------------------------------------------------
def _const_text(n) -> str:
    v = n.attrs.get("value")
    return f"{v:g}" if isinstance(v, float) else str(v)


def tensor_graph(g, locations: bool = True):
    """A node per op; parameters and outputs as boxes; fusion groups as colored clusters.
    `locations=False` leaves the kernel lines out (a static picture that must not change when
    the cell that defines the kernel gets another number)."""
    dg = _digraph(g.name, label=f"tensor graph {g.name}", labelloc="t")
    users = g.users()
    consts = {n.id: _const_text(n) for n in g.nodes if n.op == "const"}
    outputs = set(g.output_names)
    groups: dict[object, list[tuple[str, dict]]] = {}
    for n in g.nodes:
        if n.op == "const":
            continue                        # folded into the label of its user
        where = n.loc.short() if n.loc and locations else ""
        attrs = {"tooltip": _tooltip(n.op, f"{n.dtype}{fmt_shape(n.shape)}", n.attrs.get("tile"), where)}
        if n.op == "input":
            param = n.attrs["param"]
            if not users[n.id] and param in outputs:
                continue                    # a pure output: its store box stands for it
            label = f"{param}\n{n.dtype}{fmt_shape(n.shape)}"
            attrs.update(shape="box", style="filled", fillcolor="#e0e0e0", penwidth="1.5")
        elif n.op == "store":
            region = region_text(n.attrs["offsets"], n.shape, n.attrs.get("steps"))
            label = f"store {n.attrs['param']}{region}" + (f"\n{where}" if locations else "")
            attrs.update(shape="box", style="filled", fillcolor="#d9d9d9", penwidth="2")
        else:
            folded = [consts[i] for i in n.inputs if i in consts]
            op = n.op + (f"({', '.join(folded)})" if folded else "")
            label = f"{op}\n{n.dtype}{fmt_shape(n.shape)}" + (f"\n{where}" if locations else "")
        groups.setdefault(n.attrs.get("group"), []).append((f"t{n.id}", dict(label=label, **attrs)))
    for k, members in groups.items():
        if k is None:
            for name, attrs in members:
                dg.node(name, **attrs)
            continue
        with dg.subgraph(name=f"cluster_group{k}") as sg:
            sg.attr(label=f"group {k}", style="filled,rounded", fillcolor=_group_color(k), color="#999999")
            for name, attrs in members:
                sg.node(name, **attrs)
    drawn = {name for members in groups.values() for name, _ in members}
    for n in g.nodes:
        for i in n.inputs:
            if f"t{i}" in drawn and f"t{n.id}" in drawn:
                dg.edge(f"t{i}", f"t{n.id}")
    return dg


def _tooltip(op, shape, tile=None, where="", *extra) -> str:
    parts = [op, shape]
    if tile is not None:
        parts.append(f"tile {_nested(tile)}")
    parts.extend(e for e in extra if e)
    if where:
        parts.append(f"line {where}")
    return "\n".join(str(p) for p in parts)


def _nested(v) -> str:
    """(32, 256) -> [32,256]; cube tiles are nested: ((64, 64), ...) -> [[64,64],...]."""
    if isinstance(v, (tuple, list)):
        return "[" + ",".join(_nested(x) for x in v) + "]"
    return str(v)


# --- level 2: tile graph ------------------------------------------------------------------
def tile_graph(g, expand: bool = False, max_nodes: int = MAX_EXPANDED_NODES):
    """Per fusion group the tile ops of outer iteration 0 (all its inner iterations); with
    `expand=True` the tile ops of every iteration, at most `max_nodes` in all."""
    if expand:
        title = f"tile graph {g.name} (all iterations"
        title += f", first {max_nodes} of {len(g.nodes)} tile ops)" if len(g.nodes) > max_nodes else ")"
    else:
        title = f"tile graph {g.name} (outer iteration 0 of each group)"
    dg = _digraph(g.name, label=title, labelloc="t")
    shown: set[int] = set()
    gm_edges: list[tuple[str, str, str]] = []
    by_group: dict[int, list] = {}
    budget = max_nodes
    for n in g.nodes:
        if expand:
            if budget > 0:
                by_group.setdefault(n.group, []).append(n)
                budget -= 1
        elif n.outer == 0:
            by_group.setdefault(n.group, []).append(n)
    per_group = max_nodes if expand else MAX_TILE_NODES
    for info in g.groups:
        nodes = by_group.get(info.id, [])
        with dg.subgraph(name=f"cluster_group{info.id}") as sg:
            sg.attr(label=f"group {info.id}: {info.kind} on {info.core_type}, tile {fmt_shape(info.tile)}, "
                          f"x {info.n_outer} iterations",
                    style="filled,rounded", fillcolor=_group_color(info.id), color="#999999",
                    tooltip=f"group {info.id}: {info.n_outer} outer iterations of tile {fmt_shape(info.tile)}")
            if not nodes:
                sg.node(f"more{info.id}", label="(not drawn: node cap reached)", shape="plaintext", style="")
            for n in nodes[:per_group]:
                sg.node(f"n{n.id}", **_tile_node_attrs(n))
                shown.add(n.id)
                gm = n.attrs.get("gm")
                if gm is not None and n.op == "TLOAD":
                    gm_edges.append((f"gm_{gm.buf.name}", f"n{n.id}", _window(gm)))
                elif gm is not None and n.op == "TSTORE":
                    gm_edges.append((f"n{n.id}", f"gm_{gm.buf.name}", _window(gm)))
            if len(nodes) > per_group:
                sg.node(f"more{info.id}", label=f"... {len(nodes) - per_group} more tile ops",
                        shape="plaintext", style="")
            elif not expand and info.n_outer > 1:
                sg.node(f"rep{info.id}", label=f"x {info.n_outer}", shape="plaintext", style="",
                        fontsize="14", tooltip=f"the tile ops above repeat for {info.n_outer} outer "
                                               f"iterations; tick 'expand all tiles' to draw them all")
    for b in g.buffers:
        dg.node(f"gm_{b.name}", label=f"GM {b.name}\n{b.dtype}{fmt_shape(b.shape)}\n{b.role}",
                shape="cylinder", style="filled", fillcolor=SPACE_COLORS["GM"],
                tooltip=f"GM buffer {b.name} ({b.role})\n{b.dtype}{fmt_shape(b.shape)}")
    for n in g.nodes:
        if n.id in shown:
            for i in n.inputs:
                if i in shown:
                    dg.edge(f"n{i}", f"n{n.id}")
    for src, dst, window in gm_edges:
        dg.edge(src, dst, label=window, tooltip=window, color="#888888", style="dashed")
    return dg


def _window(gm) -> str:
    """The region of a GM window without the buffer name (the box next to it names it)."""
    text = gm.text()
    return text[len(gm.buf.name):] if text.startswith(gm.buf.name + "[") else text


def _tile_node_attrs(n) -> dict:
    where = n.loc.short() if n.loc else ""
    gm = n.attrs.get("gm")
    if n.op == "TSTORE":
        return dict(label=n.op, fillcolor=SPACE_COLORS["GM"],
                    tooltip=_tooltip(n.op, "to GM", None, where, f"GM {gm.text()}" if gm else ""))
    addr = f"@{n.attrs['buf']:#x}" if "buf" in n.attrs else ""
    shape = f"{n.dtype}{fmt_shape(n.shape)}"
    valid = "" if n.valid == n.shape else f" valid {fmt_shape(n.valid)}"
    return dict(label=f"{n.op}\n{n.space}{addr}\n{shape}{valid}",
                fillcolor=SPACE_COLORS.get(n.space, "white"),
                tooltip=_tooltip(n.op, f"{n.space}{addr} {shape}{valid}", None, where,
                                 f"GM {gm.text()}" if gm else ""))


# --- levels 3 and 4: block and execution graphs -------------------------------------------
def block_graph(g, expand: bool = False, max_nodes: int = MAX_EXPANDED_NODES):
    """A node per task colored by core type, edges for dependencies (collapsed when large)."""
    def label(t):
        outer = f"{t.outer[0]}..{t.outer[-1]}" if len(t.outer) > 1 else str(t.outer[0])
        return f"task {t.id}\ngroup {t.group} on {t.core_type}\niteration {outer}\nwave {t.level}"

    def merged(tasks):
        t = tasks[0]
        return f"group {t.group}: {len(tasks)} tasks on {t.core_type}\nwave {t.level}"

    by_id = g.tiles.by_id()

    def where(t):
        return _lines(by_id[i].loc for i in t.nodes if i in by_id)

    return _task_graph(g.name, "block graph", g.tasks, label, merged, expand, max_nodes, where)


def exec_graph(g, expand: bool = False, max_nodes: int = MAX_EXPANDED_NODES):
    """A node per launched task listing its instruction counts per pipe and its syncs."""
    def counts(tasks):
        pipes: dict[str, int] = {}
        syncs = 0
        for t in tasks:
            for i in run_sources(t.code):
                if i.op in SYNC_OPS:
                    syncs += 1
                else:
                    pipes[i.pipe] = pipes.get(i.pipe, 0) + 1
        return "  ".join(f"{p} {c}" for p, c in sorted(pipes.items())) + f"\n{syncs} sync"

    def folded(tasks) -> str:
        """'\n12 loops: 3,603 lines for 14,976 instructions' for tasks whose code has loops."""
        loops = sum(1 for t in tasks for _ in loops_in(t.code))
        if not loops:
            return ""
        text = sum(1 for t in tasks for _ in static_instrs(t.code))
        runs = sum(t.n_instrs for t in tasks)
        return f"\n{loops} loop{'s' if loops > 1 else ''}: {text:,} lines for {runs:,} instructions"

    def label(t):
        core = t.core_type + ("" if getattr(t, "core", None) is None else str(t.core))    # assign_cores
        return f"task {t.id} on {core}\n{counts([t])}{folded([t])}"

    def merged(tasks):
        t = tasks[0]
        # Tasks of one group are usually isomorphic: per-task counts say more than totals.
        same = len({x.n_instrs for x in tasks}) == 1
        body = f"per task: {counts([t])}{folded([t])}" if same else f"in total: {counts(tasks)}{folded(tasks)}"
        return f"group {t.group}: {len(tasks)} tasks on {t.core_type}, wave {t.level}\n{body}"

    def where(t):
        return _lines(i.loc for i, _ in static_instrs(t.code))

    return _task_graph(g.name, "execution graph", g.tasks, label, merged, expand, max_nodes, where)


def _lines(locs) -> str:
    """'line softmax.py:5, 6, 7' for the distinct source lines of some IR nodes."""
    by_file: dict[str, set[int]] = {}
    for loc in locs:
        if loc is not None:
            by_file.setdefault(loc.file.rsplit("/", 1)[-1], set()).add(loc.line)
    if not by_file:
        return ""
    parts = [f"{f}:{', '.join(map(str, sorted(ls)))}" for f, ls in sorted(by_file.items())]
    return ("lines " if sum(map(len, by_file.values())) > 1 else "line ") + "; ".join(parts)


def _task_graph(name, title, tasks, label, merged, expand=False, max_nodes=MAX_EXPANDED_NODES,
                where=lambda t: ""):
    if expand or len(tasks) <= COLLAPSE_ABOVE:
        drawn = tasks[:max_nodes]
        note = f", first {len(drawn)} drawn (cap {max_nodes})" if len(drawn) < len(tasks) else ""
        dg = _digraph(name, label=f"{title} {name} ({len(tasks)} tasks{note})", labelloc="t")
        for t in drawn:
            dg.node(f"k{t.id}", label=label(t), fillcolor=CORE_COLORS.get(t.core_type, "white"),
                    tooltip=_tooltip(f"task {t.id}: group {t.group} on {t.core_type}",
                                     f"deps {list(t.deps)}, wave {t.level}", None, "", where(t)))
        ids = {t.id for t in drawn}
        for t in drawn:
            for d in t.deps:
                if d in ids:
                    dg.edge(f"k{d}", f"k{t.id}")
        if len(drawn) < len(tasks):
            dg.node("more", label=f"... {len(tasks) - len(drawn)} more tasks not drawn\n"
                                  f"(expanded views are capped at {max_nodes} nodes)",
                    shape="plaintext", style="")
        return dg
    dg = _digraph(name, label=f"{title} {name} ({len(tasks)} tasks)", labelloc="t")
    # Collapse: one node per (group, wave); an edge per pair of merged nodes, labelled with the
    # number of task-to-task dependencies it stands for.
    members: dict[tuple[int, int], list] = {}
    for t in tasks:
        members.setdefault((t.group, t.level), []).append(t)
    key_of = {t.id: (t.group, t.level) for t in tasks}
    for (grp, wave), ts in members.items():
        ids = [t.id for t in ts]
        dg.node(f"g{grp}w{wave}", label=merged(ts), fillcolor=CORE_COLORS.get(ts[0].core_type, "white"),
                penwidth="2", tooltip=_tooltip(f"tasks {_ranges(ids)} (group {grp}, wave {wave})",
                                               f"{len(ts)} tasks on {ts[0].core_type}", None, "",
                                               where(ts[0])))
    edges: dict[tuple, int] = {}
    for t in tasks:
        for d in t.deps:
            e = (key_of[d], key_of[t.id])
            edges[e] = edges.get(e, 0) + 1
    for ((g0, w0), (g1, w1)), count in edges.items():
        dg.edge(f"g{g0}w{w0}", f"g{g1}w{w1}", label=f"{count} deps")
    return dg


def _ranges(ids) -> str:
    """[0,1,2,5,6] -> '0-2, 5-6'."""
    out, start, prev = [], None, None
    for i in sorted(ids):
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return ", ".join(out)
