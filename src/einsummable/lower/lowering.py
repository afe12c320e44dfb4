"""Lowering: (EinGraph, Plan) -> TaskGraph, one rule per node kind in ``LOWER``.

Each placed block becomes tasks at its worker. Operands come through ``fetch``,
which assembles the box a block reads from the producer's blocks:
- a producer block that is exactly the box and already there is used as is;
- remote pieces move once per (block, sub-box, destination) and are shared; a
  piece from another machine crosses once per machine, to the first of its cores
  that reads it, and moves on from there to the machine's other cores (``relay``);
- partial sums are first combined where they live (one partial per location), then
  on another machine inside it (``gather_machines``: one partial per machine crosses),
  then moved, then combined at the destination; half-precision (f16, bf16) partial
  sums and products stay in f32 until the block that forms them rounds once (a
  cast task), so 1 and n workers round alike;
- fills are rebuilt at the destination instead of moving;
- a block assembled for a reader (from pieces, summed, rounded) is made once per
  machine; the machine's other cores that read that box get it by a move of the whole
  block inside the machine, which the engines run as a view of shared memory.
Tasks that no output needs are pruned at the end; in the program's order, copies of
resident state are then gated and re-made per reader group (prefetch.py).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from einsummable.ir.box import Box, box_shape, shift, whole
from einsummable.ir.dtypes import HALF
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.expr import Cast, Input
from einsummable.ir.graph import (
    ComplexView,
    Constant,
    EinGraph,
    EinsumNode,
    Fill,
    Formation,
    InputNode,
    Piece,
    Reshape,
    Select,
)
from einsummable.lower.prefetch import prefetch_taskgraph
from einsummable.lower.taskgraph import (
    ApplyTask,
    ConstantTask,
    InputTask,
    MoveTask,
    Output,
    PartialTask,
    Task,
    TaskGraph,
    ViewTask,
)
from einsummable.plan.partition import Partition
from einsummable.plan.plan import Plan

Located = tuple[int, int]  # (task id, location)


class _Lowering:
    def __init__(self, g: EinGraph, plan: Plan) -> None:
        self.g = g
        self.plan = plan
        self.tasks: list[Task] = []
        self.index: dict[Task, int] = {}
        # per node: its output partition and, per output block, the tasks holding it
        self.outs: dict[int, tuple[Partition, list[list[Located]]]] = {}
        self.fetched: dict[tuple[int, Box, int], int] = {}
        # (task, sub-box, machine) -> (task, core) holding that piece after it crossed
        self.relayed: dict[tuple[int, Box, int], tuple[int, int]] = {}
        # (node, box, machine) -> (task, core) of the block made for that box there
        self.assembled: dict[tuple[int, Box, int], tuple[int, int]] = {}
        self.held_ids: dict[int, frozenset[int]] = {}

    def add(self, task: Task) -> int:
        """Append a task; an identical task already made is reused (moves, constants)."""
        found = self.index.get(task)
        if found is not None:
            return found
        self.tasks.append(task)
        self.index[task] = len(self.tasks) - 1
        return len(self.tasks) - 1

    def blocks(self, nid: int):
        part = self.plan.parts[nid]
        return zip(part.boxes(), self.plan.locs[nid], strict=True)

    # ------------------------------------------------------------ fetch

    def fetch(self, u: int, box: Box, w: int) -> int:
        """A task at worker w holding ``box`` of node u's value."""
        key = (u, box, w)
        if key not in self.fetched:
            self.fetched[key] = self._once_per_machine(u, box, w)
        return self.fetched[key]

    def _once_per_machine(self, u: int, box: Box, w: int) -> int:
        """A block assembled for ``box`` (from pieces, summed or rounded) is made once per
        machine: its other cores that read the box take that block by a move inside the
        machine (a view in shared memory), not a copy of their own each."""
        if isinstance(self.g.nodes[u], Fill):
            return self._fetch(u, box, w)  # rebuilt where read
        m = self.plan.cluster.machine_of(w)
        made = self.assembled.get((u, box, m))
        if made is not None:
            t, at = made
            task = self.tasks[t]
            return self.add(MoveTask((t,), whole(task.shape), at, w, task.dtype))
        t = self._fetch(u, box, w)
        task = self.tasks[t]
        if task.loc == w and isinstance(task, PartialTask | ApplyTask) and t not in self.held(u):
            self.assembled[(u, box, m)] = (t, w)
        return t

    def held(self, u: int) -> frozenset[int]:
        """The tasks that hold node u's own blocks."""
        if u not in self.held_ids:
            self.held_ids[u] = frozenset(t for blocks in self.outs[u][1] for t, _ in blocks)
        return self.held_ids[u]

    def _fetch(self, u: int, box: Box, w: int) -> int:
        node = self.g.nodes[u]
        if isinstance(node, Fill):
            return self.add(ConstantTask(node.kind, box, node.dtype, w))
        part, held = self.outs[u]
        agg = node.op.agg if isinstance(node, EinsumNode) else None
        kept = self.tasks[held[0][0][0]].dtype if held and held[0] else node.dtype  # f32 for wide partials
        pieces: list[tuple[int, Box, Box]] = []  # (task, its sub-box, target box in ours)
        for q, inter in part.overlapping(box):
            origin = [lo for lo, _ in part.box(q)]
            sub = shift(inter, origin)
            by_loc: dict[int, list[tuple[int, Box]]] = defaultdict(list)
            for t, loc in held[q]:
                by_loc[loc].append((t, sub))
            if len(by_loc) > 1:
                self.gather_machines(by_loc, w, kept, agg)
            for loc, ts in sorted(by_loc.items(), key=lambda item: item[0] != w):
                t, s = self.combine(ts, kept, agg, loc)
                if loc != w:
                    t = self.move(t, s, loc, w, kept)
                    s = tuple((0, hi - lo) for lo, hi in s)
                pieces.append((t, s, shift(inter, [lo for lo, _ in box])))
        shape = box_shape(box)
        t, s, _ = pieces[0] if pieces else (None, None, None)
        if not (len(pieces) == 1 and s == whole(self.tasks[t].shape) and box_shape(s) == shape):
            ts = [t for t, _, _ in pieces]
            srcs = [s for _, s, _ in pieces]
            dsts = [tuple(lo for lo, _ in d) for _, _, d in pieces]
            t = self.partial(ts, srcs, dsts, shape, kept, agg, w)
        if kept != node.dtype:  # the formed block: the wide partial sum rounds, once
            every = tuple(range(len(shape)))
            rounding = Einsummable(shape, (every,), len(shape), Cast(node.dtype, Input(0)), None, (kept,))
            t = self.add(ApplyTask(rounding, (t,), w, u))
        return t

    def combine(self, ts: list[tuple[int, Box]], dtype: str, agg: str | None, loc: int) -> tuple[int, Box]:
        """The partial sums that live together at loc, summed there before any move."""
        if len(ts) == 1:
            return ts[0]
        shape = box_shape(ts[0][1])
        t = self.partial([t for t, _ in ts], [s for _, s in ts], [(0,) * len(shape)] * len(ts), shape, dtype,
                         agg, loc)
        return t, whole(shape)

    def gather_machines(self, by_loc: dict[int, list[tuple[int, Box]]], w: int, dtype: str,
                        agg: str | None) -> None:
        """Partial sums on several cores of another machine meet on its first such core
        (moves inside a machine), so one sum per machine crosses to w."""
        machine = self.plan.cluster.machine_of
        heads: dict[int, int] = {}
        for loc in sorted(by_loc):
            if machine(loc) == machine(w):
                continue
            head = heads.setdefault(machine(loc), loc)
            if head != loc:
                t, s = self.combine(by_loc.pop(loc), dtype, agg, loc)
                moved = self.add(MoveTask((t,), s, loc, head, dtype))
                by_loc[head].append((moved, tuple((0, hi - lo) for lo, hi in s)))

    def move(self, t: int, s: Box, src: int, w: int, dtype: str) -> int:
        """Task t's sub-box s, at ``src``, moved to worker w. Across machines the piece
        crosses once per machine: later readers there get it from the core it reached."""
        machine = self.plan.cluster.machine_of
        if machine(src) == machine(w):
            return self.add(MoveTask((t,), s, src, w, dtype))
        key = (t, s, machine(w))
        if key not in self.relayed:
            self.relayed[key] = (self.add(MoveTask((t,), s, src, w, dtype)), w)
        r, at = self.relayed[key]
        return r if at == w else self.add(MoveTask((r,), whole(self.tasks[r].shape), at, w, dtype))

    def partial(self, ts, srcs, dsts, shape, dtype: str, agg: str | None, loc: int, pad: float = 0.0) -> int:
        """A partial of the given pieces; with none (an empty or all-padding block), a constant."""
        if not ts:
            return self.add(ConstantTask(Constant(pad), whole(shape), dtype, loc))
        inputs: list[int] = []
        pieces = []
        for t, src, dst in zip(ts, srcs, dsts, strict=True):
            if t not in inputs:
                inputs.append(t)
            pieces.append(Piece(inputs.index(t), tuple(src), tuple(dst)))
        return self.add(PartialTask(tuple(inputs), tuple(pieces), tuple(shape), dtype, agg, loc, pad))


