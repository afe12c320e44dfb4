"""A native task loop: runs of a worker's compiled joins called from C, one ctypes call a run.

Each task the local engine runs through Python costs ~12-27 us of dispatch under the GIL
(the dependency loop, the kernel's wrapper, its ctypes call). Most tasks of a small step
are joins whose kernel is a generated C function (``native``, ``ccodegen``), all of one
signature ``f(in_, n, s, vars, out_)``; those a worker runs one after another need no
Python between them.

**Cutting** (``cut``, at prepare). The segments are the native runs of lower/runs.py, the
stretches the simulator prices as this loop runs them, of the tasks whose prepared kernel is
the C function alone (``fast.prepare(op).compiled``: no cast after it, no wider op, its build
did not fail) and that the engine lets in (``eligible``: not a block stored to host storage).

**Running** (``Segment``). The segment is one node of the dependency loop. Its record
table (function pointer, operand and output places, sizes, strides, variables, task id)
is built at prepare; a run fills in the addresses of the segment's external inputs and
of its exported outputs (the blocks read outside it, or kept as program outputs: each a
fresh block, as a kernel's output is today, so freeing stays per block), allocates one
arena for the blocks used only inside it, and makes one ctypes call (the GIL released)
that loops over the records in C. Inside blocks are C-contiguous, so their strides are
known at prepare; the arena reuses the place of a block after its last reader in the
segment, as freeing after the last reader does elsewhere. An external input is read where
it lies: a non-contiguous one (a move's view) has its strides written into a copy of the
stride table for that run. Run-time variables go in as the ``vars`` table.

Its value holds its exported blocks (``Exported``); a node reading one takes it by position
(``Plan.picks``), and each is let go after its last reader has. A traced run (``trace=``)
passes a times table: the C loop writes each task's start and end from the same clock as
``time.perf_counter`` (CLOCK_MONOTONIC), so
the trace keeps one event per task. ``EINSUMMABLE_KERNELS=numpy`` or a failed build
leaves no native task, so no segment: every task runs as before.

    plan = cut(tasks, keep, eligible)          # at prepare
    plan.nodes, plan.inputs, plan.picks         # the dependency loop's graph
"""

from __future__ import annotations

import bisect
import ctypes
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from einsummable.engines.kernels import aligned, cbuild, native
from einsummable.engines.kernels import fast as kernels
from einsummable.ir.dtypes import to_numpy
from einsummable.lower import runs
from einsummable.lower.taskgraph import ApplyTask

MAX_OPERANDS = runs.MAX_OPERANDS
LINE = aligned.LINE
# a record's fields, in the table's columns
FN, OPS, NIN, OUT, SIZES, STRIDES, VARS, TASK = range(8)
WIDTH = 8

_LOOP_C = f"""#include <time.h>
typedef void (*einsummable_kernel)(char **, const int64_t *, const int64_t *, const double *, char *);
static double einsummable_now(void) {{
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}}
/* a place >= 0 is a byte offset into the arena; -1 - k is slots[k] */
void einsummable_segment_loop(const int64_t *rec, int64_t count, const int64_t *ops, const int64_t *sizes,
                              const int64_t *strides, const double *vars, char **slots, char *arena,
                              double *times) {{
  char *in[{MAX_OPERANDS}];
  for (int64_t r = 0; r < count; r++, rec += {WIDTH}) {{
    const int64_t *o = ops + rec[{OPS}];
    for (int64_t k = 0; k < rec[{NIN}]; k++) in[k] = o[k] >= 0 ? arena + o[k] : slots[-1 - o[k]];
    char *out = rec[{OUT}] >= 0 ? arena + rec[{OUT}] : slots[-1 - rec[{OUT}]];
    double *at = times ? times + 2 * rec[{TASK}] : 0;
    if (at) at[0] = einsummable_now();
    ((einsummable_kernel)(intptr_t)rec[{FN}])(in, sizes + rec[{SIZES}], strides + rec[{STRIDES}],
                                             vars + rec[{VARS}], out);
    if (at) at[1] = einsummable_now();
  }}
}}
"""
_LOOP = cbuild.Source("einsummable_segment_loop", _LOOP_C, (), (), False)
_PTR = ctypes.c_void_p


