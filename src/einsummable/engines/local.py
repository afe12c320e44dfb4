"""The local engine, the default: one process, one thread per worker, fully asynchronous.

Inputs: a TaskGraph, checked feeds and run-time variables. It runs the shared
dependency loop (``scheduler.run``) with each task pinned to its planned worker,
BLAS limited to one thread per worker (all the cores for a single worker, which
runs inline), and the engines' fast kernels:
contractions as batched GEMM, joins compiled to ufunc sequences, embeddings as
gathers; a fused task (lower/fusion.py) runs a GEMM and its epilogue (epilogue.py), or
a row reduction and its join a row at a time in one generated C function (rowfuse.py).
Blocks are freed after their last reader; partial sums accumulate in place; a
move inside the process is a view, not a copy. Feeds are never written, save
the blocks a session gives up to a run that replaces them, by the tasks marked to
(donation.py). It runs the tasks it is given, as they are: no rewrite of its own.

    prog = es.compile(g, workers=2)            # engine="local"
    prog.run({"x": X})
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import itertools
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from threadpoolctl import ThreadpoolController

from einsummable.engines import donation, scheduler, storage
from einsummable.engines import trace as timeline
from einsummable.engines.blocks import Blocks, assemble
from einsummable.engines.kernels import epilogue, native, rowfuse, segment
from einsummable.engines.kernels import fast as kernels
from einsummable.engines.kernels import reference as reference_kernel
from einsummable.errors import EngineError
from einsummable.ir import kinds, priority
from einsummable.ir.box import slices, whole
from einsummable.ir.dtypes import to_numpy
from einsummable.lower.taskgraph import (
    ApplyTask,
    ConstantTask,
    FusedTask,
    InputTask,
    MoveTask,
    PartialTask,
    TaskGraph,
    ViewTask,
)
from einsummable.progress import Progress

SHOW_PROGRESS_AFTER = 2.0  # seconds
# The most workers (threads) one local run starts: a plan for more is a typo or meant for a
# cluster (simulate it); raise it here, einsummable.engines.local.MAX_THREADS, if you mean it.
MAX_THREADS = 1024
_BLAS: ThreadpoolController | None = None  # found once: a rescan of the loaded libraries costs ~1 ms


def _blas() -> ThreadpoolController:
    global _BLAS
    if _BLAS is None:
        _BLAS = ThreadpoolController()
    return _BLAS


def _keep_freed_memory() -> None:
    """Ask glibc to keep freed blocks for reuse rather than hand them back to the OS.

    Blocks of a few MB are freed and reallocated thousands of times a run; returned
    to the OS, each reuse page-faults afresh (measured: ~45k faults and ~0.25 s of
    system time per Llama training step). Elsewhere than glibc this does nothing.

    Called when this module loads (``import einsummable``), before any thread of ours
    mallocs: glibc gives a thread that has no arena one from its list of dead threads'
    arenas whatever M_ARENA_MAX says, so set at the first run (after the compiler's
    build threads) it left the workers on their own arenas, whose heaps grew and shrank
    step after step (Llama training step: ~10-60k page faults a step for its first 5
    steps, 3 arenas; now ~0 from the third step, 1 arena).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 1 << 30)   # M_TRIM_THRESHOLD: keep up to 1 GiB free at the top of the heap
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: blocks up to 32 MiB come from the reusable heap
        libc.mallopt(-8, 1)         # M_ARENA_MAX: one heap; a worker's own arena is trimmed regardless
    except (OSError, AttributeError):
        pass


_keep_freed_memory()


def _cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def blas_limit(workers: int, cores: int | None = None) -> Iterator[None]:
    """Hold BLAS, while ``workers`` run in this process, to all its ``cores`` (default: those it
    may run on) for a lone worker, else to one thread: several workers asking OpenBLAS for
    threads at once would queue on its one pool. The simulator's ``Cluster.blas_threads``.
    Only a count that differs is set, and set back: threadpoolctl's ``limit`` reads every
    library's full description first (~20 us, a run of a decode step's every time)."""
    want = (cores or _cores()) if workers == 1 else 1
    changed = [(lib, n) for lib in _blas().lib_controllers if lib.user_api == "blas"
               and (n := lib.get_num_threads()) != want]
    for lib, _ in changed:
        lib.set_num_threads(want)
    try:
        yield
    finally:
        for lib, n in changed:
            lib.set_num_threads(n)


def _input(task: InputTask):
    box = slices(task.box)

    def run(args, feeds, variables):
        src = feeds[task.name]
        return src.get(task.box) if isinstance(src, Blocks) else src[box]

    return run


