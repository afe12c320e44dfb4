"""Blocks that start on a cache line, and blocks' addresses for the C kernels.

malloc aligns to 16 bytes; a 512-bit load or store at 16 mod 64 straddles two lines, and a
streaming join over such blocks measured 10% slower (silu(x) * y, 1.4M f32: 0.41 against
0.37 ms). Kernels' outputs (compiled joins, GEMMs) come from here, so the joins that read
them read whole lines."""

from __future__ import annotations

import math

import numpy as np

try:  # cffi's C module: its buffer view of a block gives the address in 0.2 us
    import _cffi_backend as _cffi
except ImportError:  # the slower way below serves
    _cffi = None

LINE = 64
ALIGN_FROM = 1 << 16  # bytes: smaller blocks stay plain np.empty (the offset would not pay)


def empty(shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, int]:
    """An uninitialised C-contiguous block and its address, on a cache line when large."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < ALIGN_FROM:
        out = np.empty(shape, dtype=dtype)
        return out, address(out)
    buf = np.empty(nbytes + LINE, dtype=np.uint8)
    at = address(buf)
    skip = -at % LINE
    return buf[skip : skip + nbytes].view(dtype).reshape(shape), at + skip


if _cffi is not None:
    _CHARS = _cffi.new_array_type(_cffi.new_pointer_type(_cffi.new_primitive_type("char")), None)
    _UINTPTR = _cffi.new_primitive_type("uintptr_t")


def address(a: np.ndarray) -> int:
    """The address of ``a``'s first element. Every kernel call takes one per operand and one for
    its output: cffi's buffer view takes 0.2 us where ``__array_interface__`` builds a dict
    (1.0 us); a block that is not C-contiguous (no simple buffer) takes the dict."""
    if _cffi is not None:
        try:
            return int(_cffi.cast(_UINTPTR, _cffi.from_buffer(_CHARS, a, False)))
        except (TypeError, ValueError, BufferError):
            pass
    return a.__array_interface__["data"][0]
