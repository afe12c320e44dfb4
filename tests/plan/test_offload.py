"""Offload (plan/offload.py, issue 31 item 3): when no plan fits, even rematerialised, the
step's state is kept in host storage, loaded a window ahead of its readers and stored as it
is made; the estimate, the simulator and the local engine agree on the peak, and the
results are the reference engine's."""

import tracemalloc

import numpy as np
import pytest

import einsummable as es
from einsummable.engines import reference
from einsummable.engines.simulator import simulate
from einsummable.errors import EngineError, PlanMemoryError
from einsummable.ir import priority
from einsummable.lower.lowering import lower
from einsummable.lower.taskgraph import InputTask
from einsummable.plan.planners import make_plan
from graphgen import deep_mlp_momentum

MiB = 2**20
LAYERS, BATCH, WIDTH = 32, 64, 256  # 32 weights and 32 momenta of 256 KiB: 16 MiB of state


def momentum_step():
    """A deep ReLU MLP's step with momentum: its state (16 MiB) is two thirds of its peak, and
    the gradients, which remat cannot recompute, most of the rest."""
    return deep_mlp_momentum(LAYERS, BATCH, WIDTH, loss_scale=0.001)


BUDGET = 8 * MiB
CLUSTER = es.Cluster(machines=1, cores=2, memory_per_machine=BUDGET)


def test_state_that_fits_only_in_host_storage_is_offloaded_and_the_peak_agrees():
    g, _, _ = momentum_step()
    free = make_plan(g, es.Cluster(machines=1, cores=2), compare=False)
    assert free.summary.peak > 2.5 * BUDGET
    plan = make_plan(g, CLUSTER, compare=False)
    assert plan.offload is not None and plan.remat is None and plan.order == priority.PROGRAM
    assert len(plan.offload.names) == 2 * LAYERS and plan.summary.fits
    assert plan.summary.storage_seconds == pytest.approx(2 * 16 * MiB / CLUSTER.storage_bandwidth)
    assert "kept in host storage" in str(plan)
    tg = lower(plan)
    tg.validate()
    assert tg.stored == frozenset(plan.offload.names)
    loads = [t for t in tg.tasks if isinstance(t, InputTask) and t.name in tg.stored]
    assert len(loads) > 2 * LAYERS and any(t.inputs for t in loads)  # re-loaded per reader group, gated
    simulated = max(simulate.run(tg, plan.cluster).peak_memory)
    assert simulated <= BUDGET and simulated == pytest.approx(plan.summary.peak, rel=0.2)


def test_an_offloaded_session_trains_as_the_reference_does_and_holds_its_estimate():
    g, state, feeds = momentum_step()
    prog = es.compile(g, cluster=CLUSTER, engine="local")
    assert prog.taskgraph.stored
    sess = prog.session(state)
    want = dict(state)
    for step in range(2):
        ref = reference.run(g, feeds | want)
        tracemalloc.start()
        got = sess.run(feeds, fetch=["loss"])
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        np.testing.assert_allclose(got["loss"], ref["loss"], rtol=1e-5)
        want = {name: ref[name] for name in state}
        # the state lies in host storage (memory-mapped), outside the traced heap
        assert peak <= 1.15 * prog.plan.summary.peak, (step, peak / MiB)
    for name, value in sess.state().items():
        np.testing.assert_allclose(value, want[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_offloaded_state_is_refused_by_ray_naming_the_engine_that_runs_it():
    g, _, _ = momentum_step()
    with pytest.raises(EngineError, match="host storage.*engine='local'"):
        es.compile(g, cluster=CLUSTER, engine="ray")


def test_when_even_offload_does_not_fit_the_error_says_so():
    g, _, _ = momentum_step()
    with pytest.raises(PlanMemoryError):
        make_plan(g, es.Cluster(machines=1, cores=2, memory_per_machine=2 * MiB), compare=False)