SMALL_FILL = 1 << 16  # elements: a fill block up to this size is made once and served read-only


def _constant(task: ConstantTask):
    """A small block (a decode step's ramps and masks) is made once, not each run (~10 us a ramp);
    read-only, as kernels that write into a block they read check (epilogue.py, donation.py)."""
    if math.prod(task.shape) <= SMALL_FILL:
        block = reference_kernel.fill(task.kind, task.dtype, task.box)
        block.flags.writeable = False
        return lambda args, feeds, variables: block
    return lambda args, feeds, variables: reference_kernel.fill(task.kind, task.dtype, task.box)


def _then(step, after):
    """``step``, its block passed through ``after`` (a load from storage, a store to it)."""
    return lambda args, feeds, variables: after(step(args, feeds, variables))


def _apply(task: ApplyTask):
    kernel = kernels.prepare(task.op)
    return lambda args, feeds, variables: kernel(args, variables)


def _fused(task: FusedTask):
    return (epilogue if kinds.is_gemm(task.first) else rowfuse).step(task)


def _move(task: MoveTask):
    box = slices(task.box)
    return lambda args, feeds, variables: args[0][box]  # one address space: a view is the move


def _partial(task: PartialTask):
    full = whole(task.shape)
    pieces = [(p.input, slices(p.src), slices(p.dst_box), p.dst_box == full) for p in task.pieces]
    dtype = to_numpy(task.dtype)
    reduce = reference_kernel.REDUCE[task.agg] if task.agg else None
    if pieces and all(whole for *_, whole in pieces):  # none: an empty box, assembled from nothing
        (k0, src0, _, _), rest = pieces[0], pieces[1:]

        def accumulate(args, feeds, variables):
            if not rest:
                return args[k0][src0]
            first, (k1, src1, _, _) = args[k0][src0], rest[0]
            second, more = args[k1][src1], rest[1:]
            if first.dtype == dtype and second.dtype == dtype:  # the first two meet in the new block:
                out = reduce(first, second, out=np.empty(first.shape, dtype))  # no copy pass before
            else:
                out, more = np.array(first, dtype=dtype, copy=True), rest
            for k, src, _, _ in more:
                reduce(out, args[k][src], out=out)  # partial sums meet in place
            return out

        return accumulate

    covered = not reduce and _tiles([p.dst_box for p in task.pieces], task.shape)

    def assemble(args, feeds, variables):
        if covered:
            out = np.empty(task.shape, dtype=dtype)
        elif task.pad == 0:
            out = np.zeros(task.shape, dtype=dtype)  # calloc's pages come zeroed, no pass
        else:
            out = np.full(task.shape, task.pad, dtype=dtype)
        written = np.zeros(task.shape, dtype=bool) if reduce else None
        for k, src, dst, _ in pieces:
            piece = args[k][src]
            if written is None:
                out[dst] = piece
            else:
                out[dst] = np.where(written[dst], reduce(out[dst], piece), piece)
                written[dst] = True
        return out

    return assemble


def _node_step(node: int | segment.Segment, steps, picks: tuple[int | None, ...] | None,
               times: np.ndarray | None = None):
    """The step of one node of the dependency loop: a task alone (``steps[node]``) or a segment
    (its C loop, writing its tasks' ``times`` where given), each input that is a segment's block
    taken at its position (``picks``)."""
    if isinstance(node, segment.Segment):
        def step(args, feeds, variables):
            return node(args, variables, times)
    else:
        step = steps[node]
    if picks is None:
        return step
    chosen = [(k, p) for k, p in enumerate(picks) if p is not None]

    def picked(args, feeds, variables):
        for k, p in chosen:  # (args is the loop's fresh list: picked in place)
            args[k] = args[k].take(p)
        return step(args, feeds, variables)

    return picked


def _tiles(boxes: list, shape: tuple[int, ...]) -> bool:
    """Whether disjoint ``boxes`` fill ``shape``: then no padding needs writing."""
    disjoint = all(any(b_hi <= a_lo or a_hi <= b_lo for (a_lo, a_hi), (b_lo, b_hi) in zip(a, b, strict=True))
                   for a, b in itertools.combinations(boxes, 2))
    return disjoint and sum(math.prod(hi - lo for lo, hi in box) for box in boxes) == math.prod(shape)


def _view(task: ViewTask):
    dtype = to_numpy(task.dtype)

    def run(args, feeds, variables):
        a = args[0]
        if a.dtype != dtype:
            a = np.ascontiguousarray(a).view(dtype)
        return a.reshape(task.shape)

    return run


PREPARE = {
    InputTask: _input,
    ConstantTask: _constant,
    ApplyTask: _apply,
    FusedTask: _fused,
    MoveTask: _move,
    PartialTask: _partial,
    ViewTask: _view,
}


