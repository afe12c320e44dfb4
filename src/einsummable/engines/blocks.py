"""A tensor kept as the blocks a run left on the workers: resident state between runs."""

from __future__ import annotations

import numpy as np

from einsummable.ir.dtypes import to_numpy

Box = tuple[tuple[int, int], ...]


class Blocks:
    """``box -> array`` for one tensor; ``get(box)`` serves any block of any partition.

    When the next run wants the partition this one produced (the usual case for
    parameters and optimizer state), ``get`` hands back the stored array itself.
    """

    def __init__(self, shape: tuple[int, ...], dtype: str, blocks: dict[Box, np.ndarray]) -> None:
        self.shape = shape
        self.dtype = dtype
        self.blocks = blocks

    def get(self, box: Box) -> np.ndarray:
        exact = self.blocks.get(box)
        if exact is not None:
            return exact
        out = np.empty([hi - lo for lo, hi in box], dtype=to_numpy(self.dtype))
        for have, array in self.blocks.items():
            meet = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(box, have, strict=True))
            if all(lo < hi for lo, hi in meet) or not box:
                dst = tuple(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(meet, box, strict=True))
                src = tuple(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(meet, have, strict=True))
                out[dst] = array[src]
        return out

    def array(self) -> np.ndarray:
        return self.get(tuple((0, n) for n in self.shape))

    def __repr__(self) -> str:
        return f"Blocks({self.dtype}{list(self.shape)}, {len(self.blocks)} blocks)"
