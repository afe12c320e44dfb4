"""A native task loop: runs of a worker's compiled joins called from C, one ctypes call a run.

Each task the local engine runs through Python costs ~12-27 us of dispatch under the GIL
(the dependency loop, the kernel's wrapper, its ctypes call). Most tasks of a small step
are joins whose kernel is a generated C function (``native``, ``ccodegen``), all of one
signature ``f(in_, n, s, vars, out_)``; those a worker runs one after another need no
Python between them.

**Cutting** (``cut``, at prepare, one pass over the tasks in id order, which is
topological). A task is *native* when it is an ApplyTask whose prepared kernel is the C
function alone (``fast.prepare(op).compiled``: no cast after it, no wider op, its build
did not fail) and it writes in place into nothing (not a donor, not a block stored to
host storage). Per worker, a native task joins the worker's open segment when each of
its inputs is a task of the segment (of the dtype and shape the kernel reads) or has an
id below the segment's first task; else it opens a new one. A task that is not native
closes its worker's segment. So a segment depends only on tasks before its first, and
whatever reads a segment's task comes after that first: with the segment as one node
placed at its first task's id, the node graph stays in topological order and acyclic.
Segments of fewer than ``MIN_TASKS`` tasks stay as they were.

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

Its value is the tuple of its exported blocks; a node reading one picks it by position
(``Plan.picks``). A traced run (``trace=``) passes a times table: the C loop writes each
task's start and end from the same clock as ``time.perf_counter`` (CLOCK_MONOTONIC), so
the trace keeps one event per task. ``EINSUMMABLE_KERNELS=numpy`` or a failed build
leaves no native task, so no segment: every task runs as before.

    plan = cut(tasks, steps, eligible)         # at prepare
    plan.nodes, plan.inputs, plan.picks         # the dependency loop's graph
"""

from __future__ import annotations

import bisect
import ctypes
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from einsummable.engines.kernels import aligned, cbuild, native
from einsummable.engines.kernels import fast as kernels
from einsummable.ir.dtypes import to_numpy
from einsummable.lower.taskgraph import ApplyTask

MIN_TASKS = 2  # a lone native task costs the same through its own ctypes call
MAX_OPERANDS = 64
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


def compiled(task: object) -> native._Compiled | None:
    """The C join that alone computes ``task``, built; None if it has none."""
    if not isinstance(task, ApplyTask) or len(task.inputs) > MAX_OPERANDS:
        return None
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
    """Segments of each worker's consecutive native tasks (see the module docstring); None
    where there are none (the C loop is off, or nothing qualifies)."""
    loop = _loop()
    if loop is None:
        return None
    n = len(tasks)
    seg_of: list[int] = [-1] * n
    groups: list[list[int]] = []
    open_: dict[int, int] = {}  # worker -> its open group
    joins: dict[int, native._Compiled] = {}
    reads: list[dict[int, tuple]] = []  # per group: each external input's dtype and shape as read
    for t, task in enumerate(tasks):
        w = task.loc
        fn = compiled(task) if eligible(t) else None
        g = open_.pop(w, None)
        if fn is None:
            continue
        joins[t] = fn
        if g is None or not all(_fits(tasks, seg_of, g, groups[g][0], t, k, reads[g])
                                for k in range(len(task.inputs))):
            g = len(groups)
            groups.append([])
            reads.append({})
        groups[g].append(t)
        for k, i in enumerate(task.inputs):
            if seg_of[i] != g:
                reads[g][i] = _read_as(task.op, k)
        seg_of[t] = g
        open_[w] = g
    for g, members in enumerate(groups):
        if len(members) < MIN_TASKS:
            for t in members:
                seg_of[t] = -1
            groups[g] = []
    if not any(groups):
        return None
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
    return Plan(tuple(nodes), tuple(node_of), tuple(pick), tuple(inputs), tuple(picks))


def _fits(tasks: Sequence, seg_of: list[int], g: int, first: int, t: int, k: int, reads: dict) -> bool:
    """Whether operand k of task t may be read in group g: from before its first task, as
    the group's other kernels read that block (it is made ready once, at entry), or from a
    task of it of the dtype and shape the kernel reads (an arena block is its kernel's
    output as it lies)."""
    i, op = tasks[t].inputs[k], tasks[t].op
    if i < first:
        return reads.get(i, _read_as(op, k)) == _read_as(op, k)
    src = tasks[i]
    return seg_of[i] == g and (src.dtype, tuple(src.shape)) == _read_as(op, k)


def _read_as(op, k: int) -> tuple[str, tuple[int, ...]]:
    """The dtype and shape of operand k as ``op``'s kernel reads it."""
    return op.dtypes[k], tuple(op.join_shape[d] for d in op.inputs[k])


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
                if i in inside:
                    ops.append(place[i])
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
        return tuple(outputs)


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
