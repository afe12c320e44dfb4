"""The plan as a report: per node its blocks, the strategy they amount to and its load;
in total the bytes moved, against every baseline planner.

    %3 einsum[ac,cb->ab x0 * x1 agg=add] f32[65536,256]  a:8 b:1 c:1  data parallel on a  ...
"""

from __future__ import annotations

import numpy as np

from einsummable.ir.graph import EinsumNode, Formation, InputNode
from einsummable.plan.baselines import batch_dims
from einsummable.plan.traffic import flops_per_block


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
        label = f"input {node.name!r}" if isinstance(node, InputNode) else node.describe()
        shape = f"{node.dtype}[{','.join(map(str, node.shape))}]"
        if isinstance(node, Formation):
            what = "inherits"
        else:
            what = strategy(sp.names, part.counts, sp.aggregated, batch[v])
        load = ""
        if isinstance(node, EinsumNode):
            per = np.zeros(cluster.workers)
            np.add.at(per, list(plan.locs[v]), flops_per_block(sp, part))
            mean = per.mean()
            load = f"flops/worker {human(per.max(), 'F')} imbalance {per.max() / mean if mean else 1.0:.2f}"
        rows.append((f"%{v} {label}", shape, part.describe(sp.names), what, load))
    widths = [max(len(r[i]) for r in rows) for i in range(4)] if rows else [0] * 4
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
    lines.append("")
    header = ("planner", "bytes moved", "across machines", "model bytes", "max flops/worker", "imbalance")
    table = [header]
    for name, s in ((plan.planner, plan.summary), *plan.baselines):
        star = " *" if name == plan.planner else ""
        table.append((name + star, human(s.bytes_moved), human(s.bytes_across), human(s.model_bytes),
                      human(max(s.flops), "F"), f"{s.imbalance:.2f}"))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines.extend("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table)
    return "\n".join(lines)


def brief(plan) -> str:
    """The report without its per-node rows: strategy counts and the baseline table."""
    full = render(plan).splitlines()
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
    table = full[full.index("") + 1 :]
    return "\n".join([full[0], f"  einsums: {mix}", *table])
