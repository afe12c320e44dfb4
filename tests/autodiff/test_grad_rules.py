"""Every VJP rule against central finite differences, plus folding, tie and error behaviour."""

import ast
from pathlib import Path

import numpy as np
import pytest
from gradcheck import check_grads, loss_only

import einsummable as es
from einsummable import nn
from einsummable.autodiff import rules
from einsummable.frontend.tensor import apply, select
from einsummable.ir.dtypes import to_numpy
from einsummable.ir.einsummable import AGGS, Einsummable
from einsummable.ir.graph import NODE_KINDS, Reshape


def run(g: es.Graph, feeds: dict) -> dict:
    return es.compile(g, engine="reference").run(feeds)


# ------------------------------------------------------------ the tables


def test_every_node_kind_has_a_rule():
    assert set(rules.VJP) == set(NODE_KINDS)


def test_every_aggregation_has_a_rule():
    assert set(rules.AGG_VJP) == {None, *AGGS}


def test_a_missing_rule_is_a_named_error(monkeypatch):
    monkeypatch.delitem(rules.VJP, Reshape)
    g = es.Graph()
    x = g.input("x", (2, 3), "f64")
    with pytest.raises(es.AutodiffError, match="no VJP rule for node kind Reshape"):
        es.grad(x.reshape(6).sum(), [x])


# ------------------------------------------------------------ einsummables, agg add or none

UNARY = ["exp(x0)", "tanh(x0)", "sigmoid(x0)", "silu(x0)", "gelu(x0)", "relu(x0)", "abs(x0)", "-x0",
         "x0 ** 3", "sin(x0)", "cos(x0)", "x0 * x0 - 2 * x0"]
POSITIVE = ["log(x0)", "sqrt(x0)", "rsqrt(x0)", "x0 ** -1.5", "1 / x0"]
BINARY = ["x0 + x1", "x0 - x1", "x0 * x1", "x0 / x1", "max(x0, x1)", "min(x0, x1)",
          "where(x0 > x1, x0 * x1, exp(x1))", "exp(x0 - x1) * x1"]


@pytest.mark.parametrize("join", UNARY)
def test_unary_joins(join):
    check_grads(lambda x: es.elementwise(join, x), {"x": (3, 4)})


@pytest.mark.parametrize("join", POSITIVE)
def test_joins_on_positive_inputs(join):
    check_grads(lambda x: es.elementwise(join, x), {"x": (3, 4)}, low=0.5, high=2.0)


@pytest.mark.parametrize("join", BINARY)
def test_binary_joins(join):
    check_grads(lambda x, y: es.elementwise(join, x, y), {"x": (3, 4), "y": (3, 4)}, low=0.5, high=2.0)


@pytest.mark.parametrize("shapes", [((3, 1), (4,)), ((2, 3, 4), (3, 1)), ((), (2, 3)), ((5,), (1,))])
def test_broadcasting(shapes):
    a, b = shapes
    check_grads(lambda x, y: x * y + x, {"x": a, "y": b})


