"""EinGraph node kinds, validation, the text form and DOT, through the reference engine."""

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import einsummable as es
from einsummable.errors import DtypeError, FeedError, GraphError, ShapeError
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.graph import NODE_KINDS, EinsumNode, InputNode, Select


def run(g, feeds):
    return es.compile(g, engine="reference").run(feeds)


def test_text_form_is_readable_and_stable():
    g = es.Graph()
    x = g.input("x", (4, 3))
    w = g.input("w", (3, 2))
    h = es.einsum("ij,jk->ik", x, w)
    g.output("y", es.nn.relu(h))
    assert str(g) == (
        "graph(x: f32[4,3], w: f32[3,2]) {\n"
        "  %2 = einsum[ac,cb->ab x0 * x1 agg=add] x w  : f32[4,2] partial\n"
        "  %3 = formation %2  : f32[4,2]\n"
        "  %4 = einsum[ab->ab relu(x0)] %3  : f32[4,2]\n"
        "  return y=%4\n"
        "}"
    )


def test_public_surface_example():
    rng = np.random.default_rng(0)
    g = es.Graph()
    x = g.input("x", (64, 32))
    w = g.input("w", (32, 16))
    b = g.input("b", (16,))
    h = es.einsum("ij,jk->ik", x, w)
    h = es.einsum("ij,j->ij", h, b, join="relu(x0 + x1)")
    m = es.einsum("ij->i", h, agg="max")
    loss = (m * m).sum()
    g.output("m", m)
    g.output("loss", loss)
    X, W, B = (rng.standard_normal(s).astype(np.float32) for s in [(64, 32), (32, 16), (16,)])
    out = es.compile(g, engine="reference").run({"x": X, "w": W, "b": B})
    ref_m = np.maximum(X @ W + B, 0).max(1)
    np.testing.assert_allclose(out["m"], ref_m, rtol=1e-5)
    np.testing.assert_allclose(out["loss"], (ref_m**2).sum(), rtol=1e-4)
    assert out["m"].dtype == np.float32


def test_fill_kinds():
    g = es.Graph()
    g.output("c", g.full((2, 3), 7.0))
    g.output("t", g.tril((3, 3), inside=0.0, outside=-np.inf))
    g.output("r", g.ramp((2, 3), steps=(10.0, 1.0), start=5.0))
    out = run(g, {})
    np.testing.assert_array_equal(out["c"], np.full((2, 3), 7.0))
    np.testing.assert_array_equal(out["t"], np.where(np.tril(np.ones((3, 3))) > 0, 0.0, -np.inf))
    np.testing.assert_array_equal(out["r"], 5 + 10 * np.arange(2)[:, None] + np.arange(3)[None, :])


def test_select_slice_concat_pad():
    rng = np.random.default_rng(1)
    A = rng.standard_normal((4, 5)).astype(np.float32)
    B = rng.standard_normal((2, 5)).astype(np.float32)
    g = es.Graph()
    a, b = g.input("a", A.shape), g.input("b", B.shape)
    g.output("slice", a[1:3, -2:])
    g.output("row", a[2])
    g.output("newaxis", a[None, :, 0])
    g.output("ellipsis", a[..., 1])
    g.output("concat", es.concat([a, b], axis=0))
    assert es.concat([b], axis=1).id == b.id  # one tensor: itself, no copy node
    g.output("pad", es.pad(b, [(1, 0), (0, 2)], value=-1.0))
    out = run(g, {"a": A, "b": B})
    np.testing.assert_array_equal(out["slice"], A[1:3, -2:])
    np.testing.assert_array_equal(out["row"], A[2])
    np.testing.assert_array_equal(out["newaxis"], A[None, :, 0])
    np.testing.assert_array_equal(out["ellipsis"], A[..., 1])
    np.testing.assert_array_equal(out["concat"], np.concatenate([A, B]))
    np.testing.assert_array_equal(out["pad"], np.pad(B, [(1, 0), (0, 2)], constant_values=-1))


def test_reshape_transpose_broadcast_and_cast():
    A = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    g = es.Graph()
    a = g.input("a", A.shape)
    g.output("reshape", a.reshape(6, -1))
    g.output("transpose", a.transpose(2, 0, 1))
    g.output("T", a[0].T)
    g.output("broadcast", es.broadcast_to(a[:, :1, :], (2, 3, 4)))
    g.output("cast", a.astype("f16"))
    g.output("mean", a.mean(axis=(0, 2)))
    g.output("keep", a.sum(1, keepdims=True))
    out = run(g, {"a": A})
    np.testing.assert_array_equal(out["reshape"], A.reshape(6, -1))
    np.testing.assert_array_equal(out["transpose"], A.transpose(2, 0, 1))
    np.testing.assert_array_equal(out["T"], A[0].T)
    np.testing.assert_array_equal(out["broadcast"], np.broadcast_to(A[:, :1, :], A.shape))
    assert out["cast"].dtype == np.float16
    np.testing.assert_allclose(out["mean"], A.mean(axis=(0, 2)))
    np.testing.assert_allclose(out["keep"], A.sum(1, keepdims=True))


