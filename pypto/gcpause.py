"""`gc_paused()`: run a block with Python's cyclic garbage collector paused.

The compiler's passes and the simulator's event loop allocate millions of small objects (tile
nodes, instructions, attribute maps, heap entries) that never form reference cycles; every
collection those allocations trigger traverses everything still alive, the whole program
being built, so that on large programs the collector costs as much as the work itself.
Reference counting still frees every object as usual: only cycles wait for the collector,
which is restored when the block ends, normally or by an exception.  Nested pauses are fine:
the outermost one restores the collector's state.

A base module (like `errors` and `dtypes`): every layer may use it.
"""
from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic GC for the block; restore its previous state (enabled or not) after.

    The objects the block made that are still alive (a compiled program: about a million at
    4096^3) would make the first collections after it walk all of them, first as young objects,
    again as middle-aged ones, then in a full collection: 0.4-0.5 s each for a 4096^3 matmul.
    They are long-lived results, so they go straight to the oldest generation
    (`gc.freeze(); gc.unfreeze()` moves every tracked object there without walking any), where
    only full collections look at them.  Objects made before the block move there too (their
    reference cycles, if any, are found by the next full collection instead of a young one).
    Skipped when the process froze objects itself (`gc.freeze()`: unfreezing would undo it).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
