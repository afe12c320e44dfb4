"""Outputs from blocks: a tensor kept as the blocks a run left on the workers (resident
state between runs), or assembled into one array."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from einsummable.ir.box import Box, box_shape, intersect, slices, whole, within
from einsummable.ir.dtypes import to_numpy
from einsummable.lower.taskgraph import Output


class Blocks:
    """``box -> array`` for one tensor; ``get(box)`` serves any block of any partition.

    When the next run wants the partition this one produced (the usual case for
    parameters and optimizer state), ``get`` hands back the stored array itself; a box
    inside one stored block is a view of it (engines never write into a block they read,
    and a fresh copy of every weight each run cost more than the product that read it:
    Llama prefill at batch 8 on 2 workers, whose plan halves the weights it stored whole).
    """

    def __init__(self, shape: tuple[int, ...], dtype: str, blocks: dict[Box, np.ndarray]) -> None:
        self.shape = shape
        self.dtype = dtype
        self.blocks = blocks

    def get(self, box: Box) -> np.ndarray:
        exact = self.blocks.get(box)
        if exact is not None:
            return exact
        for have, array in self.blocks.items():
            if intersect(box, have) == box:
                return array[slices(within(box, have))]
        out = np.empty(box_shape(box), dtype=to_numpy(self.dtype))
        for have, array in self.blocks.items():
            meet = intersect(box, have)
            if meet is not None:
                out[slices(within(meet, box))] = array[slices(within(meet, have))]
        return out

    def array(self) -> np.ndarray:
        return self.get(whole(self.shape))

    def __repr__(self) -> str:
        return f"Blocks({self.dtype}{list(self.shape)}, {len(self.blocks)} blocks)"


def assemble(out: Output, values: Mapping[int, np.ndarray]) -> np.ndarray:
    """An output as one fresh array (never a view of a block) from its blocks' values."""
    if len(out.blocks) == 1:
        return np.array(values[out.blocks[0][0]], dtype=to_numpy(out.dtype), copy=True)
    array = np.empty(out.shape, dtype=to_numpy(out.dtype))
    for t, box in out.blocks:
        array[slices(box)] = values[t]
    return array
