"""The reference kernel: any einsummable, or fill, on whole tensors or single blocks.

Contractions go to ``np.einsum``/BLAS, everything else is its compiled join over
broadcast views followed by a ufunc reduction. The reference and sequential engines
run it; the fast prepared path (kernels.py) shares its helpers and answers to it.

Half precision (f16, bf16) is computed and accumulated in f32 and rounded once,
when the kernel returns, as torch and JAX reduce: a bf16 sum of 4096 x 0.1 that
accumulated in bf16 would stall at 32. A half-precision partial sum that the
lowering keeps in f32 (the join wrapped in ``cast(.., f32)``) is the same kernel
without the final rounding.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from einsummable.engines.kernels.gemm import upcast
from einsummable.engines.kernels.interpret import WIDE, Compiled
from einsummable.ir.box import Box
from einsummable.ir.dtypes import HALF, to_numpy
from einsummable.ir.einsummable import IDENTITY, Einsummable, letter
from einsummable.ir.expr import Cast, Expr
from einsummable.ir.graph import Constant, FillKind, Ramp, Tril

REDUCE = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}


@functools.lru_cache(maxsize=4096)
def compiled(join: Expr, dtypes: tuple[str, ...]) -> Compiled:
    return Compiled(join, dtypes)


def accumulator(op: Einsummable) -> np.dtype | None:
    """The dtype a sum or product of ``op`` accumulates in, when it is not its own:
    f32 for the half types (a min or max is exact in any)."""
    return WIDE if op.dtype in HALF and op.agg in ("add", "mul") else None


def kept_wide(op: Einsummable) -> Einsummable | None:
    """The half-precision op inside ``cast(join, f32)``, a partial sum the lowering keeps
    in f32 until its formation rounds it once; None for any other op."""
    join = op.join
    if not (isinstance(join, Cast) and join.dtype == "f32" and op.agg in ("add", "mul")):
        return None
    inner = Einsummable(op.join_shape, op.inputs, op.out_rank, join.arg, op.agg, op.dtypes)
    return inner if inner.dtype in HALF else None


def einsum(op: Einsummable, arrays: Sequence[np.ndarray], variables: dict | None = None) -> np.ndarray:
    """Evaluate ``op`` on arrays shaped like its inputs; returns a fresh array."""
    result = np.broadcast_to(_evaluate(kept_wide(op) or op, arrays, variables), op.out_shape)
    return np.array(result, dtype=to_numpy(op.dtype), copy=True)


def _evaluate(op: Einsummable, arrays: Sequence[np.ndarray], variables: dict | None) -> np.ndarray:
    """``einsum`` before its final rounding: half precision comes back in f32."""
    covered = set(range(op.out_rank)) <= {i for idx in op.inputs for i in idx}
    plain = len(op.inputs) == 1 and op.join == IDENTITY and op.agg in (None, "add")
    if covered and (op.is_contraction() or plain):
        arrays = upcast(arrays)
        subs = ",".join("".join(letter(i) for i in idx) for idx in op.inputs)
        out = "".join(letter(i) for i in range(op.out_rank))
        return np.einsum(f"{subs}->{out}", *arrays, optimize=len(arrays) > 1)
    if math.prod(op.join_shape) > JOIN_LIMIT and op.out_rank and op.join_shape[0] > 1:
        return _in_slabs(op, arrays, variables)
    views = [align(a, idx, op.join_shape) for a, idx in zip(arrays, op.inputs, strict=True)]
    joined = compiled(op.join, op.dtypes)(*views, variables=variables, wide=op.agg is not None)
    if op.agg is not None:
        joined = REDUCE[op.agg].reduce(joined, axis=op.aggregated, dtype=accumulator(op))
    return joined


JOIN_LIMIT = 1 << 24  # join-space elements the reference materialises at once


def _in_slabs(op: Einsummable, arrays: Sequence[np.ndarray], variables: dict | None) -> np.ndarray:
    """The same op, slab by slab along its first output index, so memory stays bounded."""
    n = op.join_shape[0]
    step = max(1, n * JOIN_LIMIT // math.prod(op.join_shape))
    parts = []
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        sliced = [a[tuple(slice(lo, hi) if i == 0 else slice(None) for i in idx)]
                  for a, idx in zip(arrays, op.inputs, strict=True)]
        block = op.block((hi - lo, *op.join_shape[1:]))
        parts.append(np.broadcast_to(_evaluate(block, sliced, variables), block.out_shape))
    return np.concatenate(parts, axis=0)


def alignment(idx: tuple[int, ...], join_shape: tuple[int, ...]) -> tuple[list[int], tuple[int, ...]]:
    """The transpose and reshape that view an operand with its axes in join order and
    size-1 axes for the indices it lacks; kernels work it out once, at prepare."""
    axes = sorted(range(len(idx)), key=idx.__getitem__)
    return axes, tuple(n if i in idx else 1 for i, n in enumerate(join_shape))


def align(a: np.ndarray, idx: tuple[int, ...], join_shape: tuple[int, ...]) -> np.ndarray:
    axes, shape = alignment(idx, join_shape)
    return a.transpose(axes).reshape(shape)


def fill(kind: FillKind, dtype: str, box: Box) -> np.ndarray:
    """The block ``box`` of a fill; the whole fill when box covers its shape."""
    shape = tuple(hi - lo for lo, hi in box)
    np_dtype = to_numpy(dtype)
    if isinstance(kind, Constant):
        return np.full(shape, kind.value, dtype=np_dtype)
    if isinstance(kind, Tril):
        (r0, r1), (c0, c1) = box[-2:]
        rows = np.arange(r0, r1)[:, None]
        cols = np.arange(c0, c1)[None, :]
        mask = (cols - rows) <= kind.offset
        plane = np.where(mask, kind.inside, kind.outside).astype(np_dtype)
        return np.ascontiguousarray(np.broadcast_to(plane, shape))
    assert isinstance(kind, Ramp)
    out = np.full(shape, kind.start, dtype=np.float64)
    for d, ((lo, hi), step) in enumerate(zip(box, kind.steps, strict=True)):
        if step:
            view = [1] * len(shape)
            view[d] = hi - lo
            out = out + step * np.arange(lo, hi, dtype=np.float64).reshape(view)
    return out.astype(np_dtype)
