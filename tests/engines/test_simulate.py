"""The simulated engine: hand-computed makespans on tiny TaskGraphs, then a real one."""

import numpy as np
import pytest

import einsummable as es
from einsummable.engines.simulator.simulate import Simulation, native_tasks, run, runs_no_kernel
from einsummable.errors import SimulationError
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.graph import Piece
from einsummable.ir.kinds import kind
from einsummable.lower.stats import stats
from einsummable.lower.taskgraph import (
    ApplyTask,
    InputTask,
    MoveTask,
    Output,
    PartialTask,
    TaskGraph,
    ViewTask,
)
from einsummable.workloads import mlp_train

# 250 x 1000 f32 = 1e6 bytes
BOX = ((0, 250), (0, 1000))
QUIET = {"task_overhead": 0.0, "view_overhead": 0.0, "latency_within": 0.0, "latency_across": 0.0}


def graph(tasks, workers, cores, out) -> TaskGraph:
    tg = TaskGraph(tuple(tasks), {"y": Output(tasks[out].shape, "f32", ((out, BOX),))}, workers, cores)
    tg.validate()
    return tg


def test_a_single_move_costs_bytes_over_bandwidth_plus_latency():
    tasks = [InputTask("a", BOX, "f32", 0), MoveTask((0,), BOX, 0, 1, "f32")]
    across = es.Cluster(machines=2, cores=1, **QUIET | {"bandwidth_across": 1e9, "latency_across": 1e-3})
    sim = run(graph(tasks, 2, 1, 1), across)
    assert sim.makespan == pytest.approx(1e-3 + 1e-3)
    assert (sim.bytes_across, sim.bytes_within, sim.links) == (10**6, 0, {(0, 1): 10**6})
    assert sim.critical_path == (0, 1)
    assert sim.critical_time["moves across"] == pytest.approx(2e-3)
    within = es.Cluster(machines=1, cores=2, **QUIET | {"bandwidth_within": 1e10, "latency_within": 1e-6})
    sim = run(graph(tasks, 2, 2, 1), within)  # the whole block: a view of shared memory, no bytes
    assert sim.makespan == pytest.approx(1e-4 + 1e-6)  # ... but read from another core's cache
    assert (sim.bytes_across, sim.bytes_within, sim.links) == (0, 0, {})
    half = ((0, 125), (0, 1000))  # a piece (for an assembly)
    out = {"y": Output((125, 1000), "f32", ((1, half),))}
    sim = run(TaskGraph((tasks[0], MoveTask((0,), half, 0, 1, "f32")), out, 2, 2), within)
    assert sim.makespan == pytest.approx(5e5 / 1e10 + 1e-6)
    assert (sim.bytes_across, sim.bytes_within) == (0, 5 * 10**5)
    assert sim.busy == (0.0, 0.0)  # a move holds no core


def test_inputs_views_and_one_piece_partials_cost_the_view_overhead():
    """They run no kernel: the engine dispatches them in 1-4 us, not a kernel task's 5-25 us."""
    relu = Einsummable.from_spec("ij->ij", [(250, 1000)], join="max(x0, 0.0)")
    tasks = [InputTask("a", BOX, "f32", 0), ViewTask((0,), (250, 1000), "f32", 0),
             PartialTask((1,), (Piece(0, BOX, (0, 0)),), (250, 1000), "f32", None, 0),
             ApplyTask(relu, (2,), 0),
             PartialTask((3, 3), (Piece(0, BOX, (0, 0)), Piece(1, BOX, (0, 0))), (250, 1000), "f32", "add",
                         0)]
    cluster = es.Cluster(**QUIET | {"task_overhead": 1.0, "view_overhead": 1e-3,
                                    "elementwise_flops_per_core": 1e9, "copy_bandwidth": 1e9})
    # three dispatches; the relu's overhead, flops (0.25 ms) and write (1 ms); the sum of 2 pieces (2 ms)
    assert run(graph(tasks, 1, 1, 4), cluster).makespan == pytest.approx(3e-3 + 1.0 + 1.25e-3 + 1.0 + 2e-3)


