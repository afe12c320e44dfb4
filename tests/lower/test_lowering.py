"""Unit tests of the TaskGraph: moves only where needed, local pre-aggregation, pruning,
the checker, the text form, statistics and DOT."""

import numpy as np
import pytest

import einsummable as es
from einsummable.engines import sequential
from einsummable.engines.sequential import EXEC
from einsummable.errors import PlanError
from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import NODE_KINDS
from einsummable.lower.lowering import LOWER, lower
from einsummable.lower.stats import stats, to_dot
from einsummable.lower.taskgraph import TASK_KINDS, MoveTask, PartialTask, TaskGraph
from einsummable.plan.partition import Partition
from einsummable.plan.plan import build
from einsummable.plan.space import SPACES


def test_every_node_and_task_kind_has_a_rule():
    assert set(SPACES) == set(NODE_KINDS)
    assert set(LOWER) == set(NODE_KINDS)
    assert set(EXEC) == set(TASK_KINDS)


def _matmul(n=8, k=8, m=8):
    g = es.Graph()
    a, b = g.input("a", (n, k)), g.input("b", (k, m))
    g.output("c", a @ b)
    return g.ir


def _feeds(g):
    rng = np.random.default_rng(0)
    return {n.name: rng.standard_normal(n.shape).astype(np.float32) for n in g.nodes if hasattr(n, "name")}


def _parts(a, b, join, n=8):
    """Partitions of the four nodes of ``_matmul``, by block counts."""
    return [Partition.uniform((n, n), a), Partition.uniform((n, n), b), Partition.uniform((n, n, n), join),
            Partition.whole((n, n))]


def test_matching_partitions_move_nothing():
    g = _matmul()
    parts = _parts((4, 1), (1, 1), (4, 1, 1))
    for cluster, copied in ((Cluster.local(4), 0), (Cluster(machines=4, cores=1), 3 * 8 * 8 * 4)):
        tg = lower(build(g, cluster, parts))
        tg.validate()
        moved_b = [t for t in tg.tasks if isinstance(t, MoveTask)]
        # each a block is already where its row block runs; only b goes to the 3 other workers:
        # a view of shared memory on one machine, a copy across machines
        assert len(moved_b) == 3 and stats(tg).bytes_moved == copied


def test_a_block_assembled_for_readers_is_made_once_per_machine():
    """b is split in 2 columns on workers 0 and 1; the matmul is split in 4 row blocks, each
    of which reads all of b. Worker 0 assembles b; workers 1, 2 and 3 take worker 0's block
    as a view. Before, each of the four built its own copy."""
    from einsummable.engines.simulator import simulate

    g = _matmul()
    parts = _parts((1, 1), (1, 2), (4, 1, 1))
    cluster = Cluster.local(4)
    tg = lower(build(g, cluster, parts))
    tg.validate()
    whole_b = [t for t, task in enumerate(tg.tasks) if isinstance(task, PartialTask) and task.shape == (8, 8)]
    assert len(whole_b) == 1
    shared = [task for task in tg.tasks if isinstance(task, MoveTask) and task.inputs[0] in whole_b]
    assert sorted(task.loc for task in shared) == [1, 2, 3]
    # bytes within: the row blocks of a that workers 1-3 slice off worker 0's whole a; the
    # whole blocks handed on (b, and b's half that worker 0 reads) are views, no bytes
    assert stats(tg).bytes_within == 3 * 2 * 8 * 4
    want = _feeds(g)
    np.testing.assert_allclose(sequential.run(tg, want)["c"], want["a"] @ want["b"], rtol=1e-5)
    inputs, outputs, b_copy, a_rows = (8 * 8 + 8 * 8) * 4, 8 * 8 * 4, 8 * 8 * 4, 2 * 8 * 4
    assert max(simulate.run(tg, cluster).peak_memory) == inputs + outputs + b_copy + a_rows  # 4 copies before


