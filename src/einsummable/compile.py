"""The pipeline, one stage per line: graph -> plan -> TaskGraph -> engine."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import numpy as np

from einsummable.engines import local, reference, sequential
from einsummable.engines.feeds import check_feeds
from einsummable.errors import EinsummableError, PlanError
from einsummable.frontend.core import Graph
from einsummable.ir.graph import EinGraph
from einsummable.lower.lowering import lower
from einsummable.lower.taskgraph import TaskGraph
from einsummable.plan.cluster import Cluster
from einsummable.plan.planners import make_plan

Runner = Callable[[dict[str, np.ndarray], dict[str, float]], dict[str, np.ndarray]]


class Program:
    """A compiled graph: ``run(feeds)`` returns ``{output name: ndarray}``.

    ``plan`` prints the partitions, strategies and bytes moved against the
    baselines; ``taskgraph`` is the lowered block program (None for the
    reference engine, which runs the graph whole).
    """

    def __init__(self, graph: EinGraph, engine: str, runner: Runner, plan: object,
                 taskgraph: TaskGraph | None = None) -> None:
        self.graph = graph
        self.engine = engine
        self.plan = plan
        self.taskgraph = taskgraph
        self._runner = runner

    def run(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        arrays, variables = check_feeds(self.graph, feeds)
        return self._runner(arrays, variables)

    def __repr__(self) -> str:
        return f"Program(engine={self.engine!r}, nodes={len(self.graph)}, outputs={list(self.graph.outputs)})"


def _reference(graph: EinGraph, tg: TaskGraph | None) -> Runner:
    return lambda arrays, variables: reference.run(graph, arrays, variables)


def _sequential(graph: EinGraph, tg: TaskGraph | None) -> Runner:
    return lambda arrays, variables: sequential.run(tg, arrays, variables)


def _local(graph: EinGraph, tg: TaskGraph | None) -> Runner:
    return lambda arrays, variables: local.run(tg, arrays, variables)


# Each engine builds a runner from the graph and its TaskGraph; those in WHOLE run the
# graph undecomposed and get no TaskGraph.
ENGINES: dict[str, Callable[[EinGraph, TaskGraph | None], Runner]] = {
    "reference": _reference,
    "sequential": _sequential,
    "local": _local,
}
WHOLE = {"reference"}
DEFAULT_ENGINE = "local"


def _cluster(workers: int | None, cluster: Cluster | None) -> Cluster:
    if cluster is not None:
        if not isinstance(cluster, Cluster):
            raise PlanError(f"cluster must be an es.Cluster, got {type(cluster).__name__}")
        if workers is not None and workers != cluster.workers:
            raise PlanError(f"workers={workers} disagrees with the cluster's {cluster.workers} workers")
        return cluster
    return Cluster.local(workers if workers is not None else os.cpu_count() or 1)


def compile(
    graph: Graph | EinGraph,
    workers: int | None = None,
    *,
    engine: str | None = None,
    cluster: Cluster | None = None,
    planner: str = "eindecomp",
) -> Program:
    """Plan ``graph`` for ``workers`` (one machine) or a ``cluster``, lower it, and bind an engine."""
    ir = graph.ir if isinstance(graph, Graph) else graph
    if not isinstance(ir, EinGraph):
        raise EinsummableError(f"compile takes a Graph, got {type(graph).__name__}")
    if not ir.outputs:
        raise EinsummableError("the graph has no outputs; name some with g.output(name, tensor)")
    ir.validate()
    engine = engine or DEFAULT_ENGINE
    if engine not in ENGINES:
        raise EinsummableError(f"unknown engine {engine!r}; expected one of {sorted(ENGINES)}")
    hardware = _cluster(workers, cluster)
    if engine in WHOLE:
        plan = "reference engine: every node runs whole, in order, with numpy"
        return Program(ir, engine, ENGINES[engine](ir, None), plan)
    plan = make_plan(ir, hardware, planner)
    taskgraph = lower(ir, plan)
    return Program(ir, engine, ENGINES[engine](ir, taskgraph), plan, taskgraph)
