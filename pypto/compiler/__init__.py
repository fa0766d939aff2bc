"""The compiler: passes per level, lowerings between levels, and the pipeline that runs them."""
from .api import CompilerPipeline, OptimizationPass, default_pipeline
from .autocast import AUTOCAST_PASSES
from .autotile import AutoTilingPass
from .cores import ASSIGN_CORES
from .crosscore import CROSS_CORE_SYNC
from .fusion import FUSION_PASSES
from .l1reuse import L1_REUSE
from .layout import LAYOUT_PASSES
from .loops import FOLD_LOOPS
from .memory import TILE_PASSES
from .partition import BLOCK_PASSES, PARTITION
from .pipeline import BUILTIN_PASSES, LEVELS, OPTIONS, Pass, PassContext, PassLog, PassRecord, Pipeline
from .pressure import PressureTable, buffer_pressure
from .schedule import CODEGEN, EXEC_PASSES, SELECT, DynamicScheduler
from .tensor_passes import TENSOR_PASSES

TILING = AutoTilingPass(search=False).as_pass("tiling")   # heuristic default tiles, no search


def default_passes() -> list[Pass]:
    """Every pass and lowering of the default pipeline, in order.  autocast and layout see the
    primitives decompose and legalize leave; simplify, cse and dce clean up after them."""
    decompose, legalize, *cleanup = TENSOR_PASSES
    return [decompose, legalize, *AUTOCAST_PASSES, *LAYOUT_PASSES, *cleanup, *FUSION_PASSES, TILING,
            *TILE_PASSES, PARTITION, L1_REUSE, *BLOCK_PASSES, SELECT, *EXEC_PASSES, CROSS_CORE_SYNC, ASSIGN_CORES,
            FOLD_LOOPS, CODEGEN]


PASSES = {p.name: p for p in default_passes()}
BUILTIN_PASSES.update(PASSES.values())

__all__ = ["LEVELS", "OPTIONS", "PASSES", "AutoTilingPass", "CompilerPipeline", "DynamicScheduler", "OptimizationPass", "Pass",
           "PassContext", "PassLog", "PassRecord", "Pipeline", "PressureTable", "buffer_pressure", "default_passes",
           "default_pipeline"]
