"""Peak memory of loading a ~1 GB Llama checkpoint (issue 19 item 6), before and after.

Run: PYTHONPATH=src python benchmarks/load_rss.py [--gb 1.0]

Writes a random f32 Llama checkpoint (config.json + model.safetensors) to a temporary
directory, loads it in a fresh subprocess per loader, and prints each loader's peak
resident set (``ru_maxrss``) above the interpreter's own, against the file's size and its
largest tensor (``ru_maxrss``'s counter; see PRELUDE). The loaders, all in the same run:

- ``weights.load`` (after): our reader maps the file; each tensor is copied once into our
  layout and its pages of the map are let go.
- ``mapped, kept resident`` (main at 9560447): the map without the release: every page
  read stays resident until the load returns, so the peak is the copies plus the file.
- ``whole-file read`` (before): what the reader did before it mapped the file: read every
  byte, copy each tensor out of the bytes, then cast into our layout (a second copy).
- ``safetensors.numpy.load_file``: the safetensors package's own loader, for reference
  (its arrays alone, not converted to our layout).

The temporary directory is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from einsummable.models.llama.config import LlamaConfig
from einsummable.models.llama.weights import hf_shape

# Each snippet runs in a fresh interpreter: ``path`` is the model directory. It prints the
# peak RSS before and after the load, so the interpreter's own imports are not counted.
# The peak is the process's VmHWM, the counter getrusage's ru_maxrss reports, read from
# /proc: ru_maxrss itself carries the parent's peak across fork and exec on Linux.
PRELUDE = """
import sys
from pathlib import Path
import numpy as np
from einsummable.models.llama import safetensors_io, weights
from einsummable.models.llama.weights import to_ours
def peak():
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024
path = Path(sys.argv[1])
before = peak()
"""
LOADERS = {
    "weights.load (after)": "cfg, params = weights.load(path)",
    "mapped, kept resident (9560447)": """
from einsummable.models.llama.weights import load_config
tensors = safetensors_io.load(path / "model.safetensors")
cfg = load_config(path)
params = {name: to_ours(cfg, name, w).astype(np.float32) for name, w in tensors.items()}
""",
    "whole-file read (before)": """
import json, struct
from einsummable.models.llama.weights import load_config
data = (path / "model.safetensors").read_bytes()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8 : 8 + n])
body = memoryview(data)[8 + n :]
tensors = {name: np.frombuffer(body[e["data_offsets"][0] : e["data_offsets"][1]], np.float32)
           .reshape(e["shape"]).copy() for name, e in header.items() if name != "__metadata__"}
del data, body
cfg = load_config(path)
params = {name: to_ours(cfg, name, w).astype(np.float32) for name, w in tensors.items()}
""",
    "safetensors.numpy.load_file": """
from safetensors.numpy import load_file
tensors = load_file(path / "model.safetensors")
""",
}
EPILOGUE = """
print(before, peak())
"""


def config_of_size(gb: float) -> LlamaConfig:
    """A Llama-7B-shaped model, fewer layers and narrower, of about ``gb`` GB in f32."""
    d, f, vocab = 1024, 2816, 32000
    per_layer = 4 * d * d + 3 * d * f + 2 * d
    layers = max(1, round((gb * 1e9 / 4 - 2 * vocab * d) / per_layer))
    return LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=f, num_hidden_layers=layers,
                       num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False)


def write_checkpoint(directory: Path, cfg: LlamaConfig) -> tuple[int, int]:
    """Random weights, written one tensor at a time (the writer never holds the model);
    returns the file's size and its largest tensor's, in bytes."""
    shapes = {name: hf_shape(cfg, name) for name in sorted(cfg.parameter_shapes())}
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        size = math.prod(shape) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    rng = np.random.default_rng(0)
    with open(directory / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for shape in shapes.values():
            f.write(rng.standard_normal(shape, dtype=np.float32).tobytes())
    (directory / "config.json").write_text(json.dumps(cfg.to_hf()))
    return (directory / "model.safetensors").stat().st_size, max(math.prod(s) * 4 for s in shapes.values())


def peak_bytes(code: str, directory: Path) -> int | None:
    """The loader's peak RSS above the interpreter's, measured in a fresh process; None if it failed."""
    done = subprocess.run([sys.executable, "-c", PRELUDE + code + EPILOGUE, str(directory)],
                          capture_output=True, text=True, env=os.environ.copy())
    if done.returncode != 0:
        print(f"  (failed: {done.stderr.strip().splitlines()[-1]})")
        return None
    before, after = map(int, done.stdout.split())
    return after - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="checkpoint size in GB")
    args = parser.parse_args()
    cfg = config_of_size(args.gb)
    with tempfile.TemporaryDirectory(prefix="load_rss-", dir="/tmp") as tmp:
        size, largest = write_checkpoint(Path(tmp), cfg)
        print(f"checkpoint: {cfg.num_hidden_layers}-layer Llama, d={cfg.hidden_size}, "
              f"{size / 2**30:.2f} GiB file, largest tensor {largest / 2**20:.0f} MiB")
        print(f"  {'loader':<32} {'peak RSS':>10} {'/ file':>7} {'(peak - file) / largest':>24}")
        for name, code in LOADERS.items():
            peak = peak_bytes(code, Path(tmp))
            if peak is not None:
                over = (peak - size) / largest
                print(f"  {name:<32} {peak / 2**30:7.2f} GiB {peak / size:7.2f} {over:24.2f}")


if __name__ == "__main__":
    main()
