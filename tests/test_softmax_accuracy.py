"""f32 softmax against torch's at large offsets, and torch's NaN for a row holding +inf."""

import numpy as np
import pytest

import einsummable as es

torch = pytest.importorskip("torch")


def _softmax(x: np.ndarray, engine: str) -> np.ndarray:
    g = es.Graph()
    g.output("y", es.nn.softmax(g.input("x", x.shape, str(x.dtype).replace("float", "f"))))
    return es.compile(g, engine=engine, workers=2).run({"x": x})["y"]


@pytest.mark.parametrize("engine", ["reference", "local"])
@pytest.mark.parametrize("offset", [0.0, 1e2, 1e4, 1e5, 1e6, -1e6])
def test_f32_softmax_keeps_its_accuracy_at_any_offset(engine, offset):
    """``exp(x - logsumexp)`` lost 4.7e-4 relative at an offset of 1e4; exp(x - max)/sum does not."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((8, 96)) * 4 + offset).astype(np.float32)
    want = torch.softmax(torch.from_numpy(x), -1).numpy()
    got = _softmax(x, engine)
    assert got.dtype == np.float32
    big = want > 1e-30  # relative error where torch's value is a normal number
    rel = np.abs(got[big] - want[big]) / want[big]
    assert rel.max() < 1e-6, f"max relative error {rel.max():.3g} at offset {offset}"


@pytest.mark.parametrize("engine", ["reference", "local"])
def test_a_row_holding_plus_inf_is_all_nan_and_a_row_of_minus_inf_too(engine):
    x = np.array([[1.0, np.inf, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0],
                  [-np.inf] * 4, [0.0, -np.inf, 1.0, -np.inf]], np.float32)
    want = torch.softmax(torch.from_numpy(x), -1).numpy()
    got = _softmax(x, engine)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[0]).all() and np.isnan(got[2]).all()
    np.testing.assert_allclose(got[[1, 3]], want[[1, 3]], rtol=1e-6)
