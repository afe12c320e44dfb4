"""Engine overhead per task, measured on 20,000 tiny tasks (target: at most 3 us in the native
loop), with the native loop and with every task through Python, beside the simulator's dispatch
model.

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
    python = LocalProgram(prog.taskgraph, native_loop=False)
    t = median_time(lambda: prog.run(feeds), repeats=5)
    t_python = median_time(lambda: python.run(feeds), repeats=5)
    kernel = median_time(lambda: np.multiply(np.ones(4, np.float32), 0.5) + 1, repeats=5)
    segments = prog.executor.plan.segments if prog.executor.plan is not None else []
    print(f"{n} tasks on {args.workers} workers (engine {prog.engine}); planning took {planning:.1f} s; "
          f"{sum(len(s.tasks) for s in segments)} of them in {len(segments)} native segments")
    print(f"  run, native loop:     {t * 1e3:.2f} ms  =  {t / n * 1e6:.2f} us per task")
    print(f"  run, every task in Python: {t_python * 1e3:.2f} ms  =  {t_python / n * 1e6:.2f} us per task "
          f"({t_python / t:.1f}x; a bare numpy kernel call: {kernel * 1e6:.1f} us)")
    cluster = es.Cluster.measure(cores=args.workers)
    print(f"measured cluster ({args.workers} cores): task_overhead {cluster.task_overhead * 1e6:.1f} us, "
          f"gil_seconds {cluster.gil_seconds * 1e6:.1f} us, "
          f"native_overhead {(cluster.native_overhead or 0) * 1e6:.2f} us")
    print("chains of 500 tiny tasks on every worker, measured beside the simulator's dispatch model:")
    for workers in sorted({args.workers, 2 * args.workers, 4 * args.workers}):
        tg = chains(workers, 500)
        feeds = tiny_feeds(workers)
        model = replace(cluster, cores=workers)
        for loop, label in ((True, "native loop"), (False, "in Python")):
            run = LocalProgram(tg, native_loop=loop).run
            measured = median_time(lambda: run(feeds), repeats=5)  # noqa: B023 (called at once)
            priced = model if loop else replace(model, native_overhead=None)
            shared = simulate(tg, priced).makespan
            apart = simulate(tg, replace(priced, gil_seconds=0.0)).makespan
            print(f"  {workers} workers, {len(tg.tasks)} tasks, {label}: measured {measured * 1e3:.2f} ms; "
                  f"simulated with one interpreter {shared * 1e3:.2f} ms ({shared / measured:.2f}), every "
                  f"core its own {apart * 1e3:.2f} ms ({apart / measured:.2f})")


def chains(workers: int, chain: int) -> TaskGraph:
    """A chain of tiny joins (4 elements) pinned to each worker: nothing but dispatch."""
    return tiny_chains(workers, workers, chain)


if __name__ == "__main__":
    main()
