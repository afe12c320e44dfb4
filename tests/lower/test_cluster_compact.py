"""The compact (array) TaskGraph against lowering.py's object TaskGraph, the oracle:
the same tasks in the same order, the same outputs, on random graphs and on Llama."""

import math
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import einsummable as es
from einsummable.cli_plan import training_graph
from einsummable.errors import PlanError
from einsummable.hardware.cluster import Cluster
from einsummable.ir.dtypes import itemsize
from einsummable.lower.blockwise import lower_blocks
from einsummable.lower.cluster import cluster_graph, machine_plan
from einsummable.lower.compact import SHOWN, prune
from einsummable.lower.lowering import lower
from einsummable.lower.stats import to_dot
from einsummable.lower.taskgraph import ApplyTask, MoveTask
from einsummable.models.llama.model import PRESETS
from einsummable.plan.partition import Partition
from einsummable.plan.plan import build
from einsummable.plan.planners import make_plan
from einsummable.plan.space import spaces
from graphgen import random_graph, random_partitions

CFG = replace(PRESETS["demo"], hidden_size=512, intermediate_size=1024, num_hidden_layers=1,
              num_attention_heads=8, num_key_value_heads=8)


def same(plan):
    """lower_blocks(plan) as objects, and lowering.py's TaskGraph of the same plan."""
    cg = lower_blocks(plan)
    return cg, cg.to_taskgraph(), lower(plan)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5))
def test_random_graphs_lower_to_the_same_tasks(seed, machines):
    rng = random.Random(seed)
    g, _ = random_graph(rng, n_ops=rng.randint(1, 10))
    plan = build(g.ir, Cluster(machines=machines, cores=1), random_partitions(g.ir, rng))
    _, got, want = same(plan)
    assert got.tasks == want.tasks
    assert got.outputs == want.outputs


@pytest.mark.parametrize("optimizer", ["none", "adamw"])
@pytest.mark.parametrize("machines, cores", [(1, 4), (2, 1), (2, 4), (3, 2), (4, 2)])
def test_llama_machine_plans_lower_to_the_same_tasks(optimizer, machines, cores):
    g = training_graph(CFG, 8, 128, optimizer).ir
    cluster = Cluster(machines=machines, cores=cores)
    plan = machine_plan(make_plan(g, cluster, compare=False, check_memory=False))
    cg, got, want = same(plan)
    assert got.tasks == want.tasks and got.outputs == want.outputs
    np.testing.assert_array_equal(cg.nbytes(), [math.prod(t.shape) * itemsize(t.dtype) for t in want.tasks])
    # tens of bytes per task in arrays, where an object costs about 1.8 KB
    assert cg.memory_bytes() / len(cg) < 64


def test_half_precision_partial_sums_are_kept_wide_and_rounded_once():
    g = es.Graph()
    a, b = g.input("a", (8, 16), dtype="f16"), g.input("b", (16, 8), dtype="f16")
    g.output("c", a @ b)
    # the contraction cut in two across the machines: two partial sums to add
    parts = [Partition.uniform(s, (1, 1, 2) if len(s) == 3 else (1,) * len(s)) for s in _shapes(g.ir)]
    _, got, want = same(build(g.ir, Cluster(machines=2, cores=1), parts))
    assert got.tasks == want.tasks
    assert [t.dtype for t in got.tasks if isinstance(t, ApplyTask)].count("f32") >= 2  # wide partial sums


def test_blocks_nothing_reads_are_pruned():
    """A select of the first rows reads one input block of two: the other is dropped."""
    g = es.Graph()
    x = g.input("x", (8, 4))
    g.output("y", x[0:4] * 2.0)
    parts = [Partition.uniform(s, (2, 1)) if k == 0 else Partition.whole(s)
             for k, s in enumerate(_shapes(g.ir))]
    plan = build(g.ir, Cluster(machines=2, cores=1), parts)
    cg, got, want = same(plan)
    assert got.tasks == want.tasks
    inputs = [t for t in got.tasks if type(t).__name__ == "InputTask"]
    assert len(inputs) == 1 and inputs[0].box == ((0, 4), (0, 4))
    assert prune(cg) is cg  # already pruned: nothing more to drop


def _shapes(g):
    """The space shape of every node."""
    return [sp.shape for sp in spaces(g)]


def test_a_plan_with_cores_is_refused():
    g = es.Graph()
    g.output("y", g.input("x", (4, 4)) * 2.0)
    plan = build(g.ir, Cluster(machines=1, cores=2), [Partition.whole(s) for s in _shapes(g.ir)])
    with pytest.raises(PlanError, match="one core per machine"):
        lower_blocks(plan)


