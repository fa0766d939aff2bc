"""A sweep of 64 configurations with `pypto.tune`: serial in this process against a real Dask
LocalCluster of 2 worker processes (this machine has 2 cores), with the speed-up; the results
must be identical.  Also: the same sweep a second time (every result from the cache), and the
advisor's latency on the sweep's kernel.

Kernel: softmax over 1024x1024 fp32 with its vector tile (TM rows x TN columns) and double
buffering swept: TM in 1..128, TN in 128..1024, double_buffer on/off (8 x 4 x 2 = 64).

    python benchmarks/tune.py
"""
from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import pypto  # noqa: E402
from pypto.tuning import clear_cache  # noqa: E402

SPACE = {"TM": [1, 2, 4, 8, 16, 32, 64, 128], "TN": [128, 256, 512, 1024], "double_buffer": [True, False]}
X = pypto.Tensor([1024, 1024], pypto.DT_FP32)


@pypto.jit
def softmax(x, out, *, TM: int = 16, TN: int = 256):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = pypto.softmax(x)


def main() -> None:
    import distributed
    softmax.compile(X, X)                      # imports and first-compile work out of the way
    clear_cache()
    t0 = time.perf_counter()
    serial = pypto.tune(softmax, SPACE, X, X, cache=False)
    t_serial = time.perf_counter() - t0
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        pypto.tune(softmax, {"TM": [16]}, X, X, executor=client, cache=False)     # workers warmed
        t0 = time.perf_counter()
        dask = pypto.tune(softmax, SPACE, X, X, executor=client, cache=False)
        t_dask = time.perf_counter() - t0
    same = dask.rows == serial.rows
    pypto.tune(softmax, SPACE, X, X)           # fills the cache
    t0 = time.perf_counter()
    again = pypto.tune(softmax, SPACE, X, X)
    t_cached = time.perf_counter() - t0
    ck = softmax.compile(X, X, TM=4, TN=256)
    clear_cache()
    t0 = time.perf_counter()
    adv = pypto.advise(ck)
    t_adv = time.perf_counter() - t0
    ok = len(serial.ok_rows)
    print(f"pypto.tune, softmax 1024x1024 fp32: {len(serial.rows)} configurations ({ok} compile, "
          f"{len(serial.rows) - ok} do not fit UB)")
    print(f"  best {serial.best_config}: {serial.best['cycles']} cycles (worst that compiles: "
          f"{max(r['cycles'] for r in serial.ok_rows)})")
    print(f"  serial, in process            {t_serial:6.2f} s   {1e3 * t_serial / len(serial.rows):6.1f} ms a configuration")
    print(f"  Dask LocalCluster, 2 workers  {t_dask:6.2f} s   speed-up {t_serial / t_dask:.2f}x, "
          f"results {'identical' if same else 'DIFFERENT'}")
    print(f"  again, from the cache         {t_cached:6.3f} s   ({again.cached} of {len(again.rows)} cached)")
    print(f"  pypto.advise (TM=4, TN=256)   {t_adv:6.2f} s   {adv.tried} changes tried, "
          f"{len(adv.suggestions)} suggested, top: {adv.best.title if adv.best else 'none'}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
