"""A planned machine as a Ray actor: its share of each program, its resident blocks, its mailbox.

Inside the actor the local engine's step closures (``local.PREPARE``) run the
machine's tasks (of a whole TaskGraph, or of its share of a two-level plan, which
the actor lowers to its cores: engines/machine.py) with the shared dependency loop
(``scheduler.run``): one thread per core computes (and sends), one more receives.
Moves between the machine's cores are views of blocks in the actor's memory, as in
the local engine; blocks for other machines are handed to their actors directly
(``deliver``).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import ray

from einsummable.engines import local, scheduler
from einsummable.engines import trace as timeline
from einsummable.engines.blocks import Blocks
from einsummable.engines.kernels import native
from einsummable.engines.machine import MachinePart
from einsummable.errors import EngineError
from einsummable.ir import priority
from einsummable.ir.box import slices
from einsummable.lower.refine import Share, refine
from einsummable.lower.taskgraph import MoveTask, TaskGraph


def contiguous(block: object) -> np.ndarray:
    """A block as Ray should ship it: Ray pickles a strided slice (a column block) in band,
    2-3x slower than it copies a contiguous one into its object store (0-d stays 0-d)."""
    block = np.asarray(block)
    return block if block.flags.c_contiguous else block.copy(order="C")


class _Aborted(Exception):
    """The driver called the run off: another machine failed or died."""


class _Mailbox:
    """Blocks delivered by other machines, keyed by (program, run, message)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.items: dict[tuple, object] = {}
        self.aborted: set[tuple[str, int]] = set()
        self.closed: dict[str, int] = {}  # program -> last finished run; later deliveries are dropped

    def put(self, pid: str, run: int, key: tuple, payload: object) -> None:
        with self.cond:
            if run > self.closed.get(pid, -1):
                self.items[(pid, run, key)] = payload
                self.cond.notify_all()

    def take(self, pid: str, run: int, key: tuple, deadline: float) -> object:
        with self.cond:
            while (pid, run, key) not in self.items:
                if (pid, run) in self.aborted:
                    raise _Aborted("the run was aborted")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no delivery of {key} within the run's deadline")
                self.cond.wait(left)
            return self.items.pop((pid, run, key))

    def abort(self, pid: str, run: int) -> None:
        with self.cond:
            if run > self.closed.get(pid, -1):
                self.aborted.add((pid, run))
            self.cond.notify_all()

    def close(self, pid: str, run: int) -> None:
        with self.cond:
            self.closed[pid] = max(run, self.closed.get(pid, -1))
            self.aborted.discard((pid, run))
            for k in [k for k in self.items if k[0] == pid and k[1] <= run]:
                del self.items[k]


class _Run:
    """What one run's steps share inside an actor."""

    def __init__(self, pid, run, feeds, variables, mailbox, peers, timeout) -> None:
        self.pid, self.run, self.feeds, self.variables = pid, run, feeds, variables
        self.mailbox, self.peers = mailbox, peers
        self.deadline = time.monotonic() + timeout

    def send(self, dest: int, key: tuple, block: np.ndarray) -> None:
        """Ray passes a large block as an ObjectRef that the receiving actor pulls, and resolves
        it before ``deliver`` runs: pulls overlap, and none waits behind another in the mailbox.
        Contiguous (``contiguous``)."""
        self.peers[dest].deliver.remote(self.pid, self.run, key, contiguous(block))

    def receive(self, key: tuple) -> np.ndarray:
        return self.mailbox.take(self.pid, self.run, key, self.deadline)


class _Part:
    """One machine's share of a TaskGraph: its tasks, plus a send or a receive per move that
    crosses machines.

    Location ``k`` of the local loop is the machine's core k: it computes, and sends the
    blocks its tasks made; location ``cores`` receives, in task order, so that the earliest
    unfinished task of the whole graph can always run.
    """

    def __init__(self, tg: TaskGraph, me: int, rank: list[float], cpus: int) -> None:
        cores, machine = tg.cores, tg.machine_of
        self.cores, self.cpus = cores, cpus  # the plan's cores; the node's CPUs, for a lone worker's BLAS
        self.window = priority.window(tg.order, cores)
        self.ids = [t for t, task in enumerate(tg.tasks) if machine(task.loc) == me
                    or (isinstance(task, MoveTask) and machine(task.src) == me)]
        self.index = {t: k for k, t in enumerate(self.ids)}
        self.inputs: list[tuple[int, ...]] = []
        self.location: list[int] = []
        self.rank: list[float] = []
        self.steps = []
        self.names: list[str] = []  # trace event names: the cluster graph's ids, a crossing move's half
        for t in self.ids:
            task = tg.tasks[t]
            crossing = isinstance(task, MoveTask) and machine(task.src) != machine(task.loc)
            receive = crossing and machine(task.loc) == me
            self.inputs.append(() if receive else tuple(self.index[i] for i in task.inputs))
            self.location.append(cores if receive else (task.src if crossing else task.loc) % cores)
            self.rank.append(-float(t) if receive else rank[t])
            if receive:
                self.steps.append(lambda args, run, key=("move", t): run.receive(key))
            elif crossing:
                self.steps.append(_sender(t, task, machine(task.loc)))
            else:
                step = local.PREPARE[type(task)](task)
                self.steps.append(lambda args, run, step=step: step(args, run.feeds, run.variables))
            self.names.append(f"send %{t}" if crossing and not receive else timeline.label(task, t))
        self.describe = [f"%{t} @{tg.tasks[t].loc} {tg.tasks[t].describe()}" for t in self.ids]
        native.flush()  # the compiled kernels, built together, at prepare


