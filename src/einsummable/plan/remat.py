"""Rematerialisation when saved activations do not fit: the planner's side of ir/remat.py.

``make_plan`` first plans the graph as given, sharding state across machines where
that fits (twolevel.py). When no plan fits ``memory_per_machine`` and the state at
the peak (graph inputs and outputs: parameters, optimizer state, gradients) fits on
its own, the rest is saved activations and transient blocks, which recomputation can
cut. Then the forward is checkpointed at its cuts (``ir.remat.checkpoints``: the
residual stream between layers), every other activation the backward reads is
recomputed there, and the graph is planned again:
1. keeping every cut: per-layer checkpointing, the least recomputation;
2. keeping every k-th cut, k near the square root of their number: fewer
   checkpoints, more recomputed at once.
The first that fits is the plan; its graph holds the recomputed nodes, so its
predicted step time includes their flops, and its report says what remat cost and
saved. When none fits, PlanMemoryError names the smallest peak found, remat included.

Example: a 12-layer MLP whose activations need 3 GiB and state 1 GiB, on 2 GiB per
machine, keeps the 12 layer outputs and recomputes each layer's inner values in the
backward; the report's remat line gives the flops added and the peak before and after.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from einsummable.errors import PlanMemoryError
from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import EinGraph
from einsummable.ir.remat import checkpoints, gates, rematerialize
from einsummable.plan.predict.memory import Memory, gib, loss_of
from einsummable.plan.space import spaces


@dataclass(frozen=True)
class Remat:
    """What rematerialisation did to a plan's graph."""

    kept: int  # checkpoints held from the forward to the backward
    recomputed: int  # forward nodes copied into the backward
    flops: float  # their flops, which the predicted step includes
    total_flops: float  # the step's flops with them
    before: Memory  # the smallest peak found without rematerialising

    def describe(self, after: Memory | None) -> str:
        now = f"{gib(after.peak)} GiB" if after is not None else "a peak that fits"
        share = self.flops / self.total_flops if self.total_flops else 0.0
        return (f"remat: activations did not fit ({gib(self.before.peak)} GiB, of which activations "
                f"{gib(self.before.activations)} + transient {gib(self.before.transient)}); "
                f"{self.kept} checkpoints kept, {self.recomputed} forward nodes recomputed in the backward "
                f"(+{self.flops:.3g} flops, {share:.1%} of the step) bring the peak to {now}")


def keep_sets(g: EinGraph, loss: int) -> list[list[int]]:
    """Checkpoints to try, least recomputation first: every cut, then every k-th for k
    near the square root of their number (the classic sqrt(n) checkpointing)."""
    cuts = checkpoints(g, loss)
    stride = round(math.sqrt(len(cuts)))
    return [cuts, cuts[stride - 1::stride]] if stride > 1 else [cuts] if cuts else []


def replan(g: EinGraph, cluster: Cluster, err: PlanMemoryError,
           plan: Callable[[EinGraph], object]) -> tuple[object, Remat]:
    """Plan ``g`` rematerialised (by ``plan``, which raises PlanMemoryError when it does not
    fit), after ``err`` said it does not fit as it is; re-raise when remat cannot help."""
    before: Memory | None = err.memory if isinstance(err.memory, Memory) else None
    loss = loss_of(g)
    if before is None or loss is None or before.inputs + before.outputs >= cluster.memory_per_machine:
        raise err
    smallest = before
    for keep in keep_sets(g, loss):
        graph = rematerialize(g, loss, keep)
        try:
            planned = plan(graph)
        except PlanMemoryError as tried:
            if isinstance(tried.memory, Memory) and tried.memory.peak < smallest.peak:
                smallest = tried.memory
            continue
        flops = [_flops(x) for x in (g, graph)]
        recomputed = len(graph) - len(g) - len(gates(graph))
        return planned, Remat(len(keep), recomputed, flops[1] - flops[0], flops[1], before)
    sharded = "the state sharded and " if cluster.machines > 1 else ""
    raise PlanMemoryError(
        f"no plan fits {gib(cluster.memory_per_machine)} GiB per machine on {cluster}, even with {sharded}"
        f"activations rematerialised: the smallest peak found is {smallest.describe()}; "
        f"add machines or memory", smallest) from err


def _flops(g: EinGraph) -> float:
    live = g.live()
    return float(math.fsum(sp.flops for sp, keep in zip(spaces(g), live, strict=True) if keep))
