"""What the Ray driver keeps of a program: per machine, what its actor is given, reads and holds.

Two layouts:
- ``whole(tg)``: a core-level TaskGraph, every actor given all of it (one machine, or a
  graph built by hand); each runs its machine's tasks;
- ``two_level(*machine_shares(plan))``: a plan over several machines. The driver
  lowers the machine-level plan only (lower/cluster.py) and gives each actor its
  ``Share``, which the actor lowers to its cores itself (lower/refine.py): no
  process builds the core-level graph of the cluster, and an actor gets its tasks,
  not the cluster's.

Task ids (in ``outputs``, ``machine``, ``describe``) are the layout's graph's: the
core-level graph's, or the machine-level graph's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from einsummable.engines import local
from einsummable.ir import priority
from einsummable.ir.box import Box
from einsummable.lower.compact import INPUT, CompactGraph
from einsummable.lower.refine import Share
from einsummable.lower.taskgraph import InputTask, Output, TaskGraph


@dataclass(frozen=True, eq=False)
class Layout:
    """See the module docstring."""

    machines: int
    cores: int  # of each machine
    outputs: dict[str, Output]
    machine: np.ndarray  # [tasks] the machine each task runs on (a move: the one it lands on)
    inputs: dict[int, list[tuple[str, Box, str]]]  # machine -> (name, box, dtype) of the inputs it reads
    payloads: tuple[object, ...]  # per machine, what its actor sets up (one object, when shared)
    shipped: tuple[int, ...]  # per machine, how many tasks its payload holds
    describe: Callable[[int], str]


def _inputs(rows) -> dict[int, list[tuple[str, Box, str]]]:
    out: dict[int, list] = {}
    for m, entry in rows:
        wanted = out.setdefault(m, [])
        if entry not in wanted:
            wanted.append(entry)
    return out


def whole(tg: TaskGraph) -> Layout:
    """Every actor given the whole core-level TaskGraph (and the tasks' critical-path ranks)."""
    tasks = tg.tasks
    rank = priority.ranks([t.inputs for t in tasks], [local.task_cost(t) for t in tasks], tg.order)
    machines = tg.workers // tg.cores
    inputs = _inputs((tg.machine_of(t.loc), (t.name, t.box, t.dtype))
                     for t in tasks if isinstance(t, InputTask))
    machine = np.array([tg.machine_of(t.loc) for t in tasks], dtype=np.int64)
    return Layout(machines, tg.cores, tg.outputs, machine, inputs, ((tg, rank),) * machines,
                  (len(tasks),) * machines, lambda t: tasks[t].describe())


def two_level(cg: CompactGraph, shares: list[Share]) -> Layout:
    """Each actor given its share of the machine-level graph ``cg`` (``refine.machine_shares(plan)``)."""
    rows = [(int(cg.loc[t]), (*cg.aux_table[cg.aux[t]], cg.dtypes[cg.dtype[t]]))
            for t in np.flatnonzero(cg.kind == INPUT).tolist()]
    return Layout(cg.workers, shares[0].cores, cg.outputs, cg.loc.astype(np.int64), _inputs(rows),
                  tuple(shares), tuple(len(s) for s in shares), lambda t: cg.task(t).describe())
