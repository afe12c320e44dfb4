"""A cast of a constant in a join is a constant rounded to the cast's dtype, on every engine."""

import ml_dtypes
import numpy as np
import pytest

import einsummable as es
from einsummable.ir.dtypes import to_numpy


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
@pytest.mark.parametrize("engine", ["reference", "sequential", "local"])
def test_a_cast_constant_scales_a_reduction(dtype, engine):
    g = es.Graph()
    x = g.input("x", (4, 3), dtype)
    g.output("y", es.einsum("ab->a", x, join=f"cast(0.1, {dtype}) * x0", agg="add"))
    data = np.arange(12, dtype=np.float64).reshape(4, 3)
    got = es.compile(g, engine=engine).run({"x": data.astype(to_numpy(dtype))})["y"]
    scale = {"f32": np.float32(0.1), "bf16": ml_dtypes.bfloat16(0.1), "f64": 0.1}[dtype]
    want = (float(scale) * data).sum(axis=1)  # the constant rounded to the dtype, then summed
    tol = {"f32": 1e-6, "bf16": 1e-2, "f64": 1e-12}[dtype]
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=tol)
