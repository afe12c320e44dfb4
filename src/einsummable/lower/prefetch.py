"""Prefetch: copies of resident state made a bounded window ahead of their readers (issue 31).

In the program's order (ir/priority.py) ready work runs earliest id first, but a free core
still takes whatever is ready, and a copy of resident state (a graph input's blocks moved
from the machines that hold them and assembled into the block a reader needs: an
FSDP-gathered weight) is ready at the step's start. Made then and held to its last reader
in the backward, every layer's gathered weights are held at once. Hand-written FSDP gathers
a layer's weights just before the layer and frees them after it, and gathers them again
for the backward. This pass makes the TaskGraph say the same, for every engine:

- a copy of resident state (an input kept in host storage: its load) moves to just before its
  first reader, and is shared only by readers within ``priority.PREFETCH`` nodes of
  the reader before them; a reader further on gets a copy of its own (the chain of moves
  and partials made again, just before it), so the forward's copy goes after the forward;
- such a copy waits for a *gate*: an extra input, read for its order only, the last apply
  of the copying machine (a move's source machine, a partial's own) made for a node at
  least ``PREFETCH`` nodes before the reader. Every engine waits for a task's inputs, so
  all of them honour it; a move's data is ``inputs[0]``, a partial's the inputs its pieces
  name (``taskgraph.data_inputs``).

Only the program's order gets the pass: there tasks run near their id order, so a gate
made ``PREFETCH`` nodes earlier is reached shortly before the reader. In the critical
path's order a gate could run arbitrarily late. plan/predict/memory.py charges copies the same way.

    tg = prefetch_taskgraph(tg)      # lowering.py's lower(), in the program's order
    cg = prefetch(cg)                # blockwise.py's lower_blocks(), the same on arrays
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace

import numpy as np

from einsummable.ir import priority
from einsummable.lower.compact import APPLY, CONSTANT, INPUT, MOVE, PARTIAL, VIEW, CompactGraph
from einsummable.lower.taskgraph import Output, TaskGraph

NEVER = np.iinfo(np.int64).max  # the need of a task no apply reads (an output's block)


def prefetch(cg: CompactGraph) -> CompactGraph:
    """``cg`` with copies of resident state re-made per reader group and gated (module docstring)."""
    if cg.order != priority.PROGRAM or not len(cg):
        return cg
    rows, inputs = _schedule(cg)
    if len(rows) == len(cg) and sum(map(len, inputs)) == len(cg.indices):
        return cg  # nothing re-made or gated
    rows_a = np.asarray(rows, dtype=np.int64)
    first = np.full(len(cg), -1, dtype=np.int64)  # each task's first emission: what outputs read
    first[rows_a[::-1]] = np.arange(len(rows) - 1, -1, -1)
    lengths = np.fromiter((len(ins) for ins in inputs), dtype=np.int64, count=len(inputs))
    indices = np.fromiter((i for ins in inputs for i in ins), dtype=np.int32, count=int(lengths.sum()))
    outputs = {name: Output(o.shape, o.dtype, tuple((int(first[t]), box) for t, box in o.blocks))
               for name, o in cg.outputs.items()}
    return replace(cg, kind=cg.kind[rows_a], loc=cg.loc[rows_a], src=cg.src[rows_a], node=cg.node[rows_a],
                   dtype=cg.dtype[rows_a], shape=cg.shape[rows_a], aux=cg.aux[rows_a],
                   indptr=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), indices=indices,
                   outputs=outputs)


def prefetch_taskgraph(tg: TaskGraph) -> TaskGraph:
    """``prefetch`` of an object TaskGraph (lowering.py's), as objects."""
    if tg.order != priority.PROGRAM:
        return tg
    return prefetch(CompactGraph.from_taskgraph(tg)).to_taskgraph()


def _schedule(cg: CompactGraph) -> tuple[list[int], list[list[int]]]:
    """The tasks in their new order (rows of ``cg``, a re-made copy repeating its row) and
    each one's inputs in the new numbering."""
    n, window = len(cg), priority.PREFETCH
    kind = cg.kind.tolist()
    node = cg.node.tolist()
    machine = (cg.loc // max(cg.cores, 1)).tolist()
    source = (cg.src // max(cg.cores, 1)).tolist()
    ptr, idx = cg.indptr.tolist(), cg.indices.tolist()
    ins = [idx[ptr[t]:ptr[t + 1]] for t in range(n)]
    need = _needs(kind, node, ins, cg.outputs)
    resident = [False] * n
    for t in range(n):
        k = kind[t]
        copied = k in (MOVE, PARTIAL, VIEW) and all(resident[i] for i in ins[t])
        resident[t] = k in (INPUT, CONSTANT) or copied
    loads = _loads(cg)
    copy = [resident[t] and (kind[t] in (MOVE, PARTIAL) or loads[t]) for t in range(n)]

    rows: list[int] = []
    inputs: list[list[int]] = []
    new = [-1] * n  # a task's latest emission
    last = [0] * n  # for a copy: the need of the latest reader its latest emission serves
    gates: dict[int, tuple[list[int], list[int]]] = {}  # machine -> (nodes reached, apply ids)

    def emit(t: int, args: list[int], at: int) -> int:
        if copy[t] and at != NEVER and at - window > 0:
            where = source[t] if kind[t] == MOVE else machine[t]  # a load, a partial: its own
            reached, ids = gates.get(where, ((), ()))
            k = bisect_right(reached, at - window)
            if k:
                args = [*args, ids[k - 1]]
        rows.append(t)
        inputs.append(args)
        new[t] = len(rows) - 1
        if kind[t] == APPLY and node[t] >= 0:
            reached, ids = gates.setdefault(machine[t], ([], []))
            reached.append(max(node[t], reached[-1]) if reached else node[t])
            ids.append(new[t])
        return new[t]

    def resolve(i: int, at: int) -> int:
        if not copy[i]:
            return new[i]
        if new[i] >= 0 and (at == NEVER or at - last[i] <= window):
            last[i] = max(last[i], at) if at != NEVER else last[i]
            return new[i]
        made = emit(i, [resolve(j, at) for j in ins[i]], at)  # made (again) just before this reader
        last[i] = at
        return made

    for t in range(n):
        if copy[t] and need[t] != NEVER:
            continue  # made where its first reader resolves it, after the gates before that
        emit(t, [resolve(i, need[t]) for i in ins[t]], need[t])
    return rows, inputs


def _loads(cg: CompactGraph) -> list[bool]:
    """The input tasks of inputs kept in host storage: each loads a copy of its block."""
    out = [False] * len(cg)
    if cg.stored:
        for t in np.flatnonzero(cg.kind == INPUT).tolist():
            out[t] = cg.aux_table[cg.aux[t]][0] in cg.stored
    return out


def _needs(kind: list[int], node: list[int], ins: list[list[int]], outputs: dict[str, Output]) -> list[int]:
    """The node at which each task's value is first needed: an apply's own, else its
    earliest reader's (``NEVER`` where only outputs read it)."""
    n = len(kind)
    need = [NEVER] * n
    for t in range(n - 1, -1, -1):
        if kind[t] == APPLY and node[t] >= 0:
            need[t] = node[t]
        for i in ins[t]:
            if need[t] < need[i]:
                need[i] = need[t]
    return need
