"""Tasks as arrays: a TaskGraph stored as numpy struct-of-arrays (issue 17).

One Python object per task costs about 1.8 KB; a graph of a million tasks then
needs gigabytes. Here a task is one row across a few arrays (about 40 bytes):

- ``kind``: one of ``KINDS`` (the TaskGraph's task kinds, lower/taskgraph.py);
- ``loc``, ``src``: where it runs, and for a move where it comes from (else ``loc``);
- ``node``: the EinGraph node of an apply (-1: none);
- ``dtype``, ``shape``: ids into the ``dtypes`` and ``shapes`` tables;
- ``aux``: an id into ``aux_table``, the rest of the task, shared by the many tasks
  that repeat it: an apply's op, a move's box, an input's (name, box), a
  constant's (fill kind, box), a partial's (pieces, agg, pad), a fused task's (first, then,
  slots); an apply that donates (lower/fusion.py) has (op, the operand it donates);
- ``indptr``/``indices``: the inputs of task t are ``indices[indptr[t]:indptr[t + 1]]``.

``task(t)`` and ``to_taskgraph()`` give the objects back, for small graphs (the DOT
view, validation, the tests against lowering.py).

    cg = cluster_graph(plan).graph
    len(cg), cg.memory_bytes() / len(cg)    # tasks, bytes per task
    print(cg)                               # the first tasks, as TaskGraph prints them
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from einsummable.ir import priority
from einsummable.ir.dtypes import itemsize
from einsummable.lower.taskgraph import (
    ApplyTask,
    ConstantTask,
    FusedTask,
    InputTask,
    MoveTask,
    Output,
    PartialTask,
    Task,
    TaskGraph,
    ViewTask,
)

KINDS = ("input", "constant", "apply", "move", "partial", "view", "fused")
INPUT, CONSTANT, APPLY, MOVE, PARTIAL, VIEW, FUSED = range(7)
TYPES = (np.uint8, np.int32, np.int32, np.int32, np.uint8, np.int32, np.int32)  # of the per-task columns
SHOWN = 200  # tasks printed by str() before it cuts the listing short


@dataclass(frozen=True, eq=False)
class CompactGraph:
    """A topologically ordered TaskGraph in arrays; see the module docstring."""

    kind: np.ndarray  # uint8 [tasks]
    loc: np.ndarray  # int32
    src: np.ndarray  # int32
    node: np.ndarray  # int32
    dtype: np.ndarray  # uint8
    shape: np.ndarray  # int32
    aux: np.ndarray  # int32
    indptr: np.ndarray  # int64 [tasks + 1]
    indices: np.ndarray  # int32
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    aux_table: tuple[object, ...]
    outputs: dict[str, Output]
    workers: int
    cores: int
    order: str = priority.CRITICAL_PATH  # TaskGraph.order
    stored: frozenset[str] = frozenset()  # TaskGraph.stored

    def __len__(self) -> int:
        return len(self.kind)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.kind, self.loc, self.src, self.node, self.dtype, self.shape, self.aux, self.indptr,
                self.indices)

    def memory_bytes(self) -> int:
        """Bytes held by the per-task arrays (the tables are shared by many tasks)."""
        return sum(a.nbytes for a in self.arrays())

    def nbytes(self) -> np.ndarray:
        """[tasks] bytes of each task's block."""
        elems = np.array([int(np.prod(s)) for s in self.shapes], dtype=np.int64)
        sizes = np.array([itemsize(d) for d in self.dtypes], dtype=np.int64)
        return elems[self.shape] * sizes[self.dtype]

    def inputs(self, t: int) -> tuple[int, ...]:
        return tuple(int(i) for i in self.indices[self.indptr[t]:self.indptr[t + 1]])

    def task(self, t: int) -> Task:
        """Task t as the object lowering.py makes."""
        k, loc, dtype = int(self.kind[t]), int(self.loc[t]), self.dtypes[self.dtype[t]]
        aux = self.aux_table[self.aux[t]] if self.aux[t] >= 0 else None
        ins = self.inputs(t)
        if k == INPUT:
            name, box = aux
            return InputTask(name, box, dtype, loc, ins)  # ins: a stored input's gate (prefetch.py)
        if k == CONSTANT:
            fill, box = aux
            return ConstantTask(fill, box, dtype, loc)
        if k == APPLY:
            op, donates = aux if isinstance(aux, tuple) else (aux, -1)
            return ApplyTask(op, ins, loc, int(self.node[t]), donates)
        if k == FUSED:
            first, then, slots = aux
            return FusedTask(first, then, slots, ins, loc, int(self.node[t]))
        if k == MOVE:
            return MoveTask(ins, aux, int(self.src[t]), loc, dtype)
        if k == PARTIAL:
            pieces, agg, pad = aux
            return PartialTask(ins, pieces, self.shapes[self.shape[t]], dtype, agg, loc, pad)
        return ViewTask(ins, self.shapes[self.shape[t]], dtype, loc)

    def to_taskgraph(self) -> TaskGraph:
        """The object TaskGraph (for small graphs: DOT, validate, tests)."""
        tasks = tuple(self.task(t) for t in range(len(self)))
        return TaskGraph(tasks, self.outputs, self.workers, self.cores, self.order, self.stored)

    @classmethod
    def from_taskgraph(cls, tg: TaskGraph) -> CompactGraph:
        """The arrays of an object TaskGraph: simulate.run replays every graph through them."""
        tables: dict[str, dict] = {"dtype": {}, "shape": {}, "aux": {}}

        def intern(table: str, key: object) -> int:
            return tables[table].setdefault(key, len(tables[table]))

        cols = [[] for _ in range(7)]
        for task in tg.tasks:
            k, aux = _KIND_AUX[type(task)](task)
            row = (k, task.loc, getattr(task, "src", task.loc), getattr(task, "node", -1),
                   intern("dtype", task.dtype), intern("shape", task.shape),
                   -1 if aux is None else intern("aux", aux))
            for col, x in zip(cols, row, strict=True):
                col.append(x)
        lengths = [len(task.inputs) for task in tg.tasks]
        indices = [i for task in tg.tasks for i in task.inputs]
        arrays = [np.array(c, dtype=t) for c, t in zip(cols, TYPES, strict=True)]
        indptr = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
        return cls(*arrays, indptr, np.array(indices, dtype=np.int32), tuple(tables["dtype"]),
                   tuple(tables["shape"]), tuple(tables["aux"]), tg.outputs, tg.workers, tg.cores, tg.order,
                   tg.stored)

    def counts(self) -> dict[str, int]:
        """Tasks per kind."""
        n = np.bincount(self.kind, minlength=len(KINDS))
        return {k: int(c) for k, c in zip(KINDS, n, strict=True) if c}

    def __str__(self) -> str:
        n = len(self)
        lines = [f"taskgraph({self.workers} workers, {n:,} tasks as arrays) {{"]
        for t in range(min(n, SHOWN)):
            task = self.task(t)
            args = " ".join(f"%{i}" for i in task.inputs)
            shape = f"{task.dtype}[{','.join(map(str, task.shape))}]"
            lines.append(f"  %{t} @{task.loc} = {task.describe()} {args}".rstrip() + f" : {shape}")
        if n > SHOWN:
            kinds = ", ".join(f"{c:,} {k}" for k, c in self.counts().items())
            lines.append(f"  ... {n - SHOWN:,} more tasks (of {kinds})")
        for name, out in list(self.outputs.items())[:SHOWN]:
            lines.append(f"  return {name} = {len(out.blocks)} blocks")
        if len(self.outputs) > SHOWN:
            lines.append(f"  ... {len(self.outputs) - SHOWN} more outputs")
        lines.append("}")
        return "\n".join(lines)


