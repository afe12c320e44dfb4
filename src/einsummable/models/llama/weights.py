"""Hugging Face Llama checkpoints: config.json plus model.safetensors (or a sharded index).

Loading regroups the attention projections into our per-head layout; saving
undoes it, so a checkpoint trained here loads back in ``transformers``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

import einsummable.models.llama.safetensors_io as safetensors_io
from einsummable.errors import CheckpointError, ConfigError
from einsummable.ir.dtypes import to_numpy
from einsummable.models import atomic
from einsummable.models.llama.config import LlamaConfig
from einsummable.models.llama.tokenizer import TokenizerFiles


def hf_shape(cfg: LlamaConfig, name: str) -> tuple[int, ...]:
    """The shape Hugging Face stores ``name`` in: heads flattened into rows (or, for
    o_proj, columns); every other parameter as ours."""
    want = cfg.parameter_shapes()[name]
    if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
        return (math.prod(want[:-1]), want[-1])
    if name.endswith("o_proj.weight"):
        return (want[0], math.prod(want[1:]))
    if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
        return (math.prod(want),)
    return want


def to_ours(cfg: LlamaConfig, name: str, w: np.ndarray) -> np.ndarray:
    return w.reshape(cfg.parameter_shapes()[name])


def to_hf(cfg: LlamaConfig, name: str, w: np.ndarray) -> np.ndarray:
    return w.reshape(hf_shape(cfg, name)) if name in cfg.parameter_shapes() else w


def load_config(model_dir: str | Path) -> LlamaConfig:
    path = Path(model_dir) / "config.json"
    if not Path(model_dir).is_dir():
        what = "is a file, not a model directory" if Path(model_dir).exists() else "no such directory"
        raise CheckpointError(f"{model_dir}: {what} (a model directory holds config.json and the weights)")
    if not path.is_file():
        if (Path(model_dir) / "adapter_config.json").is_file():
            raise CheckpointError(f"{model_dir} holds LoRA adapters, not a model: merge them into their base "
                                  f"(einsummable train --resume {model_dir} --merge DIR)")
        raise CheckpointError(f"{model_dir}: no config.json")
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ConfigError(f"{path}: not valid JSON ({err})") from None
    try:
        return LlamaConfig.from_hf(config)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def _read_tensors(model_dir: Path) -> dict[str, np.ndarray]:
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    if single.exists():
        return safetensors_io.load(single)
    if index.exists():
        weight_map = _weight_map(index)
        tensors: dict[str, np.ndarray] = {}
        for shard in sorted(set(weight_map.values())):
            part = safetensors_io.load(_inside(model_dir, shard, index))
            twice = sorted(set(part) & set(tensors))
            if twice:
                raise CheckpointError(f"{index}: tensors {twice[:5]} are in two shards, the second {shard!r}")
            tensors |= part
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise CheckpointError(f"{index}: tensors {missing[:5]} are listed but in no shard")
        return tensors
    raise CheckpointError(f"{model_dir}: neither model.safetensors nor model.safetensors.index.json")


def files(model_dir: str | Path) -> list[str]:
    """The files a load reads, by name in ``model_dir``: config.json, then model.safetensors
    or the shard index and its shards."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if (model_dir / "model.safetensors").exists() or not index.exists():
        return ["config.json", "model.safetensors"]
    shards = sorted(set(_weight_map(index).values()))
    return ["config.json", index.name, *(str(_inside(model_dir, shard, index).relative_to(model_dir))
                                         for shard in shards)]


def _weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, KeyError, TypeError) as err:
        raise CheckpointError(f"{index}: not a shard index with a weight_map ({err!r})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: weight_map must map tensor names to shard file names")
    return weight_map


def _inside(model_dir: Path, shard: str, index: Path) -> Path:
    """The shard's path, which must stay in the model directory: no absolute path, no
    "..", no symlink out. A Hugging Face hub snapshot (``.../snapshots/<rev>/``) links
    its files into the repository's ``blobs``, so there the repository's cache folder
    is the bound."""
    root = model_dir.resolve()
    if root.parent.name == "snapshots":
        root = root.parent.parent
    path = model_dir / shard
    if Path(shard).is_absolute() or ".." in Path(shard).parts or not path.resolve().is_relative_to(root):
        raise CheckpointError(f"{index}: shard {shard!r} is outside the model directory {model_dir}")
    return path


def load(model_dir: str | Path, dtype: str = "f32") -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    """Config and parameters in our layout, cast to ``dtype`` (f32 or bf16).

    Every tensor must have exactly the shape the config gives it in Hugging Face's
    layout (a transposed matrix is not a reshape of the right one), and every
    tensor in the checkpoint must be one the config has. The file is mapped and each
    tensor copied out, then released: a load peaks at the model's size plus one tensor.
    """
    model_dir = Path(model_dir)
    cfg = load_config(model_dir)
    tensors = _read_tensors(model_dir)
    shapes = cfg.parameter_shapes()
    unexpected = sorted(set(tensors) - set(shapes))
    if unexpected:
        raise CheckpointError(f"{model_dir}: tensor(s) {unexpected[:5]} are not parameters of the Llama "
                              "its config.json describes")
    params = {}
    for name in shapes:
        if name not in tensors:
            raise CheckpointError(f"{model_dir}: tensor {name!r} is missing from the checkpoint")
        w, want = tensors[name], hf_shape(cfg, name)
        if w.shape != want:
            raise CheckpointError(
                f"{model_dir}: tensor {name!r} has shape {w.shape}; the config says {want}"
            )
        params[name] = to_ours(cfg, name, w).astype(to_numpy(dtype))
        safetensors_io.release(w)  # copied: the map's pages need not stay resident
    return cfg, params


def save(model_dir: str | Path, cfg: LlamaConfig, params: dict[str, np.ndarray],
         extra: dict[str, np.ndarray] | None = None,
         tokenizer: str | Path | TokenizerFiles | None = None) -> None:
    """Write config.json and model.safetensors in the Hugging Face layout.

    ``tokenizer`` (the directory the model came from, ``"bytes"``, or ``TokenizerFiles``)
    adds its tokenizer files and special-token ids. The directory is replaced whole
    (see ``atomic``): a crash during the save leaves the previous model as it was.
    """
    files = tokenizer if isinstance(tokenizer, TokenizerFiles) else TokenizerFiles.read(tokenizer)
    with atomic.replacing(model_dir) as fresh:
        write(fresh, cfg, params, extra, files)


def write(model_dir: Path, cfg: LlamaConfig, params: dict[str, np.ndarray],
          extra: dict[str, np.ndarray] | None = None, tokenizer: TokenizerFiles | None = None) -> None:
    """The files of ``save``, written into an existing directory (one being assembled)."""
    (model_dir / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    tensors = {name: to_hf(cfg, name, np.asarray(w)) for name, w in params.items()}
    safetensors_io.save(tensors | (extra or {}), model_dir / "model.safetensors")
    if tokenizer is not None:
        tokenizer.write(model_dir)
