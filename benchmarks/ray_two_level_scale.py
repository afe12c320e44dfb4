"""What the Ray engine's driver and one machine build for Llama-7B training at 32 × 64 (issue 17).

Without Ray: plan Llama-7B (batch 8 × seq 2048, AdamW) for 32 machines × 64 cores, lower
the machine-level graph as the driver does (lower/cluster.py), split it into the machines'
shares, and refine one machine's share to its 64 cores as its actor would
(lower/refine.py). Prints the tasks and seconds of each, and this process's peak RSS:
the driver's work grows with the machine-level graph, a machine's with its share, and
nobody builds the core-level graph (about 8.8 M tasks here).

    python benchmarks/ray_two_level_scale.py [--machines 32] [--cores 64] [--machine 0]
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import replace

from einsummable.cli_plan import training_graph
from einsummable.hardware.cluster import Cluster
from einsummable.ir.fuse import fuse
from einsummable.lower.blockwise import lower_blocks
from einsummable.lower.cluster import levels, machine_plan
from einsummable.lower.refine import refine, split
from einsummable.models.llama.model import PRESETS
from einsummable.plan.planners import make_plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--machines", type=int, default=32)
    ap.add_argument("--cores", type=int, default=64)
    ap.add_argument("--machine", type=int, default=0, help="the machine whose share is refined")
    args = ap.parse_args()
    cluster = replace(Cluster(machines=args.machines, cores=args.cores), memory_per_machine=256 * 2**30)
    g = fuse(training_graph(PRESETS[args.model], 8, 2048).ir)
    t0 = time.perf_counter()
    plan = make_plan(g, cluster, compare=False, check_memory=False)
    t1 = time.perf_counter()
    cg = lower_blocks(machine_plan(plan))
    t2 = time.perf_counter()
    shares = split(cg, levels(plan).cc, args.cores)
    t3 = time.perf_counter()
    refined = refine(shares[args.machine])
    t4 = time.perf_counter()
    sizes = sorted(len(s) for s in shares)
    kinds: dict[str, int] = {}
    for task in refined.graph.tasks:
        kinds[type(task).__name__] = kinds.get(type(task).__name__, 0) + 1
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{args.model} training step, batch 8 x seq 2048, on {cluster}")
    print(f"  plan                                   {t1 - t0:7.1f} s")
    print(f"  driver: machine-level graph            {t2 - t1:7.1f} s  {len(cg):>10,} tasks")
    print(f"  driver: split into {args.machines} shares             {t3 - t2:7.1f} s  "
          f"{sizes[0]:,} .. {sizes[-1]:,} tasks each")
    print(f"  machine {args.machine}: refine to {args.cores} cores         {t4 - t3:7.1f} s  "
          f"{len(refined.graph):>10,} tasks ({', '.join(f'{n:,} {k}' for k, n in sorted(kinds.items()))})")
    print(f"  peak RSS of this process (driver + one machine) {rss:.2f} GB")


if __name__ == "__main__":
    main()
