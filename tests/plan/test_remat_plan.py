"""Rematerialisation in the planner: activations that do not fit are recomputed, and the
rematerialised plan computes what the graph computes."""

import numpy as np
import pytest

import einsummable as es
from einsummable import nn
from einsummable.engines import reference
from einsummable.engines.simulator import simulate
from einsummable.errors import PlanMemoryError
from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import EinsumNode
from einsummable.ir.remat import checkpoints, rematerialize
from einsummable.lower.lowering import lower
from einsummable.plan.planners import make_plan
from einsummable.plan.remat import loss_of
from graphgen import check_lowered

MiB = 2**20
N, D, LAYERS = 2048, 32, 8


def deep_mlp(matmul=nn.matmul):
    """Residual layers h + tanh(a) * exp(-a^2), a = gelu(h @ w): weights of 4 KiB, values of
    256 KiB, of which each layer saves four for its backward."""
    g = es.Graph()
    x = g.input("x", (N, D))
    ws = [g.input(f"w{k}", (D, D)) for k in range(LAYERS)]
    h, hs = x, []
    for w in ws:
        a = nn.gelu(matmul(h, w))
        h = es.elementwise("tanh(x0)", a) * es.elementwise("exp(-x0 * x0)", a) + h
        hs.append(h)
    loss = (h * h).mean()
    for k, dw in enumerate(es.grad(loss, ws)):
        g.output(f"d{k}", dw)
    g.output("loss", loss)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((N, D), dtype=np.float32)}
    feeds |= {f"w{k}": (rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for k in range(LAYERS)}
    return g.ir, hs, feeds


STATE = 2 * LAYERS * D * D * 4 + N * D * 4  # weights, gradients, x


def _einsum_flops(g):
    live = g.live()
    return sum(n.op.flops() for v, n in enumerate(g.nodes) if live[v] and isinstance(n, EinsumNode))


@pytest.mark.parametrize("machines, cores, share", [(1, 2, 0.65), (2, 2, 0.45)])
def test_activations_over_budget_are_recomputed_and_the_plan_fits(machines, cores, share):
    """(At half the peak, two machines fit without remat: the program's order with the
    activations sharded across them, 5.8 of 5.9 MB; 0.45 needs recomputation.)"""
    g, _, feeds = deep_mlp()
    free = make_plan(g, Cluster(machines=machines, cores=cores), compare=False)
    budget = share * free.summary.peak
    assert budget > STATE
    cluster = Cluster(machines=machines, cores=cores, memory_per_machine=budget)
    plan = make_plan(g, cluster)
    assert plan.remat is not None and plan.summary.fits and plan.summary.peak <= budget
    assert plan.remat.before.peak > budget
    # the simulator, which runs the lowered tasks as the engines do, agrees that it fits
    # and that recomputation is what saved the memory
    simulated = [max(simulate.run(lower(p), p.cluster).peak_memory) for p in (free, plan)]
    assert simulated[1] <= budget < simulated[0]
    # the plan is of the rematerialised graph: its predicted work includes the recomputed flops
    extra = _einsum_flops(plan.graph) - _einsum_flops(g)
    assert extra > 0 and plan.remat.flops == pytest.approx(extra)
    assert sum(plan.summary.flops) == pytest.approx(sum(free.summary.flops) + extra)
    assert "remat:" in str(plan) and f"{plan.remat.recomputed} forward nodes recomputed" in str(plan)
    # the same numbers as the graph as written: bit for bit on the reference, and decomposed
    want = reference.run(g, feeds)
    got = reference.run(plan.graph, feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    check_lowered(plan, feeds)


def test_state_that_does_not_fit_is_not_rematerialised():
    g, _, _ = deep_mlp()
    with pytest.raises(PlanMemoryError, match=r"does not fit .* it needs [\d.]+ GiB = inputs") as err:
        make_plan(g, Cluster(machines=1, cores=2, memory_per_machine=STATE / 2), compare=False)
    assert "rematerialised" not in str(err.value)


def test_nothing_fits_even_with_remat_gives_the_smallest_requirement():
    g, _, _ = deep_mlp()
    free = make_plan(g, Cluster(machines=2, cores=2), compare=False).summary
    budget = 0.15 * free.peak
    assert budget > STATE  # the state fits: remat is tried
    with pytest.raises(PlanMemoryError, match=r"even with the state sharded and activations rematerialised: "
                                              r"the smallest peak found is [\d.]+ GiB = inputs") as err:
        make_plan(g, Cluster(machines=2, cores=2, memory_per_machine=budget), compare=False)
    smallest = err.value.memory
    assert smallest.peak > budget
    assert smallest.inputs + smallest.outputs + smallest.activations + smallest.transient == \
        pytest.approx(smallest.peak)


def test_the_cuts_of_a_residual_network_are_its_layer_outputs():
    g, hs, _ = deep_mlp()
    loss = loss_of(g)
    cuts = checkpoints(g, loss)
    assert {h.id for h in hs[:-1]} <= set(cuts)
    for c in cuts:  # nothing computed before a cut is read after it, but inputs
        for v in range(c + 1, loss + 1):
            assert all(u >= c or g.nodes[u].inputs == () for u in g.nodes[v].inputs), (c, v)


def test_index_names_follow_rematerialised_nodes_and_their_copies():
    g = es.Graph()
    x, w = g.input("x", (16, 8)), g.input("w", (8, 8))
    h = es.einsum("bi,io->bo", x, w, join="x0 * x1")
    y = es.einsum("bo->bo", h, join="exp(x0)")
    loss = es.einsum("bo->", y, join="x0 * x0", agg="add")
    (dw,) = es.grad(loss, [w])
    g.output("dw", dw)
    g.output("loss", loss)
    out = rematerialize(g.ir, loss.id, keep=[])
    named = {out.nodes[v].op: letters for v, letters in out.index_names.items()}
    assert len(out.index_names) > len(g.ir.index_names)  # the copies are named too
    for v, letters in g.ir.index_names.items():
        assert named[g.ir.nodes[v].op] == letters


def test_the_report_keeps_the_users_letters_through_autodiff_and_remat():
    g, _, _ = deep_mlp(lambda h, w: es.einsum("bi,io->bo", h, w))
    cluster = Cluster(machines=1, cores=2)
    free = make_plan(g, cluster, compare=False)
    text = str(free)
    assert text.count("einsum[bi,io->bo x0 * x1 agg=add]") == LAYERS  # the forward, as written
    assert text.count("einsum[bi,bo->io ") == LAYERS  # each weight's gradient, in the same letters
    assert text.count("einsum[io,bo->bi ") == LAYERS - 1  # each layer's input gradient but x's
    planned = make_plan(g, Cluster(machines=1, cores=2, memory_per_machine=0.65 * free.summary.peak),
                        compare=False)
    assert planned.remat is not None
    matmul = g.nodes[LAYERS + 1].op
    recomputed = sum(1 for n in planned.graph.nodes if isinstance(n, EinsumNode) and n.op == matmul)
    assert recomputed > LAYERS  # the layers' matmuls, and their copies in the backward
    assert str(planned).count("einsum[bi,io->bo x0 * x1 agg=add]") == recomputed
