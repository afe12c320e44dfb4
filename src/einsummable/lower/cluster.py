"""The cluster-level TaskGraph: one task per machine-level block, moves between machines.

A two-level plan cuts every node into ``cm`` blocks across machines, each cut
again into ``cc`` blocks across that machine's cores (plan/twolevel.py). Lowering
the core-level plan of 32 machines × 64 cores makes tens of millions of tasks;
this lowers the machine-level plan instead: the same nodes cut by ``cm`` only,
block b on machine ``flat(machine coordinates) % machines``, with the cluster
seen as machines of one worker each. Every move in it crosses a NIC, and crosses
once per machine (a machine's cores share what it receives).

Each task keeps ``split``: how many core-level blocks its machine cuts it into
(``prod(cc)`` of its node for an apply; 0 where the task has no node, meaning
"spread over all the machine's cores"). The simulator (engines/simulate_cluster.py)
costs a task on its machine from that, with the cores' rates, as the planner's
two-level cost does, so nobody builds the core-level graph.

    cg = cluster_graph(plan)          # plan from make_plan(g, Cluster(machines=32, cores=64))
    len(cg.tg), cg.core_blocks        # tasks at the machine level, blocks at the core level
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import Fill, Formation
from einsummable.lower.lowering import lower
from einsummable.lower.taskgraph import ApplyTask, TaskGraph
from einsummable.plan.partition import Partition
from einsummable.plan.plan import Plan
from einsummable.plan.planners import formations_follow
from einsummable.plan.summary import partial_seconds
from einsummable.plan.twolevel import TwoLevel, locations, nested

Counts = tuple[int, ...]


@dataclass(frozen=True, eq=False)
class ClusterGraph:
    """A TaskGraph over machines (``tg.workers == cluster.machines``, one worker each)."""

    tg: TaskGraph
    cluster: Cluster  # the real cluster: machines × cores
    split: np.ndarray  # [tasks] core-level blocks of each task (0: spread over all cores)
    core_blocks: int  # blocks of the core-level plan (its apply, input and partial tasks, before moves)
    # [tasks] seconds of one core that the task's core blocks spend adding partial sums and assembling
    # repartitioned operands inside the machine (summary.partial_seconds), all its core blocks together
    within: np.ndarray | None = None


def levels(plan: Plan) -> TwoLevel:
    """The plan's counts across machines and within one; a one-machine plan is all within."""
    if plan.levels is not None:
        return plan.levels
    cc = tuple(p.counts for p in plan.parts)
    return TwoLevel(tuple((1,) * len(c) for c in cc), cc)


def machine_plan(plan: Plan) -> Plan:
    """The plan cut across machines only, on the cluster seen as one worker per machine."""
    g, sps, tl = plan.graph, plan.spaces, levels(plan)
    live = g.live()
    ones = tuple((1,) * len(c) for c in tl.cm)
    top = TwoLevel(tl.cm, ones)
    mcluster = replace(plan.cluster, cores=1)
    parts = tuple(nested(sp.shape, tl.cm[v], ones[v]) if live[v] else Partition.whole(sp.shape)
                  for v, sp in enumerate(sps))
    parts = formations_follow(g, sps, parts)

    def where(v: int) -> np.ndarray:
        if not live[v]:
            return np.zeros(parts[v].num_blocks, dtype=np.int64)
        return locations(top, v, mcluster, 0)

    return Plan(g, mcluster, plan.planner, sps, parts, plan.summary, where, free_formations=True, levels=top)


def cluster_graph(plan: Plan) -> ClusterGraph:
    """Lower ``plan`` at the machine level; the core level is only counted."""
    tl = levels(plan)
    tg = lower(machine_plan(plan))
    within = [math.prod(c) for c in tl.cc]
    g, live = plan.graph, plan.graph.live()
    # what the core blocks add to the partial sums and assemblies the machine-level graph has as tasks
    full = partial_seconds(g, plan.spaces, [tl.counts(v) for v in range(len(g.nodes))], plan.cluster, tl.cm)
    top = partial_seconds(g, plan.spaces, tl.cm, plan.cluster, tl.cm)
    extra = [max(0.0, a - b) for a, b in zip(full, top, strict=True)]
    for v, node in enumerate(g.nodes):
        # a formation's sums follow its einsum's blocks, one formation block per core: charged to
        # the einsum's task so that its n core blocks each carry one formation block's sums
        if isinstance(node, Formation) and extra[v]:
            u = node.inputs[0]
            extra[u] += extra[v] * within[u] / max(1, math.prod(tl.cc[v]))
    split = np.zeros(len(tg.tasks), dtype=np.int64)
    seconds = np.zeros(len(tg.tasks))
    for t, task in enumerate(tg.tasks):
        if isinstance(task, ApplyTask) and task.node >= 0:
            split[t] = within[task.node]
            seconds[t] = extra[task.node] / math.prod(tl.cm[task.node])
    core_blocks = sum(math.prod(tl.counts(v)) for v, node in enumerate(g.nodes)
                      if live[v] and not isinstance(node, Fill))
    return ClusterGraph(tg, plan.cluster, split, core_blocks, seconds)
