"""Random graphs: gradients against central differences, and the exact inner-product identity
<f(t), c> = <t, f^T(c)> for random linear graphs."""

import numpy as np
from gradcheck import check_grads
from hypothesis import given, settings
from hypothesis import strategies as st

import einsummable as es
from einsummable.frontend.tensor import apply
from einsummable.ir.einsummable import AGGS, Einsummable

SMOOTH = ["tanh(x0)", "sigmoid(x0)", "sin(x0)", "0.5 * x0 * x0", "silu(x0)", "x0 * 0.5 + 1", "exp(-x0 * x0)"]
MIXING = ["x0 * x1", "x0 + x1", "tanh(x0 - x1)", "x0 * sigmoid(x1)", "max(x0, x1)"]
dims = st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple)


def _random_op(data, pool: list[es.Tensor]) -> es.Tensor:
    """One random einsummable over tensors already in the pool."""
    a = data.draw(st.sampled_from(pool[-2:] if len(pool) > 1 else pool))
    kind = data.draw(st.sampled_from(["unary", "binary", "reduce", "contract", "layout"]))
    if kind == "unary":
        return es.elementwise(data.draw(st.sampled_from(SMOOTH)), a)
    if kind == "binary":
        b = data.draw(st.sampled_from(pool))
        if a.shape != b.shape:
            b = es.reduce(b, None, "add") if b.ndim else b  # a scalar broadcasts against anything
        return es.elementwise(data.draw(st.sampled_from(MIXING)), a, b)
    if kind == "reduce" and a.ndim:
        axis = data.draw(st.integers(0, a.ndim - 1))
        join = data.draw(st.sampled_from(["x0", *SMOOTH]))
        return es.reduce(a, axis, data.draw(st.sampled_from(AGGS)), join=join)
    if kind == "contract" and a.ndim:
        # contract a's last axis with a fresh input of shape (n, k): a join-generalised matmul
        n, k = a.shape[-1], data.draw(st.integers(1, 3))
        w = a.graph.input(f"w{len(pool)}", (n, k), "f64")
        pool.append(w)
        rank = a.ndim
        join_shape = (*a.shape[:-1], k, n)
        op = Einsummable(join_shape, ((*range(rank - 1), rank), (rank, rank - 1)), rank,
                         es.ir.scalar.parse(data.draw(st.sampled_from(["x0 * x1", "exp(x0 - x1)"]))),
                         data.draw(st.sampled_from(AGGS)), ("f64", "f64"))
        return apply(op, [a, w])
    if a.ndim >= 2:
        return a.transpose()[..., : max(1, a.shape[0] - 1)]
    return es.concat([a.reshape(-1), a.reshape(-1)], 0)


@settings(max_examples=40)
@given(st.lists(dims, min_size=1, max_size=3), st.integers(1, 5), st.data())
def test_random_graphs_match_finite_differences(shapes, depth, data):
    names = {f"x{k}": s for k, s in enumerate(shapes)}

    def build(**ins):
        pool = list(ins.values())
        for _ in range(depth):
            pool.append(_random_op(data, pool))
        return pool[-1]

    check_grads(build, names, low=0.2, high=1.0, directions=2, rtol=1e-5, atol=1e-8)


LINEAR = ["transpose", "slice", "pad", "concat", "reshape", "matmul", "broadcast", "scale", "sum"]


@settings(max_examples=40)
@given(dims, st.lists(st.sampled_from(LINEAR), min_size=1, max_size=5), st.integers(0, 1000))
def test_inner_product_identity_on_linear_graphs(shape, steps, seed):
    rng = np.random.default_rng(seed)
    g = es.Graph()
    x = g.input("x", shape, "f64")
    y = x
    for step in steps:
        if step == "transpose":
            y = y.transpose()
        elif step == "slice" and y.ndim and y.shape[0] > 1:
            y = y[1:]
        elif step == "pad" and y.ndim:
            y = es.pad(y, [(1, 0)] + [(0, 1)] * (y.ndim - 1), value=3.0)
        elif step == "concat" and y.ndim:
            y = es.concat([y, y[:1]], 0)
        elif step == "reshape":
            y = y.reshape(-1)
        elif step == "matmul" and y.ndim:
            m = g.input(f"m{len(g.ir)}", (y.shape[-1], 2), "f64")
            y = es.einsum("...j,jk->...k", y, m)
        elif step == "broadcast":
            y = es.broadcast_to(y, (2, *y.shape))
        elif step == "scale":
            y = y * 2.5 - y * 0.5
        elif step == "sum" and y.ndim:
            y = y.sum(0)
    c = g.input("c", y.shape, "f64")
    (xt,) = es.grad((y * c).sum() if y.ndim else y * c, [x])
    g.output("y", y)
    g.output("xt", xt)
    feeds = {n.name: rng.standard_normal(n.shape) for n in g.ir.nodes if type(n).__name__ == "InputNode"}
    t = feeds["x"]
    out = es.compile(g, engine="reference").run(feeds)
    if "pad" in steps:  # padding adds a constant: f(t) - f(0) is the linear part
        out["y"] = out["y"] - es.compile(g, engine="reference").run({**feeds, "x": np.zeros(shape)})["y"]
    np.testing.assert_allclose(np.vdot(out["y"], feeds["c"]), np.vdot(t, out["xt"]), rtol=1e-10, atol=1e-10)
