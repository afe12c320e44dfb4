"""Each machine lowers its share of the machine-level graph to its cores (lower/refine.py), and
the machines, run in one process (engines/machine.py: the Ray actors' loop without Ray), give
the reference engine's results."""

import random
from dataclasses import replace
from itertools import product

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

import einsummable as es
from einsummable.engines import local, reference
from einsummable.engines.feeds import check_feeds
from einsummable.engines.machine import run_machines
from einsummable.hardware.cluster import Cluster
from einsummable.ir.box import intersect
from einsummable.ir.fuse import fuse
from einsummable.ir.kinds import is_gemm
from einsummable.lower.blockwise import lower_blocks
from einsummable.lower.cluster import levels, machine_plan
from einsummable.lower.fusion import fuse as fuse_tasks
from einsummable.lower.lowering import lower
from einsummable.lower.refine import _Grid, machine_shares, refine, split
from einsummable.lower.taskgraph import ApplyTask, FusedTask, InputTask, MoveTask, PartialTask
from einsummable.plan.partition import split as cuts
from einsummable.plan.plan import build
from einsummable.plan.planners import make_plan
from einsummable.plan.space import spaces
from einsummable.plan.twolevel import TwoLevel
from graphgen import random_graph, random_partitions


def two_level(rng: random.Random, g, machines: int, cores: int, within: bool = True):
    """A plan with random counts across machines (``cm``) and within them (``cc``)."""
    sps = spaces(g)
    plan = build(g, Cluster(machines=machines, cores=cores), random_partitions(g, rng))
    cm = tuple(tuple(rng.randint(1, min(3, n)) if ok and n > 1 else 1
                     for n, ok in zip(sp.shape, sp.splittable, strict=True)) for sp in sps)
    cc = tuple(tuple(rng.randint(1, max(1, min(3, n // a))) if within and ok and n > 1 else 1
                     for n, a, ok in zip(sp.shape, c, sp.splittable, strict=True)) for sp, c in zip(sps, cm,
                                                                                                   strict=True))
    return replace(plan, levels=TwoLevel(cm, cc))


def shares_of(plan):
    cg = lower_blocks(machine_plan(plan))
    shares = split(cg, levels(plan).cc, plan.cluster.cores)
    assert [s.ids.tolist() for s in machine_shares(plan)[1]] == [s.ids.tolist() for s in shares]
    for share in shares:  # the share's rows are the graph's tasks
        assert share.tasks == tuple(cg.task(t) for t in share.ids.tolist())
    return cg, shares


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([(2, 2), (3, 2), (2, 3)]))
def test_refined_shares_run_per_machine_give_the_reference_results(seed, shape):
    rng = random.Random(seed)
    g, feeds = random_graph(rng, n_ops=rng.randint(1, 10))
    plan = two_level(rng, g.ir, *shape)
    cg, shares = shares_of(plan)
    for share in shares:
        refine(share).graph.validate()  # every input where its task runs; moves inside the machine
    got = run_machines(shares, cg.outputs, feeds)
    want = reference.run(g.ir, feeds)
    assert got.keys() == want.keys()
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        np.testing.assert_allclose(got[name], array, rtol=1e-4, atol=1e-5, err_msg=name)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
@example(3736)  # partial sums of a piece away from their block's origin were summed from the origin
def test_machine_level_graphs_of_random_two_level_plans_are_lowering_pys(seed):
    rng = random.Random(seed)
    g, _ = random_graph(rng, n_ops=rng.randint(1, 10))
    mp = machine_plan(two_level(rng, g.ir, 2, 2))
    got, want = lower_blocks(mp).to_taskgraph(), lower(mp)
    assert got.tasks == want.tasks and got.outputs == want.outputs


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_with_one_core_per_machine_refinement_is_the_identity(seed):
    rng = random.Random(seed)
    g, _ = random_graph(rng, n_ops=rng.randint(1, 10))
    _, shares = shares_of(two_level(rng, g.ir, 2, 1, within=False))
    for share in shares:
        refined = refine(share)
        assert len(refined.graph) == len(share)  # a task each: no views, no assembly
        for task, mine in zip(refined.graph.tasks, share.tasks, strict=True):
            crossing = isinstance(mine, MoveTask) and mine.src != mine.loc
            assert isinstance(task, MoveTask | InputTask) if crossing else type(task) is type(mine)
            if isinstance(mine, ApplyTask):
                assert task.op == mine.op
            if isinstance(mine, PartialTask):
                assert (task.pieces, task.agg, task.pad) == (mine.pieces, mine.agg, mine.pad)


def test_a_share_holds_the_machines_tasks_and_the_moves_across_only():
    rng = random.Random(3)
    g, _ = random_graph(rng, n_ops=10)
    cg, shares = shares_of(two_level(rng, g.ir, 3, 2))
    for share in shares:
        m = share.machine
        assert all(t.loc == m or (isinstance(t, MoveTask) and t.src == m) for t in share.tasks)
    # every task on exactly one machine; every move across machines in two shares (send and receive)
    moves = sum(isinstance(t, MoveTask) for s in shares for t in s.tasks) // 2
    assert sum(len(s) for s in shares) - moves == len(cg)


def test_llama_training_step_per_machine_is_as_close_to_the_reference_as_the_local_engine():
    """2 machines x 2 cores: the machines' results against the reference engine, no farther
    than the local engine running the core-level graph (partial sums meet in another order).
    Each machine's refinement carries the fused tasks the local engine runs (Ray's actors run
    these shares): GEMM epilogues (few: a refined reader mostly reads another core's block
    through a move, which keeps it apart)."""
    from einsummable.models.llama import model as llama

    cfg = llama.PRESETS["demo"]
    g, p, loss = llama.loss_graph(cfg, 16, 64)
    step = es.train.adamw(loss, list(p.values()), lr="lr", weight_decay=0.1)
    params = llama.init_params(cfg, seed=0)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (16, 65)).astype(np.int64)
    ir = g.ir
    arrays, variables = check_feeds(ir, params | step.init_state(params) | {"tokens": tokens, "lr": 3e-3},
                                    variables=ir.variables())
    plan = make_plan(fuse(ir), es.Cluster(machines=2, cores=2))
    assert any(max(c) > 1 for c in levels(plan).cc)  # the machines cut their blocks over their cores
    cg, shares = shares_of(plan)
    fused = [t for share in shares for t in refine(share).graph.tasks if isinstance(t, FusedTask)]
    assert fused and all(is_gemm(t.first) for t in fused)
    want = reference.run(ir, arrays, variables)
    got = run_machines(shares, cg.outputs, arrays, variables)
    here = local.run(fuse_tasks(lower(plan)).graph, arrays, variables)
    for name, array in want.items():
        ours = np.max(np.abs(got[name].astype(np.float64) - array))
        theirs = np.max(np.abs(here[name].astype(np.float64) - array))
        assert ours <= 2 * theirs + 1e-6, (name, ours, theirs)
        np.testing.assert_allclose(got[name], array, rtol=1e-3, atol=1e-3, err_msg=name)


def test_a_machine_sends_before_its_other_ready_work():
    """A share's ranks stop at the machine, so a send (its readers are elsewhere) would rank
    below the machine's own products and wait for them: on 2 x 1 machines, machine 0 made its
    GEMM, then sent machine 1 the operand it waited for (a run 225 ms against 150)."""
    from einsummable.engines.machine import MachinePart

    g = es.Graph()
    a, b = g.input("a", (2048, 2048)), g.input("b", (2048, 2048))
    g.output("y", a @ b)
    plan = es.compile(g, cluster=Cluster(machines=2, cores=1), engine="simulate").plan
    checked = 0
    for share in machine_shares(plan)[1]:
        refined = refine(share)
        part = MachinePart(refined)
        sends = [part.rank[i] for i in refined.send]
        own = [part.rank[i] for i, task in enumerate(refined.graph.tasks)
               if i not in refined.send and i not in refined.receive and isinstance(task, ApplyTask)]
        if sends and own:
            assert min(sends) > max(own)
            checked += 1
    assert checked  # some machine both sends and computes


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_grid_finds_the_cells_a_box_meets_as_testing_every_cell_does(data):
    """``_Grid.meeting`` bisects; the oracle intersects the box with every cell, in C order."""
    shape = data.draw(st.lists(st.integers(1, 9), min_size=0, max_size=3))
    edges = tuple(cuts(n, data.draw(st.integers(1, n))) for n in shape)
    cells = [tuple((e[c], e[c + 1]) for c, e in zip(cell, edges, strict=True))
             for cell in product(*(range(len(e) - 1) for e in edges))]
    grid = _Grid(edges, tuple(range(100, 100 + len(cells))))
    box = tuple(sorted(data.draw(st.lists(st.integers(0, n), min_size=2, max_size=2, unique=True)))
                for n in shape)
    want = [(cell, 100 + k) for k, cell in enumerate(cells) if intersect(cell, box) is not None]
    assert grid.meeting(box) == want


def test_the_work_a_send_waits_for_goes_before_the_machines_other_work():
    """Not only the send: what it reads, too. On 2 x 1 machines attention's weights are cut
    along d and each machine sends the other its halves; machine 0 read the half of ``wo`` it
    sends only after all its own work (its input task ranked by the local GEMM it feeds), and
    machine 1's last GEMM waited 94 ms for it (the simulator ranks the whole graph: no wait)."""
    from einsummable import workloads
    from einsummable.engines.machine import MachinePart

    plan = es.compile(workloads.attention(b=2, s=512, d=512, h=8, e=64), cluster=Cluster(machines=2, cores=1),
                      engine="simulate").plan
    checked = 0
    for share in machine_shares(plan)[1]:
        refined = refine(share)
        tasks, part = refined.graph.tasks, MachinePart(refined)
        waited_for, todo = set(), list(refined.send)
        while todo:
            for j in tasks[todo.pop()].inputs:
                if j not in waited_for:
                    waited_for.add(j)
                    todo.append(j)
        other = [i for i in range(len(tasks))
                 if i not in waited_for and i not in refined.send and i not in refined.receive]
        if waited_for and other:
            assert min(part.rank[i] for i in waited_for) > max(part.rank[i] for i in other)
            checked += 1
    assert checked  # some machine sends what it reads from its feeds


def test_a_tensor_with_an_empty_dimension_runs_per_machine_as_the_reference_does():
    """A box of no elements is assembled from no pieces (it crashed with an IndexError)."""
    g = es.Graph()
    x, w = g.input("x", (0, 8)), g.input("w", (8, 6))
    g.output("z", es.einsum("ik->ik", es.einsum("ij,jk->ik", x, w), join="exp(x0)"))
    g.output("s", es.einsum("ij->j", x))
    feeds = {"x": np.zeros((0, 8), np.float32), "w": np.ones((8, 6), np.float32)}
    plan = es.compile(g, cluster=Cluster(machines=2, cores=2), engine="simulate").plan
    cg, shares = machine_shares(plan)
    got = run_machines(shares, cg.outputs, feeds)
    want = reference.run(g.ir, feeds)
    for name in ("z", "s"):
        assert got[name].shape == want[name].shape and np.array_equal(got[name], want[name]), name
