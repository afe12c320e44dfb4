"""The one dependency loop every engine shares: run a DAG of tasks on pinned workers.

Inputs: for each task, its input task ids and its worker; an ``execute(i, args)``
callback that computes task i from its inputs' values. Output: the values of the
tasks in ``keep``. State: dependency counts, one ready heap per worker ordered by
critical path (longest remaining chain of estimated cost first), and each value's
count of pending readers, so a block is freed right after its last use.

Policy: a task runs on the worker its plan placed it on; the engine never re-plans.
With ``workers=1`` the loop runs inline in the caller's thread (the sequential
oracle); otherwise one thread per worker. An exception in a task stops every
worker promptly and is re-raised as ``EngineError`` naming the task. An interrupt
in the caller (Ctrl-C) stops them too: no task starts after it, and it reaches the
caller once the tasks under way have finished, with no worker left running.

    values = run([(), (0,), (0, 1)], lambda i, args: sum(args) + 1, location=[0, 1, 0],
                 workers=2, keep={2})          # {2: 3}
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Sequence

from einsummable.errors import EngineError
from einsummable.ir import priority


def run(
    inputs: Sequence[Sequence[int]],
    execute: Callable[[int, list[object]], object],
    *,
    location: Sequence[int],
    workers: int,
    keep: set[int],
    rank: Sequence[float] | None = None,
    describe: Callable[[int], str] = str,
    on_done: Callable[[int], None] | None = None,
    window: int | None = None,
) -> dict[int, object]:
    """Execute tasks (ids in topological order) and return ``{i: value}`` for i in keep.

    ``rank`` orders ready tasks, highest first (default: ``ir.priority.ranks`` in task counts).
    ``window``: a worker starts no task more than that many ids past the earliest unfinished
    one (``ir.priority.window``; None: any ready task). A program run many times builds its
    ``Schedule`` once instead.
    """
    return Schedule(inputs, location=location, workers=workers, keep=keep, rank=rank,
                    window=window).run(execute, describe, on_done)


class Schedule:
    """What the loop derives from the DAG alone, derived once for a program run many times:
    rebuilt every run, the readers, users and first ready tasks of a decode step's 61 tasks
    cost more than its driver's every other check together (~100 us a run)."""

    def __init__(self, inputs: Sequence[Sequence[int]], *, location: Sequence[int], workers: int,
                 keep: set[int], rank: Sequence[float] | None = None, window: int | None = None) -> None:
        n = len(inputs)
        if len(location) != n:
            raise EngineError(f"{n} tasks but {len(location)} locations")
        self.inputs, self.location, self.workers, self.keep = inputs, location, workers, keep
        self.window = window
        if workers <= 1:  # inline: the values each task is the last to read, freed after it
            self.frees = _frees(inputs, keep)
            return
        if rank is None:
            rank = priority.ranks(inputs, [1.0] * n)
        self.rank = rank
        self.distinct = [tuple(set(ins)) for ins in inputs]
        self.pending = [len(ins) for ins in self.distinct]
        self.readers = [0] * n
        self.users: list[list[int]] = [[] for _ in range(n)]
        for i, ins in enumerate(self.distinct):
            for j in ins:
                self.users[j].append(i)
                self.readers[j] += 1
        self.ready: list[list[tuple[float, int]]] = [[] for _ in range(workers)]
        for i in range(n):
            if self.pending[i] == 0:
                heapq.heappush(self.ready[location[i] % workers], (-rank[i], i))

    def run(self, execute: Callable[[int, list[object]], object], describe: Callable[[int], str] = str,
            on_done: Callable[[int], None] | None = None) -> dict[int, object]:
        """One run: ``execute(i, args)`` computes task i from its inputs' values."""
        if self.workers <= 1:
            return _in_order(self.inputs, execute, self.keep, self.frees, describe, on_done)
        return self._threads(execute, describe, on_done)

    def _threads(self, execute: Callable[[int, list[object]], object], describe: Callable[[int], str],
                 on_done: Callable[[int], None] | None) -> dict[int, object]:
        inputs, location, workers, keep = self.inputs, self.location, self.workers, self.keep
        window, rank, distinct, users = self.window, self.rank, self.distinct, self.users
        n = len(inputs)
        pending, readers = list(self.pending), list(self.readers)
        state = _Shared(workers)
        state.ready = [list(heap) for heap in self.ready]
        values: dict[int, object] = {}

        finished = [False] * n

        def finish(i: int, value: object) -> None:
            with state.lock:
                values[i] = value
                finished[i] = True
                if window is not None and i == state.low:  # the reach moves on: wake whoever waits for it
                    while state.low < n and finished[state.low]:
                        state.low += 1
                    for c in state.wake:
                        c.notify()
                for j in distinct[i]:
                    readers[j] -= 1
                    if readers[j] == 0 and j not in keep:
                        values.pop(j, None)
                for u in users[i]:
                    pending[u] -= 1
                    if pending[u] == 0:
                        w = location[u] % workers
                        heapq.heappush(state.ready[w], (-rank[u], u))
                        state.wake[w].notify()
                state.done += 1
                if state.done == n:
                    for c in state.wake:
                        c.notify()

        def held_back(w: int) -> bool:
            """Nothing ready for worker w, or only work beyond the window's reach."""
            return not state.ready[w] or (window is not None and state.ready[w][0][1] >= state.low + window)

        def work(w: int) -> None:
            while True:
                with state.lock:
                    while held_back(w) and not state.stopped and state.done < n:
                        state.wake[w].wait()
                    if state.stopped or (state.done >= n and not state.ready[w]):
                        return
                    _, i = heapq.heappop(state.ready[w])
                    args = [values[j] for j in inputs[i]]
                try:
                    value = execute(i, args)
                except BaseException as err:  # stop everyone, report this task
                    state.stop((i, err))
                    return
                finish(i, value)
                if on_done is not None:
                    on_done(i)

        def worker(w: int) -> None:
            try:
                work(w)
            finally:
                state.exited[w].set()

        threads = [threading.Thread(target=worker, args=(w,), daemon=True, name=f"einsummable-{w}")
                   for w in range(workers)]
        # Wait on events, not Thread.join: an interrupted join marks a live thread as finished
        # (Python 3.11, bpo-45274's fix), and a second join would then return at once.
        try:
            for t in threads:
                t.start()
            for e in state.exited:
                e.wait()
        except BaseException:  # KeyboardInterrupt: no new task starts; wait out those under way
            state.stop()
            for t, e in zip(threads, state.exited, strict=True):
                if t.ident is not None:  # started (one that starts later finds the stop flag)
                    e.wait()
            raise
        finally:
            for t in threads:
                if t.ident is not None:
                    t.join()
        if state.error is not None:
            i, err = state.error
            if not isinstance(err, Exception):  # a KeyboardInterrupt or SystemExit inside a task
                raise err
            raise EngineError(f"task {i} ({describe(i)}) failed: {type(err).__name__}: {err}") from err
        return {i: values[i] for i in keep}


