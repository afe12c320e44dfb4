"""The Ray engine: one long-lived actor per planned worker, pinned to its machine's node.

Inputs: a TaskGraph, checked feeds and run-time variables, as for the local engine.
Outputs: arrays, or ``RayBlocks`` (blocks left inside the actors) for carried outputs.

Where things live:
- Machine m of the plan is the m-th live Ray node with CPUs (the driver's node
  first); worker w is the actor for core ``w % cores`` of that node, created with
  ``NodeAffinitySchedulingStrategy(node, soft=False)`` and ``num_cpus=0`` (the
  plan, not Ray, decides how many workers share a node). Every program of this
  driver reuses these actors; a program ships its TaskGraph to them once.
- Blocks live in the actors. Each actor builds the local engine's step closures
  (``local.PREPARE``) for its own tasks and runs them with the shared dependency
  loop (``scheduler.run``): one thread computes, one receives.
- A move between workers: the producer slices its block and hands it to the
  consumer actor directly (``deliver``), as an ObjectRef from ``ray.put`` (zero-copy
  inside a node, pulled between nodes) or inline when under ``INLINE_BYTES``. The
  consumer ``ray.get``s it when its receive thread reaches the move. The driver is
  in neither the data path nor the control path of a move.
- Submission: one actor call per worker per run, all submitted at once; the driver
  only ships each worker the input blocks it reads and fetches the requested outputs.

State: outputs carried by a Session come back as ``RayBlocks`` naming ``(worker,
key)`` per block; the next run reads them in place (or has the holder send the
piece to the worker that wants it). A carried run's blocks are committed only when
every worker succeeded, so a failed run leaves the previous state intact. Blocks are
dropped from the actors when their ``RayBlocks`` is garbage collected.

Faults (the behaviour chosen: fail fast, never recompute from lineage): when an
actor dies mid-run, the driver sees its call fail, aborts the other workers (their
waits on the dead worker end at once) and raises ``EngineError`` naming the lost
worker, its node, and its unfinished tasks. No partial result is returned. The next
run restarts the actor on the same node. Resident state held by a dead actor is
reported lost (``EngineError`` naming the tensor) when a session next reads it;
it is never zeroed. Every wait has a deadline (``RayProgram.timeout``), so a run
never hangs.

    prog = es.compile(g, engine="ray", address="auto", cluster=es.Cluster.from_ray())
    prog.run({"x": X})
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
import weakref
from collections import defaultdict

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from threadpoolctl import threadpool_limits

from einsummable.engines import local, native, scheduler
from einsummable.engines.blocks import Blocks, assemble
from einsummable.errors import EngineError
from einsummable.ir.box import Box, intersect, slices, within
from einsummable.lower.taskgraph import InputTask, MoveTask, TaskGraph

INLINE_BYTES = 100_000  # Ray inlines arguments this small anyway; larger moves go by ObjectRef
TIMEOUT = 3600.0  # seconds a run may take before it is abandoned with an error
START_TIMEOUT = 120.0  # seconds to create and set up the actors
ABORT_GRACE = 30.0  # seconds the survivors of a failed run get to stop


class _Aborted(Exception):
    """The driver called the run off: another worker failed or died."""


class _Mailbox:
    """Blocks delivered by other workers, keyed by (program, run, message)."""

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
        payload = np.asarray(block) if block.nbytes <= INLINE_BYTES else [ray.put(block)]
        self.peers[dest].deliver.remote(self.pid, self.run, key, payload)

    def receive(self, key: tuple) -> np.ndarray:
        payload = self.mailbox.take(self.pid, self.run, key, self.deadline)
        if isinstance(payload, list):  # an ObjectRef, wrapped so that Ray passes it unresolved
            return ray.get(payload[0], timeout=max(self.deadline - time.monotonic(), 0.0))
        return payload


class _Part:
    """One worker's share of a TaskGraph: its tasks, plus a send or a receive per crossing move.

    Location 0 of the local loop computes and sends; location 1 receives, in task
    order, so that the earliest unfinished task of the whole graph can always run.
    """

    def __init__(self, tg: TaskGraph, me: int, rank: list[float]) -> None:
        self.ids = [t for t, task in enumerate(tg.tasks)
                    if task.loc == me or (isinstance(task, MoveTask) and task.src == me)]
        self.index = {t: k for k, t in enumerate(self.ids)}
        self.inputs: list[tuple[int, ...]] = []
        self.location: list[int] = []
        self.rank: list[float] = []
        self.steps = []
        for t in self.ids:
            task = tg.tasks[t]
            crossing = isinstance(task, MoveTask) and task.src != task.loc
            receive = crossing and task.loc == me
            self.inputs.append(() if receive else tuple(self.index[i] for i in task.inputs))
            self.location.append(1 if receive else 0)
            self.rank.append(-float(t) if receive else rank[t])
            if receive:
                self.steps.append(lambda args, run, key=("move", t): run.receive(key))
            elif crossing:
                self.steps.append(_sender(t, task))
            else:
                step = local.PREPARE[type(task)](task)
                self.steps.append(lambda args, run, step=step: step(args, run.feeds, run.variables))
        self.describe = [f"%{t} @{tg.tasks[t].loc} {tg.tasks[t].describe()}" for t in self.ids]
        native.flush()  # the compiled kernels, built together, at prepare


def _sender(t: int, task: MoveTask):
    box = slices(task.box)

    def send(args, run):
        run.send(task.loc, ("move", t), args[0][box])

    return send


@ray.remote(max_concurrency=16, max_restarts=0, num_cpus=0)
class _Worker:
    """A planned worker: holds its parts of programs, its resident blocks and its mailbox."""

    def __init__(self) -> None:
        # one BLAS thread per worker, set once: this process is the worker's own
        self._blas = threadpool_limits(1, user_api="blas")
        self.mailbox = _Mailbox()
        self.parts: dict[str, _Part] = {}
        self.peers: dict[str, list] = {}
        self.store: dict[tuple, np.ndarray] = {}

    def setup(self, pid: str, program: tuple[TaskGraph, list[float]], me: int, peers: list) -> str:
        tg, rank = program
        self.parts[pid] = _Part(tg, me, rank)
        self.peers[pid] = peers
        return ray.get_runtime_context().get_node_id()

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
            fetch: list[int], carry: list[tuple[int, tuple]], timeout: float) -> tuple[str, object]:
        """Run this worker's part; return ("ok", fetched blocks) or ("error" | "aborted", message)."""
        part = self.parts[pid]
        ctx = _Run(pid, run, {}, variables, self.mailbox, self.peers[pid], timeout)
        try:
            for key, box, dest, msg in sends:  # resident pieces others read: send before waiting on any
                ctx.send(dest, msg, self.store[key][slices(box)])
            ctx.feeds = {name: Blocks(shape, dtype, {box: self._piece(ctx, source) for box, source in pieces})
                         for name, (shape, dtype, pieces) in feeds.items()}
            keep = {part.index[t] for t in fetch} | {part.index[t] for t, _ in carry}
            values = scheduler.run(part.inputs, lambda i, args: part.steps[i](args, ctx),
                                   location=part.location, workers=2, keep=keep, rank=part.rank,
                                   describe=lambda i: part.describe[i])
        except (EngineError, _Aborted, TimeoutError, KeyError) as err:
            cause = err.__cause__ if isinstance(err, EngineError) else err
            kind = "aborted" if isinstance(cause, _Aborted) else "error"
            return kind, f"{type(err).__name__}: {err}"
        finally:
            self.mailbox.close(pid, run)
        for t, key in carry:
            self.store[key] = values[part.index[t]]
        return "ok", {t: values[part.index[t]] for t in fetch}

    def _piece(self, ctx: _Run, source: tuple[str, object]) -> np.ndarray:
        where, key = source
        if where == "feed":
            return key
        if where == "msg":
            return ctx.receive(key)
        if key not in self.store:
            raise KeyError(f"resident block {key[2:]} is not held here")
        return self.store[key]


