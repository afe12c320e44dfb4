"""Lowering a select (lower/blockwise.py): each block reads the pieces that meet it
(``Select.reads``, over all blocks at once), then assembles them with the padding (a
partial) unless one piece is all of it. The geometry (which pieces each block reads,
its requests batched per producer, the assembly) is worked out once per distinct
select and placement and replayed, as for fetches (geometry.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from einsummable.ir.graph import Select
from einsummable.lower.assemble import Assembler
from einsummable.lower.geometry import INNER, key
from einsummable.plan.partition import Partition


@dataclass
class SelectGeometry:
    """A select's blocks apart from task ids."""

    pieces: int
    batches: list[tuple]  # per producer: (input position, [(blocks, piece)], lo, hi, machines, places, key)
    one: np.ndarray  # blocks that are one piece, whole
    first: np.ndarray  # [blocks] the first piece each block reads
    groups: list[tuple]  # per piece count c: (blocks, and for c > 0 their pieces [N, c], slo, shi, dst)
    nr: int  # places per block: its reads, then its partial
    ids: dict = field(default_factory=dict)  # table ids, filled on first use


def select_geometry(node: Select, lo: np.ndarray, hi: np.ndarray, w: np.ndarray) -> SelectGeometry:
    nb, npieces = len(lo), len(node.pieces)
    hit = np.zeros((nb, npieces), dtype=bool)
    ilo = np.zeros((npieces, *lo.shape), dtype=np.int64)
    ihi = np.zeros_like(ilo)
    for n, p in enumerate(node.pieces):
        box = np.array(p.dst_box, dtype=np.int64).reshape(-1, 2)
        ilo[n], ihi[n] = np.maximum(lo, box[:, 0]), np.minimum(hi, box[:, 1])
        hit[:, n] = (ilo[n] < ihi[n]).all(axis=1)
    count = hit.sum(axis=1)
    nr = int(count.max(initial=0)) + 1
    slot = np.cumsum(hit, axis=1) - 1  # the read's place among its block's reads
    by_u: dict[int, list] = {}  # per producer (its first input position), in the order lowering.py reads
    for n, p in enumerate(node.pieces):
        b = np.flatnonzero(hit[:, n])
        if len(b):
            shift = np.array([s - d for d, (s, _) in zip(p.dst, p.src, strict=True)], dtype=np.int64)
            at = node.inputs.index(node.inputs[p.input])
            reads = (b, n, ilo[n][b] + shift, ihi[n][b] + shift, w[b], b * nr + slot[b, n])
            by_u.setdefault(at, []).append(reads)
    batches = []
    for at, reqs in by_u.items():
        blo, bhi, bw, pre = (np.concatenate([r[j] for r in reqs]) for j in range(2, 6))
        batches.append((at, [(r[0], r[1]) for r in reqs], blo, bhi, bw, pre, key(blo, bhi, bw, pre)))
    one = np.zeros(nb, dtype=bool)
    first = np.zeros(nb, dtype=np.int64)
    if npieces:
        first, rows = np.argmax(hit, axis=1), np.arange(nb)
        one = (count == 1) & (ilo[first, rows] == lo).all(axis=1) & (ihi[first, rows] == hi).all(axis=1)
    groups = []
    for c in np.unique(count[~one]).tolist():
        f = np.flatnonzero((count == c) & ~one)
        if c == 0:  # all padding
            groups.append((f,))
            continue
        n = np.nonzero(hit[f])[1].reshape(len(f), c)  # the pieces each block reads, in order
        fb = f[:, None]
        slo = np.zeros((len(f), c, lo.shape[1]), dtype=np.int64)
        groups.append((f, n, slo, ihi[n, fb] - ilo[n, fb], ilo[n, fb] - lo[fb]))
    return SelectGeometry(npieces, batches, np.flatnonzero(one), first, groups, nr)


class Selects(Assembler):
    """The select rule; the lowering (``_Lower``) gives it ``fetch``, ``shared`` and ``selects``."""

    def select(self, node: Select, part: Partition, lo: np.ndarray, hi: np.ndarray,
               w: np.ndarray) -> np.ndarray:
        """The select's blocks [lo, hi) (of ``part``) at machines w."""
        k = (node.pieces, node.pad, node.dtype, tuple(node.inputs.index(u) for u in node.inputs), part,
             w.tobytes())
        geo = self.selects.get(k)
        if geo is None:
            geo = self.selects[k] = select_geometry(node, lo, hi, w)
        nb = len(lo)
        got = np.zeros((nb, geo.pieces), dtype=np.int64)
        for at, parts, blo, bhi, bw, pre, where in geo.batches:
            ids = self.fetch(node.inputs[at], blo, bhi, bw, pre, where)
            start = 0
            for b, n in parts:
                got[b, n] = ids[start:start + len(b)]
                start += len(b)
        out = np.full(nb, -1, dtype=np.int64)
        out[geo.one] = got[geo.one, geo.first[geo.one]]
        dt = self.dt(node.dtype)
        if "shapes" not in geo.ids:  # interned after the fetches, as when nothing was cached
            geo.ids["shapes"] = self.b.shape_ids(hi - lo)
        shapes, nr = geo.ids["shapes"], geo.nr
        shared = any(self.shared[u] for u in node.inputs)
        for g, (f, *rest) in enumerate(geo.groups):
            if not rest:  # all padding
                for b in f.tolist():
                    out[b] = self.partial([], [], [], [], int(shapes[b]), dt, None, int(w[b]), node.pad,
                                          (b * nr + nr - 1) * INNER)
                continue
            n, slo, shi, dst = rest
            out[f] = self.partials(got[f[:, None], n], slo, shi, dst, shapes[f], dt, None, w[f], node.pad,
                                   (f * nr + nr - 1) * INNER, shared, memo=geo.ids.setdefault(g, {}))
        return out
