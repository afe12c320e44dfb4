"""Peak memory of one machine under a plan, taken from the order in which the engines run.

A machine is the unit of memory: its cores share one copy of every block it holds.
Given each node's block counts across machines (``cm``) and, once chosen, within a
machine (``cc``), a machine holds ``bytes / (machine blocks of the output)`` of a node,
times the partial sums its cores keep of it. The rules follow the lowering and the
engines, and are checked against the simulator (tests/plan/test_memory_estimate.py):
- order: nodes run in the engines' order (``engine_order``, ir/priority.py): by
  default the longest chain of work after them first, so a value nothing waits on (a
  weight's gradient, the loss) runs late and what it reads is held until then; given a
  ``budget`` that this order exceeds, the program's order is tried too, and the smaller
  peak is the figure, its ``Memory.order`` the order the TaskGraph then carries;
- graph inputs (parameters, optimizer state, data) are held for the whole step, save those
  the step replaces (an output of the same name: a session run gives them up to it,
  compile.Session), held to their last reader: a training step's old weights and moments
  go as it makes the new ones; every other value from the node that makes it to its last
  reader, a graph output to the end;
- views (reshapes, complex views, the formation of a finished value or of a sum no
  block splits) hold nothing and keep their source alive; fills are rebuilt where read;
- an operand laid out otherwise than its reader needs is copied: across machines the
  part another machine holds, within a machine a block assembled from several. The
  lowering makes one copy per value and layout for all its readers, and the engines make
  it as soon as they can, so it lives from its value's making (an input's: the step's
  start) to its last reader. In the program's order a copy of a graph input (a gathered FSDP
  weight) is instead made ``priority.PREFETCH`` nodes before its reader and shared only by
  readers within that many nodes of the one before (lower/prefetch.py): the forward's
  gathered weights are freed after it and gathered again for the backward.

The figure is for the busiest machine, assuming every machine holds an equal share
(whole values count on every machine that may hold them). ``replicated=True``
counts every graph input and output whole on each machine, as data parallelism
keeps a full replica of parameters, gradients and optimizer state.

Example: a 1 GiB weight split 4 ways across machines counts 256 MiB on each; a reader
that needs it whole adds the other 768 MiB on each machine from the start of the step
to that reader.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from einsummable.ir import priority
from einsummable.ir.dtypes import FLOATS
from einsummable.ir.graph import ComplexView, EinGraph, Fill, Formation, InputNode, Reshape
from einsummable.plan.space import Space, nbytes

Counts = Sequence[int]


@dataclass(frozen=True)
class Expert:
    """An expert's arithmetic for the same plan (its layouts, on the busiest machine), as one adds
    up FSDP with checkpointing by hand: the state held all step (parameters, optimizer state,
    gradients), the activations saved for the backward, and one node's working set. The
    estimate may come out below it (a gradient is made late, not held all step) or above it
    (values held at once that the sum leaves out: see the estimate's parts)."""

    state: float  # graph inputs, and the outputs that replace none (gradients, the loss): held all step
    saved: float  # values the forward makes and the backward reads (made before the loss, read after)
    working: float  # the largest node's working set: its output, operands that are neither, its copies
    at: int  # that node

    @property
    def total(self) -> float:
        return self.state + self.saved + self.working



@dataclass(frozen=True)
class Memory:
    """The busiest machine's peak, in bytes, and what it is made of at that moment."""

    peak: float
    inputs: float  # graph inputs: parameters, optimizer state, data
    outputs: float  # graph outputs made so far: gradients, new state, loss
    activations: float  # intermediate values still to be read
    transient: float  # operand copies gathered for the node running at the peak
    at: int  # the node running at the peak
    order: str = priority.CRITICAL_PATH  # the engines' order this peak is for
    critical_path_peak: float | None = None  # in the program's order: the critical path's peak
    expert: Expert | None = None  # an expert's arithmetic for the same plan
    machine: int = 0  # the column of ``peak``'s bytes (the busiest machine) it is for

    def describe(self) -> str:
        order = "" if self.order == priority.CRITICAL_PATH else f", in the {self.order} order"
        return (f"{gib(self.peak)} GiB = inputs {gib(self.inputs)} + outputs {gib(self.outputs)}"
                f" + activations {gib(self.activations)} + transient {gib(self.transient)}"
                f" (at node %{self.at}{order})")


def gib(n: float) -> str:
    """Bytes in GiB to three significant digits, never in exponent form: 0.0107, 27.3, 532."""
    return np.format_float_positional(n / 2**30, precision=3, fractional=False, trim="-")


def holds_nothing(g: EinGraph, sps: Sequence[Space], v: int) -> bool:
    """Views and fills: no bytes of their own."""
    node = g.nodes[v]
    if isinstance(node, Reshape | ComplexView | Fill):
        return True
    return isinstance(node, Formation) and not sps[node.inputs[0]].aggregated


def formed_in_place(g: EinGraph, sps: Sequence[Space], counts: Sequence[Counts], v: int) -> bool:
    """A formation of a sum that no block splits, laid out as its einsum's output: the
    lowering hands on the einsum's blocks, so it holds nothing of its own."""
    node = g.nodes[v]
    if not isinstance(node, Formation):
        return False
    u = node.inputs[0]
    return (all(counts[u][d] == 1 for d in sps[u].aggregated)
            and tuple(counts[v]) == tuple(counts[u][d] for d in sps[u].out_dims))


def shares(g: EinGraph, sps: Sequence[Space], cm: Sequence[Counts],
           cc: Sequence[Counts] | None = None) -> np.ndarray:
    """Bytes of each node's output on one machine that holds a block of it. With the
    counts within a machine (``cc``), a sum split across its cores holds one partial
    sum per core block of the summed dimensions."""
    full = cm if cc is None else [tuple(a * b for a, b in zip(x, y, strict=True))
                                  for x, y in zip(cm, cc, strict=True)]
    out = np.zeros(len(g.nodes))
    for v, (node, sp) in enumerate(zip(g.nodes, sps, strict=True)):
        if holds_nothing(g, sps, v) or formed_in_place(g, sps, full, v):
            continue
        partials = 1 if cc is None else math.prod(cc[v][d] for d in sp.aggregated)
        out[v] = nbytes(node) / math.prod(cm[v][d] for d in sp.out_dims) * partials
    return out


def gathered(g: EinGraph, sps: Sequence[Space], cm: Sequence[Counts], live: Sequence[bool],
             cc: Sequence[Counts] | None = None, cores: int = 1) -> list[tuple[int, list[int], float]]:
    """Operand copies a machine makes for readers laid out otherwise than the value they
    read: the value, the readers of each copy and its bytes on one machine.

    Across machines, a reader's piece held by another machine crosses once and is kept
    (a gathered weight, a repartitioned activation). Within a machine (``cc`` given), a
    core block that needs pieces of several blocks assembles them into a block of its
    own: once per machine, plus once more on each reading core that holds a piece of it
    (lower/lowering.py); one that lies inside a held block is a view. The
    lowering makes each copy once and hands it to every reader of that layout, and the
    engines make it as soon as the value is there (they rank it by its readers' critical
    path), so a copy lives from the value's making to its last reader: a gathered
    weight from the start of the step.
    """
    copies: dict[tuple, tuple[int, list[int], float]] = {}

    def add(key: tuple, v: int, size: float) -> None:
        _, readers, _ = copies.setdefault(key, (key[0], [], size))
        if readers[-1:] != [v]:
            readers.append(v)

    for v, node in enumerate(g.nodes):
        if not live[v] or isinstance(node, InputNode | Formation):  # a formation's copy is its value
            continue
        sp = sps[v]
        for k, u in enumerate(node.inputs):
            if isinstance(g.nodes[u], Fill) or k >= len(sp.operands):
                continue
            dims = sp.operands[k]
            need = tuple(cm[v][d] if d is not None else 1 for d in dims)
            piece = nbytes(g.nodes[u]) / math.prod(need)
            have = tuple(cm[u][d] for d in sps[u].out_dims)
            if need != have:  # a gather brings the other machines' part; else assume it all crosses
                coarser = all(n <= h for n, h in zip(need, have, strict=True))
                add((u, need), v, piece * (1 - math.prod(need) / math.prod(have) if coarser else 1))
            if cc is None:
                continue
            inner = tuple(a * (cc[v][d] if d is not None else 1) for a, d in zip(need, dims, strict=True))
            held = tuple(cm[u][d] * cc[u][d] for d in sps[u].out_dims)
            if any(n % h for n, h in zip(inner, held, strict=True)):
                add((u, inner), v, piece)  # one block per box on each machine, its cores share it
    return list(copies.values())


def estimate(g: EinGraph, sps: Sequence[Space], cm: Sequence[Counts], live: Sequence[bool],
             replicated: bool = False, cc: Sequence[Counts] | None = None, cores: int = 1,
             budget: float | None = None) -> Memory:
    """The peak of one machine holding an equal share of every node laid out by ``cm``
    (and, when given, ``cc`` over its ``cores``); ``budget``: see ``peak``."""
    size = shares(g, sps, cm, cc)
    copies = gathered(g, sps, cm, live, cc, cores)
    if replicated:  # whole state on every machine, which its readers need not gather
        whole = np.array([float(nbytes(node)) for node in g.nodes])
        state = _inputs(g) | _outputs(g)
        size = np.where(state & (size > 0), whole, size)
        copies = [c for c in copies if not state[c[0]]]
    return peak(g, sps, live, size[:, None], copies, budget)


def peak(g: EinGraph, sps: Sequence[Space], live: Sequence[bool], size: np.ndarray,
         copies: Sequence[tuple[int, list[int], float]] = (), budget: float | None = None) -> Memory:
    """The busiest machine's peak, given [nodes, machines] bytes held, and operand copies
    (the value copied, its readers and bytes on every machine) held from the value's
    making to the last reader. In the critical-path order, unless that peak exceeds
    ``budget`` and the program's order gives a smaller one (ir/priority.py)."""
    size, copies = _stored(g, live, size, copies)
    if stored_names(g):  # the loads are gated in the program's order alone (lower/prefetch.py)
        first = _peak(g, sps, live, size, copies, priority.PROGRAM)
    else:
        first = _peak(g, sps, live, size, copies, priority.CRITICAL_PATH)
    if budget is not None and first.peak > budget and first.order != priority.PROGRAM:
        other = _peak(g, sps, live, size, copies, priority.PROGRAM)
        if other.peak < first.peak:
            first = replace(other, critical_path_peak=first.peak)
    if not len(g.nodes):
        return first
    return replace(first, expert=expert(g, sps, live, size[:, first.machine], copies))


Copies = Sequence[tuple[int, list[int], float]]  # (value copied, its readers, bytes on every machine)


def _stored(g: EinGraph, live: Sequence[bool], size: np.ndarray, copies: Copies) -> tuple[np.ndarray, list]:
    """An input kept in host storage holds nothing; each of its readers' groups loads its
    blocks (a copy of resident state, charged as ``peak`` charges those). The output of its
    name is stored as it is made (``_spans``)."""
    if not stored_names(g):
        return size, list(copies)
    size, copies = size.copy(), list(copies)
    for v, node in enumerate(g.nodes):
        if isinstance(node, InputNode) and node.stored:
            readers = [r for r, other in enumerate(g.nodes) if live[r] and v in other.inputs]
            if readers:
                copies.append((v, readers, float(size[v].max())))
            size[v] = 0.0
    return size, copies


def stored_names(g: EinGraph) -> set[str]:
    """The inputs kept in host storage (plan/offload.py)."""
    return {node.name for node in g.nodes if isinstance(node, InputNode) and node.stored}


def expert(g: EinGraph, sps: Sequence[Space], live: Sequence[bool], size: np.ndarray,
           copies: Sequence[tuple[int, list[int], float]]) -> Expert:
    """``Expert`` of one machine holding ``size`` bytes of each node, ``copies`` as ``peak``'s."""
    n = len(g.nodes)
    is_input, is_output = _inputs(g), _outputs(g)
    inputs = {node.name for node in g.nodes if isinstance(node, InputNode)}
    replacing = np.zeros(n, dtype=bool)
    replacing[[v for name, v in g.outputs.items() if name in inputs and not is_input[v]]] = True
    held = np.where(np.array(live), size, 0.0)
    state, replacing = is_input | is_output, replacing
    for v in reversed(range(n)):  # an output that is a view holds its source's bytes
        if (state[v] or replacing[v]) and live[v] and not held[v] and not is_input[v]:
            for u in g.nodes[v].inputs:
                state[u] |= state[v]
                replacing[u] |= replacing[v]
    total_state = float(held[state].sum() - held[replacing].sum())
    last = np.arange(n)  # the last node (in id order) that reads each value, through views
    for v, node in enumerate(g.nodes):
        if live[v]:
            for u in node.inputs:
                last[u] = max(last[u], v)
    for v in reversed(range(n)):
        if live[v] and holds_nothing(g, sps, v):
            for u in g.nodes[v].inputs:
                last[u] = max(last[u], last[v])
    loss = loss_of(g)
    saved = np.zeros(n, dtype=bool)
    if loss is not None:
        saved = (np.arange(n) < loss) & (last > loss) & ~state
    copied = np.zeros(n)
    for _, readers, b in copies:
        copied[readers] += b
    work = np.zeros(n)
    for v, node in enumerate(g.nodes):
        if live[v] and not is_input[v]:
            operands = [u for u in set(node.inputs) if not (state[u] or saved[u])]
            work[v] = (0.0 if state[v] or saved[v] else held[v]) + held[operands].sum() + copied[v]
    at = int(np.argmax(work))
    return Expert(total_state, float(held[saved].sum()), float(work[at]), at)


def loss_of(g: EinGraph) -> int | None:
    """The loss: the output named ``loss`` (as the optimizers name it), else the only real scalar output."""
    if "loss" in g.outputs:
        return g.outputs["loss"]
    scalars = [v for v in g.outputs.values() if g.nodes[v].shape == () and g.nodes[v].dtype in FLOATS]
    return scalars[0] if len(set(scalars)) == 1 else None


def _peak(g: EinGraph, sps: Sequence[Space], live: Sequence[bool], size: np.ndarray,
          copies: Sequence[tuple[int, list[int], float]], rule: str) -> Memory:
    n = len(g.nodes)
    if not n:
        return Memory(0.0, 0.0, 0.0, 0.0, 0.0, 0, rule)
    is_input, is_output = _inputs(g), _outputs(g)
    order = engine_order(g, sps, live, rule)
    alias = [holds_nothing(g, sps, v) or (isinstance(node, Formation) and not size[v].any())
             for v, node in enumerate(g.nodes)]
    start, end = _spans(g, live, order, alias)
    size = np.where(np.array(live)[:, None], size, 0.0)
    delta = np.zeros((n + 1, size.shape[1]))
    np.add.at(delta, start, size)
    np.add.at(delta, end + 1, -size)
    held = np.cumsum(delta, axis=0)[:n]
    moved = np.zeros(n + 1)
    reach = np.maximum.accumulate(np.where(live, start, -1))  # per node: the latest step of it or before
    resident = is_input.copy()  # held from the step's start: inputs and views of them
    for v, node in enumerate(g.nodes):
        resident[v] |= bool(alias[v] and node.inputs and all(resident[u] for u in node.inputs))
    for u, readers, b in copies:
        for group in _groups(readers) if resident[u] and rule == priority.PROGRAM else [readers]:
            steps = start[group]
            first = steps.min()
            if not resident[u]:
                begin = first
            elif rule == priority.PROGRAM:  # made after a gate PREFETCH nodes before it (lower/prefetch.py)
                gate = group[0] - priority.PREFETCH
                begin = min(first, reach[gate] + 1) if gate > 0 and reach[gate] >= 0 else 0
            else:
                begin = 0
            moved[begin] += b
            moved[steps.max() + 1] -= b
    moved = np.cumsum(moved)[:n]
    total = held + moved[:, None]
    t, m = np.unravel_index(int(np.argmax(total)), total.shape)
    alive = (start <= t) & (end >= t)
    col = size[:, m]
    return Memory(
        peak=float(total[t, m]),
        inputs=float(col[alive & is_input].sum()),
        outputs=float(col[alive & is_output & ~is_input].sum()),
        activations=float(col[alive & ~is_input & ~is_output].sum()),
        transient=float(moved[t]),
        at=int(order[t]),
        order=rule,
        machine=int(m),
    )


def _groups(readers: list[int]) -> list[list[int]]:
    """Readers (node ids, ascending) that share one copy of resident state in the program's
    order: a reader more than ``PREFETCH`` nodes after the one before gets a copy of its own."""
    out = [[readers[0]]]
    for v in readers[1:]:
        if v - out[-1][-1] > priority.PREFETCH:
            out.append([v])
        else:
            out[-1].append(v)
    return out


def engine_order(g: EinGraph, sps: Sequence[Space], live: Sequence[bool],
                 rule: str = priority.CRITICAL_PATH) -> np.ndarray:
    """Node ids in the order the engines run them when one core has work waiting: of the
    ready nodes, the highest ranked by ``rule`` first (ir/priority.py, as the engines and
    the simulator rank tasks), ties by id. Work is flops plus bytes written. Unlike id
    order, the critical path runs a value nothing waits on (a weight's gradient, the loss)
    late, so what it reads is held longer. Dead nodes go last."""
    n = len(g.nodes)
    inputs = [node.inputs if live[v] else () for v, node in enumerate(g.nodes)]
    ptr, users = priority.readers(inputs)
    pending = [len(ins) for ins in inputs]
    if rule == priority.PROGRAM:
        rank = priority.program(n)
    else:
        cost = [sps[v].flops + nbytes(g.nodes[v]) if live[v] else 0.0 for v in range(n)]
        rank = priority.critical_path(cost, ptr, users)
    ready = [(-rank[v], v) for v in range(n) if live[v] and not pending[v]]
    heapq.heapify(ready)
    out = []
    while ready:
        _, v = heapq.heappop(ready)
        out.append(v)
        for u in users[ptr[v]:ptr[v + 1]]:
            pending[u] -= 1
            if not pending[u]:
                heapq.heappush(ready, (-rank[u], u))
    out += [v for v in range(n) if not live[v]]
    return np.array(out, dtype=np.int64)


def _inputs(g: EinGraph) -> np.ndarray:
    return np.array([isinstance(node, InputNode) for node in g.nodes], dtype=bool)


def _outputs(g: EinGraph) -> np.ndarray:
    out = np.zeros(len(g.nodes), dtype=bool)
    out[list(g.outputs.values())] = True
    return out


def _spans(g: EinGraph, live: Sequence[bool], order: np.ndarray,
           alias: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    """First and last step (position in ``order``) during which each node's output is held;
    an ``alias`` (a view, a formation in place) holds its source instead."""
    n = len(g.nodes)
    is_input, is_output = _inputs(g), _outputs(g)
    start = np.empty(n, dtype=np.int64)
    start[order] = np.arange(n)
    end = start.copy()
    for v, node in enumerate(g.nodes):
        if live[v]:
            for u in node.inputs:
                end[u] = max(end[u], start[v])
    names = stored_names(g)
    kept = is_output.copy()
    kept[[v for name, v in g.outputs.items() if name in names]] = False  # stored as made (plan/offload.py)
    end[kept] = n - 1
    # a view keeps its source alive for as long as the view is read
    for v in reversed(range(n)):
        if live[v] and alias[v]:
            for u in g.nodes[v].inputs:
                end[u] = max(end[u], end[v])
    start[is_input] = 0
    end[is_input & ~replaced(g)] = n - 1
    return start, end


def replaced(g: EinGraph) -> np.ndarray:
    """The graph inputs an output of the same name replaces (a session gives them up to the run)."""
    out = np.zeros(len(g.nodes), dtype=bool)
    for v, node in enumerate(g.nodes):
        if isinstance(node, InputNode) and g.outputs.get(node.name, v) != v:
            out[v] = True
    return out


def lifetimes(g: EinGraph, sps: Sequence[Space], live: Sequence[bool]) -> np.ndarray:
    """Each node's share of the step it is held (1.0: all of it), for the planner's penalty."""
    alias = [holds_nothing(g, sps, v) for v in range(len(g.nodes))]
    start, end = _spans(g, live, engine_order(g, sps, live), alias)
    return (end - start + 1) / max(len(g.nodes), 1)
