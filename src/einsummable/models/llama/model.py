"""Llama 2/3 in the Einsummable language, read top to bottom like the paper.

Shapes use: b batch, s/q query positions, t key positions, d hidden, v vocab,
g key-value heads, r query heads per kv head (GQA), c the two RoPE halves,
j head_dim/2, k head_dim, f the MLP width. Heads and head_dim stay separate graph
dimensions, so the planner can split by head. The file holds no parallelism.

Weights use Hugging Face's names; their layouts are regrouped on load so that
q_proj is [g, r, c, j, d] rather than [g*r*c*j, d] (see ``weights.py``).
"""

from __future__ import annotations

import itertools
import math
import string
from collections.abc import Callable

import numpy as np

from einsummable.errors import GraphError
from einsummable.frontend import nn
from einsummable.frontend.builders import concat
from einsummable.frontend.class_ids import mark_class_ids
from einsummable.frontend.einsum import einsum
from einsummable.frontend.tensor import Graph, Tensor, elementwise
from einsummable.models.llama.config import LlamaConfig
from einsummable.models.llama.lora import LoraConfig
from einsummable.models.llama.lora import shapes as adapter_shapes

PRESETS = {
    "tiny": LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1),
    "demo": LlamaConfig(vocab_size=256, hidden_size=192, intermediate_size=512, num_hidden_layers=3,
                        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256),
    "llama-7b": LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=32, rms_norm_eps=1e-5),
    "llama3-8b": LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                             num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                             rope_theta=500000.0, max_position_embeddings=8192),
}


def parameters(g: Graph, cfg: LlamaConfig, dtype: str = "f32", lora: LoraConfig | None = None
               ) -> dict[str, Tensor]:
    """An input per parameter, named as Hugging Face names it; with ``lora``, per adapter too."""
    shapes = cfg.parameter_shapes() | (adapter_shapes(cfg, lora) if lora is not None else {})
    return {name: g.input(name, shape, dtype) for name, shape in shapes.items()}


def embed(ids: Tensor, table: Tensor) -> Tensor:
    """table[ids[b, s]] as an equality join: no tokens x vocab one-hot is formed.

    ``ids`` holds token ids, i64 (or i32; floats holding whole numbers work too); the
    kernels run this join as a gather.
    """
    mark_class_ids(ids, table.shape[0], "token ids")  # an id out of the vocabulary would embed as zeros
    vocab = ids.graph.ramp((table.shape[0],), steps=(1.0,), dtype=ids.dtype)
    return einsum("bs,v,vd->bsd", ids, vocab, table, join="where(x0 == x1, x2, 0)", agg="add")