class RayBlocks(Blocks):
    """A tensor whose blocks stay in the actors between runs; ``get`` fetches through the driver."""

    def __init__(self, program: RayProgram, name: str, shape, dtype: str,
                 where: dict[Box, tuple[int, int, tuple]]) -> None:
        super().__init__(shape, dtype, {})
        self.program, self.name = program, name
        self.where = where  # box -> (worker, actor generation, key in its store)
        by_worker = defaultdict(list)
        for w, _, key in where.values():
            by_worker[w].append(key)
        held = [(program.actors[w], keys) for w, keys in by_worker.items()]
        self._finalizer = weakref.finalize(self, _drop, held)
        self._finalizer.atexit = False

    def get(self, box: Box) -> np.ndarray:
        self.program.check_resident(self)
        wanted = [(have, w, key) for have, (w, _, key) in self.where.items()
                  if intersect(have, box) is not None]
        refs = [self.program.actors[w].get.remote([key]) for _, w, key in wanted]
        try:
            arrays = ray.get(refs, timeout=self.program.timeout)
        except RayActorError as err:
            raise EngineError(f"resident tensor {self.name!r} was lost: a worker holding it died "
                              f"({type(err).__name__})") from err
        got = {have: array[0] for (have, _, _), array in zip(wanted, arrays, strict=True)}
        return Blocks(self.shape, self.dtype, got).get(box)

    def __repr__(self) -> str:
        return f"RayBlocks({self.name!r}, {self.dtype}{list(self.shape)}, {len(self.where)} blocks)"


