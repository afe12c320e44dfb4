"""Figures read off a TaskGraph: flops per location, bytes per link, critical path; DOT export."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from einsummable.hardware.cluster import Cluster
from einsummable.ir.box import fmt_box, whole
from einsummable.ir.dot import escape
from einsummable.ir.dtypes import itemsize
from einsummable.lower.taskgraph import ApplyTask, InputTask, MoveTask, TaskGraph


@dataclass(frozen=True)
class Stats:
    flops: tuple[int, ...]  # per location
    links: dict[tuple[int, int], int]  # (from, to) -> bytes
    bytes_within: int
    bytes_across: int
    critical_path: float  # seconds on the given cluster, with unlimited workers
    tasks: dict[str, int]  # task count per kind

    @property
    def bytes_moved(self) -> int:
        return self.bytes_within + self.bytes_across


def move_bytes(task: MoveTask) -> int:
    return math.prod(task.shape) * itemsize(task.dtype)


def shares_whole(tg: TaskGraph, task: MoveTask) -> bool:
    """A whole block handed to another core of its machine: a view of shared memory, no bytes."""
    same = tg.machine_of(task.src) == tg.machine_of(task.loc)
    return same and task.box == whole(tg.tasks[task.inputs[0]].shape)


def stats(tg: TaskGraph, cluster: Cluster | None = None) -> Stats:
    cluster = cluster or Cluster(machines=max(1, tg.workers // tg.cores), cores=tg.cores)
    flops = [0] * tg.workers
    links: Counter[tuple[int, int]] = Counter()
    within = across = 0
    finish = [0.0] * len(tg.tasks)
    for t, task in enumerate(tg.tasks):
        cost = 0.0
        if isinstance(task, ApplyTask):
            f = task.op.flops()
            flops[task.loc] += f
            cost = f / cluster.flops_per_core
        elif isinstance(task, MoveTask):
            n = move_bytes(task)
            cost = cluster.seconds_to_move(n, task.src, task.loc)  # a view too: its block is read from afar
            if not shares_whole(tg, task):
                links[(task.src, task.loc)] += n
                if tg.machine_of(task.src) == tg.machine_of(task.loc):
                    within += n
                else:
                    across += n
        start = max((finish[i] for i in task.inputs), default=0.0)
        finish[t] = start + cost
    kinds = Counter(type(task).__name__.removesuffix("Task").lower() for task in tg.tasks)
    return Stats(tuple(flops), dict(links), within, across, max(finish, default=0.0), dict(kinds))


_COLOURS = ("lightblue", "lightyellow", "palegreen", "pink", "orange", "plum", "khaki", "lightgrey")


def to_dot(tg: TaskGraph) -> str:
    """One cluster box per location; moves are the edges that cross boxes."""
    lines = ["digraph taskgraph {", "  rankdir=TB;", "  node [shape=box, style=filled, fontname=monospace];"]
    by_loc: dict[int, list[int]] = {}
    for t, task in enumerate(tg.tasks):
        by_loc.setdefault(task.loc, []).append(t)
    for loc, ids in sorted(by_loc.items()):
        lines.append(f"  subgraph cluster_{loc} {{ label=\"worker {loc}\";")
        for t in ids:
            task = tg.tasks[t]
            parts = (f"%{t} {task.describe()}", f"{task.dtype}{list(task.shape)}")
            label = "\\n".join(escape(p) for p in parts)
            colour = _COLOURS[loc % len(_COLOURS)]
            lines.append(f'    t{t} [label="{label}", fillcolor={colour}];')
        lines.append("  }")
    for t, task in enumerate(tg.tasks):
        style = " [style=dashed]" if isinstance(task, MoveTask) else ""
        lines.extend(f"  t{i} -> t{t}{style};" for i in task.inputs)
    for k, (name, out) in enumerate(tg.outputs.items()):
        # Output names are the user's text: the node id is ours, the name only a quoted label.
        lines.append(f'  out{k} [label="{escape(name)}", shape=ellipse, fillcolor=white];')
        lines.extend(f'  t{t} -> out{k} [label="{fmt_box(box)}"];' for t, box in out.blocks)
    lines.append("}")
    return "\n".join(lines)


def live_bytes(tg: TaskGraph) -> int:
    """The largest set of blocks alive at once when the tasks run in order, each freed
    after its last reader. Input blocks and moves are views of memory held elsewhere
    (the feeds, another block), so they count nothing; output blocks live to the end."""
    readers = tg.readers()
    size = [0 if isinstance(t, InputTask | MoveTask) else math.prod(t.shape) * itemsize(t.dtype)
            for t in tg.tasks]
    live = peak = 0
    for k, task in enumerate(tg.tasks):
        live += size[k]
        peak = max(peak, live)
        for i in task.inputs:
            readers[i] -= 1
            if readers[i] == 0:
                live -= size[i]
    return peak
