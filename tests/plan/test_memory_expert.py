"""The expert's arithmetic beside the estimate (plan/predict/memory.py's ``Expert``, issue 31 item 5):
state, saved activations and one node's working set of the plan's busiest machine, as one
adds up FSDP with checkpointing by hand; the report prints it under the peak."""

import pytest

import einsummable as es
from einsummable.plan.planners import make_plan
from graphgen import deep_mlp_grads

LAYERS, BATCH, WIDTH = 4, 64, 128
F32 = 4


def test_state_is_the_inputs_and_gradients_and_the_backward_reads_each_layers_activation():
    g, _ = deep_mlp_grads(LAYERS, BATCH, WIDTH)
    plan = make_plan(g, es.Cluster(machines=1, cores=1), compare=False)
    e = plan.summary.memory.expert
    weights = LAYERS * WIDTH * WIDTH * F32
    assert e.state == BATCH * WIDTH * F32 + 2 * weights + F32  # x, the weights, their gradients, the loss
    layer = BATCH * WIDTH * F32  # one activation of one layer
    assert LAYERS * layer <= e.saved <= 3 * LAYERS * layer
    assert 0 < e.working <= 3 * layer + WIDTH * WIDTH * F32
    assert e.total == pytest.approx(e.state + e.saved + e.working)
    report = str(plan)
    assert "expert arithmetic for this plan:" in report and "saved activations" in report


def test_sharded_state_counts_the_busiest_machines_share():
    g, _ = deep_mlp_grads(LAYERS, BATCH, WIDTH)
    whole = make_plan(g, es.Cluster(machines=1, cores=1), compare=False).summary.memory.expert
    fsdp = make_plan(g, es.Cluster(machines=2, cores=1), planner="fsdp", compare=False).summary.memory.expert
    assert 0.45 * whole.state <= fsdp.state <= 0.6 * whole.state