# ------------------------------------------------------------ rules per node kind


def _single(lw: _Lowering, nid: int, make) -> None:
    """A node whose output blocks are its space blocks, one task each."""
    part = lw.plan.parts[nid]
    held = [[(make(box, w), w)] for box, w in lw.blocks(nid)]
    lw.outs[nid] = (part, held)


def _input(lw: _Lowering, nid: int) -> None:
    node: InputNode = lw.g.nodes[nid]
    _single(lw, nid, lambda box, w: lw.add(InputTask(node.name, box, node.dtype, w)))


def _fill(lw: _Lowering, nid: int) -> None:
    """Fills are made where they are read; only an output fill gets blocks of its own."""
    node: Fill = lw.g.nodes[nid]
    _single(lw, nid, lambda box, w: lw.add(ConstantTask(node.kind, box, node.dtype, w)))


def _einsum(lw: _Lowering, nid: int) -> None:
    node: EinsumNode = lw.g.nodes[nid]
    sp = lw.plan.spaces[nid]
    out = lw.plan.out_partition(nid)
    held: list[list[Located]] = [[] for _ in range(out.num_blocks)]
    part = lw.plan.parts[nid]
    op = node.op
    if part.num_blocks > out.num_blocks and op.dtype in HALF and op.agg in ("add", "mul"):
        op = replace(op, join=Cast("f32", op.join))  # partial sums: kept in f32 until formed
    for b, (box, w) in enumerate(lw.blocks(nid)):
        args = tuple(
            lw.fetch(u, sp.operand_box(k, box, lw.g.nodes[u].shape), w) for k, u in enumerate(node.inputs)
        )
        t = lw.add(ApplyTask(op.block(box_shape(box)), args, w, nid))
        idx = part.block_index(b)
        held[out.flat([idx[d] for d in sp.out_dims])].append((t, w))
    lw.outs[nid] = (out, held)


