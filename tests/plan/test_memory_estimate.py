"""The planner's peak memory per machine against the simulator's, which replays the lowered
TaskGraph task by task as the engines run it (engines/simulator/simulate.py)."""

import pytest

import einsummable as es
from einsummable.engines.simulator import simulate
from einsummable.hardware.cluster import Cluster
from einsummable.lower.lowering import lower
from einsummable.plan.planners import make_plan
from einsummable.train.optim import adamw
from einsummable.workloads import attention, chain, mlp_train


def adam_mlp():
    g = es.Graph()
    x = g.input("x", (512, 256))
    w1, w2 = g.input("w1", (256, 512)), g.input("w2", (512, 256))
    h = es.elementwise("relu(x0)", x @ w1)
    loss = es.einsum("bo->", h @ w2, join="x0 * x0", agg="add")
    adamw(loss, [w1, w2], lr="lr")
    return g.ir


GRAPHS = {
    "mlp training": lambda: mlp_train(batch=4096, d=512, hidden=1024, out=512),
    "chain": lambda: chain(2048, 512, 2048, 256, 1024),
    "attention": lambda: attention(b=4, s=256, d=512, h=8, e=64),
    "adamw step": adam_mlp,
}


@pytest.mark.parametrize("name", GRAPHS)
@pytest.mark.parametrize("machines, cores", [(1, 1), (1, 4), (2, 2), (2, 4)])
def test_peak_estimate_is_within_ten_percent_of_the_simulated_peak(name, machines, cores):
    cluster = Cluster(machines=machines, cores=cores)
    plan = make_plan(GRAPHS[name](), cluster, compare=False)
    simulated = max(simulate.run(lower(plan), cluster).peak_memory)
    assert plan.summary.peak == pytest.approx(simulated, rel=0.10)


def test_the_simulator_counts_a_move_within_a_machine_as_a_view_of_its_source():
    """The cores of a machine share its memory: the local engine's move is a slice of the
    source block, so the block is held once (it was counted twice, which made the
    planner's estimate look low)."""
    from einsummable.lower.taskgraph import InputTask, MoveTask, Output, TaskGraph

    box = ((0, 250), (0, 1000))  # 1e6 bytes of f32
    tasks = (InputTask("a", box, "f32", 0), MoveTask((0,), box, 0, 1, "f32"))
    tg = TaskGraph(tasks, {"y": Output((250, 1000), "f32", ((1, box),))}, 2, 2)
    assert simulate.run(tg, Cluster(machines=1, cores=2)).peak_memory == (10**6,)
    assert simulate.run(tg, Cluster(machines=1, cores=2, memory_per_machine=10**6)).fits
