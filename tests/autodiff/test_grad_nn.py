"""Gradients of every nn helper and es.einsum, and two hand-derived closed forms."""

import numpy as np
import pytest
from gradcheck import check_grads

import einsummable as es
from einsummable import nn

ROWS = {"x": (3, 5)}


@pytest.mark.parametrize("helper", [nn.softmax, nn.log_softmax, nn.logsumexp, nn.relu, nn.gelu, nn.silu,
                                    nn.rmsnorm, nn.layernorm])
def test_unary_helpers(helper):
    check_grads(helper, ROWS, low=-2.0, high=2.0)


def test_softmax_family_over_a_leading_axis():
    check_grads(lambda x: nn.softmax(x, axis=0) * nn.logsumexp(x, axis=0), {"x": (4, 3)})


def test_norms_with_weight_and_bias():
    check_grads(lambda x, w: nn.rmsnorm(x, w), {"x": (3, 5), "w": (5,)})
    check_grads(lambda x, w, b: nn.layernorm(x, w, b), {"x": (2, 3, 5), "w": (5,), "b": (5,)})


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_class_ids(reduction):
    ids = np.array([0.0, 4.0, 2.0])
    check_grads(lambda x, t: nn.cross_entropy(x, t, reduction=reduction), {"x": (3, 5), "t": (3,)},
                values={"t": ids}, fixed=("t",))


def test_cross_entropy_with_probabilities():
    probs = np.random.default_rng(3).dirichlet(np.ones(5), size=3)
    check_grads(lambda x, p: nn.cross_entropy(x, p), {"x": (3, 5), "p": (3, 5)}, values={"p": probs})


@pytest.mark.parametrize("shapes", [((3, 4), (4, 2)), ((2, 3, 4), (4, 2)), ((4,), (4, 2)), ((3, 4), (4,)),
                                    ((4,), (4,))])
def test_matmul(shapes):
    a, b = shapes
    check_grads(lambda x, y: nn.matmul(x, y), {"x": a, "y": b})


@pytest.mark.parametrize("spec,shapes", [
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("ii->i", [(3, 3)]),
    ("ij,ij->i", [(3, 4), (3, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 2)]),
    ("ij,jk", [(2, 3), (3, 2)]),
])
def test_einsum(spec, shapes):
    names = [f"x{k}" for k in range(len(shapes))]
    check_grads(lambda **kw: es.einsum(spec, *(kw[n] for n in names)), dict(zip(names, shapes, strict=True)))


def test_einsum_with_a_custom_join_and_agg():
    check_grads(lambda x, y: es.einsum("ij,jk->ik", x, y, join="exp(x0 - x1)", agg="max"),
                {"x": (2, 3), "y": (3, 4)})


# ------------------------------------------------------------ closed forms


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_softmax_cross_entropy_closed_form():
    """d/dz mean_n (logsumexp(z_n) - z_n[t_n]) = (softmax(z) - onehot(t)) / N."""
    rng = np.random.default_rng(0)
    n, c = 6, 4
    g = es.Graph()
    z = g.input("z", (n, c), "f64")
    t = g.input("t", (n,), "f64")
    (dz,) = es.grad(nn.cross_entropy(z, t), [z])
    g.output("dz", dz)
    Z = rng.standard_normal((n, c)) * 3
    T = rng.integers(0, c, n)
    got = es.compile(g, engine="reference").run({"z": Z, "t": T.astype(np.float64)})["dz"]
    np.testing.assert_allclose(got, (_softmax(Z) - np.eye(c)[T]) / n, rtol=1e-12, atol=1e-15)


def test_mlp_closed_form():
    """A two-layer ReLU MLP under mean squared error, against hand-written backprop."""
    rng = np.random.default_rng(1)
    n, d, h, o = 5, 4, 6, 3
    g = es.Graph()
    x, y = g.input("x", (n, d), "f64"), g.input("y", (n, o), "f64")
    w1, b1 = g.input("w1", (d, h), "f64"), g.input("b1", (h,), "f64")
    w2, b2 = g.input("w2", (h, o), "f64"), g.input("b2", (o,), "f64")
    p = nn.matmul(nn.relu(nn.matmul(x, w1) + b1), w2) + b2
    loss = ((p - y) ** 2).sum() * (0.5 / n)
    names = ["x", "w1", "b1", "w2", "b2"]
    for name, t in zip(names, es.grad(loss, [x, w1, b1, w2, b2]), strict=True):
        g.output(name, t)
    F = {"x": rng.standard_normal((n, d)), "y": rng.standard_normal((n, o)),
         "w1": rng.standard_normal((d, h)), "b1": rng.standard_normal(h),
         "w2": rng.standard_normal((h, o)), "b2": rng.standard_normal(o)}
    got = es.compile(g, engine="reference").run(F)
    pre = F["x"] @ F["w1"] + F["b1"]
    hid = np.maximum(pre, 0)
    dp = (hid @ F["w2"] + F["b2"] - F["y"]) / n
    dpre = (dp @ F["w2"].T) * (pre > 0)
    want = {"w2": hid.T @ dp, "b2": dp.sum(0), "w1": F["x"].T @ dpre, "b1": dpre.sum(0),
            "x": dpre @ F["w1"].T}
    for name in names:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-14, err_msg=name)
