"""Fusing elementwise chains: EinGraph in, EinGraph out, the same outputs.

An einsum P whose join has no aggregation and whose value only one einsum C reads,
once, over C's whole join space (no broadcast: every point of P is used exactly once),
is substituted into C's join: C reads P's operands instead of P's block, and P's
value is never written to memory. Chains fold one after another, so
``exp(x - m)`` summed is one pass, and ``y * (dy - s)`` after ``s = sum(y * dy)`` is
two. Nothing is computed twice: a P read twice, by two readers, or broadcast (read
at more points than it has) stays on its own, as does a graph output. A fused join
stays at most ``MAX_DEPTH`` deep.

Half-precision P (bf16, f16) stays on its own: its value is rounded where it is
written, and a fused reader would compute on the unrounded value. With this rule
the fused graph computes what the unfused one does, step for step; only a product
of several operands may be multiplied in another order by a kernel (numpy's einsum
path), so floats agree to rounding (tests/test_fuse.py, against the reference
engine on the unfused graph).

    ir = fuse(g.ir)     # before planning; plan, lowering and engines see the fused ops
"""

from __future__ import annotations

import dataclasses

from einsummable.ir.dtypes import HALF
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.expr import Input, depth, substitute
from einsummable.ir.graph import EinGraph, EinsumNode

MAX_DEPTH = 32  # of a fused join: a chain of a thousand ops folds in pieces, not into one tree


def fuse(graph: EinGraph) -> EinGraph:
    """The graph with every fusable elementwise producer folded into its reader."""
    readers: list[list[int]] = [[] for _ in graph.nodes]
    for v, node in enumerate(graph.nodes):
        for u in node.inputs:
            readers[u].append(v)
    outputs = set(graph.outputs.values())
    folded: set[int] = set()
    deep = [0] * len(graph.nodes)  # the depth of each einsum's join once its producers fold in
    for v, node in enumerate(graph.nodes):
        if isinstance(node, EinsumNode):
            deep[v] = depth(node.op.join) + max((deep[u] for u in node.inputs if u in folded), default=0)
            if _foldable(graph, v, readers[v], outputs) and \
                    deep[v] + depth(graph.nodes[readers[v][0]].op.join) <= MAX_DEPTH:
                folded.add(v)
    if not folded:
        return graph
    out = EinGraph()
    moved: dict[int, int] = {}
    ops: dict[int, tuple[Einsummable, tuple[int, ...]]] = {}  # a folded node's op over original ids
    for v, node in enumerate(graph.nodes):
        if isinstance(node, EinsumNode):
            op, inputs = node.op, node.inputs
            for k in reversed(range(len(inputs))):
                if inputs[k] in folded:
                    op, inputs = _absorb(op, inputs, k, *ops[inputs[k]])
            if v in folded:
                ops[v] = (op, inputs)
                continue
            node = EinsumNode(op, inputs)
            if v in graph.index_names:  # the join space is the reader's own: its letters hold
                out.index_names[len(out.nodes)] = graph.index_names[v]
        moved[v] = out.add(dataclasses.replace(node, inputs=tuple(moved[i] for i in node.inputs)))
    for name, v in graph.outputs.items():
        out.set_output(name, moved[v])
    out.class_ids = list(graph.class_ids)
    return out


def _foldable(graph: EinGraph, v: int, readers: list[int], outputs: set[int]) -> bool:
    node = graph.nodes[v]
    if not isinstance(node, EinsumNode) or node.op.agg is not None or v in outputs or node.dtype in HALF:
        return False
    if len(readers) != 1 or not isinstance(graph.nodes[readers[0]], EinsumNode):
        return False
    reader = graph.nodes[readers[0]].op
    k = graph.nodes[readers[0]].inputs.index(v)
    return len(reader.inputs[k]) == reader.rank  # read at every point of the reader's join once


def _absorb(c: Einsummable, c_inputs: tuple[int, ...], k: int, p: Einsummable,
            p_inputs: tuple[int, ...]) -> tuple[Einsummable, tuple[int, ...]]:
    """C with its operand k (P's value) replaced by P's join over P's operands."""
    where = c.inputs[k]  # P's dimension d is C's join index where[d]
    keep = [j for j in range(len(c.inputs)) if j != k]
    base = len(keep)
    inner = substitute(p.join, {i: Input(base + i) for i in range(len(p.inputs))})
    mapping = {j: Input(n) for n, j in enumerate(keep)} | {k: inner}
    op = Einsummable(
        c.join_shape,
        tuple(c.inputs[j] for j in keep) + tuple(tuple(where[d] for d in idx) for idx in p.inputs),
        c.out_rank,
        substitute(c.join, mapping),
        c.agg,
        tuple(c.dtypes[j] for j in keep) + p.dtypes,
    )
    return op, tuple(c_inputs[j] for j in keep) + p_inputs