class _Shared:
    def __init__(self, workers: int) -> None:
        self.lock = threading.Lock()
        self.wake = [threading.Condition(self.lock) for _ in range(workers)]
        self.ready: list[list[tuple[float, int]]] = [[] for _ in range(workers)]
        self.done = 0
        self.low = 0  # the earliest unfinished task
        self.stopped = False
        self.exited = [threading.Event() for _ in range(workers)]
        self.error: tuple[int, BaseException] | None = None

    def stop(self, error: tuple[int, BaseException] | None = None) -> None:
        """Start no more tasks; remember the first failure."""
        with self.lock:
            self.stopped = True
            if self.error is None:
                self.error = error
            for c in self.wake:
                c.notify()


def run_in_order(
    inputs: Sequence[Sequence[int]],
    execute: Callable[[int, list[object]], object],
    keep: set[int],
    describe: Callable[[int], str] = str,
    on_done: Callable[[int], None] | None = None,
) -> dict[int, object]:
    """Execute tasks one after another in id order, freeing each value after its last reader.

    The one-worker case of ``run``, and the loop of the two oracles (the reference and
    sequential engines): they keep their own kernels but share this bookkeeping.
    """
    return _in_order(inputs, execute, keep, _frees(inputs, keep), describe, on_done)


def _frees(inputs: Sequence[Sequence[int]], keep: set[int]) -> list[tuple[int, ...]]:
    """For each task, the values not kept whose last reader it is (its own, if none reads it)."""
    last = list(range(len(inputs)))
    for i, ins in enumerate(inputs):
        for j in ins:
            last[j] = i
    frees: list[list[int]] = [[] for _ in inputs]
    for j, i in enumerate(last):
        if j not in keep:
            frees[i].append(j)
    return [tuple(f) for f in frees]


def _in_order(inputs: Sequence[Sequence[int]], execute: Callable[[int, list[object]], object], keep: set[int],
              frees: Sequence[tuple[int, ...]], describe: Callable[[int], str],
              on_done: Callable[[int], None] | None) -> dict[int, object]:
    values: list[object] = [None] * len(inputs)
    for i, (ins, free) in enumerate(zip(inputs, frees, strict=True)):
        # up to two operands listed outright: a comprehension is a call of its own (~0.3 us a task)
        n = len(ins)
        if n == 0:
            args = []
        elif n == 1:
            args = [values[ins[0]]]
        elif n == 2:
            args = [values[ins[0]], values[ins[1]]]
        else:
            args = [values[j] for j in ins]
        try:
            values[i] = execute(i, args)
        except Exception as err:
            raise EngineError(f"task {i} ({describe(i)}) failed: {type(err).__name__}: {err}") from err
        for j in free:
            values[j] = None
        if on_done is not None:
            on_done(i)
    return {i: values[i] for i in keep}
