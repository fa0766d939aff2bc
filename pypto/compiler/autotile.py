"""Tiling with automatic tile shapes: `AutoTilingPass` (the Tensor -> Tile lowering).

Where the kernel set tile shapes, they are used.  Elsewhere the pass uses `tile_size`, or, with
`search=True`, tries legal tile shapes and keeps the one the simulator's cost model finds
fastest (timing only, no data: each candidate is compiled to a program and timed by the
context's timing model, `PassContext.timing`).  The candidates run through `pypto.sweep` (the
engine under `pypto.tune`): in this process, or on `executor` (a concurrent.futures executor or a
Dask client), with progress.  The default pipeline uses `AutoTilingPass(search=False)`: pypto's
heuristic default tiles, no search.
"""
from __future__ import annotations

import functools

from .. import sweep
from ..ir.tensor import OPS, TensorGraph, TileSpec
from .api import OptimizationPass
from .fusion import fuse
from .pipeline import PassContext, Pipeline
from .tiling import lower_to_tiles

VEC_COLS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
VEC_TILE_BYTES = (4096, 16384, 65536)
CUBE_TILES = (((64, 64), (64, 256), (64, 64)), ((128, 128), (64, 256), (128, 128)),
              ((128, 128), (128, 256), (128, 128)), ((128, 128), (64, 512), (128, 128)),
              ((256, 256), (32, 128), (64, 64)), ((64, 64), (128, 512), (128, 128)),
              ((128, 128), (64, 256), (256, 256)), ((256, 256), (64, 256), (128, 128)),
              # narrow tiles: more tiles to balance over the cores, the A panel kept in L1
              ((128, 128), (128, 256), (64, 64)), ((256, 256), (64, 128), (128, 128)))


class AutoTilingPass(OptimizationPass):
    """Tile shapes for the ops whose kernel set none: `tile_size` elements per tile row, or the
    fastest legal shape found with the simulator's cost model (`search=True`)."""

    level = "tensor->tile"
    description = "loop each fusion group over its tiles (user tile shapes, else tile_size or a cost-model search)"

    def __init__(self, tile_size: int | None = None, search: bool = True, executor=None):
        self.tile_size = tile_size
        self.search = search
        self.executor = executor
        self.tried: list[tuple[tuple, int | None]] = []    # (vector tile, cube tile) -> cycles

    def apply(self, graph: TensorGraph, ctx: PassContext):
        if not any("group" in n.attrs for n in graph.nodes):   # a custom fusion left no groups
            graph = fuse(graph, ctx)
        auto_vec = any(n.attrs.get("auto_tile") for n in graph.nodes)
        auto_mm = any(n.op == "matmul" and "tile" not in n.attrs for n in graph.nodes)
        if not (auto_vec or auto_mm) or (self.tile_size is None and not self.search):
            return lower_to_tiles(graph, ctx)
        if self.tile_size is not None:
            t = self.tile_size
            cube = ((t, t), (64, 256), (t, t)) if auto_mm else None
            vec = (max(1, 4096 // t), t) if auto_vec else None
            return lower_to_tiles(retile(graph, ctx, vec, cube), ctx)
        return lower_to_tiles(self._search(graph, ctx, auto_vec, auto_mm), ctx)

    def _search(self, graph, ctx, auto_vec, auto_mm):
        rows_of = max((n.shape[-1] for n in graph.nodes if n.attrs.get("auto_tile")), default=1)
        vec_cands = [None]
        if auto_vec:
            vec_cands = [(max(1, b // (c * 4)), c) for c in VEC_COLS if c // 2 < max(rows_of, 64)
                         for b in VEC_TILE_BYTES if b >= c * 4]
        cube_cands = list(CUBE_TILES) if auto_mm else [None]
        # vector tiles first (with the default cube tile), then cube tiles with the best vector one
        best = self._sweep(graph, ctx, [(vec, None) for vec in vec_cands], None)
        vec_best = best[1][0] if best else None
        best = self._sweep(graph, ctx, [(vec_best, cube) for cube in cube_cands], best)
        if best is None:   # nothing legal beyond the defaults: keep them
            return graph
        return retile(graph, ctx, *best[1])

    def _sweep(self, graph, ctx, cands, best):
        """(cycles, (vec, cube)) of the fastest of `cands` and `best` (the earlier on a tie)."""
        got = sweep.run(functools.partial(candidate_cycles, graph, ctx), cands, executor=self.executor,
                        what="searching tile shapes", unit="candidates",
                        detail=lambda c, cyc: f"{c}: {cyc} cycles" if cyc is not None else f"{c}: does not fit")
        for cand, cycles in zip(cands, got):
            self.tried.append((cand, cycles))
            if cycles is not None and (best is None or cycles < best[0]):
                best = (cycles, cand)
        return best


def candidate_cycles(graph: TensorGraph, ctx, cand) -> int | None:
    """Cycles of the graph retiled with cand = (vec, cube), or None when those tiles are not legal."""
    from ..errors import PyptoError
    vec, cube = cand
    try:
        return timed_cycles(retile(graph, ctx, vec, cube), ctx)
    except PyptoError:
        return None


def retile(graph: TensorGraph, ctx, vec, cube) -> TensorGraph:
    """The graph with pypto-chosen tiles replaced (vector ops by `vec`, matmuls by `cube`),
    fused again."""
    nodes = []
    for n in graph.nodes:
        a = dict(n.attrs)
        if vec is not None and a.pop("auto_tile", False):
            a = {k: v for k, v in a.items() if k not in ("group", "materialize", "tile")}
            a["tile"] = TileSpec(tuple(vec))
        elif "group" in a and OPS[n.op].kind != "matmul":
            a = {k: v for k, v in a.items() if k not in ("group", "materialize")}
        if n.op == "matmul":
            a = {k: v for k, v in a.items() if k not in ("group", "materialize")}
            if cube is not None and "tile" not in n.attrs:
                a["tile"] = TileSpec(tuple(cube))
        nodes.append(n.replace(attrs=type(n.attrs)(a)))
    regrouped = fuse(graph.replace(nodes), ctx)
    if vec is not None:     # keep the mark: these tiles are still pypto's choice
        auto = {n.id for n in graph.nodes if n.attrs.get("auto_tile")}
        regrouped = regrouped.replace([n.replace(attrs=n.attrs.replace(auto_tile=True)) if n.id in auto else n
                                       for n in regrouped.nodes])
    return regrouped


def timed_cycles(graph: TensorGraph, ctx: PassContext) -> int:
    """Cycles of the program the default pipeline makes from this fused graph (timing only)."""
    from . import default_passes
    passes = default_passes()
    # assign_cores times the program to fix its cores, which leaves the cycles as they are
    rest = [p for p in passes[[p.name for p in passes].index("tiling") + 1:] if p.name != "assign_cores"]
    levels, _, _ = Pipeline(rest).run(lower_to_tiles(graph, ctx), ctx, verify=False)
    return ctx.timed(levels["pto"], "tiling (AutoTilingPass search)")["cycles"]