_KIND_AUX = {  # a task's kind and its aux entry, as task() reads them back
    InputTask: lambda t: (INPUT, (t.name, t.box)),
    ConstantTask: lambda t: (CONSTANT, (t.kind, t.box)),
    ApplyTask: lambda t: (APPLY, t.op if t.donates < 0 else (t.op, t.donates)),
    FusedTask: lambda t: (FUSED, (t.first, t.then, t.slots)),
    MoveTask: lambda t: (MOVE, t.box),
    PartialTask: lambda t: (PARTIAL, (t.pieces, t.agg, t.pad)),
    ViewTask: lambda t: (VIEW, None),
}


def prune(cg: CompactGraph) -> CompactGraph:
    """Drop the tasks no output depends on and renumber the rest, keeping their order
    (lowering.py's ``prune``). A dead task has no readers, or only dead ones, so the
    tasks are peeled from the ones nothing reads."""
    n = len(cg)
    readers = np.bincount(cg.indices, minlength=n)
    for out in cg.outputs.values():
        for t, _ in out.blocks:
            readers[t] += 1
    keep = np.ones(n, dtype=bool)
    dead = np.flatnonzero(readers == 0)
    while len(dead):
        keep[dead] = False
        starts, ends = cg.indptr[dead], cg.indptr[dead + 1]
        lengths = ends - starts
        offsets = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
        read = cg.indices[offsets + np.arange(lengths.sum())]
        np.subtract.at(readers, read, 1)
        dead = np.unique(read[readers[read] == 0])
        dead = dead[keep[dead]]
    if keep.all():
        return cg
    new_id = np.cumsum(keep) - 1
    lengths = np.diff(cg.indptr)[keep]
    edges = np.repeat(keep, np.diff(cg.indptr))
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    outputs = {name: Output(o.shape, o.dtype, tuple((int(new_id[t]), box) for t, box in o.blocks))
               for name, o in cg.outputs.items()}
    return replace(cg, kind=cg.kind[keep], loc=cg.loc[keep], src=cg.src[keep], node=cg.node[keep],
                   dtype=cg.dtype[keep], shape=cg.shape[keep], aux=cg.aux[keep], indptr=indptr,
                   indices=new_id[cg.indices[edges]].astype(np.int32), outputs=outputs)
