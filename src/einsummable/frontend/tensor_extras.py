"""numpy surface on a Tensor beyond the core builders: step slicing, ``2 ** x``, argmax and
argmin, var and std, ``stack``. Kept apart from frontend/tensor.py, which holds the primitive
builders: this module builds on them and attaches its methods to the Tensor at import
(einsummable/__init__.py imports it), so core never imports it back."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from einsummable.errors import DtypeError, ShapeError
from einsummable.frontend import builders, shapes
from einsummable.frontend import tensor as core
from einsummable.frontend.gather import take
from einsummable.ir.dtypes import INTS


def rpow(base: object, x: core.Tensor) -> core.Tensor:
    """``base ** x`` for a positive constant base, as ``exp(x * ln base)``."""
    if not isinstance(base, int | float) or isinstance(base, bool) or base <= 0:
        raise DtypeError(f"number ** Tensor takes a positive Python number as base, got {base!r}; "
                         "for other bases write es.where(...) or exp(x * log(base)) yourself")
    return core.elementwise(f"exp(x0 * {math.log(base)!r})", x)


def var(x: core.Tensor, axis=None, keepdims: bool = False, ddof: int = 0) -> core.Tensor:
    """numpy's ``var``: the mean squared deviation, divided by ``count - ddof``."""
    axes = shapes.normalize_axes(axis, x.ndim)
    count = math.prod(x.shape[a] for a in axes)
    if count - ddof <= 0:
        raise ShapeError(f"var over {count} element(s) with ddof={ddof}: nothing to divide by")
    d = x - x.mean(axis=axes, keepdims=True)
    return core.reduce(d * d, axes, "add", join=f"x0 * {1.0 / (count - ddof)!r}", keepdims=keepdims)


def std(x: core.Tensor, axis=None, keepdims: bool = False, ddof: int = 0) -> core.Tensor:
    """Standard deviation over ``axis`` with ``ddof``, like ``np.std``."""
    return var(x, axis, keepdims, ddof).sqrt()


def _arg(x: core.Tensor, axis: int | None, keepdims: bool, best: str) -> core.Tensor:
    """The first index of the max (min) along ``axis``: compare with the reduced value, keep the
    index ramp where equal, and take the smallest. The index is an i64, as numpy's."""
    if axis is None:
        if keepdims:
            raise ShapeError("argmax/argmin with axis=None and keepdims=True: name an axis")
        return _arg(x.reshape(x.size), 0, False, best)
    if not isinstance(axis, int) or not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"argmax/argmin axis {axis!r} out of range for a tensor of rank {x.ndim}")
    axis %= x.ndim
    top = getattr(x, best)(axis=axis, keepdims=True)
    steps = tuple(1.0 if d == axis else 0.0 for d in range(x.ndim))
    ramp = x.graph.ramp(x.shape, steps, dtype="i64")
    index = builders.where(x == top, ramp, x.shape[axis])
    return index.min(axis=axis, keepdims=keepdims)


def argmax(x: core.Tensor, axis: int | None = None, keepdims: bool = False) -> core.Tensor:
    """Index of the first max along ``axis`` (None: flattened), an i64 as numpy's."""
    return _arg(x, axis, keepdims, "max")


def argmin(x: core.Tensor, axis: int | None = None, keepdims: bool = False) -> core.Tensor:
    """Index of the first min along ``axis`` (None: flattened), an i64 as numpy's."""
    return _arg(x, axis, keepdims, "min")


def stack(tensors: Sequence[core.Tensor], axis: int = 0) -> core.Tensor:
    """numpy's ``stack``: a new axis of length ``len(tensors)``."""
    if not tensors:
        raise ShapeError("stack needs at least one tensor")
    rank = tensors[0].ndim + 1
    if not -rank <= axis < rank:
        raise ShapeError(f"stack axis {axis} out of range for tensors of rank {rank - 1}")
    axis %= rank
    shapes = {t.shape for t in tensors}
    if len(shapes) > 1:
        raise ShapeError(f"stack needs tensors of one shape, got {sorted(shapes)}")
    grown = [t.reshape((*t.shape[:axis], 1, *t.shape[axis:])) for t in tensors]
    return builders.concat(grown, axis=axis)


def getitem(x: core.Tensor, key) -> core.Tensor:
    """numpy's basic indexing, steps included: a stepped slice is taken whole first, then its
    elements picked one piece each by a select. A boolean mask is refused: it selects a
    number of elements known only when the program runs."""
    keys = key if isinstance(key, tuple) else (key,)
    ids = [a for a, k in enumerate(keys) if isinstance(k, core.Tensor) and k.dtype in INTS]
    if len(ids) == 1 and all(k == slice(None) for a, k in enumerate(keys) if a != ids[0]):
        return take(x, keys[ids[0]], axis=ids[0])  # x[:, ids]: a gather by integer ids
    for k in keys:
        if isinstance(k, (core.Tensor | np.ndarray | list, bool)):
            raise ShapeError(f"index {type(k).__name__} (a mask or an index array) is not supported: "
                             "a graph's shapes are fixed before it runs; use es.where(mask, x, 0) "
                             "to zero the unselected elements; an integer Tensor of ids gathers alone "
                             "(x[ids], x[:, ids]), or by es.take(x, ids, axis)")
    if not any(isinstance(k, slice) and k.step not in (None, 1) for k in keys):
        return core.getitem(x, key)
    n_real = sum(1 for k in keys if k is not None and k is not Ellipsis)
    if Ellipsis in keys:
        at = keys.index(Ellipsis)
        keys = (*keys[:at], *[slice(None)] * (x.ndim - n_real), *keys[at + 1:])
    plain, stepped, out_axis, dim = [], [], 0, 0
    for k in keys:
        if k is None:
            plain.append(k)
            out_axis += 1
            continue
        if isinstance(k, slice) and k.step not in (None, 1):
            if dim >= x.ndim:
                raise ShapeError(f"too many indices ({n_real}) for a tensor of rank {x.ndim}")
            stepped.append((out_axis, range(*k.indices(x.shape[dim]))))
            plain.append(slice(None))
        else:
            plain.append(k)
        if not isinstance(k, int):
            out_axis += 1
        dim += 1
    y = core.getitem(x, tuple(plain))
    for axis, picks in stepped:
        y = _pick(y, axis, picks)
    return y


def _pick(y: core.Tensor, axis: int, picks: range) -> core.Tensor:
    """Elements ``picks`` of ``axis`` side by side, one select piece each."""
    shape = list(y.shape)
    shape[axis] = len(picks)
    pieces = []
    for j, i in enumerate(picks):
        box = tuple((i, i + 1) if d == axis else (0, n) for d, n in enumerate(y.shape))
        pieces.append((y, box, tuple(j if d == axis else 0 for d in range(y.ndim))))
    return core.select(shape, pieces)


core.Tensor.__getitem__ = getitem
core.Tensor.__rpow__ = lambda self, base: rpow(base, self)
core.Tensor.argmax = argmax
core.Tensor.argmin = argmin
core.Tensor.var = var
core.Tensor.std = std
