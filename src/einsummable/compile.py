"""The pipeline, one stage per line: graph -> plan -> TaskGraph -> engine."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from einsummable.engines import local, reference, sequential
from einsummable.engines import simulate as simulator
from einsummable.engines.blocks import Blocks
from einsummable.engines.feeds import check_feeds, check_inputs
from einsummable.errors import EinsummableError, FeedError, PlanError
from einsummable.frontend.core import Graph
from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import EinGraph
from einsummable.lower.lowering import lower
from einsummable.lower.taskgraph import TaskGraph
from einsummable.plan.planners import make_plan

Runner = Callable[..., dict[str, np.ndarray]]


class Program:
    """A compiled graph: ``run(feeds)`` returns ``{output name: ndarray}``
    (with ``engine="simulate"``, a ``Simulation`` report instead: nothing is computed).

    ``simulate()`` predicts the run on the planned cluster, whatever the engine.
    ``plan`` prints the partitions, strategies and bytes moved against the baselines;
    ``taskgraph`` is the lowered block program (None for the reference engine, which
    runs the graph whole).
    """

    def __init__(self, graph: EinGraph, engine: str, runner: Runner, plan: object,
                 taskgraph: TaskGraph | None = None) -> None:
        self.graph = graph
        self.engine = engine
        self.plan = plan
        self.taskgraph = taskgraph
        self._runner = runner
        self.variables = graph.variables()

    def run(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        arrays, variables = check_feeds(self.graph, feeds, variables=self.variables)
        return self._runner(arrays, variables)

    def simulate(self, cluster: Cluster | None = None) -> simulator.Simulation:
        """Predict this program's run on ``cluster`` (default: the one it was planned for)."""
        if self.taskgraph is None:
            raise EinsummableError(f"the {self.engine} engine runs the graph whole: no TaskGraph to simulate")
        return simulator.run(self.taskgraph, cluster or self.plan.cluster)

    def session(self, state: Mapping[str, np.ndarray]) -> Session:
        """Keep ``state`` (parameters, optimizer moments) resident between runs."""
        if self.engine == "simulate":
            raise EinsummableError("the simulate engine computes nothing, so it keeps no state; "
                                   "prog.run(feeds) returns the predicted run")
        return Session(self, state)

    def __repr__(self) -> str:
        return f"Program(engine={self.engine!r}, nodes={len(self.graph)}, outputs={list(self.graph.outputs)})"


