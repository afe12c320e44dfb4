"""The safetensors format read and written with numpy alone.

Our own reader lets bf16 load through ``ml_dtypes`` and lets a corrupt or
truncated file fail with an error that names the tensor.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from einsummable.errors import CheckpointError

DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
NAMES = {v: k for k, v in DTYPES.items()}


def load(path: str | Path) -> dict[str, np.ndarray]:
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 8:
        raise CheckpointError(f"{path}: too short to be a safetensors file ({len(data)} bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise CheckpointError(f"{path}: header claims {n} bytes but the file has {len(data) - 8}")
    try:
        header = json.loads(data[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: header is not valid JSON ({err})") from None
    body = memoryview(data)[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = DTYPES[info["dtype"]]
            shape = tuple(info["shape"])
            lo, hi = info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor {name!r} has a malformed header entry {info!r}") from None
        if hi > len(body) or hi - lo != math.prod(shape) * dtype.itemsize:
            raise CheckpointError(
                f"{path}: tensor {name!r} ({info['dtype']}{list(shape)}) needs bytes {lo}..{hi} "
                f"but the file holds {len(body)}: the file is truncated or corrupt"
            )
        out[name] = np.frombuffer(body[lo:hi], dtype=dtype).reshape(shape).copy()
    return out


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
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for a in arrays:
            f.write(a.tobytes())
