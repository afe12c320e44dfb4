"""The exact optimum of the cost model over the same candidates EinDecomp searches.

Min-sum variable elimination over the factor graph (one factor per node, one per
edge): exact for any graph, exponential only in the width of the elimination
order, so it is the yardstick on small graphs. It refuses, with PlanError, when
an intermediate table would pass ``limit`` entries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from einsummable.errors import PlanError
from einsummable.ir.graph import EinGraph
from einsummable.plan.cost import CostModel

Factor = tuple[tuple[int, ...], np.ndarray]


def optimum(g: EinGraph, model: CostModel, live: Sequence[bool], limit: int = 20_000_000) -> float:
    factors: list[Factor] = []
    for v, node in enumerate(g.nodes):
        if not live[v]:
            continue
        factors.append(((v,), model.unary[v]))
        for k, u in enumerate(node.inputs):
            factors.append(((u, v), model.edge(u, v, k)))
    size = {v: len(model.cands[v]) for v in range(len(g.nodes))}
    remaining = {v for v in range(len(g.nodes)) if live[v]}
    total = 0.0
    while remaining:
        widths = {x: _width(x, factors, size) for x in remaining}
        x = min(remaining, key=widths.__getitem__)
        if widths[x] > limit:
            raise PlanError(f"exhaustive search needs a table of {widths[x]} entries (limit {limit})")
        mine = [f for f in factors if x in f[0]]
        factors = [f for f in factors if x not in f[0]]
        order = [*sorted({y for vs, _ in mine for y in vs} - {x}), x]
        table = np.zeros([size[y] for y in order])
        for vs, arr in mine:
            table = table + _align(vs, arr, order)
        reduced = table.min(axis=-1)
        if order[:-1]:
            factors.append((tuple(order[:-1]), reduced))
        else:
            total += float(reduced)
        remaining.discard(x)
    return total + sum(float(arr) for vs, arr in factors if not vs)


def _width(x: int, factors: list[Factor], size: dict[int, int]) -> int:
    """Entries of the table that eliminating x would build."""
    return math.prod(size[y] for y in {y for vs, _ in factors if x in vs for y in vs})


def _align(vs: tuple[int, ...], arr: np.ndarray, order: list[int]) -> np.ndarray:
    """View a factor over ``vs`` as an array broadcastable over ``order``."""
    if len(set(vs)) < len(vs):  # the same node twice: take the diagonal
        arr = np.diagonal(arr)
        vs = (vs[0],)
    perm = sorted(range(len(vs)), key=lambda i: order.index(vs[i]))
    arr = arr.transpose(perm)
    shape = [1] * len(order)
    for i in perm:
        shape[order.index(vs[i])] = arr.shape[perm.index(i)]
    return arr.reshape(shape)
