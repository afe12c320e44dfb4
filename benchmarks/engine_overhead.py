"""Engine overhead per task, measured on 20,000 tiny tasks (target: at most 30 us), beside the
simulator's dispatch model.

Run: python benchmarks/engine_overhead.py [--tasks 20000] [--workers 2]
Tiny kernels make the run time almost all engine: scheduling, dispatch, freeing. The same
program is then predicted on this machine's measured cluster (``Cluster.measure``) with its
interpreter shared by the workers (``gil_seconds``, engines/simulator/replay.py) and without.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

import numpy as np

import einsummable as es
from common import median_time
from einsummable.engines.local import LocalProgram
from einsummable.engines.simulator.simulate import run as simulate
from einsummable.hardware.calibrate import tiny_chains, tiny_feeds
from einsummable.lower.taskgraph import TaskGraph


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
    cluster = es.Cluster.measure(cores=args.workers)
    print(f"measured cluster ({args.workers} cores): task_overhead {cluster.task_overhead * 1e6:.1f} us, "
          f"gil_seconds {cluster.gil_seconds * 1e6:.1f} us")
    print("chains of 500 tiny tasks on every worker, measured beside the simulator's dispatch model:")
    for workers in sorted({args.workers, 2 * args.workers, 4 * args.workers}):
        tg = chains(workers, 500)
        run = LocalProgram(tg).run
        feeds = tiny_feeds(workers)
        measured = median_time(lambda: run(feeds), repeats=5)  # noqa: B023 (called at once)
        model = replace(cluster, cores=workers)
        shared, apart = simulate(tg, model).makespan, simulate(tg, replace(model, gil_seconds=0.0)).makespan
        print(f"  {workers} workers, {len(tg.tasks)} tasks: measured {measured * 1e3:.1f} ms; simulated with "
              f"one interpreter {shared * 1e3:.1f} ms ({shared / measured:.2f}), every core its own "
              f"{apart * 1e3:.1f} ms ({apart / measured:.2f})")


def chains(workers: int, chain: int) -> TaskGraph:
    """A chain of tiny joins (4 elements) pinned to each worker: nothing but dispatch."""
    return tiny_chains(workers, workers, chain)


if __name__ == "__main__":
    main()
