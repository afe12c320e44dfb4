"""Host storage for offloaded state (plan/offload.py): blocks in memory-mapped files.

A stored block is a numpy memmap of an unlinked temporary file in ``directory()`` (the
``EINSUMMABLE_STORAGE`` environment variable, else the system's temporary directory). Its
pages are the file's, which the kernel writes back and drops under memory pressure, so it
does not hold the machine's memory as an anonymous block does; the file goes with the last
view of it. An input kept in storage is loaded, a block at a time, as a copy in memory just
before its readers (its input task: lower/prefetch.py gates it); the output of its name is
stored block by block as its tasks make it.

    m = store(np.ones((4, 4), np.float32))     # a memmap; load(m) is an ordinary array again
"""

from __future__ import annotations

import os
import tempfile

import numpy as np


def directory() -> str:
    """Where stored blocks go: $EINSUMMABLE_STORAGE, else the system's temporary directory."""
    return os.environ.get("EINSUMMABLE_STORAGE") or tempfile.gettempdir()


def store(block: np.ndarray) -> np.ndarray:
    """A copy of ``block`` in host storage (an empty block stays in memory: nothing to map)."""
    block = np.asarray(block)
    if block.nbytes == 0:
        return block.copy()
    with tempfile.TemporaryFile(dir=directory()) as f:
        out = np.memmap(f, dtype=block.dtype, mode="w+", shape=block.shape)  # the mapping outlives f
    out[...] = block
    return out


def load(block: np.ndarray) -> np.ndarray:
    """A block read back from storage into memory."""
    return np.array(block, copy=True)
