"""Row reductions fused with the one elementwise join that reads them: one pass per row.

Softmax backward sums ``y * dy`` per row, then writes ``y * (dy - t)``; rmsnorm sums
``h * h / n`` per row, then writes ``h * rsqrt(ms + eps) * w``. Run apart, each block
(1 MB) is read twice from L3. Where a reduction R's block is read by one task only, an
elementwise join J on the same worker that reads it broadcast along R's reduced dims
(J's leading dims are R's kept dims), the local engine runs both as one generated C
function (engines/crows.py): per row, R's reduction into a register, then J's body over
the row while it is still in L1. Softmax backward on a 1024 x 256 f32 block: 0.056 ms
against 0.078 for the two kernels apart and 0.113 for the numpy path (join_kernels.py;
torch 0.045); the kernel itself runs as fast as torch's, the rest is the call from Python.

As with GEMM epilogues (epilogue.py) the TaskGraph keeps both tasks; only the local
engine's dependency lists change: J's task reads R's inputs, then those of its own
operands R does not read, and R's task reads nothing and yields nothing. The fused step
gives the bits the two tasks give apart. Without compiled kernels (``EINSUMMABLE_KERNELS
=numpy``, no compiler) nothing fuses; a build that fails at run time runs R's and J's
own kernels, one after the other.

    rows = pairs(tg.tasks, keep)          # {join task: (reduction task, its operand position)}
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence

import numpy as np

from einsummable.engines import aligned, cbuild, crows, epilogue, kernels, native
from einsummable.engines.reference_kernel import kept_wide
from einsummable.ir.dtypes import to_numpy
from einsummable.ir.einsummable import Einsummable
from einsummable.lower.taskgraph import ApplyTask


def pairs(tasks: Sequence, keep: set[int]) -> dict[int, tuple[int, int]]:
    """Each join task that runs a row reduction's task with it: ``{join: (reduction, operand)}``.

    The reduction then waits for the join's other operands too; so, as for epilogues, a
    join that reads a move (another worker's block, at its pace) stays apart. Of several
    reductions a join reads, the last in task order is taken.
    """
    if not cbuild.enabled() or cbuild.compiler() is None:
        return {}
    readers = epilogue.reader_counts(tasks)
    out: dict[int, tuple[int, int]] = {}
    for j, join in epilogue.local_joins(tasks):
        for k in reversed(range(len(join.inputs))):
            r = join.inputs[k]
            red = tasks[r]
            if (isinstance(red, ApplyTask) and red.loc == join.loc and readers[r] == 1 and r not in keep
                    and (j not in out or r > out[j][0]) and source(red.op, join.op, k) is not None):
                out[j] = (r, k)
    return out


def source(red: Einsummable, join: Einsummable, k: int) -> cbuild.Source | None:
    """The fused function where ``join`` reads ``red``'s block as operand ``k`` a row at a time,
    both have a C form and compiled kernels are on; None otherwise (they run apart).

    R keeps dims 0..p-1 and walks them outermost (its largest operand stores them first:
    crows checks); J's leading dims are those and its operand ``k`` indexes them alone. f16
    stays on numpy, as ``kernels._native`` keeps it; GEMMs and gathers keep their kernels."""
    p = red.out_rank
    wide = kept_wide(red) or red
    if not (cbuild.enabled() and red.agg is not None and join.agg is None and 0 < p < red.rank
            and join.inputs[k] == tuple(range(p)) and join.rank > p
            and join.join_shape[:p] == red.out_shape and join.dtypes[k] == red.dtype
            and "f16" not in (*wide.dtypes, wide.dtype, *join.dtypes, join.dtype)
            and not kernels.is_gemm(red) and kernels.equality_gather(red) is None
            and (red.agg in ("add", "mul") or math.prod(red.join_shape[p:]) > 0)):
        return None
    return crows.generate(wide, join, k, red.dtype)


def rewire(inputs: list[tuple[int, ...]], rows: dict[int, tuple[int, int]]) -> list[tuple[int, ...]]:
    """The dependency lists with each join reading its reduction's inputs, then those of its
    own other operands that the reduction does not read (a block R and J share comes once)."""
    inputs = list(inputs)
    for j, (r, k) in rows.items():
        inputs[j] = shared(inputs[r], inputs[j], k)
        inputs[r] = ()
    return inputs


def shared(red_inputs: Sequence, join_inputs: Sequence, k: int) -> tuple:
    """What the fused step reads: R's operands, then J's others, each block once."""
    out: list = []
    for name in [*red_inputs, *join_inputs[:k], *join_inputs[k + 1 :]]:
        if name not in out:
            out.append(name)
    return tuple(out)


class Fused(native.Function):
    """The fused task's step: ``shared(R's inputs, J's inputs, k)`` in, J's block out."""

    def __init__(self, red: Einsummable, join: Einsummable, k: int, red_inputs: Sequence,
                 join_inputs: Sequence) -> None:
        src = source(red, join, k)
        assert src is not None, "pairs() fuses only where source() has a function"
        native.register(src)
        super().__init__(src)
        self.red, self.join, self.k = red, join, k
        names = shared(red_inputs, join_inputs, k)
        # each operand of R, then of J (R's block: -1), as an index into the step's arguments
        self.slots = [names.index(n) for n in red_inputs] + \
            [-1 if m == k else names.index(n) for m, n in enumerate(join_inputs)]
        self.red_slots, self.join_slots = self.slots[: len(red_inputs)], self.slots[len(red_inputs) :]
        first = {}  # each argument as the first operand that reads it sees it
        for op, slots in ((red, self.red_slots), (join, self.join_slots)):
            for m, at in enumerate(slots):
                if at >= 0 and at not in first:
                    first[at] = (to_numpy(op.dtypes[m]), tuple(op.join_shape[i] for i in op.inputs[m]),
                                 lambda m=m, op=op: f"operand {m} of {op.spec}")
        self.operands = [first[at] for at in range(len(names))]
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
        run_red, run_join = kernels.prepare(self.red), kernels.prepare(self.join)  # only now: not built else
        block = run_red([args[at] for at in self.red_slots], variables)
        return run_join([args[at] if at >= 0 else block for at in self.join_slots], variables)


def step(red: Einsummable, join: Einsummable, k: int, red_inputs: Sequence, join_inputs: Sequence) -> Fused:
    """The fused task (``pairs`` found it): R's reduction and J's join, a row at a time.
    ``red_inputs`` and ``join_inputs`` name their operands (task ids), so a block both
    read is handed over once (``shared``)."""
    return Fused(red, join, k, red_inputs, join_inputs)