def test_a_chain_adds_gemm_elementwise_move_and_overhead():
    gemm = Einsummable.from_spec("ij,jk->ik", [(100, 100), (100, 100)])  # 2e6 flops
    relu = Einsummable.from_spec("ij->ij", [(100, 100)], join="relu(x0)")  # 1e4 flops
    box = ((0, 100), (0, 100))  # 40,000 bytes
    tasks = [
        InputTask("a", box, "f32", 0),
        InputTask("b", box, "f32", 0),
        ApplyTask(gemm, (0, 1), 0),
        ApplyTask(relu, (2,), 0),
        MoveTask((3,), box, 0, 1, "f32"),
        ApplyTask(relu, (4,), 1),
    ]
    tg = TaskGraph(tuple(tasks), {"y": Output((100, 100), "f32", ((5, box),))}, 2, 1)
    tg.validate()
    cluster = es.Cluster(machines=2, cores=1, flops_per_core=1e9, elementwise_flops_per_core=1e7,
                         copy_bandwidth=4e7, bandwidth_across=4e7, latency_across=5e-4, task_overhead=1e-4,
                         view_overhead=1e-5)
    sim = run(tg, cluster)
    # inputs 2 x 0.01 ms on one core (no kernel: view_overhead); gemm 0.1 + 2 + 1 (writing its
    # output); relu 0.1 + 1 + 1; the move 1 + 0.5 latency; relu 2.1
    assert sim.makespan == pytest.approx(8.82e-3)
    assert sim.critical_path == (0, 1, 2, 3, 4, 5)
    assert sum(sim.critical_time.values()) == pytest.approx(sim.makespan)
    assert sim.critical_waits == 1  # input b waited for the core that input a held
    assert sim.busy == pytest.approx((5.22e-3, 2.1e-3))
    assert [kind(t.op) for t in tasks if isinstance(t, ApplyTask)] == ["gemm", "elementwise", "elementwise"]


def _fan(pairs):
    """One 1 MB input on each source machine, moved to its destination."""
    tasks = [InputTask(f"a{k}", BOX, "f32", s) for k, (s, _) in enumerate(pairs)]
    tasks += [MoveTask((k,), BOX, s, d, "f32") for k, (s, d) in enumerate(pairs)]
    return tasks


def test_a_fan_in_queues_on_the_receivers_nic():
    tasks = _fan([(1, 0), (2, 0), (3, 0)])
    add = Einsummable.from_spec("ij,ij,ij->ij", [(250, 1000)] * 3, join="x0 + x1 + x2")  # 5e5 flops
    tasks.append(ApplyTask(add, (3, 4, 5), 0))
    cluster = es.Cluster(machines=4, cores=1, bandwidth_across=1e9, latency_across=1e-4,
                         elementwise_flops_per_core=1e9, copy_bandwidth=1e9, task_overhead=0.0,
                         view_overhead=0.0)
    sim = run(graph(tasks, 4, 1, 6), cluster)
    # the three 1 ms transfers share machine 0's in-port: the last lands at 3 ms + latency;
    # then the sum: 0.5 ms of flops and 1 ms writing its output
    assert sim.makespan == pytest.approx(3e-3 + 1e-4 + 5e-4 + 1e-3)
    assert sim.critical_waits == 2
    assert sim.critical_time["moves across"] == pytest.approx(3.1e-3)
    assert sum(sim.critical_time.values()) == pytest.approx(sim.makespan)
    assert sim.machine_links == {(1, 0): 10**6, (2, 0): 10**6, (3, 0): 10**6}


def test_a_fan_out_queues_on_the_senders_nic_and_a_rotation_does_not():
    cluster = es.Cluster(machines=4, cores=1, bandwidth_across=1e9, **QUIET)
    out = [InputTask("a", BOX, "f32", 0)] + [MoveTask((0,), BOX, 0, d, "f32") for d in (1, 2, 3)]
    assert run(graph(out, 4, 1, 3), cluster).makespan == pytest.approx(3e-3)
    rotation = _fan([(1, 2), (2, 3), (3, 1)])
    assert run(graph(rotation, 4, 1, 3), cluster).makespan == pytest.approx(1e-3)


