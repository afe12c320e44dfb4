"""Bytes a placed block must receive, computed as numpy matrices per graph edge.

These are the same rules the lowering follows, so the figures a plan reports are
the bytes its TaskGraph moves:
- a piece of a producer block that lives where it is needed does not move;
- a piece moves once per destination, however many blocks there read it;
- partial sums are first added up where they live, so each location holding
  pieces of an output block sends that block once;
- fills are rebuilt where they are read and never move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from einsummable.ir.dtypes import itemsize
from einsummable.ir.graph import EinGraph, Fill, Select
from einsummable.plan.partition import Box, Partition, intersect, volume
from einsummable.plan.space import Space


@dataclass(frozen=True, eq=False)
class Holders:
    """Where each block of a node's output lives: one location, or several for partial sums.

    Entries are unique (block, location) pairs sorted by block, as flat arrays.
    """

    part: Partition
    block: np.ndarray
    loc: np.ndarray

    def entries_of(self, qs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each q in ``qs`` (repeats allowed), all its holders: (position in qs, location)."""
        starts = np.searchsorted(self.block, np.arange(self.part.num_blocks))
        counts = np.bincount(self.block, minlength=self.part.num_blocks)
        rep = counts[qs]
        pos = np.repeat(np.arange(len(qs)), rep)
        offset = np.arange(rep.sum()) - np.repeat(np.cumsum(rep) - rep, rep)
        return pos, self.loc[starts[qs][pos] + offset]


def holders(sp: Space, part: Partition, locs: tuple[int, ...]) -> Holders:
    """The output blocks of a placed node; a partial einsum has one piece per join block."""
    out = part.restrict(sp.out_dims)
    where = np.array(locs, dtype=np.int64)
    if not sp.aggregated:
        return Holders(out, np.arange(out.num_blocks), where)
    idx = block_indices(part.counts)
    q = np.zeros(part.num_blocks, dtype=np.int64)
    for d in sp.out_dims:
        q = q * part.counts[d] + idx[:, d]
    pairs = np.unique(np.stack([q, where], axis=1), axis=0)
    return Holders(out, pairs[:, 0], pairs[:, 1])


def block_indices(counts: tuple[int, ...]) -> np.ndarray:
    """[blocks, rank] per-dimension block indices in row-major order."""
    if not counts:
        return np.zeros((1, 0), dtype=np.int64)
    grids = np.meshgrid(*(np.arange(c) for c in counts), indexing="ij")
    return np.stack([gr.ravel() for gr in grids], axis=1)


def overlap_volumes(a: Partition, b: Partition) -> np.ndarray:
    """[blocks of a, blocks of b]: element counts of every pairwise intersection."""
    mats = []
    for ba, bb in zip(a.bounds, b.bounds, strict=True):
        lo = np.maximum(np.array(ba[:-1])[:, None], np.array(bb[:-1])[None, :])
        hi = np.minimum(np.array(ba[1:])[:, None], np.array(bb[1:])[None, :])
        mats.append(np.maximum(hi - lo, 0).astype(np.float64))
    out = np.ones((1, 1))
    for m in mats:
        out = (out[:, None, :, None] * m[None, :, None, :]).reshape(out.shape[0] * m.shape[0], -1)
    return out


@dataclass(frozen=True)
class EdgeCost:
    """Bytes that each reader block receives, per candidate location, for one operand."""

    within: np.ndarray  # [reader blocks, workers]: bytes from other cores of the same machine
    across: np.ndarray  # [reader blocks, workers]: bytes from other machines
    tag: object  # reads with equal (tag, key) at one location are one read
    key: np.ndarray  # [reader blocks]


def operand_partition(sp: Space, k: int, part: Partition, shape: tuple[int, ...]) -> Partition:
    """The partition of operand k that a space partition induces."""
    return Partition(
        tuple(part.bounds[d] if d is not None else (0, n) for d, n in zip(sp.operands[k], shape, strict=True))
    )


def edge_cost(
    g: EinGraph, nid: int, k: int, sp: Space, part: Partition, prod: Holders, machines: np.ndarray
) -> EdgeCost:
    """What the blocks of node ``nid`` receive for operand k, wherever they are placed."""
    node = g.nodes[nid]
    src = g.nodes[node.inputs[k]]
    workers = len(machines)
    if isinstance(src, Fill):
        zero = np.zeros((part.num_blocks, workers))
        return EdgeCost(zero, zero, ("fill", nid), np.arange(part.num_blocks))
    size = itemsize(src.dtype)
    if isinstance(node, Select):
        vol, key = _select_volumes(node, k, part, prod.part)
        tag: object = ("select", nid, k)
    else:
        opart = operand_partition(sp, k, part, src.shape)
        vol = overlap_volumes(opart, prod.part)
        idx = block_indices(part.counts)
        ocounts = [c for c, d in zip(opart.counts, sp.operands[k], strict=True) if d is not None]
        key = np.zeros(part.num_blocks, dtype=np.int64)
        for d, c in zip([d for d in sp.operands[k] if d is not None], ocounts, strict=True):
            key = key * c + idx[:, d]
        tag = opart
    # sparse: each read block overlaps few producer blocks, each held in one place or a few
    rows, qs = np.nonzero(vol)
    pos, loc = prod.entries_of(qs)
    r, v = rows[pos], vol[rows, qs][pos]
    n_rows, n_machines = vol.shape[0], int(machines.max()) + 1
    total = np.bincount(r, weights=v, minlength=n_rows)
    here = np.bincount(r * workers + loc, weights=v, minlength=n_rows * workers).reshape(n_rows, workers)
    per_machine = np.bincount(r * n_machines + machines[loc], weights=v, minlength=n_rows * n_machines)
    on_machine = per_machine.reshape(n_rows, n_machines)[:, machines]
    across = (total[:, None] - on_machine) * size
    within = (on_machine - here) * size
    return EdgeCost(within[key], across[key], tag, key)


def _select_volumes(node: Select, k: int, part: Partition, prod: Partition) -> tuple[np.ndarray, np.ndarray]:
    """[select blocks, producer blocks] read volumes; equal source boxes in a block are read once."""
    vol = np.zeros((part.num_blocks, prod.num_blocks))
    for b, box in enumerate(part.boxes()):
        boxes = {src for _, (j, src), _ in select_reads(node, box) if j == k}
        for src in boxes:
            for q, inter in prod.overlapping(src):
                vol[b, q] += volume(inter)
    return vol, np.arange(part.num_blocks)


def select_reads(node: Select, box: Box) -> list[tuple[int, tuple[int, Box], Box]]:
    """For an output block: (piece number, (operand, source box), target box in block coordinates)."""
    out = []
    for n, p in enumerate(node.pieces):
        hit = intersect(p.dst_box, box)
        if hit is None:
            continue
        src = tuple((lo - d + s, hi - d + s) for (lo, hi), d, (s, _) in zip(hit, p.dst, p.src, strict=True))
        local = tuple((lo - b, hi - b) for (lo, hi), (b, _) in zip(hit, box, strict=True))
        out.append((n, (p.input, src), local))
    return out


def flops_per_block(sp: Space, part: Partition) -> np.ndarray:
    if sp.flops == 0 or part.num_blocks == 0:
        return np.zeros(part.num_blocks)
    per = sp.flops / max(1, math.prod(sp.shape))
    sizes = np.ones(part.num_blocks)
    idx = block_indices(part.counts)
    for d, b in enumerate(part.bounds):
        sizes = sizes * np.diff(np.array(b))[idx[:, d]]
    return sizes * per
