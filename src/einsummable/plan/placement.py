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

from dataclasses import dataclass

import numpy as np

from einsummable.ir.graph import EinGraph, Fill, Formation, InputNode
from einsummable.plan.cluster import Cluster
from einsummable.plan.partition import Partition
from einsummable.plan.space import Space
from einsummable.plan.traffic import EdgeCost, Holders, block_indices, edge_cost, flops_per_block, holders

ROUNDS = 4
LEAN = 0.1  # the preference for a block's own worker, in units of the block's flop time


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
    seen: dict[tuple[int, object], np.ndarray] = {}  # reads made: key * workers + location
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
            placed, done[nid] = _assign(seconds + start, work, ready, machines, groups)
            for c, u in zip(costs, node.inputs, strict=True):
                _count(c, placed, seen, u, moved)
            np.add.at(flops, placed, work * cluster.flops_per_core)
            where = tuple(int(w) for w in placed)
        locs.append(where)
        held.append(holders(sp, part, where))
    return tuple(locs), tuple(float(f) for f in flops), moved[0], moved[1]


def _count(c: EdgeCost, where: np.ndarray, seen: dict, u: int, moved: list[int]) -> None:
    """Add the bytes of reads not yet made at their location (moves are shared)."""
    workers = c.within.shape[1]
    codes = c.key * workers + where
    fresh, first = np.unique(codes, return_index=True)
    old = seen.get((u, c.tag))
    if old is not None:
        keep = ~np.isin(fresh, old)
        fresh, first = fresh[keep], first[keep]
        seen[(u, c.tag)] = np.concatenate([old, fresh])
    else:
        seen[(u, c.tag)] = fresh
    moved[0] += int(c.within[first, where[first]].sum())
    moved[1] += int(c.across[first, where[first]].sum())


def _groups(sp: Space, part: Partition) -> np.ndarray:
    """The output block each join block adds into."""
    idx = block_indices(part.counts)
    key = np.zeros(part.num_blocks, dtype=np.int64)
    for d in sp.out_dims:
        key = key * part.counts[d] + idx[:, d]
    return key


def _assign(
    arrival: np.ndarray, work: np.ndarray, ready: np.ndarray, machines: np.ndarray, groups: np.ndarray | None
) -> tuple[np.ndarray, float]:
    """Earliest finish per block, in a few rounds: every open block bids for its best worker
    with room, and each worker takes its earliest-finishing bidders; blocks still open
    after that go to the workers with room that are free first. Updates ``ready``."""
    n, workers = arrival.shape
    finish = np.maximum(ready[None, :], arrival) + work[:, None]
    # block b leans toward worker b mod p, as inputs do: near-ties spread instead of colliding,
    # and nodes with equal partitions line up, so elementwise readers find their operands local
    rank = (np.arange(workers)[None, :] - np.arange(n)[:, None]) % workers
    finish = finish + (rank > 0) * LEAN * work[:, None] + 1e-12 * rank
    room = np.full(workers, -(-n // workers))
    where = np.full(n, -1, dtype=np.int64)
    open_ = np.arange(n)
    home = np.full(int(groups.max()) + 1 if groups is not None else 0, -1)
    for _ in range(ROUNDS):
        if not len(open_):
            break
        score = np.where(room[None, :] > 0, finish[open_], np.inf)
        if groups is not None:  # a partial-sum group stays on the machine it started on
            h = home[groups[open_]]
            away = (h[:, None] >= 0) & (machines[None, :] != h[:, None])
            fenced = np.where(away, np.inf, score)
            score = np.where(np.isfinite(fenced).any(axis=1)[:, None], fenced, score)
        best = np.argmin(score, axis=1)
        order = np.lexsort((score[np.arange(len(open_)), best], best))
        rank = np.arange(len(order)) - np.searchsorted(best[order], best[order])
        take = order[rank < room[best[order]]]
        blocks, ws = open_[take], best[take]
        where[blocks] = ws
        np.subtract.at(room, ws, 1)
        if groups is not None:
            fresh = home[groups[blocks]] < 0
            home[groups[blocks][fresh]] = machines[ws[fresh]]
        open_ = np.setdiff1d(open_, blocks)
    if len(open_):
        slots = np.repeat(np.arange(workers), room)
        slots = slots[np.argsort(ready[slots], kind="stable")]
        where[open_] = slots[: len(open_)]
    for w in np.unique(where):  # a worker with several blocks runs them back to back
        mine = where == w
        ready[w] = max(ready[w], arrival[mine, w].min()) + work[mine].sum()
    return where, float(ready[np.unique(where)].max()) if n else 0.0
