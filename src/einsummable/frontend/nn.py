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
from einsummable.frontend.einsum import einsum
from einsummable.frontend.shapes import normalize_axes
from einsummable.frontend.tensor import Tensor, elementwise, matmul
from einsummable.ir.dtypes import HALF

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


def _up(expr: str, dtype: str) -> str:
    """``expr`` in f32 when ``dtype`` is a half type: the sums of the helpers below
    accumulate, and their outputs round, in f32 (as torch's and JAX's do)."""
    return f"cast({expr}, f32)" if dtype in HALF else expr


def _down(expr: str, dtype: str) -> str:
    """An f32 result back in the half type ``dtype``, rounded once."""
    return f"cast({expr}, {dtype})" if dtype in HALF else expr


def _specs(x: Tensor, axis: int) -> tuple[str, str, str]:
    """Letters for x, for x without ``axis``, and for ``axis`` alone."""
    axis = normalize_axes(axis, x.ndim)[0]
    full = string.ascii_lowercase[: x.ndim]
    return full, full[:axis] + full[axis + 1 :], full[axis]


def relu(x: Tensor) -> Tensor:
    return elementwise("relu(x0)", x)


def gelu(x: Tensor) -> Tensor:
    """The tanh approximation of GELU (as GPT-2's ``gelu_new``)."""
    return elementwise("gelu(x0)", x)


def silu(x: Tensor) -> Tensor:
    return elementwise("silu(x0)", x)


# The max shifts the exponent; an infinite max shifts by 0 (as torch does), so that a row
# of -inf alone sums to exp(-inf) = 0, not exp(-inf + inf) = NaN. On a row vector: cheap.
SHIFT = "stop_gradient(where(abs(x{k}) == inf, 0, x{k}))"


def _max_and_sum_exp(x: Tensor, axis: int, shift: str = SHIFT) -> tuple[Tensor, Tensor, str, str]:
    """The max and the sum of ``exp(x - shift)``, in f32 for half types."""
    full, red, _ = _specs(x, axis)
    m = x.max(axis)
    s = einsum(f"{full},{red}->{red}", x, m, join=_up(f"exp(x0 - {shift.format(k=1)})", x.dtype), agg="add")
    return m, s, full, red


# Softmax shifts by a max of +inf too, as torch does: a row holding +inf is NaN throughout
# (inf - inf), where a shift of 0 would give [0, ..., 0, nan]. A row of -inf alone is 0 / 0.
SOFTMAX_SHIFT = "stop_gradient(where(x{k} == -inf, 0, x{k}))"


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``exp(x - max) / sum(exp(x - max))``, the exponential divided by its sum (in f32 for
    half types, rounded once): exact to a few ulps at any offset, where ``exp(x -
    logsumexp)`` loses the offset's digits (4.7e-4 relative at 1e4 in f32)."""
    m, s, full, red = _max_and_sum_exp(x, axis, SOFTMAX_SHIFT)
    join = _down(f"{_up(f'exp(x0 - {SOFTMAX_SHIFT.format(k=1)})', x.dtype)} / x2", x.dtype)
    return einsum(f"{full},{red},{red}->{full}", x, m, s, join=join)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    m, s, full, red = _max_and_sum_exp(x, axis)
    join = _down(f"{_up(f'x0 - {SHIFT.format(k=1)}', x.dtype)} - log(x2)", x.dtype)
    return einsum(f"{full},{red},{red}->{full}", x, m, s, join=join)


def logsumexp(x: Tensor, axis: int = -1, keepdims: bool = False) -> Tensor:
    """log(sum(exp(x))) over ``axis``: -inf for a row of -inf alone, as torch gives;
    ``keepdims`` keeps ``axis`` as size 1, to broadcast back against ``x``."""
    out = _logsumexp(x, axis, x.dtype)
    if not keepdims:
        return out
    a = normalize_axes(axis, x.ndim)[0]
    return out.reshape((*x.shape[:a], 1, *x.shape[a + 1 :]))


def _logsumexp(x: Tensor, axis: int, dtype: str) -> Tensor:
    """logsumexp in ``dtype``: f32 for cross-entropy, which subtracts from it before rounding."""
    m, s, _, red = _max_and_sum_exp(x, axis)
    join = _down(f"{_up(SHIFT.format(k=0), x.dtype)} + log(x1)", dtype)
    return einsum(f"{red},{red}->{red}", m, s, join=join)


