"""The builders no Tensor operator needs: broadcasting, concatenation, padding, complex views
and ``where``, written with tensor.py's primitives."""

from __future__ import annotations

from collections.abc import Sequence

from einsummable.errors import ShapeError
from einsummable.frontend.shapes import broadcast_shapes, kept_axes, normalize_axes
from einsummable.frontend.tensor import Scalar, Tensor, apply, elementwise, reshape, select
from einsummable.ir.box import whole
from einsummable.ir.einsummable import IDENTITY, Einsummable
from einsummable.ir.graph import ComplexView, to_shape


def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    """``x`` repeated to ``shape`` by numpy's rules: ``[n]`` to ``[m, n]``."""
    shape = to_shape(shape)
    if broadcast_shapes([x.shape, shape]) != shape:
        raise ShapeError(f"cannot broadcast {x.shape} to {shape}")
    keep = kept_axes(x.shape, shape)
    t = reshape(x, tuple(x.shape[d] for d in keep))
    op = Einsummable(shape, (tuple(len(shape) - x.ndim + d for d in keep),), len(shape), IDENTITY, None,
                     (x.dtype,))
    return apply(op, [t])


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Tensors joined along ``axis`` (others equal), like ``np.concatenate``."""
    if not tensors:
        raise ShapeError("concat needs at least one tensor")
    first = tensors[0]
    axis = normalize_axes(axis, first.ndim)[0]
    for t in tensors[1:]:
        if t.ndim != first.ndim or any(
            a != b for d, (a, b) in enumerate(zip(t.shape, first.shape, strict=True)) if d != axis
        ):
            raise ShapeError(f"concat along axis {axis}: shapes {first.shape} and {t.shape} disagree")
    if len(tensors) == 1:
        return first  # as a whole slice is the tensor itself: no copy
    pieces, offset = [], 0
    for t in tensors:
        dst = tuple(offset if d == axis else 0 for d in range(first.ndim))
        pieces.append((t, whole(t.shape), dst))
        offset += t.shape[axis]
    shape = tuple(offset if d == axis else n for d, n in enumerate(first.shape))
    return select(shape, pieces)


def pad(x: Tensor, widths: Sequence[tuple[int, int]], value: float = 0.0) -> Tensor:
    """``x`` with ``widths[d] = (before, after)`` elements of ``value`` around axis d, like ``np.pad``."""
    if len(widths) != x.ndim:
        raise ShapeError(f"pad widths {widths} need one (before, after) pair per axis of {x.shape}")
    shape = tuple(n + a + b for n, (a, b) in zip(x.shape, widths, strict=True))
    return select(shape, [(x, whole(x.shape), tuple(a for a, _ in widths))], pad=value)


def view_as_complex(x: Tensor) -> Tensor:
    """``f32[..., 2n]`` as ``c64[..., n]``: pairs (re, im) along the last axis."""
    if x.dtype != "f32" or not x.shape or x.shape[-1] % 2:
        raise ShapeError(f"view_as_complex needs f32[..., 2n], got {x.dtype}{list(x.shape)}")
    return x.graph.add(ComplexView((x.id,), (*x.shape[:-1], x.shape[-1] // 2), "c64"))


def view_as_real(x: Tensor) -> Tensor:
    """``c64[..., n]`` as ``f32[..., 2n]``."""
    if x.dtype != "c64" or not x.shape:
        raise ShapeError(f"view_as_real needs c64[..., n], got {x.dtype}{list(x.shape)}")
    return x.graph.add(ComplexView((x.id,), (*x.shape[:-1], 2 * x.shape[-1]), "f32"))


def where(cond: Tensor, a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
    """``a`` where the comparison ``cond`` holds, else ``b``: ``where(x > 0, x, 0.0)``, like ``np.where``."""
    return elementwise("where(x0, x1, x2)", cond, a, b)
