"""Cotangents during the reverse sweep, and the forward graph the rules read.

A cotangent is a Tensor, or a ``Uniform``: the same number everywhere, kept
symbolic so that it folds into the joins that use it instead of becoming a fill.
"""

from __future__ import annotations

from dataclasses import dataclass

from einsummable.frontend.tensor import Graph, Tensor, elementwise
from einsummable.ir.einsummable import IDENTITY
from einsummable.ir.expr import Const, Expr, Input, call
from einsummable.ir.graph import EinsumNode, Formation, Node


@dataclass(frozen=True)
class Uniform:
    """A cotangent equal to ``value`` at every element."""

    value: float | complex
    shape: tuple[int, ...]
    dtype: str


Cot = Tensor | Uniform


@dataclass(frozen=True)
class Forward:
    """The graph as it was before the sweep began appending gradient nodes."""

    graph: Graph
    nodes: tuple[Node, ...]
    users: tuple[tuple[int, ...], ...]

    def tensor(self, nid: int) -> Tensor:
        return Tensor(self.graph, nid)

    def formed(self, nid: int) -> Tensor:
        """The readable value of ``nid``: for a partial aggregation, its formation."""
        node = self.nodes[nid]
        if isinstance(node, EinsumNode) and node.partial:
            for user in self.users[nid]:
                if isinstance(self.nodes[user], Formation):
                    return Tensor(self.graph, user)
        return Tensor(self.graph, nid)


def materialize(graph: Graph, c: Cot) -> Tensor:
    if isinstance(c, Tensor):
        return c
    return graph.full(c.shape, c.value, c.dtype)


def total(graph: Graph, parts: list[Cot]) -> Cot:
    """Sum contributions with one elementwise node; uniform parts fold into its constant."""
    const = sum(p.value for p in parts if isinstance(p, Uniform))
    tensors = [p for p in parts if isinstance(p, Tensor)]
    if not tensors:
        first = parts[0]
        return Uniform(const, first.shape, first.dtype)
    if const == 0 and len(tensors) == 1:
        return tensors[0]
    expr: Expr = IDENTITY
    for k in range(1, len(tensors)):
        expr = call("add", expr, Input(k))
    if const != 0:
        expr = call("add", expr, Const(const))
    return elementwise(expr, *tensors)
