"""Two-level EinDecomp: machines first, then cores; memory as a constraint; expert baselines."""

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import einsummable as es
from einsummable.engines import sequential
from einsummable.errors import PlanError
from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import EinsumNode
from einsummable.lower.lowering import lower
from einsummable.lower.stats import stats
from einsummable.lower.taskgraph import InputTask
from einsummable.plan import twolevel
from einsummable.plan.cost import CostModel
from einsummable.plan.plan import build
from einsummable.plan.planners import PLANNERS, choose, make_plan, partitions
from einsummable.plan.predict import figures, memory
from einsummable.plan.space import spaces
from einsummable.workloads import SUITE, chain_skewed, mlp_train
from graphgen import check_lowered, random_graph


def _einsums(g):
    return [v for v, n in enumerate(g.nodes) if isinstance(n, EinsumNode) and g.live()[v]]


def test_huge_batch_mlp_on_4x8_is_data_parallel_across_machines_split_across_cores():
    batch = 65536
    g = mlp_train(batch=batch, d=256, hidden=256, out=256)
    plan = make_plan(g, Cluster(machines=4, cores=8), compare=False)
    tl = plan.levels
    for v in _einsums(g):
        sp = plan.spaces[v]
        if batch not in sp.shape or sp.flops < 1e8:
            continue
        b = sp.shape.index(batch)
        assert tl.cm[v][b] == 4 and math.prod(tl.cm[v]) == 4, (v, tl.cm[v])  # machines: the batch only
        assert math.prod(tl.cc[v]) == 8, (v, tl.cc[v])  # every op split across the 8 cores
    # the activations never cross machines: only weights and their gradients do
    tg = lower(plan)
    weights = 4 * (256 * 256) * 4
    assert weights <= stats(tg).bytes_across < batch * 256 * 4  # less than one activation


def test_two_level_keeps_partial_sums_inside_a_machine():
    """The flat planner over 16 workers splits contractions with no regard for machines;
    the two-level plan splits them only inside machines, and its TaskGraph moves fewer
    bytes across machines than the flat plan's."""
    g = chain_skewed()
    cluster = Cluster(machines=2, cores=8)
    plan = make_plan(g, cluster, compare=False)
    tl = plan.levels
    inside = 0
    for v in _einsums(g):
        for d in plan.spaces[v].aggregated:
            assert tl.cm[v][d] == 1, (v, tl.cm[v])
            inside += tl.cc[v][d] > 1
    assert inside  # partial sums there are, all of them inside a machine
    sps, live = spaces(g), g.live()
    flat_counts = choose("eindecomp", g, sps, CostModel(g, sps, 16, cluster, live), live)
    flat = build(g, cluster, partitions(sps, flat_counts))
    two, one = stats(lower(plan)), stats(lower(flat))
    assert two.bytes_across < one.bytes_across, (two.bytes_across, one.bytes_across)


def test_state_larger_than_a_machine_is_sharded():
    """Weights and gradients of 1 GiB do not fit one machine of 0.6 GiB: one machine
    refuses, four machines shard them, and the lowered TaskGraph puts a quarter of
    each weight's input blocks on each machine."""
    g = mlp_train(batch=256, d=4096, hidden=16384, out=4096)
    w1, w2 = (v for v, n in enumerate(g.nodes) if getattr(n, "name", None) in ("w1", "w2"))
    state = 2 * 2 * 4096 * 16384 * 4  # w1, w2, dw1, dw2 in f32: 1 GiB
    budget = 0.6 * state
    with pytest.raises(PlanError):
        make_plan(g, Cluster(machines=1, cores=2, memory_per_machine=budget), compare=False)
    cluster = Cluster(machines=4, cores=2, memory_per_machine=budget)
    plan = make_plan(g, cluster, compare=False)
    assert plan.summary.fits and plan.summary.peak <= budget
    tg = lower(plan)
    for w in (w1, w2):
        held = np.zeros(4)
        for t in tg.tasks:
            if isinstance(t, InputTask) and t.name == g.nodes[w].name:
                held[t.loc // cluster.cores] += math.prod(hi - lo for lo, hi in t.box)
        np.testing.assert_array_equal(held, math.prod(g.nodes[w].shape) / 4)


def test_impossible_budget_raises_with_the_requirement():
    g = mlp_train(batch=16384, d=1024, hidden=4096, out=1024)
    with pytest.raises(PlanError, match=r"smallest peak found is [\d.]+ GiB = inputs"):
        make_plan(g, Cluster(machines=2, cores=2, memory_per_machine=2**20), compare=False)
    with pytest.raises(PlanError, match=r"does not fit .* it needs [\d.]+ GiB"):
        make_plan(g, Cluster(machines=1, cores=2, memory_per_machine=2**20), compare=False)


def test_baselines_are_planned_only_when_the_report_asks():
    g = mlp_train(batch=4096, d=256, hidden=256, out=256)
    plan = make_plan(g, Cluster(machines=2, cores=2))
    assert "baselines" not in plan.__dict__
    text = str(plan)
    assert {name for name, _ in plan.baselines} == set(PLANNERS) - {"eindecomp"}
    for name in PLANNERS:
        assert name in text


def test_data_parallel_moves_a_ring_all_reduce_and_fsdp_shards_the_state():
    """Experts' data parallelism lays out across machines what a ring all-reduce moves: about
    2 (M-1)/M of the weights through each NIC (reduce-scatter plus all-gather), with one
    copy per machine; FSDP moves the same but holds a quarter of the state."""
    g = mlp_train(batch=8192, d=1024, hidden=4096, out=1024)
    cluster = Cluster(machines=4, cores=4)
    sps, live = spaces(g), g.live()
    outer = twolevel.outer_spaces(g, sps)
    model = CostModel(g, outer, 4, twolevel.machine_view(cluster), live, gather_once=True)
    cm = twolevel.expert_across("data_parallel", g, outer, live, cluster)
    nic_in, nic_out = figures.nic_bytes(g, model, cm, live, 4)
    weights = 2 * 1024 * 4096 * 4
    np.testing.assert_allclose(nic_in, 2 * 3 / 4 * weights, rtol=0.05)
    np.testing.assert_allclose(nic_out, 2 * 3 / 4 * weights, rtol=0.05)
    dp = make_plan(g, cluster, "data_parallel", compare=False).summary
    fsdp = make_plan(g, cluster, "fsdp", compare=False).summary
    assert fsdp.nic_bytes == dp.nic_bytes
    # a quarter of the state per machine; the gathered weights are held as the engines hold
    # them (made when their shards are there, kept for every reader), not freed per use
    assert fsdp.memory.inputs == pytest.approx(dp.memory.inputs / 4)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 3), st.integers(1, 4), st.sampled_from(PLANNERS))
