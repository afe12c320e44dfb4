"""The plan as a report: per node its blocks, the strategy they amount to and its load;
then, for this planner and every baseline, the predicted step time, the bytes across
and within machines, the peak memory per machine against capacity, and the binding
constraint (memory, NIC or compute).

    %3 einsum[ij,jk->ik x0 * x1 agg=add] f32[65536,256]  i:8 k:1 j:1  data parallel on i  ...
"""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Callable, Mapping

from einsummable.ir import scalar
from einsummable.ir.graph import EinsumNode, Formation, InputNode
from einsummable.plan.baselines import batch_dims, dim_classes

WIDTH = 120  # a report line fits this many columns


def human(n: float, unit: str = "B") -> str:
    """Bytes in binary units (KiB, MiB, GiB, TiB); flops as F, KF, MF, GF, TF."""
    step, tail = (1024, "iB") if unit == "B" else (1000, unit)
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < step or prefix == "T":
            return f"{n:.0f} {unit}" if prefix == "" else f"{n:.3g} {prefix}{tail}"
        n /= step
    return f"{n} {unit}"


def shorten(text: str, width: int) -> str:
    """Cut a long label (a join expression) in its middle so that it fits ``width``."""
    if len(text) <= width:
        return text
    keep = max(1, width - 1)
    return text[: keep - keep // 3] + "…" + text[len(text) - keep // 3:]


def strategy(names: tuple[str, ...], counts: tuple[int, ...], aggregated: tuple[int, ...],
             batch: int | None) -> str:
    """Name what a partition does: "data parallel on b", "split c (partial sums)", "3D on a,b,c"."""
    split = [d for d, c in enumerate(counts) if c > 1]
    if not split:
        return "whole"
    summed = [names[d] for d in split if d in aggregated]
    tail = f" (partial sums over {','.join(summed)})" if summed else ""
    if len(split) == 1:
        d = split[0]
        return f"data parallel on {names[d]}" if d == batch else f"split {names[d]}{tail}"
    return f"{len(split)}D on {','.join(names[d] for d in split)}{tail}"


def _load(sp, part, workers: int) -> str:
    """The busiest worker's flops of one op and its imbalance, blocks dealt one per worker."""
    blocks = part.num_blocks
    most = sp.flops * -(-blocks // workers) / blocks
    mean = sp.flops / workers
    return f"flops/worker {human(most, 'F')} imbalance {most / mean if mean else 1.0:.2f}"


def names(g, v: int, sp) -> tuple[str, ...]:
    """The index letters of node v's space: the user's (``es.einsum("ij,jk->ik")``), for
    an einsum or the formation of one, when the frontend kept them; else a, b, c..."""
    node = g.nodes[v]
    src = node.inputs[0] if isinstance(node, Formation) else v
    user = g.index_names.get(src) if isinstance(g.nodes[src], EinsumNode) else None
    if user is None or len(user) < len(sp.names):
        return sp.names
    return tuple(user[: len(sp.names)])


def label(node, letters: tuple[str, ...]) -> str:
    """How the report names a node: an einsum by its spec in ``letters``."""
    if isinstance(node, InputNode):
        return f"input {node.name!r}"
    if not isinstance(node, EinsumNode):
        return node.describe()
    op = node.op
    spec = ",".join("".join(letters[i] for i in idx) for idx in op.inputs)
    text = f"{spec}->{''.join(letters[: op.out_rank])} {scalar.to_string(op.join)}"
    return f"einsum[{text} agg={op.agg}]" if op.agg else f"einsum[{text}]"


def render(plan) -> str:
    g, cluster = plan.graph, plan.cluster
    live = g.live()
    batch = batch_dims(g, plan.spaces)
    lines = [f"plan: {plan.planner} on {cluster} ({cluster.workers} workers)"]
    rows = []
    for v, node in enumerate(g.nodes):
        if not live[v]:
            continue
        sp, part = plan.spaces[v], plan.parts[v]
        letters = names(g, v, sp)
        shape = f"{node.dtype}[{','.join(map(str, node.shape))}]"
        if isinstance(node, Formation):
            what = "inherits" if part == plan.out_partition(node.inputs[0]) else "reduce-scatter"
        else:
            what = strategy(letters, part.counts, sp.aggregated, batch[v])
        load = _load(sp, part, cluster.workers) if isinstance(node, EinsumNode) else ""
        rows.append((f"%{v} {label(node, letters)}", shape, part.describe(letters), what, load))
    lines += _rows(rows)
    return "\n".join([*lines, "", *table(plan)])


def _aligned(rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip() for r in rows]


def _rows(rows: list[tuple[str, ...]]) -> list[str]:
    """One line per node when that fits WIDTH; else two: the node and its shape, then its
    partition, strategy and load indented; a long join expression is cut in its middle."""
    if not rows:
        return []
    one = _aligned(rows)
    if max(map(len, one)) <= WIDTH:
        return one
    shape = max(len(r[1]) for r in rows)
    heads = _aligned([(shorten(r[0], WIDTH - 4 - shape), r[1]) for r in rows])
    tails = _aligned([r[2:] for r in rows], indent="      ")
    return [line for pair in zip(heads, tails, strict=True) for line in pair]


def table(plan) -> list[str]:
    """Every planner's predicted step, bytes, peak memory and binding constraint."""
    header = ("planner", "step s", "compute s", "NIC s", "across", "busiest NIC",
              "within", "peak", "fits", "binding", "planner cost")
    rows = [header]
    for name, s in ((plan.planner, plan.summary), *plan.baselines):
        star = " *" if name == plan.planner else ""
        rows.append((name + star, seconds(s.step_seconds), seconds(s.compute_seconds),
                     seconds(s.network_seconds), human(s.bytes_across), human(s.nic_bytes),
                     human(s.bytes_within), human(s.peak),
                     "yes" if s.fits else "no", s.binding, human(s.model_bytes)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    out = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    s = plan.summary
    out.append(f"  memory per machine: {human(plan.cluster.memory_per_machine)}")
    out.append(f"  {plan.planner} peak " + (_memory(s.memory) if s.memory is not None else "unknown"))
    if s.memory is not None and s.memory.expert is not None:
        e = s.memory.expert
        out.append(f"  expert arithmetic for this plan: {human(e.total)} = state {human(e.state)} + saved "
                   f"activations {human(e.saved)} + node %{e.at}'s working set {human(e.working)}")
    if s.memory is not None and s.memory.critical_path_peak is not None:
        out.append(f"  order: ready work runs in the program's order (ir/priority.py); by critical path "
                   f"the peak would be {human(s.memory.critical_path_peak)}")
    if plan.remat is not None:
        out.append(f"  {plan.remat.describe(s.memory)}")
    if plan.offload is not None:
        out.append(f"  {plan.offload.describe()}")
    out.append(f"  binding constraint of {plan.planner}: {s.binding}")
    out.append("  across, within = bytes moved between machines, between the cores of one machine;"
               " peak = memory per machine")
    out.append("  step s = busiest core's kernels (or the critical path)"
               " + busiest NIC's bytes / bandwidth;")
    out.append("  planner cost = the bytes the planner's cost model charges (replicas, partial sums,"
               " repartitions)")
    return out


def seconds(x: float) -> str:
    """Three significant figures, without an exponent for a long step."""
    return f"{x:,.0f}" if x >= 1000 else f"{x:.3g}"


def _memory(m) -> str:
    """A peak and its parts (plan/predict/memory.py's Memory), in the report's binary units."""
    return (f"{human(m.peak)} = inputs {human(m.inputs)} + outputs {human(m.outputs)} + activations "
            f"{human(m.activations)} + transient {human(m.transient)} (at node %{m.at})")


def _kind(counts: tuple[int, ...], batch: int | None) -> str:
    """A partition in words: whole, data parallel (split on the batch only), or split in kD."""
    split = [d for d, c in enumerate(counts) if c > 1]
    if not split:
        return "whole"
    if split == [batch]:
        return "data parallel (batch)"
    return f"split in {len(split)}D"


def dim_namer(plan, roles: Mapping[str, str] | None = None) -> Callable[[int, int], str]:
    """``name(v, d)``: what dim d of node v is, for the summary. The batch is "batch"; any other
    index is named by the letter the user's einsums most often give it across the graph (an
    index keeps its letter through the ops autodiff adds, which have none of their own; a
    helper's generic "abc" counts only where nothing else names it), in ``roles``' words
    where given (a model's legend: "d" -> "hidden")."""
    g, sps = plan.graph, plan.spaces
    classes = dim_classes(g, sps)
    batch = batch_dims(g, sps)
    votes: dict[tuple[int, int], Counter] = {}
    for v, letters in g.index_names.items():
        if isinstance(g.nodes[v], EinsumNode) and len(letters) >= len(sps[v].shape):
            generic = letters == string.ascii_lowercase[: len(letters)]  # a helper's "abc", as nn's
            for d in range(len(sps[v].shape)):
                votes.setdefault(classes[(v, d)], Counter())[not generic, letters[d]] += 1

    def name(v: int, d: int) -> str:
        if d == batch[v]:
            return "batch"
        vote = votes.get(classes[(v, d)])
        letter = max(vote.items(), key=lambda kv: (kv[0][0], kv[1]))[0][1] if vote else sps[v].names[d]
        return (roles or {}).get(letter, letter)

    return name


def words(plan, roles: Mapping[str, str] | None = None) -> list[str]:
    """The einsums counted by how their blocks split, each kind with the indices it splits
    (most common first), and why when every op stays whole."""
    g = plan.graph
    live = g.live()
    batch = batch_dims(g, plan.spaces)
    name = dim_namer(plan, roles)
    kinds: dict[str, Counter] = {}
    work = 0.0
    for v, node in enumerate(g.nodes):
        if live[v] and isinstance(node, EinsumNode):
            counts = plan.parts[v].counts
            split = sorted((name(v, d) for d, c in enumerate(counts) if c > 1),
                           key=lambda n: (n != "batch", n))  # batch first, then by name
            kinds.setdefault(_kind(counts, batch[v]), Counter())[" × ".join(split)] += 1
            work += plan.spaces[v].flops
    total = sum(sum(c.values()) for c in kinds.values())
    if not total:
        return ["  no einsums"]
    out = [f"  {total:,} einsums, by the indices their blocks split:"]
    width = len(f"{max(sum(c.values()) for c in kinds.values()):,}")
    for kind, combos in sorted(kinds.items(), key=lambda kv: -sum(kv[1].values())):
        head = f"    {sum(combos.values()):>{width},} {kind}"
        out.append(head if kind in ("whole", "data parallel (batch)") else _listing(head + ": ", combos))
    if len(kinds) == 1 and "whole" in kinds and plan.cluster.workers > 1:
        per = work / total / plan.cluster.workers
        out.append(f"  every op stays whole: too little work per block for {plan.cluster.workers} cores"
                   f" (about {human(per, 'F')} per core per op;")
        out.append("  a block's task overhead and moves would cost more than splitting saves)")
    return out


def _listing(head: str, combos: Counter) -> str:
    """``head`` and the most common index combinations with their counts, within WIDTH."""
    items = combos.most_common()
    line = f"{head}{items[0][1]:,} {items[0][0]}"
    for i, (dims, n) in enumerate(items[1:], 1):
        left = len(items) - i - 1
        piece = f", {n:,} {dims}"
        if len(line + piece + (f", … {left} more" if left else "")) > WIDTH:
            return line + f", … {len(items) - i} more"
        line += piece
    return line


def brief(plan, roles: Mapping[str, str] | None = None) -> str:
    """The report without its per-node rows: the strategy in words and the planners' table.
    ``roles`` names the indices by their letters, as ``words`` says."""
    head = f"plan: {plan.planner} on {plan.cluster} ({plan.cluster.workers} workers)"
    return "\n".join([head, *words(plan, roles), *table(plan)])
