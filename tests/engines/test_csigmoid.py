"""sigmoid and silu in the C kernels, the numpy path and the reference engine: torch's
forms, 1 / (1 + e^-x) and x / (1 + e^-x), and the C kernels' own denominator
(cprelude's one_plus_exp_neg_f) against the same join spelt with exp."""

from __future__ import annotations

import math

import numpy as np
import pytest

from einsummable.engines.kernels import cbuild, native
from einsummable.engines.kernels import fast as kernels
from einsummable.engines.kernels import reference as reference_kernel
from einsummable.ir.dtypes import to_numpy
from einsummable.ir.einsummable import Einsummable

pytestmark = pytest.mark.skipif(
    not cbuild.enabled() or cbuild.compiler() is None,
    reason="compiled kernels off (EINSUMMABLE_KERNELS=numpy or no C compiler)")

SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0]
EPS = {"bf16": 2.0 ** -8, "f32": 2.0 ** -24, "f64": 2.0 ** -53}

@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_sigmoid_and_silu_keep_their_tail_as_torch_does(dtype, monkeypatch):
    """sigmoid(x) = 1 / (1 + e^-x) and silu(x) = x / (1 + e^-x), torch's forms, in the
    compiled kernel, the numpy path and the reference engine alike. The former
    0.5 tanh(x / 2) + 0.5 rounded sigmoid(-20) = 2.1e-9 to 0 (already past x = -17 in f32),
    and with it silu's negative tail; here each path is within a few ulps of torch."""
    torch = pytest.importorskip("torch")
    xs = np.array([-100.0, -87.0, -60.0, -30.0, -20.0, -17.5, -5.0, -0.5, -0.0, 0.0, 1e-3, 0.5, 5.0,
                   20.0, 100.0, math.inf, -math.inf, math.nan])
    a = xs.astype(to_numpy(dtype))
    t = torch.from_numpy(xs.astype(np.float32 if dtype == "bf16" else to_numpy(dtype)))
    for name, want in (("sigmoid", torch.sigmoid(t)), ("silu", torch.nn.functional.silu(t))):
        want = want.to(torch.bfloat16).float() if dtype == "bf16" else want
        want = want.numpy().astype(np.float64)
        op = Einsummable.from_spec("i->i", [xs.shape], join=f"{name}(x0)", dtypes=[dtype])
        compiled = native.kernel(op, None)
        native.flush()
        with monkeypatch.context() as m:
            m.setenv(cbuild.ENV, "numpy")
            numpy_path = kernels.prepare.__wrapped__(op)
        with np.errstate(all="ignore"):
            paths = {"compiled": compiled([a], None), "numpy path": numpy_path([a], None),
                     "reference": reference_kernel.einsum(op, [a])}
        for path, got in paths.items():
            g = got.astype(np.float64)
            assert (np.isnan(g) == np.isnan(want)).all(), (name, path, got)
            ok = np.isfinite(want)
            tol = 4 * EPS[dtype] * np.abs(want[ok]) + 1e-44
            assert (np.abs(g[ok] - want[ok]) <= tol).all(), f"{name} ({dtype}, {path}): {got} vs torch {want}"
            assert (g[np.isinf(want)] == want[np.isinf(want)]).all(), (name, path, got)
            assert g[list(xs).index(-20.0)] != 0  # the tail: 2.1e-9 (sigmoid), -4.1e-8 (silu)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_sigmoid_and_silu_are_their_exp_forms_bit_for_bit(dtype):
    """sigmoid and silu run on a denominator of their own (cprelude's one_plus_exp_neg_f:
    one power-of-two factor, -x clamped): bit-equal to the same join spelt with exp, over
    every f32 step of 1/64 from -110 to 110 (both overflow edges, 88.72 and 103.97, inside)."""
    steps = np.arange(-110 * 64, 110 * 64 + 1) / 64.0
    xs = np.concatenate([steps, SPECIAL, [88.7228, 88.7229, -88.7228, 1e-30]]).astype(to_numpy(dtype))
    pairs = {"sigmoid(x0)": "1 / (1 + exp(-x0))", "silu(x0)": "x0 / (1 + exp(-x0))",
             "silu(x0) * x0": "x0 / (1 + exp(-x0)) * x0"}
    compiled = [tuple(native.kernel(Einsummable.from_spec("i->i", [xs.shape], join=j, dtypes=[dtype]), None)
                      for j in pair) for pair in pairs.items()]
    native.flush()
    for (own, spelt), join in zip(compiled, pairs, strict=True):
        got, want = own([xs], None), spelt([xs], None)
        bits = np.uint32 if dtype == "f32" else np.uint64
        same = (got.view(bits) == want.view(bits)) | (np.isnan(got) & np.isnan(want))  # any NaN
        assert same.all(), f"{join}: {xs[~same][:4]} -> {got[~same][:4]}, exp form {want[~same][:4]}"
