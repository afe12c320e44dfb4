"""Planners by name, and ``make_plan``: choose partitions, place them, compare baselines.

    plan = make_plan(graph, Cluster.local(8))           # EinDecomp, with baselines
    plan = make_plan(graph, Cluster.local(8), "data_parallel", compare=False)
    print(plan)                                          # the report
"""

from __future__ import annotations

from collections.abc import Sequence

from einsummable.errors import PlanError
from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import EinGraph
from einsummable.plan import baselines, eindecomp
from einsummable.plan.cost import CostModel
from einsummable.plan.partition import Partition
from einsummable.plan.plan import Plan, build
from einsummable.plan.space import Space, spaces

Counts = tuple[int, ...]
PLANNERS = ("eindecomp", *baselines.BASELINES)


def choose(
    name: str, g: EinGraph, sps: Sequence[Space], model: CostModel, live: Sequence[bool]
) -> list[Counts]:
    """Block counts per node from the named planner."""
    if name == "eindecomp":
        picks = eindecomp.solve(g, model, live)
        return [tuple(int(x) for x in model.cands[v][c]) for v, c in enumerate(picks)]
    if name in baselines.BASELINES:
        return baselines.baseline(name, g, sps, live, model.targets)
    raise PlanError(f"unknown planner {name!r}; expected one of {list(PLANNERS)}")


def partitions(sps: Sequence[Space], counts: Sequence[Counts]) -> list[Partition]:
    return [Partition.uniform(sp.shape, c) for sp, c in zip(sps, counts, strict=True)]


def make_plan(g: EinGraph, cluster: Cluster, planner: str = "eindecomp", compare: bool = True) -> Plan:
    """Plan with ``planner``; with ``compare``, also place every baseline for the report."""
    if planner not in PLANNERS:
        raise PlanError(f"unknown planner {planner!r}; expected one of {list(PLANNERS)}")
    sps = spaces(g)
    live = g.live()
    model = CostModel(g, sps, cluster.workers, cluster, live)
    counts = choose(planner, g, sps, model, live)
    plan = build(g, cluster, partitions(sps, counts), planner, model.evaluate(counts, live))
    if not compare:
        return plan
    others = []
    for name in PLANNERS:
        if name == planner:
            continue
        c = choose(name, g, sps, model, live)
        other = build(g, cluster, partitions(sps, c), name, model.evaluate(c, live))
        others.append((name, other.summary))
    return Plan(g, cluster, planner, plan.spaces, plan.parts, plan.locs, plan.summary, tuple(others))
