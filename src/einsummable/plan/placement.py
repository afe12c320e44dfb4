"""Placement: a worker for every block, and the traffic and load that result.

Policy, node by node in topological order (list scheduling on the cluster model):
- each graph input and fill is spread round-robin over the workers, from worker 0;
- a formation of an already-whole value stays where that value is;
- every other block goes to the worker where it would finish first: after that
  worker is free and after its inputs arrive there, where arrival adds the time
  to receive the bytes not already on that worker (flop time and F × bytes
  received, as docs/design.md §5 asks). A chain of small ops thus stays on one
  worker, and the blocks of a big op spread;
- only a few workers are weighed for each block (``candidates``): those holding
  most of its inputs, its own worker (block b leans to b mod p) and some of the
  least busy. The best worker is nearly always among them, and planning costs
  blocks × a few instead of blocks × p per node, which 2048 workers need;
- no worker takes more than ``ceil(blocks / workers)`` blocks of one node;
- the blocks of a partial-sum group stay on one machine while it has room.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import EinGraph, Fill, Formation, InputNode
from einsummable.plan.partition import Partition
from einsummable.plan.predict.summary import node_seconds
from einsummable.plan.predict.traffic import (
    EdgeCost,
    Holders,
    block_indices,
    edge_cost,
    flops_per_block,
    holders,
)
from einsummable.plan.space import Space

ROUNDS = 4
LEAN = 0.1  # the preference for a block's own worker, in units of the block's flop time


@dataclass(frozen=True)
class Placed:
    """Locations per node, and what they cost: flops and kernel seconds per worker,
    bytes moved within and across machines, and bytes into each machine's NIC."""

    locs: tuple[tuple[int, ...], ...]
    flops: tuple[float, ...]
    seconds: np.ndarray
    within: int
    across: int
    nic_in: np.ndarray


def place(
    g: EinGraph, spaces: tuple[Space, ...], parts: tuple[Partition, ...], cluster: Cluster, live: list[bool],
    extra: Sequence[float] | None = None,
) -> Placed:
    """``extra[v]``: kernel seconds node v's partial sums add (summary.partial_seconds)."""
    workers = cluster.workers
    machines = np.arange(workers) // cluster.cores
    ready = np.zeros(workers)  # when each worker is next free, in seconds
    done = np.zeros(len(g.nodes))  # when each node's last block finishes
    flops = np.zeros(workers)
    seconds = np.zeros(workers)
    nic_in = np.zeros(cluster.machines)
    locs: list[tuple[int, ...]] = []
    held: list[Holders | None] = []
    seen: dict[tuple[int, object], np.ndarray] = {}  # reads made: key * workers + location
    moved = [0, 0]
    counted = (moved, nic_in)
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
            start = max((done[u] for u in node.inputs), default=0.0)

            def arrive(blocks: np.ndarray, ws: np.ndarray, costs=costs, start=start) -> np.ndarray:
                t = np.full(blocks.shape, start)
                for c in costs:
                    within, across = c.at(blocks, ws)
                    t += within / cluster.bandwidth_within + across / cluster.bandwidth_across
                return t

            work = flops_per_block(sp, part) / cluster.flops_per_core
            groups = _groups(sp, part) if sp.aggregated else None
            placed, done[nid] = _assign(candidates(costs, n, ready), arrive, work, ready, machines, groups)
            for c, u in zip(costs, node.inputs, strict=True):
                _count(c, placed, seen, u, counted)
            np.add.at(flops, placed, work * cluster.flops_per_core)
            share = work / work.sum() if work.sum() > 0 else np.full(n, 1 / max(n, 1))
            own = node_seconds(node, cluster) + (extra[nid] if extra is not None else 0.0)
            np.add.at(seconds, placed, share * own + cluster.task_overhead)
            where = tuple(int(w) for w in placed)
        locs.append(where)
        held.append(holders(sp, part, where))
    return Placed(tuple(locs), tuple(float(f) for f in flops), seconds, moved[0], moved[1], nic_in)


