"""The backward as soon as it can run: a graph pass for the program's order (ir/priority.py).

Autodiff writes a layer's weight gradient after the whole chain of input gradients
(autodiff/grad.py), and an optimizer its updates after every gradient (train/optim.py), so
in the program's order each layer's activations and incoming gradient are held to the end
of the backward, and every gradient to the step's end (Llama-7B: 25 GiB of them). ``eager``
moves each node that reads a value of the backward (a node the loss does not need) to just
after the last of its operands: a weight's gradient runs as its incoming gradient is made,
and its update right after it, as an eager framework's backward and optimizer hooks run.
The forward stays where it is, and so does a node that reads forward values (moving it
into the forward would hold it to the backward); one that reads only graph inputs (an
optimizer's bias correction of the step count) is made just before its first reader, and
so is a graph input (an optimizer's moments, declared after the backward). A rematerialised chain
waits on its barrier, a value of the backward (ir/remat.py), so it moves no earlier than it.
EinGraph in, EinGraph out; the values are unchanged.

    g2 = eager(g, loss)      # the planner's remat and offload paths (plan/remat.py, offload.py)
"""

from __future__ import annotations

import dataclasses
import heapq

from einsummable.ir.graph import EinGraph, InputNode


def eager(g: EinGraph, loss: int) -> EinGraph:
    """``g`` with the nodes that read a value of the backward just after their operands."""
    n = len(g.nodes)
    needed = g.live(roots=[loss])
    is_input = [isinstance(node, InputNode) for node in g.nodes]
    moves = [not needed[v] and any(not needed[u] and not is_input[u] for u in node.inputs)
             for v, node in enumerate(g.nodes)]
    lazy = [False] * n  # off the loss, reading only inputs and other such: made just before a reader
    for v, node in enumerate(g.nodes):
        lazy[v] = not needed[v] and not is_input[v] and all(is_input[u] or lazy[u] for u in node.inputs)
    moves = [m and not z for m, z in zip(moves, lazy, strict=True)]
    if not any(moves):
        return g
    lazy = [z or i for z, i in zip(lazy, is_input, strict=True)]  # an input is held all step anywhere
    pending = [sum(1 for u in set(node.inputs) if not lazy[u]) for node in g.nodes]
    readers: list[list[int]] = [[] for _ in range(n)]
    for v, node in enumerate(g.nodes):
        for u in set(node.inputs):
            readers[u].append(v)
    order: list[int] = []
    made = [False] * n

    def place(u: int) -> None:
        """u, after whichever of its lazy operands (a step count's bias correction, a decay
        factor) are not made yet."""
        stack = [(u, False)]
        while stack:
            v, expanded = stack.pop()
            if made[v]:
                continue
            if not expanded:
                stack.append((v, True))
                stack.extend((w, False) for w in g.nodes[v].inputs if lazy[w] and not made[w])
                continue
            made[v] = True
            order.append(v)

    def emit(v: int) -> None:
        """v, then the moved nodes it makes ready: the latest written first, so that a layer's
        weight gradient and its update (written after the input gradients) come before the
        next input gradient, as they free what they read."""
        ready = [-v]
        while ready:
            u = -heapq.heappop(ready)
            place(u)
            for r in readers[u]:
                if moves[r]:
                    pending[r] -= 1
                    if not pending[r]:
                        heapq.heappush(ready, -r)

    for v in range(n):
        if not moves[v] and not lazy[v]:
            emit(v)
    for v in range(n):  # lazy values nothing reads (outputs), where they were
        if not made[v]:
            place(v)
    if order == list(range(n)):
        return g
    return _reordered(g, order)


def _reordered(g: EinGraph, order: list[int]) -> EinGraph:
    """``g``'s nodes in ``order`` (a topological order of them all), ids remapped."""
    new = {v: k for k, v in enumerate(order)}
    out = EinGraph()
    for v in order:
        node = g.nodes[v]
        out.add(dataclasses.replace(node, inputs=tuple(new[u] for u in node.inputs)))
        if v in g.index_names:
            out.index_names[new[v]] = g.index_names[v]
    for ids in g.class_ids:
        out.add_class_ids(ids)
    for name, v in g.outputs.items():
        out.set_output(name, new[v])
    return out
