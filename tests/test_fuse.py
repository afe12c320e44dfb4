"""Fusion of elementwise chains (ir/fuse.py): the fused graph computes the unfused graph's
outputs (the reference engine on both is the oracle; a product of several operands may
be multiplied in another order, so floats agree to rounding), with fewer einsums, and
never computes a value twice."""

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import einsummable as es
from einsummable.engines import reference
from einsummable.ir.expr import depth
from einsummable.ir.fuse import MAX_DEPTH, fuse
from einsummable.ir.graph import EinsumNode
from graphgen import random_graph


def einsums(g):
    return [n for n in g.nodes if isinstance(n, EinsumNode)]


def same_outputs(g, feeds, variables=None):
    want = reference.run(g, feeds, variables)
    got = reference.run(fuse(g), feeds, variables)
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_graphs_fuse_to_the_same_outputs(seed):
    g, feeds = random_graph(random.Random(seed), n_ops=random.Random(seed).randint(1, 12))
    with np.errstate(all="ignore"):
        same_outputs(g.ir, feeds)


def test_softmax_numerator_and_its_sum_are_one_pass():
    """exp(x - m) summed: the exp's value is never written; the sum reads x and m."""
    g = es.Graph()
    x = g.input("x", (8, 16))
    m = es.einsum("ij->i", x, agg="max")
    e = es.elementwise("exp(x0)", x - m[:, None])
    g.output("s", es.einsum("ij->i", e, agg="add"))
    fused = fuse(g.ir)
    assert len(einsums(fused)) < len(einsums(g.ir))
    summed = [n for n in einsums(fused) if n.op.agg == "add"]
    assert len(summed) == 1 and "exp" in str(summed[0].op.join) and len(summed[0].op.inputs) == 2
    same_outputs(g.ir, {"x": np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)})


def test_a_value_read_twice_broadcast_or_returned_is_not_folded():
    g = es.Graph()
    x, v = g.input("x", (4, 6)), g.input("v", (6,))
    twice = es.elementwise("exp(x0)", x)  # read by two einsums
    g.output("a", twice * 2.0)
    g.output("b", twice + 1.0)
    wide = es.elementwise("exp(x0)", v)  # broadcast over x's rows: folding it would compute it 4 times
    g.output("c", x * wide[None, :])
    kept = es.elementwise("sin(x0)", x)  # an output itself
    g.output("d", kept)
    g.output("e", kept * 3.0)
    ir = g.ir
    fused = fuse(ir)
    joins = [str(n.op.join) for n in einsums(fused)]
    assert sum("exp" in j for j in joins) == 2 and sum("sin" in j for j in joins) == 1
    rng = np.random.default_rng(1)
    same_outputs(ir, {"x": rng.standard_normal((4, 6)).astype(np.float32),
                      "v": rng.standard_normal(6).astype(np.float32)})


def test_half_precision_values_are_rounded_where_they_are_written():
    g = es.Graph()
    x = g.input("x", (16,), "bf16")
    g.output("y", es.elementwise("exp(x0)", x) * 3.0)
    assert len(einsums(fuse(g.ir))) == len(einsums(g.ir))


def test_a_long_chain_folds_in_pieces_of_bounded_depth():
    g = es.Graph()
    t = g.input("x", (4,))
    for _ in range(500):
        t = es.elementwise("x0 * 0.5 + 1", t)
    g.output("y", t)
    fused = fuse(g.ir)
    assert 1 < len(einsums(fused)) < 100
    assert all(depth(n.op.join) <= MAX_DEPTH for n in einsums(fused))
    same_outputs(g.ir, {"x": np.arange(4, dtype=np.float32)})


def test_compile_plans_the_fused_graph_and_matches_the_reference():
    g = es.Graph()
    x, w = g.input("x", (32, 16)), g.input("w", (16, 8))
    h = x @ w
    g.output("y", es.einsum("ij->i", es.elementwise("exp(x0)", h - 1.0) * 2.0, agg="add"))
    prog = es.compile(g, workers=2)
    assert len(einsums(prog.plan.graph)) < len(einsums(g.ir))
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((32, 16)).astype(np.float32),
             "w": rng.standard_normal((16, 8)).astype(np.float32)}
    np.testing.assert_allclose(prog.run(feeds)["y"], reference.run(g.ir, feeds)["y"], rtol=1e-5)


def test_softmax_backward_is_two_passes_over_the_block():
    """softmax's gradient y * (dy - sum(y * dy)): the row sum and the final join, each one
    pass over the [rows, cols] block (four einsums over it before fusion)."""
    g = es.Graph()
    x, dy = g.input("x", (8, 16)), g.input("dy", (8, 16))
    loss = es.einsum("ij,ij->", es.nn.softmax(x, axis=-1), dy, agg="add")
    (gx,) = es.grad(loss, [x])
    g.output("loss", loss)
    g.output("gx", gx)

    def backward_passes(ir):
        forward = ir.live(roots=[ir.outputs["loss"]])
        return sum(1 for v, n in enumerate(ir.nodes)
                   if isinstance(n, EinsumNode) and not forward[v] and n.op.join_shape == (8, 16))

    assert backward_passes(g.ir) == 4 and backward_passes(fuse(g.ir)) == 2
    rng = np.random.default_rng(3)
    same_outputs(g.ir, {"x": rng.standard_normal((8, 16)).astype(np.float32),
                        "dy": rng.standard_normal((8, 16)).astype(np.float32)})
