"""ir/eager.py: each optimizer update moves to just after its gradient, so the program's
order frees the gradients as it goes; the values are unchanged."""

import numpy as np

import einsummable as es
from einsummable.engines import reference
from einsummable.ir.eager import eager
from einsummable.ir.graph import InputNode
from einsummable.plan.partition import Partition
from einsummable.plan.plan import build
from einsummable.plan.planners import make_plan
from einsummable.plan.predict.memory import loss_of
from einsummable.plan.space import spaces
from graphgen import deep_mlp_momentum


def momentum(layers: int = 6, width: int = 64):
    g, state, data = deep_mlp_momentum(layers, 16, width)
    return g, state | data


def test_weight_gradients_and_updates_run_as_their_operands_are_made_and_compute_the_same():
    g, feeds = momentum()
    e = eager(g, loss_of(g))
    assert len(e.nodes) == len(g.nodes) and set(e.outputs) == set(g.outputs)
    want, got = reference.run(g, feeds), reference.run(e, feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # as written, the weight gradients and their updates come after the whole backward chain,
    # layer 0 first; eagerly each comes within a few nodes of the incoming gradient it reads,
    # so the last layer's is first
    written = [g.outputs[f"m{k}"] for k in range(6)]
    eagerly = [e.outputs[f"m{k}"] for k in range(6)]
    assert written == sorted(written) and eagerly == sorted(eagerly, reverse=True)
    for k in range(6):
        m2 = e.outputs[f"m{k}"]
        latest = max(u for u in e.nodes[m2].inputs if not isinstance(e.nodes[u], InputNode))
        assert m2 - latest <= 2, k


def test_the_forward_keeps_its_order():
    g, _ = momentum()
    e = eager(g, loss_of(g))

    def forward(graph):
        live = graph.live(roots=[loss_of(graph)])
        return [node.describe() for node, f in zip(graph.nodes, live, strict=True)
                if f and not isinstance(node, InputNode)]

    assert forward(e) == forward(g)


def test_where_memory_binds_the_planner_plans_the_eager_graph_and_holds_less():
    g, _ = momentum(layers=16, width=128)
    one = es.Cluster(machines=1, cores=1)  # one worker runs in the program's order
    late = build(g, one, [Partition.whole(sp.shape) for sp in spaces(g)]).summary.peak
    plan = make_plan(g, one, compare=False)
    assert plan.graph is not g and len(plan.graph.nodes) == len(g.nodes)
    grads = 16 * 128 * 128 * 4
    assert plan.summary.peak <= late - 0.5 * grads
