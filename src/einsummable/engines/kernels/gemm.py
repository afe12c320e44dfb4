"""Contractions as batched GEMM: transpose + reshape + ``np.matmul``, which measured far
faster here than ``np.einsum``. Half-precision operands go to BLAS as f32, so their
products accumulate in f32 and round once, when the kernel returns.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np

from einsummable.engines.kernels import aligned
from einsummable.ir.einsummable import Einsummable

Kernel = Callable[[Sequence[np.ndarray], dict | None], np.ndarray]


def upcast(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Half-precision operands go to BLAS as f32: numpy has no f16/bf16 GEMM worth the name."""
    return [a.astype(np.float32) if a.dtype.itemsize == 2 and a.dtype.kind != "i" else a for a in arrays]


def contraction(op: Einsummable) -> Kernel:
    """A pairwise contraction as one batched GEMM; its index bookkeeping is done here, once."""
    (ia, ib) = op.inputs
    sa, sb, out = set(ia), set(ib), set(range(op.out_rank))
    # indices summed inside one operand alone are reduced before the GEMM
    lone_a = tuple(k for k, i in enumerate(ia) if i not in sb | out)
    lone_b = tuple(k for k, i in enumerate(ib) if i not in sa | out)
    ia, ib = tuple(i for i in ia if i in sb | out), tuple(i for i in ib if i in sa | out)
    sa, sb = set(ia), set(ib)
    batch = [i for i in range(op.out_rank) if i in sa and i in sb]
    left = [i for i in range(op.out_rank) if i in sa and i not in sb]
    right = [i for i in range(op.out_rank) if i in sb and i not in sa]
    # (B A) rather than (A B) lands the GEMM's rows and columns in output order
    swap = bool(left and right and right[0] < left[0])
    if swap:
        ia, ib, sa, sb, left, right = ib, ia, sb, sa, right, left
    inner = [i for i in ia if i in sb and i not in out]
    if not _sorted(batch + left + right):
        # the result is transposed anyway: take rows and columns in their operands' memory order
        left, right = [i for i in ia if i in left], [i for i in ib if i in right]
    size = op.join_shape
    order = batch + left + right
    grid = [size[i] for i in order]
    present = [i for i in range(op.out_rank) if i in order]
    perm = [order.index(i) for i in present]
    transpose = not _sorted(perm)
    shape = [size[i] if i in order else 1 for i in range(op.out_rank)]
    as_a = _matrices(ia, batch, left, inner, size)
    as_b = _matrices(ib, batch, inner, right, size)

    def body(arrays, variables):
        a, b = upcast(arrays)
        if lone_a:
            a = a.sum(axis=lone_a)
        if lone_b:
            b = b.sum(axis=lone_b)
        if swap:
            a, b = b, a
        a, b = as_a(a), as_b(b)
        if transpose:  # elementwise kernels downstream read it row-major
            c = np.matmul(a, b).reshape(grid).transpose(perm)
            out, _ = aligned.empty(c.shape, c.dtype)
            np.copyto(out, c)
            return out.reshape(shape)
        rows = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
        out, _ = aligned.empty(rows, np.result_type(a, b))
        if _few_rows_by_columns(a, b):
            np.copyto(out, np.matmul(b.T, a.T).T)
            return out.reshape(shape)
        return np.matmul(a, b, out=out).reshape(shape)

    return body


FEW_ROWS = 64


def _few_rows_by_columns(a: np.ndarray, b: np.ndarray) -> bool:
    """A few rows times a matrix stored by columns (``x @ W.T``, a decode step's projections):
    OpenBLAS runs ``(W @ x.T).T`` and a copy of the small result faster. Measured one thread,
    8 x 512 by 512 x 1376 f32: 332 against 151 us on its AVX-512 kernels, 180 against 153 on
    Haswell's; at 64 rows 631 against 494 and equal; at 256 rows slower, so not past 64."""
    item = a.itemsize
    return (a.ndim == 2 and b.ndim == 2 and a.shape[0] <= FEW_ROWS and a.strides[1] == item
            and b.strides[0] == item and b.strides[1] != item)


def _sorted(xs: list[int]) -> bool:
    return all(x < y for x, y in itertools.pairwise(xs))


def _matrices(idx: tuple[int, ...], batch: list[int], rows: list[int], cols: list[int],
              size: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    """An operand as a stack of rows x cols matrices, [*batch, R, C], for ``np.matmul``.

    A view where the layout allows: batch axes keep any strides, and BLAS reads a
    matrix stored either way round, so only an operand whose rows or columns are
    split apart in memory is copied.
    """
    lead, perm = [size[i] for i in batch], [idx.index(i) for i in batch + rows + cols]
    shape = (*lead, _prod(size, rows), _prod(size, cols))

    def matrices(x: np.ndarray) -> np.ndarray:
        try:
            view = np.reshape(x.transpose(perm), shape, copy=False)
            if _blas_ready(view):
                return view
        except ValueError:
            pass
        return np.ascontiguousarray(x.transpose(perm)).reshape(shape)

    return matrices


def _blas_ready(m: np.ndarray) -> bool:
    """Whether numpy's matmul hands these matrices to BLAS as they are (one unit-stride axis)."""
    item = m.itemsize
    (rs, cs), (r, c) = m.strides[-2:], m.shape[-2:]
    row_major = cs == item and rs % item == 0 and rs >= c * item
    return row_major or (rs == item and cs % item == 0 and cs >= r * item)


def _prod(size: tuple[int, ...], idx: list[int]) -> int:
    n = 1
    for i in idx:
        n *= size[i]
    return n