def rmsnorm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis (Llama's RMSNorm).

    Half types square and sum in f32, so an f16 row of 30s does not overflow to inf.
    """
    full, red, last = _specs(x, -1)
    n = x.shape[-1]
    ms = einsum(f"{full}->{red}", x, join=_up(f"x0 * x0 * {1.0 / n!r}", x.dtype), agg="add")
    scaled = f"{_up('x0', x.dtype)} * rsqrt(x1 + {eps!r})"
    if weight is None:
        return einsum(f"{full},{red}->{full}", x, ms, join=_down(scaled, x.dtype))
    _check_last(weight, n, "rmsnorm weight")
    join = _down(f"{scaled} * {_up('x2', weight.dtype)}", x.dtype)
    return einsum(f"{full},{red},{last}->{full}", x, ms, weight, join=join)


def layernorm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
              eps: float = 1e-5) -> Tensor:
    """Half types take the mean and variance, and scale, in f32, rounding once."""
    full, red, last = _specs(x, -1)
    n, dtype = x.shape[-1], x.dtype
    mean = einsum(f"{full}->{red}", x, join=_up(f"x0 * {1.0 / n!r}", dtype), agg="add")
    centred = f"({_up('x0', dtype)} - x1)"
    var = einsum(f"{full},{red}->{red}", x, mean, join=f"{centred} ** 2 * {1.0 / n!r}", agg="add")
    y = f"{centred} * rsqrt(x2 + {eps!r})"
    operands, specs = [x, mean, var], [full, red, red]
    for t, what, op in ((weight, "layernorm weight", "*"), (bias, "layernorm bias", "+")):
        if t is not None:
            _check_last(t, n, what)
            y = f"{y} {op} {_up(f'x{len(operands)}', t.dtype)}"
            operands.append(t)
            specs.append(last)
    return einsum(f"{','.join(specs)}->{full}", *operands, join=_down(y, dtype))


def cross_entropy(logits: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy over the last axis.

    ``targets`` holds class ids (shape ``logits.shape[:-1]``, i32 or i64 as torch takes
    them, or floats holding whole numbers; compared against an index ramp, so no one-hot
    is fed) or probabilities (the shape of ``logits``). Half-precision logits give a loss
    of their dtype, computed in f32 and rounded once: the loss is a small difference of
    large logsumexps.
    """
    full, red, last = _specs(logits, -1)
    dtype = logits.dtype
    wide = "f32" if dtype in HALF else dtype
    lse = _logsumexp(logits, -1, wide)
    if targets.shape == logits.shape:
        picked = einsum(f"{full},{full}->{red}", logits, targets, join=_up("x0 * x1", dtype), agg="add")
        lse_weight = einsum(f"{full}->{red}", targets, join=_up("x0", targets.dtype), agg="add")
        per_row = einsum(f"{red},{red},{red}->{red}", lse, lse_weight, picked, join="x0 * x1 - x2")
    elif targets.shape == logits.shape[:-1]:
        classes = logits.shape[-1]
        mark_class_ids(targets, classes, "cross_entropy targets")
        ramp = logits.graph.ramp((classes,), steps=(1.0,), dtype=targets.dtype)
        picked = einsum(f"{full},{red},{last}->{red}", logits, targets, ramp,
                        join="where(x1 == x2, x0, 0)", agg="add")
        per_row = einsum(f"{red},{red}->{red}", lse, picked, join=f"x0 - {_up('x1', dtype)}")
    else:
        raise ShapeError(
            f"cross_entropy targets have shape {targets.shape}; expected class ids of shape "
            f"{logits.shape[:-1]} or probabilities of shape {logits.shape}"
        )
    if reduction == "none":
        return per_row.astype(dtype)
    if reduction == "sum":
        return per_row.sum().astype(dtype)
    if reduction == "mean":
        return per_row.mean().astype(dtype)
    raise ShapeError(f"unknown reduction {reduction!r}; expected 'mean', 'sum' or 'none'")


def _check_last(t: Tensor, n: int, what: str) -> None:
    if t.shape != (n,):
        raise ShapeError(f"{what} has shape {t.shape}; expected ({n},)")
