"""Neural-network helpers, each written in the language itself as einsummables.

No helper adds a node kind: a fused softmax is a max, an ``exp(x0 - x1)`` summed
over the axis, and one elementwise join. That is what the planner decomposes and
autodiff differentiates. The max only shifts the exponent for stability and the
result does not depend on it, so its gradient is stopped: the backward pass never
differentiates through the max.
"""

from __future__ import annotations

import string

from einsummable.errors import ShapeError
from einsummable.frontend.class_ids import mark_class_ids
from einsummable.frontend.core import Tensor, _axes, elementwise
from einsummable.frontend.einsum import einsum, matmul

__all__ = [
    "cross_entropy",
    "gelu",
    "layernorm",
    "log_softmax",
    "logsumexp",
    "matmul",
    "relu",
    "rmsnorm",
    "silu",
    "softmax",
]


HALF = ("f16", "bf16")


def _specs(x: Tensor, axis: int) -> tuple[str, str, str]:
    """Letters for x, for x without ``axis``, and for ``axis`` alone."""
    axis = _axes(axis, x.ndim)[0]
    full = string.ascii_lowercase[: x.ndim]
    return full, full[:axis] + full[axis + 1 :], full[axis]


def relu(x: Tensor) -> Tensor:
    return elementwise("relu(x0)", x)


def gelu(x: Tensor) -> Tensor:
    """The tanh approximation of GELU (as GPT-2's ``gelu_new``)."""
    return elementwise("gelu(x0)", x)


def silu(x: Tensor) -> Tensor:
    return elementwise("silu(x0)", x)


def _max_and_sum_exp(x: Tensor, axis: int) -> tuple[Tensor, Tensor, str, str]:
    full, red, _ = _specs(x, axis)
    m = x.max(axis)
    s = einsum(f"{full},{red}->{red}", x, m, join="exp(x0 - stop_gradient(x1))", agg="add")
    return m, s, full, red


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``exp(x - logsumexp(x))``: its gradient reads the output back instead of recomputing it.

    In half precision logsumexp rounds to a step of up to 0.5 near 100, which would
    scale whole rows; there the exponential is divided by its sum instead.
    """
    if x.dtype in HALF:
        m, s, full, red = _max_and_sum_exp(x, axis)
        return einsum(f"{full},{red},{red}->{full}", x, m, s, join="exp(x0 - stop_gradient(x1)) / x2")
    full, red, _ = _specs(x, axis)
    return einsum(f"{full},{red}->{full}", x, logsumexp(x, axis), join="exp(x0 - x1)")


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    m, s, full, red = _max_and_sum_exp(x, axis)
    return einsum(f"{full},{red},{red}->{full}", x, m, s, join="x0 - stop_gradient(x1) - log(x2)")


def logsumexp(x: Tensor, axis: int = -1) -> Tensor:
    m, s, _, red = _max_and_sum_exp(x, axis)
    return einsum(f"{red},{red}->{red}", m, s, join="stop_gradient(x0) + log(x1)")


def rmsnorm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis (Llama's RMSNorm)."""
    full, red, last = _specs(x, -1)
    n = x.shape[-1]
    ms = einsum(f"{full}->{red}", x, join=f"x0 * x0 * {1.0 / n!r}", agg="add")
    if weight is None:
        return einsum(f"{full},{red}->{full}", x, ms, join=f"x0 * rsqrt(x1 + {eps!r})")
    _check_last(weight, n, "rmsnorm weight")
    return einsum(f"{full},{red},{last}->{full}", x, ms, weight, join=f"x0 * rsqrt(x1 + {eps!r}) * x2")


def layernorm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
              eps: float = 1e-5) -> Tensor:
    full, red, _ = _specs(x, -1)
    n = x.shape[-1]
    mean = x.mean(-1)
    var = einsum(f"{full},{red}->{red}", x, mean, join=f"(x0 - x1) ** 2 * {1.0 / n!r}", agg="add")
    y = einsum(f"{full},{red},{red}->{full}", x, mean, var, join=f"(x0 - x1) * rsqrt(x2 + {eps!r})")
    if weight is not None:
        _check_last(weight, n, "layernorm weight")
        y = y * weight
    if bias is not None:
        _check_last(bias, n, "layernorm bias")
        y = y + bias
    return y


def cross_entropy(logits: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy over the last axis.

    ``targets`` holds class ids (shape ``logits.shape[:-1]``, same float dtype,
    compared against an index ramp, so no one-hot is fed) or probabilities (the
    shape of ``logits``).
    """
    full, red, last = _specs(logits, -1)
    lse = logsumexp(logits, -1)
    if targets.shape == logits.shape:
        picked = einsum(f"{full},{full}->{red}", logits, targets)
        lse_weight = targets.sum(-1)
        per_row = einsum(f"{red},{red},{red}->{red}", lse, lse_weight, picked, join="x0 * x1 - x2")
    elif targets.shape == logits.shape[:-1]:
        classes = logits.shape[-1]
        mark_class_ids(targets, classes, "cross_entropy targets")
        ramp = logits.graph.ramp((classes,), steps=(1.0,), dtype=targets.dtype)
        picked = einsum(f"{full},{red},{last}->{red}", logits, targets, ramp,
                        join="where(x1 == x2, x0, 0)", agg="add")
        per_row = lse - picked
    else:
        raise ShapeError(
            f"cross_entropy targets have shape {targets.shape}; expected class ids of shape "
            f"{logits.shape[:-1]} or probabilities of shape {logits.shape}"
        )
    if reduction == "none":
        return per_row
    if reduction == "sum":
        return per_row.sum()
    if reduction == "mean":
        return per_row.mean()
    raise ShapeError(f"unknown reduction {reduction!r}; expected 'mean', 'sum' or 'none'")


def _check_last(t: Tensor, n: int, what: str) -> None:
    if t.shape != (n,):
        raise ShapeError(f"{what} has shape {t.shape}; expected ({n},)")