def _formation(lw: _Lowering, nid: int) -> None:
    u = lw.g.nodes[nid].inputs[0]
    if not lw.plan.spaces[u].aggregated:
        lw.outs[nid] = lw.outs[u]
        return
    _single(lw, nid, lambda box, w: lw.fetch(u, box, w))


def _select(lw: _Lowering, nid: int) -> None:
    node: Select = lw.g.nodes[nid]

    def make(box: Box, w: int) -> int:
        reads = node.reads(box)
        ts = [lw.fetch(node.inputs[k], src, w) for _, (k, src), _ in reads]
        shape = box_shape(box)
        if len(reads) == 1 and reads[0][2] == whole(shape):
            return ts[0]
        srcs = [tuple((0, hi - lo) for lo, hi in src) for _, (_, src), _ in reads]
        dsts = [tuple(lo for lo, _ in local) for _, _, local in reads]
        return lw.partial(ts, srcs, dsts, shape, node.dtype, None, w, node.pad)

    _single(lw, nid, make)


def _view(lw: _Lowering, nid: int) -> None:
    """Reshape and complex view: read the matching input box, reinterpret it in place."""
    node = lw.g.nodes[nid]
    sp = lw.plan.spaces[nid]
    u = node.inputs[0]

    def make(box: Box, w: int) -> int:
        src = lw.fetch(u, sp.operand_box(0, box, lw.g.nodes[u].shape), w)
        return lw.add(ViewTask((src,), box_shape(box), node.dtype, w))

    _single(lw, nid, make)


LOWER = {
    InputNode: _input,
    EinsumNode: _einsum,
    Formation: _formation,
    Fill: _fill,
    Select: _select,
    Reshape: _view,
    ComplexView: _view,
}


def lower(plan: Plan) -> TaskGraph:
    """The TaskGraph of a placed plan (of ``plan.graph``), pruned to what the outputs need."""
    g = plan.graph
    lw = _Lowering(g, plan)
    live = g.live()
    for nid, node in enumerate(g.nodes):
        if not live[nid]:
            continue
        if isinstance(node, Fill) and nid not in g.outputs.values():
            continue  # fills are made where they are read
        LOWER[type(node)](lw, nid)
    outputs = {}
    for name, nid in g.outputs.items():
        node = g.nodes[nid]
        part, held = lw.outs[nid]
        blocks = tuple((held[q][0][0], box) for q, box in enumerate(part.boxes()))
        outputs[name] = Output(node.shape, node.dtype, blocks)
    return prefetch_taskgraph(replace(prune(lw.tasks, outputs, plan.cluster.workers, plan.cluster.cores),
                                      order=plan.order, stored=stored(g)))


def stored(g: EinGraph) -> frozenset[str]:
    """The names of the graph's inputs kept in host storage (plan/offload.py)."""
    return frozenset(node.name for node in g.nodes if isinstance(node, InputNode) and node.stored)


def prune(tasks: list[Task], outputs: dict[str, Output], workers: int, cores: int) -> TaskGraph:
    """Drop tasks no output depends on and renumber the rest, keeping their order."""
    keep = [False] * len(tasks)
    stack = [t for out in outputs.values() for t, _ in out.blocks]
    while stack:
        t = stack.pop()
        if not keep[t]:
            keep[t] = True
            stack.extend(tasks[t].inputs)
    new_id: dict[int, int] = {}
    kept: list[Task] = []
    for t, task in enumerate(tasks):
        if keep[t]:
            new_id[t] = len(kept)
            kept.append(_renumber(task, new_id))
    outs = {
        name: Output(o.shape, o.dtype, tuple((new_id[t], box) for t, box in o.blocks))
        for name, o in outputs.items()
    }
    return TaskGraph(tuple(kept), outs, workers, cores)


def _renumber(task: Task, new_id: dict[int, int]) -> Task:
    if not task.inputs:
        return task
    return replace(task, inputs=tuple(new_id[i] for i in task.inputs))

