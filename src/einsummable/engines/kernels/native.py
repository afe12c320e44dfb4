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

from einsummable.engines.kernels import aligned, cbuild
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
    register(src)
    return _Compiled(op, src, fallback)


def register(src: cbuild.Source) -> None:
    """Build ``src`` with the next batch (``flush``), not alone at its first call."""
    with _pending_lock:
        _pending[src.name] = src


def flush() -> None:
    """Build every kernel prepared and not yet built."""
    with _pending_lock:
        batch = list(_pending.values())
        _pending.clear()
    if batch:
        cbuild.build(batch)


class Function:
    """A generated C function, built with its batch (``flush``) at its first call: ``get()`` is
    it, or None once its build failed (warned once; the caller's numpy path from then on).
    ``call`` hands it the operands' addresses, the sizes, the strides, the run-time variables
    and a fresh output block."""

    def __init__(self, src: cbuild.Source) -> None:
        self.src = src
        self.fn: ctypes._CFuncPtr | None = None
        self.failed = False
        self.no_variables = (ctypes.c_double * 1)()

    def get(self) -> ctypes._CFuncPtr | None:
        if self.fn is None and not self.failed:
            flush()
            self.fn = cbuild.function(self.src)
            self.failed = self.fn is None
        return self.fn

    def call(self, fn: ctypes._CFuncPtr, pointers: ctypes.Array, sizes: ctypes.Array, strides: ctypes.Array,
             variables: dict | None, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        names = self.src.variables
        values = (ctypes.c_double * len(names))(*[_variable(n, variables) for n in names]) if names \
            else self.no_variables
        out, at = aligned.empty(shape, dtype)
        fn(pointers, sizes, strides, values, ctypes.c_void_p(at))
        return out


class _Compiled(Function):
    """Calls the C function: pointers, the join's sizes, each operand's strides per join dim."""

    def __init__(self, op: Einsummable, src: cbuild.Source, fallback: Body) -> None:
        super().__init__(src)
        self.op, self.fallback = op, fallback
        self.operands = [(to_numpy(d), tuple(op.join_shape[i] for i in idx),
                          lambda k=k: f"operand {k} of {op.spec}")
                         for k, (d, idx) in enumerate(zip(op.dtypes, op.inputs, strict=True))]
        self.sizes = (ctypes.c_int64 * max(1, op.rank))(*op.join_shape)
        # a half sum comes back in its f32 accumulator, as the numpy body's does: the
        # prepared kernel rounds it once, to its own dtype (f32 where the sum is kept wide)
        self.acc_dtype = np.dtype(np.float32) if src.accumulate_f32 else to_numpy(op.dtype)
        self.out_shape = op.out_shape
        self.pointers = ctypes.c_void_p * max(1, len(op.inputs))
        self.strides: dict[tuple, ctypes.Array] = {}  # per operand strides: the C side reads them only

    def __call__(self, arrays: Sequence[np.ndarray], variables: dict | None = None) -> np.ndarray:
        fn = self.fn if self.fn is not None else self.get()
        if fn is None:  # the build failed: numpy
            return self.fallback(arrays, variables)
        arrays = operands(arrays, self.operands)
        key = tuple([a.strides for a in arrays])
        strides = self.strides.get(key)
        if strides is None:
            strides = self.strides[key] = self._strides(arrays)
        pointers = self.pointers(*[aligned.address(a) for a in arrays])
        return self.call(fn, pointers, self.sizes, strides, variables, self.out_shape, self.acc_dtype)

    def _strides(self, arrays: list[np.ndarray]) -> ctypes.Array:
        out = (ctypes.c_int64 * max(1, len(arrays) * self.op.rank))()
        write_strides(out, 0, arrays, self.op)
        return out


Operand = tuple[np.dtype, tuple[int, ...], Callable[[], str]]  # dtype, shape, what to call it in an error


def operands(arrays: Sequence[np.ndarray], wanted: Sequence[Operand]) -> list[np.ndarray]:
    """Each array as the C side reads it (``operand``); the usual case, an array already so,
    is tested inline: this runs on every call of a compiled kernel."""
    return [a if type(a) is np.ndarray and a.dtype == t and a.shape == shape and a.flags.c_contiguous
            else operand(a, t, shape, what) for a, (t, shape, what) in zip(arrays, wanted, strict=True)]


def operand(a: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], what: Callable[[], str]) -> np.ndarray:
    """``a`` as the C side reads it: ``dtype``, ``shape``, strides in whole elements."""
    if type(a) is not np.ndarray or a.dtype != dtype:  # a whole reduction may hand over a scalar
        a = np.asarray(a, dtype=dtype)
    if a.shape != shape:
        raise ShapeError(f"{what()} has shape {a.shape}; expected {shape}")
    # a contiguous array's strides are whole elements (a size-1 dim's may be anything: times 0)
    if not a.flags.c_contiguous and any(s % dtype.itemsize for s in a.strides):
        a = np.ascontiguousarray(a)
    return a


def write_strides(out: ctypes.Array, at: int, arrays: Sequence[np.ndarray | None], op: Einsummable) -> None:
    """Each of ``op``'s operands' stride, in elements, along every join dim (0 where it has
    none), from ``out[at]`` on; a None operand's stay 0."""
    rank = op.rank
    for k, (a, idx) in enumerate(zip(arrays, op.inputs, strict=True)):
        if a is not None:
            for pos, d in enumerate(idx):
                out[at + k * rank + d] = a.strides[pos] // a.itemsize


def _variable(name: str, variables: dict | None) -> float:
    if variables is None or name not in variables:
        raise ExprError(f"run-time variable {name!r} was not given a value")
    return float(variables[name])
