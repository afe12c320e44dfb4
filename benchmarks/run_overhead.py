"""A run's fixed cost: what the driver spends per run outside the tasks (target: at most 100 us
for a decode step's program), beside torch eager's per-call time on the same tiny work.

Run: python benchmarks/run_overhead.py [--runs 500] [--rounds 7]
(the starting commit's figure: PYTHONPATH=<its checkout>/src python benchmarks/run_overhead.py)

The fixed cost of a run is its time less the sum of its tasks' times, each task timed as it runs
(the steps wrapped in timers, in rounds of their own: the unwrapped runs give the run time);
"driver alone" is a run whose every task returns the value it computed once, so costs nothing
(the closer figure: the difference also counts what real kernels cost the interpreter around them).
Two programs: a tiny Llama's decode step in a session (the weights and the KV cache resident,
what ``Generator`` runs every token), and two 4-element joins. Peers, in the same rounds:
transformers' LlamaForCausalLM on the same weights decoding a token with its KV cache, and
the two joins as torch ops. Medians of ``--rounds`` rounds of ``--runs`` runs each.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import numpy as np

import einsummable as es
from common import machine
from einsummable.models.llama.generate import Generator
from llama_block import hf_model


def timed(executor) -> list[float]:
    """Wrap ``executor``'s steps (the local engine's nodes: a task, or a native segment; donors
    included) to add their time to the list returned; ``restore`` puts them back."""
    total = [0.0]

    def wrap(step):
        def run(args, feeds, variables):
            start = time.perf_counter()
            out = step(args, feeds, variables)
            total[0] += time.perf_counter() - start
            return out
        return run

    executor.plain = (executor.node_steps, executor.node_donors)
    executor.node_steps = [wrap(s) for s in executor.node_steps]
    executor.node_donors = {j: (name, wrap(s)) for j, (name, s) in executor.node_donors.items()}
    return total


def restore(executor) -> None:
    executor.node_steps, executor.node_donors = executor.plain


def driver_alone(run: Callable[[], object], executor, runs: int, rounds: int) -> float:
    """Median seconds per run with every task replaced by the value it computed once: the run's
    cost with tasks that cost nothing, what the driver spends alone."""
    made: dict[int, object] = {}

    def record(i, step):
        def run_step(args, feeds, variables):
            made[i] = step(args, feeds, variables)
            return made[i]
        return run_step

    plain = (executor.node_steps, executor.node_donors)
    executor.node_steps = [record(i, s) for i, s in enumerate(executor.node_steps)]
    executor.node_donors = {j: (name, record(j, s)) for j, (name, s) in executor.node_donors.items()}
    run()
    executor.node_steps = [lambda args, feeds, variables, v=made[i]: v for i in range(len(plain[0]))]
    executor.node_donors = {j: (name, lambda args, feeds, variables, v=made[j]: v)
                       for j, (name, _) in plain[1].items()}
    try:
        return per_call(run, runs, rounds)
    finally:
        executor.node_steps, executor.node_donors = plain


def fixed_cost(run: Callable[[], object], executor, runs: int, rounds: int) -> tuple[float, float, float]:
    """Median seconds per run, per run in tasks, and the fixed cost (their difference)."""
    for _ in range(runs // 4):
        run()
    whole, tasks = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(runs):
            run()
        whole.append((time.perf_counter() - start) / runs)
        total = timed(executor)
        for _ in range(runs):
            run()
        restore(executor)
        tasks.append(total[0] / runs)
    w, t = statistics.median(whole), statistics.median(tasks)
    return w, t, w - t


def per_call(run: Callable[[], object], runs: int, rounds: int) -> float:
    for _ in range(runs // 4):
        run()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(runs):
            run()
        times.append((time.perf_counter() - start) / runs)
    return statistics.median(times)


def decode(runs: int, rounds: int) -> None:
    import torch

    model, cfg, params = hf_model(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, vocab=64)
    gen = Generator(cfg, params)
    prompt, length = [1, 2, 3], 16
    tokens, pads = gen._pad([prompt])
    gen._prefill(tokens, pads, length, True)  # the cache, resident
    sess = gen._session(("decode", 1, length, True))
    feeds = {"ids": np.array([[5]], np.int64), "pos": np.array([[3.0]], np.float32), "t": 3}
    executor = sess.program.executor
    ours = fixed_cost(lambda: sess.run(feeds, fetch=["next"]), executor, runs, rounds)
    alone = driver_alone(lambda: sess.run(feeds, fetch=["next"]), executor, runs, rounds)

    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        cache, ids = out.past_key_values, torch.tensor([[5]])
        done = [0]

        def step():
            if done[0] == runs:  # the cache grows a token a call: keep it short
                cache.crop(-done[0])
                done[0] = 0
            done[0] += 1
            return model(ids, past_key_values=cache, use_cache=True).logits.argmax(-1)

        peer = per_call(step, runs, rounds)
    tg = executor.tg
    print(f"Llama decode step (hidden 32, 1 layer, cache {length}; {len(tg.tasks)} tasks on "
          f"{tg.workers} worker(s)), session.run:")
    print(f"  run {ours[0] * 1e6:8.1f} us   tasks {ours[1] * 1e6:8.1f} us   fixed {ours[2] * 1e6:8.1f} us   "
          f"driver alone (tasks that cost nothing) {alone * 1e6:8.1f} us")
    print(f"  torch eager, LlamaForCausalLM decoding a token: {peer * 1e6:8.1f} us a call   "
          f"einsummable run / torch = {ours[0] / peer:.2f}, fixed / torch = {ours[2] / peer:.2f}")


def joins(workers: int, runs: int, rounds: int) -> None:
    import torch

    g = es.Graph()
    x = g.input("x", (4,))
    g.output("y", es.elementwise("x0 + 2", es.elementwise("x0 * 0.5 + 1", x)))
    prog = es.compile(g, workers=workers)
    feeds = {"x": np.ones(4, np.float32)}
    ours = fixed_cost(lambda: prog.run(feeds), prog.executor, runs, rounds)
    alone = driver_alone(lambda: prog.run(feeds), prog.executor, runs, rounds)
    t = torch.ones(4)
    with torch.no_grad():
        peer = per_call(lambda: (t * 0.5 + 1) + 2, runs, rounds)
    print(f"two 4-element joins ({len(prog.taskgraph.tasks)} tasks, {workers} worker(s)), program.run:")
    print(f"  run {ours[0] * 1e6:8.1f} us   tasks {ours[1] * 1e6:8.1f} us   fixed {ours[2] * 1e6:8.1f} us   "
          f"driver alone {alone * 1e6:8.1f} us")
    print(f"  torch eager, the same three ops: {peer * 1e6:8.1f} us a call   "
          f"einsummable run / torch = {ours[0] / peer:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*past_key_values.*")  # transformers 5 renames it
    print(machine())
    decode(args.runs, args.rounds)
    for workers in (1, 2):
        joins(workers, args.runs, args.rounds)


if __name__ == "__main__":
    main()