def _sender(t: int, task: MoveTask, dest: int):
    box = slices(task.box)

    def send(args, run):
        run.send(dest, ("move", t), args[0][box])

    return send


@ray.remote(max_concurrency=32, max_restarts=0, num_cpus=0)
class Machine:
    """A planned machine: holds its parts of programs, its resident blocks and its mailbox."""

    def __init__(self) -> None:
        self.mailbox = _Mailbox()
        self.parts: dict[str, _Part] = {}
        self.peers: dict[str, list] = {}
        self.store: dict[tuple, np.ndarray] = {}

    def setup(self, pid: str, program: tuple[TaskGraph, list[float]] | Share, me: int, peers: list,
              cpus: int) -> str:
        """Make this machine's part: of a whole TaskGraph, or its share, lowered here to its cores."""
        if isinstance(program, Share):
            self.parts[pid] = MachinePart(refine(program), cpus)
        else:
            tg, rank = program
            self.parts[pid] = _Part(tg, me, rank, cpus)
        self.peers[pid] = peers
        return ray.get_runtime_context().get_node_id()

    def ping(self) -> None:
        """Answers while the actor lives: a new program checks the actors it reuses with it, and a
        run sent with one tells a machine dead before it from one that died during it."""

    def set_peers(self, pid: str, peers: list) -> None:
        self.peers[pid] = peers

    def forget(self, pid: str) -> None:
        self.parts.pop(pid, None)
        self.peers.pop(pid, None)
        for key in [k for k in self.store if k[0] == pid]:
            del self.store[key]

    def deliver(self, pid: str, run: int, key: tuple, payload: object) -> None:
        self.mailbox.put(pid, run, key, payload)

    def abort(self, pid: str, run: int) -> None:
        self.mailbox.abort(pid, run)

    def get(self, keys: list[tuple]) -> list[np.ndarray]:
        return [self.store[k] for k in keys]

    def drop(self, keys: list[tuple]) -> None:
        for k in keys:
            self.store.pop(k, None)

    def run(self, pid: str, run: int, feeds: dict, sends: list, variables: dict[str, float],
            fetch: list[int], carry: list[tuple[int, tuple]], timeout: float,
            timed: bool = False) -> tuple[str, object]:
        """Run this machine's part; return ("ok", (fetched blocks, events)) or ("error" | "aborted",
        message). ``timed``: events are each task's (name, lane, start, end), in ``time.time()``
        seconds (one clock for every node the driver reads), else None."""
        part = self.parts[pid]
        ctx = _Run(pid, run, {}, variables, self.mailbox, self.peers[pid], timeout)
        times = np.zeros((len(part.inputs), 2)) if timed else None
        try:
            for key, box, dest, msg in sends:  # resident pieces others read: send before waiting on any
                ctx.send(dest, msg, self.store[key][slices(box)])
            ctx.feeds = {name: Blocks(shape, dtype, {box: self._piece(ctx, source) for box, source in pieces})
                         for name, (shape, dtype, pieces) in feeds.items()}
            keep = {part.index[t] for t in fetch} | {part.index[t] for t, _ in carry}

            def execute(i: int, args: list) -> object:
                return part.steps[i](args, ctx)

            with local.blas_limit(part.cores, part.cpus):
                values = scheduler.run(part.inputs, execute if times is None else
                                       timeline.timed(execute, times, clock=time.time),
                                       location=part.location, workers=part.cores + 1, keep=keep,
                                       rank=part.rank, describe=lambda i: part.describe[i],
                                       window=part.window)
        except (EngineError, _Aborted, TimeoutError, KeyError) as err:
            cause = err.__cause__ if isinstance(err, EngineError) else err
            kind = "aborted" if isinstance(cause, _Aborted) else "error"
            return kind, f"{type(err).__name__}: {err}"
        finally:
            self.mailbox.close(pid, run)
        for t, key in carry:
            self.store[key] = values[part.index[t]]
        events = None if times is None else [(name, loc, float(a), float(b)) for name, loc, (a, b)
                                             in zip(part.names, part.location, times, strict=True)]
        return "ok", ({t: contiguous(values[part.index[t]]) for t in fetch}, events)

    def _piece(self, ctx: _Run, source: tuple[str, object]) -> np.ndarray:
        where, key = source
        if where == "feed":
            return key
        if where == "msg":
            return ctx.receive(key)
        if key not in self.store:
            raise KeyError(f"resident block {key[2:]} is not held here")
        return self.store[key]
