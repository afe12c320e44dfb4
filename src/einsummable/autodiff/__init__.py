"""Reverse-mode autodiff and rematerialisation, on the EinGraph itself."""

from einsummable.autodiff.grad import grad
from einsummable.autodiff.remat import peak_bytes, rematerialize

__all__ = ["grad", "peak_bytes", "rematerialize"]
