"""Lowering and simulating Llama-7B training (batch 8 × seq 2048) at the cluster level, 1–32 machines.

Each cluster runs ``einsummable simulate`` in its own process (so each peak RSS is
its own) and the table gives the task counts at both levels (the machine level
lowered as arrays and simulated task by task, the core level only counted), the
seconds to plan, lower and simulate (wall, from the command's JSON), the child's
CPU seconds in all, its peak RSS, and the predicted step against the planner's
own prediction.

    python benchmarks/simulate_scale.py [--machines 1 4 16 32] [--cores 64] [--memory 256GiB]

Measured here (2 cores shared by ~8 engineers, load 5-19, so wall seconds are
2-4× the CPU seconds; AdamW included, 21,164 nodes):

| cluster | machine tasks | core blocks | plan + lower + simulate s | CPU s | peak RSS GB | step s |
|---|---|---|---|---|---|---|
| 1 × 64 | 15,053 | 1,214,635 | 173 + 12.9 + 0.1 | 51 | 0.57 | 151.5 (does not fit 256 GiB) |
| 4 × 64 | 66,728 | 4,717,991 | 14 + 12.9 + 0.5 | 18 | 0.30 | 47.8 |
| 16 × 64 | 510,310 | 6,649,497 | 22 + 18.8 + 7.4 | 26 | 0.52 | 108.5 |
| 32 × 64 | 1,240,220 | 8,804,521 | 18 + 12.5 + 16.8 | 41 | 1.07 | 86.5 |

Before the tasks became arrays (one Python object each) 32 × 64 took 66 + 203 +
98 s and 2.25 GB, for the same tasks and the same predicted steps.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--machines", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--cores", type=int, default=64)
    ap.add_argument("--memory", default="256GiB")
    ap.add_argument("--optimizer", choices=["adamw", "none"], default="adamw")
    args = ap.parse_args()
    print("| cluster | machine-level tasks | core-level blocks | plan s | lower s | simulate s | CPU s "
          "| peak RSS GB | step s (simulated) | step s (planner) |")
    print("|" + "---|" * 10, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for m in args.machines:
            out = Path(tmp) / f"{m}.json"
            cmd = [sys.executable, "-m", "einsummable.cli", "simulate", "--model", args.model,
                   "--machines", str(m), "--cores", str(args.cores), "--memory", args.memory,
                   "--optimizer", args.optimizer, "--json", str(out)]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            r = json.loads(out.read_text())
            s = r["seconds"]
            tasks = r["tasks"]
            print(f"| {m} × {args.cores} | {tasks['machine_level']:,} | {tasks['core_level_blocks']:,} "
                  f"| {s['plan']:.0f} | {s['lower']:.1f} | {s['simulate']:.1f} | {cpu:.0f} "
                  f"| {r['peak_rss_bytes'] / 1e9:.2f} | {r['step_seconds']:.2f} "
                  f"| {r['planner_step_seconds']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
