"""Native runs: the stretches of a worker's tasks that one call of a native loop may run.

The local engine runs each worker's consecutive small joins through one call of a C loop
(engines/kernels/segment.py), not one Python dispatch each; the simulator prices the same
stretches as that engine runs them (one dispatch, then a few hundred nanoseconds a task,
none of it holding the interpreter). Both take the stretches from here, so the program the
simulator prices is the one the engine runs.

**The rule** (one pass in id order, which is topological). A task is *native* when
``native(t)`` holds: for the simulator ``candidate(task)``, its kind alone; the engine adds
that the task's C join built. Per worker, a native task joins the worker's open run when
each of its inputs is a task of the run (of the dtype and shape the task reads) or has an id
below the run's first task, read alike by every task of the run; else it opens a new run. A
task that is not native closes its worker's run. So a run depends only on tasks before its
first, and whatever reads a run's task comes after that first: as one node placed at its first
task's id, the graph stays in topological order and acyclic. Runs of fewer than ``MIN_TASKS``
are dropped.

    runs(tg.tasks, lambda t: candidate(tg.tasks[t]))   # [[3, 4, 7], [5, 6], ...]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from einsummable.ir import kinds
from einsummable.ir.dtypes import to_numpy
from einsummable.lower.taskgraph import ApplyTask

MIN_TASKS = 2  # a lone native task costs the same through its own call
MAX_OPERANDS = 64  # the C loop's operand table
# The largest block a run makes, and the most tasks it runs. A run's outside inputs are held, and
# its blocks read outside it made, from its start to its end: past its tasks' own lives, so both
# are kept small (1 MiB blocks held a momentum step at 1.34x its estimated peak). A join of 64 KiB
# takes 5-15 us here, as long as its dispatch: past that, the dispatch saved matters less.
MAX_BLOCK_BYTES = 1 << 16
MAX_TASKS = 256
NATIVE_DTYPES = frozenset({"f32", "f64"})  # half precision computes in f32 and rounds after: two steps


def candidate(task: object) -> bool:
    """Whether ``task``'s kind lets a native loop run it: a join (no GEMM, no gather) of a small
    f32 or f64 block that writes into nothing in place."""
    if not isinstance(task, ApplyTask) or task.donates >= 0 or len(task.inputs) > MAX_OPERANDS:
        return False
    op = task.op
    return (op.dtype in NATIVE_DTYPES and NATIVE_DTYPES.issuperset(op.dtypes)
            and math.prod(op.out_shape) * to_numpy(op.dtype).itemsize <= MAX_BLOCK_BYTES
            and not kinds.is_gemm(op) and kinds.equality_gather(op) is None)


def runs(tasks: Sequence, native: Callable[[int], bool]) -> list[list[int]]:
    """Each worker's runs of native tasks (see the module docstring), in order of first task."""
    run_of = [-1] * len(tasks)
    found: list[list[int]] = []
    reads: list[dict[int, tuple]] = []  # per run: each input from before it, as its tasks read it
    open_: dict[int, int] = {}  # worker -> its open run
    for t, task in enumerate(tasks):
        r = open_.pop(task.loc, None)
        if not native(t):
            continue
        if r is None or len(found[r]) >= MAX_TASKS or not all(
                _fits(tasks, run_of, r, found[r][0], t, k, reads[r]) for k in range(len(task.inputs))):
            r = len(found)
            found.append([])
            reads.append({})
        found[r].append(t)
        for k, i in enumerate(task.inputs):
            if run_of[i] != r:
                reads[r][i] = read_as(task.op, k)
        run_of[t] = r
        open_[task.loc] = r
    return [members for members in found if len(members) >= MIN_TASKS]


def _fits(tasks: Sequence, run_of: list[int], r: int, first: int, t: int, k: int, reads: dict) -> bool:
    """Whether operand k of task t may be read in run r: from before its first task, as the
    run's other tasks read that block (it is made ready once, at entry), or from a task of it,
    of the dtype and shape t reads (a block made inside is its kernel's output as it lies)."""
    i, op = tasks[t].inputs[k], tasks[t].op
    if i < first:
        return reads.get(i, read_as(op, k)) == read_as(op, k)
    src = tasks[i]
    return run_of[i] == r and (src.dtype, tuple(src.shape)) == read_as(op, k)


def read_as(op, k: int) -> tuple[str, tuple[int, ...]]:
    """The dtype and shape of operand k as ``op``'s kernel reads it."""
    return op.dtypes[k], tuple(op.join_shape[d] for d in op.inputs[k])