@pytest.mark.parametrize("spec,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
    ("ij,ij->", [(3, 4), (3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ijk->kji", [(2, 3, 4)]),
    ("ij->j", [(3, 4)]),
    ("i->ij", [(3,)]),
])
def test_contractions_and_layouts(spec, shapes):
    if spec == "i->ij":
        build = lambda a: es.broadcast_to(a.reshape(3, 1), (3, 4))  # noqa: E731
    else:
        build = lambda *ts: es.einsum(spec, *ts)  # noqa: E731
    names = [f"x{k}" for k in range(len(shapes))]
    check_grads(lambda **kw: build(*(kw[n] for n in names)), dict(zip(names, shapes, strict=True)))


def test_fused_aggregation_with_a_non_product_join():
    """sum_j exp(x[i,j] - m[i]) * w[j]: the original system could not differentiate this."""
    def build(x, m, w):
        return es.einsum("ij,i,j->i", x, m, w, join="exp(x0 - x1) * x2", agg="add")

    check_grads(build, {"x": (3, 4), "m": (3,), "w": (4,)})


def test_a_join_that_reappears_in_its_derivative_is_read_back_not_recomputed():
    """d exp(x - y) = exp(x - y) (dx - dy): the gradient nodes read the forward's output."""
    g = es.Graph()
    x, y, w = (g.input(n, (3, 4), "f64") for n in "xyw")
    e = es.elementwise("exp(x0 - x1)", x, y)
    forward = len(g.ir.nodes)
    grads = es.grad((e * w).sum(), [x, y])
    for node in g.ir.nodes[forward:]:
        assert "exp" not in str(getattr(node, "op", ""))
    for name, d in zip(["dx", "dy"], grads, strict=True):
        g.output(name, d)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((3, 4)) for n in "xyw"}
    out = run(g, feeds)
    want = np.exp(feeds["x"] - feeds["y"]) * feeds["w"]
    np.testing.assert_allclose(out["dx"], want)
    np.testing.assert_allclose(out["dy"], -want)


def test_an_index_no_operand_reads_folds_into_a_factor():
    """d/dx of sum_{i,k} x[i] * 1 needs the size of k, which no operand carries."""
    g = es.Graph()
    x = g.input("x", (3,), "f64")
    y = es.broadcast_to(x.reshape(3, 1), (3, 5))
    (dx,) = es.grad(y.sum(), [x])
    g.output("dx", dx)
    np.testing.assert_array_equal(run(g, {"x": np.ones(3)})["dx"], np.full(3, 5.0))


def test_run_time_variables_in_joins():
    g = es.Graph()
    x = g.input("x", (3,), "f64")
    dq, dl = es.grad(("k" * x * x).sum(), [x]) + es.grad(("k" * x).sum(), [x])
    g.output("dq", dq)
    g.output("dl", dl)
    X = np.array([1.0, 2.0, -3.0])
    out = run(g, {"x": X, "k": 0.5})
    np.testing.assert_allclose(out["dq"], 2 * 0.5 * X)
    np.testing.assert_allclose(out["dl"], np.full(3, 0.5))


def test_cast_passes_the_gradient_back_in_the_input_dtype():
    g = es.Graph()
    x = g.input("x", (4,), "f64")
    c = g.input("c", (4,), "f32")
    (dx,) = es.grad((x.astype("f32") * c).sum(), [x])
    assert dx.dtype == "f64"
    g.output("dx", dx)
    C = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(run(g, {"x": np.ones(4), "c": C})["dx"], C.astype(np.float64))


# ------------------------------------------------------------ agg max, min, mul


@pytest.mark.parametrize("agg", ["max", "min", "mul"])
def test_reductions(agg):
    check_grads(lambda x: es.reduce(x, 1, agg), {"x": (3, 5)}, low=0.5, high=1.5)


@pytest.mark.parametrize("agg", ["max", "min", "mul"])
def test_fused_reductions(agg):
    """AGG_j (x[i,j] * w[j] + x[i,j]): the gradient reaches both operands through the join."""
    def build(x, w):
        return es.einsum("ij,j->i", x, w, join="x0 * x1 + x0", agg=agg)

    check_grads(build, {"x": (3, 4), "w": (4,)}, low=0.5, high=1.5)


def test_max_ties_split_the_gradient_equally():
    g = es.Graph()
    x = g.input("x", (2, 4), "f64")
    (dx,) = es.grad(x.max(1).sum(), [x])
    g.output("dx", dx)
    X = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0]])
    want = np.array([[0, 0.5, 0.5, 0], [0.25, 0.25, 0.25, 0.25]])
    np.testing.assert_array_equal(run(g, {"x": X})["dx"], want)


