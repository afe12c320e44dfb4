"""The invariant of docs/design.md §6: any graph, any partitions, any worker count, executed
through the TaskGraph, equals the reference engine."""

import random

from hypothesis import given
from hypothesis import strategies as st

from einsummable.hardware.cluster import Cluster
from einsummable.lower.stats import stats
from einsummable.plan.plan import build
from graphgen import check_lowered, random_graph, random_partitions


def _check(seed: int, workers: int, machines: int = 1) -> None:
    rng = random.Random(seed)
    g, feeds = random_graph(rng, n_ops=rng.randint(1, 10))
    plan = build(g.ir, Cluster(machines=machines, cores=workers), random_partitions(g.ir, rng))
    tg = check_lowered(plan, feeds)
    # the plan's figures are the bytes its TaskGraph moves (shared moves can only save)
    s = stats(tg)
    assert s.bytes_moved <= plan.summary.bytes_moved


@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 3, 4, 5, 7, 8, 11, 12]))
def test_random_graphs_and_partitions_match_reference(seed, workers):
    _check(seed, workers)


@given(st.integers(0, 2**32 - 1), st.integers(2, 3), st.integers(1, 4))
def test_random_graphs_on_several_machines(seed, machines, cores):
    _check(seed, cores, machines)
