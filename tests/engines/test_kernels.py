"""The engines' fast kernels against numpy, on the shapes that pick each path."""

import random
import types

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from einsummable.engines.kernels import fast as kernels
from einsummable.ir.einsummable import Einsummable


def _run(spec, arrays, join=None, agg=None):
    op = Einsummable.from_spec(spec, [a.shape for a in arrays], join, agg)
    return kernels.prepare(op)(arrays, {})


@pytest.mark.parametrize("c", [1, 2, 3, 8])
def test_a_tiny_contraction_matches_numpy(c):
    rng = np.random.default_rng(c)
    x = rng.standard_normal((3, 5, 4, c), dtype=np.float32)       # RoPE: [b, s, j, c']
    rot = rng.standard_normal((5, 4, c, c), dtype=np.float32)     # [s, j, c, c']
    got = _run("bsje,sjce->bsjc", [x, rot], agg="add")
    np.testing.assert_allclose(got, np.einsum("bsje,sjce->bsjc", x, rot), rtol=1e-5, atol=1e-6)


def test_an_empty_sum_is_zero():
    a, b = np.ones((2, 0), np.float32), np.ones((0, 4), np.float32)
    np.testing.assert_array_equal(_run("ij,jk->ik", [a, b], agg="add"), np.zeros((2, 4), np.float32))
    np.testing.assert_array_equal(_run("ij,jk->ik", [a, b], join="exp(x0) * x1", agg="add"), np.zeros((2, 4)))


@pytest.mark.parametrize("agg", ["add", "max", "min", "mul"])
def test_a_short_reduction_of_a_join_matches_numpy(agg):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 3), dtype=np.float32)
    y = rng.standard_normal((3, 2), dtype=np.float32)
    joined = np.exp(x[:, :, :, None] - y[None, None, :, :])         # [a, b, c, d]
    want = {"add": np.sum, "max": np.max, "min": np.min, "mul": np.prod}[agg](joined, axis=(0, 2))
    got = _run("abc,cd->bd", [x, y], join="exp(x0 - x1)", agg=agg)
    np.testing.assert_allclose(got, want, rtol=1e-5)