@pytest.mark.parametrize("row", [[2.0, 0.0, 3.0, 4.0], [0.0, 0.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
def test_product_is_exact_at_zeros(row):
    g = es.Graph()
    x = g.input("x", (4,), "f64")
    (dx,) = es.grad(x.prod(), [x])
    g.output("dx", dx)
    X = np.array(row)
    want = [np.prod(np.delete(X, k)) for k in range(4)]
    got = run(g, {"x": X})["dx"]
    np.testing.assert_array_equal(got, want)
    assert np.isfinite(got).all()


# ------------------------------------------------------------ structural kinds


def test_select_slices_concat_and_pad():
    check_grads(lambda x: x[1:, :2] * x[:2, 2:], {"x": (3, 4)})
    check_grads(lambda x, y: es.concat([x, y, x], 1), {"x": (3, 4), "y": (3, 2)})
    check_grads(lambda x: es.pad(x, [(1, 2), (0, 3)], value=7.0), {"x": (2, 3)})
    check_grads(lambda x: x[1, ...], {"x": (3, 4)})


def test_select_with_overlapping_pieces_sends_gradient_only_to_what_survives():
    def build(x, y):
        # x fills the output, then y overwrites the middle, then x's corner is read twice.
        return select((4, 4), [(x, ((0, 4), (0, 4)), (0, 0)), (y, ((0, 2), (0, 2)), (1, 1)),
                               (x, ((0, 2), (0, 2)), (2, 2))])

    grads = check_grads(build, {"x": (4, 4), "y": (2, 2)})
    reaches = np.ones((4, 4), dtype=bool)
    reaches[1:3, 1:3] = reaches[2:4, 2:4] = False  # overwritten copies of x carry nothing back
    reaches[0:2, 0:2] = True  # the corner is read again by the last piece
    np.testing.assert_array_equal(grads["x"] != 0, reaches)


def test_reshape_and_transpose():
    check_grads(lambda x: (x.reshape(2, 6).T * 2).reshape(3, 2, 2), {"x": (3, 4)})


def test_fill_gets_no_gradient_and_masks_pass_through():
    def build(x):
        return x * x.graph.tril((4, 4), outside=-2.0, dtype="f64") + x.graph.ramp((4, 4), (1, 1), dtype="f64")

    check_grads(build, {"x": (4, 4)})


def test_complex_view_and_a_holomorphic_complex_join():
    """A quadratic real function of f32 data through c64: central differences are exact."""
    rng = np.random.default_rng(1)
    g = es.Graph()
    x = g.input("x", (3, 4), "f32")
    w = g.input("w", (3, 2), "c64")
    z = es.view_as_complex(x) * w
    y = es.view_as_real(z * z.graph.full((3, 2), 1 - 2j, "c64"))
    loss = (y * y).sum()
    (dx, dw) = es.grad(loss, [x, w])
    g.output("dx", dx)
    g.output("dw", dw)
    g.output("loss", loss)
    X = rng.standard_normal((3, 4)).astype(np.float32)
    W = (rng.standard_normal((3, 2)) + 1j * rng.standard_normal((3, 2))).astype(np.complex64)
    prog = es.compile(g, engine="reference")
    out = prog.run({"x": X, "w": W})
    zc = (X[:, 0::2] + 1j * X[:, 1::2]) * W * (1 - 2j)
    # L = sum |z|^2, z = a*x; dL/dx (as a complex number) = 2 conj(a) z, per the convention.
    want = 2 * np.conj(W * (1 - 2j)) * zc
    np.testing.assert_allclose(out["dx"][:, 0::2], want.real, rtol=1e-4)
    np.testing.assert_allclose(out["dx"][:, 1::2], want.imag, rtol=1e-4)
    xc = X[:, 0::2] + 1j * X[:, 1::2]
    np.testing.assert_allclose(out["dw"], 2 * np.conj(xc * (1 - 2j)) * zc, rtol=1e-4)
    # and central differences: exact for a quadratic up to f32 rounding
    fwd = loss_only(g, loss)
    t = rng.standard_normal((3, 4)).astype(np.float32)
    eps = np.float32(1e-2)
    up, down = (fwd.run({"x": X + s * eps * t, "w": W})["loss"] for s in (1, -1))
    numeric = (up - down) / (2 * eps)
    np.testing.assert_allclose(np.vdot(out["dx"], t), numeric, rtol=1e-3)


def test_non_holomorphic_complex_joins_are_refused():
    g = es.Graph()
    x = g.input("x", (3, 4), "f32")
    loss = es.elementwise("real(x0)", es.view_as_complex(x)).sum()
    with pytest.raises(es.AutodiffError, match="not holomorphic"):
        es.grad(loss, [x])


# ------------------------------------------------------------ folding and the sweep


def test_constant_cotangents_fold_away():
    g = es.Graph()
    x = g.input("x", (3, 4), "f64")
    w = g.input("w", (3, 4), "f64")
    loss = (x * w).sum()
    n = len(g.ir)
    (dw,) = es.grad(loss, [w])
    assert dw.id == x.id and len(g.ir) == n, "d/dw sum(x*w) is x itself"
    total = x.sum()
    n = len(g.ir)
    (dx,) = es.grad(total, [x])
    assert len(g.ir) == n + 1 and type(dx.node).__name__ == "Fill", "d/dx sum(x) is one fill of ones"
    (dx,) = es.grad((x + w).mean(), [x])
    assert dx.node.kind.value == pytest.approx(1 / 12)


def test_contributions_are_summed_and_intermediates_can_be_targets():
    def build(x):
        h = x * x
        return h * h.exp() + x

    check_grads(build, {"x": (3,)})
    g = es.Graph()
    x = g.input("x", (3,), "f64")
    h = x * x
    dh, dx = es.grad((h * 3 + x).sum(), [h, x])
    g.output("dh", dh)
    g.output("dx", dx)
    out = run(g, {"x": np.array([1.0, 2.0, 3.0])})
    np.testing.assert_allclose(out["dh"], [3, 3, 3])
    np.testing.assert_allclose(out["dx"], [7, 13, 19])


def test_a_wrt_the_loss_does_not_use_gets_zeros():
    g = es.Graph()
    x = g.input("x", (3,), "f64")
    u = g.input("u", (2, 2), "f64")
    (du, _) = es.grad((x * x).sum(), [u, x])
    g.output("du", du)
    np.testing.assert_array_equal(run(g, {"x": np.ones(3), "u": np.ones((2, 2))})["du"], np.zeros((2, 2)))


def test_loss_must_be_scalar_unless_seeded():
    g = es.Graph()
    x = g.input("x", (3,), "f64")
    y = x * x
    with pytest.raises(es.AutodiffError, match="must be a real scalar"):
        es.grad(y, [x])
    s = g.input("s", (3,), "f64")
    (dx,) = es.grad(y, [x], seed=s)
    g.output("dx", dx)
    out = run(g, {"x": np.array([1.0, 2.0, 3.0]), "s": np.array([1.0, 0.0, -1.0])})
    np.testing.assert_allclose(out["dx"], [2.0, 0.0, -6.0])
    with pytest.raises(es.AutodiffError, match="shape and dtype"):
        es.grad(y, [x], seed=g.input("bad", (2,), "f64"))


def test_bad_arguments_are_named():
    g, h = es.Graph(), es.Graph()
    x = g.input("x", (3,), "f64")
    with pytest.raises(es.AutodiffError, match="list of tensors"):
        es.grad(x.sum(), x)
    with pytest.raises(es.AutodiffError, match=r"wrt\[0\]"):
        es.grad(x.sum(), [h.input("y", (3,))])
    with pytest.raises(es.AutodiffError, match="boolean"):
        es.grad(x.sum(), [x > 0])


def test_gradient_graph_validates_and_reads_no_partial():
    g = es.Graph()
    x = g.input("x", (3, 4), "f64")
    w = g.input("w", (4,), "f64")
    y = apply(Einsummable.from_spec("ij,j->i", [(3, 4), (4,)], join="exp(x0 * x1)", agg="max",
                                    dtypes=("f64", "f64")), [x, w])
    es.grad(y.sum(), [x, w])
    g.ir.validate()


def test_a_join_reading_one_subexpression_twice_runs():
    """d/dx 0.5*x*x simplifies to 0.5*x + 0.5*x: the compiled join reads one register twice."""
    check_grads(lambda x: es.elementwise("0.5 * x0 * x0", x), {"x": (3,)})


@pytest.mark.parametrize("f", [lambda x: (x.tanh() * x).sum(), lambda x: nn.logsumexp(x * x).sum(),
                               lambda x: nn.softmax(x).max()])
def test_second_order_gradients_are_gradients_too(f):
    """Gradient nodes are ordinary nodes, so they differentiate again: a Hessian check."""
    check_grads(lambda x: es.grad(f(x), [x])[0], {"x": (2, 3)})


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_gradients_keep_low_precision_dtypes(dtype):
    g = es.Graph()
    x, w = g.input("x", (3, 4), dtype), g.input("w", (4, 5), dtype)
    dx, dw = es.grad(nn.logsumexp(nn.rmsnorm(nn.matmul(x, w))).sum(), [x, w])
    assert (dx.dtype, dw.dtype) == (dtype, dtype)
    g.output("dx", dx)
    g.output("dw", dw)
    np_dtype = to_numpy(dtype)
    out = run(g, {"x": np.ones((3, 4), np_dtype), "w": np.eye(4, 5, dtype=np_dtype)})
    assert out["dx"].dtype == np_dtype and np.isfinite(out["dw"].astype(np.float32)).all()


def test_autodiff_and_optimizers_import_no_engine():
    """Gradients are graph nodes: nothing in autodiff or train/optim may reach downstream."""
    root = Path(es.__file__).parent
    for path in [*(root / "autodiff").glob("*.py"), root / "train" / "optim.py"]:
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        for name in names:
            assert not name.startswith(("einsummable.engines", "einsummable.compile", "einsummable.plan",
                                        "einsummable.lower")), f"{path.name} imports {name}"


def test_a_uniform_cotangent_through_a_pad_stays_uniform():
    g = es.Graph()
    x = g.input("x", (2, 3), "f64")
    total = es.pad(x, [(1, 1), (2, 0)]).sum()
    n = len(g.ir)
    (dx,) = es.grad(total, [x])
    assert len(g.ir) == n + 1 and dx.node.kind.value == 1.0
