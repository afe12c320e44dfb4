"""Fusion: the passes that make the TaskGraph every engine runs, simulates and traces.

Three rules, each a match on a task and the one task that reads it, on one worker:

- **epilogue**: a GEMM's block (``kinds.is_gemm``) read by one elementwise join, whole
  (at every point of its output, once): the join runs in the GEMM's task, right after it,
  while the block is in cache (a residual add after an output projection, the causal mask
  added to scores, a gradient summed over its paths);
- **rows**: a row reduction's block read by one elementwise join broadcast along the
  reduced dims (``kinds.row_pair``: softmax backward's ``sum(y * dy)`` then ``y * (dy - t)``,
  rmsnorm's mean square then its scaling): one pass over each row for both;
- **donation**: ``where(c, x, old)`` over a block of an input that the graph also outputs
  (a KV cache), read by this task alone and overlapping no other read of that input, is
  marked ``donates``: where a session run gives that block up, the engine may store only the
  elements where ``c`` holds into it (engines/donation.py).

A fused pair is one ``FusedTask`` and the absorbed task is gone, so the graph is smaller and
every engine sees the same tasks. A join that reads a move (a block another worker makes, at
its own pace) fuses nothing: its partner would wait on the other worker (a weight gradient
summed over two workers ran their two GEMMs one after the other: 14% slower). Of several
partners of one join the last in task order is taken, row reductions before GEMMs: the others
are ready before it. The unfused graph is what lowering made; compile keeps it for the oracles.

    fused = fuse(tg)                 # fused.graph, fused.index[old task] -> new task
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from einsummable.ir import kinds
from einsummable.ir.box import intersect
from einsummable.ir.dtypes import HALF
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.expr import Cast, Expr, Input, inputs_used
from einsummable.ir.scalar_ops import is_call
from einsummable.lower.taskgraph import ApplyTask, FusedTask, InputTask, MoveTask, Output, TaskGraph

T = TypeVar("T")


@dataclass(frozen=True)
class Fusion:
    graph: TaskGraph
    index: tuple[int, ...]  # each task of the unfused graph -> the task of ``graph`` that runs it


def fuse(tg: TaskGraph, keep: Iterable[int] = ()) -> Fusion:
    """``tg`` with its fusable pairs in one task each and its donors marked (module docstring).
    ``keep``: tasks whose blocks are wanted besides the outputs' (a machine's sends)."""
    tasks = tg.tasks
    kept = {t for out in tg.outputs.values() for t, _ in out.blocks} | set(keep)
    readers = [0] * len(tasks)
    for task in tasks:
        for i in task.inputs:
            readers[i] += 1
    pairs = _pairs(tasks, kept, readers)
    donors = _donors(tg, kept, readers, pairs)
    if not pairs and not donors:
        return Fusion(tg, tuple(range(len(tasks))))
    absorbed = {g for g, _ in pairs.values()}
    index = [-1] * len(tasks)
    out: list = []
    for t, task in enumerate(tasks):
        if t in absorbed:
            continue
        index[t] = len(out)
        if t in pairs:
            g, k = pairs[t]
            task = _fused(tasks[g], task, k)
        elif t in donors:
            task = replace(task, donates=donors[t])
        out.append(task)
    for j, (g, _) in pairs.items():
        index[g] = index[j]
    out = [_renumber(task, index) for task in out]
    outputs = {name: Output(o.shape, o.dtype, tuple((index[t], box) for t, box in o.blocks))
               for name, o in tg.outputs.items()}
    return Fusion(TaskGraph(tuple(out), outputs, tg.workers, tg.cores, tg.order, tg.stored), tuple(index))


def _pairs(tasks: Sequence, kept: set[int], readers: list[int]) -> dict[int, tuple[int, int]]:
    """``{join: (partner, the operand it reads it as)}`` (the module docstring's rules)."""
    out: dict[int, tuple[int, int]] = {}
    for j, join in enumerate(tasks):
        if not (isinstance(join, ApplyTask) and join.op.agg is None
                and not any(isinstance(tasks[i], MoveTask) for i in join.inputs)):
            continue
        rows, gemm = None, None
        for k, g in enumerate(join.inputs):
            part = tasks[g]
            if not (isinstance(part, ApplyTask) and part.loc == join.loc and readers[g] == 1 and g not in kept
                    and join.inputs.count(g) == 1):
                continue
            if kinds.row_pair(part.op, join.op, k) and (rows is None or g > rows[0]):
                rows = (g, k)
            if (kinds.is_gemm(part.op) and join.op.inputs[k] == tuple(range(join.op.rank))
                    and (gemm is None or g > gemm[0])):
                gemm = (g, k)
        if rows or gemm:
            out[j] = rows or gemm
    return out


def _fused(first: ApplyTask, then: ApplyTask, k: int) -> FusedTask:
    """One task for both (``then`` reads ``first`` as its operand ``k``)."""
    inputs, slots = wiring(first.inputs, then.inputs, k)
    return FusedTask(first.op, then.op, slots, inputs, then.loc, then.node)


def wiring(first: Sequence[T], then: Sequence[T], k: int) -> tuple[tuple[T, ...], tuple[int, ...]]:
    """A fused task's inputs and slots from its two ops' operands (``then``'s operand ``k`` is
    ``first``'s block): ``first``'s operands, then ``then``'s others, each once."""
    inputs = tuple(dict.fromkeys([*first, *then[:k], *then[k + 1 :]]))
    slots = tuple(inputs.index(i) for i in first) + \
        tuple(-1 if m == k else inputs.index(i) for m, i in enumerate(then))
    return inputs, slots


def _renumber(task, index: Sequence[int]):
    ins = tuple(index[i] for i in task.inputs)
    return task if ins == task.inputs else replace(task, inputs=ins)


def _donors(tg: TaskGraph, kept: set[int], readers: list[int], pairs: dict) -> dict[int, int]:
    """``{task: operand}`` for the applies that may write into an input's block in place."""
    tasks = tg.tasks
    boxes: dict[str, list[tuple[int, tuple]]] = {}
    for i, t in enumerate(tasks):
        if isinstance(t, InputTask):
            boxes.setdefault(t.name, []).append((i, t.box))
    out: dict[int, int] = {}
    for j, task in enumerate(tasks):  # (a pair's partner aggregates: ``match`` takes no such op)
        found = match(task.op) if isinstance(task, ApplyTask) and j not in pairs else None
        if found is None:
            continue
        k = found[0]
        i = task.inputs[k]
        src = tasks[i]
        if not (isinstance(src, InputTask) and src.name in tg.outputs and src.name not in tg.stored
                and i not in kept and readers[i] == 1 and task.inputs.count(i) == 1):
            continue
        if any(intersect(src.box, box) is not None for other, box in boxes[src.name] if other != i):
            continue
        out[j] = k
    return out


def match(op: Einsummable) -> tuple[int, Expr, Expr] | None:
    """``(slot, cond, value)`` where ``op`` is ``where(cond, value, x[slot])`` (optionally cast
    to its own dtype, ``x[slot]`` optionally widened from that half type), elementwise, with
    ``x[slot]`` read whole at the output's index in the output's dtype and read nowhere else;
    ``value`` carries the join's final rounding, if any."""
    join, rounded = op.join, isinstance(op.join, Cast) and op.join.dtype == op.dtype
    inner = join.arg if rounded else join
    if op.agg is not None or op.rank != op.out_rank or not is_call(inner, "where"):
        return None
    cond, value, old = inner.args
    if isinstance(old, Cast) and old.dtype == "f32" and op.dtype in HALF:
        old = old.arg  # a half value widened: exact, and rounded back exactly
    if not isinstance(old, Input):
        return None
    k = old.index
    if (op.inputs[k] != tuple(range(op.rank)) or op.dtypes[k] != op.dtype
            or k in inputs_used(cond) | inputs_used(value)):
        return None
    return k, cond, Cast(op.dtype, value) if rounded else value
