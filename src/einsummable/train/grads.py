"""The training convention for gradient outputs: the gradient of parameter ``w`` is named ``grad:w``.

Gradient-accumulation programs keep running sums of these resident on the workers
(``accumulate_gradients``), and the update program reads them as inputs of the same names.
"""

from __future__ import annotations

from collections.abc import Mapping

from einsummable.autodiff import grad
from einsummable.frontend.tensor import Graph, Tensor, elementwise

PREFIX = "grad:"
ACCUMULATE = "accumulate"  # the run-time variable: 0 starts the sums afresh, 1 adds to them


def grad_name(param: str) -> str:
    return PREFIX + param


def output_gradients(g: Graph, loss: Tensor, params: Mapping[str, Tensor]) -> None:
    """Append the gradient of ``loss`` for every parameter as the output ``grad:<name>``."""
    for name, d in zip(params, grad(loss, list(params.values())), strict=True):
        g.output(grad_name(name), d)


def accumulate_gradients(g: Graph, loss: Tensor, params: Mapping[str, Tensor], micro_batches: int) -> None:
    """Read the running sum ``grad:<name>`` of every parameter as an input and output it plus
    this micro-batch's gradient over ``micro_batches``: kept resident in a session, the
    sums never leave the workers. The first micro-batch runs with ``accumulate`` = 0,
    which drops the previous step's sums (a ``where``, so even a non-finite one)."""
    for (name, w), d in zip(params.items(), grad(loss, list(params.values())), strict=True):
        total = g.input(grad_name(name), w.shape, w.dtype)  # as the update program reads it
        join = f"where({ACCUMULATE} > 0, x0, 0.0) + x1 * {1.0 / micro_batches!r}"
        g.output(grad_name(name), elementwise(join, total, d).astype(w.dtype))
