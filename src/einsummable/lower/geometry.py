"""The geometry of a fetch (lower/blockwise.py): everything but the tasks it makes.

Which producer blocks each box meets, the pieces, which of them move, how each
box is assembled: that depends on the producer's partition and machines, the
boxes, their machines and their places in lowering.py's order, never on task ids.
Lowering computes it once per distinct such tuple (``key``) and replays it: the
32 layers of Llama, and its optimizer's update of every weight of a shape, fetch
the same boxes of the same partitions. The ids that tables hand out for it
(shapes, boxes, pieces, ops) are kept in ``ids`` the first time they are asked
for, in the uncached order, so the tables come out the same as without the cache.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from einsummable.ir.einsummable import Einsummable
from einsummable.lower.arrays import void_rows
from einsummable.plan.partition import Partition
from einsummable.plan.predict.traffic import block_indices

INNER = 1 << 24  # order = request * INNER + the step within the request


def key(*arrays: np.ndarray) -> bytes:
    """One bytes key for int64 arrays whose lengths the caller fixes (rows, rank)."""
    return b"".join(np.ascontiguousarray(a, dtype=np.int64).tobytes() for a in arrays) + \
        np.array([a.shape[-1] if a.ndim > 1 else -1 for a in arrays], dtype=np.int64).tobytes()


@functools.lru_cache(maxsize=4096)
def indices(counts: tuple[int, ...]) -> np.ndarray:
    """``block_indices``, shared: many nodes have the same counts."""
    return block_indices(counts)


def grid(part: Partition) -> tuple[np.ndarray, np.ndarray]:
    """[blocks, rank] lo and hi of every block, row-major."""
    idx = indices(part.counts)
    lo = np.zeros(idx.shape, dtype=np.int64)
    hi = np.zeros(idx.shape, dtype=np.int64)
    for d, b in enumerate(part.bounds):
        b = np.array(b, dtype=np.int64)
        lo[:, d], hi[:, d] = b[idx[:, d]], b[idx[:, d] + 1]
    return lo, hi


class Requests:
    """A batch of reads (boxes lo, hi at machines w, in order pre), the same read once:
    the distinct ones (``lo``, ``hi``, ``w``, their first place ``low``) and ``inv``, the
    distinct read of each. Cached by its bytes: many nodes make the same batch."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray, w: np.ndarray, pre: np.ndarray) -> None:
        rows = void_rows(np.concatenate([lo, hi, w[:, None]], axis=1))
        self.uniq, first, inv = np.unique(rows, return_index=True, return_inverse=True)
        self.inv = inv.ravel()
        self.low = pre[first]
        if len(self.uniq) < len(rows):
            np.minimum.at(self.low, self.inv, pre)
        self.lo, self.hi, self.w = lo[first], hi[first], w[first]
        self._keys: list[bytes] | None = None

    def keys(self) -> list[bytes]:
        """Each distinct read as bytes, the key of a shared value's cache of fetches."""
        if self._keys is None:
            blob, width = self.uniq.tobytes(), self.uniq.dtype.itemsize
            self._keys = [blob[j * width:(j + 1) * width] for j in range(len(self.uniq))]
        return self._keys


@dataclass
class Operands:
    """An einsum's blocks and the boxes they read, batched per producer (lower/blockwise.py)."""

    out: Partition  # of its value
    op: Einsummable  # f32-wide where the blocks are half partial sums
    dtype: str  # op.dtype (a property that walks the op's expression)
    shapes: np.ndarray  # [blocks, rank] of its space blocks
    batches: list[tuple]  # per producer: (its operands, lo, hi, machines, places, their key)
    order: np.ndarray  # [blocks] the applies' places in lowering.py's order
    ids: dict = field(default_factory=dict)  # table ids, filled on first use

    @staticmethod
    def in_place(q: np.ndarray) -> Geometry:
        """Every box is producer block q, already at its machine: that block's task, nothing made."""
        none = np.zeros(0, dtype=np.int64)
        return Geometry(q, none, [], none, none, none, none, none, none, none, none, none, [])


