import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import einsummable as es
from einsummable.hardware.cluster import MAX_CORES, MAX_MACHINES, MAX_WORKERS, Cluster
from einsummable.plan.cost import divisors
from einsummable.plan.planners import make_plan


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


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(1, 3000), st.integers(1, 200_000)))
def test_divisors_match_brute_force(n):
    assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


def test_divisors_of_a_huge_count_are_found_at_once():
    """Trial division to n would take hours here (issue 30 item 11); to sqrt(n), milliseconds."""
    start = time.perf_counter()
    got = divisors(2**20 * 3**10)
    assert len(got) == 21 * 11 and got[0] == 1 and got[-1] == 2**20 * 3**10
    assert divisors(10**12 + 39) == [1, 10**12 + 39]  # a prime
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(("shape", "match"), [
    ({"machines": 10**30}, "machines must be at most 65,536"),
    ({"machines": 65_537}, "machines must be at most 65,536"),
    ({"cores": 10**7}, "cores must be at most 65,536"),
    ({"cores": 10**6}, "cores must be at most 65,536"),
    ({"blas_threads": 10**6}, "blas_threads must be at most 65,536"),
    ({"machines": 65_536, "cores": 65_536}, "is 4,294,967,296 workers; .* at most 4,194,304"),
])
def test_huge_clusters_are_refused_at_construction(shape, match):
    """These used to hang the planner, or build a million threads' state in a local run."""
    with pytest.raises(es.PlanError, match=match):
        es.Cluster(**shape)


def test_a_huge_worker_count_is_refused_before_planning():
    start = time.perf_counter()
    with pytest.raises(es.PlanError, match="cores must be at most 65,536"):
        es.compile(_graph(), workers=10**6)
    with pytest.raises(es.PlanError, match="machines must be at most 65,536"):
        es.compile(_graph(), cluster=es.Cluster(machines=10**30), engine="simulate")
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("shape", [(MAX_MACHINES, MAX_WORKERS // MAX_MACHINES), (1, MAX_CORES)])
def test_the_largest_clusters_plan_promptly(shape):
    machines, cores = shape
    start = time.perf_counter()
    plan = make_plan(_graph().ir, es.Cluster(machines=machines, cores=cores), compare=False)
    assert plan.cluster.workers == machines * cores
    assert time.perf_counter() - start < 10.0


@pytest.mark.parametrize(("field", "value", "match"), [
    ("flops_per_core", "1e9", "flops_per_core must be a number, got '1e9'"),
    ("flops_per_core", None, "flops_per_core must be a number, got None"),
    ("flops_per_core", True, "flops_per_core must be a number"),
    ("flops_per_core", math.inf, "flops_per_core must be finite, got inf"),
    ("bandwidth_within", math.nan, "bandwidth_within must be positive, got nan"),
    ("memory_per_machine", -1, "memory_per_machine must be positive, got -1"),
    ("min_block_seconds", math.nan, "min_block_seconds must be >= 0, got nan"),
    ("min_block_seconds", math.inf, "min_block_seconds must be finite, got inf"),
    ("latency_across", -1e-6, "latency_across must be >= 0, got -1e-06"),
    ("task_overhead", "0", "task_overhead must be a number"),
    ("driver_bandwidth", math.nan, "driver_bandwidth must be positive, got nan"),
    ("driver_bandwidth", 0, "driver_bandwidth must be positive, got 0"),
    ("machines", 2.0, "machines must be a positive integer, got 2.0"),
    ("cores", "4", "cores must be a positive integer, got '4'"),
    ("cores", None, "cores must be a positive integer, got None"),
])
def test_every_cluster_field_is_checked(field, value, match):
    with pytest.raises(es.PlanError, match=match):
        es.Cluster(**{field: value})


def test_cluster_accepts_numpy_numbers_as_plain_ones():
    cluster = es.Cluster(machines=np.int64(2), flops_per_core=np.float32(1e10),
                         memory_per_machine=np.int64(2**30))
    assert type(cluster.machines) is int and cluster.machines == 2
    assert cluster.flops_per_core == 1e10 and cluster.memory_per_machine == 2**30
    assert es.Cluster(driver_bandwidth=math.inf).driver_bandwidth == math.inf  # the local engine's driver


@pytest.mark.parametrize(("text", "match"), [
    (None, "no such file"),
    (b'{"machines": 2,', r"not valid JSON: .*line 1 column"),
    (b"null", "must hold a JSON object of cluster fields, got null"),
    (b"[1, 2]", "must hold a JSON object of cluster fields, got a list"),
    (b'{"machines": 2}\xff', "not UTF-8"),
    (b'{"flops_per_core": "1e9"}', "flops_per_core must be a number, got '1e9'"),
    (b'{"min_block_seconds": NaN}', "min_block_seconds must be >= 0, got nan"),
    (b'{"machines": 2, "nics": 3}', r"unknown cluster fields \['nics'\]"),
])
def test_a_bad_cluster_file_is_a_config_error_naming_the_file(tmp_path, text, match):
    path = tmp_path / "cluster.json"
    if text is not None:
        path.write_bytes(text)
    with pytest.raises(es.ConfigError, match=match) as info:
        es.Cluster.from_json(path)
    assert str(info.value).startswith(f"cluster file {str(path)!r}: ")
    assert "\n" not in str(info.value)
