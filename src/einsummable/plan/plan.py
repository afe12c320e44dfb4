"""The Plan: a partition of every node's space and a worker for every block.

``build(graph, cluster, parts)`` places given partitions; planners only choose the
partitions. A Plan prints as the report of ``program.plan`` (see report.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from einsummable.errors import PlanError
from einsummable.hardware.cluster import Cluster
from einsummable.ir import priority
from einsummable.ir.graph import EinGraph, Formation
from einsummable.plan.partition import Partition
from einsummable.plan.placement import place
from einsummable.plan.predict.memory import formed_in_place, gathered, holds_nothing, peak
from einsummable.plan.predict.summary import Summary, critical_path, dispatch_seconds, partial_seconds
from einsummable.plan.predict.traffic import block_indices
from einsummable.plan.space import Space, nbytes, spaces

if TYPE_CHECKING:
    from einsummable.plan.offload import Offload
    from einsummable.plan.remat import Remat
    from einsummable.plan.twolevel import TwoLevel


@dataclass(frozen=True, eq=False)
class Plan:
    """``where(v)`` gives the worker of each block of node v; ``others`` plans the
    baselines for the report, only when the report asks for them."""

    graph: EinGraph
    cluster: Cluster
    planner: str
    spaces: tuple[Space, ...]
    parts: tuple[Partition, ...]
    summary: Summary
    where: Callable[[int], Sequence[int]] = field(repr=False)
    others: Callable[[], tuple[tuple[str, Summary], ...]] | None = field(default=None, repr=False)
    free_formations: bool = False  # see check_plan
    levels: TwoLevel | None = None  # a two-level plan's counts across machines and within one
    remat: Remat | None = None  # what recomputation did to ``graph`` to make it fit (plan/remat.py)
    offload: Offload | None = None  # the inputs kept in host storage to make it fit (plan/offload.py)

    @functools.cached_property
    def locs(self) -> tuple[tuple[int, ...], ...]:
        """The worker of every block, per node (built on first use: 2048 workers make millions)."""
        return tuple(tuple(int(w) for w in self.where(v)) for v in range(len(self.graph.nodes)))

    @functools.cached_property
    def baselines(self) -> tuple[tuple[str, Summary], ...]:
        return self.others() if self.others is not None else ()

    @property
    def order(self) -> str:
        """The engines' order of ready work this plan's memory figure assumes (ir/priority.py)."""
        memory = self.summary.memory
        return memory.order if memory is not None else priority.CRITICAL_PATH

    def out_partition(self, nid: int) -> Partition:
        return self.parts[nid].restrict(self.spaces[nid].out_dims)

    def validate(self) -> None:
        check_plan(self.graph, self.spaces, self.parts, self.cluster, self.locs, self.free_formations)

    def __str__(self) -> str:
        from einsummable.plan.report import render

        return render(self)


def inherit(g: EinGraph, sps: Sequence[Space], parts: Sequence[Partition]) -> tuple[Partition, ...]:
    """Give every formation its input's output partition (formations do not choose)."""
    out = list(parts)
    for nid, node in enumerate(g.nodes):
        if isinstance(node, Formation):
            u = node.inputs[0]
            out[nid] = out[u].restrict(sps[u].out_dims)
    return tuple(out)


