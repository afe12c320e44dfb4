import numpy as np
import pytest

import einsummable as es
from einsummable.hardware.cluster import Cluster


def _graph():
    g = es.Graph()
    x = g.input("x", (8, 4))
    g.output("y", x * 2.0)
    return g


@pytest.mark.parametrize("workers", [0, -3, 2.5, True])
def test_bad_worker_counts_are_refused(workers):
    with pytest.raises(es.PlanError, match="workers must be a positive integer"):
        es.compile(_graph(), workers=workers)


def test_bad_clusters_are_refused():
    with pytest.raises(es.PlanError, match="machines"):
        es.Cluster(machines=0, cores=4)
    with pytest.raises(es.PlanError, match="bandwidth_across"):
        es.Cluster(bandwidth_across=0)
    with pytest.raises(es.PlanError, match="disagrees"):
        es.compile(_graph(), workers=3, cluster=es.Cluster(machines=2, cores=2))
    with pytest.raises(es.PlanError, match="es.Cluster"):
        es.compile(_graph(), cluster=4)


def test_unknown_planner_is_refused():
    with pytest.raises(es.PlanError, match="unknown planner 'magic'"):
        es.compile(_graph(), workers=2, planner="magic")


def test_workers_is_one_machine():
    c = Cluster.local(6)
    assert (c.machines, c.cores, c.workers) == (1, 6, 6)
    two = Cluster(machines=2, cores=3)
    assert [two.machine_of(w) for w in range(6)] == [0, 0, 0, 1, 1, 1]
    assert two.seconds_to_move(100, 0, 4) > two.seconds_to_move(100, 0, 1) > 0
    assert two.seconds_to_move(100, 2, 2) == 0


@pytest.mark.parametrize("planner", ["eindecomp", "data_parallel", "model_parallel", "uniform", "none"])
def test_every_planner_compiles_and_runs(planner):
    g = es.Graph()
    x, w = g.input("x", (64, 32)), g.input("w", (32, 16))
    g.output("y", es.nn.relu(x @ w).sum(axis=1))
    prog = es.compile(g, cluster=es.Cluster(machines=2, cores=3), planner=planner)
    X = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    W = np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)
    want = es.compile(g, engine="reference").run({"x": X, "w": W})["y"]
    np.testing.assert_allclose(prog.run({"x": X, "w": W})["y"], want, rtol=1e-4, atol=1e-4)
    assert prog.plan.planner == planner and prog.taskgraph is not None
