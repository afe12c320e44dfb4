"""The one promotion rule: operations on Tensors promote float operands as numpy does; a
join written in the scalar language does not, and says so."""

import ml_dtypes
import numpy as np
import pytest

import einsummable as es
from einsummable.errors import DtypeError

NP = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64}
PAIRS = [("f32", "f64"), ("f16", "f32"), ("bf16", "f32"), ("bf16", "f16"), ("f64", "bf16")]
OPS = {
    "add": (lambda a, b: a + b, lambda a, b: a + b, (2, 3), (2, 3)),
    "matmul": (lambda a, b: a @ b, lambda a, b: a @ b, (2, 3), (3, 4)),
    "einsum": (lambda a, b: es.einsum("ij,jk->ik", a, b), lambda a, b: np.einsum("ij,jk->ik", a, b),
               (2, 3), (3, 4)),
    "where": (lambda a, b: es.where(a > 0, a, b), lambda a, b: np.where(a > 0, a, b), (2, 3), (2, 3)),
}


def _wide(a: np.ndarray, b: np.ndarray) -> np.dtype:
    """numpy's promotion, with half types meeting at f32 (as torch's and numpy's ml_dtypes do)."""
    kinds = {a.dtype.itemsize, b.dtype.itemsize}
    return np.dtype(np.float32) if kinds == {2} else np.result_type(a, b)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize(("da", "db"), PAIRS)
def test_operations_on_tensors_promote_as_numpy_does(op, da, db):
    ours, theirs, sa, sb = OPS[op]
    rng = np.random.default_rng(0)
    a = rng.standard_normal(sa).astype(NP[da])
    b = rng.standard_normal(sb).astype(NP[db])
    g = es.Graph()
    g.output("y", ours(g.input("a", sa, da), g.input("b", sb, db)))
    got = es.compile(g, engine="reference").run({"a": a, "b": b})["y"]
    wide = _wide(a, b)
    assert got.dtype == wide
    want = theirs(a.astype(wide), b.astype(wide))
    rtol = 1e-2 if wide.itemsize < 8 else 1e-12
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol)


def test_a_join_does_not_promote_and_says_how_to_cast():
    g = es.Graph()
    a, b = g.input("a", (2, 3), "f32"), g.input("b", (2, 3), "f64")
    with pytest.raises(DtypeError, match=r"mismatch in add: operands are f32, f64; a join does not promote"):
        es.einsum("ij,ij->ij", a, b, join="x0 + x1")
    y = es.einsum("ij,ij->ij", a, b, join="cast(x0, f64) + x1")  # the cast the message asks for
    assert y.dtype == "f64"
