"""Resident state: parameters and optimizer state stay on the workers between runs."""

import numpy as np
import pytest

import einsummable as es
from einsummable.engines.blocks import Blocks


def mlp_step():
    g = es.Graph()
    x = g.input("x", (32, 12))
    y = g.input("y", (32,))
    w1 = g.input("w1", (12, 24))
    w2 = g.input("w2", (24, 5))
    loss = es.nn.cross_entropy(es.nn.relu(x @ w1) @ w2, y)
    step = es.train.adamw(loss, [w1, w2], lr="lr", weight_decay=0.1)
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((12, 24), dtype=np.float32) * 0.3,
              "w2": rng.standard_normal((24, 5), dtype=np.float32) * 0.3}
    batch = {"x": rng.standard_normal((32, 12), dtype=np.float32),
             "y": rng.integers(0, 5, 32).astype(np.float32)}
    return g, step, params, batch


@pytest.mark.parametrize("engine,workers", [("local", 1), ("local", 3), ("sequential", 2), ("reference", 1)])
def test_session_equals_feeding_the_state_each_step(engine, workers):
    g, step, params, batch = mlp_step()
    prog = es.compile(g, workers=workers, engine=engine)
    state = params | step.init_state()
    losses = []
    for t in range(5):
        out = prog.run(state | batch | {"lr": 0.01 * (t + 1)})
        losses.append(float(out["loss"]))
        state = step.carry(out)
    sess = prog.session(params | step.init_state())
    got = [float(sess.run(batch | {"lr": 0.01 * (t + 1)}, fetch=["loss"])["loss"]) for t in range(5)]
    np.testing.assert_allclose(got, losses, rtol=1e-6)
    final = sess.state()
    for name in state:
        np.testing.assert_allclose(final[name], state[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_local_sessions_keep_blocks_not_arrays():
    g, step, params, batch = mlp_step()
    sess = es.compile(g, workers=2).session(params | step.init_state())
    out = sess.run(batch | {"lr": 0.01}, fetch=["loss"])
    assert set(out) == {"loss"}
    assert all(isinstance(sess._state[n], Blocks) for n in ("w1", "w2", "w1.m", "adam.step"))


def test_session_errors_name_the_problem():
    g, step, params, batch = mlp_step()
    prog = es.compile(g, workers=2)
    sess = prog.session(params | step.init_state())
    with pytest.raises(es.FeedError, match="resident"):
        sess.run(batch | {"lr": 0.1, "w1": params["w1"]})
    with pytest.raises(es.FeedError, match="fetch"):
        sess.run(batch | {"lr": 0.1}, fetch=["nope"])
    with pytest.raises(es.FeedError, match="missing"):
        sess.run({"x": batch["x"], "lr": 0.1})
    with pytest.raises(es.FeedError, match="not inputs"):
        prog.session({"zz": params["w1"]})
    with pytest.raises(es.FeedError, match="shape"):
        prog.session({"w1": params["w2"]})
    with pytest.raises(es.FeedError, match="dict of input name -> array, got list"):
        sess.put([("w1", params["w1"])])
    with pytest.raises(es.FeedError, match="dict of input name -> array, got tuple"):
        prog.session((("w1", params["w1"]),))


def test_one_name_alone_is_a_name_not_its_letters():
    g, step, params, batch = mlp_step()
    prog = es.compile(g, workers=2)
    sess = prog.session(params | step.init_state())
    name = next(n for n in prog.graph.outputs if n not in sess.state())
    assert list(sess.run(batch | {"lr": 0.1}, fetch=name)) == [name]
    sess.drop("w1")
    assert "w1" not in sess.state() and "w2" in sess.state()


def test_blocks_serve_any_box():
    full = np.arange(24.0).reshape(4, 6)
    b = Blocks((4, 6), "f64", {((0, 2), (0, 6)): full[:2], ((2, 4), (0, 6)): full[2:]})
    np.testing.assert_array_equal(b.get(((1, 3), (2, 5))), full[1:3, 2:5])
    assert b.get(((0, 2), (0, 6))) is b.blocks[((0, 2), (0, 6))]
    np.testing.assert_array_equal(b.array(), full)
    inside = b.get(((2, 4), (1, 3)))  # inside one stored block: a view of it, no copy
    np.testing.assert_array_equal(inside, full[2:4, 1:3])
    assert np.shares_memory(inside, b.blocks[((2, 4), (0, 6))])


@pytest.mark.parametrize("engine,workers", [("local", 2), ("local", 1), ("reference", 1)])
def test_threads_sharing_a_session_lose_no_update(engine, workers):
    """Each run reads the resident counter and writes it back: runs must not interleave."""
    import threading

    g = es.Graph()
    c = g.input("c", (64,))
    g.output("c", c + 1.0)
    sess = es.compile(g, workers=workers, engine=engine).session({"c": np.zeros(64, np.float32)})
    per_thread, threads = 300, 2
    start = threading.Barrier(threads)

    def bump():
        start.wait()
        for _ in range(per_thread):
            sess.run({})

    pool = [threading.Thread(target=bump) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    np.testing.assert_array_equal(sess.state()["c"], np.full(64, per_thread * threads, np.float32))


def mlp_forward():
    h = es.Graph()
    x, w1, w2 = h.input("x", (32, 12)), h.input("w1", (12, 24)), h.input("w2", (24, 5))
    h.output("logits", es.nn.relu(x @ w1) @ w2)
    return h


@pytest.mark.parametrize("engine,workers", [("local", 3), ("local", 1), ("reference", 1)])
def test_a_second_program_reads_the_first_sessions_state_by_name(engine, workers):
    g, step, params, batch = mlp_step()
    train = es.compile(g, workers=workers, engine=engine).session(params | step.init_state())
    infer = es.compile(mlp_forward(), workers=2, engine=engine).session(train)  # another partition
    twin = es.compile(g, workers=workers, engine=engine).session(params | step.init_state())
    for t in range(3):
        train.run(batch | {"lr": 0.01 * (t + 1)}, fetch=["loss"])
        state = train.state()
        got = infer.run({"x": batch["x"]})["logits"]  # the weights are not fed: they are resident
        want = np.maximum(batch["x"] @ state["w1"], 0) @ state["w2"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        twin.run(batch | {"lr": 0.01 * (t + 1)}, fetch=["loss"])
    for name, w in twin.state().items():  # reading the weights changed nothing for training
        np.testing.assert_array_equal(train.state()[name], w, err_msg=name)
    with pytest.raises(es.FeedError, match="resident"):
        infer.run({"x": batch["x"], "w1": params["w1"]})


def test_kept_outputs_become_state_that_another_program_reads_and_updates():
    g = es.Graph()
    x = g.input("x", (6, 4))
    g.output("total", x * 2.0)
    h = es.Graph()
    total, y = h.input("total", (6, 4)), h.input("y", (6, 4))
    h.output("total", total + y)
    h.output("sum", total.sum())
    first = es.compile(g, workers=2).session({}, keep=["total"])
    second = es.compile(h, workers=3).session(first)
    x_, y_ = np.arange(24.0, dtype=np.float32).reshape(6, 4), np.ones((6, 4), np.float32)
    assert first.run({"x": x_}) == {}
    assert isinstance(first.resident.tensors["total"], Blocks)
    second.run({"y": y_})
    out = second.run({"y": y_})
    np.testing.assert_allclose(out["sum"], (2 * x_ + y_).sum())
    np.testing.assert_array_equal(first.state()["total"], 2 * x_ + 2 * y_)
    first.drop(["total"])
    with pytest.raises(es.FeedError, match="missing"):
        second.run({"y": y_})
    with pytest.raises(es.FeedError, match="keep"):
        es.compile(g, workers=1).session({}, keep=["nope"])


def test_a_resident_tensor_of_the_wrong_shape_is_named():
    g, step, params, _ = mlp_step()
    h = es.Graph()
    x, w1 = h.input("x", (32, 24)), h.input("w1", (24, 12))
    h.output("y", x @ w1)
    train = es.compile(g, workers=2).session(params | step.init_state())
    other = es.compile(h, workers=2).session(train)
    with pytest.raises(es.FeedError, match=r"resident tensor 'w1' is f32\[12, 24\].*f32\[24, 12\]"):
        other.run({"x": np.zeros((32, 24), np.float32)})
