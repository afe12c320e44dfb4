"""Reverse-mode autodiff and rematerialisation, on the EinGraph itself."""

from einsummable.autodiff.grad import grad

__all__ = ["grad"]
