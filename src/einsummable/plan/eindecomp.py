"""EinDecomp: choose every node's partition to move as few bytes as possible.

Inputs: an EinGraph, a worker count p and a Cluster. Output: block counts per
node (a near-equal partition of its space). Policy (docs/design.md §5):
1. Cut the DAG into trees. Nodes are visited from the outputs toward the inputs;
   a node joins the tree of one consumer (the heaviest reader) when no other
   consumer is already in that tree, so every tree is an induced subgraph and a
   dynamic program over it is exact.
2. Solve the trees in the order they were made (outputs first). Within a tree a
   DP runs producers before consumers, each message a numpy min over a
   [producer candidates × consumer candidates] cost matrix. Edges to nodes
   outside the tree that are already fixed enter as unary costs; the rest wait.
3. Sweep again with everything fixed: each tree is re-solved exactly given its
   neighbours (block coordinate descent), so the total never rises. Stop when a
   sweep changes nothing.

Example: ``x[b,i] @ w[i,k]`` with b huge at p = 8 cuts b into 8 (data parallel):
w is copied 7 times, which is far less than any split of i or k would move.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from einsummable.ir.graph import EinGraph
from einsummable.plan.cost import CostModel

MAX_SWEEPS = 4


def trees(g: EinGraph, model: CostModel, live: Sequence[bool]) -> tuple[list[int], list[int]]:
    """Tree id and tree parent (or -1) per node; tree ids count up from the outputs."""
    n = len(g.nodes)
    users: list[list[int]] = [[] for _ in range(n)]
    for v, node in enumerate(g.nodes):
        if live[v]:
            for u in dict.fromkeys(node.inputs):
                users[u].append(v)
    tree = [-1] * n
    parent = [-1] * n
    count = 0
    for v in reversed(range(n)):
        if not live[v]:
            continue
        readers = sorted(users[v], key=lambda w: -model.spaces[w].flops)
        for w in readers:
            if sum(1 for x in users[v] if tree[x] == tree[w]) == 1:
                tree[v], parent[v] = tree[w], w
                break
        else:
            tree[v] = count
            count += 1
    return tree, parent


def solve(g: EinGraph, model: CostModel, live: Sequence[bool],
          start: Sequence[int] | None = None) -> list[int]:
    """A candidate index per node (0 for dead nodes). ``start`` (-1: none) seeds the sweeps:
    each tree is then solved given its seeded neighbours, so the result costs no more than
    the seed on the model."""
    n = len(g.nodes)
    tree, parent = trees(g, model, live)
    members: dict[int, list[int]] = {}
    for v in range(n):
        if live[v]:
            members.setdefault(tree[v], []).append(v)
    users: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # (reader, operand position)
    for v, node in enumerate(g.nodes):
        if live[v]:
            for k, u in enumerate(node.inputs):
                users[u].append((v, k))
    choice = list(start) if start is not None else [-1] * n
    for sweep in range(MAX_SWEEPS):
        changed = False
        for t in sorted(members):
            nodes = members[t]
            new = _solve_tree(g, model, nodes, set(nodes), parent, users, choice)
            for v, c in new.items():
                changed |= choice[v] != c
                choice[v] = c
        if sweep and not changed:
            break
    return [max(c, 0) for c in choice]


def _solve_tree(g, model: CostModel, nodes: list[int], inside: set[int], parent: list[int],
                users: list[list[tuple[int, int]]], choice: list[int]) -> dict[int, int]:
    value: dict[int, np.ndarray] = {}
    back: dict[int, np.ndarray] = {}
    for x in nodes:  # ascending ids: producers before consumers
        cost = model.unary[x].copy()
        inputs = g.nodes[x].inputs
        for k, u in enumerate(inputs):
            if choice[u] >= 0 and u not in inside:
                cost += model.unit_t(u, x, k)[:, choice[u]] * model.scale(u)
        for w, k in users[x]:
            if w not in inside and choice[w] >= 0:
                cost += model.unit_t(x, w, k)[choice[w]] * model.scale(x)
        for c in dict.fromkeys(u for u in inputs if u in inside and parent[u] == x):
            if x in model.follow:  # a formation: the best candidate of c with each output partition
                back[c] = _group_argmin(value[c], model.follow[x], len(cost))
                cost += value[c][back[c]]
                continue
            ks = [k for k, u in enumerate(inputs) if u == c]
            # a candidate of c dearer than c's best plus the most its edges can cost never wins
            rows = np.flatnonzero(value[c] <= value[c].min() + len(ks) * model.bound(c, x))
            m = model.unit_t(c, x, ks[0])[:, rows] * model.scale(c)
            for k in ks[1:]:
                m += model.unit_t(c, x, k)[:, rows] * model.scale(c)
            m += value[c][rows]
            best = np.argmin(m, axis=1)
            back[c] = rows[best]
            cost += m[np.arange(len(m)), best]
        value[x] = cost
    out: dict[int, int] = {}
    for x in reversed(nodes):
        if parent[x] in inside:
            out[x] = int(back[x][out[parent[x]]])
        else:
            out[x] = int(np.argmin(value[x]))
    return out


def _group_argmin(values: np.ndarray, group: np.ndarray, groups: int) -> np.ndarray:
    """For each group, the index of its smallest value (the first one on ties)."""
    order = np.lexsort((np.arange(len(values)), values, group))
    return order[np.searchsorted(group[order], np.arange(groups))]
