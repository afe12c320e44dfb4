"""Hugging Face Llama checkpoints: config.json plus model.safetensors (or a sharded index).

Loading regroups the attention projections into our per-head layout; saving
undoes it, so a checkpoint trained here loads back in ``transformers``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from einsummable.errors import CheckpointError
from einsummable.ir.dtypes import to_numpy
from einsummable.models.llama import safetensors_io
from einsummable.models.llama.model import LlamaConfig


def to_ours(cfg: LlamaConfig, name: str, w: np.ndarray) -> np.ndarray:
    want = cfg.parameter_shapes()[name]
    return w.reshape(want)


def to_hf(cfg: LlamaConfig, name: str, w: np.ndarray) -> np.ndarray:
    if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
        return w.reshape(-1, cfg.hidden_size)
    if name.endswith("o_proj.weight"):
        return w.reshape(cfg.hidden_size, -1)
    return w


def load_config(model_dir: str | Path) -> LlamaConfig:
    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise CheckpointError(f"{model_dir}: no config.json")
    return LlamaConfig.from_hf(json.loads(path.read_text()))


def _read_tensors(model_dir: Path) -> dict[str, np.ndarray]:
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    if single.exists():
        return safetensors_io.load(single)
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        tensors: dict[str, np.ndarray] = {}
        for shard in sorted(set(weight_map.values())):
            tensors |= safetensors_io.load(model_dir / shard)
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise CheckpointError(f"{index}: tensors {missing[:5]} are listed but in no shard")
        return tensors
    raise CheckpointError(f"{model_dir}: neither model.safetensors nor model.safetensors.index.json")


def load(model_dir: str | Path, dtype: str = "f32") -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    """Config and parameters in our layout, cast to ``dtype`` (f32 or bf16)."""
    model_dir = Path(model_dir)
    cfg = load_config(model_dir)
    tensors = _read_tensors(model_dir)
    shapes = cfg.parameter_shapes()
    params = {}
    for name, shape in shapes.items():
        if name not in tensors:
            raise CheckpointError(f"{model_dir}: tensor {name!r} is missing from the checkpoint")
        w = tensors[name]
        if w.size != int(np.prod(shape)):
            raise CheckpointError(
                f"{model_dir}: tensor {name!r} has shape {w.shape}, which does not fit the config's {shape}"
            )
        params[name] = to_ours(cfg, name, w).astype(to_numpy(dtype))
    return cfg, params


def save(model_dir: str | Path, cfg: LlamaConfig, params: dict[str, np.ndarray],
         extra: dict[str, np.ndarray] | None = None) -> None:
    """Write config.json and model.safetensors in the Hugging Face layout."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    tensors = {name: to_hf(cfg, name, np.asarray(w)) for name, w in params.items()}
    safetensors_io.save(tensors | (extra or {}), model_dir / "model.safetensors")