def test_partial_sums_are_combined_where_they_live_before_moving():
    g = _matmul()
    # 4 blocks over the contracted index, on 2 machines: 2 partial sums per machine
    parts = _parts((1, 4), (4, 1), (1, 1, 4))
    plan = build(g, Cluster(machines=2, cores=1), parts)
    tg = lower(plan)
    tg.validate()
    out_bytes = 8 * 8 * 4
    assert stats(tg).bytes_moved == out_bytes  # one pre-aggregated block crosses, not two
    aggs = [t for t in tg.tasks if isinstance(t, PartialTask) and t.agg == "add"]
    assert len(aggs) == 3  # one local combine per worker, one final combine
    got = sequential.run(tg, _feeds(g))["c"]
    f = _feeds(g)
    np.testing.assert_allclose(got, f["a"] @ f["b"], rtol=1e-5, atol=1e-5)
    assert plan.summary.bytes_moved == stats(tg).bytes_moved


def test_dead_nodes_and_tasks_are_pruned():
    g = es.Graph()
    x = g.input("x", (4, 4))
    _unused = es.nn.relu(x) @ x
    g.output("y", x * 3.0)
    prog = es.compile(g, workers=2)
    assert not any("x0 * x1 agg=add" in t.describe() for t in prog.taskgraph.tasks)


def test_text_form_and_dot():
    g = _matmul(4, 4, 4)
    parts = _parts((2, 1), (1, 1), (2, 1, 1), n=4)
    tg = lower(build(g, Cluster.local(2), parts))
    text = str(tg)
    assert text.splitlines()[0] == "taskgraph(2 workers) {"
    assert "%0 @0 = input 'a'[0:2,0:4] : f32[2,4]" in text
    assert "apply[ac,cb->ab x0 * x1 agg=add]" in text and "move[0:4,0:4] from 0" in text
    assert "return c = " in text
    dot = to_dot(tg)
    assert dot.startswith("digraph taskgraph") and "cluster_1" in dot and "style=dashed" in dot


def test_stats_count_flops_links_and_critical_path():
    g = _matmul()
    parts = _parts((2, 1), (1, 1), (2, 1, 1))
    tg = lower(build(g, Cluster(machines=2, cores=1), parts))
    s = stats(tg)
    assert sum(s.flops) == g.nodes[2].op.flops()
    assert s.bytes_across == sum(s.links.values()) and s.bytes_within == 0
    assert s.critical_path > 0 and s.tasks["apply"] == 2


def test_validate_names_the_bad_task():
    g = _matmul(4, 4, 4)
    tg = lower(build(g, Cluster.local(1), _parts((1, 1), (1, 1), (1, 1, 1), n=4)))
    broken = TaskGraph((*tg.tasks[:1], MoveTask((0,), ((0, 9), (0, 4)), 0, 0, "f32")), {}, 1, 1)
    with pytest.raises(PlanError, match="task %1 is invalid: move box"):
        broken.validate()


def test_compile_exposes_plan_and_taskgraph():
    g = es.Graph()
    x, w = g.input("x", (4096, 512)), g.input("w", (512, 512))
    g.output("y", es.nn.relu(x @ w))
    prog = es.compile(g, workers=4)
    assert "data parallel on a" in str(prog.plan)
    assert prog.taskgraph.workers == 4 and len(prog.taskgraph) > 4
    ref = es.compile(g, engine="reference")
    f = _feeds(g.ir)
    np.testing.assert_allclose(prog.run(f)["y"], ref.run(f)["y"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("engine", ["sequential", "local"])
def test_empty_tensors_lower_to_constants(engine):
    g = es.Graph()
    x, w = g.input("x", (0, 4)), g.input("w", (4, 3))
    g.output("y", x @ w)
    g.output("s", (x @ w).sum())
    prog = es.compile(g, workers=3, engine=engine)
    assert not any(isinstance(t, PartialTask) and not t.pieces for t in prog.taskgraph.tasks)
    out = prog.run({"x": np.zeros((0, 4), np.float32), "w": np.ones((4, 3), np.float32)})
    assert out["y"].shape == (0, 3) and out["s"] == 0
