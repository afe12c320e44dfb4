"""The simulated engine: replay a TaskGraph on a modelled cluster and predict its time.

Inputs: a TaskGraph and a Cluster (rates, bandwidths, latencies, memory). Output: a
``Simulation``: predicted makespan, each worker's busy time, bytes per link, peak
memory per machine and the critical path. No block is computed, so this is how a
plan for 32 machines × 64 cores is judged from a 2-core box.

Model, one event per task, taken from a heap in time order:
- a core runs one task at a time, for ``task_overhead`` plus the kernel's time, priced by
  its kind (ir/kinds.py) as the planner prices it (hardware/cost.py: a GEMM's flops at
  ``flops_per_core``, any other join's passes at ``elementwise_flops_per_core``, a gather's
  comparisons, each with its fresh output block written at ``copy_bandwidth``; a fused task
  its two kernels, the block between them not written); fills and assembled partials cost their bytes at
  ``copy_bandwidth``; inputs, views and single-piece partials run no kernel and cost
  ``view_overhead`` instead of ``task_overhead`` (measured here: 1-4 us, a kernel
  task's dispatch 5-25 us); a join inside a run of the local engine's native loop past its
  first (lower/runs.py) costs ``native_overhead`` (~0.1 us) and holds no interpreter;
- the ready tasks of a core wait in a heap ordered by critical path (the longest
  chain of predicted time that waits on them), as in the local engine;
- a move inside a machine takes ``latency_within + bytes / bandwidth_within`` and
  holds no core and no link (cores share memory);
- a move between machines holds the sending machine's NIC out-port and the
  receiving machine's in-port (full duplex, one transfer at a time each way) for
  ``overhead_across + bytes / bandwidth_across`` (the overhead: Ray's put, call and pull
  of each block, zero by default), then lands ``latency_across`` later. When it becomes
  ready it books the earliest slot free on both ports, so a move waiting for a busy
  receiver does not hold its sender's port meanwhile;
- a block is live from its task's start until its last reader finishes (graph
  outputs to the end); the peak per machine is compared with ``memory_per_machine``;
- an input kept in host storage (plan/offload.py) is loaded by its task, its bytes at
  ``storage_bandwidth``, and held from then to its last reader; the output of its name is
  stored by the task that makes each block (its bytes at ``storage_bandwidth`` more) and
  holds no memory;
- a driver in another process (the Ray engine: ``driver_latency``, a finite
  ``driver_bandwidth``) starts a machine when its call and feeds have arrived, and the
  run ends when the last machine's outputs are back (``driver_seconds``); the local
  engine's defaults cost nothing, its feeds and outputs being the workers' memory.

Worked example: 2 machines × 1 core, a move of 1 MB from worker 0 to 1 at 1 GB/s
with 1 ms latency, nothing else costing: makespan = 1e6 / 1e9 + 1e-3 = 2 ms.

    sim = simulate.run(tg, Cluster(machines=2, cores=4))
    print(sim)            # makespan, utilisation, bytes across, critical path
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from einsummable.engines.kernels import fast as kernels
from einsummable.engines.simulator.replay import Simulation, replay
from einsummable.errors import SimulationError
from einsummable.hardware import cost
from einsummable.hardware.cluster import Cluster
from einsummable.ir.box import whole
from einsummable.ir.dtypes import itemsize
from einsummable.ir.einsummable import Einsummable
from einsummable.lower import runs
from einsummable.lower.compact import CompactGraph
from einsummable.lower.taskgraph import (
    ApplyTask,
    ConstantTask,
    FusedTask,
    InputTask,
    MoveTask,
    PartialTask,
    Task,
    TaskGraph,
    ViewTask,
)

# ------------------------------------------------------------ kernel time, per task kind


def _nbytes(task: Task) -> int:
    return math.prod(task.shape) * itemsize(task.dtype)


def _partial_seconds(task: PartialTask, c: Cluster) -> float:
    full = whole(task.shape)
    out = _nbytes(task)
    if all(p.dst_box == full for p in task.pieces):
        # one whole piece is a view; k whole pieces are a copy and k-1 in-place sums
        return 0.0 if len(task.pieces) == 1 else len(task.pieces) * out / c.copy_bandwidth
    size = itemsize(task.dtype)
    written = sum(math.prod(hi - lo for lo, hi in p.src) for p in task.pieces) * size
    return (out + written * (3 if task.agg else 1)) / c.copy_bandwidth


KERNEL_SECONDS: dict[type, Callable[[Task, Cluster], float]] = {
    InputTask: lambda task, c: 0.0,  # a view of the feed
    ConstantTask: lambda task, c: _nbytes(task) / c.copy_bandwidth,
    ApplyTask: lambda task, c: cost.seconds(task.op, c),
    FusedTask: lambda task, c: cost.fused_seconds(task.first, task.then, c),
    PartialTask: _partial_seconds,
    ViewTask: lambda task, c: 0.0,
}


# ------------------------------------------------------------ the replay


def run(tg: TaskGraph, cluster: Cluster, durations: Sequence[float] | None = None,
        widths: Sequence[int] | None = None, slots: int = 1) -> Simulation:
    """Replay ``tg`` on ``cluster`` (replay.py's loop over its arrays).

    ``durations`` replaces the per-task time rules (engines/simulator/cluster.py
    costs a machine's whole block on its cores that way). ``slots``: cores per
    worker, of which a task holds ``widths[t]`` (default 1)."""
    if cluster.workers != tg.workers or cluster.cores != tg.cores:
        raise SimulationError(f"the TaskGraph is for {tg.workers} workers of {tg.cores} cores per machine, "
                              f"the cluster is {cluster}")
    native = native_tasks(tg) if cluster.native_overhead is not None else [False] * len(tg.tasks)
    dur = list(durations) if durations is not None else _durations(tg, cluster, native)
    feed, fetch = driver_seconds(tg, cluster)
    sim = replay(CompactGraph.from_taskgraph(tg), cluster, dur, widths, slots, feed, native)  # checks dur
    if not any(feed) and not any(fetch):
        return sim
    return _with_fetches(tg, sim, feed, fetch)


def driver_seconds(tg: TaskGraph, c: Cluster) -> tuple[list[float], list[float]]:
    """Per machine: when its part can start (the driver's call and its feeds have arrived) and
    how long its fetched outputs take to reach the driver after its last task.

    As the Ray engine runs: the driver serialises each machine's distinct input pieces into
    its object store in machine order (``bytes / driver_bandwidth`` each, one after another),
    then submits the machine's call (``driver_latency``, the call and its return). A machine
    returns its fetched output blocks at its end: stored and read back at ``driver_bandwidth``.
    Off the driver's node (machine 0's) a feed or a fetch is a move across, put and pull:
    ``latency_across + overhead_across + bytes / bandwidth_across`` in all, the put at
    ``driver_bandwidth``.
    None of it with the local engine's defaults (no latency, infinite bandwidth): its feeds
    and outputs are the workers' own memory."""
    machines = tg.workers // tg.cores
    if math.isinf(c.driver_bandwidth) and not c.driver_latency:  # the driver shares the workers' memory
        return [0.0] * machines, [0.0] * machines
    fed: list[set] = [set() for _ in range(machines)]
    feed_bytes, fetch_bytes = [0] * machines, [0] * machines
    for task in tg.tasks:
        if isinstance(task, InputTask):
            m = tg.machine_of(task.loc)
            if (task.name, task.box) not in fed[m]:
                fed[m].add((task.name, task.box))
                feed_bytes[m] += _nbytes(task)
    fetched: set[int] = set()
    for out in tg.outputs.values():
        for t, _ in out.blocks:
            if t not in fetched:
                fetched.add(t)
                fetch_bytes[tg.machine_of(tg.tasks[t].loc)] += _nbytes(tg.tasks[t])

    # a move across (bandwidth_across, as the engine makes one) includes its sender's put into
    # the object store: off the driver's node, a feed or fetch is such a move, the put its first part
    pull = max(1 / c.bandwidth_across - 1 / c.driver_bandwidth, 0.0)

    def across(m: int, nbytes: int) -> float:
        return 0.0 if m == 0 else c.latency_across + c.overhead_across + nbytes * pull

    put, release, fetch = 0.0, [], []
    for m in range(machines):
        put += feed_bytes[m] / c.driver_bandwidth
        release.append(put + c.driver_latency + across(m, feed_bytes[m]))
        back = fetch_bytes[m]
        fetch.append(back / c.driver_bandwidth + across(m, back) if back else 0.0)
    return release, fetch


def _with_fetches(tg: TaskGraph, sim: Simulation, release: list[float], fetch: list[float]) -> Simulation:
    """The run ends when the last machine's fetched outputs reach the driver; the critical
    path's time at the driver (its machine's feeds, then its fetches) is "driver"."""
    ends = [0.0] * len(release)
    for t, task in enumerate(tg.tasks):
        m = tg.machine_of(task.loc)
        ends[m] = max(ends[m], float(sim.timeline[t, 1]))
    last = max(range(len(ends)), key=lambda m: ends[m] + fetch[m])
    makespan = ends[last] + fetch[last]
    kinds = dict(sim.critical_time)
    first = sim.critical_path[0] if sim.critical_path else -1
    start = release[tg.machine_of(tg.tasks[first].loc)] if first >= 0 and not tg.tasks[first].inputs else 0.0
    kinds["compute"] -= start
    kinds["driver"] = start + makespan - sim.makespan
    return dataclasses.replace(sim, makespan=makespan, critical_time=kinds)


def native_tasks(tg: TaskGraph) -> list[bool]:
    """Whether each task runs inside a run of the native loop past its first: lower/runs.py's
    runs of the joins the kernels run as C alone (``fast.prepare(op).compiled``, the kernel the
    local engine will choose; none where compiled kernels are off), as the local engine cuts
    them (engines/kernels/segment.py); a block stored as made stays out."""
    stored = tg.stored_as_made()

    def native(t: int) -> bool:
        task = tg.tasks[t]
        return t not in stored and runs.candidate(task) and kernels.prepare(task.op).compiled is not None

    out = [False] * len(tg.tasks)
    for members in runs.runs(tg.tasks, native):
        for t in members[1:]:
            out[t] = True
    return out


def _durations(tg: TaskGraph, cluster: Cluster, native: Sequence[bool]) -> list[float]:
    """Seconds each task holds its core; for a move between machines, its NICs (latency comes after).
    A task inside a native run costs ``native_overhead``, not ``task_overhead``."""
    cache: dict[Einsummable, float] = {}
    out = [0.0] * len(tg.tasks)
    for t, task in enumerate(tg.tasks):
        if isinstance(task, MoveTask):
            if tg.machine_of(task.src) == tg.machine_of(task.loc):
                out[t] = cluster.latency_within + _nbytes(task) / cluster.bandwidth_within
            else:
                out[t] = cluster.overhead_across + _nbytes(task) / cluster.bandwidth_across
            continue
        if isinstance(task, ApplyTask):
            if task.op not in cache:
                cache[task.op] = cost.seconds(task.op, cluster)
            out[t] = cache[task.op] + (cluster.native_overhead if native[t] else cluster.task_overhead)
            continue
        rule = KERNEL_SECONDS.get(type(task))
        if rule is None:
            raise SimulationError(f"task %{t}: no time rule for {type(task).__name__}")
        if isinstance(task, InputTask) and task.name in tg.stored:  # a load from host storage
            out[t] = _nbytes(task) / cluster.storage_bandwidth + cluster.task_overhead
            continue
        overhead = cluster.view_overhead if runs_no_kernel(task) else cluster.task_overhead
        out[t] = rule(task, cluster) + overhead
    for name in tg.stored & set(tg.outputs):  # stored as made
        for t, _ in tg.outputs[name].blocks:
            out[t] += _nbytes(tg.tasks[t]) / cluster.storage_bandwidth
    return out


def runs_no_kernel(task: Task) -> bool:
    """An input, a view, or a partial of one whole piece (a view too): the engine only dispatches
    it, a few microseconds (``view_overhead``), not a kernel task's ``task_overhead``."""
    if isinstance(task, InputTask | ViewTask):
        return True
    return (isinstance(task, PartialTask) and len(task.pieces) == 1
            and task.pieces[0].dst_box == whole(task.shape))
