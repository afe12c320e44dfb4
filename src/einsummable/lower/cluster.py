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
"spread over all the machine's cores"). The simulator (engines/simulator/cluster.py)
costs a task on its machine from that, with the cores' rates, as the planner's
two-level cost does, so nobody builds the core-level graph.

    cg = cluster_graph(plan)          # plan from make_plan(g, Cluster(machines=32, cores=64))
    len(cg), cg.core_blocks           # tasks at the machine level, blocks at the core level

The graph is a CompactGraph (lower/compact.py: tasks as numpy arrays), lowered a
node at a time over arrays of blocks (lower/blockwise.py): the same tasks, in the
same order, as lowering.py makes for the machine-level plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import Fill, Formation
from einsummable.lower.blockwise import lower_blocks
from einsummable.lower.compact import APPLY, CompactGraph
from einsummable.plan.partition import Partition
from einsummable.plan.plan import Plan
from einsummable.plan.planners import formations_follow
from einsummable.plan.predict.summary import partial_seconds
from einsummable.plan.twolevel import TwoLevel, nested, spread

Counts = tuple[int, ...]


@dataclass(frozen=True, eq=False)
class ClusterGraph:
    """A TaskGraph over machines (``graph.workers == cluster.machines``, one worker each), as arrays."""

    graph: CompactGraph
    cluster: Cluster  # the real cluster: machines × cores
    split: np.ndarray  # [tasks] core-level blocks of each task (0: spread over all cores)
    core_blocks: int  # blocks of the core-level plan (its apply, input and partial tasks, before moves)
    # [tasks] seconds of one core that the task's core blocks spend adding partial sums and assembling
    # repartitioned operands inside the machine (summary.partial_seconds), all its core blocks together
    within: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.graph)

    def __str__(self) -> str:
        return f"cluster-level graph on {self.cluster}, {self.core_blocks:,} core-level blocks\n{self.graph}"


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
        """``locations`` with one core per machine: block b (row-major) on machine spread(n)[b]."""
        n = parts[v].num_blocks
        return spread(n, mcluster.machines) if live[v] else np.zeros(n, dtype=np.int64)

    return Plan(g, mcluster, plan.planner, sps, parts, plan.summary, where, free_formations=True, levels=top)


def cluster_graph(plan: Plan) -> ClusterGraph:
    """Lower ``plan`` at the machine level, into arrays; the core level is only counted."""
    tl = levels(plan)
    cg = lower_blocks(machine_plan(plan))
    within = np.array([math.prod(c) for c in tl.cc], dtype=np.int64)
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
    per_task = np.array([e / math.prod(m) for e, m in zip(extra, tl.cm, strict=True)])
    apply = (cg.kind == APPLY) & (cg.node >= 0)
    node = np.where(apply, cg.node, 0)
    split = np.where(apply, within[node], 0)
    seconds = np.where(apply, per_task[node], 0.0)
    core_blocks = sum(math.prod(tl.counts(v)) for v, node in enumerate(g.nodes)
                      if live[v] and not isinstance(node, Fill))
    return ClusterGraph(cg, plan.cluster, split, core_blocks, seconds)
