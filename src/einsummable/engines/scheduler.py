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
    one (``ir.priority.window``; None: any ready task).
    """
    n = len(inputs)
    if len(location) != n:
        raise EngineError(f"{n} tasks but {len(location)} locations")
    if workers <= 1:  # before the lists below, which only the threads use (a decode step: ~0.1 ms a run)
        return run_in_order(inputs, execute, keep, describe, on_done)
    if rank is None:
        rank = priority.ranks(inputs, [1.0] * n)
    distinct = [tuple(set(ins)) for ins in inputs]
    pending = [len(ins) for ins in distinct]
    readers = [0] * n
    users: list[list[int]] = [[] for _ in range(n)]
    for i, ins in enumerate(distinct):
        for j in ins:
            users[j].append(i)
            readers[j] += 1
    state = _Shared(workers)
    for i in range(n):
        if pending[i] == 0:
            heapq.heappush(state.ready[location[i] % workers], (-rank[i], i))
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
    readers = [0] * len(inputs)
    for ins in inputs:
        for j in set(ins):
            readers[j] += 1
    values: dict[int, object] = {}
    for i, ins in enumerate(inputs):
        try:
            values[i] = execute(i, [values[j] for j in ins])
        except Exception as err:
            raise EngineError(f"task {i} ({describe(i)}) failed: {type(err).__name__}: {err}") from err
        for j in set(ins):
            readers[j] -= 1
            if readers[j] == 0 and j not in keep:
                del values[j]
        if on_done is not None:
            on_done(i)
    return {i: values[i] for i in keep}
