"""The local engine against the reference on random graphs, partitions and worker counts."""

import os
import platform
import random
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import einsummable as es
from einsummable.engines import local, reference
from einsummable.errors import EngineError
from einsummable.hardware.cluster import Cluster
from einsummable.lower.fusion import fuse
from einsummable.lower.lowering import lower
from einsummable.plan.plan import build
from fakes import Terminal
from graphgen import random_graph, random_partitions


@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 3, 8]))
def test_random_graphs_match_reference(seed, workers):
    rng = random.Random(seed)
    g, feeds = random_graph(rng, n_ops=rng.randint(1, 10))
    plan = build(g.ir, Cluster(machines=1, cores=workers), random_partitions(g.ir, rng))
    tg = fuse(lower(plan)).graph  # as compile hands it over: fused tasks among the rest
    frozen = {k: v.copy() for k, v in feeds.items()}
    want = reference.run(g.ir, feeds)
    got = local.run(tg, feeds)
    for name in want:
        assert got[name].dtype == want[name].dtype
        np.testing.assert_allclose(got[name], want[name], rtol=2e-4, atol=2e-4, err_msg=name)
    for k in feeds:
        np.testing.assert_array_equal(feeds[k], frozen[k], err_msg=f"feed {k} was written")


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_default_engine_on_an_mlp_step(workers):
    rng = np.random.default_rng(0)
    g = es.Graph()
    x = g.input("x", (64, 16))
    w1 = g.input("w1", (16, 32))
    w2 = g.input("w2", (32, 8))
    y = g.input("y", (64,))
    loss = es.nn.cross_entropy(es.nn.relu(x @ w1) @ w2, y)
    step = es.train.adamw(loss, [w1, w2], lr="lr")
    feeds = {"x": rng.standard_normal((64, 16), dtype=np.float32),
             "w1": rng.standard_normal((16, 32), dtype=np.float32),
             "w2": rng.standard_normal((32, 8), dtype=np.float32),
             "y": rng.integers(0, 8, 64).astype(np.float32), "lr": 1e-2} | step.init_state()
    prog = es.compile(g, workers=workers)
    assert prog.engine == "local"
    got = prog.run(feeds)
    want = es.compile(g, engine="reference").run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_a_failing_kernel_names_the_task_and_node_and_stops():
    g = es.Graph()
    x = g.input("x", (8, 8))
    g.output("y", (x @ x).exp() * "scale")
    prog = es.compile(g, workers=2)
    with pytest.raises(EngineError, match=r"apply\[.*\] of node %\d+.*'scale'"):
        # a run-time variable the kernel cannot read: feeds pass the check, the kernel fails
        prog.execute({"x": np.ones((8, 8), np.float32)}, {})
    assert not [t for t in threading.enumerate() if t.name.startswith("einsummable-")]


def test_peak_memory_of_a_chain_stays_near_the_plans_live_set():
    import tracemalloc

    from einsummable.lower.stats import live_bytes

    n = 600
    g = es.Graph()
    ts = [g.input(f"x{k}", (n, n)) for k in range(4)]
    g.output("y", ts[0] @ ts[1] @ ts[2] @ ts[3])
    prog = es.compile(g, workers=2)
    rng = np.random.default_rng(0)
    feeds = {f"x{k}": rng.standard_normal((n, n), dtype=np.float32) for k in range(4)}
    prog.run(feeds)
    tracemalloc.start()
    out = prog.run(feeds)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # the feeds were allocated before tracing began, so the peak counts only the engine's
    # blocks; the bound also adds the inputs, this one is stricter
    assert peak < 1.5 * (out["y"].nbytes + live_bytes(prog.taskgraph))


def _long_chain():
    g = es.Graph()
    t = g.input("x", (4,))
    for _ in range(300):
        t = es.elementwise("x0 * 0.5 + 1", t)
    g.output("y", t)
    return es.compile(g, workers=2), {"x": np.ones(4, np.float32)}


def test_progress_shows_on_a_terminal_for_long_runs(monkeypatch):
    prog, feeds = _long_chain()
    terminal = Terminal()
    monkeypatch.setattr(local, "SHOW_PROGRESS_AFTER", 0.0)
    monkeypatch.setattr("sys.stderr", terminal)
    prog.run(feeds)
    assert "task/s" in terminal.text and f"/{len(prog.taskgraph.tasks)}" in terminal.text


def test_progress_stays_quiet_off_a_terminal(monkeypatch, capsys):
    prog, feeds = _long_chain()
    monkeypatch.setattr(local, "SHOW_PROGRESS_AFTER", 0.0)
    prog.run(feeds)
    assert capsys.readouterr().err == ""


_ONE_ARENA = """
import ctypes, threading
import numpy as np
import einsummable as es

t = threading.Thread(target=lambda: np.ones(1 << 18).sum())  # a thread that mallocs, then ends
t.start()
t.join()
g = es.Graph()
x, w = g.input("x", (256, 256)), g.input("w", (256, 512))
g.output("y", es.nn.relu(x @ w))
prog = es.compile(g, workers=2)
feeds = {"x": np.ones((256, 256), np.float32), "w": np.ones((256, 512), np.float32)}
for _ in range(3):
    prog.run(feeds)
ctypes.CDLL("libc.so.6").malloc_stats()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="glibc's malloc arenas")
def test_workers_allocate_from_one_heap_whatever_threads_ran_before():
    # A dead thread's arena is handed to the next new thread whatever M_ARENA_MAX says: set
    # only at the first run, the workers kept their own heaps, grown and trimmed run after
    # run (a Llama step page-faulted ~10-60k times a step, its first steps). glibc's own
    # report (malloc_stats, on stderr) counts the arenas.
    src = str(Path(es.__file__).resolve().parents[1])
    env = os.environ | {"PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", _ONE_ARENA], capture_output=True, text=True, env=env,
                          timeout=120, check=True)
    assert re.findall(r"^Arena \d+:", done.stderr, re.M) == ["Arena 0:"]


def _double():
    g = es.Graph()
    x = g.input("x", (8, 4))
    g.output("y", x * 2.0)
    return g


def test_a_local_run_refuses_more_threads_than_it_may_start(monkeypatch):
    """One thread per worker: a cluster of a million cores used to compile, then build their state."""
    with pytest.raises(EngineError, match=r"1,025 worker threads .* at most 1,024 .*local\.MAX_THREADS"):
        es.compile(_double(), cluster=Cluster(cores=1025))
    es.compile(_double(), cluster=Cluster(cores=1025), engine="simulate")  # the simulator starts no threads
    monkeypatch.setattr(local, "MAX_THREADS", 4)  # what the message says to change
    with pytest.raises(EngineError, match="5 worker threads"):
        es.compile(_double(), workers=5)
    x = np.ones((8, 4), np.float32)
    np.testing.assert_array_equal(es.compile(_double(), workers=4).run({"x": x})["y"], 2 * x)
