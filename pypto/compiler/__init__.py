"""The compiler: passes per level, lowerings between levels, and the pipeline that runs them."""
from .fusion import FUSION_PASSES
from .memory import TILE_PASSES
from .partition import BLOCK_PASSES, PARTITION
from .pipeline import BUILTIN_PASSES, LEVELS, Pass, PassContext, PassLog, PassRecord, Pipeline
from .schedule import CODEGEN, EXEC_PASSES, SELECT
from .tensor_passes import TENSOR_PASSES
from .tiling import TILING


def default_passes() -> list[Pass]:
    """Every pass and lowering of the default pipeline, in order."""
    return [*TENSOR_PASSES, *FUSION_PASSES, TILING, *TILE_PASSES, PARTITION, *BLOCK_PASSES,
            SELECT, *EXEC_PASSES, CODEGEN]


PASSES = {p.name: p for p in default_passes()}
BUILTIN_PASSES.update(PASSES.values())

__all__ = ["LEVELS", "PASSES", "Pass", "PassContext", "PassLog", "PassRecord", "Pipeline", "default_passes"]
