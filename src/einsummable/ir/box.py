"""Box geometry: a box is one ``(lo, hi)`` half-open range per dimension of a tensor.

Every layer speaks in boxes: a Select piece reads one, a partition's blocks are
boxes, a task computes one, and an engine stores its blocks by them. This module is
the one place their arithmetic is written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Box = tuple[tuple[int, int], ...]
Shape = tuple[int, ...]


def whole(shape: Sequence[int]) -> Box:
    """The box that covers a tensor of ``shape``."""
    return tuple((0, n) for n in shape)


def box_shape(box: Box) -> Shape:
    return tuple(hi - lo for lo, hi in box)


def volume(box: Box) -> int:
    return math.prod(hi - lo for lo, hi in box)


def intersect(a: Box, b: Box) -> Box | None:
    """The common hyper-rectangle of two boxes, or None when they do not meet."""
    out = tuple((max(lo1, lo2), min(hi1, hi2)) for (lo1, hi1), (lo2, hi2) in zip(a, b, strict=True))
    return None if any(lo >= hi for lo, hi in out) else out


def shift(box: Box, origin: Sequence[int]) -> Box:
    """``box`` in coordinates relative to ``origin``."""
    return tuple((lo - o, hi - o) for (lo, hi), o in zip(box, origin, strict=True))


def within(inner: Box, outer: Box) -> Box:
    """``inner`` in the coordinates of the block ``outer`` (its corner is the origin)."""
    return shift(inner, [lo for lo, _ in outer])


def place(extent: Sequence[int], origin: Sequence[int]) -> Box:
    """The box of ``extent`` whose corner is at ``origin``."""
    return tuple((o, o + n) for n, o in zip(extent, origin, strict=True))


def slices(box: Box) -> tuple[slice, ...]:
    """The numpy index that cuts ``box`` out of an array."""
    return tuple(slice(lo, hi) for lo, hi in box)


def fmt_box(box: Box) -> str:
    """``[0:4,2:3]``: the box as the printed IRs write it."""
    return "[" + ",".join(f"{lo}:{hi}" for lo, hi in box) + "]"
