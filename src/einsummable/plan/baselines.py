"""Baseline planners, the strategies people write by hand; EinDecomp must match or beat them.

- ``data_parallel``: split the batch index wherever it appears. The batch index is
  the first axis of the first graph input, followed through every op;
- ``model_parallel`` (Megatron-style): split each op's largest non-batch index,
  so weights are cut along their output or their input (contracted) dimension;
- ``uniform``: split every index of every op, sharing p's prime factors;
- ``none``: every node whole, so each op runs on one worker.
Like EinDecomp, each op with a target t > 1 (``cost.compute_target``: p, or fewer
for an op too small to fill p workers) gets exactly t blocks: the strategy's
index takes as much of t as it can hold, and what is left
is shared among the other indices the uniform way (data parallel with a batch of
8 on 64 workers also cuts 8 ways elsewhere). Smaller ops, inputs, selects and
reshapes take the partition their heaviest reader wants, as a hand-written
strategy would lay out its data. Formations inherit.
"""

from __future__ import annotations

from collections.abc import Sequence

from einsummable.ir.graph import EinGraph, InputNode
from einsummable.plan.space import Space

Counts = tuple[int, ...]


def dim_classes(g: EinGraph, spaces: Sequence[Space]) -> dict[tuple[int, int], tuple[int, int]]:
    """Union-find over (node, space dim): an operand axis is the same index as its producer's."""
    parent: dict[tuple[int, int], tuple[int, int]] = {}

    def find(x: tuple[int, int]) -> tuple[int, int]:
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x

    for v, node in enumerate(g.nodes):
        for k, u in enumerate(node.inputs):
            for a, d in enumerate(spaces[v].operands[k]):
                if d is not None:
                    parent[find((v, d))] = find((u, spaces[u].out_dims[a]))
    return {(v, d): find((v, d)) for v, sp in enumerate(spaces) for d in range(len(sp.shape))}


def batch_dims(g: EinGraph, spaces: Sequence[Space]) -> list[int | None]:
    """Per node, the space dim that carries the batch index, if any."""
    classes = dim_classes(g, spaces)
    first = next((v for v, n in enumerate(g.nodes) if isinstance(n, InputNode) and n.shape), None)
    if first is None:
        return [None] * len(spaces)
    batch = classes[(first, 0)]
    out: list[int | None] = []
    for v, sp in enumerate(spaces):
        dims = [d for d in range(len(sp.shape)) if classes[(v, d)] == batch]
        out.append(dims[0] if dims else None)
    return out


def _split(sp: Space, dim: int | None, p: int) -> Counts:
    """As much of p as ``dim`` holds (a divisor of p), the rest shared uniformly."""
    counts = [1] * len(sp.shape)
    if dim is not None and sp.splittable[dim]:
        counts[dim] = max(d for d in range(1, p + 1) if p % d == 0 and d <= sp.shape[dim])
    return _uniform(sp, p // counts[dim] if dim is not None else p, counts)


def _primes(n: int) -> list[int]:
    out, f = [], 2
    while f * f <= n:
        while n % f == 0:
            out.append(f)
            n //= f
        f += 1
    return [*out, n] if n > 1 else out


def _uniform(sp: Space, p: int, start: list[int] | None = None) -> Counts:
    """Hand p's prime factors, largest first, to the dimension with the largest blocks."""
    counts = list(start) if start is not None else [1] * len(sp.shape)
    for f in sorted(_primes(p), reverse=True):
        fits = [d for d in range(len(counts)) if sp.splittable[d] and counts[d] * f <= sp.shape[d]]
        if not fits:
            continue
        d = max(fits, key=lambda d: sp.shape[d] / counts[d])
        counts[d] *= f
    return tuple(counts)


def baseline(
    name: str, g: EinGraph, spaces: Sequence[Space], live: Sequence[bool], targets: Sequence[int]
) -> list[Counts]:
    """Block counts per node; ``targets`` gives the blocks of each op (1: stays whole)."""
    batch = batch_dims(g, spaces)
    counts: list[Counts | None] = [None] * len(g.nodes)
    for v, sp in enumerate(spaces):
        p = targets[v]
        if p <= 1 or name == "none":
            continue
        if name == "data_parallel":
            counts[v] = _split(sp, batch[v], p)
        elif name == "model_parallel":
            others = [d for d in range(len(sp.shape)) if d != batch[v] and sp.splittable[d]]
            dim = max(reversed(others), key=lambda d: sp.shape[d]) if others else None
            counts[v] = _split(sp, dim, p)
        else:
            counts[v] = _uniform(sp, p)
    _lay_out_data(g, spaces, counts, live)
    return [c if c is not None else (1,) * len(sp.shape) for c, sp in zip(counts, spaces, strict=True)]


def _lay_out_data(g: EinGraph, spaces: Sequence[Space], counts: list[Counts | None], live) -> None:
    """Data nodes take what their heaviest reader reads; formations inherit."""
    readers: list[list[tuple[int, int]]] = [[] for _ in g.nodes]
    for v, node in enumerate(g.nodes):
        if live[v]:
            for k, u in enumerate(node.inputs):
                readers[u].append((v, k))
    for u in reversed(range(len(g.nodes))):
        sp = spaces[u]
        if counts[u] is not None or sp.kind in ("fill", "follow") or not readers[u]:
            continue
        v, k = max(readers[u], key=lambda r: spaces[r[0]].flops)
        if counts[v] is None:
            continue
        want = [1] * len(sp.shape)
        for a, d in enumerate(spaces[v].operands[k]):
            if d is not None and sp.splittable[sp.out_dims[a]]:
                want[sp.out_dims[a]] = counts[v][d]
        counts[u] = tuple(want)
    for v, sp in enumerate(spaces):
        if sp.kind == "follow":
            u = g.nodes[v].inputs[0]
            src = counts[u] or (1,) * len(spaces[u].shape)
            counts[v] = tuple(src[d] for d in spaces[u].out_dims)


BASELINES = ("data_parallel", "model_parallel", "uniform", "none")
