"""The figures of a placed plan, and its predicted step time.

Predicted step time = compute + network:
- compute: the busiest core's kernel seconds (a GEMM's flops at ``flops_per_core``,
  other joins at ``elementwise_flops_per_core``, written bytes at
  ``copy_bandwidth``, as the simulator charges them) plus ``task_overhead`` per block,
  or the critical path of block times when that is longer;
- network: the busiest NIC, the larger of its bytes in and out over
  ``bandwidth_across`` (full duplex). Moves inside a machine hold no core and no
  link (the simulator's rule), so they do not count.
That sum is the step of a one-machine plan (no NIC). A two-level plan's step is the
node-by-node replay of plan/predict/overlap.py instead (``overlapped_seconds``), where moves
across machines overlap compute as the engines overlap them. Kernel seconds include
the partial sums' and repartitions' memory work (``partial_seconds``).

The binding constraint is memory when the peak passes the capacity, otherwise the
larger of compute and network.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from einsummable.hardware import cost
from einsummable.hardware.cluster import Cluster
from einsummable.ir.dtypes import itemsize
from einsummable.ir.graph import EinGraph, EinsumNode, Fill, Formation, InputNode, Node, Select
from einsummable.plan.predict.memory import Memory


def dispatch_seconds(g: EinGraph, live: Sequence[bool], blocks: Sequence[int], cluster: Cluster) -> float:
    """The least a machine's step takes to start its tasks: its one interpreter holds each task's
    dispatch, ``gil_seconds``, in turn (engines/simulator/replay.py models it so). ``blocks``: each
    node's blocks on the machine."""
    if cluster.cores == 1:
        return 0.0  # one worker: its dispatch is its core's time, counted already
    tasks = sum(b for v, b in enumerate(blocks) if live[v] and not isinstance(g.nodes[v], InputNode | Fill))
    return tasks * cluster.gil_seconds


def node_seconds(node: Node, cluster: Cluster) -> float:
    """One core's kernel time for the whole node, without the per-task overhead."""
    if isinstance(node, EinsumNode):
        return cost.seconds(node.op, cluster)
    if isinstance(node, Select):
        return math.prod(node.shape) * itemsize(node.dtype) / cluster.copy_bandwidth
    return 0.0


def sum_seconds(node: Node, pieces: int, cluster: Cluster) -> float:
    """Kernel seconds that cutting a sum into ``pieces`` partial sums adds, all blocks together.

    An einsum cut k ways along its aggregated indices writes k output pieces, not one;
    a formation adds its block's k whole pieces up, one copy and k - 1 in-place sums:
    k times its bytes at ``copy_bandwidth`` (the simulator's charge for such a partial).
    On one core per block: Megatron's split of the attention scores along the head
    dimension at batch 1 sums 64 pieces of 512 MB on one core, 6.9 s."""
    if pieces <= 1 or not isinstance(node, EinsumNode | Formation):
        return 0.0
    out = math.prod(node.shape) * itemsize(node.dtype) / cluster.copy_bandwidth
    return pieces * out if isinstance(node, Formation) else (pieces - 1) * out


def partial_seconds(g: EinGraph, sps: Sequence, counts: Sequence[Sequence[int]], cluster: Cluster,
                    across: Sequence[Sequence[int]] | None = None) -> list[float]:
    """``sum_seconds`` and ``assembly_seconds`` of every node, given its block counts
    (``across``: of a two-level plan, the counts across machines, within ``counts``).
    Across machines, the lowering first adds a machine's pieces on one of its cores (k_c
    pieces), and the formation's block adds one piece per other machine to its own
    machine's k_c: k_c + k_m - 1 pieces."""
    out = [0.0] * len(g.nodes)
    for v, node in enumerate(g.nodes):
        u = node.inputs[0] if isinstance(node, Formation) else v
        if not isinstance(g.nodes[u], EinsumNode) or not sps[u].aggregated:
            continue
        k = math.prod(counts[u][d] for d in sps[u].aggregated)
        km = math.prod(across[u][d] for d in sps[u].aggregated) if across is not None else 1
        if u == v or km == 1:
            out[v] = sum_seconds(node, k, cluster)
        else:
            kc = k // km
            out[v] = sum_seconds(node, kc + km - 1, cluster) + sum_seconds(node, kc, cluster)
    return [a + b for a, b in zip(out, assembly_seconds(g, sps, counts, cluster, across), strict=True)]


