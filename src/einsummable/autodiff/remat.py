"""Activation checkpointing for tensors: ``rematerialize(graph, loss, keep=[h1, h2])``.

The pass itself works on node ids and lives in ir/remat.py, where the planner uses it
too (plan/rematerialise.py applies it when activations do not fit); this takes the
frontend's Tensors as well as ids.
"""

from __future__ import annotations

from collections.abc import Iterable

from einsummable.frontend.tensor import Tensor
from einsummable.ir import remat
from einsummable.ir.graph import EinGraph
from einsummable.ir.remat import peak_bytes

__all__ = ["peak_bytes", "rematerialize"]


def rematerialize(graph: EinGraph, loss: int | Tensor, keep: Iterable[int | Tensor]) -> EinGraph:
    """A new graph computing the same outputs, recomputing un-kept activations for the backward."""
    return remat.rematerialize(graph, _id(loss), [_id(k) for k in keep])


def _id(t: int | Tensor) -> int:
    return t.id if isinstance(t, Tensor) else t
