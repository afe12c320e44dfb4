"""LoRA adapters for the Llama (Hu et al. 2021), laid out and saved as PEFT saves them.

A target projection ``W`` (q_proj, ..., down_proj) computes ``W x + (alpha / r) B (A x)``
(``model.linear``): ``A`` [r, in] starts kaiming-uniform, ``B`` [out, r] at zeros, so
training starts from the base model exactly. Adapters are parameters named like
their weight, ``model.layers.0.self_attn.q_proj.lora_A.weight``; in our layout their
"in" and "out" sides keep the weight's per-head dimensions (A of q_proj is [r, d],
its B [g, r, c, j, r']), so converting to PEFT's [r, in] / [out, r] is a reshape.

A saved adapter directory is PEFT's: ``adapter_config.json`` and
``adapter_model.safetensors`` with the keys ``base_model.model.<name>``, loadable by
``peft.PeftModel.from_pretrained`` over the base model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import einsummable.models.llama.safetensors_io as safetensors_io
from einsummable.errors import CheckpointError, ConfigError
from einsummable.ir.dtypes import to_numpy
from einsummable.models.llama.config import LlamaConfig

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."  # PEFT's key prefix: PeftModel -> LoraModel -> LlamaForCausalLM
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
IN_DIMS = {"o_proj": 3}  # how many trailing dims of our weight W are its input (1 for the others)
# PEFT settings that would change what the adapters compute; we support their defaults only
_PLAIN = {"use_dora": False, "use_rslora": False, "fan_in_fan_out": False, "bias": "none",
          "modules_to_save": None, "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {}}


@dataclass(frozen=True)
class LoraConfig:
    """Rank, alpha and target projections; the adapters add ``(alpha / rank) B A`` to each target."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def __post_init__(self) -> None:
        # named as in adapter_config.json (a trainer's lora_rank is r): an infinite alpha or a
        # fractional rank would give non-finite or misshapen adapters, not an error
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ConfigError(f"LoRA r must be an integer >= 1, got {self.rank!r}")
        number = isinstance(self.alpha, int | float) and not isinstance(self.alpha, bool)
        if not (number and math.isfinite(self.alpha) and self.alpha > 0):
            raise ConfigError(f"LoRA lora_alpha must be a finite number > 0, got {self.alpha!r}")
        object.__setattr__(self, "targets", check_targets(self.targets))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def check_targets(targets: object, field: str = "target_modules") -> tuple[str, ...]:
    """``targets`` in the model's order; a clear error for an unknown, repeated or empty list
    (``field``: the setting that gave them)."""
    if not isinstance(targets, tuple | list) or not targets:
        raise ConfigError(f"LoRA {field} must be a non-empty list of {list(TARGETS)}, got {targets!r}")
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ConfigError(f"unknown LoRA target {unknown[0]!r}; the Llama's projections are {list(TARGETS)}")
    if len(set(targets)) != len(targets):
        raise ConfigError(f"LoRA {field} {list(targets)} name a projection twice")
    return tuple(sorted(targets, key=TARGETS.index))


def shapes(cfg: LlamaConfig, lora: LoraConfig) -> dict[str, tuple[int, ...]]:
    """Every adapter in our layout: A [r, *in dims of W], B [*out dims of W, r]."""
    out = {}
    for name, shape in cfg.parameter_shapes().items():
        module = name.removesuffix(".weight")
        target = module.rsplit(".", 1)[-1]
        if name.endswith(".weight") and target in lora.targets:
            n_in = IN_DIMS.get(target, 1)
            out[module + ".lora_A.weight"] = (lora.rank, *shape[-n_in:])
            out[module + ".lora_B.weight"] = (*shape[:-n_in], lora.rank)
    return out


def init(cfg: LlamaConfig, lora: LoraConfig, seed: int = 0, dtype: str = "f32") -> dict[str, np.ndarray]:
    """PEFT's initialisation: A kaiming-uniform (a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))), B zeros."""
    rng = np.random.default_rng([seed, 0x10AA])
    params = {}
    for name, shape in shapes(cfg, lora).items():
        if name.endswith("lora_A.weight"):
            bound = 1.0 / math.sqrt(math.prod(shape[1:]))
            params[name] = rng.uniform(-bound, bound, shape).astype(to_numpy(dtype))
        else:
            params[name] = np.zeros(shape, to_numpy(dtype))
    return params


