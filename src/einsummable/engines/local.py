"""The local engine, the default: one process, one thread per worker, fully asynchronous.

Inputs: a TaskGraph, checked feeds and run-time variables. It runs the shared
dependency loop (``scheduler.run``) with each task pinned to its planned worker,
BLAS limited to one thread per worker for the run, and the engines' fast kernels:
contractions as batched GEMM, joins compiled to ufunc sequences, embeddings as
gathers. Blocks are freed after their last reader; partial sums accumulate in
place; a move inside the process is a view, not a copy. Feeds are never written.

    prog = es.compile(g, workers=2)            # engine="local"
    prog.run({"x": X})
"""

from __future__ import annotations

import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

from einsummable.engines import kernels, scheduler
from einsummable.engines.blocks import Blocks
from einsummable.ir.dtypes import to_numpy
from einsummable.lower.taskgraph import (
    ApplyTask,
    ConstantTask,
    InputTask,
    MoveTask,
    PartialTask,
    TaskGraph,
    ViewTask,
)
from einsummable.progress import Progress

SHOW_PROGRESS_AFTER = 2.0  # seconds


def _slices(box) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) for lo, hi in box)


def _input(task: InputTask, args, feeds, variables):
    src = feeds[task.name]
    return src.get(task.box) if isinstance(src, Blocks) else src[_slices(task.box)]


def _constant(task: ConstantTask, args, feeds, variables):
    return kernels.fill(task.kind, task.dtype, task.box)


def _apply(task: ApplyTask, args, feeds, variables):
    return kernels.fast_einsum(task.op, args, variables)


def _move(task: MoveTask, args, feeds, variables):
    return args[0][_slices(task.box)]  # one address space: a view is the move


def _partial(task: PartialTask, args, feeds, variables):
    shape = task.shape
    full = tuple((0, n) for n in shape)
    pieces = task.pieces
    if all(p.dst_box == full for p in pieces):
        first = args[pieces[0].input][_slices(pieces[0].src)]
        if len(pieces) == 1:
            return first
        out = np.array(first, dtype=to_numpy(task.dtype), copy=True)
        reduce = kernels.REDUCE[task.agg]
        for p in pieces[1:]:
            reduce(out, args[p.input][_slices(p.src)], out=out)
        return out
    out = np.full(shape, task.pad, dtype=to_numpy(task.dtype))
    if task.agg is None:
        for p in pieces:
            out[_slices(p.dst_box)] = args[p.input][_slices(p.src)]
        return out
    written = np.zeros(shape, dtype=bool)
    reduce = kernels.REDUCE[task.agg]
    for p in pieces:
        dst = _slices(p.dst_box)
        piece = args[p.input][_slices(p.src)]
        out[dst] = np.where(written[dst], reduce(out[dst], piece), piece)
        written[dst] = True
    return out


def _view(task: ViewTask, args, feeds, variables):
    a = args[0]
    if a.dtype != to_numpy(task.dtype):
        a = np.ascontiguousarray(a).view(to_numpy(task.dtype))
    return a.reshape(task.shape)


EXEC = {
    InputTask: _input,
    ConstantTask: _constant,
    ApplyTask: _apply,
    MoveTask: _move,
    PartialTask: _partial,
    ViewTask: _view,
}


def _cost(task) -> float:
    return float(task.op.flops()) if isinstance(task, ApplyTask) else float(np.prod(task.shape))


class _Ticker:
    """Progress on a terminal, once a run has taken a couple of seconds."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.start = time.perf_counter()
        self.bar: Progress | None = None
        self.last = 0.0
        self.count = 0
        self.tty = sys.stderr.isatty()

    def __call__(self, i: int) -> None:
        self.count += 1
        if not self.tty:
            return
        now = time.perf_counter()
        if now - self.start < SHOW_PROGRESS_AFTER or now - self.last < 0.1:
            return
        if self.bar is None:
            self.bar = Progress(self.total, "run", unit="task")
            self.bar.start = self.start
        self.bar.update(self.count - self.bar.done)
        self.last = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.update(self.count - self.bar.done)
            self.bar.__exit__()


def run(tg: TaskGraph, feeds: dict[str, np.ndarray | Blocks], variables: dict[str, float] | None = None,
        carry: frozenset[str] = frozenset()) -> dict[str, np.ndarray | Blocks]:
    """Execute the TaskGraph on ``tg.workers`` threads.

    Outputs named in ``carry`` come back as their blocks, unassembled, ready to be
    fed to the next run; the others are assembled into arrays.
    """
    variables = variables or {}
    tasks = tg.tasks
    keep = {t for out in tg.outputs.values() for t, _ in out.blocks}
    ticker = _Ticker(len(tasks))

    def execute(i: int, args: list) -> np.ndarray:
        task = tasks[i]
        return EXEC[type(task)](task, args, feeds, variables)

    with threadpool_limits(1, user_api="blas"):
        try:
            values = scheduler.run(
                [t.inputs for t in tasks], execute, location=[t.loc for t in tasks], workers=tg.workers,
                keep=keep, cost=[_cost(t) for t in tasks], describe=lambda i: tasks[i].describe(),
                on_done=ticker,
            )
        finally:
            ticker.close()
    result: dict[str, np.ndarray | Blocks] = {}
    for name, out in tg.outputs.items():
        if name in carry:
            result[name] = Blocks(out.shape, out.dtype, {box: values[t] for t, box in out.blocks})
        elif len(out.blocks) == 1:
            result[name] = np.array(values[out.blocks[0][0]], dtype=to_numpy(out.dtype), copy=True)
        else:
            array = np.empty(out.shape, dtype=to_numpy(out.dtype))
            for t, box in out.blocks:
                array[_slices(box)] = values[t]
            result[name] = array
    return result
