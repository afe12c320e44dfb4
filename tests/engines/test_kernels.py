"""The engines' fast kernels against numpy, on the shapes that pick each path."""

import numpy as np
import pytest

from einsummable.engines import kernels
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


@pytest.mark.parametrize("agg", ["add", "max", "min", "mul"])
def test_a_short_reduction_of_a_join_matches_numpy(agg):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 3), dtype=np.float32)
    y = rng.standard_normal((3, 2), dtype=np.float32)
    joined = np.exp(x[:, :, :, None] - y[None, None, :, :])         # [a, b, c, d]
    want = {"add": np.sum, "max": np.max, "min": np.min, "mul": np.prod}[agg](joined, axis=(0, 2))
    got = _run("abc,cd->bd", [x, y], join="exp(x0 - x1)", agg=agg)
    np.testing.assert_allclose(got, want, rtol=1e-5)
