"""Integer ids as indices: ``take`` (numpy's ``np.take``) and ``one_hot``, as equality joins.

Both compare the ids with an index ramp, so no ids x classes one-hot is ever fed: ``take``
is ``sum_v where(ids == v, x[v], 0)``, which the kernels run as a gather (and its gradient
as a scatter-add), and the planner splits like any other einsum. The ids are recorded as
class ids (frontend/class_ids.py), so a fed id outside [0, n) is refused when fed.
"""

from __future__ import annotations

import string

from einsummable.errors import DtypeError, ShapeError
from einsummable.frontend.class_ids import mark_class_ids
from einsummable.frontend.einsum import einsum
from einsummable.frontend.tensor import Tensor
from einsummable.ir.dtypes import INTS, canonical


def _check_ids(ids: Tensor, what: str) -> None:
    if not isinstance(ids, Tensor):
        raise DtypeError(f"{what}'s indices must be an integer Tensor (i32 or i64), got {type(ids).__name__}")
    if ids.dtype not in INTS:
        raise DtypeError(f"{what}'s indices must be integers (i32 or i64), got {ids.dtype}; "
                         "cast them first: ids.astype('i64')")


def take(x: Tensor, ids: Tensor, axis: int = 0) -> Tensor:
    """``np.take(x, ids, axis)``: shape ``x.shape[:axis] + ids.shape + x.shape[axis + 1:]``.

    ``ids`` holds integers in [0, x.shape[axis]) (no negative wrap-around). Example, an
    embedding: ``es.take(table, tokens)`` is ``table[tokens]``, [b, s] ids into [v, d] -> [b, s, d].
    """
    _check_ids(ids, "take")
    if not isinstance(axis, int) or not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"take axis {axis!r} out of range for a tensor of rank {x.ndim}")
    axis %= x.ndim
    if x.ndim + ids.ndim + 1 > len(string.ascii_letters):
        raise ShapeError(f"take of rank {x.ndim} by ids of rank {ids.ndim}: too many axes for one einsum")
    n = x.shape[axis]
    mark_class_ids(ids, n, "take indices")
    letters = iter(string.ascii_letters)
    x_spec = [next(letters) for _ in range(x.ndim)]
    id_spec = "".join(next(letters) for _ in range(ids.ndim))
    v = x_spec[axis]
    out = "".join(x_spec[:axis]) + id_spec + "".join(x_spec[axis + 1 :])
    ramp = x.graph.ramp((n,), steps=(1.0,), dtype=ids.dtype)
    return einsum(f"{id_spec},{v},{''.join(x_spec)}->{out}", ids, ramp, x,
                  join="where(x0 == x1, x2, 0)", agg="add")


def one_hot(ids: Tensor, classes: int, dtype: object = "f32") -> Tensor:
    """``ids.shape + (classes,)``: 1 where the last index equals the id, else 0 (as
    ``jax.nn.one_hot``; ``torch.nn.functional.one_hot`` gives i64: pass dtype="i64")."""
    _check_ids(ids, "one_hot")
    if not isinstance(classes, int) or isinstance(classes, bool) or classes < 0:
        raise ShapeError(f"one_hot needs a non-negative int number of classes, got {classes!r}")
    dtype = canonical(dtype)
    mark_class_ids(ids, classes, "one_hot ids")
    spec = string.ascii_letters[: ids.ndim]
    ramp = ids.graph.ramp((classes,), steps=(1.0,), dtype=ids.dtype)
    return einsum(f"{spec},Z->{spec}Z", ids, ramp, join=f"cast(where(x0 == x1, 1, 0), {dtype})")