def _count(c: EdgeCost, where: np.ndarray, seen: dict, u: int, counted: tuple[list[int], np.ndarray]) -> None:
    """Add the bytes of reads not yet made at their location (moves are shared)."""
    moved, nic_in = counted
    codes = c.key * len(c.machines) + where
    fresh, first = np.unique(codes, return_index=True)
    old = seen.get((u, c.tag))
    if old is not None:
        keep = ~np.isin(fresh, old)
        fresh, first = fresh[keep], first[keep]
        seen[(u, c.tag)] = np.concatenate([old, fresh])
    else:
        seen[(u, c.tag)] = fresh
    within, across = c.at(first, where[first])
    np.add.at(nic_in, c.machines[where[first]], across)
    moved[0] += int(within.sum())
    moved[1] += int(across.sum())


SPREAD = 2  # least busy workers weighed per block


def candidates(costs: list[EdgeCost], n: int, ready: np.ndarray) -> np.ndarray:
    """[blocks, a few] workers to weigh per block: its own, its inputs' main holders, idle ones.

    Block b's idle workers are the b-th, (b+n)-th, ... least busy, so the blocks of
    one node reach for different workers.
    """
    workers = len(ready)
    blocks = np.arange(n)
    idle = np.argsort(ready, kind="stable")
    cols = [blocks % workers]
    cols += [idle[(blocks + j * n) % workers] for j in range(SPREAD)]
    for c in costs:
        top = c.top[c.key]
        cols += [np.where(top[:, j] >= 0, top[:, j], cols[0]) for j in range(top.shape[1])]
    return np.stack(cols, axis=1)


def _groups(sp: Space, part: Partition) -> np.ndarray:
    """The output block each join block adds into."""
    idx = block_indices(part.counts)
    key = np.zeros(part.num_blocks, dtype=np.int64)
    for d in sp.out_dims:
        key = key * part.counts[d] + idx[:, d]
    return key


def _assign(
    cand: np.ndarray, arrive, work: np.ndarray, ready: np.ndarray, machines: np.ndarray,
    groups: np.ndarray | None,
) -> tuple[np.ndarray, float]:
    """Earliest finish per block among its candidate workers, in a few rounds: every open
    block bids for its best candidate with room, and each worker takes its
    earliest-finishing bidders; blocks still open after that go to the workers with
    room that are free first. ``arrive(blocks, workers)`` is when inputs are in place.
    Updates ``ready``."""
    n, width = cand.shape
    workers = len(ready)
    rows = np.repeat(np.arange(n), width).reshape(n, width)
    finish = np.maximum(ready[cand], arrive(rows, cand)) + work[:, None]
    # block b leans toward worker b mod p, as inputs do: near-ties spread instead of colliding,
    # and nodes with equal partitions line up, so elementwise readers find their operands local
    lean = (cand - rows) % workers
    finish = finish + (lean > 0) * LEAN * work[:, None] + 1e-12 * lean
    room = np.full(workers, -(-n // workers))
    where = np.full(n, -1, dtype=np.int64)
    open_ = np.arange(n)
    home = np.full(int(groups.max()) + 1 if groups is not None else 0, -1)
    for _ in range(ROUNDS):
        if not len(open_):
            break
        mine = cand[open_]
        score = np.where(room[mine] > 0, finish[open_], np.inf)
        if groups is not None:  # a partial-sum group stays on the machine it started on
            h = home[groups[open_]]
            away = (h[:, None] >= 0) & (machines[mine] != h[:, None])
            fenced = np.where(away, np.inf, score)
            score = np.where(np.isfinite(fenced).any(axis=1)[:, None], fenced, score)
        col = np.argmin(score, axis=1)
        best = mine[np.arange(len(open_)), col]
        order = np.lexsort((score[np.arange(len(open_)), col], best))
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
    if not n:
        return where, 0.0
    # a worker with several blocks runs them back to back, from the first arrival
    first = np.full(workers, np.inf)
    np.minimum.at(first, where, arrive(np.arange(n), where))
    used = np.unique(where)
    ready[used] = np.maximum(ready[used], first[used]) + np.bincount(where, work, minlength=workers)[used]
    return where, float(ready[used].max())
