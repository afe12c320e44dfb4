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
- inputs, constants, partials and views stay one task each (on the cores in turn); a
  send's or a partial's gates (lower/prefetch.py) become the gate's last core block;
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
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from einsummable.ir.box import Box, box_shape, intersect, whole, within
from einsummable.ir.dtypes import HALF
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.graph import Piece
from einsummable.lower.blockwise import lower_blocks
from einsummable.lower.cluster import levels, machine_plan
from einsummable.lower.compact import MOVE, CompactGraph
from einsummable.lower.fusion import fuse
from einsummable.lower.taskgraph import (
    ApplyTask,
    ConstantTask,
    InputTask,
    MoveTask,
    PartialTask,
    Task,
    TaskGraph,
    ViewTask,
    data_inputs,
)
from einsummable.plan.partition import split as cuts
from einsummable.plan.plan import Plan

Counts = tuple[int, ...]
RECEIVE = "\0receive"  # the name of a receive's placeholder input task


@dataclass(frozen=True, eq=False)
class Share:
    """Machine ``machine``'s part of a cluster-level graph: its rows of the graph's arrays.

    ``rows`` holds its tasks (``ids[i]`` is row i; inputs keep the graph's ids, and a move
    from another machine reads a task held elsewhere: a receive; a move to another machine
    is a send). The driver only cuts arrays; the machine makes the task objects
    (``tasks``) when it refines its share.
    """

    machine: int
    cores: int
    ids: np.ndarray  # [tasks] the graph's ids of its tasks
    rows: CompactGraph
    cc: tuple[Counts, ...]  # the plan's core counts per node (an apply's core blocks per join dimension)
    outputs: tuple[int, ...]  # ids of its tasks whose blocks some output holds

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def tasks(self) -> tuple[Task, ...]:
        return tuple(self.rows.task(i) for i in range(len(self.ids)))


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
    out_ids = np.array(sorted({t for o in cg.outputs.values() for t, _ in o.blocks}), dtype=np.int64)
    cc = tuple(cc)
    shares = []
    for m in range(cg.workers):
        ids = np.flatnonzero((cg.loc == m) | ((cg.kind == MOVE) & (cg.src == m)))
        mine = out_ids[cg.loc[out_ids] == m]
        shares.append(Share(m, cores, ids, _rows(cg, ids), cc, tuple(mine.tolist())))
    return shares


def _rows(cg: CompactGraph, ids: np.ndarray) -> CompactGraph:
    """Tasks ``ids`` of ``cg`` as arrays of their own: inputs keep cg's ids; the aux table
    is cut to the entries they use."""
    aux = cg.aux[ids]
    used = np.unique(aux[aux >= 0])
    remap = np.full(max(len(cg.aux_table), 1), -1, dtype=np.int32)
    remap[used] = np.arange(len(used), dtype=np.int32)
    starts, lengths = cg.indptr[ids], np.diff(cg.indptr)[ids]
    edges = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
    return replace(cg, kind=cg.kind[ids], loc=cg.loc[ids], src=cg.src[ids], node=cg.node[ids],
                   dtype=cg.dtype[ids], shape=cg.shape[ids],
                   aux=np.where(aux >= 0, remap[aux], -1).astype(np.int32),
                   indptr=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                   indices=cg.indices[edges], aux_table=tuple(cg.aux_table[i] for i in used.tolist()),
                   outputs={})


@dataclass(frozen=True)
class _Grid:
    """A cluster-level block as its core blocks: cut at ``edges`` in each dimension (0 .. n),
    ``rs`` the refined tasks of the cells in C order. A box finds the cells it meets by
    bisection, not by testing every cell (a 7B share has blocks of 64 cells read ~400k times)."""

    edges: tuple[tuple[int, ...], ...]
    rs: tuple[int, ...]

    @staticmethod
    def whole(shape: Sequence[int], r: int) -> _Grid:
        return _Grid(tuple((0, n) for n in shape), (r,))

    def meeting(self, box: Box) -> list[tuple[Box, int]]:
        """The cells that meet ``box`` (its pieces), in C order: (cell's box, its task)."""
        ranges = [range(max(bisect_right(e, lo) - 1, 0), min(bisect_left(e, hi), len(e) - 1))
                  for (lo, hi), e in zip(box, self.edges, strict=True)]
        out = []
        for cell in itertools.product(*ranges):
            flat = 0
            for c, e in zip(cell, self.edges, strict=True):
                flat = flat * (len(e) - 1) + c
            have = tuple((e[c], e[c + 1]) for c, e in zip(cell, self.edges, strict=True))
            out.append((have, self.rs[flat]))
        return out


