"""A TaskGraph set up on the Ray actors once and run many times, and the state it leaves there.

Per run the driver ships each machine the input blocks its workers read, submits one
actor call per machine, waits for all (aborting the rest after the first failure) and
fetches the requested outputs; carried outputs stay in the actors as ``RayBlocks``.
"""

from __future__ import annotations

import itertools
import time
import uuid
import weakref
from collections import defaultdict
from pathlib import Path

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from einsummable.engines import trace as timeline
from einsummable.engines.blocks import Blocks, assemble
from einsummable.engines.ray.actor import Machine, contiguous
from einsummable.engines.ray.layout import Layout, whole
from einsummable.engines.ray_nodes import connect, nodes
from einsummable.errors import EngineError
from einsummable.ir.box import Box, intersect, slices, within
from einsummable.lower.taskgraph import TaskGraph

TIMEOUT = 3600.0  # seconds a run may take before it is abandoned with an error
START_TIMEOUT = 120.0  # seconds to create and set up the actors
ABORT_GRACE = 30.0  # seconds the survivors of a failed run get to stop


class RayBlocks(Blocks):
    """A tensor whose blocks stay in the actors between runs; ``get`` fetches through the driver."""

    def __init__(self, program: RayProgram, name: str, shape, dtype: str,
                 where: dict[Box, tuple[int, int, tuple]]) -> None:
        super().__init__(shape, dtype, {})
        self.program, self.name = program, name
        self.where = where  # box -> (machine, actor generation, key in its store)
        self.job = program.job  # the Ray session that holds them: ray.shutdown() ends it
        by_machine = defaultdict(list)
        for m, _, key in where.values():
            by_machine[m].append(key)
        held = [(program.actors[m], keys) for m, keys in by_machine.items()]
        self._finalizer = weakref.finalize(self, _drop, held, self.job)
        self._finalizer.atexit = False

    def get(self, box: Box) -> np.ndarray:
        self.program.check_resident(self)
        wanted = [(have, m, key) for have, (m, _, key) in self.where.items()
                  if intersect(have, box) is not None]
        refs = [self.program.actors[m].get.remote([key]) for _, m, key in wanted]
        try:
            arrays = ray.get(refs, timeout=self.program.timeout)
        except RayActorError as err:
            raise EngineError(f"resident tensor {self.name!r} was lost: a machine holding it died "
                              f"({type(err).__name__})") from err
        got = {have: array[0] for (have, _, _), array in zip(wanted, arrays, strict=True)}
        return Blocks(self.shape, self.dtype, got).get(box)

    def __repr__(self) -> str:
        return f"RayBlocks({self.name!r}, {self.dtype}{list(self.shape)}, {len(self.where)} blocks)"


# The long-lived actors of this driver, by (Ray job, node): every program reuses them, and
# holding their handles here keeps Ray from collecting them between programs.
_ACTORS: dict[tuple[str, str], object] = {}


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


def _job() -> str | None:
    """The Ray session this driver is in (None: none): handles and objects of another are void."""
    return ray.get_runtime_context().get_job_id() if ray.is_initialized() else None


def _drop(held: list, job: str) -> None:
    if _job() == job:
        for actor, keys in held:
            actor.drop.remote(keys)


def _forget(actors: list, pid: str, job: str) -> None:
    if _job() == job:
        for actor in actors:
            if actor is not None:
                actor.forget.remote(pid)


class _FoundDead(EngineError):
    """Every machine that failed a run was dead before it started: nothing ran, so it may run again."""


def _write_trace(path: str | Path, events: dict[int, list], cores: int) -> None:
    """The actors' measured events on one timeline, from the earliest start."""
    origin = min((e[2] for machine in events.values() for e in machine), default=0.0)
    out = [timeline.Event(name, m, lane, start - origin, end - origin)
           for m, machine in sorted(events.items()) for name, lane, start, end in machine]
    lanes = {(e.process, e.thread): "receives" if e.thread == cores else f"core {e.thread}" for e in out}
    timeline.write(out, path, lanes, f"measured on Ray: {len(out):,} tasks on {len(events)} machine(s)")


