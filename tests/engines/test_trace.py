"""Timelines: the local engine's measured trace and the simulator's predicted one."""

import itertools
import json
import time
from collections import defaultdict

import numpy as np
import pytest

import einsummable as es
from einsummable.errors import EinsummableError
from einsummable.workloads import mlp_train


def _feeds(rng):
    return {"x": rng.standard_normal((64, 32), dtype=np.float32),
            "y": rng.standard_normal((64, 16), dtype=np.float32),
            "w1": rng.standard_normal((32, 48), dtype=np.float32),
            "w2": rng.standard_normal((48, 16), dtype=np.float32)}


def _tasks(events):
    return [e for e in events if e["ph"] == "X"]


def test_the_local_engine_traces_one_event_per_task_inside_the_run(tmp_path):
    g = mlp_train(batch=64, d=32, hidden=48, out=16)
    prog = es.compile(g, workers=2)
    feeds = _feeds(np.random.default_rng(0))
    start = time.perf_counter()
    out = prog.run(feeds, trace=tmp_path / "t.json")
    wall = time.perf_counter() - start
    a1 = np.maximum(feeds["x"] @ feeds["w1"], 0)
    np.testing.assert_allclose(out["dw2"], a1.T @ (2 * (a1 @ feeds["w2"] - feeds["y"])), rtol=1e-4, atol=1e-3)
    events = _tasks(json.loads((tmp_path / "t.json").read_text())["traceEvents"])
    tg = prog.taskgraph
    assert len(events) == len(tg.tasks)
    assert sorted(int(e["name"].split("%")[1]) for e in events) == list(range(len(tg.tasks)))
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in events)
    assert max(e["ts"] + e["dur"] for e in events) <= wall * 1e6
    lanes = defaultdict(list)
    for e in events:
        lanes[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in lanes.values():  # a worker thread runs one task at a time
        spans.sort()
        assert all(a[1] <= b[0] + 1e-3 for a, b in itertools.pairwise(spans))


def test_the_simulator_traces_the_predicted_timeline_and_a_gantt_chart(tmp_path):
    g = mlp_train(batch=64, d=32, hidden=48, out=16)
    prog = es.compile(g, cluster=es.Cluster(machines=2, cores=2), engine="simulate")
    sim = prog.simulate(trace=tmp_path / "t.json")
    events = _tasks(json.loads((tmp_path / "t.json").read_text())["traceEvents"])
    assert len(events) == sim.tasks == len(prog.taskgraph.tasks)
    assert max(e["ts"] + e["dur"] for e in events) == pytest.approx(sim.makespan * 1e6)
    assert {e["pid"] for e in events} <= {0, 1}
    prog.simulate(trace=tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_only_the_local_and_ray_engines_measure_a_trace(tmp_path):
    g = mlp_train(batch=64, d=32, hidden=48, out=16)
    prog = es.compile(g, engine="reference")
    with pytest.raises(EinsummableError, match="local or Ray engine"):
        prog.run(_feeds(np.random.default_rng(0)), trace=tmp_path / "t.json")