def rope_rotation(pos: Tensor, cfg: LlamaConfig, scale: float = 1.0) -> Tensor:
    """The 2x2 rotation per position and frequency: [b, s, c, c', j] (rotate-half convention).

    out[c] = sum_c' R[c, c'] x[c'], R = cos * I + sin * J, with J[c, c'] = c - c'. The
    frequency j is last, as in q and k: RoPE's kernels then read every operand at unit
    stride along their inner loop (0.47 -> 0.16 ms for a 512k-value q block, j at stride 4 before).
    """
    g = pos.graph
    freq = g.ramp((cfg.head_dim // 2,), steps=(1.0,), dtype=pos.dtype)
    inv_freq = elementwise(inverse_frequency(cfg), freq)
    angle = einsum("bs,j->bsj", pos, inv_freq)                                   # [b, s, j]
    sign = g.ramp((2, 2), steps=(1.0, -1.0), dtype=pos.dtype)                    # J = c - c'
    return einsum("bsj,ce->bscej", angle, sign,
                  join=f"(cos(x0) * (1 - abs(x1)) + sin(x0) * x1) * {scale!r}")


def inverse_frequency(cfg: LlamaConfig) -> str:
    """theta^(-2j/k) for frequency j (x0), as a join, scaled as ``cfg.rope_scaling`` says.

    ``llama3`` (transformers' ``_compute_llama3_parameters``) divides by ``factor`` the
    frequencies whose wavelength 2 pi / f exceeds old / low_freq_factor, keeps those
    whose wavelength is below old / high_freq_factor, and in between blends
    (1 - s) f / factor + s f with s = (old / wavelength - low) / (high - low).
    """
    f = f"exp(x0 * {-2.0 * math.log(cfg.rope_theta) / cfg.head_dim!r})"
    rs = cfg.rope_scaling
    if rs is None:
        return f
    if rs.rope_type == "linear":
        return f"{f} / {float(rs.factor)!r}"
    old, low, high, factor = (float(rs.original_max_position_embeddings), float(rs.low_freq_factor),
                              float(rs.high_freq_factor), float(rs.factor))
    s = f"(({old / (2 * math.pi)!r} * {f} - {low!r}) / {high - low!r})"
    blend = f"(1 - {s}) * {f} / {factor!r} + {s} * {f}"
    # wavelength > old / low  <=>  f < 2 pi low / old; wavelength < old / high  <=>  f > 2 pi high / old
    return (f"where({f} < {2 * math.pi * low / old!r}, {f} / {factor!r}, "
            f"where({f} > {2 * math.pi * high / old!r}, {f}, {blend}))")


def causal_mask(g: Graph, seq: int, dtype: str = "f32", keys: int | None = None, offset: int = 0) -> Tensor:
    """0 where a query may see a key, -inf elsewhere: [q, t] over ``seq`` queries at
    positions offset, offset + 1, ... and ``keys`` keys (``seq`` by default) from 0."""
    shape = (seq, seq if keys is None else keys)
    return g.tril(shape, inside=0.0, outside=-math.inf, offset=offset, dtype=dtype)


CacheWrite = Callable[[Tensor, Tensor], Tensor]  # (the cache, a step's keys or values) -> the cache updated

QUERY_BLOCK = 128  # queries per causal block (as FlashAttention tiles); 64 made more copies than it saved


def attend(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """softmax(q . keys + mask) . values; q comes scaled by 1/sqrt(k) from RoPE's rotation."""
    scores = einsum("bqgrcj,btgcj->bgrqt", q, keys)
    mask_spec = "qt" if mask.ndim == 2 else "bqt"
    masked = einsum(f"bgrqt,{mask_spec}->bgrqt", scores, mask, join="x0 + x1")
    probs = nn.softmax(masked, axis=-1)
    return einsum("bgrqt,btgk->bqgrk", probs, values)


def causal_attend(q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """Causal attention that skips the masked blocks, as FlashAttention does.

    The queries of block [a, e) see no key at or after e: those scores would be -inf and
    their probabilities exactly 0, so each block attends to keys [0, e) alone. Over
    n blocks this computes (n + 1) / 2n of the scores.
    """
    seq = q.shape[1]
    edges = [*range(0, seq, QUERY_BLOCK), seq]
    return concat([
        attend(q[:, a:e], keys[:, :e], values[:, :e], causal_mask(q.graph, e - a, q.dtype, keys=e, offset=a))
        for a, e in itertools.pairwise(edges)
    ], axis=1)


def attention(x: Tensor, p: dict[str, Tensor], prefix: str, rot_q: Tensor, rot_k: Tensor,
              mask: Tensor | None, cache: tuple[Tensor, Tensor] | None = None, lora_scale: float = 1.0,
              write: CacheWrite | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Grouped-query attention; returns the output and this call's new keys and values.

    ``mask`` None means causal, over these positions alone (no cache). A ``cache`` is
    appended to (the mask covers its keys, then these), or with ``write`` written into:
    ``write(cached, new)`` is the updated cache, attended over whole (the mask covers its
    slots alone) and returned in place of the new keys and values. A fixed-length cache
    kept between steps then costs no copy of itself into a longer one each step.
    """
    q = linear(x, p, prefix + "q_proj", "bsd,grcjd->bsgrcj", lora_scale)
    q = einsum("bsgrej,bscej->bsgrcj", q, rot_q)                    # RoPE, scaled by 1/sqrt(k)
    k_new = linear(x, p, prefix + "k_proj", "bsd,gcjd->bsgcj", lora_scale)
    k_new = einsum("bsgej,bscej->bsgcj", k_new, rot_k)
    v_new = linear(x, p, prefix + "v_proj", "bsd,gkd->bsgk", lora_scale)
    keys, values = k_new, v_new
    if cache is not None and write is not None:
        keys = k_new = write(cache[0], k_new)                          # [b, t, g, c, j]
        values = v_new = write(cache[1], v_new)                        # [b, t, g, k]
    elif cache is not None:
        keys = concat([cache[0], k_new], axis=1)                      # [b, t, g, c, j]
        values = concat([cache[1], v_new], axis=1)                    # [b, t, g, k]
    out = causal_attend(q, keys, values) if mask is None else attend(q, keys, values, mask)
    return linear(out, p, prefix + "o_proj", "bqgrk,dgrk->bqd", lora_scale), k_new, v_new


def mlp(x: Tensor, p: dict[str, Tensor], prefix: str, lora_scale: float = 1.0) -> Tensor:
    """SwiGLU: down(silu(gate(x)) * up(x))."""
    gate = linear(x, p, prefix + "gate_proj", "bsd,fd->bsf", lora_scale)
    up = linear(x, p, prefix + "up_proj", "bsd,fd->bsf", lora_scale)
    act = einsum("bsf,bsf->bsf", gate, up, join="silu(x0) * x1")
    return linear(act, p, prefix + "down_proj", "bsf,df->bsd", lora_scale)


def linear(x: Tensor, p: dict[str, Tensor], name: str, spec: str, lora_scale: float = 1.0) -> Tensor:
    """The projection ``name`` (its weight contracted with x as ``spec`` says), plus its bias
    if the config has one, plus its LoRA term if ``p`` holds adapters for it (see ``lora``)."""
    out = add_bias(einsum(spec, x, p[name + ".weight"]), p.get(name + ".bias"))
    if name + ".lora_A.weight" not in p:
        return out
    return out + lora_term(x, p[name + ".lora_A.weight"], p[name + ".lora_B.weight"], spec, lora_scale)


def lora_term(x: Tensor, a: Tensor, b: Tensor, spec: str, scale: float) -> Tensor:
    """LoRA's low-rank update (alpha / r) B (A x), l the rank: A [l, in dims of W], B [out dims of W, l].

    For q_proj (bsd,grcjd->bsgrcj) that is bsd,ld->bsl then bsl,grcjl->bsgrcj.
    """
    (xs, ws), out = spec.split("->")[0].split(","), spec.split("->")[1]
    inner = "".join(c for c in ws if c not in out)                   # the letters W contracts
    outer = "".join(c for c in ws if c in out)
    batch = "".join(c for c in xs if c not in inner)
    down = einsum(f"{xs},l{inner}->{batch}l", x, a)
    return einsum(f"{batch}l,{outer}l->{out}", down, b, join=f"x0 * x1 * {scale!r}", agg="add")


def add_bias(x: Tensor, bias: Tensor | None) -> Tensor:
    """x plus a bias over its trailing dims; x itself where the config has no bias."""
    if bias is None:
        return x
    full = string.ascii_lowercase[: x.ndim]
    return einsum(f"{full},{full[x.ndim - bias.ndim :]}->{full}", x, bias, join="x0 + x1")


def decoder(cfg: LlamaConfig, p: dict[str, Tensor], ids: Tensor, pos: Tensor, mask: Tensor | None,
            cache: list[tuple[Tensor, Tensor]] | None = None, residuals: list[Tensor] | None = None,
            lora_scale: float = 1.0, write: CacheWrite | None = None
            ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
    """Final hidden states [b, s, d] and, per layer, the new (keys, values) for a KV cache.

    ``mask`` is [b, s, t] (or [s, t]) of 0 / -inf over the keys: the cache's, then these.
    None means causal (without a cache), and then masked blocks are skipped. With
    ``write`` the cache is written into, not appended to (see ``attention``): the mask
    covers the cache's slots alone, and the layers return their updated caches.
    ``residuals``, when given, collects the residual stream after each layer (the
    natural activation checkpoints). ``lora_scale`` is alpha / r of the adapters in ``p``.
    """
    dtype = p["model.embed_tokens.weight"].dtype                       # f32, or bf16 weights
    if mask is None and cache:
        raise GraphError("a causal decoder (mask None) takes no cache; pass a mask over the cache's keys")
    if mask is not None:
        mask = mask.astype(dtype)
    eps = cfg.rms_norm_eps
    rot_q = rope_rotation(pos, cfg, scale=1.0 / math.sqrt(cfg.head_dim)).astype(dtype)
    rot_k = rope_rotation(pos, cfg).astype(dtype)
    h = embed(ids, p["model.embed_tokens.weight"])                     # [b, s, d]
    new_cache = []
    for i in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{i}."
        x = nn.rmsnorm(h, p[prefix + "input_layernorm.weight"], eps)
        a, k_new, v_new = attention(x, p, prefix + "self_attn.", rot_q, rot_k, mask,
                                    cache[i] if cache else None, lora_scale, write)
        h = h + a
        x = nn.rmsnorm(h, p[prefix + "post_attention_layernorm.weight"], eps)
        h = h + mlp(x, p, prefix + "mlp.", lora_scale)
        new_cache.append((k_new, v_new))
        if residuals is not None:
            residuals.append(h)
    return nn.rmsnorm(h, p["model.norm.weight"], eps), new_cache


def lm_head(cfg: LlamaConfig, p: dict[str, Tensor], h: Tensor) -> Tensor:
    """Logits [b, s, v], through the embedding itself when the head is tied."""
    head = p["model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"]
    return einsum("bsd,vd->bsv", h, head)


def forward(cfg: LlamaConfig, p: dict[str, Tensor], ids: Tensor, pos: Tensor, mask: Tensor | None,
            residuals: list[Tensor] | None = None, lora_scale: float = 1.0) -> Tensor:
    """Logits [b, s, vocab] for token ``ids`` [b, s] (i64) at positions ``pos`` [b, s] (f32);
    ``mask`` [s, s] or [b, s, s] of 0 / -inf is added to the scores (None: causal, masked blocks skipped).
    ``p`` comes from ``parameters(g, cfg)``; see ``loss_graph`` for a whole training graph."""
    h, _ = decoder(cfg, p, ids, pos, mask, residuals=residuals, lora_scale=lora_scale)
    return lm_head(cfg, p, h)


def loss_graph(cfg: LlamaConfig, batch: int, seq: int, dtype: str = "f32",
               residuals: list[Tensor] | None = None, lora: LoraConfig | None = None
               ) -> tuple[Graph, dict[str, Tensor], Tensor]:
    """Next-token cross-entropy over all positions: inputs ``tokens`` [b, s+1] (i64 ids).
    With ``lora``, ``p`` holds the adapters too (inputs named as in ``lora.shapes``)."""
    g = Graph()
    p = parameters(g, cfg, dtype, lora)
    tokens = g.input("tokens", (batch, seq + 1), "i64")
    ids, targets = tokens[:, :seq], tokens[:, 1:]
    pos = g.ramp((batch, seq), steps=(0.0, 1.0))
    logits = forward(cfg, p, ids, pos, None, residuals, lora.scale if lora is not None else 1.0)
    loss = nn.cross_entropy(logits.astype("f32") if dtype != "f32" else logits, targets)
    return g, p, loss


def init_params(cfg: LlamaConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Normal(0, 0.02) weights and unit norms, as Hugging Face initialises Llama."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in cfg.parameter_shapes().items():
        if name.endswith("norm.weight"):
            params[name] = np.ones(shape, np.float32)
        else:
            params[name] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return params
