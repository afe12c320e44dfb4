"""Class ids are data: which fed values must be integers in [0, n), checked when fed.

Ids travel as i64 or i32 (floats holding whole numbers still work, checked alike).

cross_entropy and an embedding read a class id by comparing it with an index ramp,
so an id that is out of range or fractional matches no class: the loss is ln(n) and
the embedding a zero row, without a word. ``mark_class_ids`` traces a tensor of
class ids back to the input region it is a copy of (through slices, concatenations
and whole reshapes, as ``tokens[:, 1:]``) and records it on the graph; feed checking
(engines/feeds.py) then refuses a bad id by value and position. Class ids computed
inside the graph are not traced: keeping those in range is the graph's own business.
"""

from __future__ import annotations

from einsummable.frontend.tensor import Tensor
from einsummable.ir.box import Box, whole
from einsummable.ir.graph import ClassIds, EinGraph, InputNode, Reshape, Select


def mark_class_ids(t: Tensor, classes: int, use: str) -> None:
    """Record that ``t`` holds class ids in [0, classes), wherever it copies an input."""
    ir = t.graph.ir
    for name, box in _sources(ir, t.id):
        ir.add_class_ids(ClassIds(name, box, classes, use))


def _sources(ir: EinGraph, nid: int) -> list[tuple[str, Box]]:
    """The input regions that node ``nid`` is a plain copy of."""
    out = []
    stack = [(nid, whole(ir.nodes[nid].shape))]
    while stack:
        nid, box = stack.pop()
        node = ir.nodes[nid]
        if any(lo >= hi for lo, hi in box):
            continue
        if isinstance(node, InputNode):
            out.append((node.name, box))
        elif isinstance(node, Select):
            for p in node.pieces:
                part = tuple((max(lo, d_lo), min(hi, d_hi))
                             for (lo, hi), (d_lo, d_hi) in zip(box, p.dst_box, strict=True))
                src = tuple((s_lo + lo - d_lo, s_lo + hi - d_lo)
                            for (lo, hi), (d_lo, _), (s_lo, _) in zip(part, p.dst_box, p.src, strict=True))
                stack.append((node.inputs[p.input], src))
        elif isinstance(node, Reshape) and box == whole(node.shape):
            stack.append((node.inputs[0], whole(ir.nodes[node.inputs[0]].shape)))
    return out
