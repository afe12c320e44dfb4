"""gelu (tanh approximation) and its gradient on every engine and kernel path, against
the definition 0.5 x (1 + tanh(c (x + 0.044715 x^3))) evaluated to 150 digits (mpmath),
through the far negative tail where that form cancels to 0 in floating point.

torch uses the cancelling form: its f32 gelu(-5.25) is -0, and even its f64 gelu is 12%
off at -7.1 and 0 past -7.5, so torch is checked where it is accurate, not used as the
tail's oracle."""

import functools
import math

import numpy as np
import pytest

import einsummable as es
from einsummable.engines.kernels import cbuild
from einsummable.ir.dtypes import to_numpy

mpmath = pytest.importorskip("mpmath")
torch = pytest.importorskip("torch")

# the tail (gelu(-5.2517805) was -0 in f32 on the local engine: 875M ulps from numpy),
# the bulk, and where e^-2u under- and overflows
POINTS = np.concatenate([[-5.2517805, -6.0, -7.5, -8.0, -9.0, -10.0, -12.0, -3.0, -1.0, -0.25, -1e-3,
                          0.0, 1e-3, 0.5, 1.0, 3.0, 9.0, 30.0, 1e4],
                         np.linspace(-11.0, 6.0, 341)])
EPS = {"f64": 2.0**-52, "f32": 2.0**-23, "bf16": 2.0**-23}  # bf16 computes in f32 ...
ROUND = {"f64": 0.0, "f32": 0.0, "bf16": 2.0**-8}  # ... and rounds once
ENGINES = ["reference", "sequential", "local", "local-numpy"]


@functools.cache
def _exact(dtype: str) -> dict[str, np.ndarray]:
    """At POINTS rounded to ``dtype``: gelu, gelu' and their condition numbers |x f'/f| and |x f''/f'|."""
    with mpmath.workdps(150):  # 1 + tanh(u) cancels ~60 digits at x = -12
        c = mpmath.mpf(math.sqrt(2 / math.pi))

        def f(t):
            return t / 2 * (1 + mpmath.tanh(c * (t + mpmath.mpf(0.044715) * t**3)))

        rows = []
        for v in POINTS.astype(to_numpy(dtype)).astype(np.float64):
            t = mpmath.mpf(float(v))
            f0, f1, f2 = (mpmath.diff(f, t, k) for k in range(3))
            cond0 = abs(t * f1 / f0) if f0 else 0
            cond1 = abs(t * f2 / f1) if f1 else 0
            rows.append([float(f0), float(f1), float(cond0), float(cond1)])
    y, dy, c0, c1 = np.array(rows).T
    return {"y": y, "dy": dy, "cond_y": c0, "cond_dy": c1}


def _run(graph: es.Graph, feeds: dict, engine: str, monkeypatch) -> dict:
    if engine == "local-numpy":
        monkeypatch.setenv(cbuild.ENV, "numpy")
        engine = "local"
    return es.compile(graph, engine=engine, workers=2).run(feeds)


def _close(got: np.ndarray, want: np.ndarray, cond: np.ndarray, dtype: str, what: str) -> None:
    """Within a few roundings of the input and of each step (eps times the condition
    number), plus the output's one rounding, where the exact value is a normal number in
    ``dtype`` by a margin; below it e^-2u has overflowed (x e^2u is within |x| of
    underflowing) and |got| is that small or 0."""
    got = got.astype(np.float64)
    tiny = 64 * np.finfo(to_numpy("f32" if dtype == "bf16" else dtype)).tiny
    normal = np.abs(want) >= tiny
    rel = np.abs(got[normal] - want[normal]) / np.abs(want[normal])
    bound = ROUND[dtype] + 8 * EPS[dtype] * (1 + cond[normal])
    k = int(np.argmax(rel / bound))
    assert rel[k] <= bound[k], (f"{what} ({dtype}) at x = {POINTS[normal][k]}: {got[normal][k]!r}, "
                                f"exact {want[normal][k]!r} ({rel[k]:.3g} relative, bound {bound[k]:.3g})")
    assert (np.abs(got[~normal]) < tiny).all(), what


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16"])
def test_gelu_and_its_gradient_keep_relative_accuracy_in_the_tail(engine, dtype, monkeypatch):
    x = POINTS.astype(to_numpy(dtype))
    g = es.Graph()
    xin = g.input("x", x.shape, dtype)
    y = es.nn.gelu(xin)
    g.output("y", y)
    g.output("dx", es.grad(es.cast(y, "f32" if dtype == "bf16" else dtype).sum(), [xin])[0])
    out = _run(g, {"x": x}, engine, monkeypatch)
    assert out["y"].dtype == to_numpy(dtype)
    exact = _exact(dtype)
    _close(out["y"], exact["y"], exact["cond_y"], dtype, "gelu")
    _close(out["dx"], exact["dy"], exact["cond_dy"], dtype, "gelu'")


def test_torch_agrees_where_its_form_does_not_cancel():
    """An independent check of the oracle: torch's f64 gelu and gelu' for x >= -3."""
    keep = POINTS >= -3.0
    t = torch.tensor(POINTS[keep], requires_grad=True)
    y = torch.nn.functional.gelu(t, approximate="tanh")
    y.sum().backward()
    exact = _exact("f64")
    np.testing.assert_allclose(y.detach().numpy(), exact["y"][keep], rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(t.grad.numpy(), exact["dy"][keep], rtol=1e-12, atol=1e-300)


def test_gelu_at_infinities_and_nan_is_torchs():
    x = np.array([np.inf, -np.inf, np.nan, -0.0], np.float32)
    g = es.Graph()
    g.output("y", es.nn.gelu(g.input("x", x.shape, "f32")))
    got = es.compile(g, engine="local", workers=2).run({"x": x})["y"]
    want = torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    np.testing.assert_array_equal(got, want)
