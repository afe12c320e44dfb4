"""The simulator's event loop, over a CompactGraph's arrays, and what it reports.

``simulate.run`` (a TaskGraph, with simulate.py's time per task) and
``simulate_cluster.run`` (a machine-level graph of a million tasks, with a time
per machine-level block) both replay through ``replay``: one heap of finish
events, a ready heap per worker ordered by rank (ir/priority.py), NIC ports booked per
move between machines, blocks live from their task's start to their last
reader's end. Arrays, not task objects, so a million tasks cost tens of MB.

Each machine has one interpreter (the local engine's process, a Ray actor): a task's first
``Cluster.gil_seconds`` on its core (all of it, if shorter) hold it, so the cores of a machine
start their tasks one at a time, ``gil_seconds`` apart at the least; a task that finds it
held waits on its core (its path's step "waited"). A task inside a native run past its first
(lower/runs.py: the C loop goes on without Python) holds none. Machine-level replays (``slots`` > 1) cost
dispatch in their durations instead.

    sim = replay(cg, Cluster(machines=32, cores=1), durations)    # a Simulation
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from einsummable.errors import SimulationError
from einsummable.hardware.cluster import Cluster
from einsummable.ir.priority import PROGRAM, critical_path, program, window
from einsummable.lower.compact import INPUT, MOVE, VIEW, CompactGraph


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
            f"simulated on {self.cluster}: {self.tasks:,} tasks, makespan {secs(self.makespan)}",
            f"  utilisation: mean {np.mean(use):.0%}, min {use[lo]:.0%} (worker {lo}), "
            f"max {use[hi]:.0%} (worker {hi})",
            f"  moved: {size(self.bytes_within)} within machines, {size(self.bytes_across)} across",
        ]
        if self.links:
            (s, d), n = max(self.links.items(), key=lambda kv: kv[1])
            lines[-1] += f"; busiest link {s}->{d} {size(n)}"
        peak = int(np.argmax(self.peak_memory))
        verdict = "fits" if self.fits else "DOES NOT FIT"
        lines.append(f"  peak memory: {size(self.peak_memory[peak])} on machine {peak} "
                     f"of {size(self.cluster.memory_per_machine)} ({verdict})")
        parts = " + ".join(f"{k} {secs(v)}" for k, v in self.critical_time.items() if v > 0)
        lines.append(f"  critical path: {len(self.critical_path)} tasks = {parts or '0 s'}; "
                     f"{self.critical_waits} waited for a busy core or NIC")
        return "\n".join(lines)


def secs(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s < 1 else f"{s:.3f} s"


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


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


def shared(g: CompactGraph) -> np.ndarray:
    """[tasks] moves that hand a whole block to another core of its machine: views of
    shared memory, which move no bytes (lower/stats.py's ``shares_whole``)."""
    same = g.src // g.cores == g.loc // g.cores
    return (g.kind == MOVE) & same & (g.shape == g.shape[first_input(g)])


def first_input(g: CompactGraph) -> np.ndarray:
    """[tasks] each task's first input (itself when it reads none)."""
    has = np.diff(g.indptr) > 0
    first = np.arange(len(g))
    first[has] = g.indices[g.indptr[:-1][has]]
    return first


def users_csr(g: CompactGraph) -> tuple[np.ndarray, np.ndarray]:
    """The readers of each task, in task order: ``users[ptr[t]:ptr[t + 1]]``."""
    n = len(g)
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.indptr))
    order = np.argsort(g.indices, kind="stable")
    ptr = np.concatenate([[0], np.cumsum(np.bincount(g.indices, minlength=n))]).astype(np.int64)
    return ptr, owner[order]


