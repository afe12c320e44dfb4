"""A Llama's configuration, and Hugging Face's config.json read strictly.

``from_hf`` knows every field a Llama config.json holds. A field that changes the
maths is implemented (RoPE scaling ``linear`` and ``llama3``, the attention and MLP
biases) or refused by name (another activation, another RoPE type, dropout, a
model that is not a Llama); fields that do not touch the forward pass (token ids,
the initialiser's scale, the saved dtype) are ignored. An unknown field is refused
too: we cannot know that it leaves the logits alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from einsummable.errors import ConfigError


@dataclass(frozen=True)
class RopeScaling:
    """Hugging Face's RoPE frequency scaling (see ``llama.inverse_frequency``).

    ``linear`` divides every frequency by ``factor``. ``llama3`` (Llama 3.1 and 3.2)
    divides those whose wavelength exceeds ``original_max_position_embeddings /
    low_freq_factor``, keeps those shorter than ``... / high_freq_factor``, and blends
    in between.
    """

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ("linear", "llama3"):
            raise ConfigError(f"rope_scaling type {self.rope_type!r} is not supported; "
                              "einsummable implements 'linear' and 'llama3'")
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            _positive_number(f"rope_scaling.{name}", getattr(self, name))
        _positive_int("rope_scaling.original_max_position_embeddings", self.original_max_position_embeddings)
        if self.rope_type == "llama3" and self.low_freq_factor >= self.high_freq_factor:
            raise ConfigError(f"rope_scaling.low_freq_factor {self.low_freq_factor} must be below "
                              f"high_freq_factor {self.high_freq_factor}")


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 172
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    rope_scaling: RopeScaling | None = None
    attention_bias: bool = False  # q, k, v and o projections
    mlp_bias: bool = False        # gate, up and down projections

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            _positive_int(name, getattr(self, name))
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        _positive_int("head_dim", self.head_dim)
        _positive_number("rms_norm_eps", self.rms_norm_eps)
        _positive_number("rope_theta", self.rope_theta)
        for name in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"field {name!r} must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.rope_scaling, dict):  # as asdict() gives it back
            try:
                object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
            except TypeError as err:
                raise ConfigError(f"field 'rope_scaling' {self.rope_scaling!r} is malformed: {err}") from None
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ConfigError(f"field 'rope_scaling' must be a RopeScaling, got {self.rope_scaling!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim {self.head_dim} must be even for RoPE")

    @property
    def groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @staticmethod
    def from_hf(config: dict) -> LlamaConfig:
        """Our config from a Hugging Face config.json's dict, or a ConfigError naming the field."""
        if not isinstance(config, dict):
            got = "null" if config is None else type(config).__name__
            raise ConfigError(f"a config must be a JSON object, got {got}")
        unknown = sorted(set(config) - set(_FIELDS) - set(_IGNORED) - set(_CHECKED))
        if unknown:
            raise ConfigError(f"unknown field(s) {unknown}: einsummable cannot tell whether they change "
                              "the model, so it refuses them")
        for name, allowed in _CHECKED.items():
            if name in config and config[name] not in allowed:
                raise ConfigError(f"field {name!r} is {config[name]!r}; einsummable's Llama supports only "
                                  + " or ".join(repr(a) for a in allowed if a is not None))
        missing = [n for n in _REQUIRED if n not in config]
        if missing:
            raise ConfigError(f"missing field(s) {missing}")
        kwargs = {k: v for k, v in config.items() if k in _FIELDS and v is not None}
        kwargs.setdefault("num_key_value_heads", config["num_attention_heads"])  # as transformers does
        kwargs.setdefault("rms_norm_eps", 1e-6)
        if config.get("rope_parameters") is not None and config.get("rope_scaling") is not None:
            raise ConfigError("fields 'rope_parameters' and 'rope_scaling' are both given; give one")
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise ConfigError(f"field 'rope_scaling' must be an object, got {rope!r}")
        rope = dict(rope)
        if "rope_theta" in rope:
            theta = rope.pop("rope_theta")
            if "rope_theta" in config and config["rope_theta"] != theta:
                raise ConfigError(f"field 'rope_theta' is {config['rope_theta']!r}, "
                                  f"but the rope parameters say {theta!r}")
            kwargs["rope_theta"] = theta
        max_positions = kwargs.get("max_position_embeddings", 2048)
        _positive_int("max_position_embeddings", max_positions)
        kwargs.pop("rope_parameters", None)
        kwargs["rope_scaling"] = _rope_scaling(rope, max_positions) if rope else None
        return LlamaConfig(**kwargs)

    def to_hf(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        scaling = out.pop("rope_scaling")
        if scaling is not None:
            linear = scaling.rope_type == "linear"
            keys = ["rope_type", "factor"] if linear else [f.name for f in fields(scaling)]
            out["rope_scaling"] = {k: getattr(scaling, k) for k in keys}
        out.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu")
        return out

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter in our layout, under its Hugging Face name."""
        g, r, j, d = self.num_key_value_heads, self.groups, self.head_dim // 2, self.hidden_size
        k, f, v = self.head_dim, self.intermediate_size, self.vocab_size
        shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes |= {
                p + "input_layernorm.weight": (d,),
                p + "self_attn.q_proj.weight": (g, r, 2, j, d),
                p + "self_attn.k_proj.weight": (g, 2, j, d),
                p + "self_attn.v_proj.weight": (g, k, d),
                p + "self_attn.o_proj.weight": (d, g, r, k),
                p + "post_attention_layernorm.weight": (d,),
                p + "mlp.gate_proj.weight": (f, d),
                p + "mlp.up_proj.weight": (f, d),
                p + "mlp.down_proj.weight": (d, f),
            }
            if self.attention_bias:
                shapes |= {p + "self_attn.q_proj.bias": (g, r, 2, j), p + "self_attn.k_proj.bias": (g, 2, j),
                           p + "self_attn.v_proj.bias": (g, k), p + "self_attn.o_proj.bias": (d,)}
            if self.mlp_bias:
                shapes |= {p + "mlp.gate_proj.bias": (f,), p + "mlp.up_proj.bias": (f,),
                           p + "mlp.down_proj.bias": (d,)}
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (v, d)
        return shapes


def _rope_scaling(rope: dict, max_positions: int) -> RopeScaling | None:
    """RopeScaling from Hugging Face's dict (``type`` or ``rope_type``); None for the default RoPE."""
    rope = dict(rope)
    kind = rope.pop("rope_type", rope.get("type"))
    legacy = rope.pop("type", kind)  # transformers' older name for rope_type
    if legacy != kind:
        raise ConfigError(f"rope_scaling gives two types, rope_type {kind!r} and type {legacy!r}")
    if rope.pop("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError("rope_scaling.partial_rotary_factor other than 1 is not supported")
    if kind in (None, "default"):
        if rope:
            raise ConfigError(f"rope_scaling fields {sorted(rope)} mean nothing to the default RoPE")
        return None
    if kind not in ("linear", "llama3"):
        raise ConfigError(f"rope_scaling type {kind!r} is not supported; einsummable implements 'linear' "
                          "and 'llama3'")
    names = {f.name for f in fields(RopeScaling)} - {"rope_type"}
    if kind == "linear":
        names = {"factor"}
    unknown = sorted(set(rope) - names)
    if unknown:
        raise ConfigError(f"rope_scaling fields {unknown} are not understood for type {kind!r}")
    needed = {"factor", "low_freq_factor", "high_freq_factor"} if kind == "llama3" else {"factor"}
    missing = sorted(needed - set(rope))
    if missing:
        raise ConfigError(f"rope_scaling of type {kind!r} needs field(s) {missing}")
    if kind == "llama3":
        rope.setdefault("original_max_position_embeddings", max_positions)  # as transformers does
    return RopeScaling(kind, **rope)


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"field {name!r} must be a positive integer, "
                          f"got {value!r} ({type(value).__name__})")


def _positive_number(name: str, value: object) -> None:
    if (not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
            or value <= 0):
        raise ConfigError(f"field {name!r} must be a positive number, got {value!r} ({type(value).__name__})")


_FIELDS = (*(f.name for f in fields(LlamaConfig)), "rope_parameters")
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# Fields that do not change the forward pass: token ids, training-time and library bookkeeping.
_IGNORED = (
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache", "pretraining_tp",
    "transformers_version", "torch_dtype", "dtype", "_name_or_path", "output_attentions",
    "output_hidden_states", "return_dict", "chunk_size_feed_forward", "is_encoder_decoder", "id2label",
    "label2id", "problem_type", "tokenizer_class",
)
# Fields whose other values would change the maths: only these values are accepted.
_CHECKED: dict[str, tuple] = {
    "model_type": ("llama",),
    "architectures": (["LlamaForCausalLM"], None),
    "hidden_act": ("silu",),
    "attention_dropout": (0, 0.0),
    "partial_rotary_factor": (1, 1.0),
}
