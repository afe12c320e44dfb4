"""The simulated engine: replay a TaskGraph on a modelled cluster and predict its time.

Inputs: a TaskGraph and a Cluster (rates, bandwidths, latencies, memory). Output: a
``Simulation``: predicted makespan, each worker's busy time, bytes per link, peak
memory per machine and the critical path. No block is computed, so this is how a
plan for 32 machines × 64 cores is judged from a 2-core box.

Model, one event per task, taken from a heap in time order:
- a core runs one task at a time, for ``task_overhead`` plus the kernel's time:
  a GEMM's flops at ``flops_per_core``, any other join's at
  ``elementwise_flops_per_core`` (an embedding's gather costs its comparisons and
  outputs, not its join space), plus its fresh output block written at
  ``copy_bandwidth``; fills and assembled partials cost their bytes at
  ``copy_bandwidth``; inputs, views and single-piece partials only the overhead;
- the ready tasks of a core wait in a heap ordered by critical path (the longest
  chain of predicted time that waits on them), as in the local engine;
- a move inside a machine takes ``latency_within + bytes / bandwidth_within`` and
  holds no core and no link (cores share memory);
- a move between machines holds the sending machine's NIC out-port and the
  receiving machine's in-port (full duplex, one transfer at a time each way) for
  ``bytes / bandwidth_across``, then lands ``latency_across`` later. When it becomes
  ready it books the earliest slot free on both ports, so a move waiting for a busy
  receiver does not hold its sender's port meanwhile;
- a block is live from its task's start until its last reader finishes (graph
  outputs to the end); the peak per machine is compared with ``memory_per_machine``.

Worked example: 2 machines × 1 core, a move of 1 MB from worker 0 to 1 at 1 GB/s
with 1 ms latency, nothing else costing: makespan = 1e6 / 1e9 + 1e-3 = 2 ms.

    sim = simulate.run(tg, Cluster(machines=2, cores=4))
    print(sim)            # makespan, utilisation, bytes across, critical path
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from einsummable.engines.kernels import equality_gather
from einsummable.errors import SimulationError
from einsummable.hardware.cluster import Cluster
from einsummable.ir.box import whole
from einsummable.ir.dtypes import itemsize
from einsummable.ir.einsummable import IDENTITY, Einsummable
from einsummable.lower.taskgraph import (
    ApplyTask,
    ConstantTask,
    InputTask,
    MoveTask,
    PartialTask,
    Task,
    TaskGraph,
    ViewTask,
)

# ------------------------------------------------------------ kernel time, per task kind


def kernel_kind(op: Einsummable) -> str:
    """Which kernel the engines run for ``op`` (the same choice as ``kernels.prepare``)."""
    if op.is_contraction():
        return "gemm"
    if equality_gather(op) is not None:
        return "gather"
    if op.join == IDENTITY and len(op.inputs) == 1 and op.agg is None:
        return "view"
    return "elementwise"


def _nbytes(task: Task) -> int:
    return math.prod(task.shape) * itemsize(task.dtype)


def apply_seconds(op: Einsummable, c: Cluster) -> float:
    """One core's time for the kernel of ``op``, without the per-task overhead."""
    kind = kernel_kind(op)
    if kind == "view":
        return 0.0
    write = math.prod(op.out_shape) * itemsize(op.dtype) / c.copy_bandwidth
    if kind == "gemm":
        return op.flops() / c.flops_per_core + write
    if kind == "gather":
        a, b, _ = equality_gather(op)
        matched = set(op.inputs[a]) | set(op.inputs[b])
        compares = math.prod(op.join_shape[i] for i in matched)
        return (compares + math.prod(op.out_shape)) / c.elementwise_flops_per_core + write
    return op.flops() / c.elementwise_flops_per_core + write


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
    ApplyTask: lambda task, c: apply_seconds(task.op, c),
    PartialTask: _partial_seconds,
    ViewTask: lambda task, c: 0.0,
}


# ------------------------------------------------------------ the report


