"""Lowering cost per task for Llama-7B training (batch 8 × seq 2048) as the cluster grows.

For each cluster it plans (EinDecomp, no baselines), then lowers the whole
core-level TaskGraph, and prints the tasks, the lowering seconds, µs and bytes per
task (tracemalloc's peak during lowering, over the tasks), and the process's peak
RSS. These are the "before" numbers of issue 17: one Python object per task.
``--level machine`` lowers the cluster-level graph instead (lower/cluster.py: one
task per machine-level block), whose size grows with the machines, not the cores.

    python benchmarks/lower_scale.py [--machines 1 2] [--cores 16] [--level core|machine] [--no-tracemalloc]

tracemalloc slows lowering about 2×; ``--no-tracemalloc`` gives the time alone.
Measured here (gradients, no optimizer; 2 shared cores under a load of about 10):
1 × 16: 303,384 tasks, 1,713 bytes per task (tracemalloc), peak RSS 1.6 GB;
2 × 16: 656,399 tasks, 264 s wall (401 µs per task on a ~20% CPU share), RSS 1.2 GB.
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

from einsummable.cli_plan import training_graph
from einsummable.hardware.cluster import Cluster
from einsummable.lower.cluster import cluster_graph
from einsummable.lower.lowering import lower
from einsummable.models.llama.model import PRESETS
from einsummable.plan.planners import make_plan


def rss_gb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--machines", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cores", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--optimizer", choices=["adamw", "none"], default="none")
    ap.add_argument("--level", choices=["core", "machine"], default="core")
    ap.add_argument("--no-tracemalloc", action="store_true")
    args = ap.parse_args()
    g = training_graph(PRESETS[args.model], args.batch, args.seq, args.optimizer).ir
    print(f"{args.model} train ({args.optimizer}), batch {args.batch} x seq {args.seq}: "
          f"{len(g.nodes)} nodes, {args.level} level")
    print(f"{'cluster':>8} {'plan s':>7} {'tasks':>10} {'lower s':>8} {'us/task':>8} {'B/task':>7} "
          f"{'RSS GB':>7}")
    for m in args.machines:
        cluster = Cluster(machines=m, cores=args.cores)
        t0 = time.perf_counter()
        plan = make_plan(g, cluster, compare=False, check_memory=False)
        _ = plan.locs
        t1 = time.perf_counter()
        if not args.no_tracemalloc:
            tracemalloc.start()
        tg = lower(plan) if args.level == "core" else cluster_graph(plan).graph
        t2 = time.perf_counter()
        peak = tracemalloc.get_traced_memory()[1] if not args.no_tracemalloc else 0
        tracemalloc.stop()
        n = len(tg)
        per = f"{peak / n:7.0f}" if peak else f"{'-':>7}"
        print(f"{m:>3}x{args.cores:<4} {t1 - t0:7.1f} {n:10,d} {t2 - t1:8.1f} {(t2 - t1) / n * 1e6:8.1f} "
              f"{per} {rss_gb():7.2f}", flush=True)
        del tg, plan


if __name__ == "__main__":
    main()
