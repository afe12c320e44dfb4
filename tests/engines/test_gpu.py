"""The GPU engine (engines/gpu.py) against the reference engine, on torch's CPU device.

Each check runs twice: with torch ops only, and with the generated Triton kernels under
Triton's interpreter (``TRITON_INTERPRET=1``; skipped where Triton is not installed). Random
graphs x random partitions x worker counts in f32 (graphgen, as tests/lower/test_property.py)
and in bf16 (compared within bf16 rounding), and a tiny Llama training step with AdamW. The
tests marked ``cuda`` need a CUDA device (its streams and events) and skip without one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import random
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import einsummable as es  # noqa: E402
from einsummable.engines import gpu, reference  # noqa: E402
from einsummable.engines.kernels import triton as gpu_kernels  # noqa: E402
from einsummable.errors import EngineError  # noqa: E402
from einsummable.hardware.cluster import Cluster  # noqa: E402
from einsummable.ir.einsummable import Einsummable  # noqa: E402
from einsummable.lower import taskgraph as tgm  # noqa: E402
from einsummable.lower.lowering import lower  # noqa: E402
from einsummable.plan.plan import build  # noqa: E402
from graphgen import llama_step, random_graph, random_partitions  # noqa: E402

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (pip install triton): "
                                  "its kernels are checked under its interpreter, TRITON_INTERPRET=1")
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
KERNELS = ["torch", pytest.param("triton", marks=needs_triton)]
FEW = settings(max_examples=20, deadline=None)


@contextlib.contextmanager
def interpreting(kernels: str):
    """TRITON_INTERPRET=1 while a program for ``kernels="triton"`` is made and run."""
    with pytest.MonkeyPatch.context() as mp:
        if kernels == "triton":
            mp.setenv("TRITON_INTERPRET", "1")
        else:
            mp.delenv("TRITON_INTERPRET", raising=False)
        yield


def run_gpu(tg, feeds, kernels: str, variables=None, device: str = "cpu"):
    with interpreting(kernels):
        prog = gpu.GpuProgram(tg, device)
        assert (prog.triton is not None) == (kernels == "triton")
        return prog.run(feeds, variables)


def close(got, want, rtol, atol):
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_allclose(got[name].astype(np.float64), want[name].astype(np.float64),
                                   rtol=rtol, atol=atol, err_msg=name)


def lowered(g, feeds, rng: random.Random, workers: int):
    plan = build(g, Cluster(machines=1, cores=workers), random_partitions(g, rng))
    return lower(plan), reference.run(plan.graph, feeds)


# ----------------------------------------------------------------- random graphs, f32

@pytest.mark.parametrize("kernels", KERNELS)
@FEW
@given(seed=st.integers(0, 2**32 - 1), workers=st.sampled_from([1, 2, 3, 5]))
def test_random_graphs_and_partitions_match_reference(kernels, seed, workers):
    rng = random.Random(seed)
    g, feeds = random_graph(rng, n_ops=rng.randint(1, 10))
    tg, want = lowered(g.ir, feeds, rng, workers)
    close(run_gpu(tg, feeds, kernels), want, rtol=2e-4, atol=2e-4)


# ----------------------------------------------------------------- random graphs, bf16

STEPS = (
    lambda h, p: h @ p["w2"],
    lambda h, p: es.elementwise("silu(x0)", h),
    lambda h, p: es.elementwise("gelu(x0)", h),
    lambda h, p: es.elementwise("tanh(x0) * 2.0 + x0", h),
    lambda h, p: es.elementwise("where(x0 > 0, x0, x0 * 0.1)", h),
    lambda h, p: es.einsum("ij,j->ij", h, p["b"], join="x0 * x1 + 1.0"),
    lambda h, p: es.nn.softmax(h),
    lambda h, p: es.nn.rmsnorm(h, p["b"]),
    lambda h, p: h * es.reduce(h, 1, "max", keepdims=True),
)


def bf16_graph(rng: random.Random):
    """A random chain of bf16 steps over a bf16 GEMM, with a row reduction beside it."""
    m, k, n = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 9)
    g = es.Graph()
    p = {"x": g.input("x", (m, k), "bf16"), "w": g.input("w", (k, n), "bf16"),
         "w2": g.input("w2", (n, n), "bf16"), "b": g.input("b", (n,), "bf16")}
    h = p["x"] @ p["w"]
    for step in rng.sample(STEPS, rng.randint(1, 4)):
        h = step(h, p)
    g.output("h", h)
    g.output("r", es.reduce(h, 1, rng.choice(("add", "max", "min"))))
    np_rng = np.random.default_rng(rng.randrange(2**32))
    feeds = {name: (np_rng.standard_normal(t.shape) / 2).astype(ml_dtypes.bfloat16) for name, t in p.items()}
    return g, feeds


@pytest.mark.parametrize("kernels", KERNELS)
@FEW
@given(seed=st.integers(0, 2**32 - 1), workers=st.sampled_from([1, 2, 4]))
def test_bf16_graphs_match_reference_within_bf16_rounding(kernels, seed, workers):
    rng = random.Random(seed)
    g, feeds = bf16_graph(rng)
    tg, want = lowered(g.ir, feeds, rng, workers)
    assert any(t.dtype == "bf16" for t in tg.tasks if isinstance(t, tgm.ApplyTask))
    close(run_gpu(tg, feeds, kernels), want, rtol=3e-2, atol=3e-2)  # a few bf16 ulps


def test_bf16_blocks_stay_bf16_on_the_device_and_sums_accumulate_in_f32():
    g = es.Graph()
    g.output("s", g.input("x", (4096,), "bf16").sum())
    tg = es.compile(g, 1, engine="simulate").taskgraph
    x = np.full(4096, 0.1, ml_dtypes.bfloat16)
    out = gpu.GpuProgram(tg, "cpu").run_tensors({"x": gpu.to_device(x, torch.device("cpu"))})
    assert out["s"].dtype == torch.bfloat16
    assert float(out["s"]) == 410.0  # 4096 * bf16(0.1) = 409.6, rounded once (a bf16 sum stalls at 32)


# ----------------------------------------------------------------- the Triton kernels, one by one

JOINS = [
    ("ij,ij->ij", "x0 * x1 + 1.5", None),
    ("ij,j->ij", "silu(x0) * x1", None),
    ("ij->ij", "gelu(x0)", None),
    ("ij->ij", "tanh(x0)", None),
    ("ij->ij", "sigmoid(x0) - rsqrt(abs(x0) + 1.0)", None),
    ("ij->ij", "sqrt(abs(x0)) + x0 ** 3 + x0 ** -2", None),
    ("ij,ij->ij", "where(x0 > x1, exp(x0), log(abs(x1) + 1.0))", None),
    ("ij,ij->ij", "max(x0, x1) - min(x0, x1)", None),
    ("ij->ij", "x0 * lr + where(x0 >= 0, 1.0, 0.0)", None),
    ("ij->ij", "cast(cast(x0, f32) * 1.01, bf16)", None),
    ("ij,ij->i", "exp(x0 - x1)", "add"),
    ("ij->j", "x0 * x0", "add"),
    ("ijk->ik", "x0", "max"),
    ("ijk->ki", "x0", "min"),
    ("ij->i", "tanh(x0) * 0.2 + 1.0", "mul"),
    ("ij->", "x0", "add"),
]


@needs_triton
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("spec, join, agg", JOINS)
def test_each_generated_kernel_matches_the_reference_kernel(spec, join, agg, dtype):
    from einsummable.engines.kernels import reference as reference_kernel

    sizes = {"i": 5, "j": 37, "k": 3}
    ins = spec.split("->")[0]
    shapes = [tuple(sizes[c] for c in s) for s in ins.split(",")]
    op = Einsummable.from_spec(spec, shapes, join=join, agg=agg, dtypes=(dtype,) * len(shapes))
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    arrays = [a.astype(ml_dtypes.bfloat16) for a in arrays] if dtype == "bf16" else arrays
    launch = gpu_kernels.triton_kernel(op, "interpret")
    assert launch is not None
    got = launch([gpu.to_device(a, torch.device("cpu")) for a in arrays], {"lr": 0.5})
    want = reference_kernel.einsum(op, arrays, {"lr": 0.5})
    tol = 2e-2 if dtype == "bf16" else 1e-5
    np.testing.assert_allclose(gpu.to_host(got, op.dtype).astype(np.float64), want.astype(np.float64),
                               rtol=tol, atol=tol)


def test_joins_without_a_triton_form_fall_back_to_torch():
    ints = Einsummable.from_spec("i,i->i", [(4,), (4,)], join="x0 + x1", dtypes=("i64", "i64"))
    odd_pow = Einsummable.from_spec("i->i", [(4,)], join="x0 ** 2.5")
    assert gpu_kernels.triton_kernel(ints) is None and gpu_kernels.triton_kernel(odd_pow) is None
    x = torch.arange(4, dtype=torch.int64)
    assert gpu_kernels.prepare(ints, "interpret")([x, x], {}).tolist() == [0, 2, 4, 6]


@needs_triton
def test_a_generated_kernel_serves_every_block_of_a_form():
    """Sizes and strides are arguments: blocks of other shapes reuse the compiled function."""
    before = gpu_kernels._compiled.cache_info().currsize
    for n in (3, 5, 8):
        op = Einsummable.from_spec("ij,j->ij", [(n, 7), (7,)], join="x0 * x1 + 0.25")
        gpu_kernels.triton_kernel(op, "interpret")([torch.ones(n, 7), torch.ones(7)], {})
    assert gpu_kernels._compiled.cache_info().currsize - before <= 1


# ----------------------------------------------------------------- a Llama training step

@pytest.mark.parametrize("kernels", KERNELS)
def test_tiny_llama_training_step_matches_reference(kernels):
    g, loss, vocab, arrays, variables = llama_step(2)
    tg = es.compile(g, 2, engine="simulate").taskgraph
    got = run_gpu(tg, arrays, kernels, variables)
    close(got, reference.run(g.ir, arrays, variables), rtol=1e-3, atol=1e-4)
    assert abs(float(got[loss]) - np.log(vocab)) < 0.5  # untrained: about log(vocab)


# ----------------------------------------------------------------- the program's surface

def _small():
    g = es.Graph()
    x, w = g.input("x", (6, 4)), g.input("w", (4, 3))
    g.output("y", es.elementwise("relu(x0)", x @ w))
    rng = np.random.default_rng(1)
    return g, {"x": rng.standard_normal((6, 4), dtype=np.float32),
               "w": rng.standard_normal((4, 3), dtype=np.float32)}


def test_torch_feeds_and_outputs_stay_tensors():
    g, feeds = _small()
    prog = gpu.GpuProgram(es.compile(g, 2, engine="simulate").taskgraph, "cpu")
    out = prog.run_tensors({k: torch.from_numpy(v) for k, v in feeds.items()})
    np.testing.assert_allclose(out["y"].numpy(), np.maximum(feeds["x"] @ feeds["w"], 0), rtol=1e-5, atol=1e-6)


def test_a_failing_task_raises_engine_error_naming_it():
    g, feeds = _small()
    tg = es.compile(g, 1, engine="simulate").taskgraph
    prog = gpu.GpuProgram(tg, "cpu")
    t = next(i for i, task in enumerate(tg.tasks) if isinstance(task, tgm.ApplyTask))

    def broken(args, feeds, variables):
        raise RuntimeError("boom")

    prog.steps[t] = broken
    with pytest.raises(EngineError, match=rf"task {t} \(apply\[.*\].*\) failed: RuntimeError: boom"):
        prog.run(feeds)
    with pytest.raises(EngineError, match="not fed"):
        prog.run({"x": feeds["x"]})


def test_triton_asked_for_where_it_cannot_run_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    g, _ = _small()
    with pytest.raises(EngineError, match="TRITON_INTERPRET"):
        gpu.GpuProgram(es.compile(g, 1, engine="simulate").taskgraph, "cpu", triton=True)


@pytest.mark.skipif(not hasattr(tgm, "FusedTask"), reason="this TaskGraph has no FusedTask kind")
def test_a_fused_task_runs_its_two_ops():
    gemm = Einsummable.from_spec("ij,jk->ik", [(6, 4), (4, 3)])
    join = Einsummable.from_spec("ik,k->ik", [(6, 3), (3,)], join="relu(x0 + x1)")
    tasks = (tgm.InputTask("x", ((0, 6), (0, 4)), "f32", 0), tgm.InputTask("w", ((0, 4), (0, 3)), "f32", 0),
             tgm.InputTask("b", ((0, 3),), "f32", 0),
             tgm.FusedTask(gemm, join, (0, 1, -1, 2), (0, 1, 2), 0))
    tg = tgm.TaskGraph(tasks, {"y": tgm.Output((6, 3), "f32", ((3, ((0, 6), (0, 3))),))}, 1, 1)
    rng = np.random.default_rng(2)
    x, w, b = (rng.standard_normal(s, dtype=np.float32) for s in [(6, 4), (4, 3), (3,)])
    got = gpu.GpuProgram(tg, "cpu").run({"x": x, "w": w, "b": b})["y"]
    np.testing.assert_allclose(got, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------- on CUDA

@needs_cuda
@pytest.mark.parametrize("seed", range(5))
def test_on_cuda_random_graphs_on_several_streams_match_reference(seed):
    rng = random.Random(seed)
    g, feeds = random_graph(rng, n_ops=8)
    tg, want = lowered(g.ir, feeds, rng, 3)
    close(gpu.GpuProgram(tg, "cuda").run(feeds), want, rtol=2e-4, atol=2e-4)


@needs_cuda
def test_on_cuda_a_bf16_gemm_stays_bf16():
    g = es.Graph()
    g.output("y", g.input("a", (256, 128), "bf16") @ g.input("b", (128, 64), "bf16"))
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((256, 128)).astype(ml_dtypes.bfloat16),
             "b": rng.standard_normal((128, 64)).astype(ml_dtypes.bfloat16)}
    out = gpu.GpuProgram(es.compile(g, 2, engine="simulate").taskgraph, "cuda").run_tensors(feeds)
    assert out["y"].dtype == torch.bfloat16 and out["y"].is_cuda
    want = reference.run(g.ir, feeds)["y"].astype(np.float32)
    np.testing.assert_allclose(out["y"].float().cpu().numpy(), want, rtol=2e-2, atol=5e-2)



# ----------------------------------------------------------------- GPUs as machines

def test_a_gpu_cluster_is_machines_of_one_worker_with_their_memory():
    from einsummable.errors import PlanError
    from einsummable.hardware.calibrate import physical_memory

    c = es.Cluster.gpus()
    assert c.cores == 1 and c.machines == (torch.cuda.device_count() if HAS_CUDA else 1)
    want = torch.cuda.get_device_properties(0).total_memory if HAS_CUDA else physical_memory()
    assert c.memory_per_machine == want
    if not HAS_CUDA:
        assert es.Cluster.gpus(3).workers == 3  # torch's CPU device, three times: the test path
    for bad in (0, -1, 1.5, True):
        with pytest.raises(PlanError, match="count"):
            es.Cluster.gpus(bad)


def test_a_measured_gpu_cluster_times_the_device():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on the CPU path: OpenMP threads beside another test's stall its GEMM
    try:
        c = es.Cluster.gpus(measure=True)
    finally:
        torch.set_num_threads(threads)
    # a GEMM reuses each element n times; an elementwise pass touches each once
    assert c.flops_per_core > 3 * c.elementwise_flops_per_core > 0
    assert c.copy_bandwidth == c.bandwidth_within > 0
    assert 0 < c.task_overhead == c.gil_seconds < 0.01  # one host thread issues every device's tasks


def test_workers_map_to_their_machines_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    devices = gpu.machine_devices(2)
    assert [str(d) for d in gpu.worker_devices(4, devices)] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    with pytest.raises(EngineError, match="3 GPUs .* torch sees 2"):
        gpu.machine_devices(3)
    with pytest.raises(EngineError, match="3 workers do not split evenly over 2 devices"):
        gpu.worker_devices(3, devices)


def across(tg, prog) -> int:
    """Moves the program runs as copies between devices."""
    return sum(isinstance(t, tgm.MoveTask) and prog.devices[t.src] != prog.devices[t.loc] for t in tg.tasks)


# "cpu" and "cpu:0" are two devices to torch: a block moved between them is copied, as between GPUs
TWO_CPUS = ["cpu", "cpu:0"]


@FEW
@given(seed=st.integers(0, 2**32 - 1), cores=st.sampled_from([1, 2]))
def test_random_graphs_over_two_devices_match_reference(seed, cores):
    rng = random.Random(seed)
    g, feeds = random_graph(rng, n_ops=rng.randint(1, 10))
    plan = build(g.ir, Cluster(machines=2, cores=cores), random_partitions(g.ir, rng))
    tg = lower(plan)
    with interpreting("torch"):
        prog = gpu.GpuProgram(tg, TWO_CPUS)
        got = prog.run(feeds)
    assert [str(d) for d in prog.devices] == [d for d in TWO_CPUS for _ in range(cores)]
    close(got, reference.run(plan.graph, feeds), rtol=2e-4, atol=2e-4)


def test_a_llama_step_planned_for_two_gpus_copies_between_them_and_matches_reference():
    g, _, _, arrays, variables = llama_step(4)
    cluster = replace(es.Cluster.gpus(1), machines=2, min_block_seconds=0)  # two GPUs' plan
    tg = es.compile(g, cluster=cluster, engine="simulate").taskgraph
    with interpreting("torch"):
        prog = gpu.GpuProgram(tg, TWO_CPUS)
        got = prog.run(arrays, variables)
    assert across(tg, prog) > 0  # the plan splits the step over both devices
    close(got, reference.run(g.ir, arrays, variables), rtol=1e-3, atol=1e-4)


def test_compile_for_engine_gpu_plans_for_the_gpus():
    g, feeds = _small()
    prog = es.compile(g, engine="gpu")
    assert prog.plan.cluster == es.Cluster.gpus()
    want = np.maximum(feeds["x"] @ feeds["w"], 0)
    np.testing.assert_allclose(prog.run(feeds)["y"], want, rtol=1e-5, atol=1e-6)
    two = es.compile(g, engine="gpu", cluster=replace(es.Cluster.gpus(1), machines=2))
    assert len(set(two.executor.devices)) == (2 if HAS_CUDA and torch.cuda.device_count() >= 2 else 1)


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("seed", range(3))
def test_on_two_gpus_random_graphs_match_reference(seed):
    rng = random.Random(seed)
    g, feeds = random_graph(rng, n_ops=8)
    plan = build(g.ir, Cluster(machines=2, cores=2), random_partitions(g.ir, rng))
    close(gpu.GpuProgram(lower(plan), machines=2).run(feeds), reference.run(plan.graph, feeds),
          rtol=2e-4, atol=2e-4)