def test_operators_follow_numpy_broadcasting():
    rng = np.random.default_rng(2)
    A = rng.uniform(0.5, 2, (3, 1, 4)).astype(np.float64)
    B = rng.uniform(0.5, 2, (5, 1)).astype(np.float64)
    g = es.Graph()
    a, b = g.input("a", A.shape, "f64"), g.input("b", B.shape, "f64")
    g.output("arith", (a + b) * 2 - a / b + (-a) ** 2 + 1 / a + abs(a - 3))
    g.output("cmp", es.where(a > b, a, b))
    g.output("mask", a < b)
    out = run(g, {"a": A, "b": B})
    np.testing.assert_allclose(out["arith"], (A + B) * 2 - A / B + (-A) ** 2 + 1 / A + abs(A - 3))
    np.testing.assert_allclose(out["cmp"], np.where(A > B, A, B))
    assert out["mask"].dtype == np.bool_
    np.testing.assert_array_equal(out["mask"], A < B)


def test_complex_view_round_trip():
    Z = np.arange(8, dtype=np.float32).reshape(2, 4)
    g = es.Graph()
    z = g.input("z", Z.shape)
    c = es.view_as_complex(z)
    back = es.view_as_real(c * 2)
    g.output("c", c)
    g.output("back", back)
    out = run(g, {"z": Z})
    np.testing.assert_array_equal(out["c"], Z.view(np.complex64))
    np.testing.assert_array_equal(out["back"], 2 * Z)
    with pytest.raises(ShapeError, match="2n"):
        es.view_as_complex(g.input("odd", (3,)))


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "f64", "c64"])
def test_every_dtype_runs(dtype):
    from einsummable.ir.dtypes import to_numpy

    A = (np.arange(6).reshape(2, 3) / 4).astype(to_numpy(dtype))
    g = es.Graph()
    a = g.input("a", A.shape, dtype)
    g.output("y", es.einsum("ij,kj->ik", a, a))
    out = run(g, {"a": A})["y"]
    assert out.dtype == to_numpy(dtype)
    ref = A.astype(np.complex128 if dtype == "c64" else np.float64)
    np.testing.assert_allclose(out.astype(ref.dtype), ref @ ref.T, rtol=2e-2)


def test_validation_names_the_bad_node():
    g = es.Graph()
    x = g.input("x", (2, 3))
    partial = g.ir.add(EinsumNode(Einsummable.from_spec("ij->i", [(2, 3)], agg="add"), (x.id,)))
    with pytest.raises(GraphError, match="partial"):
        g.ir.add(EinsumNode(Einsummable.from_spec("i->i", [(2,)]), (partial,)))
    with pytest.raises(ShapeError, match=r"\(3, 3\)"):
        g.ir.add(EinsumNode(Einsummable.from_spec("ij->i", [(3, 3)], agg="add"), (x.id,)))
    with pytest.raises(GraphError, match="precede"):
        g.ir.add(EinsumNode(Einsummable.from_spec("i->i", [(2,)]), (99,)))
    with pytest.raises(GraphError, match="named 'x'"):
        g.input("x", (1,))
    with pytest.raises(ShapeError):
        g.ir.add(Select((x.id,), (es.ir.graph.Piece(0, ((0, 5), (0, 1)), (0, 0)),), (2, 1), "f32"))
    with pytest.raises(ShapeError, match="reshape"):
        x.reshape(7)
    with pytest.raises(DtypeError):
        g.input("bad", (2,), "int8")
    with pytest.raises(GraphError, match="partial"):
        g.ir.set_output("p", partial)


def test_every_node_kind_prints_and_validates():
    g = es.Graph()
    x = g.input("x", (2, 4))
    c = es.view_as_complex(x)
    parts = [x.sum(0), g.full((2,), 1.0), x[:, 1], x.reshape(8), c]
    for k, t in enumerate(parts):
        g.output(f"o{k}", t)
    g.ir.validate()
    kinds = {type(n) for n in g.ir.nodes}
    assert kinds == set(NODE_KINDS)
    text = str(g)
    for word in ("einsum", "formation", "fill", "select", "reshape", "complex_view"):
        assert word in text
    dot = g.to_dot()
    assert all(f"n{nid} [" in dot for nid in range(len(g.ir.nodes)))
    edges = [line for line in dot.splitlines() if re.match(r"\s+n\d+ -> ", line)]
    assert len(edges) == sum(len(n.inputs) for n in g.ir.nodes) + len(g.ir.outputs)