class Session:
    """Runs a program repeatedly with some inputs kept on the workers.

    Every output named like a resident input replaces it after each run (the
    optimizers name updated parameters that way), so a training loop feeds only
    the batch and fetches only the loss:

        sess = prog.session({"w": W, **step.init_state()})
        for t in range(steps):
            loss = sess.run({"x": X, "lr": 1e-3}, fetch=["loss"])["loss"]
        W = sess.state()["w"]

    Runs are serialised: a run reads the resident state and replaces it, so two
    threads sharing a session each see the other's updates (none is lost).
    """

    def __init__(self, program: Program, state: Mapping[str, np.ndarray]) -> None:
        self.program = program
        arrays = check_inputs(program.graph, state)
        self._state: dict[str, object] = {k: np.array(v, copy=True) for k, v in arrays.items()}
        self._carry = frozenset(self._state) & set(program.graph.outputs)
        self._lock = threading.Lock()

    def run(self, feeds: Mapping[str, object], fetch: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        with self._lock:
            return self._run(feeds, fetch)

    def _run(self, feeds: Mapping[str, object], fetch: Sequence[str] | None) -> dict[str, np.ndarray]:
        clash = sorted(set(feeds) & set(self._state))
        if clash:
            raise FeedError(f"{clash} are resident in this session; feed only the other inputs")
        outputs = self.program.graph.outputs
        wanted = list(fetch) if fetch is not None else [n for n in outputs if n not in self._carry]
        unknown = sorted(set(wanted) - set(outputs))
        if unknown:
            raise FeedError(f"cannot fetch {unknown}; the outputs are {sorted(outputs)}")
        arrays, variables = check_feeds(self.program.graph, feeds, resident=frozenset(self._state),
                                        variables=self.program.variables)
        result = self.program._runner(arrays | self._state, variables, self._carry)
        for name in self._carry:
            self._state[name] = result[name]
        return {n: _as_array(result[n]) for n in wanted}

    def state(self) -> dict[str, np.ndarray]:
        """The resident tensors, gathered into arrays (for a checkpoint)."""
        with self._lock:  # between runs, never half-way through one
            return {name: _as_array(v) for name, v in self._state.items()}


def _as_array(value: object) -> np.ndarray:
    return value.array() if isinstance(value, Blocks) else np.array(value, copy=True)


def _whole(run: Callable) -> Runner:
    """Engines that take arrays: resident blocks are gathered, carried outputs returned whole."""

    def runner(arrays, variables, carry=frozenset()):
        return run({k: _as_array(v) if isinstance(v, Blocks) else v for k, v in arrays.items()}, variables)

    return runner


def _reference(graph: EinGraph, tg: TaskGraph | None, cluster: Cluster) -> Runner:
    return _whole(lambda arrays, variables: reference.run(graph, arrays, variables))


def _sequential(graph: EinGraph, tg: TaskGraph | None, cluster: Cluster) -> Runner:
    return _whole(lambda arrays, variables: sequential.run(tg, arrays, variables))


def _local(graph: EinGraph, tg: TaskGraph | None, cluster: Cluster) -> Runner:
    return local.LocalProgram(tg).run


def _ray(graph: EinGraph, tg: TaskGraph | None, cluster: Cluster, address: str | None = None) -> Runner:
    try:  # Ray is an optional extra: import it only when asked for
        from einsummable.engines import ray_engine
    except ModuleNotFoundError as err:
        if err.name != "ray":
            raise
        raise EinsummableError("engine='ray' needs Ray: pip install 'einsummable[ray]'") from err
    return ray_engine.RayProgram(tg, address).run


def _simulate(graph: EinGraph, tg: TaskGraph | None, cluster: Cluster) -> Runner:
    """Feeds are checked, then only their shapes matter: the run is predicted, not computed."""
    return lambda arrays, variables, carry=frozenset(): simulator.run(tg, cluster)


def simulate(taskgraph: TaskGraph, cluster: Cluster) -> simulator.Simulation:
    """Predict a TaskGraph's run on a modelled cluster (see engines/simulate.py)."""
    return simulator.run(taskgraph, cluster)


# Each engine builds a runner from the graph, its TaskGraph and the cluster it was planned
# for; those in WHOLE run the graph undecomposed and get no TaskGraph.
ENGINES: dict[str, Callable[[EinGraph, TaskGraph | None, Cluster], Runner]] = {
    "reference": _reference,
    "sequential": _sequential,
    "local": _local,
    "ray": _ray,
    "simulate": _simulate,
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
    address: str | None = None,
) -> Program:
    """Plan ``graph`` for ``workers`` (one machine) or a ``cluster``, lower it, and bind an engine.

    ``address`` is the Ray cluster to join for ``engine="ray"`` (``"auto"``, ``"ray://host:10001"``).
    """
    ir = graph.ir if isinstance(graph, Graph) else graph
    if not isinstance(ir, EinGraph):
        raise EinsummableError(f"compile takes a Graph, got {type(graph).__name__}")
    if not ir.outputs:
        raise EinsummableError("the graph has no outputs; name some with g.output(name, tensor)")
    ir.validate()
    engine = engine or DEFAULT_ENGINE
    if engine not in ENGINES:
        raise EinsummableError(f"unknown engine {engine!r}; expected one of {sorted(ENGINES)}")
    if address is not None and engine != "ray":
        raise EinsummableError(f"address= is for engine='ray', not engine={engine!r}")
    options = {"address": address} if address is not None else {}
    hardware = _cluster(workers, cluster)
    if engine in WHOLE:
        plan = "reference engine: every node runs whole, in order, with numpy"
        return Program(ir, engine, ENGINES[engine](ir, None, hardware), plan)
    plan = make_plan(ir, hardware, planner)
    taskgraph = lower(ir, plan)
    return Program(ir, engine, ENGINES[engine](ir, taskgraph, hardware, **options), plan, taskgraph)