def _answered(ping) -> bool:
    """Whether an actor answered the ping sent it just before a run's call."""
    try:
        ray.get(ping, timeout=ABORT_GRACE)
    except (GetTimeoutError, RayActorError):
        return False
    return True


class RayProgram:
    """A TaskGraph (or a two-level plan's shares: layout.py) set up on the machine actors once,
    then run many times."""

    def __init__(self, tg: TaskGraph | Layout, address: str | None = None, timeout: float = TIMEOUT) -> None:
        self.address = address
        self.layout = tg if isinstance(tg, Layout) else whole(tg)
        self.timeout = timeout
        self.machines = self.layout.machines
        self.pid = uuid.uuid4().hex[:12]
        self.inputs = defaultdict(list, self.layout.inputs)  # machine -> [(name, box, dtype)] it reads
        self.actors: list = [None] * self.machines
        self.generation = [0] * self.machines
        self._runs = itertools.count()
        self.job: str | None = None
        self._finalizer: weakref.finalize | None = None
        connect(address)
        self._join()
        self._revive()

    def _join(self) -> None:
        """Take this Ray session's nodes and ship the payloads there, all machines still to start:
        at creation, and again when ``ray.shutdown()`` made the last session's handles void."""
        self.job = _job()
        for slot in [slot for slot in _ACTORS if slot[0] != self.job]:  # actors of an ended session
            del _ACTORS[slot]
        hosts = nodes(self.machines)
        self.nodes = [n["NodeID"] for n in hosts]
        self.cpus = [int(n["Resources"]["CPU"]) for n in hosts]
        refs: dict[int, object] = {}  # one put per payload: a whole TaskGraph is shared by every actor
        self._programs = [refs.setdefault(id(p), ray.put(p)) for p in self.layout.payloads]
        self.actors[:] = [None] * self.machines
        self.lost: set[int] = set(range(self.machines))
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _forget, self.actors, self.pid, self.job)
        self._finalizer.atexit = False

    def _rejoin(self) -> None:
        """After ``ray.shutdown()``: the session joined since, else ``address`` joined again."""
        if _job() == self.job:
            return
        try:
            connect(self.address)
        except (ConnectionError, RuntimeError) as err:
            where = f"at {self.address!r}" if self.address else "(address None: a local one)"
            raise EngineError(f"Ray was shut down since this program was compiled, and joining a Ray cluster "
                              f"{where} again failed: {err}; call ray.init(address=...) first") from err
        self._join()

    def _revive(self) -> None:
        """(Re)create the actors of lost machines on their nodes and give every actor the new peers."""
        if not self.lost:
            return
        slots = {m: self._slot(m) for m in sorted(self.lost)}
        for m, slot in slots.items():
            if self.actors[m] is not None and _ACTORS.get(slot) is self.actors[m]:  # dead or stuck: replace
                ray.kill(_ACTORS.pop(slot), no_restart=True)
        # actors this program did not see die may have died under another program, or between runs
        shared = sorted({slot for slot in slots.values() if slot in _ACTORS})
        for slot in _unresponsive([_ACTORS[slot] for slot in shared], shared):
            ray.kill(_ACTORS.pop(slot), no_restart=True)
        for m, slot in slots.items():
            if slot not in _ACTORS:
                _ACTORS[slot] = Machine.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(slot[1], soft=False)).remote()
            self.actors[m] = _ACTORS[slot]
            self.generation[m] += 1
        calls = [self.actors[m].setup.remote(self.pid, self._programs[m], m, self.actors, self.cpus[m])
                 if m in self.lost
                 else self.actors[m].set_peers.remote(self.pid, self.actors) for m in range(self.machines)]
        try:
            ray.get(calls, timeout=START_TIMEOUT)
        except (GetTimeoutError, RayActorError) as err:
            where = [self.nodes[m][:8] for m in sorted(self.lost)]
            raise EngineError(f"could not start the Ray actors of machines {sorted(self.lost)} on nodes "
                              f"{where} within {START_TIMEOUT:.0f} s: {err}") from err
        self.lost.clear()

    def _slot(self, m: int) -> tuple[str, str]:
        return ray.get_runtime_context().get_job_id(), self.nodes[m]

    def check_resident(self, blocks: RayBlocks) -> None:
        """Resident state on a machine that died (and was restarted), or in a Ray session since
        shut down, is lost: say so."""
        if blocks.job != _job():
            raise EngineError(f"resident tensor {blocks.name!r} was lost: Ray was shut down since it was "
                              "stored, and its actors with it; restore it from a checkpoint (start a new "
                              "session)")
        gone = sorted({m for m, gen, _ in blocks.where.values()
                       if m in self.lost or gen != self.generation[m]})
        if gone:
            raise EngineError(f"resident tensor {blocks.name!r} was lost: machine(s) {gone} holding its "
                              "blocks died; restore it from a checkpoint (start a new session)")

    def run(self, feeds: dict[str, object], variables: dict[str, float] | None = None,
            carry: frozenset[str] = frozenset(),
            trace: str | Path | None = None) -> dict[str, np.ndarray | Blocks]:
        """Run once on the actors; outputs in ``carry`` stay there as ``RayBlocks``. A machine found
        dead when the run started ran nothing: it is restarted and the run made again, once.
        ``trace``: write each task each actor ran, measured there, as the local engine does
        (engines/trace.py); a move between machines shows as its send and its receive."""
        self._rejoin()
        try:
            return self._attempt(feeds, variables or {}, carry, trace)
        except _FoundDead as found:
            try:
                return self._attempt(feeds, variables or {}, carry, trace)
            except EngineError as err:
                raise EngineError(f"{err}\n{found}") from err

    def _attempt(self, feeds: dict[str, object], variables: dict[str, float],
                 carry: frozenset[str], trace: str | Path | None) -> dict[str, np.ndarray | Blocks]:
        # an actor another program found dead and replaced is lost to this one too
        self.lost |= {m for m in range(self.machines) if _ACTORS.get(self._slot(m)) is not self.actors[m]}
        for blocks in [v for v in feeds.values() if isinstance(v, RayBlocks)]:
            blocks.program.check_resident(blocks)
        self._revive()
        run = next(self._runs)
        inputs, sends = self._feeds(feeds)
        fetch: dict[int, list[int]] = defaultdict(list)
        stores: dict[int, list[tuple[int, tuple]]] = defaultdict(list)
        for name, out in self.layout.outputs.items():
            for t, box in out.blocks:
                m = int(self.layout.machine[t])
                if name in carry:
                    stores[m].append((t, (self.pid, run, name, box)))
                elif t not in fetch[m]:
                    fetch[m].append(t)
        # answered first while the actor lives: a failed run tells a machine dead before it from one
        # that died during it (the reply costs nothing on the way: it is not waited for)
        pings = [self.actors[m].ping.remote() for m in range(self.machines)]
        calls = {self.actors[m].run.remote(self.pid, run, inputs[m], sends[m], variables, fetch[m],
                                           stores[m], self.timeout, trace is not None): m
                 for m in range(self.machines)}
        results, failure = self._wait(run, calls, pings)
        if failure is not None:
            for m, (status, _) in results.items():  # what the survivors stored for this run is void
                if status == "ok" and stores[m]:
                    self.actors[m].drop.remote([key for _, key in stores[m]])
            raise failure
        values = {t: block for _, (blocks, _) in results.values() for t, block in blocks.items()}
        if trace is not None:
            _write_trace(trace, {m: events for m, (_, (_, events)) in results.items()}, self.layout.cores)
        result: dict[str, np.ndarray | Blocks] = {}
        for name, out in self.layout.outputs.items():
            if name in carry:
                machine = [int(self.layout.machine[t]) for t, _ in out.blocks]
                where = {box: (m, self.generation[m], (self.pid, run, name, box))
                         for m, (_, box) in zip(machine, out.blocks, strict=True)}
                result[name] = RayBlocks(self, name, out.shape, out.dtype, where)
            else:
                result[name] = assemble(out, values)
        return result

    def _feeds(self, feeds: dict[str, object]) -> tuple[dict[int, dict], dict[int, list]]:
        """Per machine: the pieces of each input its workers read, and the resident pieces it must send."""
        inputs: dict[int, dict] = defaultdict(dict)
        sends: dict[int, list] = defaultdict(list)
        for m, wanted in self.inputs.items():
            for name, box, dtype in wanted:
                value = feeds[name]
                entry = inputs[m].setdefault(name, (value.shape, dtype, []))
                have_boxes = {p[0] for p in entry[2]}
                mine = self._holders(value)
                if mine is None:
                    piece = value.get(box) if isinstance(value, Blocks) else value[slices(box)]
                    if box not in have_boxes:
                        entry[2].append((box, ("feed", contiguous(piece))))
                    continue
                for have, (theirs, _, key) in value.where.items():
                    meet = intersect(have, box)
                    if meet is None:
                        continue
                    holder = mine[theirs]
                    if holder == m:
                        meet, source = have, ("store", key)
                    else:
                        source = ("msg", ("resident", name, meet))
                        if meet not in have_boxes:
                            sends[holder].append((key, within(meet, have), m, source[1]))
                    if meet not in have_boxes:
                        entry[2].append((meet, source))
                        have_boxes.add(meet)
        return inputs, sends

    def _holders(self, value: object) -> dict[int, int] | None:
        """The machines of this program that hold ``value``'s blocks, by the machine of the program
        that left them: resident state another program left on the same actors (a session bound
        to another's) is read where it lies. None: the driver feeds it."""
        if not isinstance(value, RayBlocks):
            return None
        mine = {id(actor): m for m, actor in enumerate(self.actors)}
        holders = {}
        for theirs, _, _ in value.where.values():
            m = mine.get(id(value.program.actors[theirs]))
            if m is None:
                return None
            holders[theirs] = m
        return holders

    def _wait(self, run: int, calls: dict,
              pings: list) -> tuple[dict[int, tuple[str, object]], EngineError | None]:
        """Collect every machine's result; after the first failure abort the rest, then say what failed."""
        deadline = time.monotonic() + self.timeout
        pending, results, dead = list(calls), {}, {}
        aborting = False
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(deadline - time.monotonic(), 0))
            if not ready:
                break
            m = calls[ready[0]]
            try:
                results[m] = ray.get(ready[0])
            except RayActorError as err:
                dead[m] = err
            except RayTaskError as err:  # a bug outside the kernels; report it like a failed task
                results[m] = ("error", str(err))
            if not aborting and (dead or results[m][0] != "ok"):
                aborting = True  # survivors waiting on the failed machine stop at once
                for ref in pending:
                    self.actors[calls[ref]].abort.remote(self.pid, run)
                deadline = min(deadline, time.monotonic() + ABORT_GRACE)
        hung = sorted(calls[ref] for ref in pending)
        if not aborting and not hung:
            return results, None
        self.lost |= set(dead) | set(hung)
        before = {m for m in dead if not _answered(pings[m])}
        errors = [m for m, (status, _) in results.items() if status == "error"]
        message = self._failure(dead, before, results, hung)
        retry = before == set(dead) and not hung and not errors
        return results, _FoundDead(message) if retry else EngineError(message)

    def _failure(self, dead: dict, before: set[int], results: dict, hung: list[int]) -> str:
        lines = []
        for m, err in sorted(dead.items()):
            first, last = m * self.layout.cores, (m + 1) * self.layout.cores - 1
            which = f"machine {m} (workers {first}..{last}, Ray actor on node {self.nodes[m][:8]})"
            if m in before:
                lines.append(f"{which} was found dead before the run started: it ran nothing, and lost "
                             f"nothing of this run [{type(err).__name__}]")
                continue
            mine = np.flatnonzero(self.layout.machine == m).tolist()
            shown = ", ".join(f"%{t} ({self.layout.describe(t)})" for t in mine[:6])
            more = f" and {len(mine) - 6} more" if len(mine) > 6 else ""
            lines.append(f"{which} died during the run; its {len(mine)} task(s) and their blocks are lost: "
                         f"{shown}{more} [{type(err).__name__}]")
        lines += [f"machine {m} did not finish within {self.timeout:.0f} s" for m in hung]
        lines += [f"machine {m}: {msg}" for m, (status, msg) in sorted(results.items()) if status == "error"]
        lines.append("the run was abandoned and nothing it computed was kept; "
                     "the next run restarts lost machines")
        return "\n".join(lines)
