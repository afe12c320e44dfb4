"""Llama 2/3 in the language (model.py), its Hugging Face checkpoints (weights.py,
safetensors_io.py), tokenizers (tokenizer.py), generation with a KV cache (generate.py)
and the bundled demo corpus (data.py). The model's names are re-exported here."""

from einsummable.models.llama.model import (
    PRESETS,
    QUERY_BLOCK,
    LlamaConfig,
    attend,
    attention,
    causal_attend,
    causal_mask,
    decoder,
    embed,
    forward,
    init_params,
    lm_head,
    loss_graph,
    mlp,
    parameters,
    rope_rotation,
)

__all__ = [
    "PRESETS",
    "QUERY_BLOCK",
    "LlamaConfig",
    "attend",
    "attention",
    "causal_attend",
    "causal_mask",
    "decoder",
    "embed",
    "forward",
    "init_params",
    "lm_head",
    "loss_graph",
    "mlp",
    "parameters",
    "rope_rotation",
]