@dataclass
class Sum:
    """Partial sums of one piece at one machine, summed there first (a partial)."""

    piece: int
    tasks: np.ndarray  # [k] indices into the producer's task.ravel()
    lo: list[int]  # the piece's box in the producer's block: lo and shape
    size: list[int]
    loc: int
    order: int


@dataclass
class Geometry:
    """A ``_fetch`` of m boxes, apart from its task ids (see the module docstring)."""

    exact: np.ndarray | None  # [m] the producer block each box is, already at its machine (``in_place``)
    take: np.ndarray  # [n] pieces: index into the producer's task.ravel() (-1: a Sum makes it)
    sums: list[Sum]
    away: np.ndarray  # pieces that move to the reader's machine
    move_keys: np.ndarray  # [len(away), 2 * rank + 2]: their keys but the task (slo, shi, from, to)
    move_order: np.ndarray
    move_size: np.ndarray  # [len(away), rank]
    move_slo: np.ndarray
    move_shi: np.ndarray
    one: np.ndarray  # boxes that are one whole piece
    one_piece: np.ndarray  # ... that piece
    empty: np.ndarray  # boxes that meet nothing: a constant zero
    groups: list[tuple]  # (boxes, their pieces [N, c], slo, shi, dst: [N, c, rank]), per piece count c
    ids: dict = field(default_factory=dict)  # table ids, filled on first use

    @staticmethod
    def in_place(q: np.ndarray) -> Geometry:
        """Every box is producer block q, already at its machine: that block's task, nothing made."""
        none = np.zeros(0, dtype=np.int64)
        return Geometry(q, none, [], none, none, none, none, none, none, none, none, none, [])


def geometry(bounds: list[np.ndarray], counts: tuple[int, ...], task_loc: np.ndarray, partial_sums: int,
             formed: bool, lo: np.ndarray, hi: np.ndarray, w: np.ndarray, pre: np.ndarray) -> Geometry:
    """The geometry of fetching boxes [lo, hi) at machines w from a value cut by
    ``bounds`` whose block q's partial sums live at ``task_loc[q]`` (``partial_sums``
    of them); ``formed``: the value is its blocks as they are (not wide, not summed)."""
    m, rank = lo.shape
    firsts, lasts = [], []
    for a in range(rank):
        firsts.append(np.searchsorted(bounds[a], lo[:, a], "right") - 1)
        lasts.append(np.searchsorted(bounds[a], hi[:, a], "left") - 1)
    if partial_sums == 1 and formed:
        # most reads are a producer block already at the reader's machine: that block's task
        exact = np.ones(m, dtype=bool)
        q = np.zeros(m, dtype=np.int64)
        for a, c in enumerate(counts):
            f = np.clip(firsts[a], 0, c - 1)
            exact &= (lo[:, a] == bounds[a][f]) & (hi[:, a] == bounds[a][f + 1]) & (lasts[a] == f)
            exact &= lo[:, a] < hi[:, a]  # an empty box reads nothing (a constant), as lowering.py
            q = q * c + f
        if exact.all() and (task_loc[q, 0] == w).all():
            return Geometry.in_place(q)
    # the producer blocks each box meets, per dimension, expanded row-major
    row = np.arange(m)
    qa: list[np.ndarray] = []
    for a in range(rank):
        first, last = firsts[a], lasts[a]
        count = np.where(lo[:, a] < hi[:, a], np.maximum(last - first + 1, 0), 0)[row]
        rep = np.repeat(np.arange(len(row)), count)
        within = np.arange(len(rep)) - (np.cumsum(count) - count)[rep]
        row = row[rep]
        qa = [x[rep] for x in qa] + [first[row] + within]
    n = len(row)
    q = np.zeros(n, dtype=np.int64)
    for a, c in enumerate(counts):
        q = q * c + qa[a]
    start = np.searchsorted(row, np.arange(m))
    p = np.arange(n) - start[row]
    blo, bhi = np.zeros((n, rank), dtype=np.int64), np.zeros((n, rank), dtype=np.int64)
    for a in range(rank):
        blo[:, a], bhi[:, a] = bounds[a][qa[a]], bounds[a][qa[a] + 1]
    ilo, ihi = np.maximum(lo[row], blo), np.minimum(hi[row], bhi)
    slo, shi, dst = ilo - blo, ihi - blo, ilo - lo[row]
    whole = (slo == 0).all(axis=1) & (shi == bhi - blo).all(axis=1)
    groups = partial_sums + 1
    sums: list[Sum] = []
    if partial_sums == 1:
        take, at, g = q, task_loc[q, 0], np.zeros(n, dtype=np.int64)
    else:
        row, p, g, take, at, slo, shi, dst, whole, sums = _combine(task_loc, q, row, p, slo, shi, dst, whole,
                                                                  w, pre, groups)
    # pieces that live on another machine move to the reader's
    away = np.flatnonzero(at != w[row])
    r = row[away]
    move_keys = np.concatenate([slo[away], shi[away], at[away, None], w[r, None]], axis=1)
    move_order = pre[r] * INNER + (p[away] * groups + g[away]) * 2 + 1
    move_slo, move_shi = slo[away], shi[away]
    shi = shi.copy()
    shi[away] -= slo[away]
    slo = slo.copy()
    slo[away] = 0
    whole = whole.copy()
    whole[away] = True
    # one whole piece of the right shape is the block itself; else a partial assembles them
    n = len(row)
    pieces = np.bincount(row, minlength=m)
    first = np.minimum(np.searchsorted(row, np.arange(m)), max(n - 1, 0))
    one = np.zeros(m, dtype=bool)
    if n:
        one = (pieces == 1) & whole[first] & ((shi - slo)[first] == hi - lo).all(axis=1)
    rest = np.flatnonzero((pieces > 0) & ~one)
    parts = []
    for c in np.unique(pieces[rest]).tolist():
        f = rest[pieces[rest] == c]
        j = first[f][:, None] + np.arange(c)
        parts.append((f, j, slo[j], shi[j], dst[j]))
    one = np.flatnonzero(one)
    return Geometry(None, take, sums, away, move_keys, move_order, move_shi - move_slo, move_slo, move_shi,
                    one, first[one], np.flatnonzero(pieces == 0), parts)


