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

# What model.py's index letters stand for, so that the plan report names indices by role
# ("split in 2D: batch × hidden") rather than by letter. g counts the key-value heads (every
# head without GQA), r the query heads that share one
INDEX_ROLES = {"b": "batch", "s": "seq", "q": "query", "t": "key", "d": "hidden", "v": "vocab",
               "g": "head", "r": "query head", "c": "rope half", "e": "rope half", "j": "rope freq",
               "k": "head dim", "f": "mlp"}

__all__ = [
    "INDEX_ROLES",
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