# The long-lived actors of this driver, by (Ray job, node, core): every program reuses them, and
# holding their handles here keeps Ray from collecting them between programs.
_ACTORS: dict[tuple[str, str, int], object] = {}


def _drop(held: list) -> None:
    if ray.is_initialized():
        for actor, keys in held:
            actor.drop.remote(keys)


def _forget(actors: list, pid: str) -> None:
    if ray.is_initialized():
        for actor in actors:
            if actor is not None:
                actor.forget.remote(pid)


def connect(address: str | None = None) -> None:
    """Join the Ray cluster at ``address``, or the one already joined, or start a local one."""
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, configure_logging=False)


def live_nodes(address: str | None = None) -> list[dict]:
    """The live Ray nodes with CPUs, the driver's node first (joining the cluster if not yet joined).

    ``es.Cluster.from_ray`` reads the cluster's shape from these, so plan and engine agree.
    """
    connect(address)
    here = ray.get_runtime_context().get_node_id()
    alive = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) >= 1]
    alive.sort(key=lambda n: (n["NodeID"] != here, n["NodeID"]))
    return alive


def nodes(machines: int) -> list[dict]:
    """The Ray nodes that host the plan's machines."""
    alive = live_nodes()
    if len(alive) < machines:
        raise EngineError(f"the plan has {machines} machines but the Ray cluster has {len(alive)} live "
                          "node(s) with CPUs; plan with es.Cluster.from_ray()")
    return alive[:machines]


