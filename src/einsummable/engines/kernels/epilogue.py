"""GEMM epilogues: how the local engine runs a fused GEMM task (lower/fusion.py's epilogue rule).

The GEMM runs on the operands it is handed, then the join on its block while it is still
in cache. Where the join is a sum that may start from the GEMM's block (``x0 + x1 + ...``
with the block first or second, so the sum adds in the order the join does), it adds into
that block, which the GEMM made and nothing else reads: no new block, one pass less. Other
joins run their own kernel on it.

    step(task)                                  # a FusedTask's step
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from einsummable.engines.kernels import fast as kernels
from einsummable.engines.kernels.reference import align
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.expr import Expr, Input
from einsummable.ir.scalar_ops import is_call
from einsummable.lower.taskgraph import FusedTask

Step = Callable[[list, dict, dict], np.ndarray]


def step(task: FusedTask) -> Step:
    """The fused task: the GEMM on its operands, then the join on its block."""
    gemm, join, k = task.first, task.then, task.k
    run_gemm, run_join = kernels.prepare(gemm), kernels.prepare(join)
    order = _sum_order(join.join)
    in_place = adds_in_place(gemm, join, k)
    shape = join.out_shape

    def run(args, feeds, variables):
        block = run_gemm(task.first_operands(args), variables)
        if in_place and block.shape == shape and block.flags.c_contiguous and block.flags.writeable:
            for m in order:  # the block itself is the sum's first term
                if m != k:
                    np.add(block, align(args[task.then_slots[m]], join.inputs[m], join.join_shape), out=block)
            return block
        return run_join(task.then_operands(args, block), variables)

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
