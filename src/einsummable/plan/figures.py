"""The figures of a two-level plan, computed at two small scales instead of per core.

- Across machines: the bytes of the level-1 cost model (cost.py over the machines,
  one copy per machine: the cores of a machine share what it receives), each
  charged to the NIC out of the machines holding the producer and the NIC in of the
  machines running the reader (twolevel.spread places the blocks).
- Within a machine: the inner cost model's bytes for one machine, times the machines.
- Compute: every block's kernel seconds on its core (summary.node_seconds), with
  the block layout of twolevel.locations, summed per core.
So a plan for 32 × 64 workers costs blocks × 32 and blocks × 64, never × 2048.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import EinGraph, Fill, Formation, InputNode
from einsummable.plan.cost import CostModel
from einsummable.plan.memory import Memory
from einsummable.plan.overlap import Transfer, step_seconds
from einsummable.plan.space import Space
from einsummable.plan.summary import Summary, critical_path, node_seconds, partial_seconds
from einsummable.plan.traffic import machine_edges
from einsummable.plan.twolevel import TwoLevel, rotations, spread


def nic_bytes(g: EinGraph, model: CostModel, cm: Sequence[tuple[int, ...]], live: Sequence[bool],
              machines: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes into and out of each machine's NIC: every charge of ``charges`` leaves the
    machines that hold the producer's blocks and enters those that run the reader's, evenly."""
    nic_in, nic_out = np.zeros(machines), np.zeros(machines)
    where = [spread(math.prod(c), machines) for c in cm]
    for src, dst, nbytes in charges(g, model, cm, live):
        np.add.at(nic_out, where[src], nbytes / len(where[src]))
        np.add.at(nic_in, where[dst], nbytes / len(where[dst]))
    return nic_in, nic_out


def charges(g: EinGraph, model: CostModel, cm: Sequence[tuple[int, ...]],
            live: Sequence[bool]) -> list[tuple[int, int, float]]:
    """(producer, reader, bytes) of every transfer across machines; a partial sum sent to its
    formation is (node, node, bytes).

    The bytes are those of the level-1 cost model (``gather_once``: c copies of an
    operand, a share f in place, receive ``|X| max(c (1 - f), c - 1)``), except that
    readers needing the same pieces in the same way receive them once (a machine
    keeps what it received, as the lowering does), and that partial sums across
    machines send ``(k - 1) |out|`` whatever partition their formation takes (a
    reduce-scatter moves no more than a reduce).

    A machine receives each piece once and sends one partial sum (its cores share
    memory); the lowering does the same, relaying pieces and summing partials inside
    a machine."""
    out = []
    at = [model.index(v, c) for v, c in enumerate(cm)]
    seen: set[tuple] = set()
    for v, node in enumerate(g.nodes):
        if not live[v]:
            continue
        sp = model.spaces[v]
        n = math.prod(cm[v])
        for k, u in enumerate(node.inputs):
            if isinstance(g.nodes[u], Fill) or sp.kind == "follow":
                continue
            if isinstance(node, Formation) and math.prod(cm[u][d] for d in model.spaces[u].aggregated) > 1:
                continue
            need = tuple(cm[v][d] if d is not None else 1 for d in sp.operands[k])
            copies = n // math.prod(need)
            if (u, need, copies) not in seen:
                seen.add((u, need, copies))
                out.append((u, v, model.edge_at(u, v, k, cm, at)))
        if sp.aggregated:
            out.append((v, v, model.bytes[v] * (math.prod(cm[v][d] for d in sp.aggregated) - 1.0)))
    return [c for c in out if c[2] > 0]


def core_seconds(g: EinGraph, sps: Sequence[Space], tl: TwoLevel, cluster: Cluster,
                 live: Sequence[bool], extra: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """[machines, cores] kernel seconds and flops of the blocks each core runs; ``extra``: the
    partial sums' seconds per node (summary.partial_seconds)."""
    secs = np.zeros((cluster.machines, cluster.cores))
    flops = np.zeros((cluster.machines, cluster.cores))
    for v, (node, rot) in enumerate(zip(g.nodes, rotations(tl, cluster.cores), strict=True)):
        if not live[v] or isinstance(node, InputNode | Fill):
            continue
        nm, nc = math.prod(tl.cm[v]), math.prod(tl.cc[v])
        rows = spread(nm, cluster.machines)
        cols = (rot + np.arange(nc)) % cluster.cores
        cell = np.ix_(rows, cols)
        np.add.at(secs, cell, (node_seconds(node, cluster) + extra[v]) / (nm * nc) + cluster.task_overhead)
        np.add.at(flops, cell, sps[v].flops / (nm * nc))
    return secs, flops


def summarise(g: EinGraph, sps: Sequence[Space], model: CostModel, tl: TwoLevel, cluster: Cluster,
              live: Sequence[bool], memory: Memory, model_bytes: float, within: float) -> Summary:
    """``model``: the level-1 cost model (over the machines)."""
    edges = machine_edges(g, sps, tl.cm, live, cluster.machines)
    nic_out = sum((e[2] for e in edges), np.zeros(cluster.machines))
    nic_in = sum((e[3] for e in edges), np.zeros(cluster.machines))
    busiest = float(max(nic_in.max(), nic_out.max()))
    counts = [tl.counts(v) for v in range(len(g.nodes))]
    extra = partial_seconds(g, sps, counts, cluster, tl.cm)
    secs, flops = core_seconds(g, sps, tl, cluster, live, extra)
    blocks = [math.prod(tl.cc[v]) * -(-math.prod(tl.cm[v]) // cluster.machines) for v in range(len(g.nodes))]
    block = [(node_seconds(node, cluster) + extra[v]) / math.prod(counts[v]) + cluster.task_overhead
             for v, node in enumerate(g.nodes)]
    # each edge on the machine it loads most; scaled so that they add up to the busiest NIC
    peaks = [float(max(sent.max(), came.max())) for _, _, sent, came in edges]
    scale = busiest / sum(peaks) if peaks else 1.0
    moves = [Transfer(u, v, p * scale) for (u, v, _, _), p in zip(edges, peaks, strict=True)]
    step = step_seconds(g, live, block, blocks, moves, cluster)
    return Summary(
        flops=tuple(float(f) for f in flops.ravel()),
        bytes_within=within,
        bytes_across=float(nic_in.sum()),
        model_bytes=model_bytes,
        compute_seconds=max(float(secs.max()), critical_path(g, live, [math.prod(c) for c in counts], cluster,
                                                             extra)),
        nic_bytes=busiest,
        network_seconds=busiest / cluster.bandwidth_across,
        memory=memory,
        capacity=cluster.memory_per_machine,
        overlapped_seconds=step,
    )
