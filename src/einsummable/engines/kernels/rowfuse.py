"""Row reductions fused with their join: how the local engine runs a fused row task
(lower/fusion.py's rows rule), one pass per row.

Softmax backward sums ``y * dy`` per row, then writes ``y * (dy - t)``; rmsnorm sums
``h * h / n`` per row, then writes ``h * rsqrt(ms + eps) * w``. Run apart, each block
(1 MB) is read twice from L3. Fused, R and J run as one generated C function
(engines/kernels/crows.py): per row, R's reduction into a register, then J's body over the row
while it is still in L1. Softmax backward on a 1024 x 256 f32 block: 0.056 ms against
0.078 for the two kernels apart and 0.113 for the numpy path (join_kernels.py; torch
0.045); the kernel itself runs as fast as torch's, the rest is the call from Python.

The fused step gives the bits the two tasks give apart. Without compiled kernels
(``EINSUMMABLE_KERNELS=numpy``, no compiler), for f16 (kept on numpy, as
``kernels._native`` keeps it) or where a half has no C form, R's and J's own kernels run
one after the other in the task, as they do where a build fails at run time.

    step(task)                                  # a FusedTask's step
"""

from __future__ import annotations

import ctypes

import numpy as np

from einsummable.engines.kernels import aligned, cbuild, crows, native
from einsummable.engines.kernels import fast as kernels
from einsummable.engines.kernels.reference import kept_wide
from einsummable.ir import kinds
from einsummable.ir.dtypes import to_numpy
from einsummable.ir.einsummable import Einsummable
from einsummable.lower.taskgraph import FusedTask


def source(red: Einsummable, join: Einsummable, k: int) -> cbuild.Source | None:
    """The fused function where ``join`` reads ``red``'s block as operand ``k`` a row at a time
    (``kinds.row_pair``), both have a C form and compiled kernels are on; None otherwise (they
    run apart). R keeps dims 0..p-1 and walks them outermost (its largest operand stores them
    first: crows checks)."""
    wide = kept_wide(red) or red
    if not (cbuild.enabled() and cbuild.compiler() is not None and kinds.row_pair(red, join, k)
            and "f16" not in (*wide.dtypes, wide.dtype, *join.dtypes, join.dtype)):
        return None
    return crows.generate(wide, join, k, red.dtype)


class Fused(native.Function):
    """The fused task's step: its inputs in, J's block out."""

    def __init__(self, task: FusedTask, src: cbuild.Source) -> None:
        native.register(src)
        super().__init__(src)
        self.task, self.red, self.join = task, task.first, task.then
        red, join = self.red, self.join
        self.slots = task.slots  # each operand of R, then of J (R's block: -1), as an argument index
        self.red_slots, self.join_slots = task.first_slots, task.then_slots
        first = {}  # each argument as the first operand that reads it sees it
        for op, ats in ((red, self.red_slots), (join, self.join_slots)):
            for m, at in enumerate(ats):
                if at >= 0 and at not in first:
                    first[at] = (to_numpy(op.dtypes[m]), tuple(op.join_shape[i] for i in op.inputs[m]),
                                 lambda m=m, op=op: f"operand {m} of {op.spec}")
        self.operands = [first[at] for at in range(len(first))]
        self.sizes = (ctypes.c_int64 * (red.rank + join.rank))(*red.join_shape, *join.join_shape)
        self.n_strides = len(red.inputs) * red.rank + len(join.inputs) * join.rank
        self.strides: dict[tuple, ctypes.Array] = {}
        self.pointers = ctypes.c_void_p * len(self.slots)
        self.dtype = to_numpy(join.dtype)

    def __call__(self, args: list, feeds: dict, variables: dict | None) -> np.ndarray:
        fn = self.fn if self.fn is not None else self.get()
        if fn is None:  # the build failed: the two kernels
            return self._apart(args, variables)
        arrays = native.operands(args, self.operands)
        key = tuple([a.strides for a in arrays])
        strides = self.strides.get(key)
        if strides is None:
            strides = self.strides[key] = (ctypes.c_int64 * self.n_strides)()
            native.write_strides(strides, 0, [arrays[at] for at in self.red_slots], self.red)
            native.write_strides(strides, len(self.red_slots) * self.red.rank,
                                 [arrays[at] if at >= 0 else None for at in self.join_slots], self.join)
        address = [aligned.address(a) for a in arrays]
        pointers = self.pointers(*[address[at] if at >= 0 else 0 for at in self.slots])
        return self.call(fn, pointers, self.sizes, strides, variables, self.join.out_shape, self.dtype)

    def _apart(self, args: list, variables: dict | None) -> np.ndarray:
        return apart(self.task)(args, {}, variables)  # its kernels built only now: not else


def apart(task: FusedTask):
    """A fused task's two kernels, one after the other (no fused function for the pair)."""
    run_first, run_then = kernels.prepare(task.first), kernels.prepare(task.then)

    def run(args, feeds, variables):
        return run_then(task.then_operands(args, run_first(task.first_operands(args), variables)), variables)

    return run


def step(task: FusedTask):
    """The fused row task: R's reduction and J's join a row at a time, in one C function where
    the pair has one (``source``), else R's and J's kernels one after the other."""
    src = source(task.first, task.then, task.k)
    return apart(task) if src is None else Fused(task, src)
