"""Peak memory of one machine under a plan, estimated from the graph order.

A machine is the unit of memory: its cores share one copy of every block it holds.
Given each node's block counts across machines (``cm``), a machine holds
``bytes / (machine blocks of the output)`` of a node (a partial sum: its piece of
one output block). Lifetimes follow the node order, which is the order a program
is written and run:
- graph inputs (parameters, optimizer state, data) are held for the whole step;
- every other value is held from the node that makes it to its last reader, and a
  graph output (gradients, new state) to the end of the step;
- views (reshapes, complex views, the formation of a finished value) hold nothing
  of their own; fills are rebuilt where read;
- while a node runs, the operand pieces it needs that are laid out otherwise
  across machines are *transient* copies (a gathered weight, a repartitioned
  activation), freed when it ends: the ZeRO-3 / FSDP discipline of gathering a
  shard per use.

The figure is for the busiest machine, assuming every machine holds an equal share
(whole values count on every machine that may hold them). ``replicated=True``
counts every graph input and output whole on each machine, as data parallelism
keeps a full replica of parameters, gradients and optimizer state.

Example: a 1 GiB weight split 4 ways across machines counts 256 MiB on each; its
gathered copy counts 1 GiB on each machine, only while its reader runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from einsummable.ir.graph import ComplexView, EinGraph, Fill, Formation, InputNode, Reshape
from einsummable.plan.space import Space, nbytes

Counts = Sequence[int]


@dataclass(frozen=True)
class Memory:
    """The busiest machine's peak, in bytes, and what it is made of at that moment."""

    peak: float
    inputs: float  # graph inputs: parameters, optimizer state, data
    outputs: float  # graph outputs made so far: gradients, new state, loss
    activations: float  # intermediate values still to be read
    transient: float  # operand copies gathered for the node running at the peak
    at: int  # the node running at the peak

    def describe(self) -> str:
        return (f"{gib(self.peak)} GiB = inputs {gib(self.inputs)} + outputs {gib(self.outputs)}"
                f" + activations {gib(self.activations)} + transient {gib(self.transient)}"
                f" (at node %{self.at})")


def gib(n: float) -> str:
    """Bytes in GiB to three significant digits, never in exponent form: 0.0107, 27.3, 532."""
    return np.format_float_positional(n / 2**30, precision=3, fractional=False, trim="-")


def holds_nothing(g: EinGraph, sps: Sequence[Space], v: int) -> bool:
    """Views and fills: no bytes of their own."""
    node = g.nodes[v]
    if isinstance(node, Reshape | ComplexView | Fill):
        return True
    return isinstance(node, Formation) and not sps[node.inputs[0]].aggregated


def shares(g: EinGraph, sps: Sequence[Space], cm: Sequence[Counts]) -> np.ndarray:
    """Bytes of each node's output on one machine that holds a block of it."""
    out = np.zeros(len(g.nodes))
    for v, (node, sp) in enumerate(zip(g.nodes, sps, strict=True)):
        if not holds_nothing(g, sps, v):
            out[v] = nbytes(node) / math.prod(cm[v][d] for d in sp.out_dims)
    return out


def transient(g: EinGraph, sps: Sequence[Space], cm: Sequence[Counts], v: int) -> float:
    """Operand pieces node v needs on one machine that its producers lay out differently."""
    total = 0.0
    sp = sps[v]
    seen: set[int] = set()
    for k, u in enumerate(g.nodes[v].inputs):
        if u in seen or isinstance(g.nodes[u], Fill) or k >= len(sp.operands):
            continue
        seen.add(u)
        need = tuple(cm[v][d] if d is not None else 1 for d in sp.operands[k])
        have = tuple(cm[u][d] for d in sps[u].out_dims)
        if need != have:
            total += nbytes(g.nodes[u]) / math.prod(need)
    return total


def estimate(g: EinGraph, sps: Sequence[Space], cm: Sequence[Counts], live: Sequence[bool],
             replicated: bool = False) -> Memory:
    """The peak of one machine holding an equal share of every node laid out by ``cm``."""
    size = shares(g, sps, cm)
    if replicated:
        whole = np.array([float(nbytes(node)) for node in g.nodes])
        state = _inputs(g) | _outputs(g)
        size = np.where(state & (size > 0), whole, size)
    extra = np.array([transient(g, sps, cm, v) if live[v] and not isinstance(g.nodes[v], InputNode) else 0.0
                      for v in range(len(g.nodes))])
    return peak(g, sps, live, size[:, None], extra[:, None])


def peak(g: EinGraph, sps: Sequence[Space], live: Sequence[bool], size: np.ndarray,
         extra: np.ndarray) -> Memory:
    """The busiest machine's peak, given [nodes, machines] bytes held and transient per node."""
    n = len(g.nodes)
    if not n:
        return Memory(0.0, 0.0, 0.0, 0.0, 0.0, 0)
    is_input, is_output = _inputs(g), _outputs(g)
    start, end = _spans(g, sps, live)
    size = np.where(np.array(live)[:, None], size, 0.0)
    delta = np.zeros((n + 1, size.shape[1]))
    np.add.at(delta, start, size)
    np.add.at(delta, end + 1, -size)
    total = np.cumsum(delta, axis=0)[:n] + extra
    t, m = np.unravel_index(int(np.argmax(total)), total.shape)
    alive = (start <= t) & (end >= t)
    col = size[:, m]
    return Memory(
        peak=float(total[t, m]),
        inputs=float(col[alive & is_input].sum()),
        outputs=float(col[alive & is_output & ~is_input].sum()),
        activations=float(col[alive & ~is_input & ~is_output].sum()),
        transient=float(extra[t, m]),
        at=int(t),
    )


def _inputs(g: EinGraph) -> np.ndarray:
    return np.array([isinstance(node, InputNode) for node in g.nodes], dtype=bool)


def _outputs(g: EinGraph) -> np.ndarray:
    out = np.zeros(len(g.nodes), dtype=bool)
    out[list(g.outputs.values())] = True
    return out


def _spans(g: EinGraph, sps: Sequence[Space], live: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    """First and last node during which each node's output is held."""
    n = len(g.nodes)
    is_input, is_output = _inputs(g), _outputs(g)
    start = np.arange(n)
    end = np.arange(n)
    for v, node in enumerate(g.nodes):
        if live[v]:
            for u in node.inputs:
                end[u] = max(end[u], v)
    end[is_output] = n - 1
    # a view keeps its source alive for as long as the view is read
    for v in reversed(range(n)):
        if live[v] and holds_nothing(g, sps, v):
            for u in g.nodes[v].inputs:
                end[u] = max(end[u], end[v])
    start[is_input] = 0
    end[is_input] = n - 1
    return start, end


def lifetimes(g: EinGraph, sps: Sequence[Space], live: Sequence[bool]) -> np.ndarray:
    """Each node's share of the step it is held (1.0: all of it), for the planner's penalty."""
    start, end = _spans(g, sps, live)
    return (end - start + 1) / max(len(g.nodes), 1)
