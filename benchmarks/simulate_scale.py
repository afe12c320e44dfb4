"""Lowering and simulating Llama-7B training (batch 8 × seq 2048) at the cluster level, 1–32 machines.

Each cluster runs ``einsummable simulate`` in its own process (so each peak RSS is
its own) and the table gives the task counts at both levels (the core level only
counted), the seconds to plan, lower and simulate, the process's peak RSS, and the
predicted step against the planner's own prediction.

    python benchmarks/simulate_scale.py [--machines 1 4 16 32] [--cores 64] [--memory 256GiB]

Measured here (2 shared cores under a load of about 10, so wall seconds are ~3-6×
the CPU seconds; peak RSS from /usr/bin/time -v; AdamW included, 21,164 nodes):

| cluster | machine-level tasks | core-level blocks | plan+lower+simulate s (CPU s) | peak RSS GB | step s |
|---|---|---|---|---|---|
| 1 × 64 | 15,053 | 1,214,635 | 259 + 14 + 1 (55) | 0.57 | 151.5 (does not fit 256 GiB) |
| 4 × 64 | 66,728 | 4,717,991 | 84 + 53 + 7 (22) | 0.37 | 47.8 |
| 16 × 64 | 510,310 | 6,649,497 | 27 + 50 + 32 (47) | 1.05 | 108.5 |
| 32 × 64 | 1,240,220 | 8,804,521 | 66 + 203 + 98 (94) | 2.25 | 86.5 |
"""

from __future__ import annotations

import argparse
import json
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
    print("| cluster | machine-level tasks | core-level blocks | plan s | lower s | simulate s "
          "| peak RSS GB | step s (simulated) | step s (planner) |")
    print("|" + "---|" * 9, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for m in args.machines:
            out = Path(tmp) / f"{m}.json"
            cmd = [sys.executable, "-m", "einsummable.cli", "simulate", "--model", args.model,
                   "--machines", str(m), "--cores", str(args.cores), "--memory", args.memory,
                   "--optimizer", args.optimizer, "--json", str(out)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            r = json.loads(out.read_text())
            s = r["seconds"]
            tasks = r["tasks"]
            print(f"| {m} × {args.cores} | {tasks['machine_level']:,} | {tasks['core_level_blocks']:,} "
                  f"| {s['plan']:.0f} | {s['lower']:.0f} | {s['simulate']:.0f} "
                  f"| {r['peak_rss_bytes'] / 1e9:.1f} | {r['step_seconds']:.2f} "
                  f"| {r['planner_step_seconds']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