def test_render_writes_a_file(tmp_path):
    g = es.Graph()
    g.output("y", es.nn.softmax(g.input("x", (2, 3))))
    path = g.render(tmp_path / "graph.svg")
    text = Path(path).read_text()
    assert "<svg" in text or "digraph" in text


def test_feeds_are_checked():
    g = es.Graph()
    x = g.input("x", (2, 3))
    g.output("y", x * "lr")
    prog = es.compile(g, engine="reference")
    good = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(prog.run({"x": good, "lr": 0.5})["y"], good * 0.5)
    with pytest.raises(FeedError, match=r"missing input.*'x'"):
        prog.run({"lr": 1.0})
    with pytest.raises(FeedError, match=r"unknown feed.*'z'"):
        prog.run({"x": good, "lr": 1.0, "z": good})
    with pytest.raises(FeedError, match=r"shape \(3, 2\)"):
        prog.run({"x": good.T.copy(), "lr": 1.0})
    with pytest.raises(FeedError, match=r"float64.*f32"):
        prog.run({"x": good.astype(np.float64), "lr": 1.0})
    with pytest.raises(FeedError, match="list"):
        prog.run({"x": [[1, 2, 3], [4, 5, 6]], "lr": 1.0})
    with pytest.raises(FeedError, match="'lr'"):
        prog.run({"x": good})
    with pytest.raises(FeedError, match=r"'lr'.*number"):
        prog.run({"x": good, "lr": "fast"})


def test_compile_rejects_a_graph_without_outputs():
    g = es.Graph()
    g.input("x", (2,))
    with pytest.raises(es.EinsummableError, match="no outputs"):
        es.compile(g)


def test_inputs_are_not_modified():
    X = np.ones((3, 3), np.float32)
    g = es.Graph()
    x = g.input("x", X.shape)
    g.output("y", x)
    g.output("z", x + 1)
    out = run(g, {"x": X})
    out["y"][0, 0] = 5
    assert X[0, 0] == 1
    assert isinstance(g.ir.nodes[0], InputNode)


@given(st.integers(0, 2**32 - 1))
def test_select_reads_rebuild_any_block_of_the_output(seed):
    """Select.reads, applied piece by piece over the pad, gives the block the reference engine computes."""
    from einsummable.frontend.tensor import select
    from einsummable.ir.box import slices

    rng = np.random.default_rng(seed)
    g = es.Graph()
    a, b = g.input("a", (5, 4)), g.input("b", (3, 6))
    pieces = []
    for t in (a, b, a):  # overlapping pieces: the later one wins
        lo = [int(rng.integers(0, n)) for n in t.shape]
        src = tuple((s, int(rng.integers(s, n + 1))) for s, n in zip(lo, t.shape, strict=True))
        dst = tuple(int(rng.integers(0, 7 - (hi - s) + 1)) for s, hi in src)
        pieces.append((t, src, dst))
    g.output("y", select((7, 7), pieces, pad=-1.0))
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in (("a", (5, 4)), ("b", (3, 6)))}
    want = run(g, feeds)["y"]
    node = g.ir.nodes[g.ir.outputs["y"]]
    assert isinstance(node, Select)
    lo = [int(rng.integers(0, 7)) for _ in range(2)]
    box = tuple((s, int(rng.integers(s, 8))) for s in lo)
    got = np.full([hi - lo for lo, hi in box], -1.0, dtype=np.float32)
    names = [g.ir.nodes[i].name for i in node.inputs]
    for _, (k, src), dst in node.reads(box):
        got[slices(dst)] = feeds[names[k]][slices(src)]
    np.testing.assert_array_equal(got, want[slices(box)])


def test_render_without_graphviz_warns_once_and_names_the_file_it_wrote(tmp_path, monkeypatch):
    from einsummable.ir import dot

    monkeypatch.setattr(dot.shutil, "which", lambda name: None)
    monkeypatch.setattr(dot, "_warned", False)
    g = es.Graph()
    g.output("y", es.nn.softmax(g.input("x", (2, 3))))
    with pytest.warns(UserWarning, match="Graphviz") as caught:
        svg = g.render(tmp_path / "graph.svg")
        png = g.render(tmp_path / "graph.png")
    assert len(caught) == 1
    assert svg != png and {Path(svg).name, Path(png).name} == {"graph.svg.dot", "graph.png.dot"}
    assert Path(svg).read_text() == Path(png).read_text() == g.to_dot()
    assert g.render(tmp_path / "g.dot") == str(tmp_path / "g.dot")
    with pytest.raises(es.GraphError, match=r"\.svg"):
        g.render(tmp_path / "graph.jpg")
