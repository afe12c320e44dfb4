"""Two-level EinDecomp: decompose across machines, then each machine's blocks across its cores.

docs/design.md §5, "Two levels in practice". A node's partition is the product of two
count vectors: ``cm`` (blocks across machines) and ``cc`` (blocks of one machine's
block across its cores), laid out nested, so every fine block lies inside one
machine block and runs on that machine.

1. Across machines: the cost model of cost.py over the machine view of the
   cluster (one worker per machine with the machine's flop rate); its bytes are
   the bytes that cross NICs. Every op takes about ``machines`` blocks, so compute
   is balanced and the total is the busiest NIC's share times the machine count.
   Formations of partial sums choose their own partition here (a reduce-scatter),
   so sharded gradients can emerge.
2. Memory: the plan must fit ``memory_per_machine`` (memory.py). When it does not,
   each node's candidates pay ``penalty × its lifetime share × its bytes per
   machine`` and level 1 is solved again with a penalty sixteen times larger, so the
   long-lived state (parameters, optimizer state, gradients, saved activations)
   is sharded across machines first: ZeRO/FSDP emerges from the partitions.
   When even the largest penalty does not fit, PlanError names the smallest peak.
3. Within a machine: the same search over one machine block of every node
   (shapes divided by ``cm``) for p = cores; a replica or partial sum inside a
   machine is memory traffic, so these bytes only order the choices.

Block b of a node runs on machine ``spread(flat(machine coordinates))`` and core
``(flat(core coordinates) + r) % cores``, where r rotates ops with fewer blocks
than cores over the cores so that small ops do not all queue on core 0, except a join or a
reduction laid out as its input, which stays on its input's cores (``rotations``). ``spread``
lays a node's n <= machines blocks out evenly (block b on machine b·machines // n):
with machine coordinates row-major, a node with fewer blocks then sits on the
machines holding the matching blocks of its neighbours, as the cost model's "share
already in place" assumes. (``b % machines`` put the 8 batch blocks of a select on
machines 0..7 while their producer's (batch, sequence) blocks sat on 2b and 2b + 1:
at 16 machines the lowering moved 40% more bytes than the model charged.)
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from einsummable.errors import PlanMemoryError
from einsummable.hardware.cluster import Cluster
from einsummable.ir import kinds
from einsummable.ir.graph import EinGraph, EinsumNode, Formation, InputNode
from einsummable.plan import baselines, eindecomp
from einsummable.plan.cost import CostModel, op_targets
from einsummable.plan.partition import Partition, split
from einsummable.plan.predict.memory import Memory, estimate, gib, holds_nothing, lifetimes
from einsummable.plan.predict.traffic import block_indices
from einsummable.plan.space import Space, nbytes

Counts = tuple[int, ...]
PENALTIES = (0.0, *(16.0**k for k in range(7)))


@dataclass(frozen=True)
class TwoLevel:
    """Block counts per node across machines and within a machine."""

    cm: tuple[Counts, ...]
    cc: tuple[Counts, ...]

    def counts(self, v: int) -> Counts:
        return tuple(a * b for a, b in zip(self.cm[v], self.cc[v], strict=True))


def machine_view(cluster: Cluster) -> Cluster:
    """The cluster seen from above: one worker per machine, a machine's flops, the network."""
    return replace(cluster, machines=1, cores=cluster.machines,
                   flops_per_core=cluster.flops_per_core * cluster.cores,
                   elementwise_flops_per_core=cluster.elementwise_flops_per_core * cluster.cores,
                   bandwidth_within=cluster.bandwidth_across)


def outer_spaces(g: EinGraph, sps: Sequence[Space]) -> tuple[Space, ...]:
    """Spaces for level 1: a formation of partial sums may take any partition."""
    out = []
    for node, sp in zip(g.nodes, sps, strict=True):
        if isinstance(node, Formation) and sps[node.inputs[0]].aggregated:
            sp = replace(sp, kind="data")
        out.append(sp)
    return tuple(out)


