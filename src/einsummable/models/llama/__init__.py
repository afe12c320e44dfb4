"""Llama 2/3 in the language (model.py), its configuration read strictly from Hugging Face's
config.json (config.py), its checkpoints (weights.py, safetensors_io.py), tokenizers
(tokenizer.py), generation with a KV cache (generate.py) and training data, the bundled
demo corpus included (data.py). The model's names are re-exported here, with ``Model``
(api.py), the Hugging Face-like surface over all of them:

    from einsummable.models.llama import Model
    model = Model.from_pretrained("llama-dir")
    logits = model([[1, 2, 3]])                     # numpy [1, 3, vocab]
"""

from einsummable.models.llama.api import Model
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
    "Model",
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
