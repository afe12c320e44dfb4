"""Partitions of an index space into hyper-rectangular blocks, and their overlaps.

A partition is, per dimension, a tuple of block boundaries ``(0, b1, ..., n)``.
Blocks are numbered row-major over the per-dimension block indices. Near-equal
splits put the larger blocks first: ``split(10, 3) == (0, 4, 7, 10)``.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from einsummable.errors import PlanError
from einsummable.ir.box import Box


def split(n: int, k: int) -> tuple[int, ...]:
    """Boundaries of ``k`` near-equal blocks of ``range(n)``; sizes differ by at most one."""
    if not 1 <= k <= max(n, 1):
        raise PlanError(f"cannot cut a dimension of size {n} into {k} blocks (need 1 <= k <= {max(n, 1)})")
    q, r = divmod(n, k)
    return tuple(i * q + min(i, r) for i in range(k + 1))


@dataclass(frozen=True)
class Partition:
    """Block boundaries per dimension of a shape."""

    bounds: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        for d, b in enumerate(self.bounds):
            empty = b == (0, 0)  # a zero-size dimension is one empty block
            if not empty and (len(b) < 2 or b[0] != 0 or any(lo >= hi for lo, hi in itertools.pairwise(b))):
                raise PlanError(f"dimension {d} has bad block boundaries {b}")

    @staticmethod
    def uniform(shape: Sequence[int], counts: Sequence[int]) -> Partition:
        """Near-equal blocks: ``counts[d]`` of them along dimension d."""
        if len(shape) != len(counts):
            raise PlanError(f"{len(counts)} block counts for a shape of rank {len(shape)}")
        return Partition(tuple(split(n, k) for n, k in zip(shape, counts, strict=True)))

    @staticmethod
    def whole(shape: Sequence[int]) -> Partition:
        return Partition(tuple((0, n) for n in shape))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b[-1] for b in self.bounds)

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(len(b) - 1 for b in self.bounds)

    @property
    def num_blocks(self) -> int:
        return math.prod(self.counts)

    def block_index(self, flat: int) -> tuple[int, ...]:
        out = []
        for c in reversed(self.counts):
            flat, r = divmod(flat, c)
            out.append(r)
        return tuple(reversed(out))

    def flat(self, index: Sequence[int]) -> int:
        f = 0
        for i, c in zip(index, self.counts, strict=True):
            f = f * c + i
        return f

    def box(self, flat: int) -> Box:
        idx = self.block_index(flat)
        return tuple((b[i], b[i + 1]) for b, i in zip(self.bounds, idx, strict=True))

    def boxes(self) -> Iterator[Box]:
        for idx in itertools.product(*(range(c) for c in self.counts)):
            yield tuple((b[i], b[i + 1]) for b, i in zip(self.bounds, idx, strict=True))

    def restrict(self, dims: Sequence[int]) -> Partition:
        """The partition seen by a tensor whose axes are ``dims`` of this space."""
        return Partition(tuple(self.bounds[d] for d in dims))

    def overlapping(self, box: Box) -> list[tuple[int, Box]]:
        """Blocks that meet ``box``: (flat block id, the intersection), row-major."""
        ranges = []
        for b, (lo, hi) in zip(self.bounds, box, strict=True):
            if lo == hi:
                return []
            first = bisect.bisect_right(b, lo) - 1
            last = bisect.bisect_left(b, hi) - 1
            ranges.append([(i, (max(lo, b[i]), min(hi, b[i + 1]))) for i in range(first, last + 1)])
        out = []
        for combo in itertools.product(*ranges):
            out.append((self.flat([i for i, _ in combo]), tuple(r for _, r in combo)))
        return out

    def describe(self, names: Sequence[str]) -> str:
        return " ".join(f"{n}:{c}" for n, c in zip(names, self.counts, strict=True)) or "scalar"
