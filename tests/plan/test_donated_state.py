"""State a session run replaces is given up to it (compile.Session, engines/donation.py): each
block is freed after its last reader, so a training step's old weights and moments are not
held beside the new ones to its end. The planner's estimate (plan/predict/memory.py), the simulator
(engines/simulator/replay.py) and the local engine's traced peak agree on it (issue 31)."""

import tracemalloc

import numpy as np
import pytest

import einsummable as es
from einsummable.engines import reference
from einsummable.engines.simulator import simulate
from einsummable.errors import EngineError
from einsummable.lower.lowering import lower
from einsummable.lower.taskgraph import ApplyTask
from einsummable.plan.planners import make_plan

MiB = 2**20
N = 1024  # a 4 MiB f32 weight and a 4 MiB moment


def momentum_step():
    """m' = 0.9 m + 0.1 w^2, w' = w - 0.01 m': both outputs replace the inputs of their names."""
    g = es.Graph()
    w, m = g.input("w", (N, N)), g.input("m", (N, N))
    m2 = es.elementwise("0.9 * x0 + 0.1 * x1 * x1", m, w)
    g.output("m", m2)
    g.output("w", es.elementwise("x0 - 0.01 * x1", w, m2))
    rng = np.random.default_rng(0)
    state = {"w": rng.standard_normal((N, N), dtype=np.float32), "m": np.zeros((N, N), np.float32)}
    return g.ir, state


def traced_peak(prog, state, steps: int) -> tuple[float, dict]:
    """The largest traced peak of ``steps`` session runs after a first (which builds the
    kernels' one-time state), with the state traced from the session's copy of it on and the
    program's own tables not; and the state after them."""
    tracemalloc.start()
    try:
        sess = prog.session(state)
        sess.run({})
        peaks = []
        for _ in range(steps):
            tracemalloc.reset_peak()
            sess.run({})
            peaks.append(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()
    return max(peaks), sess.state()


@pytest.mark.parametrize("workers", [1, 2])
def test_replaced_state_is_freed_after_its_last_reader_as_planned_simulated_and_run(workers):
    g, state = momentum_step()
    whole = 4 * N * N * 4  # inputs and outputs, each held whole to the end
    plan = make_plan(g, es.Cluster(machines=1, cores=workers), compare=False)
    estimate = plan.summary.peak
    simulated = max(simulate.run(lower(plan), plan.cluster).peak_memory)
    assert estimate < 0.8 * whole and simulated == pytest.approx(estimate, rel=0.15)
    measured, got = traced_peak(es.compile(g, cluster=plan.cluster, engine="local"), state, 3)
    assert measured == pytest.approx(estimate, rel=0.15)
    want = dict(state)
    for _ in range(4):
        want = reference.run(g, want)
    for name in ("w", "m"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)


def test_a_budget_that_holds_the_step_only_with_its_state_given_up():
    """13 MiB holds w, m and the new blocks as they are made (12 MiB), not old and new state
    whole (16 MiB): the plan fits without recomputing anything, and the run stays under it."""
    g, state = momentum_step()
    budget = 13 * MiB
    plan = make_plan(g, es.Cluster(machines=1, cores=2, memory_per_machine=budget), compare=False)
    assert plan.summary.fits and plan.summary.peak <= budget and plan.remat is None
    measured, _ = traced_peak(es.compile(g, cluster=plan.cluster, engine="local"), state, 2)
    assert measured <= budget


def _failing(sess, task: int):
    """Make the step that runs task ``task`` of the session's local program raise (the task's
    own, or its native segment's: engines/kernels/segment.py)."""
    executor = sess.program.executor
    steps, node = executor.node_steps, task if executor.plan is None else executor.plan.node_of[task]

    def fail(args, feeds, variables):
        raise RuntimeError("disk on fire")

    executor.node_steps = [fail if i == node else s for i, s in enumerate(steps)]
    return steps


def test_a_run_that_fails_after_reading_given_up_state_says_it_is_lost():
    g, state = momentum_step()
    sess = es.compile(g, workers=1).session(state)
    sess.run({})
    tasks = sess.program.taskgraph.tasks
    last = max(i for i, t in enumerate(tasks) if isinstance(t, ApplyTask))
    steps = _failing(sess, last)
    with pytest.raises(EngineError, match="disk on fire"):
        sess.run({})
    sess.program.executor.node_steps = steps
    with pytest.raises(EngineError, match=r"\['m', 'w'\] were given up to a run that failed part-way"):
        sess.run({})
    with pytest.raises(EngineError, match="put them again"):
        sess.state()
    sess.put(state)  # from a checkpoint: the session goes on
    sess.run({})
    np.testing.assert_allclose(sess.state()["w"], reference.run(g, state)["w"], rtol=1e-6)


def test_a_run_that_fails_before_reading_given_up_state_leaves_it_as_it_was():
    g, state = momentum_step()
    sess = es.compile(g, workers=1).session(state)
    sess.run({})
    before = sess.state()
    steps = _failing(sess, 0)  # the first input task: nothing is read
    with pytest.raises(EngineError, match="disk on fire"):
        sess.run({})
    sess.program.executor.node_steps = steps
    after = sess.state()
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])


def test_each_given_up_block_goes_after_the_last_read_that_overlaps_it():
    """Not after the tensor's last read: a worker that reads its block late must not keep the
    blocks the others read long ago (they would be held beside the new ones)."""
    from einsummable.engines.blocks import Blocks
    from einsummable.engines.donation import GivenUp

    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    top, bottom = ((0, 2), (0, 4)), ((2, 4), (0, 4))
    held = GivenUp(Blocks((4, 4), "f32", {top: x[:2].copy(), bottom: x[2:].copy()}),
                   {top: 1, bottom: 1, ((1, 3), (0, 4)): 1})
    np.testing.assert_array_equal(held.get(top), x[:2])
    assert set(held.blocks) == {top, bottom}, "the straddling read is still to come"
    np.testing.assert_array_equal(held.get(((1, 3), (0, 4))), x[1:3])
    assert set(held.blocks) == {bottom}
    np.testing.assert_array_equal(held.get(bottom), x[2:])
    assert held.blocks == {} and not held.unread


def test_four_workers_free_the_replaced_state_block_by_block():
    """Four workers on as many blocks: the traced peak stays at the plan's (it reached 1.17x
    when every block waited for the tensor's last read)."""
    g, state = momentum_step()
    plan = make_plan(g, es.Cluster(machines=1, cores=4), compare=False)
    measured, _ = traced_peak(es.compile(g, cluster=plan.cluster, engine="local"), state, 8)
    assert measured <= 1.1 * plan.summary.peak
