"""The reference engine: whole-tensor numpy over the EinGraph, no decomposition.

It is the oracle every planner and engine is checked against, so it stays
simple: one rule per node kind, values freed after their last use.
"""

from __future__ import annotations

import numpy as np

from einsummable.engines import kernels
from einsummable.ir.box import slices, whole
from einsummable.ir.dtypes import to_numpy
from einsummable.ir.graph import (
    ComplexView,
    EinGraph,
    EinsumNode,
    Fill,
    Formation,
    InputNode,
    Reshape,
    Select,
)


def _input(node: InputNode, args, feeds, variables):
    return feeds[node.name]


def _einsum(node: EinsumNode, args, feeds, variables):
    return kernels.einsum(node.op, args, variables)


def _formation(node: Formation, args, feeds, variables):
    return args[0]


def _fill(node: Fill, args, feeds, variables):
    return kernels.fill(node.kind, node.dtype, whole(node.shape))


def _select(node: Select, args, feeds, variables):
    out = np.full(node.shape, node.pad, dtype=to_numpy(node.dtype))
    for p in node.pieces:
        out[slices(p.dst_box)] = args[p.input][slices(p.src)]
    return out


def _reshape(node: Reshape, args, feeds, variables):
    return args[0].reshape(node.shape)


def _complex_view(node: ComplexView, args, feeds, variables):
    a = np.ascontiguousarray(args[0])
    return a.view(to_numpy(node.dtype)).reshape(node.shape)


EVAL = {
    InputNode: _input,
    EinsumNode: _einsum,
    Formation: _formation,
    Fill: _fill,
    Select: _select,
    Reshape: _reshape,
    ComplexView: _complex_view,
}


def run(graph: EinGraph, feeds: dict[str, np.ndarray], variables: dict[str, float] | None = None
        ) -> dict[str, np.ndarray]:
    """Evaluate every live node in order; feeds are assumed checked."""
    live = graph.live()
    remaining = [0] * len(graph.nodes)
    for nid, node in enumerate(graph.nodes):
        if live[nid]:
            for i in node.inputs:
                remaining[i] += 1
    wanted = set(graph.outputs.values())
    values: dict[int, np.ndarray] = {}
    for nid, node in enumerate(graph.nodes):
        if not live[nid]:
            continue
        args = [values[i] for i in node.inputs]
        values[nid] = EVAL[type(node)](node, args, feeds, variables or {})
        for i in node.inputs:
            remaining[i] -= 1
            if remaining[i] == 0 and i not in wanted:
                del values[i]
    return {name: np.array(values[nid], copy=True) for name, nid in graph.outputs.items()}
