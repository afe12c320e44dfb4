"""The tasks that assemble blocks, made in batches for lower/blockwise.py: partials
(pieces copied, or summed, into one block), constants, and the casts that round a
wide partial sum once. A partial's pieces (``Piece`` objects, with its agg and pad)
are one entry of the aux table, shared by every partial with the same geometry."""

from __future__ import annotations

import numpy as np

from einsummable.ir.einsummable import Einsummable
from einsummable.ir.expr import Cast, Input
from einsummable.ir.graph import Constant, Piece
from einsummable.lower.arrays import Builder
from einsummable.lower.compact import APPLY, CONSTANT, PARTIAL


class Assembler:
    """Single tasks over a Builder: ``partial`` one at a time, ``partials`` in rows."""

    def __init__(self, builder: Builder) -> None:
        self.b = builder

    def dt(self, dtype: str) -> int:
        return self.b.intern("dtype", dtype)


    def partial(self, ts: list[int], slo: list, shi: list, dst: list, shape: int, dtype: int, agg: str | None,
                loc: int, pad: float, order: int) -> int:
        """A partial of the given pieces (lowering.py's ``partial``); with none, a constant."""
        if not ts:
            full = np.array([self.b.lists["shape"][shape]], dtype=np.int64)
            return int(self.constants(Constant(pad), self.b.lists["dtype"][dtype], np.zeros_like(full), full,
                                      np.array([loc]), np.array([order]))[0])
        inputs: list[int] = []
        flat: list[int] = []
        for t, lo, hi, d in zip(ts, slo, shi, dst, strict=True):
            if t not in inputs:
                inputs.append(t)
            flat.extend((inputs.index(t), *lo, *hi, *d))
        aux = self.pieces(tuple(flat), len(slo[0]), agg, pad)
        key = np.array([*inputs, aux, shape, dtype, loc], dtype=np.int64).tobytes()  # as ``partials`` does
        return self.b.emit_one(PARTIAL, key, order, loc=loc, dtype=dtype, shape=shape, aux=aux,
                               inputs=tuple(inputs))

    def pieces(self, flat: tuple[int, ...], rank: int, agg: str | None, pad: float) -> int:
        """The aux id of a partial's (pieces, agg, pad); ``flat`` holds, per piece, its
        input's index, its source box's lo and hi, and its target corner."""
        key = ("partial", rank, flat, agg, pad)
        aux = self.b.tables["aux"].get(key)
        if aux is None:
            w = 1 + 3 * rank
            pieces = []
            for i in range(0, len(flat), w):
                a = i + 1
                lo, hi, d = flat[a:a + rank], flat[a + rank:a + 2 * rank], flat[a + 2 * rank:i + w]
                pieces.append(Piece(flat[i], tuple(zip(lo, hi, strict=True)), tuple(d)))
            aux = self.b.intern("aux", key, (tuple(pieces), agg, pad))
        return aux

    def partials(self, ts: np.ndarray, slo: np.ndarray, shi: np.ndarray, dst: np.ndarray, shape: np.ndarray,
                 dtype: int, agg: str | None, loc: np.ndarray, pad: float, order: np.ndarray,
                 shared: bool, memo: dict | None = None) -> np.ndarray:
        """Partials of c pieces each, one per row: ts [N, c]; slo, shi, dst [N, c, rank].
        ``memo`` keeps their pieces' aux ids for the next call with the same geometry."""
        n, c = ts.shape
        out = np.empty(n, dtype=np.int64)
        s = np.sort(ts, axis=1)
        dup = (s[:, 1:] == s[:, :-1]).any(axis=1)
        for i in np.flatnonzero(dup).tolist():  # an input read twice: one by one, as lowering.py
            out[i] = self.partial(ts[i].tolist(), slo[i].tolist(), shi[i].tolist(), dst[i].tolist(),
                                  int(shape[i]), dtype, agg, int(loc[i]), pad, int(order[i]))
        ok = np.flatnonzero(~dup)
        if len(ok):
            aux = memo.get("aux") if memo is not None and len(ok) == n else None
            if aux is None:
                k = np.broadcast_to(np.arange(c)[None, :, None], (len(ok), c, 1))
                geo = np.concatenate([k, slo[ok], shi[ok], dst[ok]], axis=2).reshape(len(ok), -1)
                rank = slo.shape[2]
                aux = np.array([self.pieces(row, rank, agg, pad) for row in map(tuple, geo.tolist())],
                               dtype=np.int64)
                if memo is not None and len(ok) == n:
                    memo["aux"] = aux
            keys = np.concatenate([ts[ok], aux[:, None], shape[ok, None], np.full((len(ok), 1), dtype),
                                   loc[ok, None]], axis=1)
            out[ok] = self.b.emit(PARTIAL, keys, order[ok], loc=loc[ok], dtype=dtype, shape=shape[ok],
                                  aux=aux, inputs=ts[ok], shared=shared, ids_at=tuple(range(c)))
        return out

    def constants(self, kind, dtype: str, lo, hi, w, order, memo: dict | None = None) -> np.ndarray:
        """Constant blocks [lo, hi) at machines w; ``memo`` keeps their table ids for the next
        call with the same boxes."""
        if memo is None or "aux" not in memo:
            ids = (self.b.box_ids("constant", kind, lo, hi), self.dt(dtype), self.b.shape_ids(hi - lo))
            if memo is None:
                memo = {}
            memo["aux"] = ids
        aux, dt, shape = memo["aux"]
        keys = np.stack([aux, np.full(len(w), dt), w], axis=1)
        return self.b.emit(CONSTANT, keys, order, loc=w, dtype=dt, shape=shape, aux=aux)

    def cast(self, u: int, dtype: str, kept: str, t, shapes, w, order, shared: bool,
             memo: dict | None = None) -> np.ndarray:
        """Wide partial sums t rounded to ``dtype``; ``memo`` as in ``constants``."""
        if memo is None or "ops" not in memo:
            ops = np.zeros(len(t), dtype=np.int64)
            uniq, inv = (np.unique(shapes, axis=0, return_inverse=True) if shapes.shape[1]
                         else (shapes[:1], ops))
            for j, shape in enumerate(uniq.tolist()):
                every = tuple(range(len(shape)))
                op = Einsummable(tuple(shape), (every,), len(shape), Cast(dtype, Input(0)), None, (kept,))
                ops[inv.ravel() == j] = self.b.intern("aux", op)
            if memo is None:
                memo = {}
            memo["ops"] = (ops, self.dt(dtype), self.b.shape_ids(shapes))
        ops, dt, shape = memo["ops"]
        keys = np.stack([ops, t, w, np.full(len(t), u)], axis=1)
        return self.b.emit(APPLY, keys, order, loc=w, node=u, dtype=dt, shape=shape, aux=ops,
                           inputs=t[:, None], shared=shared, ids_at=(1,))
