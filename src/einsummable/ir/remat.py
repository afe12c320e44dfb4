"""Activation checkpointing (rematerialisation) as a pass: EinGraph in, EinGraph out.

The forward part of a training graph is what the loss depends on. Every other node
(the backward and the update) that reads a forward activation normally keeps that
activation alive from the forward pass until the backward uses it. ``rematerialize``
keeps only the ``keep`` nodes (and the inputs) alive that long: each other forward
value a backward node reads is recomputed from the kept ones, by copies of its
forward nodes placed just before the first backward node that needs it. The copies
are the same ops on the same values, so the gradients are bitwise unchanged.

Example: for ``h1 = layer(x); h2 = layer(h1); loss = f(h2)`` with ``keep=[h1, h2]``,
the pre-activations inside each layer are recomputed during the backward pass
instead of being held from the forward pass. Checkpoints bound how much is recomputed
at once: with ``keep=[]`` the whole forward is recomputed in one go and nothing is saved.
Measured on a 6-layer residual GELU MLP (tests/autodiff/test_remat.py): keeping every
layer's output cuts the peak held bytes from 57 kB to 37 kB for 12 recomputed nodes (and 18
that order them, below).

Order: the engines run a ready task as soon as a core is free, so a recomputation whose
checkpoint exists would run during the forward pass and save nothing (the simulator
showed 11.3 MiB either way on a 2-core machine). The first op of each recomputed chain
therefore reads its checkpoint through a barrier, ``where(t == t, x, x)``, whose token
``t`` is one element of the last backward value made before the chain is needed: the
same ``x`` for every value, NaN included, but not before the backward gets there (the
optimization barrier of JAX's remat plays this part). ``gates`` finds these nodes.

``checkpoints`` finds the forward values that make good ``keep`` sets: the cuts of the
forward (the residual stream between layers), through which every later forward value
is computed. Index names (``EinGraph.index_names``) follow the nodes and their copies.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from einsummable.ir.dtypes import itemsize
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.graph import ComplexView, EinGraph, EinsumNode, InputNode, Piece, Reshape, Select
from einsummable.ir.syntax import parse

BARRIER = parse("where(x1 == x1, x0, x0)")


def rematerialize(graph: EinGraph, loss: int, keep: Iterable[int]) -> EinGraph:
    """A new graph computing the same outputs, recomputing un-kept activations for the backward."""
    kept = set(keep)
    forward = graph.live(roots=[loss])
    out = EinGraph()
    moved: dict[int, int] = {}  # original id -> id in out
    copies: dict[int, int] = {}  # recomputed forward id -> id of its copy in out
    barriers: dict[tuple[int, int], int] = {}  # (value, token) -> the value, once the token exists
    tokens: dict[int, int] = {}  # backward value -> a scalar of it
    progress = [-1]  # the backward value the next recomputation waits for

    def add(nid: int, inputs: tuple[int, ...]) -> int:
        new = out.add(dataclasses.replace(graph.nodes[nid], inputs=inputs))
        if nid in graph.index_names:
            out.index_names[new] = graph.index_names[nid]
        return new

    def recomputable(nid: int) -> bool:
        return forward[nid] and nid not in kept and not isinstance(graph.nodes[nid], InputNode)

    def operand(i: int) -> int:
        return copies[i] if recomputable(i) else moved[i]

    def gated(inputs: tuple[int, ...], originals: tuple[int, ...]) -> tuple[int, ...]:
        """A chain's first recomputation reads one operand through a barrier on the backward's
        progress, so that no engine runs it before the backward needs it."""
        if progress[0] < 0 or not originals or any(recomputable(i) for i in originals):
            return inputs
        k = next((k for k, i in enumerate(originals) if not isinstance(graph.nodes[i], InputNode)), 0)
        key = (inputs[k], progress[0])
        if key not in barriers:
            barriers[key] = _barrier(out, inputs[k], _token(out, progress[0], tokens))
        return (*inputs[:k], barriers[key], *inputs[k + 1:])

    def copy(root: int) -> None:
        stack = [root]
        while stack:
            nid = stack[-1]
            if nid in copies:
                stack.pop()
                continue
            todo = [i for i in graph.nodes[nid].inputs if recomputable(i) and i not in copies]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            originals = graph.nodes[nid].inputs
            copies[nid] = add(nid, gated(tuple(operand(i) for i in originals), originals))

    for nid, node in enumerate(graph.nodes):
        if forward[nid]:
            moved[nid] = add(nid, tuple(moved[i] for i in node.inputs))
            continue
        for i in node.inputs:
            if recomputable(i):
                copy(i)
        moved[nid] = add(nid, tuple(operand(i) for i in node.inputs))
        if _token_source(out, moved[nid]):
            progress[0] = moved[nid]
    for name, nid in graph.outputs.items():
        out.set_output(name, moved[nid])
    out.class_ids = list(graph.class_ids)
    return out


def _token_source(g: EinGraph, v: int) -> bool:
    """Whether one element of v can gate a recomputation: a finished, non-empty value."""
    node = g.nodes[v]
    return not (isinstance(node, EinsumNode) and node.partial) and math.prod(node.shape) > 0


def _token(g: EinGraph, v: int, tokens: dict[int, int]) -> int:
    """A scalar of v: its first element."""
    if v not in tokens:
        node = g.nodes[v]
        if node.shape:
            rank = len(node.shape)
            first = g.add(Select((v,), (Piece(0, ((0, 1),) * rank, (0,) * rank),), (1,) * rank, node.dtype))
            tokens[v] = g.add(Reshape((first,), (), node.dtype))
        else:
            tokens[v] = v
    return tokens[v]


def _barrier(g: EinGraph, v: int, token: int) -> int:
    """v itself, computed only once ``token`` exists: ``where(t == t, x, x)`` is x for every t
    and x, NaN included (as JAX's remat orders recomputation with an optimization barrier)."""
    node = g.nodes[v]
    every = tuple(range(len(node.shape)))
    op = Einsummable(node.shape, (every, ()), len(every), BARRIER, None, (node.dtype, g.nodes[token].dtype))
    return g.add(EinsumNode(op, (v, token)))


def gates(graph: EinGraph) -> set[int]:
    """The barriers of a rematerialised graph and the scalars that only they read (as their
    token): the nodes that order recomputation, as against the recomputed ones."""
    users = graph.users()
    out = {v for v, node in enumerate(graph.nodes)
           if isinstance(node, EinsumNode) and node.op.join == BARRIER}
    for v in reversed(range(len(graph.nodes))):
        if isinstance(graph.nodes[v], Select | Reshape) and users[v] and all(
                u in out and graph.nodes[u].inputs[-1] == v for u in users[v]):
            out.add(v)
    return out


def checkpoints(graph: EinGraph, loss: int) -> list[int]:
    """The forward values, in order, that every later forward value is computed through.

    Node c is a cut when no forward value made before c is read after c: in a residual
    network, the stream between layers. Inputs, views of them (weights), values computed
    from fills alone (masks, rotary tables) and small values (under an eighth of the
    median forward value: token targets, norms' scales) are read anywhere and do not
    count; nor are partial sums cuts (their formation is the value), nor the loss.
    """
    forward = graph.live(roots=[loss])
    n = len(graph.nodes)
    ignored = [False] * n
    fills_only = [False] * n  # computed from fills alone
    last = list(range(n))  # last forward reader
    for nid, node in enumerate(graph.nodes):
        if not forward[nid]:
            continue
        fills_only[nid] = not isinstance(node, InputNode) and all(fills_only[i] for i in node.inputs)
        ignored[nid] = isinstance(node, InputNode) or fills_only[nid] or (
            isinstance(node, Reshape | ComplexView) and ignored[node.inputs[0]])
        for i in node.inputs:
            last[i] = max(last[i], nid)
    size = [_nbytes(node) for node in graph.nodes]
    values = sorted(size[v] for v in range(n) if forward[v] and not ignored[v])
    small = values[len(values) // 2] / 8 if values else 0
    cuts, reach = [], 0
    for nid, node in enumerate(graph.nodes):
        if not forward[nid] or ignored[nid]:
            continue
        if reach <= nid and nid != loss and not (isinstance(node, EinsumNode) and node.partial):
            cuts.append(nid)
        if size[nid] >= small:
            reach = max(reach, last[nid])
    return cuts


def _nbytes(node) -> int:
    return itemsize(node.dtype) * math.prod(node.shape)


def peak_bytes(graph: EinGraph) -> int:
    """Peak bytes of computed values held when nodes run in id order and each value is
    freed after its last use (as the reference engine does); inputs are not counted."""
    live = graph.live()
    last_use = {}
    for nid, node in enumerate(graph.nodes):
        if live[nid]:
            for i in node.inputs:
                last_use[i] = nid
    for nid in graph.outputs.values():
        last_use[nid] = len(graph.nodes)
    held, peak = 0, 0
    frees: dict[int, list[int]] = {}
    for nid, node in enumerate(graph.nodes):
        if not live[nid] or isinstance(node, InputNode):
            continue
        size = itemsize(node.dtype) * math.prod(node.shape)
        held += size
        peak = max(peak, held)
        frees.setdefault(last_use.get(nid, nid), []).append(size)
        for freed in frees.pop(nid, []):
            held -= freed
    return peak
