"""Reverse-mode autodiff on the EinGraph itself.

``grad(loss, wrt)`` visits the nodes between ``wrt`` and ``loss`` in reverse id
order, sums each node's cotangent contributions, and hands the total to the node
kind's VJP rule (``rules.VJP``), which appends the gradient nodes through the
frontend builders. Gradient nodes are ordinary nodes: they are planned, decomposed
and run like the forward ones.

Example: ``dw, = grad((x * w).sum(), [w])`` is ``x`` itself and appends nothing;
the seed 1 stays symbolic and folds away.
"""

from __future__ import annotations

from collections.abc import Sequence

from einsummable.autodiff.cotangent import Cot, Forward, Uniform, materialize, total
from einsummable.autodiff.rules import VJP
from einsummable.errors import AutodiffError
from einsummable.frontend.tensor import Graph, Tensor
from einsummable.ir.dtypes import FLOATS, INTS
from einsummable.ir.graph import Node


def grad(loss: Tensor, wrt: Sequence[Tensor], seed: Tensor | None = None) -> list[Tensor]:
    """Gradients of ``loss`` with respect to each of ``wrt``, as tensors of the same graph.

    ``loss`` must be a real scalar unless ``seed`` (the cotangent of ``loss``, of its
    shape and dtype) is given. A ``wrt`` that ``loss`` does not depend on gets zeros.
    Through a max or min, tied elements split the gradient equally (see ``rules``).
    """
    graph = _check(loss, wrt, seed)
    nodes = tuple(graph.ir.nodes)
    fw = Forward(graph, nodes, tuple(tuple(u) for u in graph.ir.users()))
    relevant = _relevant(graph, nodes, loss.id, {w.id for w in wrt})
    start: Cot = seed if seed is not None else Uniform(1.0, (), loss.dtype)
    pending: dict[int, list[Cot]] = {loss.id: [start]}
    done: dict[int, Cot] = {}
    for nid in range(loss.id, -1, -1):
        parts = pending.pop(nid, None)
        if parts is None:
            continue
        g = total(graph, parts)
        done[nid] = g
        node = nodes[nid]
        wants = tuple(relevant[i] for i in node.inputs)
        if not any(wants) or (isinstance(g, Uniform) and g.value == 0):
            continue
        for i, c in zip(node.inputs, _rule(node, nid)(fw, nid, g, wants), strict=True):
            if c is not None:
                pending.setdefault(i, []).append(c)
    return [materialize(graph, done.get(w.id, Uniform(0.0, w.shape, w.dtype))) for w in wrt]


def _rule(node: Node, nid: int):
    rule = VJP.get(type(node))
    if rule is None:
        raise AutodiffError(f"%{nid}: no VJP rule for node kind {type(node).__name__}")
    return rule


def _check(loss: Tensor, wrt: Sequence[Tensor], seed: Tensor | None) -> Graph:
    if not isinstance(loss, Tensor):
        raise AutodiffError(f"grad's loss must be a Tensor, got {type(loss).__name__}")
    graph = loss.graph
    if isinstance(wrt, Tensor):
        raise AutodiffError("grad takes a list of tensors to differentiate with respect to: grad(loss, [w])")
    for k, w in enumerate(wrt):
        if not isinstance(w, Tensor) or w.graph is not graph:
            raise AutodiffError(f"wrt[{k}] must be a Tensor of the loss's graph, got {w!r}")
        if w.dtype == "bool" or w.dtype in INTS:
            kind = "boolean" if w.dtype == "bool" else "an integer tensor (ids, indices)"
            raise AutodiffError(
                f"wrt[{k}] {w!r} is {kind}; there is no gradient with respect to it. Differentiate "
                "with respect to a float tensor, such as the embedding table the ids index"
            )
    if seed is None:
        if loss.shape != () or loss.dtype not in FLOATS:
            fix = ("cast it to a float first (loss.astype('f32'))" if loss.dtype in INTS
                   else f"reduce it first (loss.sum()) or pass seed= a cotangent of shape {loss.shape}")
            raise AutodiffError(f"loss {loss!r} must be a real scalar; {fix}")
        return graph
    if not isinstance(seed, Tensor) or seed.graph is not graph:
        raise AutodiffError(f"seed must be a Tensor of the loss's graph, got {seed!r}")
    if (seed.shape, seed.dtype) != (loss.shape, loss.dtype):
        raise AutodiffError(f"seed {seed!r} must match the loss {loss!r} in shape and dtype")
    return graph


def _relevant(graph: Graph, nodes: tuple[Node, ...], loss: int, wrt: set[int]) -> list[bool]:
    """Nodes on some path from a ``wrt`` to the loss, carrying a differentiable value
    (booleans and integers carry none: they are piecewise constant)."""
    ancestors = graph.ir.live(roots=[loss])
    reached = [False] * len(nodes)
    for nid, node in enumerate(nodes):
        reached[nid] = nid in wrt or any(reached[i] for i in node.inputs)
    return [a and r and n.dtype != "bool" and n.dtype not in INTS
            for a, r, n in zip(ancestors, reached, nodes, strict=True)]