def assembly_seconds(g: EinGraph, sps: Sequence, counts: Sequence[Sequence[int]], cluster: Cluster,
                     across: Sequence[Sequence[int]] | None = None) -> list[float]:
    """Kernel seconds each node spends assembling operand blocks, all blocks together.

    Where a reader's blocks of an operand are not its producer's blocks (another
    partition, at either level), the lowering builds each block it reads from
    pieces on the reader's core: a partial that writes the block and copies its
    pieces in, twice the block's bytes at ``copy_bandwidth``. Matching partitions
    read the producer's blocks as they are; a select reads only its slice."""
    out = [0.0] * len(g.nodes)
    for v, node in enumerate(g.nodes):
        sp = sps[v]
        if sp.kind in ("follow", "fill"):
            continue
        for k, u in enumerate(node.inputs):
            su = sps[u]
            if su.kind == "fill" or su.aggregated:
                continue
            levels = [counts] if across is None else [across, counts]
            if all(tuple(c[v][d] if d is not None else 1 for d in sp.operands[k])
                   == tuple(c[u][d] for d in su.out_dims) for c in levels):
                continue
            need = math.prod(counts[v][d] for d in sp.operands[k] if d is not None)
            read = math.prod(g.nodes[u].shape) * itemsize(g.nodes[u].dtype) / need
            if isinstance(node, Select):  # a slice reads its pieces, no more than it holds
                read = min(read, math.prod(node.shape) * itemsize(node.dtype) / need)
            out[v] += 2 * read * min(math.prod(counts[v]), need * cluster.workers) / cluster.copy_bandwidth
    return out


def critical_path(g: EinGraph, live: Sequence[bool], blocks: Sequence[int], cluster: Cluster,
                  extra: Sequence[float] | None = None) -> float:
    """The longest chain of block times through the graph: a node's blocks run side by
    side, each taking its share of the node's kernel time (plus ``extra[v]``, the
    partial sums' seconds) plus the per-task overhead.
    A chain of small whole ops cannot go faster than this, however many cores there are."""
    finish = np.zeros(len(g.nodes))
    for v, node in enumerate(g.nodes):
        if not live[v]:
            continue
        start = max((finish[u] for u in node.inputs), default=0.0)
        own = (node_seconds(node, cluster) + (extra[v] if extra is not None else 0.0)) / max(1, blocks[v])
        finish[v] = start + (own + cluster.task_overhead if own else 0.0)
    return float(finish.max()) if len(finish) else 0.0


@dataclass(frozen=True)
class Summary:
    """The figures of one placed plan."""

    flops: tuple[float, ...]  # per worker
    bytes_within: float  # moved between cores of one machine
    bytes_across: float  # moved between machines
    model_bytes: float  # the planner's own cost: bytes its cost model charges, before placement
    compute_seconds: float = 0.0  # the busiest core, or the critical path when longer
    nic_bytes: float = 0.0  # the busiest NIC, in or out
    network_seconds: float = 0.0
    memory: Memory | None = None  # the busiest machine's peak
    capacity: float = math.inf  # memory per machine
    # the step with transfers overlapping compute (plan/predict/overlap.py), where the planner replayed it
    overlapped_seconds: float | None = None
    storage_seconds: float = 0.0  # loads and stores of state kept in host storage (plan/offload.py)

    @property
    def bytes_moved(self) -> float:
        return self.bytes_within + self.bytes_across

    @property
    def imbalance(self) -> float:
        """Busiest worker over the mean; 1.0 is perfect balance."""
        mean = sum(self.flops) / len(self.flops)
        return max(self.flops) / mean if mean else 1.0

    @property
    def step_seconds(self) -> float:
        if self.overlapped_seconds is not None:
            return self.overlapped_seconds + self.storage_seconds
        return self.compute_seconds + self.network_seconds + self.storage_seconds

    @property
    def peak(self) -> float:
        return self.memory.peak if self.memory is not None else 0.0

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity

    @property
    def binding(self) -> str:
        if not self.fits:
            return "memory"
        return "NIC" if self.network_seconds > self.compute_seconds else "compute"
