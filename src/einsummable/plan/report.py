"""The plan as a report: per node its blocks, the strategy they amount to and its load;
then, for this planner and every baseline, the predicted step time, the bytes across
and within machines, the peak memory per machine against capacity, and the binding
constraint (memory, NIC or compute).

    %3 einsum[ij,jk->ik x0 * x1 agg=add] f32[65536,256]  i:8 k:1 j:1  data parallel on i  ...
"""

from __future__ import annotations

from einsummable.ir import scalar
from einsummable.ir.graph import EinsumNode, Formation, InputNode
from einsummable.plan.baselines import batch_dims


def human(n: float, unit: str = "B") -> str:
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000 or prefix == "T":
            return f"{n:.0f} {prefix}{unit}" if prefix == "" else f"{n:.3g} {prefix}{unit}"
        n /= 1000
    return f"{n} {unit}"


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
    widths = [max(len(r[i]) for r in rows) for i in range(4)] if rows else [0] * 4
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
    return "\n".join([*lines, "", *table(plan)])


GiB = 2**30


def table(plan) -> list[str]:
    """Every planner's predicted step, bytes, peak memory and binding constraint."""
    header = ("planner", "predicted s", "compute s", "NIC s", "across machines", "busiest NIC",
              "within machines", "peak/machine", "fits", "binding", "planner cost")
    rows = [header]
    for name, s in ((plan.planner, plan.summary), *plan.baselines):
        star = " *" if name == plan.planner else ""
        rows.append((name + star, f"{s.step_seconds:.3g}", f"{s.compute_seconds:.3g}",
                     f"{s.network_seconds:.3g}", human(s.bytes_across), human(s.nic_bytes),
                     human(s.bytes_within), f"{s.peak / GiB:.3g} GiB",
                     "yes" if s.fits else "no", s.binding, human(s.model_bytes)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    out = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    s = plan.summary
    out.append(f"  memory per machine: {plan.cluster.memory_per_machine / GiB:.3g} GiB; {plan.planner} peak "
               + (s.memory.describe() if s.memory is not None else "unknown"))
    out.append(f"  binding constraint of {plan.planner}: {s.binding}")
    out.append("  predicted s = busiest core's kernels (or the critical path)"
               " + busiest NIC's bytes / bandwidth;"
               " planner cost = the bytes the planner's cost model charges (replicas, partial sums,"
               " repartitions)")
    return out


def brief(plan) -> str:
    """The report without its per-node rows: strategy counts and the planners' table."""
    g = plan.graph
    live = g.live()
    batch = batch_dims(g, plan.spaces)
    counts: dict[str, int] = {}
    for v, node in enumerate(g.nodes):
        if live[v] and isinstance(node, EinsumNode):
            what = strategy(plan.spaces[v].names, plan.parts[v].counts, plan.spaces[v].aggregated, batch[v])
            kind = what.split(" (")[0] if what.startswith(("data", "whole")) else what.split(" ")[0]
            counts[kind] = counts.get(kind, 0) + 1
    mix = ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    head = f"plan: {plan.planner} on {plan.cluster} ({plan.cluster.workers} workers)"
    return "\n".join([head, f"  einsums: {mix}", *table(plan)])
