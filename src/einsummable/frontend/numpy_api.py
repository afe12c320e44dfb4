"""numpy's functions on a Tensor (``np.sum(x)``, ``np.transpose(x)``): the common
reductions and reshapes map to the Tensor's methods; anything else, or an argument a graph
cannot honour (``out=``, ``where=``), is a clear GraphError instead of numpy's TypeError.

Duck-typed on the Tensor's methods, so this module imports nothing of the frontend.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from einsummable.errors import GraphError

# numpy function -> (the Tensor's method, the keyword arguments it takes)
REDUCTIONS = {np.sum: "sum", np.mean: "mean", np.max: "max", np.min: "min", np.prod: "prod",
              np.amax: "max", np.amin: "min"}
_KEYWORDS = {"axis", "keepdims"}


def dispatch(func: Callable, args: tuple, kwargs: dict) -> object:
    """The Tensor method ``func`` stands for, applied; or a GraphError that says what works."""
    name = getattr(func, "__name__", repr(func))
    kwargs = {k: v for k, v in kwargs.items() if v is not None}  # out=None and the like ask nothing
    if func in REDUCTIONS:
        _refuse_extras(name, kwargs, _KEYWORDS, args, 2)
        axis = args[1] if len(args) > 1 else kwargs.get("axis")
        return getattr(args[0], REDUCTIONS[func])(axis=axis, keepdims=kwargs.get("keepdims", False))
    if func is np.transpose:
        _refuse_extras(name, kwargs, {"axes"}, args, 2)
        axes = args[1] if len(args) > 1 else kwargs.get("axes")
        return args[0].transpose(*(() if axes is None else (tuple(axes),)))
    if func is np.reshape:
        _refuse_extras(name, kwargs, {"shape", "newshape"}, args, 2)
        shape = args[1] if len(args) > 1 else kwargs.get("shape", kwargs.get("newshape"))
        return args[0].reshape(shape)
    raise GraphError(f"np.{name} does not run on an einsummable Tensor, a node of a graph with no values "
                     "until the program runs; use the Tensor's methods (.sum, .mean, .max, .min, .prod, "
                     ".transpose, .reshape) or es.einsum")


def _refuse_extras(name: str, kwargs: dict, allowed: set[str], args: tuple, positional: int) -> None:
    extra = sorted(set(kwargs) - allowed)
    if len(args) > positional:
        extra.append(f"{len(args) - positional} more positional argument(s)")
    if extra:
        raise GraphError(f"np.{name} on an einsummable Tensor takes {sorted(allowed)}, not {extra}: "
                         "a graph has no arrays to write into or mask")
