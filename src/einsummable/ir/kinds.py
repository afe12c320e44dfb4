"""Kernel kinds: what kind of kernel a block op is, decided once, from the op alone.

Every engine maps a kind to an implementation (engines/kernels/fast.py: BLAS, gathers, generated
C or numpy), and the planner and the simulator price a kind through one cost function
(hardware/cost.py), so the three agree on what each op is. Nothing here depends on whether
a C compiler exists: that changes how a kind runs, not what it is.

- ``gemm``: a contraction ``sum x0 * x1`` whose two operands index different dims and whose
  summed size is more than ``TINY_INNER`` (a batched matrix product on BLAS);
- ``gather``: ``sum where(xa == xb, xc, 0)``, an embedding lookup or its scatter-add gradient
  (costs its comparisons and the rows it moves, not its join space);
- ``view``: one operand, the identity join, no aggregation (a transpose: no work);
- ``copy``: one operand cast to the op's dtype (one pass);
- ``reduction``: any other aggregated join (a row sum, softmax's row max, a row-wise dot);
- ``elementwise``: any other join.

Two tasks that one task runs (lower/fusion.py) have the kinds ``gemm+epilogue`` and
``rows+join``.

    kind(op)              # "gemm", ...
"""

from __future__ import annotations

import math

from einsummable.ir.einsummable import IDENTITY, Einsummable
from einsummable.ir.expr import ZERO, Cast, Input
from einsummable.ir.scalar_ops import is_call

GEMM, GATHER, VIEW, COPY = "gemm", "gather", "view", "copy"
REDUCTION, ELEMENTWISE = "reduction", "elementwise"
EPILOGUE, ROWS = "gemm+epilogue", "rows+join"
TINY_INNER = 8  # below this contracted size a GEMM per tiny matrix loses to multiply-and-sum


def kind(op: Einsummable) -> str:
    """The kernel kind of ``op`` (see the module docstring)."""
    if is_gemm(op):
        return GEMM
    if equality_gather(op) is not None:
        return GATHER
    if len(op.inputs) == 1 and op.agg is None and op.join == IDENTITY:
        return VIEW
    if len(op.inputs) == 1 and op.agg is None and op.join == Cast(op.dtype, IDENTITY):
        return COPY
    return REDUCTION if op.agg is not None else ELEMENTWISE


def is_gemm(op: Einsummable) -> bool:
    """A contraction run as a matrix product: a block it makes, fresh."""
    return op.is_contraction() and inner_size(op) > TINY_INNER and not rowwise_dot(op)


def rowwise_dot(op: Einsummable) -> bool:
    """A contraction whose operands index the same dims (softmax backward's ``sum(y * dy)``):
    no matrix product, one pass over both operands."""
    ia, ib = op.inputs
    return set(ia) == set(ib)


def inner_size(op: Einsummable) -> int:
    """The size of what a contraction sums over (RoPE's 2x2 rotation sums over 2)."""
    ia, ib = op.inputs
    return math.prod(op.join_shape[i] for i in set(ia) & set(ib) - set(range(op.out_rank)))


def equality_gather(op: Einsummable) -> tuple[int, int, int] | None:
    """``(a, b, c)`` where ``op`` is ``sum where(xa == xb, xc, 0)``: an embedding lookup or its
    scatter-add gradient."""
    e = op.join
    if op.agg != "add" or len(op.inputs) != 3 or not is_call(e, "where"):
        return None
    cond, then, other = e.args
    if not (is_call(cond, "eq") and other == ZERO and isinstance(then, Input)):
        return None
    a, b = cond.args
    if not (isinstance(a, Input) and isinstance(b, Input)):
        return None
    if len({a.index, b.index, then.index}) != 3 or not (op.inputs[a.index] or op.inputs[b.index]):
        return None
    return a.index, b.index, then.index


def row_pair(red: Einsummable, join: Einsummable, k: int) -> bool:
    """Whether ``join`` can read ``red``'s block as operand ``k`` a row at a time (lower/fusion.py):
    ``red`` reduces the trailing dims of its join space keeping dims 0..p-1, ``join`` is
    elementwise over a space whose leading dims are those, and its operand ``k`` indexes them
    alone, in the reduction's dtype. GEMMs and gathers keep their own kernels."""
    p = red.out_rank
    return (red.agg is not None and join.agg is None and 0 < p < red.rank and join.rank > p
            and join.inputs[k] == tuple(range(p)) and join.join_shape[:p] == red.out_shape
            and join.dtypes[k] == red.dtype and kind(red) == REDUCTION
            and (red.agg in ("add", "mul") or math.prod(red.join_shape[p:]) > 0))