def aliases(g: CompactGraph, readers: np.ndarray,
            within: np.ndarray) -> tuple[list[int], list[int], list[int]]:
    """Bytes each task holds, the task that owns its memory, and each owner's readers.

    A move inside a machine and a view alias their source (the cores share memory, as
    in the local engine), so they hold nothing and their readers keep the source alive.
    Input blocks are the feeds, there from the start (``replay`` counts them then) and held
    all step, save those of an input an output of the same name replaces, which a session
    gives up to the run: freed after their last reader (plan/predict/memory.py); outputs live to the end.
    An input kept in host storage is loaded by its task and freed after its last reader; the
    output of its name is stored as it is made and holds nothing."""
    held = g.nbytes().tolist()
    owner = list(range(len(g)))
    count = readers.tolist()
    first = first_input(g).tolist()
    for t in np.flatnonzero(within | (g.kind == VIEW)).tolist():
        o = owner[t] = owner[first[t]]
        held[t] = 0
        count[o] += count[t]
    stored = [t for name, out in g.outputs.items() if name in g.stored for t, _ in out.blocks]
    for t in stored:  # stored as made: in host storage, not the machine's memory (plan/offload.py)
        held[t] = 0
    pinned = [t for name, out in g.outputs.items() if name not in g.stored for t, _ in out.blocks]
    kept = [t for t in np.flatnonzero(g.kind == INPUT).tolist() if g.aux_table[g.aux[t]][0] not in g.outputs
            and g.aux_table[g.aux[t]][0] not in g.stored]
    pinned += kept
    for t in pinned:
        count[owner[t]] += 1 << 40  # never freed
    return held, owner, count


