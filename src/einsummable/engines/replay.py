"""simulate.py's replay over a CompactGraph's arrays, for graphs of millions of tasks.

The same model and the same events, in the same order, as ``simulate.run`` (see
its docstring): one heap of finish events, a ready heap per worker ordered by
critical path, NIC ports booked per move between machines, blocks live from their
task's start to their last reader's end. Only the input differs: arrays instead
of task objects, so a million tasks cost tens of MB, not gigabytes.

    sim = replay(cg, Cluster(machines=32, cores=1), durations)    # a simulate.Simulation
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from einsummable.engines.simulate import Simulation, _earliest_slot, _Port
from einsummable.errors import SimulationError
from einsummable.hardware.cluster import Cluster
from einsummable.lower.compact import MOVE, CompactGraph


def users_csr(g: CompactGraph) -> tuple[np.ndarray, np.ndarray]:
    """The readers of each task, in task order: ``users[ptr[t]:ptr[t + 1]]``."""
    n = len(g)
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.indptr))
    order = np.argsort(g.indices, kind="stable")
    ptr = np.concatenate([[0], np.cumsum(np.bincount(g.indices, minlength=n))]).astype(np.int64)
    return ptr, owner[order]


def ranks(dur: list[float], ptr: list[int], users: list[int]) -> list[float]:
    """Each task's critical path: its time and the longest path of its readers."""
    n = len(dur)
    rank = [0.0] * n
    for t in range(n - 1, -1, -1):
        a, b = ptr[t], ptr[t + 1]
        rank[t] = dur[t] + (max([rank[u] for u in users[a:b]]) if b > a else 0.0)
    return rank


def replay(g: CompactGraph, cluster: Cluster, durations: Sequence[float]) -> Simulation:
    """Replay ``g`` on ``cluster`` with the given seconds per task (simulate.run's loop)."""
    if cluster.workers != g.workers or cluster.cores != g.cores:
        raise SimulationError(f"the graph is for {g.workers} workers of {g.cores} cores per machine, "
                              f"the cluster is {cluster}")
    n, workers, cores = len(g), g.workers, g.cores
    if len(durations) != n:
        raise SimulationError(f"{len(durations)} durations for {n} tasks")
    dur = [float(d) for d in durations]
    loc = g.loc.tolist()
    srcs = g.src.tolist()
    nbytes_arr = g.nbytes()
    nbytes = nbytes_arr.tolist()
    move = g.kind == MOVE
    is_move = move.tolist()
    across_arr = move & (g.src // cores != g.loc // cores)
    across = across_arr.tolist()
    inptr, inputs = g.indptr.tolist(), g.indices.tolist()
    uptr_arr, users_arr = users_csr(g)
    uptr, users = uptr_arr.tolist(), users_arr.tolist()
    rank = ranks(dur, uptr, users)
    readers = np.diff(uptr_arr)
    for out in g.outputs.values():
        for t, _ in out.blocks:
            readers[t] += 1 << 40  # outputs are never freed
    readers = readers.tolist()

    pending = np.diff(g.indptr).tolist()
    finish = [0.0] * n
    ready_at = [0.0] * n
    prev = [-1] * n
    waited = [False] * n
    events: list[tuple[float, int]] = []
    ready: list[list[tuple[float, int]]] = [[] for _ in range(workers)]
    idle = [True] * workers
    last_on_core = [-1] * workers
    machines = workers // cores
    out_ports = [_Port() for _ in range(machines)]
    in_ports = [_Port() for _ in range(machines)]
    xfer_end = [0.0] * n
    live = [0] * machines
    peak = [0] * machines
    busy = [0.0] * workers
    latency = cluster.latency_across
    push, pop = heapq.heappush, heapq.heappop

    def begin(t: int, now: float) -> None:
        m = loc[t] // cores
        live[m] += nbytes[t]
        if live[m] > peak[m]:
            peak[m] = live[m]
        push(events, (now + dur[t], t))

    def start_core(w: int, now: float) -> None:
        _, t = pop(ready[w])
        idle[w] = False
        if now > ready_at[t]:
            prev[t], waited[t] = last_on_core[w], True
        last_on_core[w] = t
        busy[w] += dur[t]
        begin(t, now)

    def become_ready(t: int, now: float, why: int) -> None:
        prev[t], ready_at[t] = why, now
        if not is_move[t]:
            w = loc[t]
            push(ready[w], (-rank[t], t))
            if idle[w]:
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
        live[in_m] += nbytes[t]
        peak[in_m] = max(peak[in_m], live[in_m])
        push(events, (end + latency, t))

    for t in range(n):
        if not pending[t]:
            become_ready(t, 0.0, -1)
    done = 0
    while events:
        now, t = pop(events)
        finish[t] = now
        done += 1
        for u in users[uptr[t]:uptr[t + 1]]:
            pending[u] -= 1
            if not pending[u]:
                become_ready(u, now, t)
        if not is_move[t]:
            w = loc[t]
            idle[w] = True
            if ready[w]:
                start_core(w, now)
        for i in inputs[inptr[t]:inptr[t + 1]]:
            readers[i] -= 1
            if not readers[i]:
                live[loc[i] // cores] -= nbytes[i]
    if done != n:
        raise SimulationError(f"only {done} of {n} tasks could run: a cycle, or an input id out of order")
    end = np.array(finish)
    sent = across_arr
    end[sent] = np.array(xfer_end)[sent]
    timeline = np.stack([end - np.array(dur), np.array(finish)], axis=1) if n else np.zeros((0, 2))
    return report(g, cluster, finish, xfer_end, prev, waited, move, across_arr, busy, peak, nbytes_arr,
                  timeline)


def report(g: CompactGraph, cluster: Cluster, finish: list[float], xfer_end: list[float], prev: list[int],
           waited: list[bool], move: np.ndarray, across: np.ndarray, busy: list[float], peak: list[int],
           nbytes: np.ndarray, timeline: np.ndarray) -> Simulation:
    """simulate._report over arrays: the critical path, bytes per link, the totals."""
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
        point = xfer_end[t] if nxt >= 0 and across[t] and across[nxt] and waited[nxt] else finish[t]
        kind = "compute" if not move[t] else "moves across" if across[t] else "moves within"
        kinds[kind] += point - mark
        mark = point
    src, dst = g.src[move].astype(np.int64), g.loc[move].astype(np.int64)
    size = nbytes[move]
    keys, inverse = np.unique(src * g.workers + dst, return_inverse=True)
    totals = np.bincount(inverse.ravel(), weights=size, minlength=len(keys)).astype(np.int64)
    links = {(int(k // g.workers), int(k % g.workers)): int(v) for k, v in zip(keys, totals, strict=True)}
    cross = (src // g.cores) != (dst // g.cores)
    return Simulation(
        cluster=cluster, tasks=n, makespan=makespan, busy=tuple(busy), links=links,
        bytes_within=int(size[~cross].sum()), bytes_across=int(size[cross].sum()), peak_memory=tuple(peak),
        critical_path=tuple(path), critical_time=kinds, critical_waits=sum(1 for t in path if waited[t]),
        timeline=timeline,
    )
