"""Arrays from other libraries in, and out: anything with ``__dlpack__`` or ``__array__``
(torch, JAX, cupy on the host) is read as a numpy array without a copy where the
library allows it; ``like="torch"`` hands outputs back as torch tensors sharing memory.

bf16 has no DLPack code numpy understands, so a torch bf16 tensor travels as its 16-bit
pattern (an int16 view, no copy) and is reinterpreted as ``ml_dtypes.bfloat16``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from einsummable.errors import FeedError

LIKE = ("numpy", "torch")


def as_array(name: str, value: object) -> np.ndarray | object:
    """``value`` as a numpy array when it is an array of another library; anything else is
    returned as is, for the caller to refuse by name."""
    if isinstance(value, np.ndarray) or not (hasattr(value, "__dlpack__") or hasattr(value, "__array__")):
        return value
    if _is_torch(value):
        return _from_torch(value)
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (BufferError, TypeError, RuntimeError, ValueError) as err:
            if not hasattr(value, "__array__"):
                raise FeedError(f"input {name!r}: cannot read a {type(value).__name__} through DLPack "
                                f"({err}); give a numpy array") from None
    try:
        return np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as err:
        raise FeedError(f"input {name!r}: cannot read a {type(value).__name__} as an array ({err}); "
                        "give a numpy array") from None


def _is_torch(value: object) -> bool:
    return type(value).__module__.split(".")[0] == "torch"


def _from_torch(t: object) -> np.ndarray:
    import torch

    t = t.detach()  # a tensor that requires grad refuses export
    if t.device.type != "cpu":
        t = t.cpu()  # the one copy: device memory is not host memory
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def convert(outputs: Mapping[str, np.ndarray], like: str | None) -> dict[str, object]:
    """The outputs as ``like`` asks: numpy arrays (``None``, ``"numpy"``) or torch tensors."""
    if like is None or like == "numpy":
        return dict(outputs)
    if like != "torch":
        raise FeedError(f"like={like!r}: expected one of {LIKE}")
    import torch

    return {name: _to_torch(torch, a) for name, a in outputs.items()}


def _to_torch(torch: object, a: np.ndarray) -> object:
    if not a.flags.writeable:
        a = a.copy()  # torch tensors are writable; never alias memory the engine keeps read-only
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
