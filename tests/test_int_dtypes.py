"""Integer dtypes i32 and i64 (ids and indices) against numpy and torch: names, feeds, joins,
gathers, comparisons, casts, reductions, every engine; and the clear errors for arithmetic
that means nothing on integers."""

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import einsummable as es
from einsummable.engines.kernels import cbuild, ccodegen, native
from einsummable.engines.kernels import fast as kernels
from einsummable.ir.einsummable import Einsummable
from einsummable.lower.lowering import lower
from einsummable.lower.stats import stats
from einsummable.lower.taskgraph import MoveTask
from einsummable.plan.plan import build
from graphgen import random_partitions

ENGINES = ["reference", "sequential", "local"]
NP = {"i32": np.int32, "i64": np.int64}


def run_all(g: es.Graph, feeds: dict, workers: int = 3) -> list[dict]:
    return [es.compile(g, workers, engine=e).run(feeds) for e in ENGINES]


# ------------------------------------------------------------ names and feeds


@pytest.mark.parametrize("given, short", [
    ("i32", "i32"), ("int32", "i32"), (np.int32, "i32"), (np.dtype("int32"), "i32"), (torch.int32, "i32"),
    ("i64", "i64"), ("int64", "i64"), (np.int64, "i64"), (np.dtype("int64"), "i64"), (torch.int64, "i64"),
    ("torch.int64", "i64")])
def test_integer_dtypes_are_accepted_wherever_a_dtype_is(given, short):
    g = es.Graph()
    assert g.input("y", (3,), dtype=given).dtype == short
    assert g.zeros((2,), dtype=given).dtype == short
    assert g.input("x", (3,)).astype(given).dtype == short


def test_other_integer_widths_are_refused_by_name():
    for bad in ("int16", np.uint8, torch.int16, "u32"):
        with pytest.raises(es.DtypeError, match="i32, i64"):
            es.Graph().input("y", (3,), dtype=bad)


def _doubler(dtype="i64"):
    g = es.Graph()
    y = g.input("y", (4,), dtype=dtype)
    g.output("z", y * 2 + 1)
    return es.compile(g, engine="reference")


def test_int_feeds_are_checked_exactly_and_outputs_keep_their_dtype():
    y = np.array([3, -1, 7, 2**40], np.int64)
    out = _doubler().run({"y": y})["z"]
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, y * 2 + 1)  # exact beyond 2**24 (f32) and 2**31 (i32)
    assert _doubler("i32").run({"y": y.astype(np.int32)})["z"].dtype == np.int32
    for wrong in (y.astype(np.int32), y.astype(np.float32), y.astype(np.float64)):
        with pytest.raises(es.FeedError, match=r"expected i64.*astype\('int64'\)"):
            _doubler().run({"y": wrong})


def test_torch_int64_tensors_go_in_and_come_out():
    t = torch.tensor([1, 2, 3, 4])
    out = _doubler().run({"y": t}, like="torch")["z"]
    assert out.dtype == torch.int64
    assert torch.equal(out, t * 2 + 1)


def test_a_float_scalar_is_refused_for_an_int_scalar_input():
    g = es.Graph()
    n = g.input("n", (), "i64")
    g.output("m", n + 1)
    prog = es.compile(g, engine="reference")
    assert prog.run({"n": 41})["m"] == 42
    with pytest.raises(es.FeedError, match="float 2.5.*i64"):
        prog.run({"n": 2.5})
    with pytest.raises(es.FeedError, match="too large for i64"):
        prog.run({"n": 2**70})


# ------------------------------------------------------------ joins, against numpy


ints = st.integers(-50, 50)