def test_moves_across_hold_the_nics_for_their_overhead_one_after_another():
    """Ray's cost per block moved (its put, call and pull of an object, ``overhead_across``):
    back-to-back blocks pay it in turn on the NICs; the latency overlaps."""
    hw = QUIET | {"bandwidth_across": 1e9, "latency_across": 1e-3}
    two = [InputTask("a", BOX, "f32", 0), InputTask("b", BOX, "f32", 0),
           MoveTask((0,), BOX, 0, 1, "f32"), MoveTask((1,), BOX, 0, 1, "f32")]
    ray = es.Cluster(machines=2, cores=1, **hw, overhead_across=2e-3)
    sim = run(graph(two, 2, 1, 3), ray)
    # 1 MB at 1 GB/s: each holds the ports 2 + 1 ms, the second from 3 ms; it lands 1 ms after 6 ms
    assert sim.makespan == pytest.approx(3e-3 + 3e-3 + 1e-3)
    assert sim.critical_time["moves across"] == pytest.approx(7e-3)
    assert sim.busy == (0.0, 0.0)  # held by the NICs, not the cores
    assert run(graph(two, 2, 1, 3), es.Cluster(machines=2, cores=1, **hw)).makespan == pytest.approx(3e-3)
    # a feed off the driver's node is such a move: machine 1 starts overhead_across later
    feed = [InputTask("a", BOX, "f32", 0), InputTask("b", BOX, "f32", 1), MoveTask((1,), BOX, 1, 0, "f32")]
    ray = es.Cluster(machines=2, cores=1, **hw, driver_bandwidth=1e9, driver_latency=2e-3,
                     overhead_across=2e-3)
    # a and b put (1 ms each), the call (2 ms), b pulled across (1 ms latency, 2 ms overhead, its
    # bytes at the put's rate: nothing more); b crosses back (3 ms) and lands (1 ms); y fetched (1 ms)
    landed = 1e-3 + 1e-3 + 2e-3 + 3e-3 + 3e-3 + 1e-3
    assert run(graph(feed, 2, 1, 2), ray).makespan == pytest.approx(landed + 1e-3)


def test_a_move_waiting_for_a_busy_receiver_does_not_hold_its_senders_port():
    cluster = es.Cluster(machines=4, cores=1, bandwidth_across=1e9, **QUIET)
    tasks = _fan([(3, 0), (1, 0), (1, 2)])
    sim = run(graph(tasks, 4, 1, 5), cluster)
    # 3->0 takes [0, 1) ms; 1->0 waits for 0's in-port, [1, 2); 1->2 slips in at [0, 1) on 1's out-port
    assert sim.makespan == pytest.approx(2e-3)
    assert sim.critical_path == (0, 3, 4)
    assert sim.critical_waits == 1


def test_peak_memory_counts_blocks_until_their_last_reader():
    tasks = [InputTask("a", BOX, "f32", 0), MoveTask((0,), BOX, 0, 1, "f32")]
    sim = run(graph(tasks, 2, 1, 1), es.Cluster(machines=2, cores=1, memory_per_machine=10**6))
    assert sim.peak_memory == (10**6, 10**6)
    assert sim.fits
    assert not run(graph(tasks, 2, 1, 1), es.Cluster(machines=2, cores=1, memory_per_machine=10**5)).fits


def test_the_cluster_must_match_the_taskgraph():
    tasks = [InputTask("a", BOX, "f32", 0), MoveTask((0,), BOX, 0, 1, "f32")]
    with pytest.raises(SimulationError, match="2 workers"):
        run(graph(tasks, 2, 1, 1), es.Cluster(machines=1, cores=4))


def test_a_real_mlp_step_through_compile():
    g = mlp_train(batch=256, d=64, hidden=128, out=32)
    cluster = es.Cluster(machines=2, cores=2)
    prog = es.compile(g, cluster=cluster, engine="simulate")
    rng = np.random.default_rng(0)
    feeds = {n.name: rng.standard_normal(n.shape, dtype=np.float32) for n in g.nodes if hasattr(n, "name")}
    sim = prog.simulate(feeds=feeds)
    assert isinstance(sim, Simulation) and sim.tasks == len(prog.taskgraph)
    st = stats(prog.taskgraph, cluster)
    assert (sim.bytes_within, sim.bytes_across) == (st.bytes_within, st.bytes_across)
    assert sim.links == st.links
    assert sum(sim.critical_time.values()) == pytest.approx(sim.makespan)
    assert sim.makespan >= max(sim.busy)
    assert sim.makespan >= st.critical_path  # the stats path ignores overhead and queueing
    assert all(0 <= u <= 1 + 1e-9 for u in sim.utilisation)
    assert "makespan" in str(sim) and "critical path" in str(sim)
    assert es.simulate(prog.taskgraph, cluster).makespan == sim.makespan
    local = es.compile(g, cluster=cluster)
    assert local.simulate().makespan == pytest.approx(sim.makespan)
    with pytest.raises(es.FeedError):
        prog.run({})
    with pytest.raises(es.EinsummableError, match="keeps no state"):
        prog.session({})


def test_the_cluster_round_trips_through_json(tmp_path):
    cluster = es.Cluster(machines=2, cores=3, elementwise_flops_per_core=2e9, latency_across=1e-5)
    cluster.to_json(tmp_path / "c.json")
    assert es.Cluster.from_json(tmp_path / "c.json") == cluster
    (tmp_path / "bad.json").write_text('{"machines": 2, "nics": 3}')
    with pytest.raises(es.ConfigError, match="nics"):
        es.Cluster.from_json(tmp_path / "bad.json")