class _Refine:
    def __init__(self, share: Share) -> None:
        self.share, self.cores = share, share.cores
        self.tasks: list[Task] = []
        self.grids: dict[int, _Grid] = {}  # cluster-level task -> its core blocks
        self.cache: dict[tuple, int] = {}
        self.blocked: dict[tuple[int, tuple[int, ...]], Einsummable] = {}  # (id of op, block shape) -> op
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
        key = ("read", t, box, core)
        if key in self.cache:  # a box assembled before (only those are kept under this key)
            return self.cache[key]
        pieces = self.grids[t].meeting(box)
        if len(pieces) == 1:  # one core block holds it: that block, or a view of it
            have, r = pieces[0]
            return self.at(r, core, None if have == box else within(box, have))
        ins: dict[int, int] = {}  # each core block's task, read in place (no view task per piece)
        parts = []
        for have, r in pieces:
            meet = intersect(have, box)
            dst = tuple(a - b for (a, _), (b, _) in zip(meet, box, strict=True))
            parts.append(Piece(ins.setdefault(self.at(r, core), len(ins)), within(meet, have), dst))
        dtype = self.tasks[self.grids[t].rs[0]].dtype
        task = PartialTask(tuple(ins), tuple(parts), box_shape(box), dtype, None, core)
        self.cache[key] = r = self.add(task)
        return r

    def source(self, t: int, box: Box, core: int) -> tuple[int, Box]:
        """A refined task at ``core`` and the box in it that holds ``box`` of task t's block: the
        core block holding it where one does (a slice read in place), else ``read``'s."""
        pieces = self.grids[t].meeting(box)
        if len(pieces) == 1:
            have, r = pieces[0]
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
            sub = op if len(blocks) == 1 else self.block(op, tuple(hi - lo for lo, hi in block))
            r = self.add(ApplyTask(sub, args, core, task.node))
            sums.setdefault(tuple(block[:op.out_rank]), []).append(r)
        cells = []  # in C order over the output's cuts: blocks run the output's dimensions outermost
        for box, rs in sums.items():
            if len(rs) > 1:
                core = self.tasks[rs[0]].loc
                size = box_shape(box)
                parts = tuple(Piece(k, whole(size), (0,) * len(size)) for k in range(len(rs)))
                rs = [self.add(PartialTask(tuple(self.at(r, core) for r in rs), parts, size, op.dtype, op.agg,
                                           core))]
            cells.append(rs[0])
        self.grids[t] = _Grid(tuple(cuts(n, c) for n, c in zip(shape[:op.out_rank], counts, strict=False)),
                              tuple(cells))

    def block(self, op: Einsummable, shape: tuple[int, ...]) -> Einsummable:
        """``op.block(shape)``, made once per op and shape (its checks cost ~60 µs)."""
        key = (id(op), shape)
        if key not in self.blocked:
            self.blocked[key] = op.block(shape)
        return self.blocked[key]

    def run(self) -> Refined:
        share = self.share
        tasks = share.tasks
        ids = share.ids.tolist()
        self.shapes = {t: task.shape for t, task in zip(ids, tasks, strict=True)}
        for t, task in zip(ids, tasks, strict=True):
            counts = share.cc[task.node] if isinstance(task, ApplyTask) and task.node >= 0 else None
            me = share.machine
            if isinstance(task, ApplyTask):
                self.apply(t, task, counts)
                continue
            if isinstance(task, MoveTask) and task.src != task.loc:
                if task.loc == me:  # a receive: the block comes whole from the mailbox
                    box = whole(task.shape)
                    r = self.add(InputTask(f"{RECEIVE} %{t}", box, task.dtype, self.next_core()))
                    self.receive[r] = t
                    self.grids[t] = _Grid.whole(task.shape, r)
                else:  # a send: the box, made at one core, goes to the peer
                    core = self.next_core()
                    r, box = self.source(task.inputs[0], task.box, core)
                    out = self.add(MoveTask((r, *self.gates(task)), box, core, core, task.dtype))
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
            self.grids[t] = _Grid.whole(task.shape, r)
        held = {t: self.read(t, whole(self.shapes[t]), self.tasks[self.grids[t].rs[0]].loc)
                for t in share.outputs}
        graph = TaskGraph(tuple(self.tasks), {}, self.cores, self.cores, self.share.rows.order)
        fused = fuse(graph, keep={*held.values(), *self.send})  # the passes the one-machine graph gets
        ix = fused.index
        return Refined(fused.graph, {ix[r]: t for r, t in self.receive.items()},
                       {ix[s]: v for s, v in self.send.items()}, {t: ix[r] for t, r in held.items()})

    def partial(self, task: PartialTask, core: int) -> int:
        ins: dict[int, int] = {}
        pieces = []
        for p in task.pieces:
            r, box = self.source(task.inputs[p.input], p.src, core)
            pieces.append(Piece(ins.setdefault(r, len(ins)), box, p.dst))
        args = (*ins, *self.gates(task))
        return self.add(PartialTask(args, tuple(pieces), task.shape, task.dtype, task.agg, core, task.pad))

    def gates(self, task: MoveTask | PartialTask) -> tuple[int, ...]:
        """A task's gates (lower/prefetch.py: applies of this machine), as the last core block of each."""
        return tuple(self.grids[g].rs[-1] for g in task.inputs[len(data_inputs(task)):])


def refine(share: Share) -> Refined:
    """Lower a machine's share to its cores (see the module docstring)."""
    return _Refine(share).run()
