"""Building a CompactGraph a node at a time: tasks emitted in batches of arrays.

Lowering.py adds one task object at a time and reuses an identical task already
made (``add``). Here a node's tasks arrive in batches (all moves of the node at
once, all applies at once...), as rows of integer keys that say what makes the
task itself: a row equal to a task already made is that task. A task new in this
node gets a temporary id; its ``order`` (where lowering.py would make it: block,
operand, piece, step) decides its final place when the node is done, so the
arrays come out in exactly lowering.py's order, and every id handed out during the
node is renumbered then (``finish``), in the index's keys too. An index entry made
while ``owner`` is set goes with that owner (``release``): the lowering lets a
value's moves, sums and views go once no node to come reads its tasks. Finished
columns are kept in chunks (``Chunks``) and joined once (``graph``).

    b = Builder(workers, cores)
    ids = b.emit(MOVE, keys, order, loc=..., src=..., dtype=..., shape=..., aux=..., inputs=...)
    remap = b.finish()      # once per node: temporary ids -> final ids
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from einsummable.lower.compact import CONSTANT, KINDS, TYPES, CompactGraph
from einsummable.lower.taskgraph import Output

COLUMNS = ("kind", "loc", "src", "node", "dtype", "shape", "aux")
CHUNK = 1 << 16  # elements per chunk of a finished column


def void_rows(keys: np.ndarray) -> np.ndarray:
    """Rows of an int64 matrix as one opaque value each, for np.unique and bytes keys."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    return keys.view(np.dtype((np.void, 8 * keys.shape[1]))).ravel()


class Remap:
    """Temporary ids (from ``base`` on) to final ids; ids below ``base`` stay; ``final``
    None: the temporary ids are the final ones."""

    def __init__(self, base: int, final: np.ndarray | None) -> None:
        self.base, self.final = base, final

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if self.final is None:
            return ids
        new = ids >= self.base
        if not new.any():
            return ids
        out = ids.copy()
        out[new] = self.final[ids[new] - self.base]
        return out


class Chunks:
    """A growing column of one dtype, kept in chunks of ``CHUNK`` elements: a node's tasks
    are copied into the free room, so a million tasks are a few dozen arrays, not one
    small array (and its ~100 bytes of header) per node and column."""

    def __init__(self, dtype) -> None:
        self.dtype = dtype
        self.chunks: list[np.ndarray] = []
        self.used = 0  # of the last chunk

    def extend(self, a: np.ndarray) -> None:
        at = 0
        while at < len(a):
            if not self.chunks or self.used == len(self.chunks[-1]):
                self.chunks.append(np.empty(CHUNK, dtype=self.dtype))
                self.used = 0
            last = self.chunks[-1]
            k = min(len(a) - at, len(last) - self.used)
            last[self.used:self.used + k] = a[at:at + k]
            self.used += k
            at += k

    def take(self) -> np.ndarray:
        """The whole column, in one array; the chunks are let go."""
        if self.chunks:
            self.chunks[-1] = self.chunks[-1][:self.used]
        out = np.concatenate(self.chunks) if self.chunks else np.zeros(0, dtype=self.dtype)
        self.chunks = []
        return out


