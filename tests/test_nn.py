"""Every nn helper against plain numpy, and proof that they add no node kinds."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import einsummable as es
from einsummable.ir.graph import EinsumNode, Fill, Formation, InputNode, Reshape

shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5)


def arrays(shape, seed, low=-3.0, high=3.0):
    return np.random.default_rng(seed).uniform(low, high, shape)


def np_softmax(a, axis):
    e = np.exp(a - a.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def build(shape, fn, *extra_shapes):
    g = es.Graph()
    x = g.input("x", shape, "f64")
    extras = [g.input(f"e{k}", s, "f64") for k, s in enumerate(extra_shapes)]
    g.output("y", fn(x, *extras))
    allowed = (InputNode, EinsumNode, Formation, Fill, Reshape)
    assert all(isinstance(n, allowed) for n in g.ir.nodes), "helpers must lower to einsummables"
    return es.compile(g, engine="reference")


@given(shapes, st.integers(0, 1000), st.data())
def test_softmax_family(shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    X = arrays(shape, seed)
    for fn, ref in [
        (lambda x: es.nn.softmax(x, axis), np_softmax(X, axis)),
        (lambda x: es.nn.log_softmax(x, axis), np.log(np_softmax(X, axis))),
        (lambda x: es.nn.logsumexp(x, axis), np.log(np.exp(X).sum(axis))),
    ]:
        got = build(shape, fn).run({"x": X})["y"]
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)


@given(shapes, st.integers(0, 1000))
def test_activations(shape, seed):
    X = arrays(shape, seed)
    c = math.sqrt(2 / math.pi)
    for fn, ref in [
        (es.nn.relu, np.maximum(X, 0)),
        (es.nn.silu, X / (1 + np.exp(-X))),
        (es.nn.gelu, 0.5 * X * (1 + np.tanh(c * (X + 0.044715 * X**3)))),
    ]:
        np.testing.assert_allclose(build(shape, fn).run({"x": X})["y"], ref, rtol=1e-10, atol=1e-12)


@given(shapes, st.integers(0, 1000))
def test_norms(shape, seed):
    X = arrays(shape, seed)
    W = arrays(shape[-1:], seed + 1)
    B = arrays(shape[-1:], seed + 2)
    rms = build(shape, lambda x, w: es.nn.rmsnorm(x, w, eps=1e-6), W.shape)
    ref = X / np.sqrt((X**2).mean(-1, keepdims=True) + 1e-6) * W
    np.testing.assert_allclose(rms.run({"x": X, "e0": W})["y"], ref, rtol=1e-9)
    ln = build(shape, lambda x, w, b: es.nn.layernorm(x, w, b, eps=1e-5), W.shape, B.shape)
    mu, var = X.mean(-1, keepdims=True), X.var(-1, keepdims=True)
    np.testing.assert_allclose(ln.run({"x": X, "e0": W, "e1": B})["y"],
                               (X - mu) / np.sqrt(var + 1e-5) * W + B, rtol=1e-9, atol=1e-12)


@given(st.integers(1, 6), st.integers(2, 7), st.integers(0, 1000))
def test_cross_entropy_with_labels_and_probabilities(n, c, seed):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, c))
    labels = rng.integers(0, c, n)
    logp = np.log(np_softmax(logits, -1))
    with_labels = build((n, c), es.nn.cross_entropy, (n,))
    got = with_labels.run({"x": logits, "e0": labels.astype(np.float64)})["y"]
    np.testing.assert_allclose(got, -logp[np.arange(n), labels].mean(), rtol=1e-10)
    probs = np_softmax(rng.standard_normal((n, c)), -1)
    soft = build((n, c), lambda x, t: es.nn.cross_entropy(x, t, reduction="sum"), (n, c))
    np.testing.assert_allclose(soft.run({"x": logits, "e0": probs})["y"], -(probs * logp).sum(), rtol=1e-10)


@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.integers(0, 99))
def test_batched_matmul(b, m, k, n, seed):
    A, B = arrays((b, m, k), seed), arrays((k, n), seed + 1)
    prog = build(A.shape, lambda x, w: es.nn.matmul(x, w), B.shape)
    np.testing.assert_allclose(prog.run({"x": A, "e0": B})["y"], A @ B, rtol=1e-10)


def test_softmax_makes_three_passes_over_its_input():
    """A max, a summed exp and the exp divided by that sum: three nodes, each over the input."""
    g = es.Graph()
    g.output("y", es.nn.softmax(g.input("x", (4, 8))))
    ops = [n.op for n in g.ir.nodes if isinstance(n, EinsumNode)]
    assert sorted(op.join_shape for op in ops) == [(4, 8), (4, 8), (4, 8)]


@pytest.mark.parametrize("centre", [0.0, 40.0, 100.0])
def test_bf16_softmax_stays_close_to_the_exact_one(centre):
    """logsumexp rounded to bf16 would scale whole rows (25% at a centre of 100)."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 64)) * 3 + centre).astype(ml_dtypes.bfloat16)
    g = es.Graph()
    g.output("y", es.nn.softmax(g.input("x", x.shape, "bf16")))
    y = es.compile(g, engine="reference").run({"x": x})["y"].astype(np.float64)
    e = np.exp(x.astype(np.float64) - x.astype(np.float64).max(-1, keepdims=True))
    exact = e / e.sum(-1, keepdims=True)
    assert np.max(np.abs(y - exact) / exact) < 0.08  # x - max itself rounds to bf16
    np.testing.assert_allclose(y.sum(-1), 1.0, atol=0.03)