def test_two_level_plans_of_random_graphs_match_reference(seed, machines, cores, planner):
    rng = random.Random(seed)
    g, feeds = random_graph(rng, n_ops=rng.randint(1, 8))
    check_lowered(make_plan(g.ir, Cluster(machines=machines, cores=cores), planner, compare=False), feeds)


def test_memory_estimate_of_a_chain_counts_what_is_alive():
    """x is held all step; exp(x) lives until its reader; so the peak is three copies of x
    while the last op runs, and a quarter of that per machine when split four ways."""
    g = es.Graph()
    x = g.input("x", (1024, 256))
    g.output("y", es.elementwise("2.0 * x0", es.elementwise("exp(x0)", x)))
    ir = g.ir
    sps, live = spaces(ir), ir.live()
    size = 1024 * 256 * 4
    whole = memory.estimate(ir, sps, [(1,) * len(sp.shape) for sp in sps], live)
    assert whole.peak == 3 * size and whole.inputs == size and whole.outputs == size
    split = memory.estimate(ir, sps, [(4,) + (1,) * (len(sp.shape) - 1) for sp in sps], live)
    assert split.peak == 3 * size / 4


def test_lowered_nic_bytes_match_the_model_a_machine_receives_a_piece_once():
    """Data parallel over 2 machines × 4 cores: every core reads the whole weight. The
    lowering moves it across once per machine and on to the other cores inside it, so
    the TaskGraph's bytes across machines are the hardware model's (before the relay
    the busiest NIC moved 2621440 bytes here, once per core, against 2228224)."""
    g = es.Graph()
    x, w = g.input("x", (4096, 256)), g.input("w", (256, 256))
    g.output("y", es.einsum("bd,dh->bh", x, w))
    cluster = Cluster(machines=2, cores=4)
    plan = make_plan(g.ir, cluster, "data_parallel", compare=False)
    tg = lower(plan)
    nic_in, nic_out = np.zeros(2), np.zeros(2)
    for (a, b), n in stats(tg, cluster).links.items():
        if cluster.machine_of(a) != cluster.machine_of(b):
            nic_out[cluster.machine_of(a)] += n
            nic_in[cluster.machine_of(b)] += n
    s = plan.summary
    assert max(nic_in.max(), nic_out.max()) == s.nic_bytes
    assert nic_in.sum() == s.bytes_across
    f = {"x": np.random.default_rng(0).standard_normal((4096, 256), np.float32),
         "w": np.random.default_rng(1).standard_normal((256, 256), np.float32)}
    np.testing.assert_allclose(sequential.run(tg, f)["y"], f["x"] @ f["w"], rtol=1e-4, atol=1e-3)


def test_partial_sums_meet_inside_a_machine_before_crossing():
    """Model parallel mlp fwd+bwd over 2 × 4: the cores of a machine sum their partials
    inside it, so one partial per machine crosses and the TaskGraph's bytes across
    machines are the plan's (each core's partial used to cross: 201326608 against 100663300)."""
    g = SUITE["mlp fwd+bwd"]()
    cluster = Cluster(machines=2, cores=4)
    plan = make_plan(g, cluster, "model_parallel", compare=False)
    st = stats(lower(plan), cluster)
    assert st.bytes_across == plan.summary.bytes_across
