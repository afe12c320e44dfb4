"""The bundled demo corpus (einsummable/data/corpus.txt) as bytes: a byte-level Llama's tokens."""

from __future__ import annotations

from importlib import resources

import numpy as np


def corpus() -> np.ndarray:
    text = resources.files("einsummable").joinpath("data/corpus.txt").read_bytes()
    return np.frombuffer(text, dtype=np.uint8)
