"""pypto.tune: a sweep of a kernel's constants, options and machines, timed in this process, on a
thread or process pool, or on a real Dask LocalCluster, with the same results everywhere."""
import concurrent.futures as cf
import multiprocessing

import pytest

import pypto
from pypto import sweep
from pypto.progress import listening
from pypto.tuning import clear_cache, evaluate, Job

T = pypto.Tensor
F32 = pypto.DT_FP32
X = T([512, 1024], F32)
SPACE = {"TM": [4, 8, 16, 32], "TN": [256, 1024]}


@pypto.jit
def softmax(x, out, *, TM: int = 16, TN: int = 256):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = pypto.softmax(x)


def cycles_of(tm, tn, **kw):
    return softmax.compile(X, X, TM=tm, TN=tn, **kw).simulate(mode="timing").cycles


@pytest.fixture(autouse=True)
def fresh():
    clear_cache()
    yield
    clear_cache()


def test_every_configuration_is_timed_as_a_compile_would_time_it():
    res = pypto.tune(softmax, SPACE, X, X)
    assert res.names == ("TM", "TN") and len(res.rows) == 8 and res.cached == 0
    assert [r["config"] for r in res.rows] == [{"TM": m, "TN": n} for m in (4, 8, 16, 32) for n in (256, 1024)]
    failed = [r for r in res.rows if "error" in r]
    assert [r["config"] for r in failed] == [{"TM": 32, "TN": 1024}]       # 3 tiles of 128 KiB: UB is 192
    assert failed[0]["error"].startswith("TileShapeError: the tiles of group 0 do not fit UB")
    for r in res.ok_rows:
        assert r["cycles"] == cycles_of(r["config"]["TM"], r["config"]["TN"])
    assert res.best_config == {"TM": 4, "TN": 1024}
    assert res.best["cycles"] == min(r["cycles"] for r in res.ok_rows)
    assert res.ranked()[0] is res.best and "error" in res.ranked()[-1]
    assert res.compile(X, X).consts == {"TM": 4, "TN": 1024}
    assert res.compile().simulate(mode="timing").cycles == res.best["cycles"]   # the swept shapes


def test_the_jit_cache_is_left_as_it_was():
    softmax.cache_clear()
    pypto.tune(softmax, SPACE, X, X)
    assert softmax.cache_size == 0


def test_a_second_sweep_times_only_what_is_new():
    first = pypto.tune(softmax, {"TM": [8, 16], "TN": 256}, X, X)
    again = pypto.tune(softmax, {"TM": [8, 16, 32], "TN": 256}, X, X)
    assert again.cached == 2
    assert [r["cycles"] for r in again.rows[:2]] == [r["cycles"] for r in first.rows]
    other = pypto.tune(softmax, {"TM": [8, 16], "TN": 256}, T([256, 1024], F32), T([256, 1024], F32))
    assert other.cached == 0                                   # other shapes: other programs


def test_options_and_machines_are_part_of_the_space():
    res = pypto.tune(softmax, {"double_buffer": [True, False], "machine": ["a2a3", "a5"]}, X, X)
    got = {(r["config"]["double_buffer"], r["config"]["machine"]): r["cycles"] for r in res.rows}
    assert got[(True, "a2a3")] == cycles_of(16, 256)
    assert got[(False, "a2a3")] == cycles_of(16, 256, options={"double_buffer": False})
    assert got[(True, "a5")] == softmax.compile(X, X, machine="a5").simulate(mode="timing").cycles
    assert got[(False, "a2a3")] > got[(True, "a2a3")]


def test_a_list_of_configurations_is_taken_as_it_is():
    res = pypto.tune(softmax, [{"TM": 8, "TN": 1024}, {"TM": 4}], X, X)
    assert res.names == ("TM", "TN") and [r["config"] for r in res.rows] == [{"TM": 8, "TN": 1024}, {"TM": 4}]
    assert res.rows[1]["cycles"] == cycles_of(4, 256)         # TN keeps its default


def test_bad_spaces_are_clear_errors():
    with pytest.raises(pypto.PyptoError, match="'TMM' is not something softmax can be tuned by") as e:
        pypto.tune(softmax, {"TMM": [1, 2]}, X, X)
    assert "TM, TN" in e.value.expected and "did you mean 'TM'?" in str(e.value)
    with pytest.raises(pypto.PyptoError, match="add it to the kernel: def softmax"):
        pypto.tune(softmax, {"ROWS": [1, 2]}, X, X)
    with pytest.raises(pypto.PyptoError, match="did you mean 'double_buffer'"):
        pypto.tune(softmax, {"double_bufer": [False]}, X, X)
    with pytest.raises(pypto.PyptoError, match="the tuning space is empty"):
        pypto.tune(softmax, {"TM": []}, X, X)
    with pytest.raises(pypto.PyptoError, match="a dict of name -> values"):
        pypto.tune(softmax, [("TM", 8)], X, X)
    with pytest.raises(pypto.PyptoError, match="takes a @pypto.jit kernel"):
        pypto.tune(softmax.fn, SPACE, X, X)
    with pytest.raises(pypto.PyptoError, match="unknown machine|no machine|machine"):
        pypto.tune(softmax, {"machine": ["a9"]}, X, X)
    dyn = T([pypto.DYNAMIC, 1024], F32)
    with pytest.raises(pypto.UnsupportedError, match="pypto.DYNAMIC dim"):
        pypto.tune(softmax, SPACE, dyn, dyn)