@settings(max_examples=25)
@given(st.sampled_from(["i32", "i64"]), st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_int_joins_comparisons_casts_and_reductions_match_numpy(dtype, n, m, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-5, 6, (n, m)).astype(NP[dtype])
    b = rng.integers(-5, 6, (m,)).astype(NP[dtype])
    f = rng.uniform(-9, 9, (n, m)).astype(np.float32)
    g = es.Graph()
    x, y, z = g.input("a", a.shape, dtype), g.input("b", b.shape, dtype), g.input("f", f.shape)
    want = {
        "onehot": (a == b).astype(np.float32),
        "eq": a == b, "lt": a < b, "ge": a >= 3,
        "arith": (a * b - a + 3) ** 2,
        "neg_abs": np.abs(-a) + np.maximum(a, 0),
        "minmax": np.minimum(a, b) + np.maximum(a, -2),
        "where": np.where(a > b, a, b - 1),
        # sums and products keep the operand's dtype (numpy and torch widen i32 to i64)
        "sum": a.sum(axis=0, dtype=NP[dtype]), "max": a.max(axis=1), "min": a.min(),
        "prod": a.prod(axis=1, dtype=NP[dtype]),
        "matmul": a @ np.ones((m, 2), NP[dtype]) * 3,
        "to_f32": a.astype(np.float32) * np.float32(0.5),
        "to_int": f.astype(NP[dtype]),  # truncation toward zero, as numpy and torch
        "count": (a == b).sum(axis=1, dtype=NP[dtype]),
        "mean": a.mean(axis=0).astype(np.float32),  # an f32, as jnp.mean gives
    }
    outs = {
        "onehot": es.einsum("ij,j->ij", x, y, join="where(x0 == x1, 1, 0)"),
        "eq": x == y, "lt": x < y, "ge": x >= 3,
        "arith": (x * y - x + 3) ** 2,
        "neg_abs": abs(-x) + es.nn.relu(x),
        "minmax": es.einsum("ij,j->ij", x, y, join="min(x0, x1)") + es.elementwise("max(x0, -2)", x),
        "where": es.where(x > y, x, y - 1),
        "sum": x.sum(axis=0), "max": x.max(axis=1), "min": x.min(), "prod": x.prod(axis=1),
        "matmul": es.einsum("ij,jk->ik", x, g.full((m, 2), 1, dtype)) * 3,
        "to_f32": x.astype("f32") * 0.5,
        "to_int": z.astype(dtype),
        "count": es.einsum("ij,j->i", x, y, join=f"cast(where(x0 == x1, 1, 0), {dtype})", agg="add"),
        "mean": x.mean(axis=0),
    }
    for name, t in outs.items():
        g.output(name, t)
    for out in run_all(g, {"a": a, "b": b, "f": f}):
        for name, w in want.items():
            assert out[name].dtype == w.dtype, name
            if name == "mean":  # a sum of x / n: rounds differently from numpy's sum, then / n
                np.testing.assert_allclose(out[name], w, rtol=1e-6, atol=1e-6, err_msg=name)
            else:
                np.testing.assert_array_equal(out[name], w, err_msg=name)


def test_int_graphs_lowered_with_irregular_partitions_match_the_reference():
    from einsummable.engines import reference, sequential

    rng = np.random.default_rng(0)
    ids, table = rng.integers(0, 7, (5, 6)), rng.standard_normal((7, 4))
    g = es.Graph()
    x, t = g.input("ids", ids.shape, "i64"), g.input("t", table.shape, "f64")
    g.output("emb", es.take(t, x))
    g.output("hist", es.one_hot(x, 7, "i64").sum(axis=(0, 1)))
    g.output("shift", es.concat([x[:, 1:], x[:, :1]], axis=1) * 3 - x)
    g.output("top", x.max(axis=0))
    feeds = {"ids": ids, "t": table}
    want = reference.run(g.ir, feeds)
    np.testing.assert_array_equal(want["emb"], table[ids])
    np.testing.assert_array_equal(want["hist"], np.bincount(ids.ravel(), minlength=7))
    for seed in range(6):
        plan = build(g.ir, es.Cluster(machines=2, cores=2), random_partitions(g.ir, random.Random(seed)))
        got = sequential.run(lower(plan), feeds)
        for name, w in want.items():
            assert got[name].dtype == w.dtype, name
            np.testing.assert_array_equal(got[name], w, err_msg=f"{name}, seed {seed}")


def test_take_and_one_hot_match_numpy():
    rng = np.random.default_rng(1)
    x, xi = rng.standard_normal((3, 5, 4)).astype(np.float32), rng.integers(-99, 99, 5)
    ids = rng.integers(0, 5, (2, 6)).astype(np.int32)
    g = es.Graph()
    tx, txi, tid = g.input("x", x.shape), g.input("xi", xi.shape, "i64"), g.input("ids", ids.shape, "i32")
    g.output("take", es.take(tx, tid, axis=1))
    g.output("take_int", es.take(txi, tid))
    g.output("onehot", es.one_hot(tid, 5))
    for out in run_all(g, {"x": x, "xi": xi, "ids": ids}):
        np.testing.assert_array_equal(out["take"], np.take(x, ids, axis=1))
        assert out["take_int"].dtype == np.int64
        np.testing.assert_array_equal(out["take_int"], np.take(xi, ids))
        np.testing.assert_array_equal(out["onehot"], np.eye(5, dtype=np.float32)[ids])
    with pytest.raises(es.FeedError, match=r"holds 5 at position \(0, 0\), read as take indices"):
        es.compile(g, engine="reference").run({"x": x, "xi": xi, "ids": np.full(ids.shape, 5, np.int32)})
    with pytest.raises(es.DtypeError, match=r"integers \(i32 or i64\), got f32.*astype\('i64'\)"):
        es.take(tx, g.input("f", (2,)))


def test_indexing_by_an_integer_tensor_gathers_as_numpy_does():
    rng = np.random.default_rng(2)
    x, ids = rng.standard_normal((5, 4, 3)), np.array([[3, 0], [2, 2]])
    g = es.Graph()
    tx, ti = g.input("x", x.shape, "f64"), g.input("ids", ids.shape, "i64")
    g.output("rows", tx[ti])
    g.output("cols", tx[:, ti])
    g.output("last", tx[:, :, ti[0, 1:]])
    out = es.compile(g, 2).run({"x": x, "ids": ids})
    np.testing.assert_array_equal(out["rows"], x[ids])
    np.testing.assert_array_equal(out["cols"], x[:, ids])
    np.testing.assert_array_equal(out["last"], x[:, :, ids[0, 1:]])
    with pytest.raises(es.ShapeError, match=r"es\.take\(x, ids, axis\)"):
        tx[ti, 1]


def test_argmax_and_argmin_are_int64_as_numpy_gives_and_gather_back():
    x = np.random.default_rng(7).standard_normal((4, 6)).astype(np.float32)
    x[1, :] = x[1, 0]  # ties take the first
    g = es.Graph()
    t = g.input("x", x.shape)
    best = t.argmax(axis=1)
    g.output("argmax", best)
    g.output("argmin", t.argmin())
    g.output("picked", es.take(t, best, axis=1))
    out = es.compile(g, 2).run({"x": x})
    for name, want in (("argmax", x.argmax(axis=1)), ("argmin", x.argmin())):
        assert out[name].dtype == want.dtype == np.int64
        np.testing.assert_array_equal(out[name], want)
    np.testing.assert_array_equal(out["picked"], x[:, x.argmax(axis=1)])


# ------------------------------------------------------------ meaningless arithmetic


@pytest.mark.parametrize("join, op", [
    ("exp(x0)", "exp"), ("log(x0)", "log"), ("sqrt(x0)", "sqrt"), ("rsqrt(x0)", "rsqrt"),
    ("tanh(x0)", "tanh"), ("sigmoid(x0)", "sigmoid"), ("silu(x0)", "silu"), ("gelu(x0)", "gelu"),
    ("sin(x0)", "sin"), ("x0 / 2", r"div \(/\)"), ("real(x0)", "real")])
def test_meaningless_int_arithmetic_names_the_op_the_dtype_and_the_cast(join, op):
    g = es.Graph()
    x = g.input("x", (3,), "i64")
    match = rf"^{op} is not defined for integer operands \(i64\).*cast\(x0, f32\)"
    with pytest.raises(es.DtypeError, match=match):
        es.elementwise(join, x)


def test_int_ops_refuse_fractions_mixes_and_variables():
    g = es.Graph()
    x, f, w = g.input("x", (3,), "i32"), g.input("f", (3,)), g.input("w", (3,), "i64")
    for bad, match in [(lambda: x * 0.5, "'0.5', not a whole number"),
                       (lambda: x ** -1, "exponent '-1'"),
                       (lambda: x * "lr", "run-time variable"),
                       (lambda: x + f, "dtype mismatch in add: operands are i32, f32; cast"),
                       (lambda: x + w, "i32, i64"),
                       (lambda: x / x, r"div \(/\)"),
                       (lambda: x.exp(), "exp is not defined for integer operands"),
                       (lambda: g.full((2,), 0.5, "i64"), "0.5, not a whole number"),
                       (lambda: es.pad(x, [(1, 1)], value=-np.inf), "-inf")]:
        with pytest.raises(es.DtypeError, match=match):
            bad()


def test_gradients_skip_integers_and_refuse_to_be_taken_with_respect_to_them():
    g = es.Graph()
    x, ids = g.input("x", (4,), "f64"), g.input("ids", (4,), "i64")
    with pytest.raises(es.AutodiffError, match="integer tensor"):
        es.grad((x * 2).sum(), [ids])
    with pytest.raises(es.AutodiffError, match=r"astype\('f32'\)"):
        es.grad(ids.sum(), [x])
    # truncation is piecewise constant: its gradient is 0 (finite differences agree)
    loss = (x.astype("i64").astype("f64") * x + es.elementwise("cast(cast(x0 * 3, i64), f64)", x)).sum()
    (dx,) = es.grad(loss, [x])
    g.output("dx", dx)
    v = np.array([0.3, 1.7, -2.2, 5.5])
    got = es.compile(g, engine="reference").run({"x": v, "ids": np.zeros(4, np.int64)})["dx"]
    np.testing.assert_array_equal(got, np.trunc(v))


# ------------------------------------------------------------ embedding and cross-entropy


def test_embedding_and_cross_entropy_with_int64_ids_match_float_ids_and_torch():
    from einsummable.models.llama.model import embed

    rng = np.random.default_rng(3)
    b, v, d = 6, 9, 5
    ids, targets = rng.integers(0, v, (2, 3)), rng.integers(0, v, b)
    table, h = rng.standard_normal((v, d)), rng.standard_normal((b, d))
    losses = {}
    for id_dtype in ("i64", "f64"):
        g = es.Graph()
        tid, ttg = g.input("ids", ids.shape, id_dtype), g.input("y", targets.shape, id_dtype)
        tt, th = g.input("t", table.shape, "f64"), g.input("h", h.shape, "f64")
        emb = embed(tid, tt)
        loss = es.nn.cross_entropy(th @ es.einsum("vd->dv", tt), ttg) + (emb * emb).sum()
        dt, dh = es.grad(loss, [tt, th])
        for name, t in (("emb", emb), ("loss", loss), ("dt", dt), ("dh", dh)):
            g.output(name, t)
        np_dtype = NP.get(id_dtype, np.float64)
        feeds = {"ids": ids.astype(np_dtype), "y": targets.astype(np_dtype), "t": table, "h": h}
        losses[id_dtype] = run_all(g, feeds)
    T, H = torch.tensor(table, requires_grad=True), torch.tensor(h, requires_grad=True)
    E = torch.nn.functional.embedding(torch.tensor(ids), T)
    L = torch.nn.functional.cross_entropy(H @ T.T, torch.tensor(targets)) + (E * E).sum()
    L.backward()
    for out in losses["i64"] + losses["f64"]:
        np.testing.assert_allclose(out["emb"], E.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(out["loss"], L.item(), rtol=1e-10)
        np.testing.assert_allclose(out["dt"], T.grad.numpy(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(out["dh"], H.grad.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_reductions_with_int_targets_match_torch(reduction):
    rng = np.random.default_rng(4)
    logits, targets = rng.standard_normal((2, 3, 7)).astype(np.float32), rng.integers(0, 7, (2, 3))
    g = es.Graph()
    x, y = g.input("x", logits.shape), g.input("y", targets.shape, "i32")
    g.output("l", es.nn.cross_entropy(x, y, reduction=reduction))
    got = es.compile(g, 2).run({"x": logits, "y": targets.astype(np.int32)})["l"]
    want = torch.nn.functional.cross_entropy(torch.tensor(logits).permute(0, 2, 1), torch.tensor(targets),
                                             reduction=reduction)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)


def test_llama_logits_with_int64_ids_equal_those_with_float_ids():
    from einsummable.models.llama import model as llama

    cfg = llama.PRESETS["tiny"]
    params = llama.init_params(cfg, seed=1)
    tokens = np.random.default_rng(5).integers(0, cfg.vocab_size, (2, 5))
    logits = []
    for id_dtype, ids in (("i64", tokens), ("f32", tokens.astype(np.float32))):
        g = es.Graph()
        p = llama.parameters(g, cfg)
        t = g.input("ids", tokens.shape, id_dtype)
        g.output("logits", llama.forward(cfg, p, t, g.ramp(tokens.shape, steps=(0.0, 1.0)), None))
        logits.append(es.compile(g, 2).run(params | {"ids": ids})["logits"])
    np.testing.assert_array_equal(logits[0], logits[1])


def test_the_trainer_feeds_int64_token_batches():
    from einsummable.train.trainer import TrainConfig, batch_at

    batch = batch_at(np.arange(100, dtype=np.uint16), TrainConfig(batch=2, seq=8), step=0)
    assert batch.dtype == np.int64 and batch.shape == (2, 9)


# ------------------------------------------------------------ kernels and byte counts


def test_int_arithmetic_stays_on_numpy_and_int_comparisons_compile_to_c():
    rng = np.random.default_rng(6)
    a, b, f = rng.integers(0, 4, (40, 30)), np.arange(30) % 4, rng.standard_normal(30).astype(np.float32)
    arith = Einsummable.from_spec("ij,j->i", [(40, 30), (30,)], join="where(x0 == x1, x0 * 2, 0)", agg="max",
                                  dtypes=("i64", "i64"))
    assert ccodegen.generate(arith) is None  # no C form: kernels.prepare keeps numpy's path
    np.testing.assert_array_equal(kernels.prepare(arith)([a, b]), np.where(a == b, 2 * a, 0).max(axis=1))
    if not cbuild.enabled() or cbuild.compiler() is None:
        pytest.skip("no C compiler")
    for join, want in [("where(x0 == x1, x2, 0)", np.where(a == b, f, 0)),
                       ("where(x0 > 1.5, cast(x1, f32), x2)", np.where(a > 1.5, b, f)),  # compared as doubles
                       ("where(x0 == 2.5, cast(x1, f32), x2)", np.broadcast_to(f, a.shape))]:
        op = Einsummable.from_spec("ij,j,j->ij", [(40, 30), (30,), (30,)], join=join,
                                   dtypes=("i64", "i64", "f32"))
        assert ccodegen.generate(op) is not None
        got = native.kernel(op, None)([a, b, f], None)  # no numpy fallback: the C function runs
        np.testing.assert_array_equal(got, want.astype(np.float32), err_msg=join)


def test_moves_and_simulated_bytes_count_int_itemsizes():
    for dtype, size in (("i32", 4), ("i64", 8)):
        g = es.Graph()
        x = g.input("x", (64, 32), dtype)
        g.output("y", es.einsum("ij->ji", x * 2))
        plan = build(g.ir, es.Cluster(machines=2, cores=2), random_partitions(g.ir, random.Random(1)))
        tg = lower(plan)
        moves = [t for t in tg.tasks if isinstance(t, MoveTask)]
        assert moves and all(t.dtype == dtype for t in moves)
        assert stats(tg).bytes_moved == size * sum(int(np.prod(t.shape)) for t in moves)
        sim = es.compile(g, cluster=es.Cluster(machines=2, cores=2), engine="simulate").simulate()
        assert sim.peak_memory[0] >= 64 * 32 * size // 2
