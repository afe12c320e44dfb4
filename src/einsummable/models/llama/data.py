"""Training data as tokens (bytes, or a pretrained model's tokenizer's): a text file, or
the bundled demo corpus (einsummable/data/corpus.txt), named by ``BUNDLED`` so a
checkpoint can record it."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np

from einsummable.errors import EinsummableError
from einsummable.models.llama.tokenizer import ByteTokenizer, Tokenizer

BUNDLED = "bundled:corpus.txt"  # the data source of runs on the corpus shipped with the package


def load_data(source: str, tokenizer: Tokenizer | None = None) -> np.ndarray:
    """Tokens of a text file, or of the bundled corpus (``BUNDLED``): its bytes, or what
    ``tokenizer`` (a pretrained model's) makes of its text."""
    try:
        if source == BUNDLED:
            raw = resources.files("einsummable").joinpath("data/corpus.txt").read_bytes()
        else:
            raw = Path(source).read_bytes()
    except OSError as err:
        raise EinsummableError(f"cannot read the training data {source}: {err.strerror}") from None
    if tokenizer is None or isinstance(tokenizer, ByteTokenizer):
        return np.frombuffer(raw, dtype=np.uint8)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise EinsummableError(f"the training data {source} is not UTF-8 text ({err})") from None
    return np.array(tokenizer.encode(text), dtype=np.int64)


def corpus() -> np.ndarray:
    """The bundled demo corpus's tokens."""
    return load_data(BUNDLED)
