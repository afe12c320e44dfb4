"""The predicted step time of a two-level plan, with transfers overlapping compute.

Adding the busiest core's seconds to the busiest NIC's (figures.py's two figures)
assumes nothing overlaps. The engines overlap: a move across machines starts when
its block is made and holds only the NICs, while the cores run whatever is ready
(engines/simulator/simulate.py and simulate_cluster.py replay exactly that). Replaying
Llama-7B training at 4 machines × 64 cores the sum was 1.27-1.42 × the simulated
step for data parallelism and EinDecomp, whose gradient reductions run under
the backward pass; a plain max would miss the network-bound plans, whose
activations wait for the network layer after layer (simulated: more than the sum).

So the planner replays the plan node by node on one machine, taken as typical
(every node is costed on the machine that holds most of it):
- a node runs on ``min(blocks, cores)`` of the machine's cores for its blocks'
  time (the busiest core's share: ``ceil(blocks / cores)`` block times), when its
  inputs have arrived and enough cores are free; ready nodes go by critical path,
  as in the engines;
- every transfer the NIC model charges (an operand's pieces from other machines, a
  partial sum sent to its formation: figures.nic_bytes) is a job on the NIC, which
  runs one at a time for ``bytes on the busiest machine / bandwidth_across`` and
  lands ``latency_across`` later; it starts once its producer has run, and its
  reader waits for it.
That is a few operations per node: a plan for 32 × 64 is timed in well under a second.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import EinGraph, Fill, InputNode


@dataclass(frozen=True)
class Transfer:
    """Bytes on the busiest NIC (in or out) that ``reader`` waits for, sent once ``producer`` ran.
    ``reader`` is -1 for a partial sum sent after ``producer`` ran: its readers wait for it."""

    producer: int
    reader: int
    nbytes: float


def step_seconds(g: EinGraph, live: Sequence[bool], block_seconds: Sequence[float], blocks: Sequence[int],
                 transfers: Sequence[Transfer], cluster: Cluster) -> float:
    """The makespan of the node-by-node replay (module docstring).

    ``block_seconds[v]``: one block of node v on one core, overhead included;
    ``blocks[v]``: node v's blocks on its busiest machine."""
    n, cores = len(g.nodes), cluster.cores
    width = [min(max(1, b), cores) for b in blocks]
    dur = [0.0 if not live[v] or isinstance(node, InputNode | Fill) else
           block_seconds[v] * math.ceil(max(1, blocks[v]) / cores) for v, node in enumerate(g.nodes)]
    # jobs 0..n-1: nodes; n + i: transfer i
    jobs = n + len(transfers)
    wait = [0] * jobs  # prerequisites not yet done
    after: list[list[int]] = [[] for _ in range(jobs)]  # jobs released when a job is done
    sent_after: list[list[int]] = [[] for _ in range(n)]  # a node's partial sums, sent when it ran
    for v, node in enumerate(g.nodes):
        if live[v]:
            for u in set(node.inputs):
                after[u].append(v)
                wait[v] += 1
    for i, t in enumerate(transfers):
        j = n + i
        after[t.producer].append(j)
        wait[j] += 1
        if t.reader >= 0:
            after[j].append(t.reader)
            wait[t.reader] += 1
        else:
            sent_after[t.producer].append(j)
    for v in range(n):  # readers of a node whose partial sums travel wait for them too
        for j in sent_after[v]:
            for r in after[v]:
                if r < n:
                    after[j].append(r)
                    wait[r] += 1
    seconds = dur + [t.nbytes / cluster.bandwidth_across for t in transfers]
    rank = [0.0] * jobs
    for j in reversed(_order(after, wait)):
        rank[j] = seconds[j] + max((rank[k] for k in after[j]), default=0.0)

    events: list[tuple[float, int]] = []  # (time, job done), or (time, NIC) when the NIC is free again
    nic = -1
    on_cores: list[tuple[float, int]] = []
    on_nic: list[tuple[float, int]] = []
    free, nic_busy, now, end = cores, False, 0.0, 0.0

    def ready(j: int) -> None:
        heapq.heappush(on_nic if j >= n else on_cores, (-rank[j], j))

    def start() -> None:
        nonlocal free, nic_busy
        while on_cores and width[on_cores[0][1]] <= free:
            _, v = heapq.heappop(on_cores)
            free -= width[v]
            heapq.heappush(events, (now + seconds[v], v))
        if on_nic and not nic_busy:
            _, j = heapq.heappop(on_nic)
            nic_busy = True
            heapq.heappush(events, (now + seconds[j], nic))
            heapq.heappush(events, (now + seconds[j] + cluster.latency_across, j))

    for j in range(jobs):
        if not wait[j] and (j >= n or live[j]):
            ready(j)
    start()
    while events:
        now, j = heapq.heappop(events)
        end = max(end, now)
        if j == nic:
            nic_busy = False
        else:
            if j < n:
                free += width[j]
            for k in after[j]:
                wait[k] -= 1
                if not wait[k]:
                    ready(k)
        start()
    return end


def _order(after: list[list[int]], wait: list[int]) -> list[int]:
    """The jobs in an order where every job comes after its prerequisites."""
    left = list(wait)
    out = [j for j in range(len(wait)) if not left[j]]
    for j in out:
        for k in after[j]:
            left[k] -= 1
            if not left[k]:
                out.append(k)
    return out