def test_calibrate_writes_a_cluster_that_loads(tmp_path, monkeypatch):
    from einsummable import cli
    from einsummable.hardware import calibrate

    for name, value in (("GEMM_N", 64), ("ELEMENTS", 1 << 12), ("COPY_ELEMENTS", 1 << 12), ("REPEATS", 1)):
        monkeypatch.setattr(calibrate, name, value)
    assert cli.main(["calibrate", "--cores", "2", "--out", str(tmp_path / "c.json")]) == 0
    cluster = es.Cluster.from_json(tmp_path / "c.json")
    assert (cluster.machines, cluster.cores) == (1, 2)
    assert cluster.flops_per_core > 0 and cluster.elementwise_flops_per_core > 0
    assert cluster.bandwidth_within == cluster.copy_bandwidth


def test_program_types_hold_on_every_engine():
    """run returns arrays (the simulate engine refuses: it computes nothing), simulate returns a
    Simulation after checking the feeds, and plan is a Plan, or None for the reference engine."""
    from einsummable.plan.plan import Plan

    g = es.Graph()
    x = g.input("x", (8, 4))
    g.output("y", x * 2.0)
    feeds = {"x": np.ones((8, 4), np.float32)}
    sim = es.compile(g, workers=2, engine="simulate")
    assert isinstance(sim.plan, Plan) and isinstance(sim.simulate(feeds=feeds), Simulation)
    with pytest.raises(es.EinsummableError, match="computes nothing: prog.simulate"):
        sim.run(feeds)
    with pytest.raises(es.FeedError):
        sim.simulate(feeds={"x": np.ones((3, 4), np.float32)})
    ref = es.compile(g, engine="reference")
    assert ref.plan is None and ref.taskgraph is None
    np.testing.assert_array_equal(ref.run(feeds)["y"], 2 * feeds["x"])
    with pytest.raises(es.EinsummableError, match="runs the graph whole"):
        ref.simulate()


def test_a_driver_in_another_process_feeds_machines_in_turn_and_fetches_at_their_end():
    """The Ray engine's driver: puts each machine's feeds in machine order, calls it, and a
    machine off the driver's node pulls its feeds and returns its fetches across."""
    tasks = [InputTask("a", BOX, "f32", 0), InputTask("b", BOX, "f32", 1), MoveTask((1,), BOX, 1, 0, "f32")]
    hw = QUIET | {"bandwidth_across": 5e8, "latency_across": 1e-3}
    ray = es.Cluster(machines=2, cores=1, **hw, driver_bandwidth=1e9, driver_latency=2e-3)
    sim = run(graph(tasks, 2, 1, 2), ray)
    # 1 MB put at 1 GB/s; across at 0.5 GB/s in all (put then pull), 1 ms latency
    put_a, put_b, call, pull_b = 1e-3, 1e-3, 2e-3, 1e-3 + (2e-3 - 1e-3)
    landed = put_a + put_b + call + pull_b + 2e-3 + 1e-3  # then b crosses to machine 0
    assert sim.makespan == pytest.approx(landed + 1e-3)  # y (1 MB) fetched from machine 0, the driver's
    assert sim.critical_time["driver"] == pytest.approx(put_a + put_b + call + pull_b + 1e-3)
    assert sum(sim.critical_time.values()) == pytest.approx(sim.makespan)
    local = run(graph(tasks, 2, 1, 2), es.Cluster(machines=2, cores=1, **hw))  # the driver's memory: free
    assert local.makespan == pytest.approx(2e-3 + 1e-3)
    assert "driver" not in local.critical_time


@pytest.mark.parametrize("node_cost", [1.0, 0.25, 0.0])
def test_a_joins_nodes_past_its_first_cost_the_clusters_node_cost_of_a_pass(node_cost):
    """numpy runs a ufunc pass per node (1.0: the join's flops); a compiled join runs its nodes
    in one loop, so each further node costs a measured fraction of a pass."""
    softmax_sum = Einsummable.from_spec("ij,i->i", [(250, 1000), (250,)], join="exp(x0 - x1)", agg="add")
    tasks = [InputTask("a", BOX, "f32", 0), InputTask("m", ((0, 250),), "f32", 0),
             ApplyTask(softmax_sum, (0, 1), 0)]
    cluster = es.Cluster(**QUIET | {"elementwise_flops_per_core": 1e9, "copy_bandwidth": 1e9,
                                    "elementwise_node_cost": node_cost})
    # 250,000 elements: sub, exp and the sum, the first a pass (0.25 ms), each other node_cost of one;
    # the 1,000-byte write (1 us)
    expected = 2.5e-4 * (1 + 2 * node_cost) + 1e-6
    tg = TaskGraph(tuple(tasks), {"y": Output((250,), "f32", ((2, ((0, 250),)),))}, 1, 1)
    assert run(tg, cluster).makespan == pytest.approx(expected)
    assert softmax_sum.passes(1.0) == softmax_sum.flops()