def _combine(task_loc, q, row, p, slo, shi, dst, whole, w, pre, groups):
    """Each piece's partial sums grouped by machine, the reader's first; a group of
    several is summed where it lives (a ``Sum``) before it moves."""
    cols: list[list] = [[] for _ in range(9)]
    sums: list[Sum] = []
    locs, width = task_loc.tolist(), task_loc.shape[1]
    sl, sh, ds, wh = slo.tolist(), shi.tolist(), dst.tolist(), whole.tolist()
    rows, ps = row.tolist(), p.tolist()
    for i, qi in enumerate(q.tolist()):
        wi = int(w[rows[i]])
        by_loc: dict[int, list[int]] = {}
        for r, li in enumerate(locs[qi]):
            by_loc.setdefault(li, []).append(qi * width + r)
        for gi, (li, ts) in enumerate(sorted(by_loc.items(), key=lambda item: item[0] != wi)):
            lo_, hi_, whole_ = sl[i], sh[i], wh[i]
            take = ts[0]
            if len(ts) > 1:
                take = -1
                shape = [b - a for a, b in zip(lo_, hi_, strict=True)]
                sums.append(Sum(len(cols[0]), np.array(ts, dtype=np.int64), lo_, shape, li,
                                int(pre[rows[i]]) * INNER + (ps[i] * groups + gi) * 2))
                lo_, hi_, whole_ = [0] * len(shape), shape, True
            for c, v in zip(cols, (rows[i], ps[i], gi, take, li, lo_, hi_, ds[i], whole_), strict=True):
                c.append(v)
    arr = [np.array(c, dtype=np.int64) for c in cols[:5]]
    boxes = [np.array(c, dtype=np.int64).reshape(len(cols[0]), slo.shape[1]) for c in cols[5:8]]
    return (*arr, *boxes, np.array(cols[8], dtype=bool), sums)
