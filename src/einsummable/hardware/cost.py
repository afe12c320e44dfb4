"""What a block op's kernel costs on a Cluster, by its kind (ir/kinds.py): the one price the
planner's figures (plan/predict/summary.py) and the simulator (engines/simulator/simulate.py) both charge.

- ``gemm``: its flops at ``flops_per_core`` and its output written at ``copy_bandwidth``, both
  spread over ``blas_threads`` cores (a lone worker's BLAS has them all);
- ``gather``: its comparisons (the compared operands' dims) and its output elements at
  ``elementwise_flops_per_core``, plus the output written;
- ``view``: nothing (an engine hands back a view);
- any other: its passes over the join space (``Einsummable.passes``, a compiled join's further
  nodes at ``elementwise_node_cost`` of a pass) at ``elementwise_flops_per_core``, plus the
  output written.

A fused task (lower/fusion.py) costs its two kernels; its intermediate block is not written
out, so the first kernel's write is not charged.

    seconds(op, cluster)            # one worker's kernel time, no per-task overhead
"""

from __future__ import annotations

import math

from einsummable.hardware.cluster import Cluster
from einsummable.ir import kinds
from einsummable.ir.dtypes import itemsize
from einsummable.ir.einsummable import Einsummable


def seconds(op: Einsummable, c: Cluster, written: bool = True) -> float:
    """One worker's time for the kernel of ``op``, without the per-task overhead; ``written``:
    whether its block goes to memory (False: it stays in cache for a fused reader)."""
    kind = kinds.kind(op)
    if kind == kinds.VIEW:
        return 0.0
    write = math.prod(op.out_shape) * itemsize(op.dtype) / c.copy_bandwidth if written else 0.0
    if kind == kinds.GEMM:
        return (op.flops() / c.flops_per_core + write) / c.blas_threads
    if kind == kinds.GATHER:
        a, b, _ = kinds.equality_gather(op)
        compares = math.prod(op.join_shape[i] for i in set(op.inputs[a]) | set(op.inputs[b]))
        return (compares + math.prod(op.out_shape)) / c.elementwise_flops_per_core + write
    return op.passes(c.elementwise_node_cost) / c.elementwise_flops_per_core + write


def fused_seconds(first: Einsummable, then: Einsummable, c: Cluster) -> float:
    """A fused task's kernels: ``first``'s block is read by ``then`` in cache, never written out."""
    return seconds(first, c, written=False) + seconds(then, c)
