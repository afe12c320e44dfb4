"""Dtype names used throughout the IRs and their numpy counterparts.

Dtypes are short strings ("f32", "bf16", ...) so that IR text stays readable and
nodes stay hashable. bf16 comes from ``ml_dtypes``.
"""

import ml_dtypes
import numpy as np

from einsummable.errors import DtypeError

NUMPY: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "c64": np.dtype(np.complex64),
}
DTYPES = tuple(NUMPY)
FLOATS = ("f16", "bf16", "f32", "f64")
COMPLEX = ("c64",)
DEFAULT = "f32"
_BY_NUMPY = {v: k for k, v in NUMPY.items()}
_REAL_OF = {"c64": "f32"}


def canonical(dtype: object) -> str:
    """Accept "f32", np.float32, np.dtype("float32") or "float32"; return the short name."""
    if isinstance(dtype, str) and dtype in NUMPY:
        return dtype
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        np_dtype = None
    if np_dtype is not None and np_dtype in _BY_NUMPY:
        return _BY_NUMPY[np_dtype]
    raise DtypeError(f"unsupported dtype {dtype!r}; expected one of {', '.join(DTYPES)}")


def to_numpy(dtype: str) -> np.dtype:
    return NUMPY[canonical(dtype)]


def real_of(dtype: str) -> str:
    """The real dtype underlying a complex one; a real dtype is its own."""
    return _REAL_OF.get(dtype, dtype)


def itemsize(dtype: str) -> int:
    return NUMPY[dtype].itemsize
