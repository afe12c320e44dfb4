"""The Ray engine against the local engine and dask.distributed, and what Ray costs per task and per MB.

Workloads (b) the chain A@B@C@D of n² f32 and (d) one MLP training step (forward,
backward, AdamW; the state stays resident in a session, and in dask's workers via
``persist``). Everything runs on this one machine: the local engine on threads, the
Ray engine on one actor per worker, dask.distributed on a ``LocalCluster`` of
``--workers`` processes with one thread each. Inputs start in the driver and results
come back to it in every system.

Ray's overheads, measured against the local engine on the same TaskGraph:
- per task: a graph of many tiny blocks (little arithmetic, scheduling only);
- per MB moved between workers: a transpose whose every block crosses workers, at
  two sizes; the slope of time over MB moved.

Run: python benchmarks/ray_engine.py [--size 4000] [--workers 2] [--batch 8192] [--widths 1024,4096,4096,1024]
Needs: pip install "einsummable[ray]" distributed

``--llama`` instead: the demo Llama's training step (batch 16 x seq 64, AdamW, state
resident in a session) planned for 2 machines x 2 cores, on a simulated Ray cluster of
2 nodes x 2 CPUs (``ray.cluster_utils.Cluster``), one actor per node, against the
local engine on the same TaskGraph; the losses must agree. ``--before DIR`` also runs
the same step with the source tree DIR/src (e.g. ``git archive 9560447 src``, the
per-core-actor engine) in a subprocess, and prints this engine's time against it:

    python benchmarks/ray_engine.py --llama [--before /tmp/old] [--steps 5]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import einsummable as es
from common import median_time, report
from einsummable.lower.lowering import lower
from einsummable.lower.taskgraph import InputTask, MoveTask
from einsummable.plan.partition import Partition
from einsummable.plan.plan import build
from einsummable.plan.space import spaces
from mlp_step import B1, B2, EPS, LR, WD, graph


def chain(n: int, workers: int, client, repeats: int) -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((n, n), dtype=np.float32) / np.float32(np.sqrt(n)) for _ in range(4)]
    g = es.Graph()
    ts = [g.input(f"x{k}", (n, n)) for k in range(4)]
    g.output("y", ts[0] @ ts[1] @ ts[2] @ ts[3])
    feeds = {f"x{k}": a for k, a in enumerate(arrays)}
    want = arrays[0] @ arrays[1] @ arrays[2] @ arrays[3]
    times = {}
    for engine in ("local", "ray"):
        prog = es.compile(g, workers=workers, engine=engine)
        got = prog.run(feeds)["y"]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
        times[f"einsummable {engine}"] = median_time(lambda prog=prog: prog.run(feeds), repeats)
    if client is not None:
        import dask.array as da

        def dask_chain():
            ds = [da.from_array(a, chunks=n // 2) for a in arrays]
            return (ds[0] @ ds[1] @ ds[2] @ ds[3]).compute()

        assert dask_chain().dtype == np.float32
        times[f"dask.distributed ({workers} procs, chunks {n // 2})"] = median_time(dask_chain, repeats)
    report(f"(b) chain A@B@C@D, {n}^2 f32, {workers} workers", times, base="einsummable ray")


def _dask_step(x, onehot, ws, ms, vs, t):
    import dask.array as da

    acts, h = [x], x
    for k, w in enumerate(ws):
        h = h @ w
        if k < len(ws) - 1:
            h = da.maximum(h, 0)
        acts.append(h)
    p = da.exp(h - h.max(1, keepdims=True))
    p = p / p.sum(1, keepdims=True)
    n = x.shape[0]
    loss = -(da.log(p) * onehot).sum() / n
    d = (p - onehot) / n
    c1, c2 = 1 - B1**t, 1 - B2**t
    new_ws, new_ms, new_vs = list(ws), list(ms), list(vs)
    for k in reversed(range(len(ws))):
        gw = acts[k].T @ d
        if k > 0:
            d = (d @ ws[k].T) * (acts[k] > 0)
        new_ms[k] = B1 * ms[k] + (1 - B1) * gw
        new_vs[k] = B2 * vs[k] + (1 - B2) * gw * gw
        new_ws[k] = ws[k] - LR * ((new_ms[k] / c1) / (da.sqrt(new_vs[k] / c2) + EPS) + WD * ws[k])
    return loss, new_ws, new_ms, new_vs


def _persist(client, groups: list[list]) -> list[list]:
    """Keep lists of dask arrays computed on the workers, as the state between steps."""
    flat = client.persist([a for group in groups for a in group])
    out, start = [], 0
    for group in groups:
        out.append(flat[start:start + len(group)])
        start += len(group)
    return out


def mlp(batch: int, widths: list[int], workers: int, client, repeats: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, widths[0]), dtype=np.float32)
    labels = rng.integers(0, widths[-1], batch)
    ws = [rng.standard_normal((a, b), dtype=np.float32) / np.float32(np.sqrt(a))
          for a, b in itertools.pairwise(widths)]
    g, step = graph(batch, widths)
    batch_feeds = {"x": x, "y": labels.astype(np.float32)}
    times, losses = {}, {}
    for engine in ("local", "ray"):
        prog = es.compile(g, workers=workers, engine=engine)
        sess = prog.session({f"w{k}": w for k, w in enumerate(ws)} | step.init_state())
        losses[engine] = float(sess.run(batch_feeds, fetch=["loss"])["loss"])
        times[f"einsummable {engine} (session)"] = median_time(
            lambda sess=sess: sess.run(batch_feeds, fetch=["loss"]), repeats)
    np.testing.assert_allclose(losses["ray"], losses["local"], rtol=1e-5)
    if client is not None:
        import dask.array as da

        dx = client.persist(da.from_array(x, chunks=(batch // workers, widths[0])))
        onehot = np.zeros((batch, widths[-1]), np.float32)
        onehot[np.arange(batch), labels] = 1
        dy = client.persist(da.from_array(onehot, chunks=(batch // workers, widths[-1])))
        zeros = [[da.zeros(w.shape, np.float32) for w in ws] for _ in range(2)]
        state = _persist(client, [[da.from_array(w) for w in ws], *zeros])
        counter = itertools.count(1)

        def dask_step():
            nonlocal state
            loss, *new = _dask_step(dx, dy, *state, next(counter))
            (loss,), *state = _persist(client, [[loss], *new])  # one graph, so keys never clash
            return loss.compute()

        first = dask_step()
        assert first.dtype == np.float32
        np.testing.assert_allclose(first, losses["local"], rtol=1e-4)
        times[f"dask.distributed ({workers} procs, persist)"] = median_time(dask_step, repeats)
    report(f"(d) MLP step, batch {batch}, widths {widths}, {workers} workers", times,
           base="einsummable ray (session)")


def _given(g: es.Graph, workers: int, counts: list[int], per_node: dict[int, list[int]] | None = None):
    """A TaskGraph with ``counts`` blocks along the leading dimensions of every node (no planner)."""
    parts = []
    for k, sp in enumerate(spaces(g.ir)):
        want = [*(per_node or {}).get(k, counts), *[1] * len(sp.shape)][: len(sp.shape)]
        counts_here = [c if ok else 1 for c, ok in zip(want, sp.splittable, strict=True)]
        parts.append(Partition.uniform(sp.shape, counts_here))
    return lower(build(g.ir, es.Cluster(machines=1, cores=workers), parts))


def _per_task(workers: int, repeats: int) -> None:
    """200 elementwise steps over 8 blocks each: scheduling, almost no arithmetic."""
    from einsummable.engines import local
    from einsummable.engines import ray as ray_engine

    g = es.Graph()
    t = g.input("x", (64,))
    for _ in range(200):
        t = es.elementwise("x0 * 0.5 + 1", t)
    g.output("y", t)
    tg = _given(g, workers, [8])
    feeds = {"x": np.ones(64, np.float32)}
    lp, rp = local.LocalProgram(tg), ray_engine.RayProgram(tg)
    t_local = median_time(lambda: lp.run(feeds), repeats)
    t_ray = median_time(lambda: rp.run(feeds), repeats)
    trivial = es.Graph()
    trivial.output("y", trivial.input("x", (64,)) * 1.0)
    tp = ray_engine.RayProgram(_given(trivial, workers, [workers]))
    t_trivial = median_time(lambda: tp.run(feeds), repeats)
    n = len(tg.tasks)
    print(f"\nper task ({n} tiny tasks, {workers} workers): local {t_local / n * 1e6:.1f} us, "
          f"ray {t_ray / n * 1e6:.1f} us; a ray run of a trivial graph {t_trivial * 1e3:.2f} ms")


def _per_mb(workers: int, repeats: int) -> None:
    """x <- x * 1 with x resident (nothing crosses the driver), split by rows but computed by columns,
    so every worker reads a piece of every block: moves, and almost no arithmetic."""
    from einsummable.engines import local
    from einsummable.engines import ray as ray_engine

    points = []
    for n in (512, 2048):
        g = es.Graph()
        g.output("x", g.input("x", (n, n)) * 1.0)
        tg = _given(g, workers, [workers], per_node={1: [1, workers]})
        programs = {"local": local.LocalProgram(tg).run, "ray": ray_engine.RayProgram(tg).run}
        seconds = {}
        for name, run in programs.items():
            state = {"x": run({"x": np.ones((n, n), np.float32)}, {}, frozenset({"x"}))["x"]}

            def step(run=run, state=state):
                state["x"] = run(state, {}, frozenset({"x"}))["x"]

            seconds[name] = median_time(step, repeats)
        held = state["x"].where
        moved = sum(4 * math.prod(t.shape) for t in tg.tasks if isinstance(t, MoveTask) and t.src != t.loc)
        moved += sum(4 * math.prod(hi - lo for lo, hi in _meet(have, t.box)) for t in tg.tasks
                     if isinstance(t, InputTask) for have, (w, _, _) in held.items()
                     if w != t.loc and _meet(have, t.box))  # resident pieces sent to another worker
        points.append((moved / 2**20, seconds))
    (m0, s0), (m1, s1) = points
    slope = {name: (s1[name] - s0[name]) / (m1 - m0) for name in s0}
    ray_ms, local_ms = slope["ray"] * 1e3, slope["local"] * 1e3
    print(f"per MB moved between workers: ray {ray_ms:.2f} ms/MB, local {local_ms:.2f} ms/MB, "
          f"difference {ray_ms - local_ms:.2f} ms/MB ({m0:.1f} and {m1:.1f} MB a run)")


def _meet(a, b):
    box = tuple((max(p, r), min(q, s)) for (p, q), (r, s) in zip(a, b, strict=True))
    return box if all(lo < hi for lo, hi in box) else None


def _llama_times(steps: int) -> dict[str, object]:
    """On the connected 2-node Ray: seconds to set the program up, median seconds per step on
    Ray and on the local engine (same TaskGraph), and the losses of each."""
    from einsummable.compile import Program
    from einsummable.engines import local
    from einsummable.models.llama import model as llama

    cfg = llama.PRESETS["demo"]
    g, p, loss = llama.loss_graph(cfg, 16, 64)
    step = es.train.adamw(loss, list(p.values()), lr="lr", weight_decay=0.1)
    params = llama.init_params(cfg, seed=0)
    rng = np.random.default_rng(0)
    batch = {"tokens": rng.integers(0, cfg.vocab_size, (16, 65)).astype(np.int64), "lr": 3e-3}
    cluster = es.Cluster(machines=2, cores=2)
    plan = es.compile(g, cluster=cluster, engine="simulate")
    start = time.perf_counter()
    from einsummable.engines.ray import RayProgram

    programs = {}
    try:  # two levels: the driver lowers the machine-level graph, each actor its own share
        from einsummable.engines.ray.layout import two_level
        from einsummable.lower.refine import machine_shares

        runner = RayProgram(two_level(*machine_shares(plan.plan)))
        setup = time.perf_counter() - start
        driver, shipped = len(runner.layout.machine), list(runner.layout.shipped)
        programs["ray whole"] = RayProgram(plan.taskgraph)  # every actor sent the core-level graph
    except ImportError:  # --before a tree without it: every actor is sent the core-level graph
        runner = RayProgram(plan.taskgraph)
        setup = time.perf_counter() - start
        driver, shipped = len(plan.taskgraph), [len(plan.taskgraph)] * runner.machines
    programs = {"ray": runner, **programs, "local": local.LocalProgram(plan.taskgraph)}
    out: dict[str, object] = {"setup": setup, "tasks": len(plan.taskgraph), "driver": driver,
                              "shipped": shipped}
    sessions = {name: Program(plan.graph, name, prog, plan.plan, plan.taskgraph).session(
        params | step.init_state(params)) for name, prog in programs.items()}
    times: dict[str, list[float]] = {name: [] for name in sessions}
    losses: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(steps + 1):  # round-robin; the first step warms up and is not timed
        for name, sess in sessions.items():
            t0 = time.perf_counter()
            losses[name].append(float(sess.run(batch, fetch=["loss"])["loss"]))
            times[name].append(time.perf_counter() - t0)
    for name in sessions:
        out[name] = float(np.median(times[name][1:]))
        out[f"{name} losses"] = losses[name]
    return out


def _two_nodes():
    """A simulated Ray cluster on this machine: 2 raylets, 2 CPUs each (as tests/engines/test_ray.py)."""
    import ray
    from ray.cluster_utils import Cluster

    store = {"object_store_memory": 1 << 30}  # cluster_utils' default, 150 MB, spills to /tmp
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2} | store)
    cluster.add_node(num_cpus=2, **store)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    return cluster


def llama(steps: int, before: str | None) -> None:
    import ray

    cluster = _two_nodes()
    try:
        now = _llama_times(steps)
    finally:
        ray.shutdown()
        cluster.shutdown()
    np.testing.assert_allclose(now["ray losses"], now["local losses"], rtol=1e-6)
    print(f"(L) demo Llama training step, batch 16 x seq 64, 2 machines x 2 cores ({now['tasks']} tasks), "
          f"Ray on 2 simulated nodes x 2 CPUs; losses {[round(x, 6) for x in now['ray losses']]} "
          f"(equal to the local engine's)")
    print(f"  local engine (one process, 4 threads)   {now['local'] * 1e3:9.1f} ms/step")
    if "ray whole" in now:
        np.testing.assert_allclose(now["ray whole losses"], now["local losses"], rtol=1e-6)
        print(f"  ray, every actor sent the core-level graph {now['ray whole'] * 1e3:6.1f} ms/step "
              "(today's path for one machine; same run)")
    print(f"  ray, one actor per machine              {now['ray'] * 1e3:9.1f} ms/step, "
          f"setup {now['setup']:.1f} s; the driver built {now['driver']} tasks, shipped {now['shipped']}")
    if before is None:
        return
    env = os.environ | {"PYTHONPATH": str(Path(before) / "src")}
    proc = subprocess.run([sys.executable, __file__, "--llama-json", "--steps", str(steps)], env=env,
                          capture_output=True, text=True, check=True)
    old = json.loads(proc.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(old["ray losses"], now["ray losses"], rtol=1e-6)
    print(f"  ray, before ({before}/src)      {old['ray'] * 1e3:9.1f} ms/step, setup {old['setup']:.1f} s "
          f"(its local engine: {old['local'] * 1e3:.1f} ms/step); the driver built {old['driver']} tasks, "
          f"shipped {old['shipped']}")
    print(f"  per-machine / before = {now['ray'] / old['ray']:.2f} per step, "
          f"{now['setup'] / old['setup']:.2f} at setup")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--widths", default="1024,4096,4096,1024")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-dask", action="store_true", help="skip dask.distributed")
    parser.add_argument("--llama", action="store_true", help="only the Llama step on 2 simulated nodes")
    parser.add_argument("--llama-json", action="store_true", help=argparse.SUPPRESS)  # --before's child
    parser.add_argument("--steps", type=int, default=5, help="timed Llama steps")
    parser.add_argument("--before", help="a source tree (DIR/src) to time the Llama step with too")
    args = parser.parse_args()
    if args.llama_json:
        import ray

        cluster = _two_nodes()
        print(json.dumps(_llama_times(args.steps)))
        ray.shutdown()
        cluster.shutdown()
        return
    if args.llama:
        llama(args.steps, args.before)
        return
    import ray

    # dask warns that the feeds travel inside its graph: they travel with every run in ours too
    warnings.filterwarnings("ignore", message=".*[Ll]arge graph.*")
    ray.init(address="local", num_cpus=args.workers, log_to_driver=False, configure_logging=False)
    client = None
    if not args.no_dask:
        from dask.distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True)
        client = Client(cluster)
    print("Ray's overhead, against the local engine on the same TaskGraph")
    _per_task(args.workers, args.repeats)
    _per_mb(args.workers, args.repeats)
    chain(args.size, args.workers, client, args.repeats)
    mlp(args.batch, [int(w) for w in args.widths.split(",")], args.workers, client, args.repeats)
    if client is not None:
        client.close()
        cluster.close()


if __name__ == "__main__":
    main()
