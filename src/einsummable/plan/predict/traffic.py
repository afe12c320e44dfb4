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

from einsummable.ir.box import volume
from einsummable.ir.dtypes import itemsize
from einsummable.ir.graph import EinGraph, Fill, Select
from einsummable.plan.partition import Partition
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


def overlap_pairs(a: Partition, b: Partition) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks of a and b that meet, sparse: (block of a, block of b, elements in common).

    Along one dimension the cuts of both partitions split it into segments, each
    inside one block of a and one of b; the pairs in several dimensions are the
    products of these, so the cost grows with the pairs that meet, not blocks × blocks.
    """
    rows, cols, vol = np.zeros(1, np.int64), np.zeros(1, np.int64), np.ones(1)
    for ba, bb in zip(a.bounds, b.bounds, strict=True):
        ea, eb = np.array(ba), np.array(bb)
        cuts = np.union1d(ea, eb)
        lo, length = cuts[:-1], np.diff(cuts)
        ia, ib = np.searchsorted(ea, lo, "right") - 1, np.searchsorted(eb, lo, "right") - 1
        rows = (rows[:, None] * (len(ba) - 1) + ia[None, :]).ravel()
        cols = (cols[:, None] * (len(bb) - 1) + ib[None, :]).ravel()
        vol = (vol[:, None] * length[None, :]).ravel()
    return rows, cols, vol


def _sums(codes: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique codes and the sum of the values of each."""
    unique, inverse = np.unique(codes, return_inverse=True)
    return unique, np.bincount(inverse, weights=values, minlength=len(unique))


def _lookup(codes: np.ndarray, sums: np.ndarray, queries: np.ndarray) -> np.ndarray:
    if not len(codes):
        return np.zeros(queries.shape)
    i = np.minimum(np.searchsorted(codes, queries), len(codes) - 1)
    return np.where(codes[i] == queries, sums[i], 0.0)


@dataclass(frozen=True, eq=False)
class EdgeCost:
    """What the reader blocks of one operand receive, kept sparse over locations.

    A reader block reads one *read block* (``key``); bytes are summed per (read
    block, worker) and per (read block, machine) that holds them, so a query for
    any block at any worker costs a binary search instead of a blocks × workers matrix.
    """

    key: np.ndarray  # [reader blocks]: the read block; equal (tag, key) at one location are one read
    tag: object
    total: np.ndarray  # [read blocks]: bytes
    on_worker: tuple[np.ndarray, np.ndarray]  # codes read block * workers + worker, bytes
    on_machine: tuple[np.ndarray, np.ndarray]  # codes read block * machines + machine, bytes
    top: np.ndarray  # [read blocks, TOP]: the workers holding the most of each, -1 past the end
    machines: np.ndarray  # machine of each worker

    def at(self, blocks: np.ndarray, workers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bytes from the same machine and from other machines, for reader block b at worker w."""
        r = self.key[blocks]
        here = _lookup(*self.on_worker, r * len(self.machines) + workers)
        machine = _lookup(*self.on_machine, r * (int(self.machines[-1]) + 1) + self.machines[workers])
        return machine - here, self.total[r] - machine


TOP = 2  # holders of a read block that placement considers


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
    workers, n_machines = len(machines), int(machines[-1]) + 1
    if isinstance(src, Fill):
        rows = qs = np.zeros(0, np.int64)
        vol, key, tag, n_rows = np.zeros(0), np.arange(part.num_blocks), ("fill", nid), part.num_blocks
    elif isinstance(node, Select):
        dense, key = _select_volumes(node, k, part, prod.part)
        rows, qs = np.nonzero(dense)
        vol, tag, n_rows = dense[rows, qs], ("select", nid, k), part.num_blocks
    else:
        opart = operand_partition(sp, k, part, src.shape)
        rows, qs, vol = overlap_pairs(opart, prod.part)
        idx = block_indices(part.counts)
        key = np.zeros(part.num_blocks, dtype=np.int64)
        for d, c in zip(sp.operands[k], opart.counts, strict=True):
            if d is not None:
                key = key * c + idx[:, d]
        tag, n_rows = opart, opart.num_blocks
    # each read block overlaps few producer blocks, each held in one place or a few
    pos, loc = prod.entries_of(qs)
    r, v = rows[pos], vol[pos] * itemsize(src.dtype)
    on_worker = _sums(r * workers + loc, v)
    codes, held = on_worker
    order = np.lexsort((-held, codes // workers))
    owner = codes[order] // workers
    rank = np.arange(len(order)) - np.searchsorted(owner, owner)
    top = np.full((n_rows, TOP), -1, dtype=np.int64)
    keep = rank < TOP
    top[owner[keep], rank[keep]] = codes[order][keep] % workers
    return EdgeCost(key, tag, np.bincount(r, weights=v, minlength=n_rows), on_worker,
                    _sums(r * n_machines + machines[loc], v), top, machines)


def _select_volumes(node: Select, k: int, part: Partition, prod: Partition) -> tuple[np.ndarray, np.ndarray]:
    """[select blocks, producer blocks] read volumes; equal source boxes in a block are read once."""
    vol = np.zeros((part.num_blocks, prod.num_blocks))
    for b, box in enumerate(part.boxes()):
        boxes = {src for _, (j, src), _ in node.reads(box) if j == k}
        for src in boxes:
            for q, inter in prod.overlapping(src):
                vol[b, q] += volume(inter)
    return vol, np.arange(part.num_blocks)


def flops_per_block(sp: Space, part: Partition) -> np.ndarray:
    if sp.flops == 0 or part.num_blocks == 0:
        return np.zeros(part.num_blocks)
    per = sp.flops / max(1, math.prod(sp.shape))
    sizes = np.ones(part.num_blocks)
    idx = block_indices(part.counts)
    for d, b in enumerate(part.bounds):
        sizes = sizes * np.diff(np.array(b))[idx[:, d]]
    return sizes * per