def _loop() -> ctypes._CFuncPtr | None:
    """The C loop, built once (cached on disk like every kernel); None where C is off."""
    fn = cbuild.function(_LOOP) if cbuild.enabled() else None
    if fn is not None and fn.argtypes is None:
        fn.argtypes = [_PTR, ctypes.c_int64, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR]
    return fn


def compiled(task: ApplyTask) -> native._Compiled | None:
    """The C join that alone computes ``task``, built; None if it has none."""
    body = getattr(kernels.prepare(task.op), "compiled", None)
    return body if body is not None and body.get() is not None else None


@dataclass(frozen=True)
class Plan:
    """The dependency loop's graph over nodes: a task alone (its id) or a ``Segment``.

    ``node_of[t]``: the node computing task t; ``pick[t]``: t's position in its segment's
    value (None for a task alone). ``inputs[i]`` / ``picks[i]``: node i's input nodes and
    the position of each input block in that node's value (None: the value itself)."""

    nodes: tuple[int | Segment, ...]
    node_of: tuple[int, ...]
    pick: tuple[int | None, ...]
    inputs: tuple[tuple[int, ...], ...]
    picks: tuple[tuple[int | None, ...] | None, ...]  # None: no input is a segment's

    @property
    def segments(self) -> list[Segment]:
        return [n for n in self.nodes if isinstance(n, Segment)]


def cut(tasks: Sequence, keep: set[int], eligible: Callable[[int], bool]) -> Plan | None:
    """Segments of the native runs (lower/runs.py) of the ``eligible`` tasks whose C join built;
    None where there are none (the C loop is off, or nothing qualifies)."""
    loop = _loop()
    if loop is None:
        return None
    n = len(tasks)
    joins: dict[int, native._Compiled] = {}
    for t, task in enumerate(tasks):
        if eligible(t) and runs.candidate(task) and (fn := compiled(task)) is not None:
            joins[t] = fn
    groups = runs.runs(tasks, joins.__contains__)
    if not groups:
        return None
    seg_of = [-1] * n
    for g, members in enumerate(groups):
        for t in members:
            seg_of[t] = g
    exported: list[set[int]] = [set() for _ in groups]
    for u, task in enumerate(tasks):
        for i in task.inputs:
            if seg_of[i] >= 0 and seg_of[i] != seg_of[u]:
                exported[seg_of[i]].add(i)
    for t in keep:
        if seg_of[t] >= 0:
            exported[seg_of[t]].add(t)
    nodes: list[int | Segment] = []
    node_of, pick = [-1] * n, [None] * n
    for t in range(n):
        g = seg_of[t]
        if g < 0:
            node_of[t] = len(nodes)
            nodes.append(t)
        elif groups[g][0] == t:
            seg = Segment(loop, tasks, groups[g], exported[g], joins)
            for k, e in enumerate(seg.exported):
                pick[e] = k
            for m in groups[g]:
                node_of[m] = len(nodes)
            nodes.append(seg)
    inputs, picks = [], []
    for node in nodes:
        reads = node.external if isinstance(node, Segment) else tasks[node].inputs
        inputs.append(tuple(node_of[i] for i in reads))
        chosen = tuple(pick[i] for i in reads)
        picks.append(chosen if any(p is not None for p in chosen) else None)
        for i in reads:
            if pick[i] is not None:
                nodes[node_of[i]].readers[pick[i]] += 1
    for t in keep:
        if pick[t] is not None:
            nodes[node_of[t]].readers[pick[t]] += 1  # taken by no node: held to the run's end
    return Plan(tuple(nodes), tuple(node_of), tuple(pick), tuple(inputs), tuple(picks))


