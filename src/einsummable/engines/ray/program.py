"""A TaskGraph set up on the Ray actors once and run many times, and the state it leaves there.

Per run the driver ships each worker the input blocks it reads, submits one actor call
per worker, waits for all (aborting the rest after the first failure) and fetches the
requested outputs; carried outputs stay in the actors as ``RayBlocks``.
"""

from __future__ import annotations

import itertools
import time
import uuid
import weakref
from collections import defaultdict

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from einsummable.engines import local, scheduler
from einsummable.engines.blocks import Blocks, assemble
from einsummable.engines.ray.actor import Worker
from einsummable.engines.ray.nodes import connect, nodes
from einsummable.errors import EngineError
from einsummable.ir.box import Box, intersect, slices, within
from einsummable.lower.taskgraph import InputTask, TaskGraph

TIMEOUT = 3600.0  # seconds a run may take before it is abandoned with an error
START_TIMEOUT = 120.0  # seconds to create and set up the actors
ABORT_GRACE = 30.0  # seconds the survivors of a failed run get to stop


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


def _unresponsive(actors: list, slots: list) -> list:
    """The slots whose actor does not answer a ping: dead, or stuck past START_TIMEOUT."""
    refs = [actor.ping.remote() for actor in actors]
    ray.wait(refs, num_returns=len(refs), timeout=START_TIMEOUT)
    out = []
    for slot, ref in zip(slots, refs, strict=True):
        try:
            ray.get(ref, timeout=0)
        except (GetTimeoutError, RayActorError):
            out.append(slot)
    return out


def _drop(held: list) -> None:
    if ray.is_initialized():
        for actor, keys in held:
            actor.drop.remote(keys)


def _forget(actors: list, pid: str) -> None:
    if ray.is_initialized():
        for actor in actors:
            if actor is not None:
                actor.forget.remote(pid)


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
        slots = {w: self._slot(w) for w in sorted(self.lost)}
        for w, slot in slots.items():
            if self.actors[w] is not None and _ACTORS.get(slot) is self.actors[w]:  # dead or stuck: replace
                ray.kill(_ACTORS.pop(slot), no_restart=True)
        # actors this program did not see die may have died under another program, or between runs
        shared = sorted({slot for slot in slots.values() if slot in _ACTORS})
        for slot in _unresponsive([_ACTORS[slot] for slot in shared], shared):
            ray.kill(_ACTORS.pop(slot), no_restart=True)
        for w, slot in slots.items():
            if slot not in _ACTORS:
                _ACTORS[slot] = Worker.options(
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
        for blocks in [v for v in feeds.values() if isinstance(v, RayBlocks)]:
            blocks.program.check_resident(blocks)
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
                mine = self._holders(value)
                if mine is None:
                    piece = value.get(box) if isinstance(value, Blocks) else value[slices(box)]
                    pieces = [(box, ("feed", np.asarray(piece)))]
                else:
                    pieces = []
                    for have, (theirs, _, key) in value.where.items():
                        meet = intersect(have, box)
                        if meet is None:
                            continue
                        holder = mine[theirs]
                        if holder == w:
                            pieces.append((have, ("store", key)))
                        else:
                            msg = ("resident", name, meet)
                            sends[holder].append((key, within(meet, have), w, msg))
                            pieces.append((meet, ("msg", msg)))
                entry = inputs[w].setdefault(name, (value.shape, dtype, []))
                entry[2].extend(p for p in pieces if p[0] not in {q[0] for q in entry[2]})
        return inputs, sends

    def _holders(self, value: object) -> dict[int, int] | None:
        """The workers of this program that hold ``value``'s blocks, by the worker of the program
        that left them: resident state another program left on the same actors (a session bound
        to another's) is read where it lies. None: the driver feeds it."""
        if not isinstance(value, RayBlocks):
            return None
        mine = {id(actor): w for w, actor in enumerate(self.actors)}
        holders = {}
        for theirs, _, _ in value.where.values():
            w = mine.get(id(value.program.actors[theirs]))
            if w is None:
                return None
            holders[theirs] = w
        return holders

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