def task_cost(task) -> float:
    """A task's estimated work, for ranking ready tasks by critical path."""
    if isinstance(task, ApplyTask):
        return float(task.op.flops())
    if isinstance(task, FusedTask):
        return float(task.first.flops() + task.then.flops())
    return float(np.prod(task.shape))


class _Ticker:
    """Progress on a terminal, once a run has taken a couple of seconds (made only for a
    terminal: elsewhere a run calls nothing per task)."""

    def __init__(self, total: int, weight: Sequence[int] | None = None) -> None:
        self.total, self.weight = total, weight  # weight[i]: the tasks node i runs (default 1)
        self.start = time.perf_counter()
        self.due = self.start + SHOW_PROGRESS_AFTER  # nothing to draw before then
        self.bar: Progress | None = None
        self.count = 0

    def __call__(self, i: int) -> None:
        self.count += 1 if self.weight is None else self.weight[i]
        now = time.perf_counter()
        if now < self.due:
            return
        if self.bar is None:
            self.bar = Progress(self.total, "run", unit="task")
            self.bar.start = self.start
        self.bar.update(self.count - self.bar.done)
        self.due = now + 0.1

    def close(self) -> None:
        if self.bar is not None:
            self.bar.update(self.count - self.bar.done)
            self.bar.__exit__()


def _reads(task, name: str, box) -> bool:
    """Whether ``task`` is the input task reading block ``box`` of feed ``name``."""
    return isinstance(task, InputTask) and task.name == name and task.box == box