@given(st.integers(0, 2**32 - 1))
def test_contractions_in_any_layout_match_numpy(seed):
    """Batch, row, column and summed indices in random memory orders: views or copies, never wrong."""
    rng = random.Random(seed)
    letters = "abcdefg"[: rng.randint(2, 7)]
    roles = {ch: rng.choice(["batch", "left", "right", "inner"]) for ch in letters}
    a = [ch for ch in letters if roles[ch] in ("batch", "left", "inner")]
    b = [ch for ch in letters if roles[ch] in ("batch", "right", "inner")]
    out = [ch for ch in letters if roles[ch] != "inner"]
    for term in (a, b, out):
        rng.shuffle(term)
    if not a or not b:
        return
    spec = f"{''.join(a)},{''.join(b)}->{''.join(out)}"
    sizes = {ch: rng.choice([1, 2, 3, 5, 16]) for ch in letters}
    nrng = np.random.default_rng(seed)
    xs = [nrng.standard_normal([sizes[ch] for ch in term], dtype=np.float32) for term in (a, b)]
    if rng.random() < 0.5:  # an operand that is itself a transposed view
        xs[0] = np.ascontiguousarray(xs[0].T).T
    agg = "add" if "inner" in roles.values() else None
    np.testing.assert_allclose(_run(spec, xs, agg=agg), np.einsum(spec, *xs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec", ["ik,kj->ij", "bik,bkj->bij", "ik,kj->ji", "ik,bkj->jbi"])
def test_a_large_gemm_block_starts_on_a_cache_line(spec):
    """A GEMM's output (transposed or not) is the block the next join streams over: on a
    64-byte line, each vector load reads one line, not two (engines/kernels/aligned.py)."""
    rng = np.random.default_rng(0)
    sizes = {"b": 3, "i": 260, "j": 130, "k": 40}  # outputs >= aligned.ALIGN_FROM
    terms = spec.split("->")[0].split(",")
    a, b = (rng.standard_normal([sizes[c] for c in t], dtype=np.float32) for t in terms)
    got = _run(spec, [a, b], agg="add")
    assert got.ctypes.data % 64 == 0 and got.flags.c_contiguous
    np.testing.assert_allclose(got, np.einsum(spec, a, b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("agg", ["add", "max"])
def test_a_reduction_over_leading_memory_axes_matches_numpy(agg):
    """RMSNorm's weight gradient: [b, s, d] summed over b and s, walked in memory order."""
    rng = np.random.default_rng(1)
    x, r, g = (rng.standard_normal(s, dtype=np.float32) for s in [(4, 6, 5), (4, 6), (4, 6, 5)])
    got = _run("bca,bc,bca->a", [x, np.abs(r), g], join="rsqrt(1e-06 + x1) * x0 * x2", agg=agg)
    joined = x / np.sqrt(1e-6 + np.abs(r))[:, :, None] * g
    want = joined.sum(axis=(0, 1)) if agg == "add" else joined.max(axis=(0, 1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("join,oracle", [
    ("-(x0 * x1) / x2 ** 2", lambda a, b, c, lr: -(a * b).sum(-1) / c**2),
    ("lr * x2 * x0 * x1", lambda a, b, c, lr: lr * c * (a * b).sum(-1)),
    ("exp(x0 - x2) * x1 / (x2 + 3)", lambda a, b, c, lr: (np.exp(a - c[..., None]) * b).sum(-1) / (c + 3)),
])
def test_factors_constant_along_a_sum_come_out_of_it(join, oracle):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 3, 4, 7), dtype=np.float32)
    c = rng.uniform(0.5, 2.0, (3, 4)).astype(np.float32)
    op = Einsummable.from_spec("abc,abc,ab->ab", [a.shape, b.shape, c.shape], join, "add")
    assert kernels._outer_factors(op) is not None
    got = kernels.prepare(op)([a, b, c], {"lr": 0.3})
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, oracle(a, b, c, 0.3), rtol=1e-5, atol=1e-6)


def test_a_constant_factor_comes_out_and_leaves_a_contraction():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((2, 3, 4, 7), dtype=np.float32)
    op = Einsummable.from_spec("abc,abc->ab", [a.shape, b.shape], "-(0.5 * lr * x0 * x1)", "add")
    got = kernels.prepare(op)([a, b], {"lr": 2.0})
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, -(a * b).sum(-1), rtol=1e-5, atol=1e-6)


def test_a_sum_of_reciprocals_factors_once():
    """1 / x must not split into 1 and 1 / x over and over."""
    a, x = np.full(3, 2.0, np.float32), np.full((3, 4), 4.0, np.float32)
    np.testing.assert_allclose(_run("i,it->i", [a, x], join="x0 / x1", agg="add"), np.full(3, 2.0))
    np.testing.assert_allclose(_run("it->i", [x], join="1 / x0", agg="add"), np.ones(3))


def test_a_constant_factor_keeps_double_precision():
    x = np.random.default_rng(4).standard_normal((4, 10))
    op = Einsummable.from_spec("ij->i", [x.shape], "lr * x0 * 0.1", "add", ["f64"])
    got = kernels.prepare(op)([x], {"lr": 0.3})
    np.testing.assert_allclose(got, 0.03 * x.sum(1), rtol=1e-14)


def test_an_empty_sum_with_an_infinite_outer_factor_is_zero():
    a, s = np.ones((3, 0), np.float32), np.zeros(3, np.float32)
    np.testing.assert_array_equal(_run("it,i->i", [a, s], join="x0 / x1", agg="add"), np.zeros(3))


def test_row_reductions_and_row_wise_dots_take_the_compiled_kernel(monkeypatch):
    """Softmax's row max and sum, and its backward's sum(y * dy), run as C kernels (issue 18):
    a ufunc's reduce per row and a batched GEMM of 1 x n by n x 1 matrices both measured
    slower (1024 rows of 256: 0.083 ms against 0.035 for the max, 0.026 against 0.022 for
    the dot). Same numbers as numpy's."""
    from einsummable.engines.kernels import cbuild, native
    if not cbuild.enabled() or cbuild.compiler() is None:
        pytest.skip("compiled kernels off")
    routed = []
    real = native.kernel
    monkeypatch.setattr(native, "kernel", lambda op, body: routed.append(op.agg) or real(op, body))
    rng = np.random.default_rng(4)
    y, dy = (rng.standard_normal((8, 70)).astype(np.float32) for _ in range(2))
    ops = [Einsummable.from_spec("ij->i", [y.shape], agg="max"),
           Einsummable.from_spec("ij->i", [y.shape], agg="add"),
           Einsummable.from_spec("ij,ij->i", [y.shape] * 2, join="x0 * x1", agg="add")]
    feeds = [[y], [y], [y, dy]]
    got = [kernels.prepare.__wrapped__(op)(arrays, {}) for op, arrays in zip(ops, feeds, strict=True)]
    assert routed == ["max", "add", "add"]
    np.testing.assert_array_equal(got[0], y.max(1))
    np.testing.assert_allclose(got[1], y.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[2], (y * dy).sum(1), rtol=1e-5, atol=1e-5)


def test_a_blocks_address_is_numpys_for_every_kind_of_array():
    """``aligned.address`` (cffi's buffer view, or numpy's dict where there is no simple buffer)
    names the first element numpy names: views, slices, reversed, transposed, read-only,
    broadcast, empty, 0-d, bool and bf16 blocks."""
    import ml_dtypes

    from einsummable.engines.kernels import aligned

    w = np.arange(24, dtype=np.float32).reshape(4, 6)
    arrays = [np.array(3.0, np.float32), np.zeros((0, 3), np.float32), np.broadcast_to(w, (2, 4, 6)),
              w[1:3], w[:, ::2], w[::-1], w.T, w.astype(ml_dtypes.bfloat16), w > 3,
              np.frombuffer(w.tobytes(), np.float32), aligned.empty((128, 256), np.dtype(np.float32))[0]]
    for a in arrays:
        assert aligned.address(a) == a.__array_interface__["data"][0]


def _add_at(*args, **kwargs):
    raise AssertionError("np.add.at ran")


def test_an_embedding_lookup_and_its_gradient_run_without_np_add_at(monkeypatch):
    """np.add.at holds the GIL and adds row by row (3.5 ms of a Llama step's lookup, 5.6 of
    its gradient). A lookup's rows land in one place each: assigned. Its gradient's places
    repeat: summed by runs of a stable sort, a reassociated sum (within n eps of numpy's)."""
    monkeypatch.setattr(kernels, "np", types.SimpleNamespace(
        **vars(np) | {"add": types.SimpleNamespace(at=_add_at, reduceat=np.add.reduceat)}))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 30, (6, 5)).astype(np.float32)
    table = rng.standard_normal((30, 4), dtype=np.float32)
    vocab = np.arange(30, dtype=np.float32)
    grad = rng.standard_normal((6, 5, 4), dtype=np.float32)
    want = np.zeros((30, 4))
    np.add.at(want, ids.astype(int), grad.astype(np.float64))
    terms = np.bincount(ids.astype(int).ravel(), minlength=30)[:, None]
    got = _run("bs,v,bsd->vd", [ids, vocab, grad], join="where(x0 == x1, x2, 0)", agg="add")
    assert (terms > 2).any() and (np.abs(got - want) <= 4 * terms * 2.0**-24 * np.abs(grad).max()).all()
    got = _run("bs,v,vd->bsd", [ids, vocab, table], join="where(x0 == x1, x2, 0)", agg="add")
    np.testing.assert_array_equal(got, table[ids.astype(int)])


@pytest.mark.parametrize("rows", [1, 8, 64, 65, 300])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_few_rows_times_a_matrix_stored_by_columns(rows, dtype, monkeypatch):
    """``x @ W.T`` with W stored (out, in), as a decode step's projections: up to FEW_ROWS
    rows it runs as ``(W @ x.T).T`` (2x faster on OpenBLAS's AVX-512 kernels), past them as
    written; either way numpy's product, row-major, and a large f32 block on a cache line."""
    from einsummable.engines.kernels import gemm
    from einsummable.ir.dtypes import to_numpy

    calls = []
    real = np.matmul
    spy = types.SimpleNamespace(**{n: getattr(np, n) for n in dir(np) if not n.startswith("__")})
    spy.matmul = lambda a, b, **k: calls.append((a.shape, b.shape)) or real(a, b, **k)
    monkeypatch.setattr(gemm, "np", spy)
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 96)).astype(to_numpy(dtype))
    w = rng.standard_normal((700, 96)).astype(to_numpy(dtype))
    op = Einsummable.from_spec("sd,fd->sf", [x.shape, w.shape], agg="add", dtypes=[dtype, dtype])
    got = kernels.prepare.__wrapped__(op)([x, w], None)
    want = np.einsum("sd,fd->sf", x.astype(np.float64), w.astype(np.float64))
    rtol = 1e-2 if dtype == "bf16" else 1e-4
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=1e-3)
    assert got.flags.c_contiguous and got.shape == (rows, 700)
    assert calls == [((700, 96), (96, rows))] if rows <= gemm.FEW_ROWS else [((rows, 96), (96, 700))]
    if got.nbytes >= 64 * 1024 and dtype == "f32":  # bf16 is the f32 block rounded, a copy
        assert got.ctypes.data % 64 == 0
