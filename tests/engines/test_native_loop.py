"""The native task loop (engines/kernels/segment.py): a worker's runs of compiled joins cut into
segments, each run by one call of the C loop, against numpy."""

import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import einsummable as es
from einsummable.engines import local, reference
from einsummable.engines.kernels import cbuild, native, segment
from einsummable.engines.simulator import simulate
from einsummable.errors import EngineError
from einsummable.hardware.calibrate import tiny_chains, tiny_feeds
from einsummable.hardware.cluster import Cluster
from einsummable.ir.einsummable import Einsummable
from einsummable.lower.fusion import fuse
from einsummable.lower.lowering import lower
from einsummable.lower.taskgraph import ApplyTask, InputTask, Output, TaskGraph
from einsummable.plan.plan import build
from graphgen import BINARY, UNARY, llama_step, random_graph, random_partitions

pytestmark = pytest.mark.skipif(not cbuild.enabled(), reason="compiled kernels are off")


def chains(workers: int, chain: int) -> TaskGraph:
    """A chain of tiny joins (4 elements) pinned to each worker (benchmarks/engine_overhead.py's)."""
    return tiny_chains(workers, workers, chain)


def _keep(tg: TaskGraph) -> set[int]:
    return {t for out in tg.outputs.values() for t, _ in out.blocks}


def _chain(x: np.ndarray, n: int) -> np.ndarray:
    for _ in range(n):
        x = x * np.float32(0.5) + np.float32(1)
    return x


def test_each_workers_chain_is_one_segment_and_matches_numpy():
    tg = chains(2, 50)
    native.flush()
    plan = segment.cut(tg.tasks, _keep(tg), lambda t: True)
    assert plan is not None
    assert [len(s.tasks) for s in plan.segments] == [50, 50]
    assert len(plan.nodes) == 4  # two inputs, two segments
    for seg in plan.segments:
        x = np.linspace(-2, 2, 4, dtype=np.float32)
        (y,) = seg([x], {})
        np.testing.assert_allclose(y, _chain(x, 50), rtol=1e-6)
        assert seg.arena_bytes <= 2 * segment.LINE  # a chain reuses its places


def test_a_non_contiguous_external_input_is_read_where_it_lies():
    tg = chains(1, 10)
    native.flush()
    (seg,) = segment.cut(tg.tasks, _keep(tg), lambda t: True).segments
    x = np.arange(8, dtype=np.float32)[::2]
    assert not x.flags.c_contiguous
    (y,) = seg([x], {})
    np.testing.assert_allclose(y, _chain(x.copy(), 10), rtol=1e-6)
    (z,) = seg([np.ascontiguousarray(x)], {})  # the shared stride table was left as it was
    np.testing.assert_array_equal(z, y)


def test_run_time_variables_and_traced_times():
    box = ((0, 4),)
    scale = Einsummable.from_spec("i->i", [(4,)], "x0 * s + 1")
    tasks = (InputTask("x", box, "f32", 0), ApplyTask(scale, (0,), 0), ApplyTask(scale, (1,), 0))
    tg = TaskGraph(tasks, {"y": Output((4,), "f32", ((2, box),))}, 1, 1)
    native.flush()
    (seg,) = segment.cut(tg.tasks, _keep(tg), lambda t: True).segments
    x = np.ones(4, np.float32)
    times = np.zeros((3, 2))
    (y,) = seg([x], {"s": 3.0}, times)
    np.testing.assert_allclose(y, (x * 3 + 1) * 3 + 1)
    assert (times[1:, 0] > 0).all() and (times[1:, 1] >= times[1:, 0]).all() and times[2, 0] >= times[1, 1]
    assert not times[0].any()  # the input task is no part of the segment


def test_a_task_reading_past_the_segments_start_opens_another():
    box = ((0, 4),)
    add = Einsummable.from_spec("i,i->i", [(4,), (4,)], "x0 + x1")
    one = Einsummable.from_spec("i->i", [(4,)], "x0 * 2")
    # 3 runs on worker 1 and reads 2; so task 4 on worker 0, reading 3, cannot join 1..2's segment
    tasks = (InputTask("x", box, "f32", 0), ApplyTask(one, (0,), 0), ApplyTask(one, (1,), 0),
             ApplyTask(one, (2,), 1), ApplyTask(add, (3, 2), 0), ApplyTask(one, (4,), 0))
    tg = TaskGraph(tasks, {"y": Output((4,), "f32", ((5, box),))}, 2, 2)
    native.flush()
    plan = segment.cut(tg.tasks, _keep(tg), lambda t: True)
    assert [s.tasks for s in plan.segments] == [(1, 2), (4, 5)]
    first, second = plan.segments
    assert first.exported == (2,) and second.external == (3, 2)
    x = np.arange(4, dtype=np.float32)
    (b,) = first([x], {})
    (y,) = second([b * 2, b], {})
    np.testing.assert_allclose(y, (x * 8 + x * 4) * 2)


# ------------------------------------------------------------ the local engine runs them

def _elementwise_dag(rng: random.Random, shape: tuple[int, ...], ops: int) -> tuple[es.Graph, dict]:
    """A random DAG of elementwise joins (graphgen's) over two inputs of one shape: most of a
    worker's tasks are then consecutive compiled joins, so its runs become segments."""
    g = es.Graph()
    feeds = {n: np.random.default_rng(rng.randrange(2**32)).uniform(0.5, 1.5, shape).astype(np.float32)
             for n in ("a", "b")}
    pool = [g.input(n, shape) for n in feeds]
    letters = "ijk"[:len(shape)]
    for _ in range(ops):
        if rng.random() < 0.5:
            spec, args = f"{letters}->{letters}", [rng.choice(pool)]
            join = rng.choice(UNARY)
        else:
            spec, args = f"{letters},{letters}->{letters}", rng.sample(pool, 2)
            join = rng.choice(BINARY)
        pool.append(es.einsum(spec, *args, join=join))
    for k, t in enumerate([pool[-1], *rng.sample(pool[2:], min(2, len(pool) - 2))]):
        g.output(f"out{k}", t)
    return g, feeds


