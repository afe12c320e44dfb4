"""The per-worker compute model: how many cores a worker's GEMMs use (``Cluster.blas_threads``),
as the engines set BLAS and as the simulator and ``Cluster.measure`` describe it."""

import os

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import einsummable as es
from einsummable.engines import local
from einsummable.engines.kernels import cbuild
from einsummable.engines.simulator.simulate import run
from einsummable.hardware import calibrate
from einsummable.hardware.cluster import INLINE_TASK_OVERHEAD
from einsummable.ir.einsummable import Einsummable
from einsummable.lower.taskgraph import ApplyTask, InputTask, Output, TaskGraph

BOX = ((0, 100), (0, 100))


def _gemm_graph() -> TaskGraph:
    gemm = Einsummable.from_spec("ij,jk->ik", [(100, 100), (100, 100)])  # 2e6 flops
    tasks = (InputTask("a", BOX, "f32", 0), InputTask("b", BOX, "f32", 0), ApplyTask(gemm, (0, 1), 0))
    return TaskGraph(tasks, {"y": Output((100, 100), "f32", ((2, BOX),))}, 1, 1)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_a_gemm_spreads_its_flops_and_its_write_over_the_blas_threads(threads):
    cluster = es.Cluster(flops_per_core=1e9, copy_bandwidth=4e7, task_overhead=1e-4, view_overhead=1e-4,
                         blas_threads=threads)
    # 3 tasks of 0.1 ms overhead; the GEMM's 2 ms of flops and 1 ms writing 40,000 bytes, over the threads
    assert run(_gemm_graph(), cluster).makespan == pytest.approx(3e-4 + 3e-3 / threads)


def test_blas_threads_is_checked_and_kept_in_json(tmp_path):
    with pytest.raises(es.PlanError, match="blas_threads must be a positive integer, got 0"):
        es.Cluster(blas_threads=0)
    cluster = es.Cluster(machines=2, cores=1, blas_threads=8)
    cluster.to_json(tmp_path / "c.json")
    assert es.Cluster.from_json(tmp_path / "c.json") == cluster


def test_measure_gives_a_lone_worker_every_core_of_the_process(monkeypatch):
    monkeypatch.setattr(calibrate, "rates", lambda cores: {})  # the rates are not under test here
    available = len(os.sched_getaffinity(0))
    assert es.Cluster.measure(cores=1).blas_threads == available
    assert es.Cluster.measure(machines=4, cores=1).blas_threads == available  # one worker per machine
    assert es.Cluster.measure(cores=2).blas_threads == 1
    assert es.Cluster.measure(cores=1, blas_threads=1).blas_threads == 1


def _blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_the_engines_hold_blas_as_the_cluster_says():
    if not _blas_threads():
        pytest.skip("numpy has no BLAS that threadpoolctl can see")
    with local.blas_limit(1, 3):
        assert set(_blas_threads()) == {3}  # a lone worker: the cores it is given
    with local.blas_limit(2):
        assert set(_blas_threads()) == {1}


def test_a_lone_local_worker_runs_the_gemm_on_its_blas_threads(monkeypatch):
    """The local engine's single worker calls BLAS with blas_threads(1) threads in force."""
    seen = []
    real = np.matmul

    def spy(*args, **kwargs):
        seen.append(_blas_threads())
        return real(*args, **kwargs)

    if not _blas_threads():
        pytest.skip("numpy has no BLAS that threadpoolctl can see")
    g = es.Graph()
    a, b = g.input("a", (64, 64)), g.input("b", (64, 64))
    g.output("y", a @ b)
    prog = es.compile(g, workers=1)
    monkeypatch.setattr(np, "matmul", spy)
    x = np.ones((64, 64), np.float32)
    np.testing.assert_allclose(prog.run({"a": x, "b": x})["y"], real(x, x))
    assert seen and all(set(s) == {len(os.sched_getaffinity(0))} for s in seen)


