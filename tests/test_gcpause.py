"""The paused collector (pypto.gcpause): blocks run without it, and the reference cycles they leave
are still collected in a long-lived process (a notebook moving a slider, the fuzzer's worker: its
run of 16,000 kernels grew to 24 GB before the pauses counted what they leave)."""
import gc

import numpy as np

import pypto
from pypto import gcpause


def _kernel():
    def k(x, out):                     # a new kernel each time: its compile and results are garbage
        pypto.set_vec_tile_shapes(8, 64)
        out[:] = pypto.softmax(x * 1.5, dim=-1)
    return pypto.jit(k)


def test_cycles_left_by_paused_blocks_are_collected(monkeypatch):
    monkeypatch.setattr(gcpause, "MIN_PENDING", 20_000)
    x = np.ones((256, 256), np.float32)
    peak = 0
    for _ in range(40):
        ck = _kernel().compile(x, np.zeros_like(x))
        ck.simulate(x, np.zeros_like(x))
        peak = max(peak, len(gc.get_objects()))
    gc.collect()
    alive = len(gc.get_objects())
    # each compile and simulation leaves some 20,000 objects in cycles (a kernel and its cache):
    # without the count, all 40 would still be there (about 860,000 objects); with it, what is
    # tracked stays within about twice what is alive (plus one block's leftovers)
    assert peak < 2 * alive + 3 * 20_000, (peak, alive)


def test_a_full_collection_resets_the_count():
    with gcpause.gc_paused():
        junk = [[i] for i in range(1000)]
        for a in junk:
            a.append(a)                 # cycles
        del junk, a
    assert gcpause._Count.pending >= 1000
    gc.collect()
    assert gcpause._Count.pending == 0 and gcpause._Count.kept > 0


def test_nested_pauses_restore_the_collector():
    assert gc.isenabled()
    with gcpause.gc_paused():
        with gcpause.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
