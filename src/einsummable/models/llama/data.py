"""Training data as byte-level tokens: a text file, or the bundled demo corpus
(einsummable/data/corpus.txt), named by ``BUNDLED`` so a checkpoint can record it."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np

from einsummable.errors import EinsummableError

BUNDLED = "bundled:corpus.txt"  # the data source of runs on the corpus shipped with the package


def load_data(source: str) -> np.ndarray:
    """Byte-level tokens of a text file, or of the bundled corpus (``BUNDLED``)."""
    if source == BUNDLED:
        text = resources.files("einsummable").joinpath("data/corpus.txt")
        return np.frombuffer(text.read_bytes(), dtype=np.uint8)
    try:
        return np.frombuffer(Path(source).read_bytes(), dtype=np.uint8)
    except OSError as err:
        raise EinsummableError(f"cannot read the training data {source}: {err.strerror}") from None


def corpus() -> np.ndarray:
    """The bundled demo corpus's tokens."""
    return load_data(BUNDLED)
