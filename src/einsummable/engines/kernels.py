"""Numpy kernels for every node kind, over whole tensors or single blocks.

Any einsummable runs: contractions go to ``np.einsum``/BLAS, everything else is
its compiled join over broadcast views followed by a ufunc reduction.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from einsummable.ir import scalar
from einsummable.ir.dtypes import to_numpy
from einsummable.ir.einsummable import IDENTITY, Einsummable, letter
from einsummable.ir.expr import Expr
from einsummable.ir.graph import Box, Constant, FillKind, Ramp, Tril

REDUCE = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}


@functools.lru_cache(maxsize=4096)
def compiled(join: Expr, dtypes: tuple[str, ...]) -> scalar.Compiled:
    return scalar.Compiled(join, dtypes)


def einsum(op: Einsummable, arrays: Sequence[np.ndarray], variables: dict | None = None) -> np.ndarray:
    """Evaluate ``op`` on arrays shaped like its inputs; returns a fresh array."""
    covered = set(range(op.out_rank)) <= {i for idx in op.inputs for i in idx}
    plain = len(op.inputs) == 1 and op.join == IDENTITY and op.agg in (None, "add")
    if covered and (op.is_contraction() or plain):
        subs = ",".join("".join(letter(i) for i in idx) for idx in op.inputs)
        out = "".join(letter(i) for i in range(op.out_rank))
        result = np.einsum(f"{subs}->{out}", *arrays, optimize=len(arrays) > 1)
        result = np.broadcast_to(result, op.out_shape)
        return np.array(result, dtype=to_numpy(op.dtype), copy=True)
    views = [_align(a, idx, op.rank) for a, idx in zip(arrays, op.inputs, strict=True)]
    fn = compiled(op.join, op.dtypes)
    joined = fn(*views, variables=variables)
    if op.agg is not None:
        joined = REDUCE[op.agg].reduce(joined, axis=op.aggregated)
    joined = np.broadcast_to(joined, op.out_shape)
    return np.array(joined, dtype=to_numpy(op.dtype), copy=True)


def _align(a: np.ndarray, idx: tuple[int, ...], rank: int) -> np.ndarray:
    """View ``a`` with its axes in join order and size-1 axes for the indices it lacks."""
    order = sorted(range(len(idx)), key=lambda k: idx[k])
    a = a.transpose(order)
    present = sorted(idx)
    shape = [1] * rank
    for axis, i in enumerate(present):
        shape[i] = a.shape[axis]
    return a.reshape(shape)


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


def whole(shape: Sequence[int]) -> Box:
    return tuple((0, n) for n in shape)
