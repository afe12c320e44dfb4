"""Workload (e): a small Llama's loss and the gradients of all its parameters.

Einsummable (``es.grad`` over ``llama.loss_graph``) against PyTorch eager on
transformers' LlamaForCausalLM with the same weights, plus a hand-written numpy
forward as the floor for the forward alone. Losses and gradients are checked
against torch before anything is timed.
Run: python benchmarks/llama_block.py [--layers 1] [--batch 8] [--seq 256] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import einsummable as es
from common import add_llama_arguments, median_time, report
from einsummable.models.llama import model as llama
from einsummable.models.llama import weights


def hf_model(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int,
             seed: int = 0):
    """A randomly initialised LlamaForCausalLM, our config, and its weights in our layout (copied)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=False,
        max_position_embeddings=4096)
    model = transformers.LlamaForCausalLM(hf_cfg)
    cfg = llama.LlamaConfig.from_hf(hf_cfg.to_dict())
    state = model.state_dict()
    params = {n: weights.to_ours(cfg, n, state[n].numpy().copy()) for n in cfg.parameter_shapes()}
    return model, cfg, params


def torch_loss(model, tokens):
    import torch

    logits = model(tokens[:, :-1], use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def numpy_loss(cfg: llama.LlamaConfig, hf: dict[str, np.ndarray], tokens: np.ndarray) -> float:
    """The same forward pass written directly in numpy, on Hugging Face's 2-D weights."""
    ids, targets = tokens[:, :-1], tokens[:, 1:]
    b, s = ids.shape
    nh, nkv, hd, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    angle = np.arange(s)[:, None] * cfg.rope_theta ** (-np.arange(0, hd, 2) / hd)
    cos = np.cos(np.concatenate([angle, angle], -1)).astype(np.float32)
    sin = np.sin(np.concatenate([angle, angle], -1)).astype(np.float32)
    mask = np.triu(np.full((s, s), -np.inf, np.float32), 1)

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(eps)) * w

    def rope(x):                                                        # [b, heads, s, hd]
        half = hd // 2
        return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin

    def heads(x, n):
        return x.reshape(b, s, n, hd).transpose(0, 2, 1, 3)

    h = hf["model.embed_tokens.weight"][ids]
    for i in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{i}."
        w = {k.removeprefix(prefix): v for k, v in hf.items() if k.startswith(prefix)}
        x = norm(h, w["input_layernorm.weight"])
        q = rope(heads(x @ w["self_attn.q_proj.weight"].T, nh))
        k = np.repeat(rope(heads(x @ w["self_attn.k_proj.weight"].T, nkv)), cfg.groups, axis=1)
        v = np.repeat(heads(x @ w["self_attn.v_proj.weight"].T, nkv), cfg.groups, axis=1)
        scores = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(hd)) + mask
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, nh * hd)
        h = h + attn @ w["self_attn.o_proj.weight"].T
        x = norm(h, w["post_attention_layernorm.weight"])
        gate = x @ w["mlp.gate_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * (x @ w["mlp.up_proj.weight"].T)) @ w["mlp.down_proj.weight"].T
    logits = norm(h, hf["model.norm.weight"]) @ hf["lm_head.weight"].T
    top = logits.max(-1, keepdims=True)
    logz = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    return float((logz - picked).mean())


def programs(cfg: llama.LlamaConfig, batch: int, seq: int, workers: int):
    """The loss alone, and the loss with the gradient of every parameter (outputs ``d:<name>``)."""
    g, _, loss = llama.loss_graph(cfg, batch, seq)
    g.output("loss", loss)
    forward = es.compile(g, workers=workers)
    g, p, loss = llama.loss_graph(cfg, batch, seq)
    g.output("loss", loss)
    for name, d in zip(p, es.grad(loss, list(p.values())), strict=True):
        g.output("d:" + name, d)
    return forward, es.compile(g, workers=workers)


def main() -> None:
    parser = argparse.ArgumentParser()
    add_llama_arguments(parser, layers=1)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(os.cpu_count())
    model, cfg, params = hf_model(args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate,
                                  args.vocab)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.seq + 1))
    feeds = params | {"tokens": tokens}
    start = time.perf_counter()
    forward, backward = programs(cfg, args.batch, args.seq, args.workers)
    print(f"compiled both programs in {time.perf_counter() - start:.1f} s")
    hf = {n: t.detach().numpy() for n, t in model.named_parameters()}
    t_tokens = torch.from_numpy(tokens)

    out = backward.run(feeds)
    ref = torch_loss(model, t_tokens)
    ref.backward()
    np.testing.assert_allclose(out["loss"], ref.item(), rtol=1e-4)
    np.testing.assert_allclose(numpy_loss(cfg, hf, tokens), ref.item(), rtol=1e-4)
    worst = 0.0
    for name in cfg.parameter_shapes():
        d = weights.to_ours(cfg, name, model.get_parameter(name).grad.numpy())
        worst = max(worst, float(np.abs(out["d:" + name] - d).max() / (np.abs(d).max() + 1e-12)))
    assert worst < 1e-3, f"a gradient differs from torch's by {worst:.2e} of its largest entry"
    print(f"loss {float(out['loss']):.6f} (torch {ref.item():.6f}); "
          f"worst gradient error {worst:.1e} of the largest entry")

    def torch_step():
        model.zero_grad(set_to_none=True)
        torch_loss(model, t_tokens).backward()

    def torch_forward():
        with torch.no_grad():
            torch_loss(model, t_tokens)

    n_params = sum(int(np.prod(s)) for s in cfg.parameter_shapes().values())
    shape = (f"{args.layers} layer(s), hidden {args.hidden}, heads {args.heads}/{args.kv_heads}, "
             f"mlp {args.intermediate}, vocab {args.vocab}, {n_params / 1e6:.1f}M params, "
             f"batch {args.batch} x seq {args.seq}")
    where = f"engine {backward.engine}, workers {args.workers}"
    report(f"(e) Llama loss + all gradients: {shape} ({where})",
           {"einsummable": median_time(lambda: backward.run(feeds), args.repeats),
            "torch eager": median_time(torch_step, args.repeats)})
    report(f"(e) Llama loss, forward only ({where})",
           {"einsummable": median_time(lambda: forward.run(feeds), args.repeats),
            "torch eager (no_grad)": median_time(torch_forward, args.repeats),
            "numpy hand-written": median_time(lambda: numpy_loss(cfg, hf, tokens), args.repeats)})


if __name__ == "__main__":
    main()