def test_progress_names_each_finished_configuration():
    events = []
    with listening(events.append):
        pypto.tune(softmax, {"TM": [8, 16], "TN": [256]}, X, X)
    mine = [e for e in events if e.what == "tuning softmax"]
    assert [e.done for e in mine] == [1, 2, 2] and mine[-1].closed and mine[0].total == 2 and mine[0].unit == "configs"
    assert mine[0].detail == f"TM=8 TN=256: {cycles_of(8, 256)} cycles"
    assert all(e.what == "tuning softmax" for e in events)      # the compiles inside stay quiet


def test_a_thread_pool_gives_the_same_results():
    serial = pypto.tune(softmax, SPACE, X, X, cache=False)
    with cf.ThreadPoolExecutor(2) as pool:
        threads = pypto.tune(softmax, SPACE, X, X, executor=pool, cache=False)
    assert threads.rows == serial.rows and threads.executor == "ThreadPoolExecutor"


def test_a_process_pool_gives_the_same_results():
    serial = pypto.tune(softmax, {"TM": [8, 16], "TN": [256, 1024]}, X, X, cache=False)
    with cf.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        procs = pypto.tune(softmax, {"TM": [8, 16], "TN": [256, 1024]}, X, X, executor=pool, cache=False)
    assert procs.rows == serial.rows


def test_a_dask_local_cluster_gives_the_same_results():
    distributed = pytest.importorskip("distributed")
    serial = pypto.tune(softmax, SPACE, X, X, cache=False)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        events = []
        with listening(events.append):
            dask = pypto.tune(softmax, SPACE, X, X, executor=client, cache=False)
        assert dask.executor == "Dask, 2 workers"
        # the workers ran the jobs: each rebuilt the kernel from its pickled function
        where = client.run(lambda: len(__import__("pypto.tuning", fromlist=["_REBUILT"])._REBUILT))
        assert sorted(where.values()) == [1, 1]
    assert dask.rows == serial.rows
    assert [e.done for e in events if not e.closed] == list(range(1, 9))


def test_a_dask_client_is_described_by_its_workers():
    """A client of a LocalCluster counts the workers the cluster runs (the scheduler may miss one
    for a moment on a loaded machine); a client of a scheduler's address, the scheduler's."""
    distributed = pytest.importorskip("distributed")
    from pypto.sweep import describe
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        assert client.cluster is cluster and describe(client) == "Dask, 2 workers"
        with distributed.Client(cluster.scheduler_address) as remote:
            remote.wait_for_workers(2)
            assert remote.cluster is None and describe(remote) == "Dask, 2 workers"


def test_a_job_that_raises_is_raised_here():
    def boom(job):
        raise ValueError(f"bad job {job}")
    with pytest.raises(ValueError, match="bad job 1"):
        sweep.run(boom, [1, 2])
    with cf.ThreadPoolExecutor(2) as pool, pytest.raises(ValueError, match="bad job"):
        sweep.run(boom, [1, 2], executor=pool)
    with pytest.raises(pypto.PyptoError, match="the executor cannot run jobs"):
        sweep.run(boom, [1], executor=object())


def test_evaluate_reports_a_configuration_that_does_not_compile():
    row = evaluate(Job(softmax, ((tuple(X.shape), "fp32"),) * 2, {"TM": 64, "TN": 1024}, {}, "a2a3"))
    assert set(row) == {"error"} and "do not fit UB" in row["error"]


def test_the_table_html_and_plot():
    res = pypto.tune(softmax, SPACE, X, X)
    text = res.text()
    assert text.splitlines()[0] == "softmax: 8 configurations on a2a3 (in process, 0 from the cache)"
    assert text.splitlines()[2].split()[:3] == ["4", "1024", str(res.best["cycles"])]
    html = res._repr_html_()
    assert f"best <b>TM=4, TN=1024</b>: {res.best['cycles']:,} cycles" in html
    assert "background-image:url(data:image/png;base64," in html
    fig = res.plot()
    ax = fig.axes[0]
    assert ax.get_xlabel() == "TM" and [t.get_text() for t in ax.get_legend().get_texts()] == ["TN=256", "TN=1024"]
    bars = pypto.tune(softmax, [{"TM": 8}, {"TN": 512}, {"double_buffer": False}], X, X).plot()
    assert len(bars.axes[0].patches) == 3                       # not one numeric axis: a bar each