def test_text_is_cut_short_and_dot_still_renders():
    g = training_graph(CFG, 8, 128, "none").ir
    cg = cluster_graph(make_plan(g, Cluster(machines=2, cores=2), compare=False))
    text = str(cg.graph).splitlines()
    assert len(cg) > SHOWN
    assert text[1] == str(cg.graph.to_taskgraph()).splitlines()[1]  # the first task, as TaskGraph prints it
    assert f"{len(cg) - SHOWN:,} more tasks" in text[SHOWN + 1]
    counts = cg.graph.counts()
    assert sum(counts.values()) == len(cg) and counts["move"] > 0
    dot = to_dot(cg.graph.to_taskgraph())
    assert dot.count("->") >= len(cg.graph.indices)


def test_empty_blocks_lower_to_the_same_tasks():
    """A zero-size dimension: its boxes read nothing, lowering.py makes constants for them."""
    g = es.Graph()
    x = g.input("x", (0, 4))
    g.output("y", (x * 2.0).sum(0))
    parts = [Partition.uniform(s, [2 if n >= 2 else 1 for n in s]) for s in _shapes(g.ir)]
    _, got, want = same(build(g.ir, Cluster(machines=2, cores=1), parts))
    assert got.tasks == want.tasks and got.outputs == want.outputs


def test_a_select_holding_its_inputs_block_shares_the_moves_of_it():
    """y = x[0:4] holds x's first block as its own (both on machine 0): z = y + 1 on machine 1
    moves that block there, and w = x + 3, whose first block is on machine 1 too, needs the
    same move. lowering.py makes it once; so must the arrays, though y has one reader."""
    g = es.Graph()
    x = g.input("x", (8, 4))
    g.output("z", x[0:4] + 1.0)
    g.output("w", x + 3.0)
    shapes = _shapes(g.ir)
    parts = [Partition.uniform(s, (2, 1)) if s[0] == 8 else Partition.whole(s) for s in shapes]
    locs = {0: (0, 1), 1: (0,), 2: (1,), 3: (1, 0)}  # x, y = x[0:4], z, w
    assert [s[0] for s in shapes] == [8, 4, 4, 8]
    plan = replace(build(g.ir, Cluster(machines=2, cores=1), parts), where=locs.__getitem__)
    _, got, want = same(plan)
    assert got.tasks == want.tasks and got.outputs == want.outputs
    assert sum(isinstance(t, MoveTask) for t in got.tasks) == 2  # x's first block to 1, its second to 0


def test_a_task_keyed_by_a_task_of_the_same_node_is_found_by_later_nodes():
    """Each block of x.reshape(4, 2, 2) on machine 0 gathers a row band of x (a move, a
    partial) and views it: the view's identity names the partial, made in the same node,
    which has a temporary id until the node is done. The same reshape again must find
    those views (lowering.py makes them once)."""
    g = es.Graph()
    x = g.input("x", (4, 4))
    g.output("a", x.reshape((4, 2, 2)) * 2.0)
    g.output("b", x.reshape((4, 2, 2)) * 3.0)
    parts = [Partition.uniform(s, (1, 2)) if s == (4, 4) else Partition.uniform(s, (2, 1, 1))
             for s in _shapes(g.ir)]
    locs = {0: (0, 1), 1: (0, 0), 2: (0, 0), 3: (0, 0), 4: (0, 0)}  # x, its reshape, * 2, again, * 3
    plan = replace(build(g.ir, Cluster(machines=2, cores=1), parts), where=locs.__getitem__)
    _, got, want = same(plan)
    assert got.tasks == want.tasks and got.outputs == want.outputs
    assert sum(type(t).__name__ == "ViewTask" for t in got.tasks) == 2


def test_two_nodes_made_of_the_same_tasks_share_the_moves_of_them():
    """Two equal reshapes of x on machine 0 are the same view tasks; * 2 and * 3 on
    machine 1 both move that view there. lowering.py makes that move once; so must the
    arrays, though each reshape has one reader."""
    g = es.Graph()
    x = g.input("x", (4, 4))
    g.output("a", x.reshape((4, 2, 2)) * 2.0)
    g.output("b", x.reshape((4, 2, 2)) * 3.0)
    parts = [Partition.whole(s) for s in _shapes(g.ir)]
    locs = {0: (0,), 1: (0,), 2: (1,), 3: (0,), 4: (1,)}  # x, its reshape, * 2, again, * 3
    plan = replace(build(g.ir, Cluster(machines=2, cores=1), parts), where=locs.__getitem__)
    _, got, want = same(plan)
    assert got.tasks == want.tasks and got.outputs == want.outputs
    assert sum(isinstance(t, MoveTask) for t in got.tasks) == 1