def inner(g: EinGraph, sps: Sequence[Space], cm: Sequence[Counts]) -> tuple[tuple[Space, ...], list[float]]:
    """One machine block of every node: its space and its output bytes."""
    out, size = [], []
    for node, sp, c in zip(g.nodes, sps, cm, strict=True):
        shape = tuple(n // k for n, k in zip(sp.shape, c, strict=True))
        out.append(replace(sp, shape=shape, flops=sp.flops // math.prod(c)))
        size.append(nbytes(node) / math.prod(c[d] for d in sp.out_dims))
    return tuple(out), size


def nested(shape: Sequence[int], cm: Counts, cc: Counts) -> Partition:
    """``cm`` near-equal blocks per dimension, each cut into ``cc`` near-equal blocks."""
    return Partition(tuple(_nested(n, a, b) for n, a, b in zip(shape, cm, cc, strict=True)))


@functools.lru_cache(maxsize=65536)
def _nested(n: int, a: int, b: int) -> tuple[int, ...]:
    if not n:
        return (0, 0)
    cuts = [0]
    for lo, hi in itertools.pairwise(split(n, a)):
        cuts.extend(lo + x for x in split(hi - lo, b)[1:])
    return tuple(cuts)


def rotations(g: EinGraph, tl: TwoLevel, cores: int) -> list[int]:
    """The first core of each node's blocks. An op with fewer blocks than cores takes a turn, so
    small ops do not all queue on core 0, unless it is an elementwise join of a GEMM's or a
    reduction's block laid out as it is (the same blocks per machine and per core): it stays on
    that producer's cores (the last such, as lower/fusion.py takes the last partner), so that it
    reads no move and fuses with it. Rotating every small op put each of a 2 x 2 Llama step's ops
    on the other core from its producer: 294 moves in 519 tasks and not one fused pair."""
    out, r = [], 0
    for v, (node, cc) in enumerate(zip(g.nodes, tl.cc, strict=True)):
        n = math.prod(cc)
        if n >= cores:
            out.append(0)
            continue
        laid = [u for u in node.inputs
                if math.prod(tl.cc[u]) == n and math.prod(tl.cm[u]) == math.prod(tl.cm[v])]
        if isinstance(node, Formation):  # the sum of a block's partials, or the block itself: where it is
            partners = laid
        elif isinstance(node, EinsumNode) and node.op.agg is None:
            partners = [u for u in laid if _partner(g, u)]
        else:
            partners = []
        if partners:
            out.append(out[partners[-1]])
            continue
        out.append(r)
        r = (r + n) % cores
    return out


def _partner(g: EinGraph, u: int) -> bool:
    """Whether an elementwise reader of node u may fuse with the op that makes it (through its
    formation): a GEMM, or a reduction."""
    while isinstance(g.nodes[u], Formation):
        u = g.nodes[u].inputs[0]
    node = g.nodes[u]
    return isinstance(node, EinsumNode) and (kinds.is_gemm(node.op) or node.op.agg is not None)


def spread(blocks: int, machines: int) -> np.ndarray:
    """The machine of each of a node's ``blocks`` machine-level blocks (see the module docstring)."""
    b = np.arange(blocks, dtype=np.int64)
    return b * machines // blocks if blocks <= machines else b % machines


def locations(tl: TwoLevel, v: int, cluster: Cluster, rotation: int) -> np.ndarray:
    """The worker of each block of node v, machine-major."""
    cm, cc = tl.cm[v], tl.cc[v]
    idx = block_indices(tl.counts(v))
    m = np.zeros(len(idx), dtype=np.int64)
    c = np.zeros(len(idx), dtype=np.int64)
    for d, (a, b) in enumerate(zip(cm, cc, strict=True)):
        m = m * a + idx[:, d] // b
        c = c * b + idx[:, d] % b
    return spread(math.prod(cm), cluster.machines)[m] * cluster.cores + (c + rotation) % cluster.cores


def _picks(model: CostModel, picks: Sequence[int]) -> list[Counts]:
    return [tuple(int(x) for x in model.cands[v][c]) for v, c in enumerate(picks)]


def solve(g: EinGraph, outer: Sequence[Space], model: CostModel, cluster: Cluster, live: Sequence[bool],
          score: Callable[[list[Counts]], float], seeds: Sequence[Sequence[Counts]] = (),
          check_memory: bool = True) -> tuple[TwoLevel, Memory]:
    """The two-level plan and its memory estimate; ``model`` is the level-1 cost model."""
    cm, memory = fit(g, outer, model, cluster, live, score, seeds, check_memory)
    isps, isize = inner(g, outer, cm)
    inner_model = CostModel(g, isps, cluster.cores, cluster, live, node_bytes=isize)
    cc = _picks(inner_model, eindecomp.solve(g, inner_model, live))
    return TwoLevel(tuple(cm), tuple(cc)), memory


def fit(g: EinGraph, outer: Sequence[Space], model: CostModel, cluster: Cluster, live: Sequence[bool],
        score: Callable[[list[Counts]], float], seeds: Sequence[Sequence[Counts]],
        check_memory: bool) -> tuple[list[Counts], Memory]:
    """Level 1 under the memory bound, searched from several starts.

    The search starts from scratch and from each seed (the experts' layouts across
    machines): block coordinate descent from a seed never costs more than the seed
    on the model. The model charges every reader its own copy, which the lowering
    shares, so the seeds themselves stay in the running: of all these plans that
    fit, the one with the lowest ``score`` (the busiest NIC's bytes, counted with
    shared copies) wins. When none fits, the penalty on long-lived bytes per machine
    rises and the search runs again.
    """
    base = model.unary
    life = lifetimes(g, outer, live)
    starts = [None, *(_indices(model, seed) for seed in seeds)]
    best: tuple[list[Counts], Memory] | None = None
    try:
        for penalty in PENALTIES:
            if penalty:
                model.unary = [u + penalty * life[v] * _per_machine(g, outer, model, v)
                               for v, u in enumerate(base)]
            fits: list[tuple[float, list[Counts], Memory]] = []
            found = [_picks(model, eindecomp.solve(g, model, live, start)) for start in starts]
            for cm in [*found, *(list(seed) for seed in seeds)]:
                memory = estimate(g, outer, cm, live, budget=cluster.memory_per_machine)
                if best is None or memory.peak < best[1].peak:
                    best = (cm, memory)
                if memory.peak <= cluster.memory_per_machine or not check_memory:
                    fits.append((score(cm), cm, memory))
            if fits:
                _, cm, memory = min(fits, key=lambda f: f[0])
                return cm, memory
    finally:
        model.unary = base
    assert best is not None
    raise PlanMemoryError(
        f"no plan fits {gib(cluster.memory_per_machine)} GiB per machine on {cluster}: the smallest "
        f"peak found is {best[1].describe()}; add machines or memory, or rematerialise activations", best[1])


def _indices(model: CostModel, counts: Sequence[Counts]) -> list[int]:
    """The candidate index of each node's counts (-1 where they are not a candidate)."""
    out = []
    for v, c in enumerate(counts):
        hit = np.flatnonzero((model.cands[v] == np.array(c)).all(axis=1))
        out.append(int(hit[0]) if len(hit) else -1)
    return out


def expert(name: str, g: EinGraph, sps: Sequence[Space], outer: Sequence[Space], live: Sequence[bool],
           cluster: Cluster) -> TwoLevel:
    """A baseline's two-level counts: across machines, then within each machine's blocks."""
    cm = expert_across(name, g, outer, live, cluster)
    isps, isize = inner(g, outer, cm)
    inner_targets = op_targets(g, isps, cluster.cores, cluster, isize)
    cc = baselines.level(name, g, isps, live, inner_targets, baselines.data_dims(g, isps), [False] * len(sps),
                         across=False)
    return TwoLevel(tuple(cm), tuple(cc))


def expert_across(name: str, g: EinGraph, outer: Sequence[Space], live: Sequence[bool],
                  cluster: Cluster) -> list[Counts]:
    """A baseline's counts across machines."""
    size = [float(nbytes(n)) for n in g.nodes]
    data = baselines.data_dims(g, outer)
    batch = baselines.batch_dims(g, outer)
    first = baselines.data_input(g, baselines.dim_classes(g, outer))
    # parameters and optimizer state, and the gradients: sums over the batch
    state = [
        (isinstance(node, InputNode) and v != first and math.prod(node.shape) >= cluster.machines)
        or (sp.kind == "data" and isinstance(node, Formation)
            and batch[node.inputs[0]] in outer[node.inputs[0]].aggregated)
        for v, (node, sp) in enumerate(zip(g.nodes, outer, strict=True))
    ]
    targets = op_targets(g, outer, cluster.machines, machine_view(cluster), size)
    targets = [cluster.machines if state[v] else t for v, t in enumerate(targets)]
    return baselines.level(name, g, outer, live, targets, data, state, across=True)


def _per_machine(g: EinGraph, sps: Sequence[Space], model: CostModel, v: int) -> np.ndarray:
    """[candidates]: bytes of node v's output on one machine."""
    sp = sps[v]
    cands = model.cands[v]
    if holds_nothing(g, sps, v):
        return np.zeros(len(cands))
    if not sp.out_dims:
        return np.full(len(cands), float(nbytes(g.nodes[v])))
    return nbytes(g.nodes[v]) / np.prod(cands[:, list(sp.out_dims)], axis=1)
