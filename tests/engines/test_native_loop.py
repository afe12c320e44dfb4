"""The native task loop (engines/kernels/segment.py): a worker's runs of compiled joins cut into
segments, each run by one call of the C loop, against numpy."""

import numpy as np
import pytest

from einsummable.engines.kernels import cbuild, native, segment
from einsummable.hardware.calibrate import tiny_chains
from einsummable.ir.einsummable import Einsummable
from einsummable.lower.taskgraph import ApplyTask, InputTask, Output, TaskGraph

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
