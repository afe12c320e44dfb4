"""GEMM epilogues: a contraction's block and the one elementwise join that reads it, in one task.

Where a GEMM's block is read by a single task, an elementwise join on the same worker
that reads it whole (at every point of its output, once), the local engine runs the
join in the GEMM's task, right after it, while the block is still in cache: a
residual add after an output projection, the causal mask added to attention scores,
a gradient summed over its paths. Where the join is a sum that may start from the
GEMM's block (``x0 + x1 + ...`` with the block first or second, so the sum adds in
the order the join does), it adds into that block, which the GEMM made and nothing
else reads: no new block, one pass less. Other joins run their own kernel on it.

The TaskGraph keeps both tasks (other engines and the simulator see them as planned);
only the local engine's dependency lists change: the join's task reads the GEMM's
inputs instead of its block, and the GEMM's task reads nothing and yields nothing.

    fused = pairs(tg.tasks, keep)         # {join task: (GEMM task, its operand position)}
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from einsummable.engines import kernels
from einsummable.engines.reference_kernel import align
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.expr import Expr, Input
from einsummable.ir.scalar_ops import is_call
from einsummable.lower.taskgraph import ApplyTask, MoveTask

Step = Callable[[list, dict, dict], np.ndarray]


def pairs(tasks: Sequence, keep: set[int]) -> dict[int, tuple[int, int]]:
    """Each join task that runs a GEMM's epilogue: ``{join: (gemm, the operand it reads it as)}``.

    The GEMM then waits for the join's other operands too. So a join that reads a move
    (a block another worker makes, at its own pace) keeps its GEMM apart: fused, this
    worker's GEMM would wait on the other's work (a weight gradient summed over two
    workers ran their two GEMMs one after the other: the MLP step 14% slower). Of several
    GEMM operands of one join, the last in task order is taken: the others are ready
    before it, so running it late in the join's task delays little.
    """
    readers = reader_counts(tasks)
    out: dict[int, tuple[int, int]] = {}
    for j, join in local_joins(tasks):
        best = None
        for k, g in enumerate(join.inputs):
            gemm = tasks[g]
            if (isinstance(gemm, ApplyTask) and kernels.is_gemm(gemm.op) and gemm.loc == join.loc
                    and readers[g] == 1 and g not in keep and join.op.inputs[k] == tuple(range(join.op.rank))
                    and (best is None or g > best[0])):
                best = (g, k)
        if best is not None:
            out[j] = best
    return out


def reader_counts(tasks: Sequence) -> list[int]:
    """How many tasks read each task's block."""
    readers = [0] * len(tasks)
    for t in tasks:
        for i in t.inputs:
            readers[i] += 1
    return readers


def local_joins(tasks: Sequence) -> Iterator[tuple[int, ApplyTask]]:
    """The elementwise join tasks that read no move: those that may run another task's work."""
    for j, join in enumerate(tasks):
        if isinstance(join, ApplyTask) and join.op.agg is None and \
                not any(isinstance(tasks[i], MoveTask) for i in join.inputs):
            yield j, join


def rewire(inputs: list[tuple[int, ...]], fused: dict[int, tuple[int, int]]) -> list[tuple[int, ...]]:
    """The dependency lists with each join reading its GEMM's inputs, then its own other operands."""
    inputs = list(inputs)
    for j, (g, k) in fused.items():
        inputs[j] = inputs[g] + inputs[j][:k] + inputs[j][k + 1 :]
        inputs[g] = ()
    return inputs


def step(gemm: Einsummable, join: Einsummable, k: int) -> Step:
    """The fused task: the GEMM on the first operands it is handed, then the join on its block."""
    run_gemm, run_join = kernels.prepare(gemm), kernels.prepare(join)
    n = len(gemm.inputs)
    order = _sum_order(join.join)
    in_place = adds_in_place(gemm, join, k)
    others = [m for m in range(len(join.inputs)) if m != k]
    shape = join.out_shape

    def run(args, feeds, variables):
        block = run_gemm(args[:n], variables)
        rest = args[n:]
        if in_place and block.shape == shape and block.flags.c_contiguous and block.flags.writeable:
            operands = dict(zip(others, rest, strict=True))
            for m in order:  # the block itself is the sum's first term
                if m != k:
                    np.add(block, align(operands[m], join.inputs[m], join.join_shape), out=block)
            return block
        return run_join([*rest[:k], block, *rest[k:]], variables)

    return run


def adds_in_place(gemm: Einsummable, join: Einsummable, k: int) -> bool:
    """Whether the join adds into the GEMM's block (its operand ``k``): a sum of one float dtype
    whose first two terms include it, so adding onto it adds in the join's own order."""
    order = _sum_order(join.join)
    return (order is not None and k in order[:2] and join.dtype in ("f32", "f64")
            and gemm.dtype == join.dtype and set(join.dtypes) == {join.dtype})


def _sum_order(e: Expr) -> list[int] | None:
    """The operands of a left-to-right sum of distinct operands (``x0 + x1 + x2``), in the
    order the join adds them; None for any other join."""
    terms: list[int] = []
    while is_call(e, "add"):
        a, b = e.args
        if not isinstance(b, Input):
            return None
        terms.append(b.index)
        e = a
    if not isinstance(e, Input) or not terms:
        return None
    terms.append(e.index)
    terms.reverse()
    return terms if len(set(terms)) == len(terms) else None
