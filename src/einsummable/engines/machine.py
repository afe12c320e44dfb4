"""One machine's refined share on its cores: the Ray actor's loop, and the same in one process.

``MachinePart`` makes a ``Refined`` (lower/refine.py) ready for the shared dependency
loop (``scheduler.run``): its tasks' inputs, locations, ranks and steps (the local
engine's, ``local.PREPARE``). Location k is the machine's core k: it computes, and
sends the blocks that leave the machine; location ``cores`` receives, in cluster-level
task order, so that the earliest unfinished task of the whole cluster can always run.
A step is called as ``step(args, ctx)``; ``ctx`` has ``feeds``, ``variables``,
``send(dest, key, block)`` and ``receive(key)`` (engines/ray/actor.py's ``_Run``).

``run_machines`` runs every machine's share in this process, each on its own threads,
with the moves between machines handed over in memory: the Ray engine's execution
per machine without Ray (the tests check it against the reference engine).

    parts = [MachinePart(refine(s)) for s in shares]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np

from einsummable.engines import local, scheduler
from einsummable.engines import trace as timeline
from einsummable.engines.blocks import assemble
from einsummable.engines.kernels import native
from einsummable.errors import EngineError
from einsummable.ir import priority
from einsummable.ir.box import slices
from einsummable.lower.refine import Refined, Share, refine
from einsummable.lower.taskgraph import Output


class MachinePart:
    """A machine's refined share, ready to run many times (see the module docstring)."""

    def __init__(self, refined: Refined, cpus: int = 1) -> None:
        tasks = refined.graph.tasks
        self.cores = refined.graph.cores  # the plan's cores of the machine
        self.cpus = cpus  # the node's CPUs, for a lone core's BLAS
        self.index = dict(refined.held)  # cluster-level output task -> the refined task holding it
        self.inputs = [task.inputs for task in tasks]
        self.location = [task.loc for task in tasks]
        # a send, and the work it waits for, go before its core's other ready work: the share's
        # ranks stop at the machine, so the work waiting for the block elsewhere would rank it
        # last (2 x 1 matmul: machine 0 multiplied, then sent machine 1 its operand, 225 -> 150
        # ms a run; 2 x 1 attention: machine 0 read the weight it sends after all its own work)
        cost = [local.task_cost(task) for task in tasks]
        first = sum(cost) + 1.0  # more than any chain of the share's own work
        for i in refined.send:
            cost[i] += first
        self.rank = priority.ranks(self.inputs, cost, refined.graph.order)
        self.window = priority.window(refined.graph.order, self.cores)
        self.steps = []
        self.names = []  # trace event names: the share's ids (a move that leaves the machine: its send)
        for i, task in enumerate(tasks):
            self.names.append(f"send %{i}" if i in refined.send else timeline.label(task, i))
            if i in refined.receive:
                t = refined.receive[i]
                self.location[i], self.rank[i] = self.cores, -float(t)
                self.steps.append(lambda args, ctx, key=("move", t): ctx.receive(key))
            elif i in refined.send:
                (t, dest), box = refined.send[i], slices(task.box)
                self.steps.append(lambda args, ctx, key=("move", t), dest=dest, box=box:
                                  ctx.send(dest, key, args[0][box]))
            else:
                step = local.PREPARE[type(task)](task)
                self.steps.append(lambda args, ctx, step=step: step(args, ctx.feeds, ctx.variables))
        self.describe = [f"%{i} @{task.loc} {task.describe()}" for i, task in enumerate(tasks)]
        self.tasks = len(tasks)
        native.flush()  # the compiled kernels, built together, at prepare

    def run(self, ctx: object) -> dict[int, np.ndarray]:
        """Run on this thread's BLAS setting; the blocks of the share's outputs, by cluster-level id."""
        keep = set(self.index.values())
        values = scheduler.run(self.inputs, lambda i, args: self.steps[i](args, ctx), location=self.location,
                               workers=self.cores + 1, keep=keep, rank=self.rank,
                               describe=lambda i: self.describe[i], window=self.window)
        return {t: values[r] for t, r in self.index.items()}


class _Exchange:
    """The moves between machines of one in-process run: blocks by (destination, key)."""

    def __init__(self, timeout: float) -> None:
        self.cond = threading.Condition()
        self.items: dict[tuple, np.ndarray] = {}
        self.failed = False
        self.deadline = time.monotonic() + timeout

    def put(self, dest: int, key: tuple, block: np.ndarray) -> None:
        with self.cond:
            self.items[(dest, key)] = block
            self.cond.notify_all()

    def take(self, me: int, key: tuple) -> np.ndarray:
        with self.cond:
            while (me, key) not in self.items:
                left = self.deadline - time.monotonic()
                if self.failed or left <= 0:
                    raise EngineError(f"machine {me}: no delivery of {key} "
                                      "(another machine failed, or the run timed out)")
                self.cond.wait(left)
            return self.items.pop((me, key))

    def fail(self) -> None:
        with self.cond:
            self.failed = True
            self.cond.notify_all()


class _Context:
    def __init__(self, me: int, exchange: _Exchange, feeds: dict, variables: dict) -> None:
        self.me, self.exchange, self.feeds, self.variables = me, exchange, feeds, variables

    def send(self, dest: int, key: tuple, block: np.ndarray) -> None:
        self.exchange.put(dest, key, np.array(block, copy=True))  # as if it crossed a NIC

    def receive(self, key: tuple) -> np.ndarray:
        return self.exchange.take(self.me, key)


def run_machines(shares: Sequence[Share], outputs: dict[str, Output], feeds: dict[str, np.ndarray],
                 variables: dict[str, float] | None = None, timeout: float = 120.0) -> dict[str, np.ndarray]:
    """Refine every share and run them all in this process, one thread pool per machine."""
    parts = [MachinePart(refine(share)) for share in shares]
    exchange = _Exchange(timeout)
    values: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def machine(m: int) -> None:
        try:
            values.update(parts[m].run(_Context(m, exchange, feeds, variables or {})))
        except BaseException as err:  # re-raised in the caller's thread
            errors.append(err)
            exchange.fail()

    with local.blas_limit(2):
        threads = [threading.Thread(target=machine, args=(m,)) for m in range(len(parts))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    if errors:
        raise errors[0]
    return {name: assemble(out, values) for name, out in outputs.items()}
