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
    """Pause the cyclic GC for the block; restore its previous state (enabled or not) after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