@dataclass(frozen=True)
class Simulation:
    """A predicted run: makespan in seconds, and where the time and bytes went."""

    cluster: Cluster
    tasks: int
    makespan: float
    busy: tuple[float, ...]  # seconds each worker's core computed
    links: dict[tuple[int, int], int]  # (from worker, to worker) -> bytes moved
    bytes_within: int
    bytes_across: int
    peak_memory: tuple[int, ...]  # bytes live at once, per machine
    critical_path: tuple[int, ...]  # task ids, first to last
    critical_time: dict[str, float]  # seconds of the critical path per kind of step; sums to makespan
    critical_waits: int  # steps on the path that waited for a busy core or NIC, not for data
    # [tasks, 2]: each task's start and end in seconds (a move across: on its NICs), for timelines
    timeline: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def utilisation(self) -> tuple[float, ...]:
        return tuple(b / self.makespan if self.makespan else 0.0 for b in self.busy)

    @property
    def machine_links(self) -> dict[tuple[int, int], int]:
        """Bytes between machines, per (from machine, to machine)."""
        out: dict[tuple[int, int], int] = {}
        for (s, d), n in self.links.items():
            key = (self.cluster.machine_of(s), self.cluster.machine_of(d))
            if key[0] != key[1]:
                out[key] = out.get(key, 0) + n
        return out

    @property
    def fits(self) -> bool:
        return max(self.peak_memory, default=0) <= self.cluster.memory_per_machine

    def __str__(self) -> str:
        use = self.utilisation
        lo, hi = int(np.argmin(use)), int(np.argmax(use))
        lines = [
            f"simulated on {self.cluster}: {self.tasks:,} tasks, makespan {_secs(self.makespan)}",
            f"  utilisation: mean {np.mean(use):.0%}, min {use[lo]:.0%} (worker {lo}), "
            f"max {use[hi]:.0%} (worker {hi})",
            f"  moved: {_size(self.bytes_within)} within machines, {_size(self.bytes_across)} across",
        ]
        if self.links:
            (s, d), n = max(self.links.items(), key=lambda kv: kv[1])
            lines[-1] += f"; busiest link {s}->{d} {_size(n)}"
        peak = int(np.argmax(self.peak_memory))
        verdict = "fits" if self.fits else "DOES NOT FIT"
        lines.append(f"  peak memory: {_size(self.peak_memory[peak])} on machine {peak} "
                     f"of {_size(self.cluster.memory_per_machine)} ({verdict})")
        parts = " + ".join(f"{k} {_secs(v)}" for k, v in self.critical_time.items() if v > 0)
        lines.append(f"  critical path: {len(self.critical_path)} tasks = {parts or '0 s'}; "
                     f"{self.critical_waits} waited for a busy core or NIC")
        return "\n".join(lines)


