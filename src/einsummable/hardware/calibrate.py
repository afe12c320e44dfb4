"""Measure this machine's rates for the hardware model: GEMM and elementwise flop
rates per core and the memory-copy rate, with every core busy at once (as in a run).

Each figure is the median of a few timed repetitions, each core running the same
numpy kernel in its own thread with BLAS held to one thread, so a figure is what
one worker gets while its neighbours work too. Time is each thread's CPU time, so
other programs sharing the box do not count against it. Moves inside a machine are memory
copies, so ``bandwidth_within`` is the copy rate; the rates between machines and
latencies keep the Cluster defaults. The per-task overheads are the local engine's
own, timed on chains of tiny tasks (``dispatch``). ``ray_driver`` measures
what the Ray engine's driver pays to call, feed and fetch a machine actor. ``gpu_figures``
describes GPUs (``Cluster.gpus``), timed with torch on the device where asked.

    cluster = Cluster.measure()             # or: einsummable calibrate --out cluster.json
    ray_cluster = replace(cluster, **ray_driver())   # joined to a Ray cluster
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from einsummable.errors import PlanError

GEMM_N = 1024
ELEMENTS = 1 << 22  # 16 MiB of f32: out of cache, like a real block
COPY_ELEMENTS = 1 << 24  # 64 MiB: past malloc's mmap threshold, so each copy faults its pages in
REPEATS = 5


def _per_core_seconds(cores: int, make: Callable[[], Callable[[], None]]) -> float:
    """Median seconds of one call of the kernel while every core runs its own copy."""
    kernels = [make() for _ in range(cores)]
    for k in kernels:
        k()
    def work(i: int, barrier: threading.Barrier, spans: list[float]) -> None:
        barrier.wait()
        t0 = time.thread_time()
        kernels[i]()
        spans[i] = time.thread_time() - t0

    times: list[float] = []
    for _ in range(REPEATS):
        barrier = threading.Barrier(cores)
        spans = [0.0] * cores
        threads = [threading.Thread(target=work, args=(i, barrier, spans)) for i in range(cores)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        times.append(statistics.median(spans))
    return statistics.median(times)


def _gemm() -> Callable[[], None]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32)
    b = rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32)
    out = np.empty_like(a)
    return lambda: np.matmul(a, b, out=out)


def _elementwise() -> Callable[[], None]:
    """Two flops per element (a multiply-add as two ufunc passes), as compiled joins run."""
    rng = np.random.default_rng(0)
    x, y, z = (rng.standard_normal(ELEMENTS, dtype=np.float32) for _ in range(3))
    out = np.empty_like(x)

    def run() -> None:
        np.multiply(x, y, out=out)
        np.add(out, z, out=out)

    return run


def _copy() -> Callable[[], None]:
    """Into fresh memory, page faults and all, as every kernel writes its output block."""
    src = np.ones(COPY_ELEMENTS, dtype=np.float32)
    return lambda: np.array(src, copy=True)


# joins of two operands and their nodes, timed against one node (x0 * x1): arithmetic, exp, sqrt
NODE_JOINS = (("exp(x0 - x1)", 2), ("(x0 - x1) * (x0 + x1)", 3), ("exp(x0 - x1) * x1 + x0", 4),
              ("sqrt(x0 * x0 + x1 * x1) / (x0 + 2.0)", 6))
NODE_ELEMENTS = 1 << 20  # 4 MiB of f32: a block's size, out of L2


def node_cost(cores: int) -> float:
    """``elementwise_node_cost``: what a join's each node past its first costs, in passes, as the
    engines run joins: 1.0 on the numpy path (a ufunc pass a node); compiled, the median over
    NODE_JOINS of (its time / one node's time - 1) / (its nodes - 1)."""
    from einsummable.engines.kernels import (  # the engines' own kernels, loaded only when asked
        cbuild,
        native,
    )
    from einsummable.engines.kernels import fast as kernels
    from einsummable.ir.einsummable import Einsummable

    if not cbuild.enabled() or cbuild.compiler() is None:
        return 1.0

    def join(expr: str) -> Callable[[], Callable[[], None]]:
        def make() -> Callable[[], None]:
            rng = np.random.default_rng(0)
            xs = [rng.standard_normal(NODE_ELEMENTS, dtype=np.float32) for _ in range(2)]
            run = kernels.prepare(Einsummable.from_spec("i,i->i", [(NODE_ELEMENTS,)] * 2, join=expr,
                                                        dtypes=["f32", "f32"]))
            native.flush()
            return lambda: run(xs, None)

        return make

    one = _per_core_seconds(cores, join("x0 * x1"))
    return statistics.median(max(0.0, (_per_core_seconds(cores, join(e)) / one - 1) / (n - 1))
                             for e, n in NODE_JOINS)


STORAGE_BYTES = 1 << 26  # 64 MiB: a stored block's size, well past the drive's cache


def storage_bandwidth() -> float:
    """Bytes/s a block goes to host storage and back, as offloaded state does
    (engines/storage.py): written to a file in its directory, forced to the device, and read
    back (the median of a few; wall time, the device being the resource)."""
    import tempfile

    from einsummable.engines.storage import directory  # where the engines store blocks

    block = np.ones(STORAGE_BYTES // 4, dtype=np.float32)
    times = []
    for _ in range(3):
        with tempfile.TemporaryFile(dir=directory()) as f:
            t0 = time.perf_counter()
            f.write(block.data)
            f.flush()
            os.fsync(f.fileno())
            f.seek(0)
            f.readinto(memoryview(np.empty_like(block)).cast("B"))
            times.append(time.perf_counter() - t0)
    return 2 * STORAGE_BYTES / statistics.median(times)


def physical_memory() -> float:
    """This machine's memory in bytes."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def rates(cores: int) -> dict[str, float]:
    """This machine's measured Cluster fields (rates and memory) with ``cores`` busy cores."""
    with threadpool_limits(1, "blas"):
        gemm = 2 * GEMM_N**3 / _per_core_seconds(cores, _gemm)
        elementwise = 2 * ELEMENTS / _per_core_seconds(cores, _elementwise)
        copy = 4 * COPY_ELEMENTS / _per_core_seconds(cores, _copy)
    return {"flops_per_core": gemm, "bandwidth_within": copy, "elementwise_flops_per_core": elementwise,
            "copy_bandwidth": copy, "memory_per_machine": physical_memory(),
            "storage_bandwidth": storage_bandwidth(),
            "elementwise_node_cost": node_cost(cores)} | dispatch(cores)


def least_run_seconds(prog, feeds: dict[str, np.ndarray]) -> float:
    """The least wall seconds of ``REPEATS`` runs of a program, after one to warm it: other
    programs on the box only add."""
    prog.run(feeds)
    spans = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        prog.run(feeds)
        spans.append(time.perf_counter() - t0)
    return min(spans)


def tiny_chains(busy: int, workers: int, chain: int, make: Callable[[int, int], object] | None = None):
    """A TaskGraph for ``workers`` that is nothing but dispatch: on each of the first ``busy``
    workers an input of 4 f32 elements (``x{w}``, fed by ``tiny_feeds``) and ``chain`` tasks after
    it, each ``make(i, w)`` reading task i (default: a join on 4 elements), the last one ``y{w}``."""
    from einsummable.ir.einsummable import Einsummable
    from einsummable.lower.taskgraph import ApplyTask, InputTask, Output, TaskGraph

    box = ((0, 4),)
    if make is None:
        tiny = Einsummable.from_spec("i->i", [(4,)], "x0 * 0.5 + 1")

        def make(i: int, w: int) -> ApplyTask:
            return ApplyTask(tiny, (i,), w)

    tasks, outputs = [], {}
    for w in range(busy):
        tasks.append(InputTask(f"x{w}", box, "f32", w))
        for _ in range(chain):
            tasks.append(make(len(tasks) - 1, w))
        outputs[f"y{w}"] = Output((4,), "f32", ((len(tasks) - 1, box),))
    return TaskGraph(tuple(tasks), outputs, workers, workers)


def tiny_feeds(busy: int) -> dict[str, np.ndarray]:
    """The inputs of ``tiny_chains(busy, ...)``."""
    return {f"x{w}": np.ones(4, np.float32) for w in range(busy)}


def dispatch(cores: int, chain: int = 300) -> dict[str, float]:
    """The local engine's cost per task on ``cores`` workers, from chains of tiny kernel tasks (a
    join on 4 elements) and of views. ``task_overhead``: a worker's seconds per kernel task with
    the others idle (one worker alone runs its tasks inline: 5 against 15-20 us here);
    ``gil_seconds``: the run's seconds per task with every worker running a chain, the part of a
    task's dispatch that holds the interpreter, which the workers of one process take in turn
    (22 us here at 2 and 4 workers, 29 at 8: a machine's tiny tasks go one at a time, whatever
    its cores); ``view_overhead``: a worker's seconds per view, all busy. These three through
    Python, the native loop off. ``native_overhead``: a task's seconds inside a run of the native
    loop (lower/runs.py), from the difference between chains of ``chain`` and ``2 * chain`` joins
    (0.05-0.1 us here; None where no C compiler works: no loop). Least of a few runs: other
    programs only add."""
    from einsummable.engines.kernels import cbuild
    from einsummable.engines.local import LocalProgram  # the engine's own loop, loaded only when asked
    from einsummable.lower.taskgraph import ViewTask

    def run_seconds(busy: int, make: Callable[[int, int], object] | None = None, n: int = chain,
                    native_loop: bool = False) -> float:
        """The least wall seconds of a run with a chain of ``n`` on each of the first ``busy`` workers."""
        prog = LocalProgram(tiny_chains(busy, cores, n, make), native_loop)
        return least_run_seconds(prog, tiny_feeds(busy))

    alone = run_seconds(1) / (chain + 1)
    native = (run_seconds(1, n=2 * chain, native_loop=True) - run_seconds(1, native_loop=True)) / chain
    return {"task_overhead": alone,
            "gil_seconds": run_seconds(cores) / (cores * (chain + 1)) if cores > 1 else alone,
            "view_overhead": run_seconds(cores, lambda i, w: ViewTask((i,), (4,), "f32", w)) / (chain + 1),
            "native_overhead": min(max(native, 0.0), alone) if cbuild.enabled() else None}


def ray_driver(repeats: int = 7) -> dict[str, float]:
    """The Cluster's ``driver_latency`` and ``driver_bandwidth`` for the connected Ray cluster,
    measured as the Ray engine pays them: arrays shipped to an actor on the driver's node as an
    argument and fetched back as a result (and copied out, as the driver assembles an output),
    of 512 KiB and 32 MiB (both through Ray's object store, as a run's feeds and fetches are);
    medians of ``repeats`` after four warm calls. The bandwidth is the slope; the latency is
    what a call carrying one block there and one back costs besides their bytes (the empty
    call's round trip, 0.8 ms here, and the put and get of each object, 1-2 ms more)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    class Probe:
        def __init__(self) -> None:
            self.blocks: dict[int, np.ndarray] = {}

        def take(self, block: np.ndarray | None) -> None:
            """A feed arrives."""

        def make(self, nbytes: int) -> None:
            self.blocks[nbytes] = np.ones(nbytes // 4, np.float32)

        def give(self, nbytes: int) -> tuple[str, dict[int, np.ndarray]]:
            """A block the actor holds (as the engine returns computed blocks), fetched."""
            return "ok", {0: self.blocks[nbytes]}

    here = ray.get_runtime_context().get_node_id()
    probe = Probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()

    def timed(call: Callable[[], object]) -> float:
        for _ in range(4):  # warm: the object store's pages touched, as in a program's later runs
            call()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    small, large = 1 << 19, 1 << 25
    try:
        call = timed(lambda: ray.get(probe.take.remote(None)))
        both = {}  # a feed and a fetch of the size
        for nbytes in (small, large):
            block = np.ones(nbytes // 4, np.float32)
            ray.get(probe.make.remote(nbytes))
            feed = timed(lambda block=block: ray.get(probe.take.remote(block)))
            fetch = timed(lambda n=nbytes: np.array(ray.get(probe.give.remote(n))[1][0], copy=True))
            both[nbytes] = feed + fetch
    finally:
        ray.kill(probe)
    bandwidth = 2 * (large - small) / max(both[large] - both[small], 1e-9)
    # the feed's and the fetch's calls are one call in a run: count the empty round trip once
    latency = max(both[small] - 2 * small / bandwidth - call, call)
    return {"driver_latency": latency, "driver_bandwidth": bandwidth}


def ray_link(repeats: int = 7, burst: int = 6) -> dict[str, float]:
    """The Cluster's ``bandwidth_across``, ``overhead_across`` and ``latency_across`` for the
    connected Ray cluster's first two machines (nodes), measured as the Ray engine moves a block:
    an actor call carrying it, from an actor on one node to one on the other, answered when it
    has run. Medians of ``repeats`` after a warm one.

    One block's round trip, of 512 KiB and 16 MiB, gives the bandwidth (a lone block takes
    ``latency_across + overhead_across + bytes / bandwidth_across``); ``burst`` blocks of 512 KiB
    sent back to back give the overhead: each block after the first adds what one holds the
    link, ``overhead_across + bytes / bandwidth_across`` (Ray puts, calls and pulls each object
    in turn: about 4 ms a block here, where the bytes take 0.5 ms). Both sizes go through Ray's
    object store; a block under 100 KiB is sent inline with its call, cheaper than the model says."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, max_concurrency=32)  # threaded, as the engine's machine actor
    class End:
        def take(self, block: np.ndarray) -> None:
            """A block arrives."""

        def give(self, peer, nbytes: int, count: int) -> float:
            """Median seconds until ``count`` blocks sent back to back have all arrived."""
            block, out = np.ones(nbytes // 4, np.float32), []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                ray.get([peer.take.remote(block) for _ in range(count)])
                out.append(time.perf_counter() - t0)
            return statistics.median(out[1:])

    from einsummable.engines.ray_nodes import live_nodes  # machines 0 and 1 as the engine orders them

    hosts = [n["NodeID"] for n in live_nodes()][:2]
    if len(hosts) < 2:
        raise PlanError(f"calibrate.ray_link needs a Ray cluster of two nodes with CPUs; it has {len(hosts)}")
    ends = [End.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
            for node in hosts]
    small, large = 1 << 19, 1 << 24
    try:
        one = {n: ray.get(ends[0].give.remote(ends[1], n, 1)) for n in (small, large)}
        held = (ray.get(ends[0].give.remote(ends[1], small, burst)) - one[small]) / (burst - 1)
    finally:
        for end in ends:
            ray.kill(end)
    bandwidth = (large - small) / max(one[large] - one[small], 1e-9)
    overhead = max(held - small / bandwidth, 0.0)
    return {"bandwidth_across": bandwidth, "overhead_across": overhead,
            "latency_across": max(one[small] - small / bandwidth - overhead, 0.0)}


# An H100 SXM's figures, for a GPU cluster planned without timing it: dense bf16 GEMM as cuBLAS
# reaches it, HBM3 for elementwise passes (2 flops a 16-byte f32 multiply-add) and copies, NVLink
# between GPUs, the engine's host-side cost per task (torch's dispatch and ours), and a block
# worth a launch at 50 us (5e-4, the CPU figure, would keep a 1B model's GEMMs from ever splitting).
NOMINAL_GPU = {"flops_per_core": 6e14, "elementwise_flops_per_core": 4e11, "bandwidth_within": 1.5e12,
               "copy_bandwidth": 1.5e12, "bandwidth_across": 4e11, "latency_across": 1e-5,
               "task_overhead": 3e-5, "gil_seconds": 3e-5, "view_overhead": 5e-6, "min_block_seconds": 5e-5,
               "native_overhead": None}  # the GPU engine runs no native loop
GPU_GEMM_N = {"cuda": 8192, "cpu": 256}  # bf16 on CUDA, f32 on torch's CPU device (the test path)
GPU_ELEMENTS = {"cuda": 1 << 26, "cpu": 1 << 18}


def gpu_figures(count: int | None, measure: bool) -> dict[str, float]:
    """Cluster fields for ``count`` GPUs (machines): every GPU torch sees by default, their least
    memory; without CUDA, torch's CPU device (``count`` or 1 machines, this machine's memory)."""
    try:
        import torch
    except ModuleNotFoundError as err:
        raise PlanError("Cluster.gpus needs torch: pip install torch") from err
    cuda = torch.cuda.is_available()
    seen = torch.cuda.device_count() if cuda else None
    if count is None:
        count = seen or 1
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise PlanError(f"Cluster.gpus count must be a positive integer, got {count!r}")
    if seen is not None and count > seen:
        raise PlanError(f"Cluster.gpus({count}): torch sees {seen} GPU(s)")
    if cuda:
        memory = float(min(torch.cuda.get_device_properties(m).total_memory for m in range(count)))
        figures = dict(NOMINAL_GPU)
    else:
        memory, figures = physical_memory(), {}
    if measure:
        figures |= gpu_rates(torch.device("cuda", 0) if cuda else torch.device("cpu"), count)
    return {"machines": count, "memory_per_machine": memory} | figures


def gpu_rates(device, count: int) -> dict[str, float]:
    """A device's measured rates: GEMM (bf16 on CUDA), elementwise, copy, between two GPUs
    (where ``count`` >= 2) and the GPU engine's seconds per task, medians of a few runs."""
    import torch

    kind = device.type
    sync = torch.cuda.synchronize if kind == "cuda" else (lambda: None)

    def seconds(run: Callable[[], object]) -> float:
        run()
        sync()
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            run()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    n, elements = GPU_GEMM_N[kind], GPU_ELEMENTS[kind]
    dtype = torch.bfloat16 if kind == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    x, y, z = (torch.randn(elements, device=device) for _ in range(3))
    out = torch.empty_like(x)
    copy = 4 * elements / seconds(lambda: x.clone())
    figures = {"flops_per_core": 2 * n**3 / seconds(lambda: a @ b),
               "elementwise_flops_per_core": 2 * elements / seconds(lambda: torch.addcmul(z, x, y, out=out)),
               "bandwidth_within": copy, "copy_bandwidth": copy}
    if kind == "cuda" and count >= 2:
        there = torch.device("cuda", 1)
        figures["bandwidth_across"] = 4 * elements / seconds(lambda: x.to(there))
    per_task = gpu_dispatch(device)
    return figures | {"task_overhead": per_task, "gil_seconds": per_task, "native_overhead": None}


def gpu_dispatch(device, chain: int = 300) -> float:
    """The GPU engine's host seconds per task, from a chain of tiny joins (least of a few runs):
    one host thread issues every task, so it is also the interpreter's share."""
    from einsummable.engines.gpu import GpuProgram  # the engine's own loop, loaded only when asked

    prog = GpuProgram(tiny_chains(1, 1, chain), device, triton=False)
    return least_run_seconds(prog, tiny_feeds(1)) / (chain + 1)
