"""Prefetch (lower/prefetch.py, issue 31): in the program's order a copy of resident state
(an FSDP-gathered weight) is made a bounded window ahead of its reader and made again for
a reader far after, so the gathered weights of every layer are not held at once. Checked
against the estimate (plan/predict/memory.py), the simulator and the reference engine."""

import numpy as np
import pytest

import einsummable as es
from einsummable.engines import reference, sequential
from einsummable.engines.simulator import simulate
from einsummable.ir import priority
from einsummable.lower.compact import CompactGraph
from einsummable.lower.lowering import lower
from einsummable.lower.prefetch import prefetch
from einsummable.lower.refine import machine_shares, refine
from einsummable.lower.taskgraph import MoveTask, PartialTask, data_inputs
from einsummable.plan.planners import make_plan
from graphgen import deep_mlp_grads

MiB = 2**20


def mlp_grads():
    return deep_mlp_grads(layers=12, batch=64, width=512)  # 1 MiB weights, activations a quarter of that


def fsdp_plan(g, budget: float = MiB, cores: int = 1):
    """FSDP on 2 machines, with a budget the critical path's order exceeds: the program's order."""
    cluster = es.Cluster(machines=2, cores=cores, memory_per_machine=budget)
    return make_plan(g, cluster, planner="fsdp", compare=False, check_memory=False)


def gated(tg) -> list[int]:
    return [t for t, task in enumerate(tg.tasks) if len(task.inputs) > len(data_inputs(task))]


def test_gathered_weights_are_made_per_use_and_the_busiest_machine_holds_less(monkeypatch):
    g, _ = mlp_grads()
    plan = fsdp_plan(g)
    assert plan.order == priority.PROGRAM
    tg = lower(plan)
    tg.validate()
    gates = gated(tg)
    assert gates and all(isinstance(tg.tasks[t], MoveTask | PartialTask) for t in gates)
    sim = max(simulate.run(tg, plan.cluster).peak_memory)
    assert sim == pytest.approx(plan.summary.peak, rel=0.15)
    monkeypatch.setattr(priority, "PREFETCH", 10**9)  # no window: every copy made at the start
    held = fsdp_plan(g)
    whole = lower(held)
    assert not gated(whole) and len(whole) < len(tg)  # the backward's gathers are the extra tasks
    held_sim = max(simulate.run(whole, held.cluster).peak_memory)
    # 12 layers of 1 MiB weights, half of each gathered from the other machine: held at once
    # without the window; with it, a few layers' worth
    assert sim < 0.8 * held_sim and plan.summary.peak < 0.9 * held.summary.peak


def test_the_critical_paths_order_is_left_as_it_is():
    g, _ = mlp_grads()
    plan = fsdp_plan(g, budget=256 * MiB)
    assert plan.order == priority.CRITICAL_PATH
    tg = lower(plan)
    assert not gated(tg)
    assert prefetch(CompactGraph.from_taskgraph(tg)).to_taskgraph().tasks == tg.tasks


@pytest.mark.parametrize("engine", ["sequential", "local"])
def test_a_prefetched_step_computes_the_references_gradients(engine):
    g, feeds = mlp_grads()
    want = reference.run(g, feeds)
    prog = es.compile(g, cluster=es.Cluster(machines=2, cores=1, memory_per_machine=13 * MiB), planner="fsdp",
                      engine=engine)
    assert prog.plan.order == priority.PROGRAM and gated(prog.taskgraph)
    got = prog.run(feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-4, atol=1e-5, err_msg=name)


def test_each_machine_refines_its_gates_onto_its_own_cores():
    """The machine-level graph (blockwise.py) is gated as lowering.py's is, and a machine's
    refinement keeps each send's and partial's gates, as core tasks of its own."""
    g, feeds = mlp_grads()
    plan = fsdp_plan(g, cores=2)
    cg, shares = machine_shares(plan)
    assert plan.order == priority.PROGRAM and cg.order == priority.PROGRAM
    top = cg.to_taskgraph()
    top.validate()
    assert gated(top)
    for share in shares:
        refined = refine(share).graph
        refined.validate()
        assert gated(refined)
    want = reference.run(g, feeds)["d0"]
    got = sequential.run(lower(plan), feeds)["d0"]
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-5)