def peft_shape(name: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """PEFT's matrix for an adapter of our ``shape``: A [r, in], B [out, r]."""
    if name.endswith("lora_A.weight"):
        return (shape[0], math.prod(shape[1:]))
    return (math.prod(shape[:-1]), shape[-1])


def delta(a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
    """``scale * B A`` in the weight's layout (our A [r, *in], B [*out, r]), in f32."""
    a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)
    flat = scale * (b32.reshape(-1, a32.shape[0]) @ a32.reshape(a32.shape[0], -1))
    return flat.reshape(b32.shape[:-1] + a32.shape[1:])


def merge(params: Mapping[str, np.ndarray], lora: LoraConfig) -> dict[str, np.ndarray]:
    """The base weights with each adapter folded in (``W + (alpha / r) B A``); adapters dropped."""
    merged = {n: w for n, w in params.items() if ".lora_" not in n}
    for name in params:
        if name.endswith(".lora_A.weight"):
            module = name.removesuffix(".lora_A.weight")
            w = merged[module + ".weight"]
            d = delta(params[name], params[module + ".lora_B.weight"], lora.scale)
            merged[module + ".weight"] = (np.asarray(w, np.float32) + d).astype(w.dtype)
    return merged


def save(directory: Path, cfg: LlamaConfig, lora: LoraConfig, adapters: Mapping[str, np.ndarray],
         base_model: str | None) -> None:
    """Write PEFT's two files into ``directory``; ``base_model`` is the base's directory."""
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank, "lora_alpha": lora.alpha,
              "target_modules": list(lora.targets), "lora_dropout": 0.0, "inference_mode": True,
              "init_lora_weights": True, "base_model_name_or_path": base_model, **_PLAIN}
    (directory / CONFIG).write_text(json.dumps(config, indent=2))
    shaped = shapes(cfg, lora)
    tensors = {}
    for name, w in adapters.items():
        if name not in shaped:
            raise CheckpointError(f"{name!r} is not an adapter of this model and LoRA config")
        tensors[PREFIX + name] = np.asarray(w).reshape(peft_shape(name, shaped[name]))
    safetensors_io.save(tensors, directory / WEIGHTS)


def read_config(directory: str | Path) -> tuple[LoraConfig, str | None]:
    """The adapters' LoraConfig and their base model's directory, from ``adapter_config.json``."""
    path = Path(directory) / CONFIG
    try:
        config = json.loads(path.read_text())
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read ({err.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise CheckpointError(f"{path}: expected a PEFT LoRA config (peft_type \"LORA\")")
    for key, plain in _PLAIN.items():
        value = config.get(key)
        if value is not None and value != plain and (plain not in ({}, None) or value):
            raise CheckpointError(f"{path}: {key} = {value!r} is not supported (only {plain!r})")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        raise CheckpointError(f"{path}: target_modules as a regular expression ({targets!r}) is not "
                              f"supported; list the projections, from {list(TARGETS)}")
    base = config.get("base_model_name_or_path")
    try:
        lora = LoraConfig(config.get("r"), config.get("lora_alpha"), () if targets is None else targets)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return lora, base if isinstance(base, str) else None


def load(directory: str | Path, cfg: LlamaConfig, lora: LoraConfig, dtype: str = "f32"
         ) -> dict[str, np.ndarray]:
    """The adapters of ``adapter_model.safetensors`` in our layout, each checked against the config."""
    path = Path(directory) / WEIGHTS
    if not path.is_file():
        raise CheckpointError(f"{directory}: no {WEIGHTS}")
    tensors = safetensors_io.load(path)
    want = shapes(cfg, lora)
    names = {key.removeprefix(PREFIX): key for key in tensors}
    unexpected = sorted(set(names) - set(want))
    missing = sorted(set(want) - set(names))
    if unexpected or missing:
        raise CheckpointError(f"{path}: the adapters do not fit {CONFIG} and the base model: "
                              f"unexpected {unexpected[:3]}, missing {missing[:3]}")
    adapters = {}
    for name, shape in want.items():
        w = tensors[names[name]]
        if w.shape != peft_shape(name, shape):
            raise CheckpointError(f"{path}: {names[name]} has shape {list(w.shape)}; the config and the "
                                  f"base model say {list(peft_shape(name, shape))}")
        adapters[name] = np.array(w.reshape(shape), to_numpy(dtype))
    return adapters
