"""`gc_paused()`: run a block with Python's cyclic garbage collector paused.

The compiler's passes and the simulator's event loop allocate millions of small objects (tile
nodes, instructions, attribute maps, heap entries) that never form reference cycles; every
collection those allocations trigger traverses everything still alive, the whole program
being built, so that on large programs the collector costs as much as the work itself.
Reference counting still frees every object as usual: only cycles wait for the collector,
which is restored when the block ends, normally or by an exception.  Nested pauses are fine,
in one thread or several (the explorer checks in a worker thread): the last one to end restores
the collector's state.

What a paused block leaves goes straight to the oldest generation (see `gc_paused`), where only
full collections look, and Python starts those by its own count of objects promoted there,
which this move does not add to: left alone, the reference cycles of every compile and
simulation in a long-lived process (a notebook moving a slider, the fuzzer's worker) would
never be collected.  So the pauses keep that count themselves: a pause starting after its
predecessors left more objects than a full collection last kept alive, than twice the most one
pause has left (a compiled 1.2M-instruction program is 5.4M objects, nearly all of them alive:
a collection right after it would take 1.6 s to find 2,000), and than MIN_PENDING, runs a full
collection first; any full collection, Python's or the user's, resets the count.  The garbage
waiting stays within about what is alive, a collection costs about as much as the objects it
looks at cost to make, and it never runs inside a block.

A base module (like `errors` and `dtypes`): every layer may use it.
"""
from __future__ import annotations

import contextlib
import gc
import threading

MIN_PENDING = 200_000           # objects left by pauses before a full collection is worth it


class _Count:
    pending = 0                 # objects the pauses moved to the oldest generation since a full collection
    kept = 0                    # what the last full collection left alive
    biggest = 0                 # the most objects one pause has left
    depth = 0                   # pauses running now, in every thread
    restore = False             # whether the collector was enabled when the first of them started


_lock = threading.Lock()


def _after_full(phase, info) -> None:
    if phase == "stop" and info.get("generation") == 2:
        _Count.pending = 0
        _Count.kept = len(gc.get_objects())


gc.callbacks.append(_after_full)


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic GC for the block; restore its previous state (enabled or not) after.

    The objects the block made that are still alive (a compiled program: about a million at
    4096^3) would make the first collections after it walk all of them, first as young objects,
    again as middle-aged ones, then in a full collection: 0.4-0.5 s each for a 4096^3 matmul.
    They are long-lived results, so they go straight to the oldest generation
    (`gc.freeze(); gc.unfreeze()` moves every tracked object there without walking any), where
    only full collections look at them; the count of what was moved there decides when the next
    pause starts with one (see the module's docstring).  Objects made before the block move there
    too (their reference cycles, if any, are found by the next full collection instead of a young
    one).  Skipped when the process froze objects itself (`gc.freeze()`: unfreezing would undo it).
    """
    with _lock:                 # (pauses in several threads: the first one in pauses, the last one out restores)
        if _Count.depth == 0:
            _Count.restore = gc.isenabled()
            if _Count.restore and _Count.pending > max(MIN_PENDING, _Count.kept, 2 * _Count.biggest):
                gc.collect()            # (resets the count: _after_full)
            gc.disable()
        _Count.depth += 1
    try:
        yield
    finally:
        with _lock:
            _Count.depth -= 1
            if _Count.depth == 0 and _Count.restore:
                if gc.get_freeze_count() == 0:
                    left = gc.get_count()[0]               # what the block left in the youngest generation
                    _Count.pending += left
                    _Count.biggest = max(_Count.biggest, left)
                    gc.freeze()
                    gc.unfreeze()
                gc.enable()
