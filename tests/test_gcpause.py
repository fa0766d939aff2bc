"""The paused collector (pypto.gcpause): blocks run without it, and the reference cycles they leave
are still collected in a long-lived process (a notebook moving a slider, the fuzzer's worker: its
run of 16,000 kernels grew to 24 GB before the pauses counted what they leave)."""
import gc
import os
import subprocess
import sys

from pypto import gcpause


LOOP = r"""
import gc, sys
import numpy as np
import pypto
from pypto import gcpause
gcpause.MIN_PENDING = 20_000
x = np.ones((256, 256), np.float32)
peak = 0
for _ in range(30):
    def k(x, out):                 # a new kernel each time: its compile and results are garbage
        pypto.set_vec_tile_shapes(8, 64)
        out[:] = pypto.softmax(x * 1.5, dim=-1)
    ck = pypto.jit(k).compile(x, np.zeros_like(x))
    ck.simulate(x, np.zeros_like(x))
    peak = max(peak, len(gc.get_objects()))
gc.collect()
print(peak, len(gc.get_objects()))
"""


def test_cycles_left_by_paused_blocks_are_collected():
    """In a fresh process (a small heap, as a notebook's or the fuzzer's worker starts): each
    compile and simulation leaves some 20,000 objects in cycles (a kernel and its cache);
    without the count all 30 would still be there (some 650,000 objects), with it what is
    tracked stays within about twice what is alive, plus one block's leftovers."""
    out = subprocess.run([sys.executable, "-c", LOOP], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    peak, alive = map(int, out.stdout.split())
    assert peak < 2 * alive + 3 * 20_000, (peak, alive)


def test_a_full_collection_resets_the_count():
    with gcpause.gc_paused():
        junk = [[i] for i in range(1000)]
        for a in junk:
            a.append(a)                 # cycles
        del junk, a
    assert gcpause._Count.pending >= 900            # (about the thousand lists left)
    gc.collect()
    assert gcpause._Count.pending == 0 and gcpause._Count.kept > 0


def test_nested_pauses_restore_the_collector():
    assert gc.isenabled()
    with gcpause.gc_paused():
        with gcpause.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_pauses_in_two_threads_that_end_out_of_order_restore_the_collector():
    """A pause in a worker thread that starts inside the main thread's and ends after it (the
    explorer's check): the collector stays paused until both end, then runs again (a pause that
    restored the state it found would leave it off for good)."""
    import threading
    assert gc.isenabled()
    started, release, done = threading.Event(), threading.Event(), threading.Event()

    def worker():
        with gcpause.gc_paused():
            started.set()
            release.wait(5)
        done.set()
    with gcpause.gc_paused():
        t = threading.Thread(target=worker)
        t.start()
        assert started.wait(5)
    assert not gc.isenabled()           # the worker's pause still runs
    release.set()
    t.join(5)
    assert done.is_set() and gc.isenabled()