class LocalProgram:
    """A TaskGraph made ready to run many times: kernels chosen and priorities ranked once."""

    def __init__(self, tg: TaskGraph, native_loop: bool = True) -> None:
        """``native_loop``: run each worker's runs of compiled joins through the C loop
        (kernels/segment.py); False runs every task through Python (calibrate.dispatch
        measures both)."""
        if tg.workers > MAX_THREADS:
            raise EngineError(
                f"the plan has {tg.workers:,} worker threads for the local engine, which runs at most "
                f"{MAX_THREADS:,} in one process; plan for fewer workers, use engine='simulate' to "
                "model a larger cluster, or raise einsummable.engines.local.MAX_THREADS")
        self.tg = tg
        tasks = tg.tasks
        self.location = [t.loc for t in tasks]
        self.keep = {t for out in tg.outputs.values() for t, _ in out.blocks}
        self.inputs = [t.inputs for t in tasks]
        self.steps = [PREPARE[type(t)](t) for t in tasks]
        self.rank = priority.ranks(self.inputs, [task_cost(t) for t in tasks], tg.order)
        # where(c, x, a block a session run gives up): stored in place (donation.py)
        self.donors = donation.prepare(tg, self.steps)
        if tg.stored:
            self._offload(tg)
        self.reads: dict[str, collections.Counter] = {}  # per feed, the boxes its input tasks read
        for t in tasks:
            if isinstance(t, InputTask):
                self.reads.setdefault(t.name, collections.Counter())[t.box] += 1
        # the outputs that are their input's blocks handed back as they lie (weights a decode step
        # outputs unchanged, to keep them in its partition): a session gives them up for nothing
        self.unchanged = {name: frozenset(box for _, box in out.blocks) for name, out in tg.outputs.items()
                          if name not in tg.stored
                          and all(_reads(tasks[t], name, box) for t, box in out.blocks)}
        native.flush()  # the compiled kernels, built together, at prepare
        self._segments(tg, native_loop)

    def _segments(self, tg: TaskGraph, native_loop: bool) -> None:
        """The dependency loop's nodes: each worker's runs of compiled joins as one segment, run
        by one call of the C loop (kernels/segment.py: lower/runs.py's runs, which the simulator
        prices), every other task alone. A block stored to host storage as made stays alone."""
        tasks = tg.tasks
        alone = tg.stored_as_made()
        plan = segment.cut(tasks, self.keep, lambda t: t not in alone) if native_loop else None
        self.plan = plan
        if plan is None:  # every task alone: the loop runs the tasks themselves
            self.node_steps, self.node_donors, self.weight = self.steps, self.donors, None
            inputs, location, keep, rank = self.inputs, self.location, self.keep, self.rank
        else:
            self.weight = [1 if isinstance(n, int) else len(n.tasks) for n in plan.nodes]
            rank = [-math.inf] * len(plan.nodes)
            for t, node in enumerate(plan.node_of):
                rank[node] = max(rank[node], self.rank[t])
            self.node_steps = [_node_step(node, self.steps, picks)
                               for node, picks in zip(plan.nodes, plan.picks, strict=True)]
            self.node_donors = {plan.node_of[t]: (name, _node_step(t, {t: step}, plan.picks[plan.node_of[t]]))
                                for t, (name, step) in self.donors.items()}
            inputs, keep = plan.inputs, {plan.node_of[t] for t in self.keep}
            location = [tasks[n if isinstance(n, int) else n.tasks[0]].loc for n in plan.nodes]
        self.schedule = scheduler.Schedule(inputs, location=location, workers=tg.workers, keep=keep,
                                           rank=rank, window=priority.window(tg.order, tg.workers))

    def _offload(self, tg: TaskGraph) -> None:
        """Inputs kept in host storage (plan/offload.py): their input tasks load a copy of
        the block, and the output of each one's name is stored block by block as it is made
        (engines/storage.py); nothing writes into a stored block in place."""
        self.donors = {t: d for t, d in self.donors.items() if d[0] not in tg.stored}
        made = tg.stored_as_made()
        for t, task in enumerate(tg.tasks):
            if isinstance(task, InputTask) and task.name in tg.stored:
                self.steps[t] = _then(self.steps[t], storage.load)
            if t in made:
                self.steps[t] = _then(self.steps[t], storage.store)

    def run(self, feeds: dict[str, np.ndarray | Blocks], variables: dict[str, float] | None = None,
            carry: frozenset[str] = frozenset(),
            trace: str | Path | None = None) -> dict[str, np.ndarray | Blocks]:
        """Execute on ``tg.workers`` threads.

        Outputs named in ``carry`` come back as their blocks, unassembled, ready to
        be fed to the next run; the others are assembled into arrays. A kernel may
        write into the blocks of a feed given up (``donation.GivenUp``). ``trace``: write
        each task's measured start and end per worker there (engines/trace.py: Chrome
        trace JSON, or a Gantt chart for ``*.png``); without it nothing is recorded.
        """
        variables = variables or {}
        tasks, plan = self.tg.tasks, self.plan
        steps = donation.swap(self.node_steps, self.node_donors, feeds)
        ticker = _Ticker(len(tasks), self.weight) if sys.stderr.isatty() else None
        times = np.zeros((len(tasks), 2)) if trace is not None else None
        if times is not None and plan is not None:  # each segment writes its tasks' times itself
            steps = [_node_step(node, steps, picks, times) if isinstance(node, segment.Segment) else steps[i]
                     for i, (node, picks) in enumerate(zip(plan.nodes, plan.picks, strict=True))]

        def execute(i: int, args: list) -> object:
            return steps[i](args, feeds, variables)

        def describe(i: int) -> str:
            node = i if plan is None else plan.nodes[i]
            return tasks[node].describe() if isinstance(node, int) else node.describe(tasks)

        if times is not None:
            node_times = times if plan is None else np.zeros((len(plan.nodes), 2))
            execute, origin = timeline.timed(execute, node_times), time.perf_counter()
        with blas_limit(self.tg.workers):
            try:
                values = self.schedule.run(execute, describe=describe, on_done=ticker)
            finally:
                if ticker is not None:
                    ticker.close()
        if plan is not None:  # the kept tasks' blocks, picked from their nodes' values
            node_of, pick = plan.node_of, plan.pick
            values = {t: values[node_of[t]] if pick[t] is None else values[node_of[t]][pick[t]]
                      for t in self.keep}
        if times is not None:
            if plan is not None:
                for i, node in enumerate(plan.nodes):
                    if isinstance(node, int):
                        times[node] = node_times[i]
            events, lanes = timeline.task_events(self.tg, times - origin, measured=True)
            title = f"measured: {len(tasks):,} tasks on {self.tg.workers} worker(s)"
            timeline.write(events, trace, lanes, title)
        result: dict[str, np.ndarray | Blocks] = {}
        for name, out in self.tg.outputs.items():
            if name not in carry:
                result[name] = assemble(out, values)
            elif type(fed := feeds.get(name)) is Blocks and fed.blocks.keys() == self.unchanged.get(name):
                result[name] = fed  # handed back as it lies: the very blocks it was fed
            else:
                result[name] = Blocks(out.shape, out.dtype, {box: values[t] for t, box in out.blocks})
        return result


def run(tg: TaskGraph, feeds: dict[str, np.ndarray | Blocks], variables: dict[str, float] | None = None,
        carry: frozenset[str] = frozenset()) -> dict[str, np.ndarray | Blocks]:
    """Prepare and run once (a compiled Program prepares once and runs many times)."""
    return LocalProgram(tg).run(feeds, variables, carry)
