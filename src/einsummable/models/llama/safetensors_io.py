"""The safetensors format read and written with numpy alone.

Our own reader lets bf16 load through ``ml_dtypes`` and lets a corrupt, truncated
or hostile file fail with an error that names the file and the problem. It checks
what the ``safetensors`` library checks: a JSON object header, known dtypes,
non-negative shapes, and byte ranges that tile the data exactly, in order, with
no gap or overlap. Tensors are memory-mapped, not read: ``load`` returns read-only
views of the file, so a load costs no more memory than the caller's own copies.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import stat
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from einsummable.errors import CheckpointError

DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype(np.int8),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
NAMES = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 100_000_000  # bytes; the safetensors library's own limit


def load(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor in the file, as read-only views of a memory map of it."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise CheckpointError(f"{path}: not a regular file")
            size = info.st_size
            if size < 8:
                raise CheckpointError(f"{path}: too short to be a safetensors file ({size} bytes)")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > min(size - 8, MAX_HEADER):
                raise CheckpointError(f"{path}: header claims {n} bytes but the file has {size - 8}")
            raw = f.read(n)
            entries = _entries(path, _header(path, raw), size - 8 - n)
            body = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)[8 + n :]
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read ({err.strerror or err})") from None
    return {name: body[lo:hi].view(dtype).reshape(shape) for name, (dtype, shape, lo, hi) in entries.items()}


def release(array: np.ndarray) -> None:
    """Drop a tensor of ``load``'s from this process's resident memory once it has been
    copied: its pages stay in the page cache and come back if read again. A loader that
    copies tensor by tensor and releases each then peaks at its copies plus one tensor,
    not plus the whole file. Arrays that are not views of a map are left alone."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    mapped = base.obj if isinstance(base, memoryview) else None
    if not isinstance(mapped, mmap.mmap) or array.nbytes == 0 or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = array.ctypes.data - np.frombuffer(mapped, np.uint8).ctypes.data
    first = start - start % mmap.PAGESIZE
    mapped.madvise(mmap.MADV_DONTNEED, first, start + array.nbytes - first)


def _header(path: Path, raw: bytes) -> dict:
    def unique(pairs: list[tuple[str, object]]) -> dict:
        keys = [k for k, _ in pairs]
        dup = next((k for k in keys if keys.count(k) > 1), None)
        if dup is not None:
            raise CheckpointError(f"{path}: the header names {dup!r} twice")
        return dict(pairs)

    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=unique)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: header is not valid JSON ({err})") from None
    except RecursionError:
        raise CheckpointError(f"{path}: header is nested too deeply to be a safetensors header") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is a JSON {type(header).__name__}, expected an object")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CheckpointError(f"{path}: __metadata__ must map strings to strings, got {meta!r:.200}")
    return header


def _entries(path: Path, header: dict, nbytes: int) -> dict[str, tuple[np.dtype, tuple[int, ...], int, int]]:
    """Each tensor's dtype, shape and byte range, after checking that the ranges tile the data."""
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        what = f"{path}: tensor {name!r}"
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise CheckpointError(f"{what} has a malformed header entry {info!r:.200}; "
                                  "expected dtype, shape and data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise CheckpointError(f"{what} has dtype {dtype!r:.50}; expected one of {sorted(DTYPES)}")
        if not isinstance(shape, list) or not all(_index(s) for s in shape):
            raise CheckpointError(f"{what} has shape {shape!r:.200}; expected a list of non-negative ints")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_index(o) for o in offsets):
            raise CheckpointError(f"{what} has data_offsets {offsets!r:.200}; "
                                  "expected [begin, end], two non-negative ints")
        lo, hi = offsets
        need = math.prod(shape) * DTYPES[dtype].itemsize
        if hi - lo != need:
            raise CheckpointError(f"{what} ({dtype}{shape}) needs {need} bytes but its data_offsets "
                                  f"[{lo}, {hi}] span {hi - lo}")
        entries[name] = (DTYPES[dtype], tuple(shape), lo, hi)
    end = 0
    for name, (_, _, lo, hi) in sorted(entries.items(), key=lambda e: (e[1][2], e[1][3])):
        if lo != end:
            problem = "overlaps the tensor before it" if lo < end else f"leaves bytes {end}..{lo} unclaimed"
            raise CheckpointError(f"{path}: tensor {name!r} at bytes [{lo}, {hi}] {problem}; "
                                  "tensors must tile the data in order")
        end = hi
    if end != nbytes:
        raise CheckpointError(
            f"{path}: the tensors claim {end} bytes of data but the file holds {nbytes}: "
            + ("the file is truncated or corrupt" if end > nbytes else "trailing bytes belong to no tensor")
        )
    return entries


def _index(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def save(tensors: dict[str, np.ndarray], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    arrays = []
    for name in sorted(tensors):
        a = np.asarray(tensors[name])
        if not a.flags.c_contiguous:  # not ascontiguousarray: it turns 0-d arrays into 1-d
            a = a.copy(order="C")
        if a.dtype not in NAMES:
            raise CheckpointError(f"cannot save tensor {name!r} of dtype {a.dtype}")
        header[name] = {"dtype": NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    # A new file swapped in, never the old one rewritten: ``load`` maps files, and
    # rewriting one in place would change (or truncate) the arrays mapped from it.
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for a in arrays:
            f.write(a.tobytes())
    os.replace(tmp, path)
