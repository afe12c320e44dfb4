"""The pipeline, one stage per line: graph -> plan -> TaskGraph -> engine."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from einsummable.engines import donation, local, reference, sequential, storage
from einsummable.engines import trace as timeline
from einsummable.engines.blocks import Blocks
from einsummable.engines.feeds import FeedCheck, check_inputs
from einsummable.engines.interop import convert
from einsummable.engines.simulator import simulate as simulator
from einsummable.errors import EinsummableError, EngineError, FeedError, PlanError
from einsummable.frontend.tensor import Graph
from einsummable.hardware.cluster import Cluster
from einsummable.ir.dtypes import canonical
from einsummable.ir.fuse import fuse
from einsummable.ir.graph import EinGraph, InputNode
from einsummable.lower.fusion import fuse as fuse_tasks
from einsummable.lower.lowering import lower
from einsummable.lower.lowering import stored as stored_inputs
from einsummable.lower.refine import machine_shares
from einsummable.lower.taskgraph import TaskGraph
from einsummable.plan.plan import Plan
from einsummable.plan.planners import make_plan


class Executor(Protocol):
    """What an engine binds a program to: runs checked arrays (and resident blocks)."""

    def run(self, feeds: Mapping[str, object], variables: dict[str, float] | None = None,
            carry: frozenset[str] = frozenset()) -> dict[str, np.ndarray | Blocks]: ...


class Program:
    """A compiled graph: ``run(feeds)`` returns ``{output name: ndarray}``.

    ``simulate()`` predicts the run on the planned cluster, whatever the engine (the
    simulate engine computes nothing, so that is all it does). ``plan`` prints the
    partitions, strategies and bytes moved against the baselines; it and ``taskgraph``,
    the lowered block program with its fusions (lower/fusion.py: the tasks every engine
    runs, simulates and traces), are None for the reference engine, which runs the graph
    whole; ``unfused()`` lowers it again without them. ``executor`` is the engine's own
    program object.
    """

    def __init__(self, graph: EinGraph, engine: str, executor: Executor | None, plan: Plan | None = None,
                 taskgraph: TaskGraph | None = None) -> None:
        self.graph = graph
        self.engine = engine
        self.plan = plan
        self._taskgraph = taskgraph
        self.executor = executor
        self.variables = graph.variables()
        self._check = FeedCheck(graph, variables=self.variables)

    @property
    def taskgraph(self) -> TaskGraph | None:
        """The core-level TaskGraph; built here on first use for a Ray program over several
        machines, which lowers only the machine-level graph (each machine lowers its own share)."""
        if self._taskgraph is None and self.plan is not None:
            self._taskgraph = fuse_tasks(lower(self.plan)).graph
        return self._taskgraph

    def unfused(self) -> TaskGraph | None:
        """The TaskGraph as lowering makes it, before the fusion passes (for the oracles)."""
        return None if self.plan is None else lower(self.plan)

    def run(self, feeds: Mapping[str, object], like: str | None = None,
            trace: str | Path | None = None) -> dict[str, object]:
        """Run on ``feeds`` (name -> numpy array, or any array with ``__dlpack__`` or
        ``__array__``, such as a torch tensor; run-time variables are numbers) and return the
        outputs by name: numpy arrays, or torch tensors sharing their memory with ``like="torch"``.

            out = prog.run({"x": torch.randn(4, 3), "lr": 1e-3}, like="torch")

        ``trace="t.json"`` (local and Ray engines): also write each task's measured start and end per
        worker, as a Chrome trace (Perfetto, chrome://tracing), or a Gantt chart for ``*.png``.
        """
        arrays, variables = self._check(feeds)
        if trace is None:
            return convert(self.execute(arrays, variables), like)
        if self.engine not in TRACED:
            raise EinsummableError(f"trace= needs the local or Ray engine; this program runs on "
                                   f"{self.engine!r} "
                                   "(prog.simulate(trace=...) gives the predicted timeline)")
        return convert(self.executor.run(arrays, variables, trace=trace), like)

    def execute(self, arrays: Mapping[str, object], variables: dict[str, float],
                carry: frozenset[str] = frozenset()) -> dict[str, np.ndarray | Blocks]:
        """Run on checked feeds (resident blocks allowed); outputs in ``carry`` may stay as blocks."""
        if self.executor is None:
            raise EinsummableError(f"the {self.engine} engine computes nothing: prog.simulate() predicts "
                                   "the run")
        return self.executor.run(arrays, variables, carry)

    def simulate(self, cluster: Cluster | None = None, feeds: Mapping[str, object] | None = None,
                 trace: str | Path | None = None) -> simulator.Simulation:
        """Predict this program's run on ``cluster`` (default: the one it was planned for).

        ``feeds``, when given, are checked as ``run`` checks them; only their shapes matter.
        ``trace``: write the predicted timeline there, as ``run(trace=...)`` writes the measured one.
        """
        if self.taskgraph is None or self.plan is None:
            raise EinsummableError(f"the {self.engine} engine runs the graph whole: no TaskGraph to simulate")
        if feeds is not None:
            self._check(feeds)
        sim = simulator.run(self.taskgraph, cluster or self.plan.cluster)
        if trace is not None:
            events, lanes = timeline.task_events(self.taskgraph, sim.timeline)
            timeline.write(events, trace, lanes, f"predicted: {sim.tasks:,} tasks on {sim.cluster}")
        return sim

    def session(self, state: Mapping[str, np.ndarray] | Session, keep: Sequence[str] = ()) -> Session:
        """Keep ``state`` (parameters, optimizer moments) resident between runs.

        ``state`` may be another session: the two then share one resident state, bound by
        tensor name, and nothing goes through the driver (a generation program reading a
        training session's weights). ``keep`` names outputs to keep resident although no
        input reads them yet (a prefill's KV cache, read by the decode program's session).
        """
        if self.executor is None:
            raise EinsummableError(f"the {self.engine} engine computes nothing, so it keeps no state; "
                                   "prog.simulate() predicts the run")
        return Session(self, state, keep)

    def __repr__(self) -> str:
        return f"Program(engine={self.engine!r}, nodes={len(self.graph)}, outputs={list(self.graph.outputs)})"


class Resident:
    """Tensors kept on the workers by name, shared by every session bound to them.

    A value is an array or the blocks a run left on the workers (``Blocks``; on Ray,
    ``RayBlocks``). The lock serialises the runs of all the sessions that share it.
    """

    def __init__(self, tensors: dict[str, object]) -> None:
        self.tensors = tensors
        self.lock = threading.Lock()


class Session:
    """Runs a program repeatedly with some inputs kept on the workers.

    Every output named like a resident tensor (or named in ``keep``) replaces it
    after each run (the optimizers name updated parameters that way), so a training
    loop feeds only the batch and fetches only the loss:

        sess = prog.session({"w": W, **step.init_state()})
        for t in range(steps):
            loss = sess.run({"x": X, "lr": 1e-3}, fetch=["loss"])["loss"]
        W = sess.state()["w"]

    ``prog2.session(sess)`` binds a second program to the same resident state: its
    inputs named like resident tensors read them where they lie. Runs are serialised
    across all the sessions of one state: a run reads the resident state and replaces
    it, so two threads sharing it each see the other's updates (none is lost). The blocks of
    a resident input that a run replaces are given up to it on the local engine: each is
    freed after its last reader, or updated in place (engines/donation.py), so a training
    step never holds old and new weights whole at once. A run that fails part-way has then
    lost them: the session says so (``EngineError``) rather than run on part-updated state.
    """

    def __init__(self, program: Program, state: Mapping[str, np.ndarray] | Session,
                 keep: Sequence[str] = ()) -> None:
        self.program = program
        graph = program.graph
        self._inputs = {n.name: n for n in graph.nodes if isinstance(n, InputNode)}
        keep = _names(keep)
        unknown = sorted(set(keep) - set(graph.outputs))
        if unknown:
            raise FeedError(f"cannot keep {unknown}: not outputs; the outputs are {sorted(graph.outputs)}")
        self._keep = frozenset(keep)
        self._check: FeedCheck | None = None
        if isinstance(state, Session):
            self._resident = state._resident
        else:
            self._resident = Resident({})
            self.put(state)

    @property
    def resident(self) -> Resident:
        """The resident state this session shares with the sessions bound to it."""
        return self._resident

    @property
    def _state(self) -> dict[str, object]:
        """The resident tensors by name, as they lie (blocks on the workers)."""
        return self._resident.tensors

    def run(self, feeds: Mapping[str, object], fetch: Sequence[str] | None = None,
            like: str | None = None) -> dict[str, object]:
        """As ``Program.run``, with the resident inputs left out; ``fetch`` names the outputs wanted."""
        with self._resident.lock:
            return convert(self._run(feeds, fetch), like)

    def _run(self, feeds: Mapping[str, object], fetch: Sequence[str] | None) -> dict[str, np.ndarray]:
        state = self._resident.tensors
        resident = {name: state[name] for name in self._inputs if name in state}
        clash = sorted(set(feeds) & set(resident))
        if clash:
            raise FeedError(f"{clash} are resident in this session; feed only the other inputs")
        _check_not_lost(resident)
        _check_resident(resident, self._inputs)
        outputs = self.program.graph.outputs
        carry = (frozenset(state) | self._keep) & set(outputs)
        wanted = _names(fetch) if fetch is not None else [n for n in outputs if n not in carry]
        unknown = sorted(set(wanted) - set(outputs))
        if unknown:
            raise FeedError(f"cannot fetch {unknown}; the outputs are {sorted(outputs)}")
        names = frozenset(resident)
        if self._check is None or self._check.resident != names:  # signature: one per resident set
            self._check = FeedCheck(self.program.graph, names, self.program.variables)
        arrays, variables = self._check(feeds)
        executor = self.program.executor  # other engines keep their blocks as they are
        given = (donation.given_up(state, resident, carry, executor.reads, executor.unchanged)
                 if isinstance(executor, local.LocalProgram) else {})
        for name in given:  # the run owns them now: nothing else may hold them
            state[name] = _Lost()
            del resident[name]
        try:
            result = self.program.execute(arrays | resident | given, variables, carry)
        except BaseException:
            for name, blocks in given.items():
                if blocks.unread:  # failed before it read them: they are as they were
                    state[name] = Blocks(blocks.shape, blocks.dtype, blocks.blocks)
            raise
        for name in carry:
            state[name] = result[name]
        return {n: _as_array(result[n]) for n in wanted}

    def state(self) -> dict[str, np.ndarray]:
        """The resident tensors, gathered into arrays (for a checkpoint)."""
        with self._resident.lock:  # between runs, never half-way through one
            _check_not_lost(self._resident.tensors)
            return {name: _as_array(v) for name, v in self._resident.tensors.items()}

    def put(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Make more of this program's inputs resident (frozen weights that only it reads)."""
        checked = check_inputs(self.program.graph, arrays)
        stored = stored_inputs(self.program.plan.graph) if self.program.plan is not None else frozenset()
        with self._resident.lock:  # inputs kept in host storage go there (plan/offload.py)
            self._resident.tensors.update({k: storage.store(v) if k in stored else np.array(v, copy=True)
                                           for k, v in checked.items()})

    def drop(self, names: Sequence[str]) -> None:
        """Forget resident tensors (a finished generation's KV cache), freeing them on the workers."""
        with self._resident.lock:
            for name in _names(names):
                self._resident.tensors.pop(name, None)


def _names(names: str | Sequence[str]) -> list[str]:
    """A list of tensor names; one name alone is that name, not its letters."""
    return [names] if isinstance(names, str) else list(names)


def _check_resident(resident: Mapping[str, object], inputs: Mapping[str, InputNode]) -> None:
    """A resident tensor another program left must still fit this program's input. (A function
    of its own: a loop variable left in ``Session._run`` would hold a given-up tensor all run.)"""
    for name, value in resident.items():
        node = inputs[name]
        dtype = value.dtype if isinstance(value, Blocks) else canonical(np.asarray(value).dtype)
        if tuple(value.shape) != tuple(node.shape) or dtype != node.dtype:
            raise FeedError(f"resident tensor {name!r} is {dtype}{list(value.shape)}, but this program's "
                            f"input {name!r} is {node.dtype}{list(node.shape)}")


class _Lost:
    """A resident tensor given up to a run that did not finish (it may be part-updated)."""


def _check_not_lost(state: Mapping[str, object]) -> None:
    lost = sorted(name for name, value in state.items() if isinstance(value, _Lost))
    if lost:
        raise EngineError(f"resident tensors {lost} were given up to a run that failed part-way and "
                          "may be part-updated; put them again (from a checkpoint) to go on")


def _as_array(value: object) -> np.ndarray:
    """A fresh array: never a resident block itself, which a later run may write into."""
    if isinstance(value, Blocks):
        array = value.array()
        return array.copy() if any(np.may_share_memory(array, b) for b in value.blocks.values()) else array
    return np.array(value, copy=True)


class _Whole:
    """Engines that take arrays: resident blocks are gathered, carried outputs returned whole."""

    def __init__(self, run: Callable[[dict, dict], dict[str, np.ndarray]]) -> None:
        self._run = run

    def run(self, feeds, variables=None, carry=frozenset()) -> dict[str, np.ndarray]:
        return self._run({k: v.array() if isinstance(v, Blocks) else v for k, v in feeds.items()},
                         variables or {})


def _reference(graph: EinGraph, tg: TaskGraph | None) -> Executor:
    return _Whole(lambda arrays, variables: reference.run(graph, arrays, variables))


def _sequential(graph: EinGraph, tg: TaskGraph | None) -> Executor:
    return _Whole(lambda arrays, variables: sequential.run(tg, arrays, variables))


def _local(graph: EinGraph, tg: TaskGraph | None) -> Executor:
    return local.LocalProgram(tg)


def _ray(graph: EinGraph, tg: TaskGraph | None, address: str | None = None,
         plan: Plan | None = None) -> Executor:
    """On several machines (``plan``, ``tg`` None) each actor gets its share of the machine-level graph."""
    try:  # Ray is an optional extra: import it only when asked for
        from einsummable.engines.ray import RayProgram
        from einsummable.engines.ray.layout import two_level
    except ModuleNotFoundError as err:
        if err.name != "ray":
            raise
        raise EinsummableError("engine='ray' needs Ray: pip install 'einsummable[ray]'") from err
    return RayProgram(two_level(*machine_shares(plan)) if tg is None else tg, address)


def _gpu(graph: EinGraph, tg: TaskGraph | None, machines: int = 1) -> Executor:
    """Blocks as torch tensors on CUDA devices, ``cuda:m`` for machine m (torch's CPU device
    without CUDA)."""
    try:  # torch is an optional extra: import it only when asked for
        from einsummable.engines.gpu import GpuProgram
    except ModuleNotFoundError as err:
        if err.name != "torch":
            raise
        raise EinsummableError("engine='gpu' needs torch: pip install torch (and triton on Linux)") from err
    return GpuProgram(tg, machines=machines)


def _simulate(graph: EinGraph, tg: TaskGraph | None) -> None:
    """Nothing to run: the program is only predicted (``prog.simulate()``)."""
    return None


def simulate(taskgraph: TaskGraph, cluster: Cluster) -> simulator.Simulation:
    """Predict a TaskGraph's run on a modelled cluster (see engines/simulator/simulate.py)."""
    return simulator.run(taskgraph, cluster)


# Each engine builds its executor from the graph and its TaskGraph; those in WHOLE run the
# graph undecomposed and get no TaskGraph (and no plan).
ENGINES: dict[str, Callable[..., Executor | None]] = {
    "reference": _reference,
    "sequential": _sequential,
    "local": _local,
    "ray": _ray,
    "gpu": _gpu,
    "simulate": _simulate,
}
WHOLE = {"reference"}
TRACED = {"local", "ray"}  # engines whose run takes trace=: they measure each task where it runs
DEFAULT_ENGINE = "local"


def _cluster(workers: int | None, cluster: Cluster | None, engine: str) -> Cluster:
    """The hardware to plan for: ``cluster``, else ``workers`` cores of this machine, else all
    of its cores (all its GPUs for ``engine="gpu"``: ``Cluster.gpus()``)."""
    if cluster is None and workers is None and engine == "gpu":
        return Cluster.gpus()
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
    options: dict[str, object] = {"address": address} if address is not None else {}
    hardware = _cluster(workers, cluster, engine)
    if engine == "gpu":
        options["machines"] = hardware.machines  # machine m runs on cuda:m
    if engine in WHOLE:
        return Program(ir, engine, ENGINES[engine](ir, None))
    plan = make_plan(fuse(ir), hardware, planner)  # the oracle, above, runs the graph unfused
    if engine == "ray" and stored_inputs(plan.graph):
        raise EngineError(f"the plan keeps {sorted(stored_inputs(plan.graph))} in host storage to fit "
                          f"{hardware.memory_per_machine / 2**30:.3g} GiB a machine; offloaded state runs on "
                          "the local engine (engine='local'), not on Ray's actors yet")
    if engine == "ray" and plan.levels is not None and hardware.machines > 1:
        return Program(ir, engine, _ray(ir, None, address, plan), plan)  # no core-level graph here
    taskgraph = fuse_tasks(lower(plan)).graph
    return Program(ir, engine, ENGINES[engine](ir, taskgraph, **options), plan, taskgraph)
