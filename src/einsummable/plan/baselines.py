"""Baseline planners, the strategies people write by hand; EinDecomp must match or beat them.

Each is a two-level plan (twolevel.TwoLevel): blocks across machines, then blocks of
a machine's block across its cores. The *data* indices are those that appear in
no parameter: the batch (the first axis of the data input, the one graph input
whose first axis no other input shares) and, in a sequence model, the positions.
- ``data_parallel``, as experts run it: the data indices across machines (batch
  first), each op split across a machine's cores along its output indices (the
  threads of a BLAS call), a full replica of parameters, gradients and optimizer
  state on every machine, and gradients summed across machines by a
  reduce-scatter and all-gather (the two halves of a ring all-reduce: parameters
  and state are laid out as shards across machines, gathered where read);
- ``fsdp`` (ZeRO-3): the same partitions, but each machine keeps only its shard of
  parameters, gradients and optimizer state, gathering a parameter per use;
- ``megatron``: data parallel across machines, tensor parallel inside a machine
  (each op's largest non-data index across the cores), state replicated per machine;
- ``model_parallel``: each op's largest non-data index at both levels;
- ``uniform``: every index of every op, sharing the prime factors at both levels;
- ``none``: every node whole, so each op runs on one worker.
Like EinDecomp, each op with a target t > 1 (``cost.compute_target``: as many
blocks as it has workers at that level, or fewer for an op too small to fill them)
gets exactly t blocks: the strategy's indices take as much of t as they can hold,
and what is left is shared among the other indices the uniform way. Smaller ops,
inputs, selects and reshapes take the partition their heaviest reader wants, as
a hand-written strategy would lay out its data. Formations inherit.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from einsummable.ir.graph import EinGraph, InputNode
from einsummable.plan.cost import divisors
from einsummable.plan.space import Space

Counts = tuple[int, ...]


_CLASSES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def dim_classes(g: EinGraph, spaces: Sequence[Space]) -> dict[tuple[int, int], tuple[int, int]]:
    """Union-find over (node, space dim): an operand axis is the same index as its producer's.

    The classes depend only on which dims the operands follow, the same for a graph's
    spaces and for its machine blocks, so they are kept per graph (while it does not grow)."""
    key = tuple((sp.out_dims, sp.operands) for sp in spaces)
    cached = _CLASSES.get(g)
    if cached is not None and cached[0] == key:
        return cached[1]
    classes = _classes(g, spaces)
    _CLASSES[g] = (key, classes)
    return classes


def _classes(g: EinGraph, spaces: Sequence[Space]) -> dict[tuple[int, int], tuple[int, int]]:
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


def _inputs(g: EinGraph) -> list[int]:
    return [v for v, n in enumerate(g.nodes) if isinstance(n, InputNode) and n.shape]


def data_input(g: EinGraph, classes: dict) -> int | None:
    """The graph input that carries the batch: of the inputs whose first axis no other
    input shares (a weight's axes are shared with the activations' weights), the one
    whose first axis reaches the most nodes."""
    inputs = _inputs(g)
    if not inputs:
        return None
    owners: dict[tuple[int, int], set[int]] = {}
    for v in inputs:
        for d in range(len(g.nodes[v].shape)):
            owners.setdefault(classes[(v, d)], set()).add(v)
    reach: dict[tuple[int, int], int] = {}
    for c in classes.values():
        reach[c] = reach.get(c, 0) + 1
    alone = [v for v in inputs if len(owners[classes[(v, 0)]]) == 1]
    return max(alone, key=lambda v: reach[classes[(v, 0)]]) if alone else inputs[0]


def batch_dims(g: EinGraph, spaces: Sequence[Space]) -> list[int | None]:
    """Per node, the space dim that carries the batch index, if any."""
    return [dims[0] if dims else None for dims in data_dims(g, spaces, batch_only=True)]


def data_dims(g: EinGraph, spaces: Sequence[Space], batch_only: bool = False) -> list[list[int]]:
    """Per node, the dims that carry data indices: the batch first, then the dims of
    indices that appear in no other input (positions, keys), largest first."""
    classes = dim_classes(g, spaces)
    first = data_input(g, classes)
    if first is None:
        return [[] for _ in spaces]
    batch = classes[(first, 0)]
    params = {classes[(v, d)] for v in _inputs(g) if v != first for d in range(len(g.nodes[v].shape))}
    out = []
    for v, sp in enumerate(spaces):
        dims = [d for d in range(len(sp.shape)) if classes[(v, d)] == batch][:1]
        if not batch_only:
            rest = [d for d in range(len(sp.shape)) if classes[(v, d)] not in params and d not in dims]
            dims += sorted(rest, key=lambda d: -sp.shape[d])
        out.append(dims)
    return out


def _largest_divisor(p: int, limit: int) -> int:
    return max(d for d in divisors(p) if d <= limit)


def _split_many(sp: Space, dims: Sequence[int], p: int) -> Counts:
    """The dims in turn take as much of p as they hold; the rest is shared uniformly."""
    counts = [1] * len(sp.shape)
    for d in dims:
        if sp.splittable[d]:
            counts[d] = _largest_divisor(p, sp.shape[d])
            p //= counts[d]
    return _uniform(sp, p, counts)


def _split(sp: Space, dim: int | None, p: int) -> Counts:
    """As much of p as ``dim`` holds (a divisor of p), the rest shared uniformly."""
    counts = [1] * len(sp.shape)
    if dim is not None and sp.splittable[dim]:
        counts[dim] = _largest_divisor(p, sp.shape[dim])
    return _uniform(sp, p // counts[dim] if dim is not None else p, counts)


def _primes(n: int) -> list[int]:
    out, f = [], 2
    while f * f <= n:
        while n % f == 0:
            out.append(f)
            n //= f
        f += 1
    return [*out, n] if n > 1 else out


def _uniform(sp: Space, p: int, start: list[int] | None = None, dims: Sequence[int] | None = None) -> Counts:
    """Hand p's prime factors, largest first, to the dimension (of ``dims``, else any)
    with the largest blocks."""
    counts = list(start) if start is not None else [1] * len(sp.shape)
    for f in sorted(_primes(p), reverse=True):
        fits = [d for d in range(len(counts)) if sp.splittable[d] and counts[d] * f <= sp.shape[d]]
        if dims is not None and any(d in dims for d in fits):
            fits = [d for d in fits if d in dims]
        if not fits:
            continue
        d = max(fits, key=lambda d: sp.shape[d] / counts[d])
        counts[d] *= f
    return tuple(counts)


def level(name: str, g: EinGraph, spaces: Sequence[Space], live: Sequence[bool], targets: Sequence[int],
          data: Sequence[Sequence[int]], state: Sequence[bool], across: bool) -> list[Counts]:
    """Block counts of one level (``across`` machines, or within one machine's blocks);
    ``state`` marks the nodes that data parallelism lays out as shards across machines."""
    counts: list[Counts | None] = [None] * len(g.nodes)
    expert = name in ("data_parallel", "fsdp", "megatron")
    for v, sp in enumerate(spaces):
        p = targets[v]
        if name == "none" or (p <= 1 and not (across and expert and state[v])):
            continue
        if expert and across:
            counts[v] = _uniform(sp, p) if state[v] or not data[v] else _split_many(sp, data[v], p)
        elif name in ("data_parallel", "fsdp"):  # the threads of one call split its output
            counts[v] = _uniform(sp, p, dims=sp.out_dims)
        elif name in ("megatron", "model_parallel"):
            others = [d for d in range(len(sp.shape)) if d not in data[v] and sp.splittable[d]]
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
        if counts[u] is not None or sp.kind in ("fill", "follow") or not readers[u] or not live[u]:
            continue
        v, k = max(readers[u], key=lambda r: spaces[r[0]].flops)
        if counts[v] is None:
            continue
        want = [1] * len(sp.shape)
        for a, d in enumerate(spaces[v].operands[k]):
            if d is not None and sp.splittable[sp.out_dims[a]]:
                want[sp.out_dims[a]] = min(counts[v][d], max(1, sp.shape[sp.out_dims[a]]))
        counts[u] = tuple(want)
    for v, sp in enumerate(spaces):
        if sp.kind == "follow":
            u = g.nodes[v].inputs[0]
            src = counts[u] or (1,) * len(spaces[u].shape)
            counts[v] = tuple(src[d] for d in spaces[u].out_dims)


BASELINES = ("data_parallel", "fsdp", "megatron", "model_parallel", "uniform", "none")
REPLICATED = ("data_parallel", "megatron")  # a full replica of the state on every machine