class RayProgram:
    """A TaskGraph set up on the actors once, then run many times."""

    def __init__(self, tg: TaskGraph, address: str | None = None, timeout: float = TIMEOUT) -> None:
        connect(address)
        self.tg, self.timeout = tg, timeout
        self.pid = uuid.uuid4().hex[:12]
        self.nodes = [n["NodeID"] for n in nodes(tg.workers // tg.cores)]
        tasks = tg.tasks
        rank = scheduler.critical_path([t.inputs for t in tasks], [local.task_cost(t) for t in tasks])
        self._program = ray.put((tg, rank))
        self.inputs = defaultdict(list)  # worker -> [(name, box, dtype)] of the graph inputs it reads
        for task in tasks:
            if isinstance(task, InputTask) and (task.name, task.box, task.dtype) not in self.inputs[task.loc]:
                self.inputs[task.loc].append((task.name, task.box, task.dtype))
        self.actors: list = [None] * tg.workers
        self.generation = [0] * tg.workers
        self.lost: set[int] = set(range(tg.workers))
        self._runs = itertools.count()
        weakref.finalize(self, _forget, self.actors, self.pid).atexit = False
        self._revive()

    def _revive(self) -> None:
        """(Re)create the actors of lost workers on their nodes and give every actor the new peers."""
        if not self.lost:
            return
        cores = self.tg.cores
        for w in sorted(self.lost):
            slot = self._slot(w)
            if self.actors[w] is not None and _ACTORS.get(slot) is self.actors[w]:  # dead or stuck: replace
                ray.kill(_ACTORS.pop(slot), no_restart=True)
            if slot not in _ACTORS:
                _ACTORS[slot] = _Worker.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(slot[1], soft=False)).remote()
            self.actors[w] = _ACTORS[slot]
            self.generation[w] += 1
        calls = [self.actors[w].setup.remote(self.pid, self._program, w, self.actors) if w in self.lost
                 else self.actors[w].set_peers.remote(self.pid, self.actors) for w in range(self.tg.workers)]
        try:
            ray.get(calls, timeout=START_TIMEOUT)
        except (GetTimeoutError, RayActorError) as err:
            where = [self.nodes[w // cores][:8] for w in sorted(self.lost)]
            raise EngineError(f"could not start the Ray workers {sorted(self.lost)} on nodes {where} "
                              f"within {START_TIMEOUT:.0f} s: {err}") from err
        self.lost.clear()

    def _slot(self, w: int) -> tuple[str, str, int]:
        return ray.get_runtime_context().get_job_id(), self.nodes[w // self.tg.cores], w % self.tg.cores

    def check_resident(self, blocks: RayBlocks) -> None:
        """Resident state on a worker that died (and was restarted) is lost: say so."""
        gone = sorted({w for w, gen, _ in blocks.where.values()
                       if w in self.lost or gen != self.generation[w]})
        if gone:
            raise EngineError(f"resident tensor {blocks.name!r} was lost: worker(s) {gone} holding its "
                              "blocks died; restore it from a checkpoint (start a new session)")

    def run(self, feeds: dict[str, object], variables: dict[str, float] | None = None,
            carry: frozenset[str] = frozenset()) -> dict[str, np.ndarray | Blocks]:
        """Run once on the actors; outputs in ``carry`` stay there as ``RayBlocks``."""
        # an actor another program found dead and replaced is lost to this one too
        self.lost |= {w for w in range(self.tg.workers) if _ACTORS.get(self._slot(w)) is not self.actors[w]}
        resident = [v for v in feeds.values() if isinstance(v, RayBlocks) and v.program is self]
        for blocks in resident:
            self.check_resident(blocks)
        self._revive()
        run = next(self._runs)
        workers = range(self.tg.workers)
        inputs, sends = self._feeds(feeds)
        fetch: dict[int, list[int]] = defaultdict(list)
        stores: dict[int, list[tuple[int, tuple]]] = defaultdict(list)
        for name, out in self.tg.outputs.items():
            for t, box in out.blocks:
                loc = self.tg.tasks[t].loc
                if name in carry:
                    stores[loc].append((t, (self.pid, run, name, box)))
                elif t not in fetch[loc]:
                    fetch[loc].append(t)
        calls = {self.actors[w].run.remote(self.pid, run, inputs[w], sends[w], variables or {}, fetch[w],
                                           stores[w], self.timeout): w for w in workers}
        results, failure = self._wait(run, calls)
        if failure is not None:
            for w, (status, _) in results.items():  # what the survivors stored for this run is void
                if status == "ok" and stores[w]:
                    self.actors[w].drop.remote([key for _, key in stores[w]])
            raise EngineError(failure)
        values = {t: block for _, blocks in results.values() for t, block in blocks.items()}
        result: dict[str, np.ndarray | Blocks] = {}
        for name, out in self.tg.outputs.items():
            if name in carry:
                where = {box: (self.tg.tasks[t].loc, self.generation[self.tg.tasks[t].loc],
                               (self.pid, run, name, box)) for t, box in out.blocks}
                result[name] = RayBlocks(self, name, out.shape, out.dtype, where)
            else:
                result[name] = assemble(out, values)
        return result

    def _feeds(self, feeds: dict[str, object]) -> tuple[dict[int, dict], dict[int, list]]:
        """Per worker: the pieces of each input it reads, and the resident pieces it must send."""
        inputs: dict[int, dict] = defaultdict(dict)
        sends: dict[int, list] = defaultdict(list)
        for w, wanted in self.inputs.items():
            for name, box, dtype in wanted:
                value = feeds[name]
                if not (isinstance(value, RayBlocks) and value.program is self):
                    piece = value.get(box) if isinstance(value, Blocks) else value[slices(box)]
                    pieces = [(box, ("feed", np.asarray(piece)))]
                else:
                    pieces = []
                    for have, (holder, _, key) in value.where.items():
                        meet = intersect(have, box)
                        if meet is None:
                            continue
                        if holder == w:
                            pieces.append((have, ("store", key)))
                        else:
                            msg = ("resident", name, meet)
                            sends[holder].append((key, within(meet, have), w, msg))
                            pieces.append((meet, ("msg", msg)))
                entry = inputs[w].setdefault(name, (value.shape, dtype, []))
                entry[2].extend(p for p in pieces if p[0] not in {q[0] for q in entry[2]})
        return inputs, sends

    def _wait(self, run: int, calls: dict) -> tuple[dict[int, tuple[str, object]], str | None]:
        """Collect every worker's result; after the first failure abort the rest, then say what failed."""
        deadline = time.monotonic() + self.timeout
        pending, results, dead = list(calls), {}, {}
        aborting = False
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(deadline - time.monotonic(), 0))
            if not ready:
                break
            w = calls[ready[0]]
            try:
                results[w] = ray.get(ready[0])
            except RayActorError as err:
                dead[w] = err
            except RayTaskError as err:  # a bug outside the kernels; report it like a failed task
                results[w] = ("error", str(err))
            if not aborting and (dead or results[w][0] != "ok"):
                aborting = True  # survivors waiting on the failed worker stop at once
                for ref in pending:
                    self.actors[calls[ref]].abort.remote(self.pid, run)
                deadline = min(deadline, time.monotonic() + ABORT_GRACE)
        hung = sorted(calls[ref] for ref in pending)
        if not aborting and not hung:
            return results, None
        self.lost |= set(dead) | set(hung)
        return results, self._failure(dead, results, hung)

    def _failure(self, dead: dict, results: dict, hung: list[int]) -> str:
        lines = []
        for w, err in sorted(dead.items()):
            mine = [t for t, task in enumerate(self.tg.tasks) if task.loc == w]
            shown = ", ".join(f"%{t} ({self.tg.tasks[t].describe()})" for t in mine[:6])
            more = f" and {len(mine) - 6} more" if len(mine) > 6 else ""
            node = self.nodes[w // self.tg.cores][:8]
            lines.append(f"worker {w} (Ray actor on node {node}) died during the run; its {len(mine)} "
                         f"task(s) and their blocks are lost: {shown}{more} [{type(err).__name__}]")
        lines += [f"worker {w} did not finish within {self.timeout:.0f} s" for w in hung]
        lines += [f"worker {w}: {msg}" for w, (status, msg) in sorted(results.items()) if status == "error"]
        lines.append("the run was abandoned and nothing it computed was kept; "
                     "the next run restarts lost workers")
        return "\n".join(lines)
