"""The figures of a two-level plan, computed at two small scales instead of per core.

- Across machines: the bytes the lowering moves (``machine_edges``, one copy per
  machine: the cores of a machine share what it receives), out of the machines
  holding the producer and into those running the reader (twolevel.spread places
  the blocks). The level-1 cost model's charges (``nic_bytes``) score the search's
  candidates, where exact overlaps for every candidate would cost too much.
- Within a machine: the inner cost model's bytes for one machine, times the machines.
- Compute: every block's kernel seconds on its core (summary.node_seconds, plus the
  partial sums' and repartitions' memory work), with the block layout of
  twolevel.locations, summed per core.
- The step: the node-by-node replay of overlap.py.
So a plan for 32 × 64 workers costs blocks × 32 and blocks × 64, never × 2048.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import EinGraph, Fill, Formation, InputNode
from einsummable.plan.cost import CostModel
from einsummable.plan.predict.memory import Memory
from einsummable.plan.predict.overlap import Transfer, step_seconds
from einsummable.plan.predict.summary import (
    Summary,
    critical_path,
    dispatch_seconds,
    node_seconds,
    partial_seconds,
)
from einsummable.plan.predict.traffic import edge_cost, holders
from einsummable.plan.space import Space
from einsummable.plan.twolevel import TwoLevel, nested, rotations, spread


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


def machine_edges(g: EinGraph, sps: Sequence[Space], cm: Sequence[tuple[int, ...]], live: Sequence[bool],
                  machines: int) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """(producer, reader, bytes out of each machine, bytes into each machine) of every edge
    whose lowering crosses machines, for a two-level plan's counts across machines laid out
    as twolevel.spread lays them: the rules of this module at one worker per machine.

    A machine receives a read block once (however many blocks or readers of the same
    pieces read it there: the lowering relays it to its cores), and every machine holding
    partial sums of it sends their sum. The cost model's share in place assumes aligned
    blocks; this is the overlap the lowering finds (at 16 machines a (2, 2, 4) logits
    block read (8, 2, 1) moves bytes the share counts as in place)."""
    where = np.arange(machines)
    parts = [nested(sp.shape, c, (1,) * len(c)) for sp, c in zip(sps, cm, strict=True)]
    locs = [spread(p.num_blocks, machines) for p in parts]
    cache: dict[tuple, tuple] = {}  # the layers of a model repeat their edges
    got: dict[tuple[int, object], set[int]] = {}
    out = []
    for v, node in enumerate(g.nodes):
        if not live[v] or not any(math.prod(c) > 1 for c in (cm[v], *(cm[u] for u in node.inputs))):
            continue
        if isinstance(node, Formation) and not sps[node.inputs[0]].aggregated:
            continue
        for k, u in enumerate(node.inputs):
            src = g.nodes[u]
            if isinstance(src, Fill):
                continue
            key = (type(node), getattr(node, "pieces", None), sps[v], cm[v], k, sps[u], cm[u], src.shape,
                   src.dtype)
            if key not in cache:
                cache[key] = _moves(g, v, k, sps, parts, locs, where)
            tag, pairs, pos, sender, nbytes = cache[key]
            seen = got.setdefault((u, tag), set())
            fresh = np.array([p not in seen for p in pairs.tolist()], dtype=bool)
            seen.update(pairs.tolist())
            keep = fresh[pos]
            if not keep.any():
                continue
            dst = (pairs % machines)[pos[keep]]
            out.append((u, v, np.bincount(sender[keep], weights=nbytes[keep], minlength=machines),
                        np.bincount(dst, weights=nbytes[keep], minlength=machines)))
    return out


def _moves(g: EinGraph, v: int, k: int, sps: Sequence[Space], parts: list, locs: list,
           where: np.ndarray) -> tuple:
    """Operand k of node v: the read-block tag, its (read block, machine) pairs, and for each
    piece that crosses: its pair, the sending machine and its bytes."""
    machines = len(where)
    u = g.nodes[v].inputs[k]
    held = holders(sps[u], parts[u], tuple(int(x) for x in locs[u]))
    ec = edge_cost(g, v, k, sps[v], parts[v], held, where)
    pairs = np.unique(ec.key * machines + locs[v])
    r, dst = pairs // machines, pairs % machines
    codes, nbytes = ec.on_worker  # (read block * machines + holder machine, bytes), sorted
    lo = np.searchsorted(codes, r * machines)
    n = np.searchsorted(codes, r * machines + machines) - lo
    pos = np.repeat(np.arange(len(r)), n)
    idx = np.repeat(lo, n) + np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    sender = codes[idx] % machines
    moved = sender != dst[pos]
    return ec.tag, pairs, pos[moved], sender[moved], nbytes[idx][moved]


def core_seconds(g: EinGraph, sps: Sequence[Space], tl: TwoLevel, cluster: Cluster,
                 live: Sequence[bool], extra: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """[machines, cores] kernel seconds and flops of the blocks each core runs; ``extra``: the
    partial sums' seconds per node (summary.partial_seconds)."""
    secs = np.zeros((cluster.machines, cluster.cores))
    flops = np.zeros((cluster.machines, cluster.cores))
    for v, (node, rot) in enumerate(zip(g.nodes, rotations(g, tl, cluster.cores), strict=True)):
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
        compute_seconds=max(float(secs.max()), dispatch_seconds(g, live, blocks, cluster),  # busiest machine
                            critical_path(g, live, [math.prod(c) for c in counts], cluster, extra)),
        nic_bytes=busiest,
        network_seconds=busiest / cluster.bandwidth_across,
        memory=memory,
        capacity=cluster.memory_per_machine,
        overlapped_seconds=step,
    )
