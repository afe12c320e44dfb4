"""The compiled form of a join kernel, with the numpy kernel behind it as the fallback.

``kernel(op, fallback)`` is the hook ``kernels.prepare`` calls for the joins it would
otherwise run as numpy passes. Preparing only generates C source; the first call of
any compiled kernel builds every kernel prepared so far, in parallel batches, so a
program's kernels compile together (``cbuild``). Where the op has no C form, or no
compiler works, the numpy kernel runs.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Callable, Sequence

import numpy as np

from einsummable.engines import cbuild
from einsummable.errors import ExprError, ShapeError
from einsummable.ir.dtypes import to_numpy
from einsummable.ir.einsummable import Einsummable

Body = Callable[[Sequence[np.ndarray], dict | None], np.ndarray]

_pending: dict[str, cbuild.Source] = {}
_pending_lock = threading.Lock()


def kernel(op: Einsummable, fallback: Body) -> Body:
    """A body that runs ``op``'s generated C function, or ``fallback`` where there is none."""
    if op.agg in ("min", "max") and math.prod(op.join_shape[op.out_rank :]) == 0:
        return fallback  # numpy's error for an empty min/max stays numpy's
    src = cbuild.source(op)
    if src is None:
        return fallback
    with _pending_lock:
        _pending[src.name] = src
    return _Compiled(op, src, fallback)


def flush() -> None:
    """Build every kernel prepared and not yet built."""
    with _pending_lock:
        batch = list(_pending.values())
        _pending.clear()
    if batch:
        cbuild.build(batch)


class _Compiled:
    """Calls the C function: pointers, the join's sizes, each operand's strides per join dim."""

    def __init__(self, op: Einsummable, src: cbuild.Source, fallback: Body) -> None:
        self.op, self.src, self.fallback = op, src, fallback
        self.fn: ctypes._CFuncPtr | None = None
        self.dtypes = [to_numpy(d) for d in op.dtypes]
        self.shapes = [tuple(op.join_shape[i] for i in idx) for idx in op.inputs]
        self.sizes = np.array(op.join_shape or (0,), dtype=np.int64)
        self.out_dtype = to_numpy(op.dtype)
        self.acc_dtype = np.dtype(np.float32) if src.accumulate_f32 else self.out_dtype
        self.out_shape = op.out_shape
        self.rank, self.n = op.rank, len(op.inputs)

    def __call__(self, arrays: Sequence[np.ndarray], variables: dict | None = None) -> np.ndarray:
        fn = self.fn
        if fn is None:
            flush()
            fn = self.fn = cbuild.function(self.src)
            if fn is None:  # the build failed (warned once): numpy from now on
                self.__call__ = self.fallback  # type: ignore[method-assign]
                return self.fallback(arrays, variables)
        rank, kept = self.rank, []
        strides = np.zeros(max(1, self.n * rank), dtype=np.int64)
        pointers = (ctypes.c_void_p * max(1, self.n))()
        for k, a in enumerate(arrays):
            dtype = self.dtypes[k]
            a = np.asarray(a)  # a whole reduction may hand over a numpy scalar
            if a.dtype != dtype:
                a = a.astype(dtype)
            if a.shape != self.shapes[k]:
                raise ShapeError(f"operand {k} of {self.op.spec} has shape {a.shape}; "
                                 f"expected {self.shapes[k]}")
            if any(s % dtype.itemsize for s in a.strides):
                a = np.ascontiguousarray(a)
            for pos, d in enumerate(self.op.inputs[k]):
                strides[k * rank + d] = a.strides[pos] // dtype.itemsize
            pointers[k] = a.ctypes.data
            kept.append(a)
        values = np.array([_variable(name, variables) for name in self.src.variables] or [0.0])
        out = np.empty(self.out_shape, dtype=self.acc_dtype)
        fn(pointers, self.sizes.ctypes.data, strides.ctypes.data, values.ctypes.data, out.ctypes.data)
        return out.astype(self.out_dtype) if self.acc_dtype != self.out_dtype else out


def _variable(name: str, variables: dict | None) -> float:
    if variables is None or name not in variables:
        raise ExprError(f"run-time variable {name!r} was not given a value")
    return float(variables[name])
