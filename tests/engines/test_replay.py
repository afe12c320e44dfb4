"""A program run many times replays what it prepared: the feeds checked against a cached
signature, the dependency loop's bookkeeping built once (``scheduler.Schedule``), blocks that
a run hands back unchanged left as they lie. Oracles: the reference engine on the same feeds,
and the errors a first run raises, which a later run with a changed feed must raise too."""

import numpy as np
import pytest

import einsummable as es
from einsummable.engines import scheduler
from einsummable.errors import FeedError
from einsummable.ir.graph import InputNode
from einsummable.models.llama import LlamaConfig, init_params
from einsummable.models.llama.generate import Generator


def small_graph():
    g = es.Graph()
    x, w = g.input("x", (6, 4)), g.input("w", (4, 3))
    g.output("y", es.nn.relu(x @ w) * "s")
    g.output("w", w)  # handed back unchanged: a session keeps it where it lies
    return g


def feeds(seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((6, 4), dtype=np.float32), "s": float(seed + 1)}


def without(f, name):
    return {k: v for k, v in f.items() if k != name}


W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10


@pytest.mark.parametrize("workers", [1, 2])
def test_repeated_runs_with_new_values_equal_the_reference(workers):
    prog = es.compile(small_graph(), workers=workers)
    oracle = es.compile(small_graph(), engine="reference")
    for seed in range(4):
        f = feeds(seed) | {"w": W}
        np.testing.assert_allclose(prog.run(f)["y"], oracle.run(f)["y"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_session_replays_with_new_values_and_leaves_unchanged_blocks_as_they_lie(workers):
    sess = es.compile(small_graph(), workers=workers).session({"w": W})
    oracle = es.compile(small_graph(), engine="reference")
    sess.run(feeds(0), fetch=["y"])
    held = sess.resident.tensors["w"]
    for seed in range(1, 5):
        got = sess.run(feeds(seed), fetch=["y"])["y"]
        np.testing.assert_allclose(got, oracle.run(feeds(seed) | {"w": W})["y"], rtol=1e-5, atol=1e-6)
        assert sess.resident.tensors["w"] is held, "an unchanged output is the blocks it was fed"
    np.testing.assert_array_equal(sess.state()["w"], W)


@pytest.mark.parametrize("resident", [False, True])
@pytest.mark.parametrize("change,message", [
    (lambda f: f | {"x": np.zeros((6, 5), np.float32)}, r"input 'x' has shape \(6, 5\), expected \(6, 4\)"),
    (lambda f: f | {"x": f["x"].astype(np.float64)}, r"input 'x' has dtype float64, expected f32"),
    (lambda f: without(f, "x"), r"missing input\(s\) \['x'\]; expected x: f32\[6, 4"),
    (lambda f: f | {"z": 1.0}, r"unknown feed\(s\) \['z'\]"),
    (lambda f: f | {"s": "fast"}, r"run-time variable 's' must be a number, got str"),
    (lambda f: without(f, "s"), r"missing run-time variable\(s\) \['s'\]"),
])
def test_a_feed_changed_after_runs_that_matched_is_refused_by_name(resident, change, message):
    prog = es.compile(small_graph(), workers=1)
    if resident:
        sess = prog.session({"w": W})
        run, good = (lambda f: sess.run(f, fetch=["y"])), feeds(0)
    else:
        run, good = prog.run, feeds(0) | {"w": W}
    first = run(good)["y"]
    run(feeds(1) | ({} if resident else {"w": W}))
    with pytest.raises(FeedError, match=message):
        run(change(good))
    np.testing.assert_array_equal(run(good)["y"], first)  # the signature still holds


def test_a_signature_mismatch_still_converts_what_check_feeds_converts():
    torch = pytest.importorskip("torch")
    prog = es.compile(small_graph(), workers=1)
    f = feeds(0) | {"w": W}
    want = prog.run(f)["y"]
    np.testing.assert_array_equal(prog.run(f | {"x": torch.from_numpy(f["x"])})["y"], want)
    np.testing.assert_array_equal(prog.run(f)["y"], want)


def test_class_ids_are_checked_every_run():
    g = es.Graph()
    logits, targets = g.input("logits", (2, 4)), g.input("targets", (2,), "i64")
    g.output("loss", es.nn.cross_entropy(logits, targets))
    prog = es.compile(g, workers=1)
    good = {"logits": np.zeros((2, 4), np.float32), "targets": np.array([0, 3])}
    for _ in range(2):
        prog.run(good)
    with pytest.raises(FeedError, match=r"holds 4 at position \(1,\)"):
        prog.run(good | {"targets": np.array([0, 4])})
    with pytest.raises(FeedError, match=r"holds -1 at position \(0,\)"):
        prog.run(good | {"targets": np.array([-1, 0])})
    big = np.zeros(1000, np.int64)
    big[700] = 9  # past the small regions checked in Python
    g2 = es.Graph()
    lg, tg = g2.input("logits", (1000, 4)), g2.input("targets", (1000,), "i64")
    g2.output("loss", es.nn.cross_entropy(lg, tg))
    with pytest.raises(FeedError, match=r"holds 9 at position \(700,\)"):
        es.compile(g2, workers=1).run({"logits": np.zeros((1000, 4), np.float32), "targets": big})


def test_a_decode_step_replayed_equals_the_reference_on_the_same_state():
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    gen = Generator(cfg, init_params(cfg), workers=1)
    tokens, pads = gen._pad([[1, 2, 3]])
    length = 8
    gen._prefill(tokens, pads, length, False)
    sess = gen._session(("decode", 1, length, False))
    oracle = es.compile(gen._decode_graph(1, length, False), engine="reference")
    weights = {name: sess.resident.tensors[name] for name in cfg.parameter_shapes()}
    names = [n.name for n in oracle.graph.nodes if isinstance(n, InputNode) and n.name not in ("ids", "pos")]
    for t, token in zip(range(3, 7), [5, 9, 2, 60], strict=True):
        state = sess.state()
        step = {"ids": np.array([[token]], np.int64), "pos": np.array([[float(t)]], np.float32), "t": t}
        want = oracle.run({n: state[n] for n in names} | step)
        got = sess.run(step, fetch=["logits"])["logits"]
        np.testing.assert_allclose(got, want["logits"], rtol=1e-4, atol=1e-5)
        cache = sess.state()["cache_k0"]
        np.testing.assert_allclose(cache, want["cache_k0"], rtol=1e-5, atol=1e-6)
    for name, held in weights.items():  # the weights were never given up: the same blocks
        assert sess.resident.tensors[name] is held, name


def test_a_schedule_runs_again_with_its_bookkeeping_fresh():
    inputs, location = [(), (0,), (0, 1), (2, 2)], [0, 1, 0, 1]
    for workers in (1, 2):
        schedule = scheduler.Schedule(inputs, location=location, workers=workers, keep={1, 3})
        for k in range(3):  # the values each run computes are its own
            got = schedule.run(lambda i, args, k=k: sum(args) + i + k)
            one = 0 + k
            two = one + 1 + k
            three = one + two + 2 + k
            assert got == {1: two, 3: 2 * three + 3 + k}, (workers, k)


def test_an_in_order_run_frees_each_value_after_its_last_reader():
    seen: list[int] = []

    class Value:
        def __init__(self, i):
            self.i = i

        def __del__(self):
            seen.append(self.i)

    def execute(i, args):
        assert all(isinstance(a, Value) for a in args)
        return Value(i)

    schedule = scheduler.Schedule([(), (0,), (1,), (0, 2)], location=[0] * 4, workers=1, keep={3})
    out = schedule.run(execute)
    assert sorted(seen) == [0, 1, 2] and list(out) == [3]