def _tiny_chains(machines: int, cores: int, chain: int) -> TaskGraph:
    """A chain of tiny joins on every worker: dispatch, no work."""
    box = ((0, 4),)
    tiny = Einsummable.from_spec("i->i", [(4,)], "x0 * 0.5 + 1")
    tasks, outputs = [], {}
    for w in range(machines * cores):
        tasks.append(InputTask(f"x{w}", box, "f32", w))
        for _ in range(chain):
            tasks.append(ApplyTask(tiny, (len(tasks) - 1,), w))
        outputs[f"y{w}"] = Output((4,), "f32", ((len(tasks) - 1, box),))
    return TaskGraph(tuple(tasks), outputs, machines * cores, cores)


@pytest.mark.parametrize("machines", [1, 2])
def test_a_machines_cores_take_its_interpreter_in_turn(machines):
    """64 cores of tiny tasks, 20 us a task on its core of which 10 hold the interpreter: the cores
    of a machine start their tasks 10 us apart, so a machine runs them at one per 10 us, not 64 per
    20 us; each machine has its own interpreter, so two machines take no longer than one."""
    tg = _tiny_chains(machines, 64, 100)
    quiet = QUIET | {"elementwise_flops_per_core": 1e30, "copy_bandwidth": 1e30, "native_overhead": None}
    free = es.Cluster(machines=machines, cores=64, **quiet | {"task_overhead": 2e-5, "gil_seconds": 0.0})
    held = es.Cluster(machines=machines, cores=64, **quiet | {"task_overhead": 2e-5, "gil_seconds": 1e-5})
    assert run(tg, free).makespan == pytest.approx(100 * 2e-5, rel=0.01)
    sim = run(tg, held)
    assert sim.makespan == pytest.approx(64 * 100 * 1e-5, rel=0.01)
    assert sim.critical_waits > 0  # its path waited for the interpreter, not for data
    few = es.Cluster(machines=machines, cores=2, **quiet | {"task_overhead": 2e-5, "gil_seconds": 1e-5})
    assert run(_tiny_chains(machines, 2, 100), few).makespan == pytest.approx(100 * 2e-5, rel=0.01)


def test_a_native_run_pays_one_dispatch_and_holds_the_interpreter_once():
    """The same chains with the native loop (lower/runs.py): each worker's 100 joins are one run,
    so a core pays one dispatch (20 us, 10 of it holding the interpreter) and 99 x 1 us; the 64
    cores take the interpreter once each, not 100 times: 64 x 10 us + 20 + 99 us at the most."""
    tg = _tiny_chains(1, 64, 100)
    assert all(native_tasks(tg)[2:101]) and not any(native_tasks(tg)[:2])  # the input, the run's first
    quiet = QUIET | {"elementwise_flops_per_core": 1e30, "copy_bandwidth": 1e30, "native_overhead": 1e-6}
    native = es.Cluster(cores=64, **quiet | {"task_overhead": 2e-5, "gil_seconds": 1e-5})
    sim = run(tg, native)
    assert 20e-6 + 99e-6 < sim.makespan <= 64 * 1e-5 + 20e-6 + 99e-6 + 1e-9


def test_the_planner_prices_a_machines_dispatch_as_the_simulator_does():
    """Tasks of 1 ms, all of it holding the interpreter: the plan's compute time and the simulated
    step are at least the machine's tasks x 1 ms, however many cores it has."""
    g = mlp_train(batch=256, d=64, hidden=256, out=64)
    held = es.Cluster(machines=1, cores=64, task_overhead=1e-3, gil_seconds=1e-3, native_overhead=None)
    prog = es.compile(g, cluster=held, engine="simulate")
    tasks = sum(1 for t in prog.taskgraph.tasks if not runs_no_kernel(t) and not isinstance(t, MoveTask))
    assert prog.plan.summary.compute_seconds >= 1e-3 * tasks * 0.5  # the blocks the planner counts
    assert prog.simulate().makespan >= 1e-3 * tasks * 0.99
