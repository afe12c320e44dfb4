"""Which ready work runs first: one rule for the engines, the simulator and the planner's
memory estimate (plan/predict/memory.py), so that the estimate follows the order that runs.

Two orders; the plan picks one and the TaskGraph carries it (``TaskGraph.order``):
- ``CRITICAL_PATH``, the default: a task's rank is the costliest chain of work that waits
  on it, and ready tasks run highest rank first. It keeps the cores busy, but defers work
  that little waits on, such as a weight's gradient (its chain is only the optimizer's
  update), to when nothing else is ready, and what that work reads is held until then:
  Llama-7B on one machine, rematerialised, holds every layer's recomputed activations to
  the end of the backward (466 GiB estimated).
- ``PROGRAM``: ready tasks run in the program's order (task ids, which follow the graph's
  nodes: the forward, then each layer's backward with its weight gradients, as an eager
  framework runs them). Work still runs as soon as it is ready, so cores never idle for
  it, but the earliest-written work goes first, and a layer's values die with its
  backward: the same Llama-7B plan needs 151 GiB. The planner chooses it only when the
  critical-path order does not fit the machine's memory (plan/planners.py).

In the program's order a free worker starts no task more than ``window`` tasks past the
earliest unfinished one (the engines and the simulator), and a copy of resident state (an
FSDP-gathered weight) is made at most ``PREFETCH`` nodes ahead of its reader and shared
only by readers within ``PREFETCH`` nodes of the one before (lower/prefetch.py gates and
re-makes the copies; plan/predict/memory.py charges them so): a layer's gathered weights live for
that layer, in the forward and again in the backward, as hand-written FSDP holds them.
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


CRITICAL_PATH = "critical-path"
PROGRAM = "program"
ORDERS = (CRITICAL_PATH, PROGRAM)
PREFETCH = 16  # nodes: how far ahead of its reader a copy of resident state is made
AHEAD = 8  # tasks per worker: how far past the earliest unfinished task the program's order runs


def window(order: str, workers: int) -> int | None:
    """How many tasks past the earliest unfinished one a free worker may start (None: any).

    In the program's order the memory estimate follows one core's run in id order; with
    several workers a free one would otherwise take any ready task, however far ahead (a
    weight's gradient long before its update can run, holding it meanwhile). Bounding the
    reach to ``AHEAD`` tasks a worker keeps the run near the estimate's order and cannot
    stall: the earliest unfinished task has its inputs done and is within reach. The
    critical path's order is not bounded."""
    return AHEAD * max(workers, 1) if order == PROGRAM else None


def ranks(inputs: Sequence[Sequence[int]], cost: Sequence[float], order: str = CRITICAL_PATH) -> list[float]:
    """Each task's rank in ``order`` (see the module docstring); ``inputs`` in topological order."""
    if order == PROGRAM:
        return program(len(inputs))
    return critical_path(cost, *readers(inputs))


def program(n: int) -> list[float]:
    """Ranks that run ready work in id order: the earliest first."""
    return [-float(t) for t in range(n)]


def critical_path(cost: Sequence[float], uptr: Sequence[int], users: Sequence[int]) -> list[float]:
    """``ranks`` over flat readers (for graphs of millions of tasks): ``users[uptr[t]:uptr[t + 1]]``."""
    n = len(cost)
    path = [0.0] * n
    for t in range(n - 1, -1, -1):
        a, b = uptr[t], uptr[t + 1]
        path[t] = cost[t] + (max([path[u] for u in users[a:b]]) if b > a else 0.0)
    return path
