"""One machine's share of the cluster-level graph, lowered to its cores there (issue 17).

On a cluster of many machines the driver lowers the machine-level plan only
(lower/cluster.py: one task per machine-level block, every move crossing machines)
and hands each machine its ``Share``: its tasks, the moves out of it (sends) and
into it (receives), and which of its blocks are outputs. The machine then lowers
its share to its cores (``refine``), in its own process, so no process ever holds
the core-level graph of the whole cluster:

- an apply of node v is cut into the core blocks of the plan's ``cc[v]``, nested in
  its machine-level block as plan/twolevel.py's ``nested`` cuts them; each core block
  reads its operands' sub-boxes (views: moves inside a machine) and the partial sums
  of the dimensions cut within the machine are added on the first one's core;
- a block stays as its core blocks: a reader whose box is one of them, or lies in
  one, takes it (or a view of it); only a box spanning several is assembled (a
  partial), once per box and core;
- inputs, constants, partials and views stay one task each (on the cores in turn);
  a receive is an input task whose name starts with ``RECEIVE``, a send a move in
  place of the box to send; the runner (engines/machine.py) makes them the mailbox
  and the delivery to the peer.

A half-precision sum is not cut along its summed dimensions inside a machine: its
partial sums would round before they meet (lowering keeps them in f32 instead).
With ``cc`` all ones and one core the refinement is the share itself.

    cg, shares = machine_shares(plan)   # in the driver: split(lower_blocks(machine_plan(plan)), ...)
    refined = refine(shares[m])         # on machine m: a TaskGraph over its cores
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from einsummable.ir.box import Box, box_shape, intersect, whole, within
from einsummable.ir.dtypes import HALF
from einsummable.ir.graph import Piece
from einsummable.lower.blockwise import lower_blocks
from einsummable.lower.cluster import levels, machine_plan
from einsummable.lower.compact import APPLY, MOVE, CompactGraph
from einsummable.lower.taskgraph import (
    ApplyTask,
    ConstantTask,
    InputTask,
    MoveTask,
    PartialTask,
    Task,
    TaskGraph,
    ViewTask,
)
from einsummable.plan.partition import split as cuts
from einsummable.plan.plan import Plan

Counts = tuple[int, ...]
RECEIVE = "\0receive"  # the name of a receive's placeholder input task


@dataclass(frozen=True, eq=False)
class Share:
    """Machine ``machine``'s part of a cluster-level graph, in its ids (``ids[i]`` is ``tasks[i]``)."""

    machine: int
    cores: int
    ids: tuple[int, ...]
    tasks: tuple[Task, ...]  # its tasks; a move whose ``loc`` is another machine is a send, one from
    # another machine a receive (its input id names a task elsewhere)
    split: tuple[Counts | None, ...]  # per task: core blocks per join dimension of an apply, else None
    outputs: tuple[int, ...]  # ids of its tasks whose blocks some output holds

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, eq=False)
class Refined:
    """A share lowered to the machine's cores: a TaskGraph of one machine, and its endpoints."""

    graph: TaskGraph  # workers == cores == the machine's cores
    receive: dict[int, int]  # refined task -> the cluster-level move it receives
    send: dict[int, tuple[int, int]]  # refined task -> (the cluster-level move, destination machine)
    held: dict[int, int]  # cluster-level output task -> refined task holding its whole block


def machine_shares(plan: Plan) -> tuple[CompactGraph, list[Share]]:
    """The machine-level graph of a two-level ``plan`` and each machine's share of it."""
    cg = lower_blocks(machine_plan(plan))
    return cg, split(cg, levels(plan).cc, plan.cluster.cores)


def split(cg: CompactGraph, cc: Sequence[Counts], cores: int) -> list[Share]:
    """Each machine's share of ``cg`` (workers are machines), with ``cc``: the plan's core counts per node."""
    out_ids = {t for o in cg.outputs.values() for t, _ in o.blocks}
    kind, node = cg.kind, cg.node
    shares = []
    for m in range(cg.workers):
        ids = np.flatnonzero((cg.loc == m) | ((kind == MOVE) & (cg.src == m))).tolist()
        tasks = tuple(cg.task(t) for t in ids)
        counts = tuple(cc[node[t]] if kind[t] == APPLY and node[t] >= 0 else None for t in ids)
        mine = tuple(t for t in ids if t in out_ids and cg.loc[t] == m)
        shares.append(Share(m, cores, tuple(ids), tasks, counts, mine))
    return shares


