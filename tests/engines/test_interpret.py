"""The engines' numpy kernel table against the IR's op table: one kernel per op, same values."""

import numpy as np
import pytest

from einsummable.engines.kernels.interpret import KERNELS
from einsummable.ir.scalar_ops import OPS

PRIMITIVES = sorted(name for name, rule in OPS.items() if rule.expansion is None)  # gelu: its expansion's


def test_every_primitive_has_a_kernel_and_no_kernel_lacks_one():
    assert set(KERNELS) == set(PRIMITIVES)


@pytest.mark.parametrize("name", PRIMITIVES)
def test_kernel_writes_the_value_the_op_table_folds(name):
    rule = OPS[name]
    rng = np.random.default_rng(0)
    args = [rng.uniform(0.5, 2.0, 7) for _ in range(rule.arity)]
    if name == "where":
        args[0] = args[0] > 1.2
    if name == "pow":
        args[1] = 3.0  # the exponent is a constant
    want = np.asarray(rule.value(*args))
    out = np.empty(7, dtype=want.dtype)
    kernel, _ = KERNELS[name]
    kernel(out, *args)
    np.testing.assert_allclose(out, np.broadcast_to(want, (7,)), rtol=1e-14)
