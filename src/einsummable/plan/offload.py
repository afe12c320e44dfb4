"""Offload when nothing else fits (issue 31, item 3): inputs kept in host storage.

When no plan fits, even with activations rematerialised (plan/remat.py), the step's state
(the inputs an output of the same name replaces: weights, optimizer moments) can live in
host storage instead of memory, as ZeRO-Offload keeps optimizer state on the host: each
block is loaded just before its readers (its input task, gated ``priority.PREFETCH`` nodes
ahead like a gathered weight, lower/prefetch.py) and freed after them, and the new value is
stored block by block as it is made (engines/storage.py). The estimate counts a stored input
only while a load of it is held (plan/predict/memory.py), the simulator charges its bytes both ways at
``Cluster.storage_bandwidth``, and so does the plan's step: ``Summary.storage_seconds``.

Which state: the largest tensors first, as few as bring the plan under the budget (the
excess over it, from the plan tried without; then all of them), on one machine: a plan over
several machines shards its state instead.

    plan, how = replan(g, cluster, err, planner)    # after PlanMemoryError; how.describe()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from einsummable.errors import PlanMemoryError
from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import EinGraph, InputNode
from einsummable.plan.predict.memory import Memory, gib
from einsummable.plan.space import nbytes


@dataclass(frozen=True)
class Offload:
    """What offloading did to a plan's graph."""

    names: tuple[str, ...]  # the inputs kept in host storage
    nbytes: float  # their bytes: loaded and stored once each a step at least
    seconds: float  # both ways at the cluster's storage bandwidth (the plan's step includes it)

    def describe(self) -> str:
        more = len(self.names) - 4
        shown = ", ".join(self.names[:4]) + (f" and {more} more" if more > 0 else "")
        return (f"offload: {len(self.names)} inputs ({gib(self.nbytes)} GiB: {shown}) kept in host storage, "
                f"loaded before their readers and stored as made: +{self.seconds:.3g} s a step")


def store(g: EinGraph, names: set[str]) -> EinGraph:
    """A copy of ``g`` whose inputs in ``names`` are kept in host storage."""
    out = EinGraph()
    for v, node in enumerate(g.nodes):
        if isinstance(node, InputNode) and node.name in names:
            node = dataclasses.replace(node, stored=True)
        new = out.add(node)
        if v in g.index_names:
            out.index_names[new] = g.index_names[v]
    for ids in g.class_ids:
        out.add_class_ids(ids)
    for name, v in g.outputs.items():
        out.set_output(name, v)
    return out


def state(g: EinGraph) -> list[InputNode]:
    """The step's state: inputs an output of the same name replaces, the largest first."""
    found = [node for node in g.nodes if isinstance(node, InputNode) and node.name in g.outputs]
    return sorted(found, key=lambda node: -nbytes(node))


def replan(g: EinGraph, cluster: Cluster, err: PlanMemoryError,
           plan: Callable[[EinGraph], object]) -> tuple[object, Offload]:
    """Plan ``g`` with some of its state in host storage (``plan`` raises PlanMemoryError when it
    does not fit), after ``err`` said nothing fits in memory; re-raise ``err`` when that cannot help."""
    candidates = state(g)
    before = err.memory if isinstance(err.memory, Memory) else None
    if cluster.machines > 1 or not candidates or before is None:
        raise err
    excess, taken, prefix = before.peak - cluster.memory_per_machine, 0.0, []
    for node in candidates:
        if taken >= 1.1 * excess:
            break
        prefix.append(node.name)
        taken += nbytes(node)
    tries = [prefix] if len(prefix) < len(candidates) else []
    tries.append([node.name for node in candidates])
    for names in tries:
        try:
            planned = plan(store(g, set(names)))
        except PlanMemoryError:
            continue
        moved = sum(nbytes(node) for node in candidates if node.name in names)
        return planned, Offload(tuple(names), moved, 2 * moved / cluster.storage_bandwidth)
    raise err
