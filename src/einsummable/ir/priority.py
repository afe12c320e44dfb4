"""Which ready work runs first: one rule for the engines, the simulator and the planner's
memory estimate (plan/memory.py), so that the estimate follows the order that runs.

A task's rank is the costliest chain of work that waits on it (its critical path), and
ready tasks run highest rank first.

Known cost: this defers work that little waits on, such as a weight's gradient (its
chain is only the optimizer's update), to when nothing else is ready; what it reads is
held until then. On Llama-7B on one machine, rematerialised, the estimate holds every
layer's MLP activations to the end of the backward for that reason (363 GiB peak).
Lifting a task to the rank of the other readers of its inputs brought that to 296 GiB,
changed nothing at 4 machines (161 GiB) and made small simulated steps 0-9% slower, so
it is not done; a memory-aware order is the better fix.
"""

from __future__ import annotations

from collections.abc import Sequence


def readers(inputs: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """The readers of each task, flat: ``users[ptr[t]:ptr[t + 1]]``."""
    ptr = [0] * (len(inputs) + 1)
    for ins in inputs:
        for i in ins:
            ptr[i + 1] += 1
    for t in range(len(inputs)):
        ptr[t + 1] += ptr[t]
    users, fill = [0] * ptr[-1], ptr[:-1]
    for t, ins in enumerate(inputs):
        for i in ins:
            users[fill[i]] = t
            fill[i] += 1
    return ptr, users


def ranks(inputs: Sequence[Sequence[int]], cost: Sequence[float]) -> list[float]:
    """Each task's rank (see the module docstring); ``inputs`` in topological order."""
    return critical_path(cost, *readers(inputs))


def critical_path(cost: Sequence[float], uptr: Sequence[int], users: Sequence[int]) -> list[float]:
    """``ranks`` over flat readers (for graphs of millions of tasks): ``users[uptr[t]:uptr[t + 1]]``."""
    n = len(cost)
    path = [0.0] * n
    for t in range(n - 1, -1, -1):
        a, b = uptr[t], uptr[t + 1]
        path[t] = cost[t] + (max([path[u] for u in users[a:b]]) if b > a else 0.0)
    return path