def test_the_driver_fields_are_checked_and_kept_in_json(tmp_path):
    with pytest.raises(es.PlanError, match="driver_bandwidth must be positive, got 0"):
        es.Cluster(driver_bandwidth=0)
    with pytest.raises(es.PlanError, match="driver_latency must be >= 0, got -1"):
        es.Cluster(driver_latency=-1)
    ray = es.Cluster(machines=2, driver_bandwidth=2e9, driver_latency=1e-3)
    for cluster in (es.Cluster(machines=2), ray):  # the local default, infinite bandwidth, too
        cluster.to_json(tmp_path / "c.json")
        assert es.Cluster.from_json(tmp_path / "c.json") == cluster


def test_one_local_worker_is_its_machine_alone():
    """The local engine runs one worker inline, its BLAS on every core the process may use:
    its cluster says both, so its simulated GEMM spreads over those cores."""
    available = len(os.sched_getaffinity(0))
    one = es.Cluster.local(1)
    assert (one.workers, one.blas_threads) == (1, available)
    assert one.task_overhead == INLINE_TASK_OVERHEAD < es.Cluster.local(2).task_overhead
    assert one == es.Cluster(cores=available).alone()
    alone = es.Cluster(machines=2, cores=4, task_overhead=1e-6).alone()  # a measured overhead stays
    assert (alone.machines, alone.cores, alone.blas_threads, alone.task_overhead) == (1, 1, 4, 1e-6)
    g = es.Graph()
    g.output("y", g.input("a", (100, 100)) @ g.input("b", (100, 100)))
    # two inputs (views of the feeds), then the GEMM's 2e6 flops and 40,000 bytes written, on every core
    gemm = (2e6 / one.flops_per_core + 4e4 / one.copy_bandwidth) / available
    expected = 2 * one.view_overhead + one.task_overhead + gemm
    assert es.compile(g, workers=1).simulate().makespan == pytest.approx(expected)


def test_dispatch_measures_the_engines_cost_per_task():
    """A view costs the engine less than a kernel task, both microseconds, not milliseconds."""
    measured = calibrate.dispatch(1, chain=50)
    assert 0 < measured["view_overhead"] < measured["task_overhead"] < 1e-3
    if cbuild.enabled():  # a task in the native loop: one C call after another, no Python between
        assert 0 <= measured["native_overhead"] < measured["task_overhead"] / 4
    else:
        assert measured["native_overhead"] is None


def test_the_overhead_across_is_checked_and_kept_in_json(tmp_path):
    with pytest.raises(es.PlanError, match="overhead_across must be >= 0, got -0.001"):
        es.Cluster(overhead_across=-1e-3)
    with pytest.raises(es.PlanError, match="overhead_across must be >= 0, got nan"):
        es.Cluster(overhead_across=float("nan"))
    assert es.Cluster().overhead_across == 0.0  # a plain NIC: its cost is in the bytes
    ray = es.Cluster(machines=2, latency_across=3e-3, overhead_across=2.5e-3, bandwidth_across=5e8)
    ray.to_json(tmp_path / "c.json")
    assert es.Cluster.from_json(tmp_path / "c.json") == ray
    # a file written before the field existed still loads, with no overhead
    (tmp_path / "old.json").write_text('{"machines": 2, "latency_across": 0.001}')
    assert es.Cluster.from_json(tmp_path / "old.json") == es.Cluster(machines=2, latency_across=1e-3)


def test_the_node_cost_is_checked_kept_in_json_and_one_on_the_numpy_path(tmp_path, monkeypatch):
    with pytest.raises(es.PlanError, match="elementwise_node_cost must be >= 0, got -0.5"):
        es.Cluster(elementwise_node_cost=-0.5)
    assert es.Cluster().elementwise_node_cost == 1.0  # a numpy ufunc pass a node, as before
    compiled = es.Cluster(elementwise_node_cost=0.3)
    compiled.to_json(tmp_path / "c.json")
    assert es.Cluster.from_json(tmp_path / "c.json") == compiled
    monkeypatch.setenv("EINSUMMABLE_KERNELS", "numpy")
    assert calibrate.node_cost(1) == 1.0


def test_node_cost_measures_a_compiled_joins_nodes_as_less_than_a_pass_each():
    """One loop over the elements, whatever its nodes: each costs well under a ufunc pass."""
    from einsummable.engines.kernels import cbuild

    if not cbuild.enabled() or cbuild.compiler() is None:
        pytest.skip("compiled kernels off")
    assert 0.0 <= calibrate.node_cost(1) < 1.0
