"""The cost model of docs/design.md §5, in bytes, as numpy arrays over candidate partitions.

A candidate is a vector of block counts, one per dimension of a node's space. The
cost of a choice of candidates is a sum of
- per node (``unary``): input replication, ``|X_i| * (N / N_i - 1)`` for each
  operand (N join blocks, N_i of them distinct on the operand's indices), and
  partial aggregation, ``(k - 1) * |out|`` for k blocks across aggregated indices;
- per edge (``edge``): repartition, ``|X| * (1 - f)`` where f, the share of a
  block already in place, is the product over axes of min(p, q) / max(p, q) for
  p producer blocks and q needed blocks along the axis.
Fills are rebuilt where read and cost nothing. A formation must take its
einsummable's output partition: other pairs cost ``FORBIDDEN``.

Candidates: every op has a target, the most blocks up to p that are still worth
``cluster.min_block_flops`` each (``compute_target``). An op with target p takes
exactly p blocks (p factored over the dimensions in every way, never more blocks
than a dimension's size). An op with a smaller target t > 1 takes at least t
blocks, of any count that divides p or that some op uses, so it can line up with
its neighbours but can never fall back to running whole: bytes alone would always
pick the fewest blocks. Tiny ops (target 1) and data nodes (inputs, selects,
reshapes) may take any such count, so they stay whole unless following their
neighbours saves bytes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import EinGraph, Fill, Formation
from einsummable.plan.space import Space, nbytes

FORBIDDEN = 1e30
STREAM_BYTES_PER_SECOND = 5e9  # what one core streams through an elementwise kernel here
# Partial sums cost the adds where they meet as well as their bytes; replicas only bytes.
# At equal bytes this small premium sends the choice to the replica.
PARTIAL_PREMIUM = 1.001


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending: trial division up to sqrt(n), each small one giving its pair."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@functools.lru_cache(maxsize=65536)
def _exact(t: int, limits: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """All count vectors with product exactly t and counts[d] <= limits[d]."""
    if not limits:
        return ((),) if t == 1 else ()
    out = []
    for d in divisors(t):
        if d <= limits[0]:
            out.extend((d, *rest) for rest in _exact(t // d, limits[1:]))
    return tuple(out)


def _limits(sp: Space) -> tuple[int, ...]:
    return tuple(max(1, n) if ok else 1 for n, ok in zip(sp.shape, sp.splittable, strict=True))


def compute_target(sp: Space, p: int, cluster: Cluster, touched: float = 0.0) -> int:
    """The block count an op aims at: p, or fewer when blocks would be too small to pay.

    An op's work is its flops or, for memory-bound ops such as an optimizer update,
    the flops the core could have done while streaming the ``touched`` bytes.
    """
    limits = _limits(sp)
    reachable = math.prod(limits)
    work = max(sp.flops, touched * cluster.flops_per_core / STREAM_BYTES_PER_SECOND)
    for d in sorted(divisors(p), reverse=True):
        if d == 1 or (work / d >= cluster.min_block_flops and d <= reachable):
            break
    for t in range(d, 0, -1):  # a dimension too small for every factorisation of d: take less
        if _exact(t, limits):
            return t
    return 1


def op_targets(g: EinGraph, spaces: Sequence[Space], p: int, cluster: Cluster,
               node_bytes: Sequence[float]) -> list[int]:
    """The block count of every op (``compute_target``); 1 for every other node."""
    touched = [node_bytes[v] + sum(node_bytes[u] for u in node.inputs) for v, node in enumerate(g.nodes)]
    return [compute_target(sp, p, cluster, touched[v]) if sp.kind == "compute" else 1
            for v, sp in enumerate(spaces)]


class CostModel:
    """Candidates, unary costs and edge costs for one graph at one worker count."""

    def __init__(self, g: EinGraph, spaces: Sequence[Space], p: int, cluster: Cluster,
                 live: Sequence[bool], node_bytes: Sequence[float] | None = None,
                 gather_once: bool = False) -> None:
        """``node_bytes`` overrides each node's output bytes: the inner level of a two-level
        plan costs one machine's block of every node (plan/twolevel.py).

        ``gather_once`` (the machine level): a reader of c copies of an operand whose
        pieces are a share f in place receives ``|X| max(c (1 - f), c - 1)``, an edge
        cost, instead of replication ``|X| (c - 1)`` plus repartition ``|X| (1 - f)``:
        a weight sharded over 4 machines and read whole by all 4 is all-gathered once,
        3 |W|, not 3.75 |W|."""
        self.g, self.spaces, self.p = g, spaces, p
        self.gather_once = gather_once
        self.bytes = [float(b) for b in node_bytes] if node_bytes is not None else [
            float(nbytes(n)) for n in g.nodes]
        self._cache: dict[tuple, np.ndarray] = {}
        self._arrays: dict[tuple, np.ndarray] = {}
        self._index: dict[int, dict[tuple[int, ...], int]] = {}
        self.targets = targets = op_targets(g, spaces, p, cluster, self.bytes)
        sizes = sorted(set(divisors(p)) | {t for t, ok in zip(targets, live, strict=True) if ok})
        self.cands: list[np.ndarray] = []
        self.follow: dict[int, np.ndarray] = {}  # formation: its candidate per einsummable candidate
        for nid, sp in enumerate(spaces):
            if sp.kind == "follow":  # the distinct output partitions of its einsummable's candidates
                u = g.nodes[nid].inputs[0]
                key = ("follow", id(self.cands[u]), spaces[u].out_dims)
                c, inverse = self._array(key, lambda u=u: np.unique(
                    self.cands[u][:, list(spaces[u].out_dims)], axis=0, return_inverse=True))
                self.follow[nid] = inverse.reshape(-1)
            elif sp.kind == "fill" or not live[nid]:
                c = self._array(("whole", len(sp.shape)), lambda sp=sp: np.ones((1, len(sp.shape)), np.int64))
            elif sp.kind == "compute" and targets[nid] == p:
                key = ("exact", targets[nid], _limits(sp))
                c = self._array(key, lambda t=targets[nid], sp=sp: _as_array(_exact(t, _limits(sp)), sp))
            else:
                at_least = [s for s in sizes if s >= targets[nid]]
                key = ("any", tuple(at_least), _limits(sp))
                c = self._array(key, lambda sp=sp, at_least=at_least: _as_array(
                    tuple(v for s in at_least for v in _exact(s, _limits(sp))), sp))
            self.cands.append(c)
        self.unary = [self.node_cost(nid, c) for nid, c in enumerate(self.cands)]

    def _array(self, key: tuple, make):
        if key not in self._arrays:
            self._arrays[key] = make()
        return self._arrays[key]

    # ------------------------------------------------------------ costs on count arrays

    def node_cost(self, nid: int, counts: np.ndarray) -> np.ndarray:
        """[candidates]: replication of every operand plus partial aggregation."""
        sp = self.spaces[nid]
        node = self.g.nodes[nid]
        n = np.prod(counts, axis=1).astype(np.float64)
        cost = np.zeros(len(counts))
        for k, u in enumerate(node.inputs):
            if isinstance(self.g.nodes[u], Fill) or self.gather_once:
                continue
            dims = [d for d in sp.operands[k] if d is not None]
            n_k = np.prod(counts[:, dims], axis=1) if dims else np.ones(len(counts))
            cost += self.bytes[u] * (n / n_k - 1.0)
        if sp.aggregated:
            k = np.prod(counts[:, list(sp.aggregated)], axis=1)
            cost += PARTIAL_PREMIUM * self.bytes[nid] * (k - 1.0)
        return cost

    def edge_cost(self, u: int, v: int, k: int, cu: np.ndarray, cv: np.ndarray) -> np.ndarray:
        """[candidates of u, candidates of v]: repartition of u's output into what v reads."""
        if isinstance(self.g.nodes[u], Fill):
            return np.zeros((len(cu), len(cv)))
        su, sv = self.spaces[u], self.spaces[v]
        have = cu[:, list(su.out_dims)]
        if sv.kind == "follow":
            same = (have[:, None, :] == cv[None, :, :]).all(axis=2)
            return np.where(same, 0.0, FORBIDDEN)
        need = np.ones((len(cv), len(sv.operands[k])), dtype=np.int64)
        for a, d in enumerate(sv.operands[k]):
            if d is not None:
                need[:, a] = cv[:, d]
        hi = np.maximum(have[:, None, :], need[None, :, :])
        lo = np.minimum(have[:, None, :], need[None, :, :])
        share = np.prod(lo / hi, axis=2)
        if not self.gather_once:
            return self.bytes[u] * (1.0 - share)
        copies = (np.prod(cv, axis=1) / np.prod(need, axis=1))[None, :]
        cost = self.bytes[u] * np.maximum(copies * (1.0 - share), copies - 1.0)
        if isinstance(self.g.nodes[v], Formation) and su.aggregated:
            # partial sums already travel to their formation's blocks (the aggregation
            # cost); only gathering several of their output blocks into one moves more
            summed = np.prod(cu[:, list(su.aggregated)], axis=1)[:, None] > 1
            gather = 1.0 - np.prod(lo / have[:, None, :], axis=2)
            cost = np.where(summed, self.bytes[u] * gather, cost)
        return cost

    def unit_t(self, u: int, v: int, k: int) -> np.ndarray:
        """[candidates of v, candidates of u]: the edge cost per byte of u, cached by what it
        depends on. Transposed, so that minimising over u's candidates runs along rows."""
        key = (id(self.cands[u]), id(self.cands[v]), self.spaces[u].out_dims, self.spaces[v].operands[k],
               self.spaces[v].kind, isinstance(self.g.nodes[u], Fill))
        unit = self._cache.get(key)
        if unit is None:
            cost = self.edge_cost(u, v, k, self.cands[u], self.cands[v]) / self.scale(u)
            unit = self._cache[key] = np.ascontiguousarray(cost.T)
        return unit

    def scale(self, u: int) -> float:
        """Edge costs scale with the producer's bytes."""
        return self.bytes[u] or 1.0

    def edge(self, u: int, v: int, k: int) -> np.ndarray:
        """[candidates of u, candidates of v]: the edge cost over the candidate lists."""
        return self.unit_t(u, v, k).T * self.scale(u)

    def bound(self, u: int, v: int) -> float:
        """The most an edge can cost, bar a forbidden pair: all of u's bytes move (to every
        worker, with ``gather_once``)."""
        if self.spaces[v].kind == "follow":
            return FORBIDDEN
        return self.bytes[u] * (self.p if self.gather_once else 1)

    def index(self, v: int, counts: Sequence[int]) -> int:
        """The candidate number of ``counts`` for node v, or -1 when it is no candidate."""
        table = self._index.get(id(self.cands[v]))
        if table is None:
            table = self._index[id(self.cands[v])] = {tuple(int(x) for x in c): i
                                                      for i, c in enumerate(self.cands[v])}
        return table.get(tuple(counts), -1)

    def edge_at(self, u: int, v: int, k: int, counts: Sequence[Sequence[int]], at: Sequence[int]) -> float:
        """The edge cost for the given counts (``at``: their candidate numbers, -1 for none)."""
        if at[u] >= 0 and at[v] >= 0:
            return float(self.unit_t(u, v, k)[at[v], at[u]]) * self.scale(u)
        return float(self.edge_cost(u, v, k, np.array([counts[u]]), np.array([counts[v]]))[0, 0])

    def evaluate(self, counts: Sequence[Sequence[int]], live: Sequence[bool]) -> float:
        """The model cost of any plan, given its block counts per node."""
        at = [self.index(v, c) for v, c in enumerate(counts)]
        total = 0.0
        for v, node in enumerate(self.g.nodes):
            if not live[v]:
                continue
            if at[v] >= 0:
                total += float(self.unary[v][at[v]])
            else:
                total += float(self.node_cost(v, np.array([counts[v]], dtype=np.int64))[0])
            for k, u in enumerate(node.inputs):
                total += self.edge_at(u, v, k, counts, at)
        return total


def _as_array(vectors: tuple[tuple[int, ...], ...], sp: Space) -> np.ndarray:
    if not vectors:
        return np.ones((1, len(sp.shape)), dtype=np.int64)
    return np.array(vectors, dtype=np.int64).reshape(len(vectors), len(sp.shape))
