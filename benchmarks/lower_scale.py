"""Lowering Llama-7B training (batch 8 × seq 2048) at the cluster level: tasks as arrays against objects.

For each cluster it plans (EinDecomp), then lowers the machine-level plan
(lower/cluster.py) in this process:
- as arrays (lower/blockwise.py, a CompactGraph), timed without tracemalloc, then
  again under tracemalloc for its peak;
- up to ``--objects-up-to`` machines also with lowering.py, one Python object per
  task (what cluster_graph did before), the same way, for the ratios.
Columns: tasks; CPU µs per task (process time: the box is shared, so wall time
is noisy); bytes per task kept (the arrays' nbytes) and at the peak of lowering
(tracemalloc: arrays, tables and the index of tasks made); object/array ratios;
the process's peak RSS so far.

    python benchmarks/lower_scale.py [--machines 1 4 16 32] [--cores 64] [--objects-up-to 4]

Measured here (2 cores shared by ~8 engineers; AdamW, 21,164 nodes), ``--machines 1 4 16
32 --cores 64 --objects-up-to 0``, before (c08a687, load 0.7-1.9) and after caching the
geometry of fetches, einsums and selects, releasing a value's index entries once nothing
reads its tasks, keeping the columns in chunks and the garbage collector off while
lowering (load 4.2-4.8); cells are before → after, RSS is the process's peak so far
(planning included):

| cluster | tasks | CPU µs/task | B/task kept | B/task peak | RSS GB |
|---|---|---|---|---|---|
| 1 × 64 | 15,053 | 321 → 96 | 37 | 2,455 → 1,307 | 0.33 → 0.34 |
| 4 × 64 | 66,728 | 84 → 24 | 37 | 755 → 403 | 0.34 → 0.34 |
| 16 × 64 | 481,637 | 18.5 → 5.6 | 37 | 317 → 133 | 0.45 → 0.36 |
| 32 × 64 | 1,211,037 | 8.4 → 3.0 | 37 | 259 → 104 | 0.75 → 0.43 |

Llama's 32 layers (and its optimizer's update of every weight of a shape) repeat the
same fetches, so most of a node's numpy work is done once; what is left costs about
70 µs per node whatever its blocks, so the cost per task still falls as blocks per
node grow. lowering.py's objects cost 98 and 70 µs/task at 1 and 4 machines (an
earlier run of ``--objects-up-to 4``).
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

from einsummable.cli_plan import training_graph
from einsummable.hardware.cluster import Cluster
from einsummable.lower.blockwise import lower_blocks
from einsummable.lower.cluster import machine_plan
from einsummable.lower.lowering import lower
from einsummable.models.llama.model import PRESETS
from einsummable.plan.planners import make_plan


def rss_gb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def measure(fn, plan) -> tuple[object, float, int]:
    """(result, CPU seconds of a plain run, tracemalloc's peak bytes over a second run)."""
    t = time.process_time()
    out = fn(plan)
    seconds = time.process_time() - t
    del out
    tracemalloc.start()
    out = fn(plan)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out, seconds, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--machines", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--cores", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--optimizer", choices=["adamw", "none"], default="adamw")
    ap.add_argument("--objects-up-to", type=int, default=4,
                    help="also lower with lowering.py up to this many machines (slow)")
    args = ap.parse_args()
    g = training_graph(PRESETS[args.model], args.batch, args.seq, args.optimizer).ir
    print(f"{args.model} train ({args.optimizer}), batch {args.batch} x seq {args.seq}: {len(g.nodes)} "
          f"nodes; machine-level graph")
    print("| cluster | tasks | plan s | arrays: lower CPU s | µs/task | B/task kept | B/task peak "
          "| objects: µs/task | B/task peak | time ratio | peak ratio | RSS GB |")
    print("|" + "---|" * 12, flush=True)
    for m in args.machines:
        cluster = Cluster(machines=m, cores=args.cores)
        t0 = time.process_time()
        plan = machine_plan(make_plan(g, cluster, compare=False, check_memory=False))
        planned = time.process_time() - t0
        cg, secs, peak = measure(lower_blocks, plan)
        n = len(cg)
        kept = cg.memory_bytes() / n
        row = (f"| {m} × {args.cores} | {n:,} | {planned:.0f} | {secs:.1f} | {secs / n * 1e6:.1f} "
               f"| {kept:.0f} | {peak / n:.0f} |")
        del cg
        if m <= args.objects_up_to:
            tg, osecs, opeak = measure(lower, plan)
            assert len(tg.tasks) == n
            del tg
            row += (f" {osecs / n * 1e6:.1f} | {opeak / n:.0f} | {osecs / secs:.1f}× | {opeak / peak:.1f}× |")
        else:
            row += " - | - | - | - |"
        print(row + f" {rss_gb():.2f} |", flush=True)
        del plan


if __name__ == "__main__":
    main()