def _secs(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s < 1 else f"{s:.3f} s"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


# ------------------------------------------------------------ the replay


class _Port:
    """One direction of one NIC: its booked transfers as sorted, disjoint [start, end) slots."""

    __slots__ = ("ends", "owners", "starts")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.owners: list[int] = []

    def forget_before(self, now: float) -> None:
        k = bisect_right(self.ends, now)
        if k:
            del self.starts[:k], self.ends[:k], self.owners[:k]

    def clash(self, t: float, d: float) -> int:
        """The first booked slot overlapping [t, t + d), or -1."""
        k = bisect_right(self.ends, t)
        return k if k < len(self.starts) and self.starts[k] < t + d else -1

    def book(self, t: float, d: float, owner: int) -> None:
        """Book [t, t + d), merged with touching slots so a busy stretch is one slot to skip.
        A slot's owner is the transfer that ends it: the one a later transfer waits for."""
        k = bisect_left(self.starts, t)
        end = t + d
        if k < len(self.starts) and self.starts[k] == end:
            end, owner = self.ends[k], self.owners[k]
            del self.starts[k], self.ends[k], self.owners[k]
        if k and self.ends[k - 1] == t:
            self.ends[k - 1], self.owners[k - 1] = end, owner
            return
        self.starts.insert(k, t)
        self.ends.insert(k, end)
        self.owners.insert(k, owner)


def _earliest_slot(now: float, d: float, out: _Port, into: _Port) -> tuple[float, int]:
    """The first time both ports are free for d seconds, and the transfer that held it up (or -1)."""
    t, blocker = now, -1
    while True:
        for port in (out, into):
            k = port.clash(t, d)
            if k >= 0:
                t, blocker = port.ends[k], port.owners[k]
                break
        else:
            return t, blocker


def run(tg: TaskGraph, cluster: Cluster, durations: Sequence[float] | None = None,
        widths: Sequence[int] | None = None, slots: int = 1) -> Simulation:
    """Replay ``tg`` on ``cluster``: one heap of finish events, one ready heap per core.

    ``durations`` replaces the per-task time rules (engines/simulate_cluster.py
    costs a machine's whole block on its cores that way). ``slots``: cores per
    worker, of which a task holds ``widths[t]`` (default 1): a machine-level worker
    runs tasks side by side while their widths fit, the highest ranked first."""
    if cluster.workers != tg.workers or cluster.cores != tg.cores:
        raise SimulationError(f"the TaskGraph is for {tg.workers} workers of {tg.cores} cores per machine, "
                              f"the cluster is {cluster}")
    n, workers, cores = len(tg.tasks), tg.workers, tg.cores
    loc = [task.loc for task in tg.tasks]
    inputs = [task.inputs for task in tg.tasks]
    nbytes = [_nbytes(task) for task in tg.tasks]
    if durations is not None and len(durations) != n:
        raise SimulationError(f"{len(durations)} durations for {n} tasks")
    dur = list(durations) if durations is not None else _durations(tg, cluster, nbytes)
    is_move = [isinstance(task, MoveTask) for task in tg.tasks]
    across = [isinstance(task, MoveTask) and task.src // cores != task.loc // cores for task in tg.tasks]
    users: list[list[int]] = [[] for _ in range(n)]
    for t, ins in enumerate(inputs):
        for i in ins:
            users[i].append(t)
    rank = [0.0] * n
    for t in reversed(range(n)):
        rank[t] = dur[t] + max((rank[u] for u in users[t]), default=0.0)
    readers = [len(u) for u in users]
    for out in tg.outputs.values():
        for t, _ in out.blocks:
            readers[t] += 1 << 40  # outputs are never freed

    pending = [len(ins) for ins in inputs]
    finish = [0.0] * n
    ready_at = [0.0] * n
    prev = [-1] * n  # what the task waited for last: an input, or the task before it on its core or NIC
    waited = [False] * n  # prev was a resource, not data
    events: list[tuple[float, int]] = []
    ready: list[list[tuple[float, int]]] = [[] for _ in range(workers)]
    width = [min(max(1, int(x)), slots) for x in widths] if widths is not None else [1] * n
    free = [slots] * workers
    last_on_core = [-1] * workers
    machines = tg.workers // cores
    out_ports = [_Port() for _ in range(machines)]
    in_ports = [_Port() for _ in range(machines)]
    xfer_end = [0.0] * n
    live = [0] * machines
    peak = [0] * machines
    busy = [0.0] * workers
    latency = cluster.latency_across

    def begin(t: int, now: float) -> None:
        m = loc[t] // cores
        live[m] += nbytes[t]
        if live[m] > peak[m]:
            peak[m] = live[m]
        heapq.heappush(events, (now + dur[t], t))

    def start_core(w: int, now: float) -> None:
        while ready[w] and width[ready[w][0][1]] <= free[w]:
            start_one(w, now)

    def start_one(w: int, now: float) -> None:
        _, t = heapq.heappop(ready[w])
        free[w] -= width[t]
        if now > ready_at[t]:
            prev[t], waited[t] = last_on_core[w], True
        last_on_core[w] = t
        busy[w] += dur[t] * width[t] / slots
        begin(t, now)

    def become_ready(t: int, now: float, why: int) -> None:
        prev[t], ready_at[t] = why, now
        if not is_move[t]:
            w = loc[t]
            heapq.heappush(ready[w], (-rank[t], t))
            start_core(w, now)
            return
        if not across[t]:
            begin(t, now)
            return
        out_m, in_m = tg.tasks[t].src // cores, loc[t] // cores
        out, into = out_ports[out_m], in_ports[in_m]
        out.forget_before(now)
        into.forget_before(now)
        go, blocker = _earliest_slot(now, dur[t], out, into)
        if go > now:
            prev[t], waited[t] = blocker, True
        out.book(go, dur[t], t)
        into.book(go, dur[t], t)
        end = xfer_end[t] = go + dur[t]
        live[in_m] += nbytes[t]
        peak[in_m] = max(peak[in_m], live[in_m])
        heapq.heappush(events, (end + latency, t))

    for t in range(n):
        if not pending[t]:
            become_ready(t, 0.0, -1)
    done = 0
    while events:
        now, t = heapq.heappop(events)
        finish[t] = now
        done += 1
        for u in users[t]:
            pending[u] -= 1
            if not pending[u]:
                become_ready(u, now, t)
        if not is_move[t]:
            w = loc[t]
            free[w] += width[t]
            start_core(w, now)
        for i in inputs[t]:
            readers[i] -= 1
            if not readers[i]:
                live[loc[i] // cores] -= nbytes[i]
    if done != n:
        raise SimulationError(f"only {done} of {n} tasks could run: a cycle, or an input id out of order")
    sim = _report(tg, cluster, finish, xfer_end, prev, waited, is_move, across, busy, peak, nbytes)
    end = np.array(finish)
    sent = np.array(across, dtype=bool)
    end[sent] = np.array(xfer_end)[sent]
    return replace(sim, timeline=np.stack([end - np.array(dur), np.array(finish)], axis=1) if n else
                   np.zeros((0, 2)))


def _durations(tg: TaskGraph, cluster: Cluster, nbytes: list[int]) -> list[float]:
    """Seconds each task holds its core; for a move between machines, its NICs (latency comes after)."""
    cache: dict[Einsummable, float] = {}
    out = [0.0] * len(tg.tasks)
    for t, task in enumerate(tg.tasks):
        if isinstance(task, MoveTask):
            same = tg.machine_of(task.src) == tg.machine_of(task.loc)
            if same:
                out[t] = cluster.latency_within + nbytes[t] / cluster.bandwidth_within
            else:
                out[t] = nbytes[t] / cluster.bandwidth_across
            continue
        if isinstance(task, ApplyTask):
            if task.op not in cache:
                cache[task.op] = apply_seconds(task.op, cluster)
            out[t] = cache[task.op] + cluster.task_overhead
            continue
        rule = KERNEL_SECONDS.get(type(task))
        if rule is None:
            raise SimulationError(f"task %{t}: no time rule for {type(task).__name__}")
        out[t] = rule(task, cluster) + cluster.task_overhead
    return out


def _report(tg: TaskGraph, cluster: Cluster, finish: list[float], xfer_end: list[float], prev: list[int],
            waited: list[bool], is_move: list[bool], across: list[bool], busy: list[float], peak: list[int],
            nbytes: list[int]) -> Simulation:
    n = len(tg.tasks)
    makespan = max(finish, default=0.0)
    path: list[int] = []
    t = int(np.argmax(finish)) if n else -1
    while t >= 0:
        path.append(t)
        t = prev[t]
    path.reverse()
    kinds = {"compute": 0.0, "moves across": 0.0, "moves within": 0.0}
    mark = 0.0
    for k, t in enumerate(path):
        nxt = path[k + 1] if k + 1 < len(path) else -1
        # a transfer lets the next one on its NIC go when its bytes are sent, before it lands
        point = xfer_end[t] if nxt >= 0 and across[t] and across[nxt] and waited[nxt] else finish[t]
        kind = "compute" if not is_move[t] else "moves across" if across[t] else "moves within"
        kinds[kind] += point - mark
        mark = point
    src = np.array([task.src for task in tg.tasks if isinstance(task, MoveTask)], dtype=np.int64)
    dst = np.array([task.loc for task in tg.tasks if isinstance(task, MoveTask)], dtype=np.int64)
    size = np.array([b for b, m in zip(nbytes, is_move, strict=True) if m], dtype=np.int64)
    keys, inverse = np.unique(src * tg.workers + dst, return_inverse=True)
    totals = np.bincount(inverse, weights=size, minlength=len(keys)).astype(np.int64)
    links = {(int(k // tg.workers), int(k % tg.workers)): int(v) for k, v in zip(keys, totals, strict=True)}
    cross = (src // tg.cores) != (dst // tg.cores)
    return Simulation(
        cluster=cluster,
        tasks=n,
        makespan=makespan,
        busy=tuple(busy),
        links=links,
        bytes_within=int(size[~cross].sum()),
        bytes_across=int(size[cross].sum()),
        peak_memory=tuple(peak),
        critical_path=tuple(path),
        critical_time=kinds,
        critical_waits=sum(1 for t in path if waited[t]),
    )
