"""The fusion passes (lower/fusion.py): one fused TaskGraph that every engine runs, simulates and
traces, computing what the unfused graph computes."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import einsummable as es
from einsummable.cli_plan import training_graph
from einsummable.engines import local, reference, sequential
from einsummable.hardware.cluster import Cluster
from einsummable.ir import kinds
from einsummable.ir.dtypes import to_numpy
from einsummable.lower.fusion import fuse
from einsummable.lower.lowering import lower
from einsummable.lower.taskgraph import ApplyTask, FusedTask
from einsummable.models.llama import LlamaConfig
from einsummable.plan.plan import build
from graphgen import random_graph, random_partitions

CFG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1)


def _feeds(g: es.Graph, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for name, x in g.inputs.items():
        if x.dtype == "i64":
            out[name] = rng.integers(0, vocab, x.shape)
        else:
            out[name] = (rng.standard_normal(x.shape) * 0.1).astype(to_numpy(x.dtype))
    return out


def _traced(path) -> list[str]:
    """The task names of a Chrome trace, in task order."""
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    return sorted((e["name"] for e in events), key=lambda n: int(n.split("%")[1]))


@pytest.mark.parametrize("workers", [1, 2])
def test_one_fused_llama_step_runs_on_local_sequential_and_the_simulator_as_one_task_list(tmp_path, workers):
    """A Llama training step (forward, backward, gradients out): the local engine, the sequential
    engine and the simulator see the same tasks, fused ones among them, and the two engines give
    what the reference engine gives on the graph unfused."""
    g = training_graph(CFG, batch=2, seq=8, optimizer="none")
    feeds = _feeds(g, CFG.vocab_size)
    prog = es.compile(g, workers=workers)
    tg = prog.taskgraph
    fused = [t for t in tg.tasks if isinstance(t, FusedTask)]
    assert {kinds.is_gemm(t.first) for t in fused} == {True, False}  # epilogues and row pairs
    assert len(tg) == len(prog.unfused()) - len(fused)

    got_local = prog.run(feeds, trace=tmp_path / "local.json")
    got_seq = sequential.run(tg, feeds, trace=tmp_path / "sequential.json")
    prog.simulate(trace=tmp_path / "simulated.json")
    want = [f"{type(t).__name__.removesuffix('Task').lower()} %{i}" for i, t in enumerate(tg.tasks)]
    for engine in ("local", "sequential", "simulated"):
        assert _traced(tmp_path / f"{engine}.json") == want, engine

    oracle = reference.run(g.ir, feeds)
    for name, value in oracle.items():
        np.testing.assert_allclose(got_local[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(got_seq[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 3]))
def test_fused_random_graphs_give_the_unfused_graphs_values(seed, workers):
    """Random graphs x partitions x workers: the fused graph is valid, has a task fewer per pair,
    and the sequential engine gives on it exactly what it gives on the unfused graph."""
    rng = random.Random(seed)
    g, feeds = random_graph(rng, n_ops=rng.randint(1, 10))
    tg = lower(build(g.ir, Cluster(machines=1, cores=workers), random_partitions(g.ir, rng)))
    fusion = fuse(tg)
    fused = fusion.graph
    fused.validate()
    pairs = sum(isinstance(t, FusedTask) for t in fused.tasks)
    assert len(fused) == len(tg) - pairs
    assert sorted(set(fusion.index)) == list(range(len(fused)))
    want, got = sequential.run(tg, feeds), sequential.run(fused, feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_kv_cache_update_is_marked_as_donating_its_cache():
    """``where(slot == t, new, cache)`` over the cache the graph also returns: the apply donates the
    cache's operand; read by another task too, it does not."""
    g = es.Graph()
    cache, new = g.input("cache", (4, 8)), g.input("new", (8,))
    slot = g.ramp((4,), steps=(1.0,))
    g.output("cache", es.einsum("i,j,ij->ij", slot, new, cache, join="where(x0 == t, x1, x2)"))
    tg = es.compile(g, workers=1).taskgraph
    (donor,) = [t for t in tg.tasks if isinstance(t, ApplyTask) and t.donates >= 0]
    assert tg.tasks[donor.inputs[donor.donates]].name == "cache"
    g.output("sum", cache.sum())
    tg = es.compile(g, workers=1).taskgraph
    assert not [t for t in tg.tasks if isinstance(t, ApplyTask) and t.donates >= 0]


def test_the_local_engine_runs_an_unfused_graph_as_given():
    """Engines do not fuse: a graph lowered without the passes runs task for task."""
    g = training_graph(CFG, batch=1, seq=4, optimizer="none")
    prog = es.compile(g, workers=1)
    unfused = prog.unfused()
    assert not any(isinstance(t, FusedTask) for t in unfused.tasks)
    feeds = _feeds(g, CFG.vocab_size)
    got, want = local.run(unfused, feeds), prog.run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