def replay(g: CompactGraph, cluster: Cluster, durations: Sequence[float], widths: Sequence[int] | None = None,
           slots: int = 1, release: Sequence[float] | None = None,
           native: Sequence[bool] | None = None) -> Simulation:
    """Replay ``g`` on ``cluster`` with the given seconds per task. ``slots``: cores per
    worker, of which a task holds ``widths[t]`` (default 1): a machine-level worker runs
    tasks side by side while their widths fit, the highest ranked first. ``release``: per
    machine, when its tasks without inputs become ready (default 0: a driver feeding it
    over the object store starts it later). ``native[t]``: task t runs inside a run of the
    native loop past its first task (lower/runs.py), holding no interpreter."""
    if cluster.workers != g.workers or cluster.cores != g.cores:
        raise SimulationError(f"the graph is for {g.workers} workers of {g.cores} cores per machine, "
                              f"the cluster is {cluster}")
    n, workers, cores = len(g), g.workers, g.cores
    if len(durations) != n:
        raise SimulationError(f"{len(durations)} durations for {n} tasks")
    dur = [float(d) for d in durations]
    loc, srcs = g.loc.tolist(), g.src.tolist()
    move = g.kind == MOVE
    is_move = move.tolist()
    across_arr = move & (g.src // cores != g.loc // cores)
    across = across_arr.tolist()
    inptr, inputs = g.indptr.tolist(), g.indices.tolist()
    uptr_arr, users_arr = users_csr(g)
    uptr, users = uptr_arr.tolist(), users_arr.tolist()
    rank = program(n) if g.order == PROGRAM else critical_path(dur, uptr, users)
    held, owner, readers = aliases(g, np.diff(uptr_arr), move & ~across_arr)

    pending = np.diff(g.indptr).tolist()
    finish = [0.0] * n
    ready_at = [0.0] * n
    prev = [-1] * n  # what the task waited for last: an input, or the task before it on its core or NIC
    waited = [False] * n  # prev was a resource, not data
    events: list[tuple[float, int]] = []
    ready: list[list[tuple[float, int]]] = [[] for _ in range(workers)]
    width = [min(max(1, int(x)), slots) for x in widths] if widths is not None else [1] * n
    free = [slots] * workers
    last_on_core = [-1] * workers
    machines = workers // cores
    out_ports = [_Port() for _ in range(machines)]
    in_ports = [_Port() for _ in range(machines)]
    xfer_end = [0.0] * n
    live = [0] * machines
    freed = list(held)  # what the last reader of each owner frees
    for t in np.flatnonzero(g.kind == INPUT).tolist():  # the feeds are there from the start
        if g.aux_table[g.aux[t]][0] not in g.stored:  # a stored one: loaded when its task runs
            live[loc[t] // cores] += held[t]
            held[t] = 0
    peak = list(live)
    busy = [0.0] * workers
    latency = cluster.latency_across
    push, pop = heapq.heappush, heapq.heappop

    gil = cluster.gil_seconds if slots == 1 else 0.0
    holds = [gil] * n if native is None else [0.0 if x else gil for x in native]
    gil_free, gil_owner = [0.0] * machines, [-1] * machines  # when each interpreter is next free; by whom

    def begin(t: int, now: float) -> None:
        m = loc[t] // cores
        live[m] += held[t]
        if live[m] > peak[m]:
            peak[m] = live[m]
        push(events, (now + dur[t], t))

    def dispatch(t: int, now: float) -> float:
        """When core task ``t``, taken at ``now``, gets its machine's interpreter."""
        m = loc[t] // cores
        go = max(now, gil_free[m])
        if go > now:
            prev[t], waited[t] = gil_owner[m], True
        gil_free[m], gil_owner[m] = go + min(holds[t], dur[t]), t
        return go

    reach = window(g.order, workers * slots)
    low, finished, blocked = 0, [False] * n, set()  # the earliest unfinished task; workers held back

    def start_core(w: int, now: float) -> None:
        while ready[w] and width[ready[w][0][1]] <= free[w]:
            if reach is not None and ready[w][0][1] >= low + reach:
                blocked.add(w)
                return
            _, t = pop(ready[w])
            free[w] -= width[t]
            if now > ready_at[t]:
                prev[t], waited[t] = last_on_core[w], True
            last_on_core[w] = t
            busy[w] += dur[t] * width[t] / slots
            begin(t, dispatch(t, now) if holds[t] else now)

    def become_ready(t: int, now: float, why: int) -> None:
        prev[t], ready_at[t] = why, now
        if not is_move[t]:
            w = loc[t]
            push(ready[w], (-rank[t], t))
            start_core(w, now)
            return
        if not across[t]:
            begin(t, now)
            return
        out_m, in_m = srcs[t] // cores, loc[t] // cores
        out, into = out_ports[out_m], in_ports[in_m]
        out.forget_before(now)
        into.forget_before(now)
        go, blocker = _earliest_slot(now, dur[t], out, into)
        if go > now:
            prev[t], waited[t] = blocker, True
        out.book(go, dur[t], t)
        into.book(go, dur[t], t)
        end = xfer_end[t] = go + dur[t]
        live[in_m] += held[t]
        peak[in_m] = max(peak[in_m], live[in_m])
        push(events, (end + latency, t))

    for t in range(n):
        if not pending[t]:
            become_ready(t, float(release[loc[t] // cores]) if release is not None else 0.0, -1)
    done = 0
    while events:
        now, t = pop(events)
        finish[t] = now
        done += 1
        finished[t] = True
        if t == low:
            while low < n and finished[low]:
                low += 1
            for b in list(blocked):  # the reach moved on
                blocked.discard(b)
                start_core(b, now)
        for i in inputs[inptr[t]:inptr[t + 1]]:  # freed before the next task on this core takes memory
            o = owner[i]
            readers[o] -= 1
            if not readers[o]:
                live[loc[o] // cores] -= freed[o]
        for u in users[uptr[t]:uptr[t + 1]]:
            pending[u] -= 1
            if not pending[u]:
                become_ready(u, now, t)
        if not is_move[t]:
            w = loc[t]
            free[w] += width[t]
            start_core(w, now)
    if done != n:
        raise SimulationError(f"only {done} of {n} tasks could run: a cycle, or an input id out of order")
    end = np.array(finish)
    end[across_arr] = np.array(xfer_end)[across_arr]
    timeline = np.stack([end - np.array(dur), np.array(finish)], axis=1) if n else np.zeros((0, 2))
    return report(g, cluster, finish, xfer_end, prev, waited, move, across_arr, busy, peak, timeline)


def report(g: CompactGraph, cluster: Cluster, finish: list[float], xfer_end: list[float], prev: list[int],
           waited: list[bool], move: np.ndarray, across: np.ndarray, busy: list[float], peak: list[int],
           timeline: np.ndarray) -> Simulation:
    """The critical path, bytes per link, the totals."""
    n = len(g)
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
        kind = "compute" if not move[t] else "moves across" if across[t] else "moves within"
        kinds[kind] += point - mark
        mark = point
    src, dst = g.src[move].astype(np.int64), g.loc[move].astype(np.int64)
    nbytes = np.where(shared(g), 0, g.nbytes())[move]
    keys, inverse = np.unique(src * g.workers + dst, return_inverse=True)
    totals = np.bincount(inverse.ravel(), weights=nbytes, minlength=len(keys)).astype(np.int64)
    links = {(int(k // g.workers), int(k % g.workers)): int(v)
             for k, v in zip(keys, totals, strict=True) if v}
    cross = (src // g.cores) != (dst // g.cores)
    return Simulation(
        cluster=cluster, tasks=n, makespan=makespan, busy=tuple(busy), links=links,
        bytes_within=int(nbytes[~cross].sum()), bytes_across=int(nbytes[cross].sum()),
        peak_memory=tuple(peak),
        critical_path=tuple(path), critical_time=kinds, critical_waits=sum(1 for t in path if waited[t]),
        timeline=timeline,
    )
