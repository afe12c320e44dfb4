"""Issue 20 item 3, the rest of numpy's surface on a Tensor: step slicing, ``2 ** x``,
argmax/argmin, var/std, es.stack and float promotion, each against numpy; boolean masks
are a clear error."""

import numpy as np
import pytest

import einsummable as es

X = np.random.default_rng(1).standard_normal((5, 6, 4)).astype(np.float32)
X[1, 2, :] = X[1, 2, 0]  # ties: argmax/argmin take the first, as numpy does


def _run(build, x_value=X):
    g = es.Graph()
    x = g.input("x", x_value.shape)
    g.output("y", build(x))
    return es.compile(g, engine="reference").run({"x": x_value})["y"]


@pytest.mark.parametrize("key", [
    np.s_[::2], np.s_[1::3], np.s_[::-1], np.s_[:, ::2], np.s_[..., ::-2], np.s_[3:0:-2, 1, None, ::3],
    np.s_[None, 1:5:2], np.s_[-1, ::4],
])
def test_step_slicing_matches_numpy(key):
    np.testing.assert_array_equal(_run(lambda x: x[key]), X[key])


@pytest.mark.parametrize(("build", "oracle"), [
    (lambda x: 2 ** x, lambda a: 2.0 ** a),
    (lambda x: 0.5 ** x, lambda a: 0.5 ** a),
    (lambda x: x.var(), lambda a: a.var()),
    (lambda x: x.var(axis=1, keepdims=True), lambda a: a.var(axis=1, keepdims=True)),
    (lambda x: x.std(axis=(0, 2), ddof=1), lambda a: a.std(axis=(0, 2), ddof=1)),
    (lambda x: x.argmax(axis=-1), lambda a: a.argmax(axis=-1)),
    (lambda x: x.argmin(axis=1), lambda a: a.argmin(axis=1)),
    (lambda x: x.argmax(axis=0, keepdims=True), lambda a: a.argmax(axis=0, keepdims=True)),
    (lambda x: x.argmax(), lambda a: a.argmax()),
    (lambda x: es.stack([x, x * 2.0, -x], axis=1), lambda a: np.stack([a, a * 2, -a], axis=1)),
    (lambda x: es.stack([x[0], x[1]], axis=-1), lambda a: np.stack([a[0], a[1]], axis=-1)),
])
def test_numpy_surface_matches_numpy(build, oracle):
    np.testing.assert_allclose(_run(build), oracle(X), rtol=1e-5, atol=1e-6)


def test_f16_with_f32_promotes_like_numpy():
    g = es.Graph()
    a, b = g.input("a", (4,), dtype="f16"), g.input("b", (4,), dtype="f32")
    y = a * b + a
    assert y.dtype == "f32"
    g.output("y", y)
    av = np.array([1.5, -2.0, 3.25, 0.1], np.float16)
    bv = np.array([0.3, 1.7, -2.2, 4.0], np.float32)
    out = es.compile(g, engine="reference").run({"a": av, "b": bv})["y"]
    np.testing.assert_allclose(out, av * bv + av, rtol=1e-6)
    assert (av * bv + av).dtype == np.float32


def test_masks_and_bad_bases_are_clear_errors():
    g = es.Graph()
    x = g.input("x", (4,))
    with pytest.raises(es.ShapeError, match="mask.*es.where"):
        x[x > 0]
    with pytest.raises(es.ShapeError, match="mask"):
        x[np.array([True, False, True, False])]
    with pytest.raises(es.DtypeError, match="positive Python number as base"):
        (-2) ** x
    with pytest.raises(es.ShapeError, match="out of range"):
        x.argmax(axis=3)
    with pytest.raises(es.ShapeError, match="one shape"):
        es.stack([x, g.input("z", (3,))])
