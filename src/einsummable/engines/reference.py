"""The reference engine: whole-tensor numpy over the EinGraph, no decomposition.

It is the oracle every planner and engine is checked against, so it stays
simple: one rule per node kind, values freed after their last use.
"""

from __future__ import annotations

import numpy as np

from einsummable.engines import scheduler
from einsummable.engines.kernels import reference as reference_kernel
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
    return reference_kernel.einsum(node.op, args, variables)


def _formation(node: Formation, args, feeds, variables):
    return args[0]


def _fill(node: Fill, args, feeds, variables):
    return reference_kernel.fill(node.kind, node.dtype, whole(node.shape))


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
    nodes, live, variables = graph.nodes, graph.live(), variables or {}

    def execute(nid: int, args: list) -> np.ndarray | None:
        return EVAL[type(nodes[nid])](nodes[nid], args, feeds, variables) if live[nid] else None

    values = scheduler.run_in_order(
        [node.inputs if live[nid] else () for nid, node in enumerate(nodes)], execute,
        keep=set(graph.outputs.values()), describe=lambda nid: f"%{nid} {nodes[nid].describe()}",
    )
    return {name: np.array(values[nid], copy=True) for name, nid in graph.outputs.items()}
