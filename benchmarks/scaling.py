"""Predicted scaling on 1..32 machines × 64 cores: EinDecomp against the baselines.

For each workload, machine count and planner it plans (timing the planner), then
predicts one run: by lowering to a TaskGraph and replaying it in the simulator
(``sim``), or, for graphs whose TaskGraphs are too big to lower here (Llama-7B at
thousands of workers means millions of tasks), analytically from the plan
(``plan``): each worker's blocks cost the simulator's kernel time, and the bytes the
plan moves cost their bandwidth, spread evenly over the NICs and cores, with no
overlap of compute and communication. ``plan`` is optimistic: it sees neither a hot
NIC nor a worker waiting on its inputs (on matmul 32768² it predicts 4.5 s at 4
machines and 1.5 s at 16 where the simulator says 7.6 s and 7.4 s; they agree on one
machine). Memory per machine is the simulator's peak (``sim``), or for ``plan`` the
bytes of the blocks placed on the machine, all kept to the end (received copies not
counted); plans over ``--memory`` GiB are flagged.

Writes ``scaling.md`` (the table) and one ``scaling-<workload>.png`` per workload.

    python benchmarks/scaling.py                     # matmul, chains, MLP; sim; ~10 min here
    python benchmarks/scaling.py --llama --machines 1 2 4 8 16 32    # + Llama-7B (plan)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

import einsummable as es
from einsummable import workloads
from einsummable.engines.simulate import apply_seconds
from einsummable.ir.graph import EinGraph, EinsumNode
from einsummable.lower.lowering import lower
from einsummable.models.llama import model as llama
from einsummable.plan.plan import Plan
from einsummable.plan.planners import make_plan
from einsummable.plan.space import nbytes
from einsummable.plan.traffic import flops_per_block
from einsummable.train.grads import output_gradients

PLANNERS = {"eindecomp": "EinDecomp", "data_parallel": "data parallel", "model_parallel": "Megatron",
            "uniform": "uniform"}


def llama_train() -> EinGraph:
    cfg = llama.PRESETS["llama-7b"]
    g, p, loss = llama.loss_graph(cfg, 8, 2048)
    output_gradients(g, loss, p)
    g.output("loss", loss)
    return g.ir


def llama_infer() -> EinGraph:
    cfg = llama.PRESETS["llama-7b"]
    g = es.Graph()
    p = llama.parameters(g, cfg)
    ids = g.input("ids", (1, 2048))
    pos = g.ramp((1, 2048), steps=(0.0, 1.0))
    g.output("logits", llama.forward(cfg, p, ids, pos, llama.causal_mask(g, 2048)))
    return g.ir


WORKLOADS: dict[str, tuple[Callable[[], EinGraph], str]] = {
    "matmul 32768²": (lambda: workloads.matmul(32768), "sim"),
    "chain (equal)": (workloads.chain_equal, "sim"),
    "chain (skewed)": (workloads.chain_skewed, "sim"),
    "mlp fwd+bwd": (workloads.mlp_train, "sim"),
    "llama-7b train b8 s2048": (llama_train, "plan"),
    "llama-7b infer b1 s2048": (llama_infer, "plan"),
}


def analytic(plan: Plan, cluster: es.Cluster) -> tuple[float, float]:
    """Seconds and the largest machine's bytes, from the plan alone (see the module docstring)."""
    g = plan.graph
    compute = np.zeros(cluster.workers)
    memory = np.zeros(cluster.machines)
    for v, node in enumerate(g.nodes):
        locs = np.asarray(plan.locs[v], dtype=np.int64)
        part = plan.parts[v]
        if isinstance(node, EinsumNode) and part.num_blocks:
            flops = flops_per_block(plan.spaces[v], part)
            block = node.op.block(tuple(int(b[1] - b[0]) for b in part.bounds))
            seconds = apply_seconds(block, cluster) * flops / max(flops.max(), 1) + cluster.task_overhead
            compute += np.bincount(locs, weights=seconds, minlength=cluster.workers)
        if len(locs):
            per_block = nbytes(node) / len(locs)
            memory += np.bincount(locs // cluster.cores, minlength=cluster.machines) * per_block
    s = plan.summary
    comm = s.bytes_within / (cluster.workers * cluster.bandwidth_within)
    if cluster.machines > 1:
        comm += s.bytes_across / (cluster.machines * cluster.bandwidth_across)
    return float(compute.max()) + comm, float(memory.max())


def predict(g: EinGraph, cluster: es.Cluster, planner: str, method: str) -> dict:
    t0 = time.perf_counter()
    plan = make_plan(g, cluster, planner, compare=False)
    planning = time.perf_counter() - t0
    if method == "sim":
        sim = es.simulate(lower(plan), cluster)
        seconds, memory, tasks = sim.makespan, max(sim.peak_memory), sim.tasks
    else:
        (seconds, memory), tasks = analytic(plan, cluster), sum(p.num_blocks for p in plan.parts)
    return {"seconds": seconds, "across": plan.summary.bytes_across, "plan_s": planning, "memory": memory,
            "tasks": tasks}


def plot(name: str, rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    for planner, label in PLANNERS.items():
        pts = sorted((r["machines"], r["seconds"]) for r in rows if r["planner"] == planner)
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("machines (× 64 cores)")
    ax.set_ylabel("predicted seconds per run")
    ax.set_title(name)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machines", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--cores", type=int, default=64)
    ap.add_argument("--planners", nargs="+", default=list(PLANNERS))
    ap.add_argument("--workloads", nargs="+", default=None, help="names (default: all but Llama)")
    ap.add_argument("--llama", action="store_true", help="add Llama-7B training and inference")
    ap.add_argument("--cluster", help="a cluster JSON (einsummable calibrate) for the per-core rates")
    ap.add_argument("--memory", type=float, default=256, help="GiB per machine")
    ap.add_argument("--nic", type=float, default=100, help="Gbit/s per machine's NIC (each way)")
    ap.add_argument("--method", choices=["auto", "sim", "plan"], default="auto",
                    help="auto: sim where the TaskGraph is small enough to lower here, else plan")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    base = es.Cluster.from_json(args.cluster) if args.cluster else es.Cluster()
    names = args.workloads or [n for n in WORKLOADS if args.llama or not n.startswith("llama")]
    out = Path(args.out)
    lines = [f"Per-core rates: GEMM {base.flops_per_core / 1e9:.0f} GFLOP/s, elementwise "
             f"{base.elementwise_flops_per_core / 1e9:.1f} GFLOP/s; {args.nic:.0f} Gbit/s per NIC; "
             f"{args.memory:.0f} GiB per machine.", "",
             "| workload | machines | planner | method | predicted s | speed-up | efficiency | across GB "
             "| plan s | GiB/machine | fits |", "|" + "---|" * 11]
    for name in names:
        make, method = WORKLOADS[name]
        method = method if args.method == "auto" else args.method
        g = make()
        rows = []
        for m in args.machines:
            cluster = replace(base, machines=m, cores=args.cores, memory_per_machine=args.memory * 2**30,
                              bandwidth_across=args.nic * 1e9 / 8)
            for planner in args.planners:
                r = predict(g, cluster, planner, method) | {"machines": m, "planner": planner}
                rows.append(r)
                print(f"{name:<24} {m:>3} x {args.cores} {planner:<15} {r['seconds']:10.4f} s  "
                      f"{r['tasks']:>9,} tasks  plan {r['plan_s']:.1f} s", flush=True)
        single = {r["planner"]: r["seconds"] for r in rows if r["machines"] == 1}
        for r in rows:
            speed = single[r["planner"]] / r["seconds"] if r["planner"] in single else float("nan")
            fits = "yes" if r["memory"] <= args.memory * 2**30 else "**no**"
            lines.append(f"| {name} | {r['machines']} | {PLANNERS[r['planner']]} | {method} "
                         f"| {r['seconds']:.4f} | {speed:.2f} | {speed / r['machines']:.2f} "
                         f"| {r['across'] / 1e9:.2f} "
                         f"| {r['plan_s']:.1f} | {r['memory'] / 2**30:.1f} | {fits} |")
        slug = "".join(c if c.isalnum() else "-" for c in name).strip("-")
        plot(name, rows, out / f"scaling-{slug}.png")
        (out / "scaling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
