"""Shape arithmetic the frontend's builders share: numpy broadcasting, axis arguments
and basic indexing, on plain tuples so that every builder reads them the same way."""

from __future__ import annotations

from collections.abc import Sequence

from einsummable.errors import ShapeError
from einsummable.ir.box import Box


def broadcast_shapes(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """numpy's broadcast of ``shapes``, or a ShapeError that names the axis that clashes."""
    rank = max(len(s) for s in shapes)
    out = []
    for d in range(rank):
        sizes = {s[len(s) - rank + d] for s in shapes if len(s) - rank + d >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise ShapeError(f"shapes {', '.join(map(str, shapes))} do not broadcast (axis {d})")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def kept_axes(shape: tuple[int, ...], target: tuple[int, ...]) -> list[int]:
    """The axes of ``shape`` that survive broadcasting it, right-aligned, to ``target``:
    a size-1 axis that stretches is dropped, since the einsummable spreads it instead."""
    offset = len(target) - len(shape)
    return [d for d in range(len(shape)) if not (shape[d] == 1 and target[offset + d] != 1)]


def normalize_axes(axis, ndim: int) -> tuple[int, ...]:
    """An ``axis=`` argument (None, an int or a sequence, negatives allowed) as sorted axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ShapeError(f"axis {a} is out of range for a tensor of rank {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"repeated axis in {axis}")
    return tuple(sorted(out))


def index_box(shape: tuple[int, ...], key) -> tuple[Box, tuple[int, ...]]:
    """Basic numpy indexing (ints, slices with step 1, None, Ellipsis) as the box it reads
    and the shape of the result."""
    if not isinstance(key, tuple):
        key = (key,)
    ndim = len(shape)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise ShapeError("an index can only have a single ellipsis")
    if n_real > ndim:
        raise ShapeError(f"too many indices ({n_real}) for a tensor of rank {ndim}")
    fill = [slice(None)] * (ndim - n_real)
    if Ellipsis in key:
        at = key.index(Ellipsis)
        expanded = [*key[:at], *fill, *key[at + 1 :]]
    else:
        expanded = [*key, *fill]
    box, out_shape, dim = [], [], 0
    for k in expanded:
        if k is None:
            out_shape.append(1)
            continue
        n = shape[dim]
        if isinstance(k, int) and not isinstance(k, bool):
            if not -n <= k < n:
                raise ShapeError(f"index {k} is out of bounds for axis {dim} with size {n}")
            k %= n
            box.append((k, k + 1))
        elif isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step != 1:
                raise ShapeError(f"slice step {k.step} on axis {dim}: only step 1 is supported")
            stop = max(start, stop)
            box.append((start, stop))
            out_shape.append(stop - start)
        else:
            raise ShapeError(f"unsupported index {k!r}; use ints, slices, None or ...")
        dim += 1
    return tuple(box), tuple(out_shape)
