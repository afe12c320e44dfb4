"""Training: optimizers as graph updates."""

from einsummable.train.optim import StateSpec, TrainStep, adam, adamw, clip_by_global_norm, sgd

__all__ = ["StateSpec", "TrainStep", "adam", "adamw", "clip_by_global_norm", "sgd"]
