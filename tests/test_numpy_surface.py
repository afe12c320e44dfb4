"""What a numpy user reaches for on a Tensor: len(x), np.sum(x) and friends, negative axes,
``keepdims`` on logsumexp; numpy is the oracle, and what a graph cannot do is a clear error."""

import numpy as np
import pytest

import einsummable as es


def _run(x_value, build):
    g = es.Graph()
    x = g.input("x", x_value.shape)
    g.output("y", build(x))
    return es.compile(g, engine="reference").run({"x": x_value})["y"]


X = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)


@pytest.mark.parametrize(("build", "oracle"), [
    (lambda x: np.sum(x), lambda a: np.sum(a)),
    (lambda x: np.sum(x, axis=1, keepdims=True), lambda a: np.sum(a, axis=1, keepdims=True)),
    (lambda x: np.mean(x, 0), lambda a: np.mean(a, 0)),
    (lambda x: np.max(x, axis=-1), lambda a: np.max(a, axis=-1)),
    (lambda x: np.amin(x, axis=(0, 2)), lambda a: np.amin(a, axis=(0, 2))),
    (lambda x: np.prod(x, axis=2), lambda a: np.prod(a, axis=2)),
    (lambda x: np.transpose(x), lambda a: np.transpose(a)),
    (lambda x: np.transpose(x, (0, -1, -2)), lambda a: np.transpose(a, (0, -1, -2))),
    (lambda x: x.transpose(-1, 0, 1), lambda a: a.transpose(-1, 0, 1)),
    (lambda x: np.reshape(x, (6, 4)), lambda a: np.reshape(a, (6, 4))),
])
def test_numpy_functions_on_a_tensor_match_numpy(build, oracle):
    np.testing.assert_allclose(_run(X, build), oracle(X), rtol=1e-5, atol=1e-6)


def test_len_is_the_first_axis():
    g = es.Graph()
    x = g.input("x", (5, 3))
    assert len(x) == len(np.empty((5, 3))) == 5
    with pytest.raises(es.ShapeError, match="0-d"):
        len(x.sum())


def test_numpy_calls_a_graph_cannot_honour_are_clear_errors():
    g = es.Graph()
    x = g.input("x", (2, 3))
    with pytest.raises(es.GraphError, match="out"):
        np.sum(x, out=np.empty(()))
    with pytest.raises(es.GraphError, match="cumsum does not run on an einsummable Tensor"):
        np.cumsum(x)


def test_logsumexp_keepdims_broadcasts_back_like_numpy():
    def oracle(a, axis):
        m = a.max(axis, keepdims=True)
        return m + np.log(np.exp(a - m).sum(axis, keepdims=True))

    for axis in (1, -1, 0):
        out = _run(X, lambda x, axis=axis: x - es.nn.logsumexp(x, axis=axis, keepdims=True))
        np.testing.assert_allclose(out, X - oracle(X, axis), rtol=1e-5, atol=1e-5)
