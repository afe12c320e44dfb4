"""Placement: a worker for every block, and the traffic and load that result.

Policy, node by node in topological order (list scheduling on the cluster model):
- each graph input and fill is spread round-robin over the workers, from worker 0;
- a formation of an already-whole value stays where that value is;
- every other block goes to the worker where it would finish first: after that
  worker is free and after its inputs arrive there, where arrival adds the time
  to receive the bytes not already on that worker (flop time and F × bytes
  received, as DESIGN.md §5 asks). A chain of small ops thus stays on one
  worker, and the blocks of a big op spread;
- no worker takes more than ``ceil(blocks / workers)`` blocks of one node;
- the blocks of a partial-sum group stay on one machine while it has room.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from einsummable.ir.graph import EinGraph, Fill, Formation, InputNode
from einsummable.plan.cluster import Cluster
from einsummable.plan.partition import Partition
from einsummable.plan.space import Space
from einsummable.plan.traffic import EdgeCost, Holders, block_indices, edge_cost, flops_per_block, holders


@dataclass(frozen=True)
class Summary:
    """The figures of one placed plan."""

    flops: tuple[float, ...]  # per worker
    bytes_within: int  # moved between cores of one machine
    bytes_across: int  # moved between machines
    model_bytes: float  # the planner's cost model, before placement

    @property
    def bytes_moved(self) -> int:
        return self.bytes_within + self.bytes_across

    @property
    def imbalance(self) -> float:
        """Busiest worker over the mean; 1.0 is perfect balance."""
        mean = sum(self.flops) / len(self.flops)
        return max(self.flops) / mean if mean else 1.0


def place(
    g: EinGraph, spaces: tuple[Space, ...], parts: tuple[Partition, ...], cluster: Cluster, live: list[bool]
) -> tuple[tuple[tuple[int, ...], ...], tuple[float, ...], int, int]:
    """Locations per node, flops per worker, and bytes moved within and across machines."""
    workers = cluster.workers
    machines = np.arange(workers) // cluster.cores
    ready = np.zeros(workers)  # when each worker is next free, in seconds
    done = np.zeros(len(g.nodes))  # when each node's last block finishes
    flops = np.zeros(workers)
    locs: list[tuple[int, ...]] = []
    held: list[Holders | None] = []
    seen: dict[tuple[int, object], set[tuple[int, int]]] = {}
    moved = [0, 0]
    for nid, (node, sp, part) in enumerate(zip(g.nodes, spaces, parts, strict=True)):
        n = part.num_blocks
        if not live[nid]:
            locs.append((0,) * n)
            held.append(None)
            continue
        if isinstance(node, InputNode | Fill):
            where = tuple(b % workers for b in range(n))
        elif isinstance(node, Formation) and not spaces[node.inputs[0]].aggregated:
            where = locs[node.inputs[0]]
            done[nid] = done[node.inputs[0]]
        else:
            costs = [edge_cost(g, nid, k, sp, part, held[u], machines) for k, u in enumerate(node.inputs)]
            seconds = np.zeros((n, workers))
            for c in costs:
                seconds += c.within / cluster.bandwidth_within + c.across / cluster.bandwidth_across
            work = flops_per_block(sp, part) / cluster.flops_per_core
            groups = _groups(sp, part) if sp.aggregated else None
            start = max((done[u] for u in node.inputs), default=0.0)
            where, done[nid] = _assign(seconds + start, work, ready, machines, groups)
            for c, u in zip(costs, node.inputs, strict=True):
                _count(c, where, seen.setdefault((u, c.tag), set()), moved)
            for b, w in enumerate(where):
                flops[w] += work[b] * cluster.flops_per_core
        locs.append(where)
        held.append(holders(sp, part, where))
    return tuple(locs), tuple(float(f) for f in flops), moved[0], moved[1]


def _count(c: EdgeCost, where: tuple[int, ...], seen: set[tuple[int, int]], moved: list[int]) -> None:
    """Add the bytes of reads not yet made at their location (moves are shared)."""
    for b, w in enumerate(where):
        read = (int(c.key[b]), w)
        if read not in seen:
            seen.add(read)
            moved[0] += int(c.within[b, w])
            moved[1] += int(c.across[b, w])


def _groups(sp: Space, part: Partition) -> np.ndarray:
    """The output block each join block adds into."""
    idx = block_indices(part.counts)
    key = np.zeros(part.num_blocks, dtype=np.int64)
    for d in sp.out_dims:
        key = key * part.counts[d] + idx[:, d]
    return key


def _assign(
    arrival: np.ndarray, work: np.ndarray, ready: np.ndarray, machines: np.ndarray, groups: np.ndarray | None
) -> tuple[tuple[int, ...], float]:
    """Greedy earliest finish per block; updates ``ready``, returns locations and the last finish."""
    n, workers = arrival.shape
    cap = math.ceil(n / workers)
    taken = np.zeros(workers, dtype=np.int64)
    group_machine: dict[int, int] = {}
    where = []
    last = 0.0
    for b in range(n):
        finish = np.maximum(ready, arrival[b]) + work[b]
        score = np.where(taken < cap, finish, np.inf)
        if groups is not None and int(groups[b]) in group_machine:
            home = machines == group_machine[int(groups[b])]
            if np.isfinite(score[home]).any():
                score = np.where(home, score, np.inf)
        w = int(np.argmin(score))
        where.append(w)
        taken[w] += 1
        ready[w] = finish[w]
        last = max(last, float(finish[w]))
        if groups is not None:
            group_machine.setdefault(int(groups[b]), int(machines[w]))
    return tuple(where), last
