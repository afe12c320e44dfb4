"""The Plan: a partition of every node's space and a worker for every block.

``build(graph, cluster, parts)`` places given partitions; planners only choose the
partitions. A Plan prints as the report of ``program.plan`` (see report.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from einsummable.errors import PlanError
from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import EinGraph, Formation
from einsummable.plan.partition import Partition
from einsummable.plan.placement import Summary, place
from einsummable.plan.space import Space, spaces


@dataclass(frozen=True, eq=False)
class Plan:
    graph: EinGraph
    cluster: Cluster
    planner: str
    spaces: tuple[Space, ...]
    parts: tuple[Partition, ...]
    locs: tuple[tuple[int, ...], ...]
    summary: Summary
    baselines: tuple[tuple[str, Summary], ...] = field(default=())

    def out_partition(self, nid: int) -> Partition:
        return self.parts[nid].restrict(self.spaces[nid].out_dims)

    def validate(self) -> None:
        check_plan(self.graph, self.spaces, self.parts, self.cluster, self.locs)

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
) -> Plan:
    sps = spaces(g)
    parts = inherit(g, sps, parts)
    check_plan(g, sps, parts, cluster)
    live = g.live()
    locs, flops, within, across = place(g, sps, parts, cluster, live)
    summary = Summary(flops, within, across, model_bytes)
    plan = Plan(g, cluster, planner, sps, parts, locs, summary)
    check_plan(g, sps, parts, cluster, locs)
    return plan


def check_plan(
    g: EinGraph,
    sps: Sequence[Space],
    parts: Sequence[Partition],
    cluster: Cluster,
    locs: Sequence[tuple[int, ...]] | None = None,
) -> None:
    """Every node has a partition of its own space, cutting only what it may cut."""
    if len(parts) != len(g.nodes):
        raise PlanError(f"a plan needs one partition per node: {len(parts)} for {len(g.nodes)} nodes")
    for nid, (node, sp, part) in enumerate(zip(g.nodes, sps, parts, strict=True)):
        where = f"%{nid} ({node.describe()})"
        if part.shape != sp.shape:
            raise PlanError(f"{where}: partition of shape {part.shape}, its space is {sp.shape}")
        for d, (c, ok) in enumerate(zip(part.counts, sp.splittable, strict=True)):
            if c > 1 and not ok:
                raise PlanError(f"{where}: dimension {d} cannot be split, given {c} blocks")
        if isinstance(node, Formation):
            src = node.inputs[0]
            if part != parts[src].restrict(sps[src].out_dims):
                raise PlanError(f"{where}: a formation must keep the output partition of %{src}")
        if locs is not None:
            if len(locs[nid]) != part.num_blocks:
                raise PlanError(f"{where}: {part.num_blocks} blocks but {len(locs[nid])} locations")
            bad = [w for w in locs[nid] if not 0 <= w < cluster.workers]
            if bad:
                raise PlanError(f"{where}: locations {bad} outside 0..{cluster.workers - 1}")
