"""The sequential engine: a TaskGraph run block by block, in order, with numpy.

Inputs: a validated TaskGraph, checked feeds and run-time variables. State: one
dict of live blocks, each freed after its last reader. Locations are ignored
(every worker is this one process), so it is the oracle that the parallel
engines must agree with: same tasks, same kernels, no scheduling.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from einsummable.engines import scheduler
from einsummable.engines import trace as timeline
from einsummable.engines.blocks import assemble
from einsummable.engines.kernels import reference as reference_kernel
from einsummable.ir.box import slices
from einsummable.ir.dtypes import to_numpy
from einsummable.lower.taskgraph import (
    ApplyTask,
    ConstantTask,
    FusedTask,
    InputTask,
    MoveTask,
    PartialTask,
    TaskGraph,
    ViewTask,
)


def _input(task: InputTask, args, feeds, variables):
    return feeds[task.name][slices(task.box)]


def _constant(task: ConstantTask, args, feeds, variables):
    return reference_kernel.fill(task.kind, task.dtype, task.box)


def _apply(task: ApplyTask, args, feeds, variables):
    return reference_kernel.einsum(task.op, args, variables)


def _fused(task: FusedTask, args, feeds, variables):
    """The two ops one after the other, ``first``'s block handed to ``then``."""
    block = reference_kernel.einsum(task.first, task.first_operands(args), variables)
    return reference_kernel.einsum(task.then, task.then_operands(args, block), variables)


def _move(task: MoveTask, args, feeds, variables):
    return np.array(args[0][slices(task.box)], copy=True)


def _partial(task: PartialTask, args, feeds, variables):
    out = np.full(task.shape, task.pad, dtype=to_numpy(task.dtype))
    written = np.zeros(task.shape, dtype=bool) if task.agg else None
    for p in task.pieces:
        dst = slices(p.dst_box)
        piece = args[p.input][slices(p.src)]
        if written is None:
            out[dst] = piece
            continue
        combined = reference_kernel.REDUCE[task.agg](out[dst], piece)
        out[dst] = np.where(written[dst], combined, piece)
        written[dst] = True
    return out


def _view(task: ViewTask, args, feeds, variables):
    a = np.ascontiguousarray(args[0])
    if a.dtype != to_numpy(task.dtype):
        a = a.view(to_numpy(task.dtype))
    return a.reshape(task.shape)


EXEC = {
    InputTask: _input,
    ConstantTask: _constant,
    ApplyTask: _apply,
    FusedTask: _fused,
    MoveTask: _move,
    PartialTask: _partial,
    ViewTask: _view,
}


def run(tg: TaskGraph, feeds: dict[str, np.ndarray], variables: dict[str, float] | None = None,
        trace: str | Path | None = None) -> dict[str, np.ndarray]:
    """Execute every task in order and assemble the outputs from their blocks. ``trace``: write
    each task's measured start and end there, as the local engine does (engines/trace.py)."""
    tasks, variables = tg.tasks, variables or {}
    times = np.zeros((len(tasks), 2))
    origin = time.perf_counter()

    def step(t: int, args: list) -> np.ndarray:
        return EXEC[type(tasks[t])](tasks[t], args, feeds, variables)

    values = scheduler.run_in_order(
        [t.inputs for t in tasks], timeline.timed(step, times),
        keep={t for out in tg.outputs.values() for t, _ in out.blocks},
        describe=lambda t: tasks[t].describe(),
    )
    if trace is not None:
        events, lanes = timeline.task_events(tg, times - origin, measured=True)
        timeline.write(events, trace, lanes, f"measured, in order: {len(tasks):,} tasks")
    return {name: assemble(out, values) for name, out in tg.outputs.items()}
