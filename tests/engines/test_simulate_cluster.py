"""The cluster-level simulation against the core-level one on the full lowering (the oracle)."""

from dataclasses import replace

import numpy as np
import pytest

from einsummable.cli_plan import training_graph
from einsummable.engines.simulator import cluster as simulate_cluster
from einsummable.engines.simulator import simulate
from einsummable.engines.simulator.simulate import KERNEL_SECONDS
from einsummable.hardware.cluster import Cluster
from einsummable.lower.cluster import cluster_graph, machine_plan
from einsummable.lower.lowering import lower
from einsummable.lower.taskgraph import MoveTask
from einsummable.models.llama.model import PRESETS
from einsummable.plan.planners import make_plan

CFG = replace(PRESETS["demo"], hidden_size=512, intermediate_size=1024, num_hidden_layers=1,
              num_attention_heads=8, num_key_value_heads=8)


@pytest.fixture(scope="module")
def graph():
    return training_graph(CFG, 8, 128, "none").ir


def test_with_one_core_per_machine_it_is_the_core_level_simulation(graph):
    """cores = 1: the machine level is the whole plan, so both replays must agree exactly (the
    machine level models no native loop: both without it)."""
    cluster = Cluster(machines=2, cores=1, native_overhead=None)
    plan = make_plan(graph, cluster, compare=False)
    cg = cluster_graph(plan)
    tg = lower(plan)
    full = simulate.run(tg, cluster)
    got = simulate_cluster.run(cg)
    assert got.machine_tasks == len(tg.tasks) == len(cg)
    assert got.makespan == pytest.approx(full.makespan, rel=1e-9)
    assert got.sim.bytes_across == full.bytes_across > 0
    assert got.sim.peak_memory == full.peak_memory


def test_machines_of_cores_stay_close_to_the_core_level_simulation(graph):
    cluster = Cluster(machines=2, cores=4)
    plan = make_plan(graph, cluster, compare=False)
    cg = cluster_graph(plan)
    machine_tg = cg.graph.to_taskgraph()
    machine_tg.validate()
    assert cg.graph.workers == 2
    moves = [t for t in machine_tg.tasks if isinstance(t, MoveTask)]
    assert moves and all(t.src != t.loc for t in moves)  # every move crosses a NIC
    tg = lower(plan)
    assert len(cg) < len(tg.tasks)
    full = simulate.run(tg, cluster)
    got = simulate_cluster.run(cg)
    assert got.makespan == pytest.approx(full.makespan, rel=0.25)
    # the core-level blocks counted are the plan's blocks of its live nodes
    assert cg.core_blocks == sum(p.num_blocks for v, p in enumerate(plan.parts)
                                 if graph.live()[v] and type(graph.nodes[v]).__name__ != "Fill")
    out, into = got.nic_bytes()
    assert out.sum() == into.sum() == got.sim.bytes_across
    d = got.to_dict()
    assert d["tasks"]["machine_level"] == len(cg) and d["step_seconds"] == got.makespan


def test_timeline_spans_every_task_within_the_makespan(graph):
    plan = make_plan(graph, Cluster(machines=2, cores=2), compare=False)
    sim = simulate_cluster.run(cluster_graph(plan)).sim
    tl = sim.timeline
    assert tl.shape == (sim.tasks, 2)
    assert (tl[:, 0] >= 0).all() and (tl[:, 1] >= tl[:, 0]).all()
    assert tl[:, 1].max() == pytest.approx(sim.makespan)
    # a machine runs tasks side by side only while the cores they hold fit its cores
    cg = cluster_graph(plan)
    tasks = cg.graph.to_taskgraph().tasks
    _, widths = simulate_cluster._timing(cg)
    for m in range(2):
        mine = [t for t, task in enumerate(tasks) if task.loc == m and not isinstance(task, MoveTask)]
        for t in mine:  # the cores held just after each task starts
            now = tl[t, 0]
            held = sum(widths[u] for u in mine if tl[u, 0] <= now < tl[u, 1] - 1e-12 or u == t)
            assert held <= 2
    assert np.isfinite(tl).all()


def object_durations(tg, cluster, split, within):
    """The per-machine compute model over task objects, as simulate_cluster computed it
    before the tasks became arrays: the oracle for the array version. Also the cores each holds."""
    out, widths = [], []
    for t, task in enumerate(tg.tasks):
        n = split[t] or cluster.cores
        widths.append(min(n, cluster.cores))
        if isinstance(task, MoveTask):
            out.append(cluster.overhead_across + simulate._nbytes(task) / cluster.bandwidth_across)
            continue
        kernel = KERNEL_SECONDS[type(task)](task, cluster)
        overhead = cluster.view_overhead if simulate.runs_no_kernel(task) else cluster.task_overhead
        k = (kernel + within[t]) / n + overhead
        out.append(max(k, n * k / cluster.cores))
    return out, widths


@pytest.mark.parametrize("optimizer", ["none", "adamw"])
@pytest.mark.parametrize("machines, cores", [(2, 4), (3, 2), (4, 8)])
def test_the_array_replay_is_the_object_replay_event_for_event(optimizer, machines, cores):
    """simulate.run over lowering.py's objects (with the same per-machine durations,
    worked out task by task) is the oracle for the block-wise lowering into arrays and
    the vectorised durations: same makespan, links, peaks, critical path and times."""
    g = training_graph(CFG, 8, 128, optimizer).ir
    cluster = Cluster(machines=machines, cores=cores, overhead_across=1e-3)  # Ray's cost per block
    plan = make_plan(g, cluster, compare=False, check_memory=False)
    cg = cluster_graph(plan)
    got = simulate_cluster.run(cg)
    tg = lower(machine_plan(plan))
    dur, widths = object_durations(tg, cluster, cg.split, cg.within)
    np.testing.assert_allclose(simulate_cluster.durations(cg), dur, rtol=1e-12)
    want = simulate.run(tg, replace(cluster, cores=1), dur, widths, cores)
    assert got.makespan == want.makespan
    assert got.sim.links == want.links and got.sim.peak_memory == want.peak_memory
    assert got.sim.busy == pytest.approx(want.busy, rel=1e-12)
    assert got.sim.critical_path == want.critical_path and got.sim.critical_time == want.critical_time
    np.testing.assert_array_equal(got.sim.timeline, want.timeline)


def test_trace_events_put_tasks_on_cores_and_moves_on_the_sender_nic(graph):
    from einsummable.engines import trace

    cg = cluster_graph(make_plan(graph, Cluster(machines=2, cores=2), compare=False))
    sim = simulate_cluster.run(cg)
    events, lanes = simulate_cluster.events(cg, sim.sim.timeline)
    want, _ = trace.task_events(cg.graph.to_taskgraph(), sim.sim.timeline)
    assert [(e.name, e.process, e.start, e.end) for e in events] == [(e.name, e.process, e.start, e.end)
                                                                     for e in want]
    assert set(lanes.values()) == {"cores", "NIC out"}