class Builder:
    def __init__(self, workers: int, cores: int) -> None:
        self.workers, self.cores = workers, cores
        self.n = 0  # tasks finished (ids below n are final)
        self.done = {c: Chunks(t) for c, t in zip(COLUMNS, TYPES, strict=True)}
        self.done_lengths = Chunks(np.int32)
        self.done_indices = Chunks(np.int32)
        self.index: list[dict[Hashable, int]] = [{} for _ in KINDS]  # identical tasks are one
        # the index's entries per owner (a node whose value's tasks they move, sum or view): let go
        # once nothing can make them again (``release``); None: kept to the end
        self.owner: int | None = None
        self.owned: dict[int, list[list[Hashable]]] = {}
        self.tables: dict[str, dict[Hashable, int]] = {"shape": {}, "dtype": {}, "aux": {}}
        self.lists: dict[str, list] = {"shape": [], "dtype": [], "aux": []}
        self._reset()

    def _reset(self) -> None:
        self.rows: list[np.ndarray] = []  # [m, len(COLUMNS)] int64 per batch of new tasks
        self.order: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []
        self.flat: list[np.ndarray] = []
        self.lowered: list[tuple[np.ndarray, np.ndarray]] = []  # (temporary ids, order): min with their order
        self.fresh: list[tuple[dict, Hashable]] = []  # dict entries holding temporary ids
        # index keys that name tasks by temporary ids: (index, their rows, the id columns, their
        # owner's list and places in it), renamed by ``finish``
        self.stale: list[tuple[dict, np.ndarray, tuple[int, ...], list, list[int]]] = []
        self.count = 0  # tasks new in this node

    # ------------------------------------------------------------ tables

    def intern(self, table: str, key: Hashable, value: object = None) -> int:
        """The id of ``key`` in a table, which holds ``value`` (default: the key itself)."""
        d = self.tables[table]
        i = d.get(key)
        if i is None:
            i = d[key] = len(self.lists[table])
            self.lists[table].append(key if value is None else value)
        return i

    def shape_ids(self, shapes: np.ndarray) -> np.ndarray:
        """[N] shape ids of an [N, rank] matrix of shapes (a few distinct rows: a dict beats np.unique)."""
        d, table = self.tables["shape"], self.lists["shape"]
        out = []
        for row in map(tuple, shapes.tolist()):
            i = d.get(row)
            if i is None:
                i = d[row] = len(table)
                table.append(row)
            out.append(i)
        return np.array(out, dtype=np.int64)

    def box_ids(self, kind: str, tag: object, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """[N] aux ids of boxes given as lo, hi rows: the table holds ``(tag, box)``, or the
        box alone when tag is None; ``kind`` keeps the kinds' entries apart."""
        inv = None
        if len(lo) > 32 and lo.shape[1]:  # many rows, few distinct boxes
            both = np.concatenate([lo, hi], axis=1)
            _, first, inv = np.unique(void_rows(both), return_index=True, return_inverse=True)
            lo, hi = lo[first], hi[first]
        out = []
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
            box = tuple(zip(a, b, strict=True))
            out.append(self.intern("aux", (kind, tag, box), box if tag is None else (tag, box)))
        ids = np.array(out, dtype=np.int64)
        return ids if inv is None else ids[inv.ravel()]

    # ------------------------------------------------------------ emitting

    def emit(self, kind: int, keys: np.ndarray, order: np.ndarray, *, loc, src=None, node=-1, dtype, shape,
             aux=-1, inputs: np.ndarray | None = None, shared: bool = True, ids_at: tuple[int, ...] = ()
             ) -> np.ndarray:
        """Ids of the tasks whose identities are the rows of ``keys`` [N, c] (equal rows: one task).

        Column arguments are [N] arrays or scalars; ``inputs`` is [N, k]; ``ids_at``: the
        columns of ``keys`` that are task ids (inputs), renamed in the index when the tasks
        they name get their final ids (``finish``). ``shared=False``:
        no other batch can make these tasks (an apply names its node; a move reads a
        block that only this node reads), so they are not remembered: most tasks are
        not, which keeps the index, and the memory of lowering, small."""
        n = len(keys)
        if not n:
            return np.zeros(0, dtype=np.int64)
        uniq, first, inv = np.unique(void_rows(keys), return_index=True, return_inverse=True)
        inv = inv.ravel()
        low = np.asarray(order, dtype=np.int64)[first]
        if len(uniq) < n:
            np.minimum.at(low, inv, order)
        base = self.n + self.count
        if not shared:  # every distinct row is a new task
            self.add(len(uniq), first, low, kind, loc, src, node, dtype, shape, aux, inputs)
            return base + inv
        blob, width = uniq.tobytes(), uniq.dtype.itemsize
        d = self.index[kind]
        ids = np.empty(len(uniq), dtype=np.int64)
        new = []
        made = self.owned_keys(kind)
        at = len(made)
        for j in range(len(uniq)):
            key = blob[j * width:(j + 1) * width]
            t = d.get(key)
            if t is None:
                t = d[key] = base + len(new)
                self.fresh.append((d, key))
                made.append(key)
                new.append(j)
            ids[j] = t
        if ids_at and new:
            rows = keys[first[new]]
            temp = np.flatnonzero((rows[:, list(ids_at)] >= self.n).any(axis=1))
            if len(temp):
                self.stale.append((d, rows[temp], ids_at, made, (at + temp).tolist()))
        pending = ids >= self.n
        if pending.any():
            self.lowered.append((ids[pending], low[pending]))
        if new:
            self.add(len(new), first[new], low[new], kind, loc, src, node, dtype, shape, aux, inputs)
        return ids[inv]

    def add(self, m: int, pick: np.ndarray, low: np.ndarray, kind, loc, src, node, dtype, shape, aux,
            inputs) -> None:
        """The m new tasks of an ``emit``: rows ``pick`` of its column arguments, made at ``low``."""
        rows = np.empty((m, len(COLUMNS)), dtype=np.int64)
        for j, x in enumerate((kind, loc, loc if src is None else src, node, dtype, shape, aux)):
            rows[:, j] = x[pick] if isinstance(x, np.ndarray) else x
        self.rows.append(rows)
        self.order.append(low)
        k = 0 if inputs is None else inputs.shape[1]
        self.lengths.append(np.full(m, k, dtype=np.int64))
        if k:
            self.flat.append(inputs[pick].ravel().astype(np.int64))
        self.count += m

    def emit_one(self, kind: int, key: Hashable, order: int, *, loc: int, dtype: int, shape: int, aux: int,
                 inputs: tuple[int, ...], node: int = -1) -> int:
        """One task, from a Python key (partials: their pieces vary in number)."""
        d = self.index[kind]
        t = d.get(key)
        if t is not None:
            if t >= self.n:
                self.lowered.append((np.array([t]), np.array([order])))
            return t
        t = d[key] = self.n + self.count
        self.fresh.append((d, key))
        made = self.owned_keys(kind)
        made.append(key)
        if any(i >= self.n for i in inputs):  # the key is [*inputs, ...] (assemble.partial)
            self.stale.append((d, np.frombuffer(key, dtype=np.int64)[None], tuple(range(len(inputs))), made,
                               [len(made) - 1]))
        self.rows.append(np.array([[kind, loc, loc, node, dtype, shape, aux]], dtype=np.int64))
        self.order.append(np.array([order], dtype=np.int64))
        self.lengths.append(np.array([len(inputs)], dtype=np.int64))
        if inputs:
            self.flat.append(np.array(inputs, dtype=np.int64))
        self.count += 1
        return t

    def owned_keys(self, kind: int) -> list:
        """Where the new index entries of this kind go: their owner's list (constants have
        none: any node may make the same one), else a list nobody keeps."""
        if self.owner is None or kind == CONSTANT:
            return []
        return self.owned.setdefault(self.owner, [[] for _ in KINDS])[kind]

    def release(self, owner: int) -> None:
        """Drop the index entries of ``owner``: no task to come can be one of them."""
        for d, keys in zip(self.index, self.owned.pop(owner, ()), strict=False):
            for key in keys:
                del d[key]

    def remember(self, d: dict, key: Hashable, t: int) -> None:
        """A cache entry (a fetch) that may hold a temporary id until ``finish``."""
        d[key] = t
        if t >= self.n:
            self.fresh.append((d, key))

    def finish(self) -> Remap:
        """Put this node's new tasks in lowering.py's order; returns the map of the ids
        handed out during the node to their final ids."""
        m, base = self.count, self.n
        if not m:
            self._reset()
            return Remap(base, np.zeros(0, dtype=np.int64))
        order = np.concatenate(self.order)
        for ids, low in self.lowered:
            np.minimum.at(order, ids - base, low)
        if (order[1:] >= order[:-1]).all():  # made in order (most nodes): the temporary ids are final
            rows = np.concatenate(self.rows)
            for j, c in enumerate(COLUMNS):
                self.done[c].extend(rows[:, j])
            self.done_lengths.extend(np.concatenate(self.lengths))
            if self.flat:
                self.done_indices.extend(np.concatenate(self.flat))
            self.n += m
            self._reset()
            return Remap(base, None)
        perm = np.argsort(order, kind="stable")
        final = np.empty(m, dtype=np.int64)
        final[perm] = np.arange(base, base + m)
        remap = Remap(base, final)
        rows = np.concatenate(self.rows)[perm]
        for j, c in enumerate(COLUMNS):
            self.done[c].extend(rows[:, j])
        lengths = np.concatenate(self.lengths)
        flat = remap(np.concatenate(self.flat)) if self.flat else np.zeros(0, dtype=np.int64)
        starts = np.cumsum(lengths) - lengths
        plen = lengths[perm]
        gather = np.repeat(starts[perm] - (np.cumsum(plen) - plen), plen) + np.arange(plen.sum())
        self.done_lengths.extend(plen)
        self.done_indices.extend(flat[gather])
        for d, key in self.fresh:
            v = d[key]
            if v >= base:
                d[key] = int(final[v - base])
        # keys naming this node's tasks by temporary ids: by their final ids (all taken out
        # first, as an old key may be another's new one)
        moved = []
        for d, rows, at, made, places in self.stale:
            renamed = rows.copy()
            renamed[:, list(at)] = remap(rows[:, list(at)])
            old, new = rows.tobytes(), renamed.tobytes()
            width = rows.shape[1] * 8
            for j, place in enumerate(places):
                b = new[j * width:(j + 1) * width]
                moved.append((d, b, d.pop(old[j * width:(j + 1) * width])))
                made[place] = b
        for d, b, t in moved:
            d[b] = t
        self.n += m
        self._reset()
        return remap

    def graph(self, outputs: dict[str, Output]) -> CompactGraph:
        """The finished tasks as one CompactGraph. The builder is spent: its index and its
        per-node arrays are let go as they are joined, so that they and the joined arrays
        are not all held at once."""
        self.index = []
        cols = {c: self.done[c].take() for c in COLUMNS}
        lengths = self.done_lengths.take()
        indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        del lengths
        indices = self.done_indices.take()
        return CompactGraph(**cols, indptr=indptr, indices=indices, dtypes=tuple(self.lists["dtype"]),
                            shapes=tuple(self.lists["shape"]), aux_table=tuple(self.lists["aux"]),
                            outputs=outputs, workers=self.workers, cores=self.cores)