class _Arena:
    """First-fit places for the blocks used only inside a segment, reused after their last
    reader; free places kept sorted by offset and merged with their neighbours."""

    def __init__(self) -> None:
        self.free: list[list[int]] = []  # [offset, size]
        self.top = 0

    def take(self, size: int) -> int:
        size = -(-max(size, 1) // LINE) * LINE
        for k, (at, room) in enumerate(self.free):
            if room >= size:
                if room == size:
                    del self.free[k]
                else:
                    self.free[k] = [at + size, room - size]
                return at
        at, self.top = self.top, self.top + size
        return at

    def give(self, at: int, size: int) -> None:
        size = -(-max(size, 1) // LINE) * LINE
        k = bisect.bisect(self.free, [at, size])
        self.free.insert(k, [at, size])
        if k + 1 < len(self.free) and at + size == self.free[k + 1][0]:
            self.free[k][1] += self.free.pop(k + 1)[1]
        if k > 0 and self.free[k - 1][0] + self.free[k - 1][1] == at:
            self.free[k - 1][1] += self.free.pop(k)[1]


def _nbytes(task: ApplyTask) -> int:
    return math.prod(task.shape) * to_numpy(task.dtype).itemsize


class Segment:
    """One worker's run of native tasks, run by one call of the C loop."""

    def __init__(self, loop: ctypes._CFuncPtr, tasks: Sequence, members: list[int], exported: set[int],
                 joins: dict[int, native._Compiled]) -> None:
        self.loop, self.tasks = loop, tuple(members)
        inside = set(members)
        self.exported = tuple(t for t in members if t in exported)
        self.readers = [0] * len(self.exported)  # the takes of each exported block a run (cut counts)
        external: dict[int, int] = {}  # task -> its slot
        for t in members:
            for i in tasks[t].inputs:
                if i not in inside and i not in external:
                    external[i] = len(external)
        self.external = tuple(external)
        slot_of = external | {t: len(external) + k for k, t in enumerate(self.exported)}
        # what each external input must be for the C side: its dtype and shape as its kernels read it
        self.wanted: list[native.Operand] = []
        last = {i: t for t in members for i in tasks[t].inputs if i in inside}
        arena, place = _Arena(), {}
        records, ops, sizes, strides = [], [], [], []
        size_at: dict[tuple[int, ...], int] = {}
        var_at: dict[tuple[str, ...], int] = {}
        self.variables: list[str] = []
        self.uses: list[list[tuple[int, tuple[int, ...]]]] = [[] for _ in external]  # per slot
        for t in members:
            task, fn = tasks[t], joins[t]
            op, rank = task.op, task.op.rank
            at_ops, at_strides = len(ops), len(strides)
            strides.extend([0] * max(1, rank * len(task.inputs)))
            for k, (i, idx) in enumerate(zip(task.inputs, op.inputs, strict=True)):
                dtype, shape = to_numpy(op.dtypes[k]), tuple(op.join_shape[d] for d in idx)
                if i in inside:  # in the arena, or exported (and read here too): its slot
                    ops.append(place[i] if i in place else -1 - slot_of[i])
                else:
                    slot = external[i]
                    if slot == len(self.wanted):  # (the cut made every reader read it alike)
                        self.wanted.append((dtype, shape, lambda k=k, op=op: f"operand {k} of {op.spec}"))
                    ops.append(-1 - slot)
                    self.uses[slot].append((at_strides + k * rank, idx))
                for pos, d in enumerate(idx):
                    strides[at_strides + k * rank + d] = _contiguous(shape)[pos]
            if t in slot_of:
                out = -1 - slot_of[t]
            else:
                out = place[t] = arena.take(_nbytes(task))
            for i in set(task.inputs):
                if last.get(i) == t and i in place:
                    arena.give(place.pop(i), _nbytes(tasks[i]))
            if t not in slot_of and t not in last:  # read by nothing: its place is free again
                arena.give(place.pop(t), _nbytes(task))
            if op.join_shape not in size_at:
                size_at[op.join_shape] = len(sizes)
                sizes.extend(op.join_shape or (0,))
            names = fn.src.variables
            if names not in var_at:
                var_at[names] = len(self.variables)
                self.variables.extend(names)
            records.append((ctypes.cast(fn.get(), _PTR).value, at_ops, len(task.inputs), out,
                            size_at[op.join_shape], at_strides, var_at[names], t))
        self.records = np.array(records, dtype=np.int64).reshape(-1, WIDTH)
        self.ops = np.array(ops or [0], dtype=np.int64)
        self.sizes = np.array(sizes or [0], dtype=np.int64)
        self.strides = np.array(strides or [0], dtype=np.int64)
        self.arena_bytes = arena.top
        self.outputs = [(tasks[t].shape, to_numpy(tasks[t].dtype)) for t in self.exported]
        self.contiguous = [_byte_strides(shape, dtype) for dtype, shape, _ in self.wanted]
        self.slots = _PTR * max(1, len(slot_of))
        self.no_variables = (ctypes.c_double * 1)()
        self.table = (self.records.ctypes.data, len(self.records), self.ops.ctypes.data,
                      self.sizes.ctypes.data)

    def describe(self, tasks: Sequence) -> str:
        return (f"{tasks[self.tasks[0]].describe()}, the first of {len(self.tasks)} tasks "
                f"run natively (tasks {self.tasks[0]}..{self.tasks[-1]})")

    def __call__(self, arrays: list, variables: dict | None, times: np.ndarray | None = None) -> tuple:
        """Run the segment on its external inputs' blocks (in ``external``'s order); returns its
        exported blocks (in ``exported``'s order). ``times``: each task's start and end, written."""
        arrays = native.operands(arrays, self.wanted)
        strides = self.strides
        for slot, (a, want) in enumerate(zip(arrays, self.contiguous, strict=True)):
            if a.strides != want and self.uses[slot]:
                if strides is self.strides:
                    strides = self.strides.copy()
                item = a.itemsize
                for at, idx in self.uses[slot]:
                    for pos, d in enumerate(idx):
                        strides[at + d] = a.strides[pos] // item
        pointers = [aligned.address(a) for a in arrays]
        outputs = []
        for shape, dtype in self.outputs:
            out, at = aligned.empty(shape, dtype)
            outputs.append(out)
            pointers.append(at)
        arena = np.empty(self.arena_bytes + LINE, dtype=np.uint8)
        base = aligned.address(arena)
        base += -base % LINE
        if self.variables:
            values = (ctypes.c_double * len(self.variables))(*[native._variable(n, variables)
                                                                 for n in self.variables])
        else:
            values = self.no_variables
        records, count, ops, sizes = self.table
        self.loop(records, count, ops, sizes, strides.ctypes.data, values, self.slots(*pointers), base,
                  None if times is None else times.ctypes.data)
        return Exported(outputs, list(self.readers))


class Exported:
    """A segment's exported blocks of one run, each let go after its last reader takes it, as a
    task's block is freed after its last reader (held as one value, the segment's blocks would be
    freed together, after the last reader of any: 1.34x the estimated peak of a momentum step)."""

    __slots__ = ("blocks", "left", "lock")

    def __init__(self, blocks: list[np.ndarray], left: list[int]) -> None:
        self.blocks, self.left, self.lock = blocks, left, threading.Lock()

    def take(self, k: int) -> np.ndarray:
        """Block k, for one of its readers."""
        with self.lock:
            block = self.blocks[k]
            self.left[k] -= 1
            if self.left[k] == 0:
                self.blocks[k] = None
        return block

    def __getitem__(self, k: int) -> np.ndarray:
        return self.blocks[k]

    def __len__(self) -> int:
        return len(self.blocks)


def _contiguous(shape: tuple[int, ...]) -> list[int]:
    """A C-contiguous block's strides, in elements."""
    out, step = [0] * len(shape), 1
    for pos in reversed(range(len(shape))):
        out[pos] = step
        step *= shape[pos]
    return out


def _byte_strides(shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, ...]:
    """The strides numpy gives a fresh C-contiguous array of ``shape``."""
    return tuple(s * dtype.itemsize for s in _contiguous(shape))