class _Refine:
    def __init__(self, share: Share) -> None:
        self.share, self.cores = share, share.cores
        self.tasks: list[Task] = []
        self.pieces: dict[int, list[tuple[Box, int]]] = {}  # cluster-level task -> its core blocks
        self.cache: dict[tuple, int] = {}
        self.turn = 0
        self.receive: dict[int, int] = {}
        self.send: dict[int, tuple[int, int]] = {}

    def add(self, task: Task) -> int:
        self.tasks.append(task)
        return len(self.tasks) - 1

    def next_core(self, n: int = 1) -> int:
        core, self.turn = self.turn, (self.turn + n) % self.cores
        return core

    def at(self, r: int, core: int, box: Box | None = None) -> int:
        """Refined task r (or its ``box``) at ``core``: r itself, or a move (a view in one process)."""
        task = self.tasks[r]
        if task.loc == core and (box is None or box == whole(task.shape)):
            return r
        key = ("at", r, core, box)
        if key not in self.cache:
            box = box or whole(task.shape)
            self.cache[key] = self.add(MoveTask((r,), box, task.loc, core, task.dtype))
        return self.cache[key]

    def read(self, t: int, box: Box, core: int) -> int:
        """A refined task at ``core`` holding ``box`` of cluster-level task t's block."""
        pieces = self.pieces[t]
        for have, r in pieces:
            if have == box:
                return self.at(r, core)
        for have, r in pieces:
            meet = intersect(have, box)
            if meet == box:
                return self.at(r, core, within(box, have))
        key = ("read", t, box, core)
        if key not in self.cache:
            ins, parts = [], []
            for have, r in pieces:
                meet = intersect(have, box)
                if meet is not None:
                    ins.append(self.at(r, core, within(meet, have)))
                    dst = tuple(a - b for (a, _), (b, _) in zip(meet, box, strict=True))
                    parts.append(Piece(len(parts), whole(box_shape(meet)), dst))
            dtype = self.tasks[pieces[0][1]].dtype
            task = PartialTask(tuple(ins), tuple(parts), box_shape(box), dtype, None, core)
            self.cache[key] = self.add(task)
        return self.cache[key]

    def source(self, t: int, box: Box, core: int) -> tuple[int, Box]:
        """A refined task at ``core`` and the box in it that holds ``box`` of task t's block: the
        core block holding it where one does (a slice read in place), else ``read``'s."""
        for have, r in self.pieces[t]:
            if intersect(have, box) == box:
                return self.at(r, core), within(box, have)
        return self.read(t, box, core), whole(box_shape(box))

    def apply(self, t: int, task: ApplyTask, counts: Counts | None) -> None:
        op, ins = task.op, task.inputs
        shape = op.join_shape
        if counts is None or len(counts) != len(shape):
            counts = (1,) * len(shape)
        counts = tuple(max(1, min(c, n)) for c, n in zip(counts, shape, strict=True))
        if op.dtype in HALF and op.agg in ("add", "mul"):  # half partial sums would round apart
            counts = tuple(c if d < op.out_rank else 1 for d, c in enumerate(counts))
        bounds = [list(itertools.pairwise(cuts(n, c))) for n, c in zip(shape, counts, strict=True)]
        blocks = list(itertools.product(*bounds))
        first = self.next_core(len(blocks))
        sums: dict[Box, list[int]] = {}
        for j, block in enumerate(blocks):
            core = (first + j) % self.cores
            args = tuple(self.read(i, tuple(block[d] for d in idx), core)
                         for i, idx in zip(ins, op.inputs, strict=True))
            sub = op if len(blocks) == 1 else op.block([hi - lo for lo, hi in block])
            r = self.add(ApplyTask(sub, args, core, task.node))
            sums.setdefault(tuple(block[:op.out_rank]), []).append(r)
        pieces = []
        for box, rs in sums.items():
            if len(rs) > 1:
                core = self.tasks[rs[0]].loc
                size = box_shape(box)
                parts = tuple(Piece(k, whole(size), (0,) * len(size)) for k in range(len(rs)))
                rs = [self.add(PartialTask(tuple(self.at(r, core) for r in rs), parts, size, op.dtype, op.agg,
                                           core))]
            pieces.append((box, rs[0]))
        self.pieces[t] = pieces

    def run(self) -> Refined:
        share = self.share
        self.shapes = {t: task.shape for t, task in zip(share.ids, share.tasks, strict=True)}
        for t, task, counts in zip(share.ids, share.tasks, share.split, strict=True):
            me = share.machine
            if isinstance(task, ApplyTask):
                self.apply(t, task, counts)
                continue
            if isinstance(task, MoveTask) and task.src != task.loc:
                if task.loc == me:  # a receive: the block comes whole from the mailbox
                    box = whole(task.shape)
                    r = self.add(InputTask(f"{RECEIVE} %{t}", box, task.dtype, self.next_core()))
                    self.receive[r] = t
                    self.pieces[t] = [(whole(task.shape), r)]
                else:  # a send: the box, made at one core, goes to the peer
                    core = self.next_core()
                    r, box = self.source(task.inputs[0], task.box, core)
                    out = self.add(MoveTask((r,), box, core, core, task.dtype))
                    self.send[out] = (t, task.loc)
                continue
            core = self.next_core()
            if isinstance(task, InputTask | ConstantTask):
                r = self.add(replace(task, loc=core))
            elif isinstance(task, MoveTask):  # inside the machine: a view
                r = self.read(task.inputs[0], task.box, core)
            elif isinstance(task, ViewTask):
                r = self.add(ViewTask((self.read(task.inputs[0], whole(self.shapes[task.inputs[0]]), core),),
                                      task.shape, task.dtype, core))
            else:
                r = self.partial(task, core)
            self.pieces[t] = [(whole(task.shape), r)]
        held = {t: self.read(t, whole(self.shapes[t]), self.tasks[self.pieces[t][0][1]].loc)
                for t in share.outputs}
        graph = TaskGraph(tuple(self.tasks), {}, self.cores, self.cores)
        return Refined(graph, self.receive, self.send, held)

    def partial(self, task: PartialTask, core: int) -> int:
        ins: dict[int, int] = {}
        pieces = []
        for p in task.pieces:
            r, box = self.source(task.inputs[p.input], p.src, core)
            pieces.append(Piece(ins.setdefault(r, len(ins)), box, p.dst))
        args = tuple(ins)
        return self.add(PartialTask(args, tuple(pieces), task.shape, task.dtype, task.agg, core, task.pad))


def refine(share: Share) -> Refined:
    """Lower a machine's share to its cores (see the module docstring)."""
    return _Refine(share).run()