def build(
    g: EinGraph,
    cluster: Cluster,
    parts: Sequence[Partition],
    planner: str = "given",
    model_bytes: float = 0.0,
    sps: Sequence[Space] | None = None,
    live: Sequence[bool] | None = None,
) -> Plan:
    """Place ``parts`` and sum the plan up; ``sps`` and ``live``, when the planner has
    them already, are ``spaces(g)`` and ``g.live()``, not worked out again."""
    sps = tuple(sps) if sps is not None else spaces(g)
    live = list(live) if live is not None else g.live()
    parts = inherit(g, sps, parts)
    check_plan(g, sps, parts, cluster)
    placed = place(g, sps, parts, cluster, live, partial_seconds(g, sps, [p.counts for p in parts], cluster))
    check_locs(g, parts, cluster, placed.locs)  # the partitions were checked above
    held = np.zeros((len(g.nodes), cluster.machines))
    counts = [p.counts for p in parts]
    for v, node in enumerate(g.nodes):
        if not holds_nothing(g, sps, v) and not formed_in_place(g, sps, counts, v):
            sizes = nbytes(node) * _out_share(sps[v], parts[v])
            np.add.at(held[v], np.array(placed.locs[v], dtype=np.int64) // cluster.cores, sizes)
    ones = [(1,) * len(c) for c in counts]  # one machine's view: its copies are within it
    # one worker runs its tasks one at a time, in id order (engines/scheduler.py): the program's
    budget = cluster.memory_per_machine if cluster.workers > 1 else 0.0
    memory = peak(g, sps, live, held, gathered(g, sps, ones, live, counts, cluster.cores), budget)
    nic = float(placed.nic_in.max())
    extra = partial_seconds(g, sps, [p.counts for p in parts], cluster)
    per_machine = np.zeros((len(g.nodes), cluster.machines), dtype=np.int64)
    for v in range(len(g.nodes)):
        np.add.at(per_machine[v], np.asarray(placed.locs[v], dtype=np.int64) // cluster.cores, 1)
    busiest = per_machine[:, int(np.argmax(per_machine.sum(axis=0)))]
    compute = max(float(placed.seconds.max()), dispatch_seconds(g, live, busiest, cluster),
                  critical_path(g, live, [p.num_blocks for p in parts], cluster, extra))
    summary = Summary(placed.flops, placed.within, placed.across, model_bytes, compute,
                      nic, nic / cluster.bandwidth_across, memory, cluster.memory_per_machine)
    return Plan(g, cluster, planner, sps, parts, summary, placed.locs.__getitem__)


def _out_share(sp: Space, part: Partition) -> np.ndarray:
    """The share of the output each join block writes (a piece of it, for partial sums)."""
    idx = block_indices(part.counts)
    share = np.ones(part.num_blocks)
    for d in sp.out_dims:
        n = part.bounds[d][-1]
        share = share * (np.diff(np.array(part.bounds[d]))[idx[:, d]] / n if n else 1.0)
    return share


def check_plan(
    g: EinGraph,
    sps: Sequence[Space],
    parts: Sequence[Partition],
    cluster: Cluster,
    locs: Sequence[tuple[int, ...]] | None = None,
    free_formations: bool = False,
) -> None:
    """Every node has a partition of its own space, cutting only what it may cut.

    ``free_formations``: a formation of partial sums may take another partition than
    its einsum's output; its blocks then gather and add the pieces they overlap (a
    reduce-scatter when it is finer). Two-level plans shard gradients this way.
    """
    if len(parts) != len(g.nodes):
        raise PlanError(f"a plan needs one partition per node: {len(parts)} for {len(g.nodes)} nodes")
    for nid, (node, sp, part) in enumerate(zip(g.nodes, sps, parts, strict=True)):
        where = f"%{nid} ({node.describe()})"
        if part.shape != sp.shape:
            raise PlanError(f"{where}: partition of shape {part.shape}, its space is {sp.shape}")
        for d, (c, ok) in enumerate(zip(part.counts, sp.splittable, strict=True)):
            if c > 1 and not ok:
                raise PlanError(f"{where}: dimension {d} cannot be split, given {c} blocks")
        if isinstance(node, Formation) and not (free_formations and sps[node.inputs[0]].aggregated):
            src = node.inputs[0]
            if part != parts[src].restrict(sps[src].out_dims):
                raise PlanError(f"{where}: a formation must keep the output partition of %{src}")
    if locs is not None:
        check_locs(g, parts, cluster, locs)


def check_locs(g: EinGraph, parts: Sequence[Partition], cluster: Cluster,
               locs: Sequence[tuple[int, ...]]) -> None:
    """Every block of every node has one worker, and that worker exists."""
    for nid, (node, part) in enumerate(zip(g.nodes, parts, strict=True)):
        where = f"%{nid} ({node.describe()})"
        if len(locs[nid]) != part.num_blocks:
            raise PlanError(f"{where}: {part.num_blocks} blocks but {len(locs[nid])} locations")
        bad = [w for w in locs[nid] if not 0 <= w < cluster.workers]
        if bad:
            raise PlanError(f"{where}: locations {bad} outside 0..{cluster.workers - 1}")
