"""torch tensors (and anything with ``__dlpack__`` or ``__array__``) as feeds, torch dtypes
as dtypes, and torch tensors back with ``like="torch"``; torch itself is the oracle."""

import ml_dtypes
import numpy as np
import pytest

import einsummable as es

torch = pytest.importorskip("torch")


def _matmul_program(dtype=torch.float32, engine="local"):
    g = es.Graph()
    a = g.input("a", (4, 3), dtype=dtype)
    b = g.input("b", (3, 5), dtype=dtype)
    g.output("c", es.einsum("ij,jk->ik", a, b) * "scale")
    return es.compile(g, 2, engine=engine)


@pytest.mark.parametrize("engine", ["reference", "local"])
def test_torch_feeds_and_torch_outputs_match_torch(engine):
    a, b = torch.randn(4, 3), torch.randn(3, 5, requires_grad=True)
    prog = _matmul_program(engine=engine)
    out = prog.run({"a": a, "b": b, "scale": 0.5}, like="torch")["c"]
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    torch.testing.assert_close(out, (a @ b).detach() * 0.5, rtol=1e-5, atol=1e-6)
    plain = prog.run({"a": a, "b": b, "scale": 0.5})["c"]
    assert isinstance(plain, np.ndarray)


def test_bf16_torch_tensors_work_both_ways():
    a, b = torch.randn(4, 3).bfloat16(), torch.randn(3, 5).bfloat16()
    prog = _matmul_program(torch.bfloat16)
    out = prog.run({"a": a, "b": b, "scale": 1.0}, like="torch")["c"]
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-2)
    arrays = prog.run({"a": a, "b": b, "scale": 1.0})
    assert arrays["c"].dtype == np.dtype(ml_dtypes.bfloat16)


def test_a_torch_feed_is_read_without_a_copy():
    from einsummable.engines.interop import as_array

    for t in (torch.randn(4, 3), torch.randn(4, 3).bfloat16(), torch.randn(6, 4)[::2]):
        view = as_array("a", t)
        assert view.ctypes.data == t.data_ptr() and view.shape == tuple(t.shape)
        np.testing.assert_array_equal(view.astype(np.float32), t.float().numpy())


def test_objects_with_array_or_dlpack_are_feeds():
    class Wrapped:  # neither numpy nor torch: only the protocol
        def __init__(self, a):
            self.a = a

        def __array__(self, dtype=None, copy=None):
            return self.a

    a, b = np.ones((4, 3), np.float32), np.arange(15, dtype=np.float32).reshape(3, 5)
    prog = _matmul_program(np.float32, engine="reference")
    for feed in (Wrapped(a), torch.from_numpy(a)):
        np.testing.assert_allclose(prog.run({"a": feed, "b": b, "scale": 1.0})["c"], a @ b)


def test_torch_and_numpy_dtype_objects_are_dtypes():
    g = es.Graph()
    given = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.complex64, torch.bool,
             np.float16, np.dtype("float64"), ml_dtypes.bfloat16, "float32"]
    expected = ["f32", "f16", "bf16", "f64", "c64", "bool", "f16", "f64", "bf16", "f32"]
    assert [g.input(f"x{i}", (2,), dtype=d).dtype for i, d in enumerate(given)] == expected
    with pytest.raises(es.DtypeError, match=r"torch\.int16"):
        g.input("w", (2,), dtype=torch.int16)


def test_a_wrong_dtype_or_like_is_our_error():
    prog = _matmul_program()
    with pytest.raises(es.FeedError, match="float64"):
        prog.run({"a": torch.randn(4, 3, dtype=torch.float64), "b": torch.randn(3, 5), "scale": 1.0})
    with pytest.raises(es.FeedError, match="like='jax'"):
        prog.run({"a": torch.randn(4, 3), "b": torch.randn(3, 5), "scale": 1.0}, like="jax")
