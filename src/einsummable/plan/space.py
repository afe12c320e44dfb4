"""What the planner partitions for each node kind: one rule per kind in ``SPACES``.

A node's *space* is its join space for an einsummable and its output shape for
every other kind. For each operand the space says which of its dimensions each
operand axis follows (``None``: that axis is needed whole), so one cost model and
one lowering serve every kind. Example: ``ij,jk->ik`` has space ``(i, k, j)``,
operands ``((0, 2), (2, 1))``, output dims ``(0, 1)`` and aggregated dims ``(2,)``.

Kinds of space, which decide the candidate partitions:
- ``compute``: einsummables; about p blocks each, unless the op is tiny;
- ``data``: inputs, selects, reshapes, complex views; any block count dividing p;
- ``fill``: constants are rebuilt wherever they are read, so they stay whole;
- ``follow``: a formation takes its einsummable's output partition.
"""

from __future__ import annotations

from dataclasses import dataclass

from einsummable.errors import PlanError
from einsummable.ir.box import Box
from einsummable.ir.dtypes import itemsize
from einsummable.ir.einsummable import letter
from einsummable.ir.graph import (
    ComplexView,
    EinGraph,
    EinsumNode,
    Fill,
    Formation,
    InputNode,
    Node,
    Reshape,
    Select,
)

Axis = int | None


@dataclass(frozen=True)
class Space:
    kind: str
    shape: tuple[int, ...]
    out_dims: tuple[int, ...]
    operands: tuple[tuple[Axis, ...], ...]
    splittable: tuple[bool, ...]
    aggregated: tuple[int, ...] = ()
    flops: int = 0

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(letter(i) for i in range(len(self.shape)))

    def operand_box(self, k: int, box: Box, operand_shape: tuple[int, ...]) -> Box:
        """The piece of operand k that the space block ``box`` reads."""
        return tuple(
            box[d] if d is not None else (0, n) for d, n in zip(self.operands[k], operand_shape, strict=True)
        )

    def out_box(self, box: Box) -> Box:
        return tuple(box[d] for d in self.out_dims)


def _input(node: InputNode, g: EinGraph) -> Space:
    rank = len(node.shape)
    return Space("data", node.shape, tuple(range(rank)), (), (True,) * rank)


def _einsum(node: EinsumNode, g: EinGraph) -> Space:
    op = node.op
    return Space(
        "compute", op.join_shape, tuple(range(op.out_rank)), op.inputs, (True,) * op.rank,
        op.aggregated, op.flops(),
    )


def _formation(node: Formation, g: EinGraph) -> Space:
    rank = len(node.shape)
    return Space("follow", node.shape, tuple(range(rank)), (tuple(range(rank)),), (True,) * rank)


def _fill(node: Fill, g: EinGraph) -> Space:
    rank = len(node.shape)
    return Space("fill", node.shape, tuple(range(rank)), (), (False,) * rank)


def _select(node: Select, g: EinGraph) -> Space:
    """Split only the axes every piece copies whole, such as the rows of a column slice."""
    rank = len(node.shape)
    clean = []
    for d in range(rank):
        ok = all(
            p.src[d] == (0, node.shape[d]) and p.dst[d] == 0 and g.nodes[node.inputs[p.input]].shape[d]
            == node.shape[d]
            for p in node.pieces
        )
        clean.append(ok and bool(node.pieces))
    operands = tuple(tuple(d if clean[d] else None for d in range(rank)) for _ in node.inputs)
    return Space("data", node.shape, tuple(range(rank)), operands, tuple(clean))


def reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Pair runs of source and target axes (size-1 axes left out) with equal products."""
    i = j = 0
    src_dims = [d for d, n in enumerate(src) if n != 1]
    dst_dims = [d for d, n in enumerate(dst) if n != 1]
    groups = []
    while i < len(src_dims) and j < len(dst_dims):
        a, b = [src_dims[i]], [dst_dims[j]]
        pa, pb = src[src_dims[i]], dst[dst_dims[j]]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                a.append(src_dims[i])
                pa *= src[src_dims[i]]
                i += 1
            else:
                b.append(dst_dims[j])
                pb *= dst[dst_dims[j]]
                j += 1
        groups.append((a, b))
    return groups


def _reshape(node: Reshape, g: EinGraph) -> Space:
    """Split only the axes that pass through unchanged; merged or split axes stay whole."""
    src = g.nodes[node.inputs[0]].shape
    rank = len(node.shape)
    operand: list[Axis] = [None] * len(src)
    clean = [False] * rank
    if 0 not in src:
        for a, b in reshape_groups(src, node.shape):
            if len(a) == 1 and len(b) == 1:
                operand[a[0]] = b[0]
                clean[b[0]] = True
    return Space("data", node.shape, tuple(range(rank)), (tuple(operand),), tuple(clean))


def _complex_view(node: ComplexView, g: EinGraph) -> Space:
    rank = len(node.shape)
    operand = (*range(rank - 1), None)
    return Space("data", node.shape, tuple(range(rank)), (operand,), (*([True] * (rank - 1)), False))


SPACES = {
    InputNode: _input,
    EinsumNode: _einsum,
    Formation: _formation,
    Fill: _fill,
    Select: _select,
    Reshape: _reshape,
    ComplexView: _complex_view,
}


def space_of(node: Node, g: EinGraph) -> Space:
    rule = SPACES.get(type(node))
    if rule is None:
        raise PlanError(f"no planning rule for node kind {type(node).__name__}")
    return rule(node, g)


def spaces(g: EinGraph) -> tuple[Space, ...]:
    return tuple(space_of(node, g) for node in g.nodes)


def nbytes(node: Node) -> int:
    n = itemsize(node.dtype)
    for s in node.shape:
        n *= s
    return n


def is_partial(node: Node) -> bool:
    return isinstance(node, EinsumNode) and node.partial
