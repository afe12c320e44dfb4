"""The training convention for gradient outputs: the gradient of parameter ``w`` is named ``grad:w``.

Gradient-accumulation programs output these, the host sums them, and the update program
takes them back as inputs of the same names.
"""

from __future__ import annotations

from collections.abc import Mapping

from einsummable.autodiff import grad
from einsummable.frontend.tensor import Graph, Tensor

PREFIX = "grad:"


def grad_name(param: str) -> str:
    return PREFIX + param


def output_gradients(g: Graph, loss: Tensor, params: Mapping[str, Tensor]) -> None:
    """Append the gradient of ``loss`` for every parameter as the output ``grad:<name>``."""
    for name, d in zip(params, grad(loss, list(params.values())), strict=True):
        g.output(grad_name(name), d)
