"""Dtype names used throughout the IRs and their numpy counterparts.

Dtypes are short strings ("f32", "bf16", ...) so that IR text stays readable and
nodes stay hashable. bf16 comes from ``ml_dtypes``, imported on first use: it takes
most of a second to import, and planning, printing and simulating never need it.
The integers i32 and i64 carry ids and indices; ir/scalar_ops.py says which ops take them.
"""

from collections.abc import Sequence
from functools import cache

import numpy as np

from einsummable.errors import DtypeError

# short name -> the numpy dtype's name (ml_dtypes names bf16 "bfloat16")
NAMES: dict[str, str] = {
    "bool": "bool",
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "c64": "complex64",
    "i32": "int32",
    "i64": "int64",
}
DTYPES = tuple(NAMES)
FLOATS = ("f16", "bf16", "f32", "f64")
COMPLEX = ("c64",)
INTS = ("i32", "i64")  # ids and indices: joins, gathers, comparisons, casts, min/max, sums
HALF = ("f16", "bf16")  # computed and accumulated in f32, rounded once (engines/kernels/interpret.py)
DEFAULT = "f32"
_ITEMSIZE = {"bool": 1, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "i32": 4, "i64": 8}
_BY_NAME = {v: k for k, v in NAMES.items()}


def common_float(dtypes: Sequence[str]) -> str | None:
    """numpy's promotion of mixed floats: the widest (f16 with bf16 meets at f32, as in
    torch); None when there is no mix of floats to promote."""
    kinds = set(dtypes)
    if len(kinds) < 2 or not kinds <= set(FLOATS):
        return None
    bits = max(8 * _ITEMSIZE[d] for d in kinds)
    return "f32" if bits == 16 else f"f{bits}"


_REAL_OF = {"c64": "f32"}


@cache
def _numpy() -> dict[str, np.dtype]:
    import ml_dtypes

    return {k: np.dtype(ml_dtypes.bfloat16 if k == "bf16" else v) for k, v in NAMES.items()}


def canonical(dtype: object) -> str:
    """Accept "f32", "float32", np.float32, np.dtype("float32"), torch.float32 or
    jnp.bfloat16 (and "i64", "int64", np.int64, torch.int64 alike); return the short name."""
    if isinstance(dtype, str):
        if dtype in NAMES:
            return dtype
        if dtype.removeprefix("torch.") in _BY_NAME:
            return _BY_NAME[dtype.removeprefix("torch.")]
    elif type(dtype).__module__ == "torch":  # torch.dtype, without importing torch
        name = str(dtype).removeprefix("torch.")
        if name in _BY_NAME:
            return _BY_NAME[name]
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        np_dtype = None
    if np_dtype is not None and np_dtype.name in _BY_NAME:
        return _BY_NAME[np_dtype.name]
    raise DtypeError(f"unsupported dtype {dtype!r}; expected one of {', '.join(DTYPES)} "
                     "(or the numpy or torch dtype of one)")


def to_numpy(dtype: object) -> np.dtype:
    return _numpy()[canonical(dtype)]


def real_of(dtype: str) -> str:
    """The real dtype underlying a complex one; a real dtype is its own."""
    return _REAL_OF.get(dtype, dtype)


def itemsize(dtype: str) -> int:
    return _ITEMSIZE[dtype]
