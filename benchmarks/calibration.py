"""The simulator against the local engine: predicted and measured makespans on the workload suite.

For each worker count it measures this machine's rates with that many cores busy
(``Cluster.measure``), writes them to ``calibration-<w>.json``, compiles every
workload of einsummable/workloads.py (sizes scaled to fit a 2-core box) for the local
engine, and prints the simulator's prediction, the median of measured runs and
their ratio. The aim is a ratio within 0.75..1.25.

The box is shared, so each run also records its CPU share: process CPU time over
wall time × workers. A share well under 1 means other programs held our cores, and
the measured time says more about them than about the model; such rows are flagged.

    python benchmarks/calibration.py [--workers 1 2] [--repeats 3] [--scale 1.0] [--out DIR]

Measured here on a quiet moment (2 cores, OpenBLAS, medians of 5): every ratio within
0.87..1.17 at workers 1 and 2. On a busy moment (another program holding a core) the
workers=2 rows read 0.4..0.7, and their cpu share says why.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

import einsummable as es
from einsummable import workloads
from einsummable.ir.graph import EinGraph, InputNode


def suite(scale: float) -> dict[str, EinGraph]:
    """The workloads at sizes that take about a second on one core here."""

    def s(n: int) -> int:
        return max(8, int(n * scale) // 8 * 8)

    return {
        "matmul": workloads.matmul(s(2048)),
        "chain (equal)": workloads.chain_equal(s(1536)),
        "chain (skewed)": workloads.chain(m=s(8192), k=s(256), n=s(4096), r=s(64), t=s(2048)),
        "mlp fwd+bwd": workloads.mlp_train(batch=s(2048), d=s(512), hidden=s(2048), out=s(512)),
        "attention": workloads.attention(b=2, s=s(512), d=s(512), h=8, e=s(64)),
    }


def feeds_for(g) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for node in g.nodes:
        if isinstance(node, InputNode):
            out[node.name] = rng.standard_normal(node.shape, dtype=np.float32)
    return out


def measured(prog: es.Program, feeds: dict, repeats: int) -> tuple[float, float]:
    """Median wall seconds, and the median share of the workers' cores the run got."""
    prog.run(feeds)  # warm: kernels compiled, pages touched
    times, shares = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        prog.run(feeds)
        wall = time.perf_counter() - t0
        times.append(wall)
        shares.append((time.process_time() - c0) / (wall * prog.taskgraph.workers))
    return statistics.median(times), statistics.median(shares)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the workload sizes")
    ap.add_argument("--out", default=".", help="where the calibrated cluster JSON files go")
    args = ap.parse_args()
    graphs = suite(args.scale)
    rows = []
    for w in args.workers:
        cluster = es.Cluster.measure(cores=w)
        cluster.to_json(Path(args.out) / f"calibration-{w}.json")
        print(f"workers={w}: GEMM {cluster.flops_per_core / 1e9:.1f} GFLOP/s/core, elementwise "
              f"{cluster.elementwise_flops_per_core / 1e9:.2f} GFLOP/s/core, copy "
              f"{cluster.copy_bandwidth / 1e9:.1f} GB/s/core", flush=True)
        for name, g in graphs.items():
            prog = es.compile(g, cluster=cluster)
            predicted = prog.simulate().makespan
            actual, share = measured(prog, feeds_for(g), args.repeats)
            rows.append((name, w, len(prog.taskgraph), predicted, actual, share))
            print(f"  {name:<16} {predicted * 1e3:9.1f} ms predicted {actual * 1e3:9.1f} ms measured "
                  f"ratio {predicted / actual:5.2f} cpu share {share:.2f}", flush=True)
    print("\n| workload | workers | tasks | predicted ms | measured ms | predicted/measured | cpu share |")
    print("|" + "---|" * 7)
    for name, w, n, p, m, share in rows:
        flag = "" if 0.75 <= p / m <= 1.25 else " (outside 25%)"
        starved = " (starved: cores shared)" if share < 0.85 else ""
        print(f"| {name} | {w} | {n} | {p * 1e3:.1f} | {m * 1e3:.1f} | {p / m:.2f}{flag} "
              f"| {share:.2f}{starved} |")


if __name__ == "__main__":
    main()
