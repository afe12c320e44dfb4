"""Engine overhead per task, measured on 20,000 tiny tasks (target: at most 30 us).

Run: python benchmarks/engine_overhead.py [--tasks 20000] [--workers 2]
Tiny kernels make the run time almost all engine: scheduling, dispatch, freeing.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import einsummable as es
from common import median_time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    args = parser.parse_args()
    g = es.Graph()
    xs = [g.input(f"x{k}", (4,)) for k in range(args.workers)]
    lanes = list(xs)
    per_lane = args.tasks // args.workers
    for _ in range(per_lane):
        lanes = [es.elementwise("x0 * 0.5 + 1", t) for t in lanes]
    for k, t in enumerate(lanes):
        g.output(f"y{k}", t)
    start = time.perf_counter()
    prog = es.compile(g, workers=args.workers)
    planning = time.perf_counter() - start
    feeds = {f"x{k}": np.ones(4, np.float32) for k in range(args.workers)}
    n = len(prog.taskgraph.tasks)
    t = median_time(lambda: prog.run(feeds), repeats=5)
    kernel = median_time(lambda: np.multiply(np.ones(4, np.float32), 0.5) + 1, repeats=5)
    print(f"{n} tasks on {args.workers} workers (engine {prog.engine}); planning took {planning:.1f} s")
    print(f"  run: {t * 1e3:.1f} ms  =  {t / n * 1e6:.1f} us per task  "
          f"(a bare numpy kernel call: {kernel * 1e6:.1f} us)")


if __name__ == "__main__":
    main()