def _segments(executor: local.LocalProgram) -> list:
    return [] if executor.plan is None else executor.plan.segments


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 3]))
def test_random_elementwise_graphs_with_segments_match_the_reference(seed, workers):
    rng = random.Random(seed)
    g, feeds = _elementwise_dag(rng, (rng.randint(1, 9), rng.randint(1, 9)), rng.randint(2, 12))
    plan = build(g.ir, Cluster(machines=1, cores=workers), random_partitions(g.ir, rng))
    tg = fuse(lower(plan)).graph
    want = reference.run(g.ir, feeds)
    for native_loop in (True, False):
        got = local.LocalProgram(tg, native_loop).run(feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=2e-5, err_msg=name)


def test_segments_are_cut_on_random_graphs_and_match_the_reference():
    """Random graphs of every kind (graphgen) on random partitions and worker counts: each run
    with segments matches the reference, and segments were cut in many of them (so the property
    test above is no vacuous pass)."""
    cut = 0
    for seed in range(40):
        rng = random.Random(seed)
        g, feeds = random_graph(rng, n_ops=rng.randint(3, 12))
        plan = build(g.ir, Cluster(machines=1, cores=rng.choice([1, 2, 3])), random_partitions(g.ir, rng))
        prog = local.LocalProgram(fuse(lower(plan)).graph)
        cut += bool(_segments(prog))
        got, want = prog.run(feeds), reference.run(g.ir, feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-4, atol=2e-4, err_msg=f"{seed} {name}")
    assert cut >= 10


def test_the_engines_segments_are_the_runs_the_simulator_prices():
    """One program: the local engine cuts exactly the native runs (lower/runs.py) that the
    simulator prices, on a Llama training step's TaskGraph."""
    g, *_ = llama_step(2)
    prog = es.compile(g, workers=2)
    tg = prog.taskgraph
    native = simulate.native_tasks(tg)
    segments = _segments(prog.executor)
    assert segments
    engine = sorted(t for s in segments for t in s.tasks[1:])
    assert engine == [t for t, x in enumerate(native) if x]


def test_a_llama_training_step_with_segments_matches_the_reference_and_its_trace_has_every_task(tmp_path):
    g, _, _, arrays, variables = llama_step(2)
    prog = es.compile(g, workers=2)
    assert _segments(prog.executor)
    trace = tmp_path / "t.json"
    got = prog.executor.run(arrays, variables, trace=trace)
    want = reference.run(g.ir, arrays, variables)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-3, atol=1e-4, err_msg=name)
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(prog.taskgraph.tasks)
    assert all(e["dur"] >= 0 for e in events)


def test_a_segment_lets_each_exported_block_go_after_its_last_reader():
    """A block of a segment read by two tasks outside it is dropped after the second takes it,
    not when every block of the segment has been read; a kept one is never dropped."""
    box = ((0, 4),)
    one = Einsummable.from_spec("i->i", [(4,)], "x0 * 2")
    # 1..2 on worker 0 are a segment; 3 (worker 1) and 4 (worker 2) read 1, 5 reads 2; 2 is kept
    tasks = (InputTask("x", box, "f32", 0), ApplyTask(one, (0,), 0), ApplyTask(one, (1,), 0),
             ApplyTask(one, (1,), 1), ApplyTask(one, (1,), 2), ApplyTask(one, (2,), 1))
    outputs = {"y": Output((4,), "f32", ((2, box),)), "z": Output((4,), "f32", ((5, box),))}
    tg = TaskGraph(tasks, outputs, 3, 3)
    native.flush()
    seg = segment.cut(tg.tasks, _keep(tg), lambda t: True).segments[0]
    assert seg.exported == (1, 2) and seg.readers == [2, 2]  # 2: read by 5, and kept
    out = seg([np.ones(4, np.float32)], {})
    first = out.take(0)
    assert out[0] is first  # one reader still to take it
    assert out.take(0) is first and out[0] is None  # both have: let go
    out.take(1)
    assert out[1] is not None  # kept: held for the run's result
    got = local.LocalProgram(tg).run({"x": np.ones(4, np.float32)})
    np.testing.assert_array_equal(got["y"], np.full(4, 4, np.float32))
    np.testing.assert_array_equal(got["z"], np.full(4, 8, np.float32))


def test_a_failing_segment_names_its_first_task_and_stops():
    tg = chains(2, 20)
    prog = local.LocalProgram(tg)
    node = prog.plan.node_of[5]

    def fail(args, feeds, variables):
        raise RuntimeError("segment on fire")

    prog.node_steps = [fail if i == node else s for i, s in enumerate(prog.node_steps)]
    with pytest.raises(EngineError, match=r"run natively \(tasks \d+\.\.\d+\).*segment on fire"):
        prog.run(tiny_feeds(2))


def test_with_compiled_kernels_off_nothing_is_cut(monkeypatch):
    monkeypatch.setattr(cbuild, "enabled", lambda: False)
    assert segment.cut(chains(1, 10).tasks, set(), lambda t: True) is None
