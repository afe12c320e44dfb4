"""Issue 7's benchmark: Llama training and generation tokens/s against PyTorch eager.

The same randomly initialised model (default: hidden 512, 8 layers, 8 heads,
4 kv heads, MLP 1376, byte vocabulary 256, untied head: 23.5M parameters), the same
batches and the same AdamW (warmup + cosine learning rate, clipping at 1.0, weight
decay on tensors with 2 or more dimensions only, so two torch parameter groups) on
both sides: einsummable's ``Trainer`` and ``Generator`` with the default engine,
transformers' LlamaForCausalLM with torch.optim.AdamW and ``generate(use_cache=True)``.
Training losses are checked against torch's step by step. Generation is greedy
and includes the prefill; it runs resident (the weights and the KV cache stay on
the workers; the timed "einsummable") and driver-fed (every decode step feeds all
the weights and the cache: the path before issue 19), with the bytes the driver
feeds and fetches per decode step for each.
Run: python benchmarks/llama.py [--quick] [--workers 2] [--steps 3] [--new-tokens 32] [--gen-batch 1 8]
     [--generation-only | --training-only]
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import numpy as np

from common import SETTLE, add_llama_arguments, compare, gemm_peer, machine, report, report_bound
from einsummable.compile import Program
from einsummable.engines.blocks import Blocks
from einsummable.models.llama.generate import Generator
from einsummable.train.optim import decays
from einsummable.train.trainer import TrainConfig, Trainer, batch_at, lr_at
from llama_block import hf_model, torch_loss

QUICK = dict(hidden=256, layers=2, heads=4, kv_heads=2, intermediate=688, batch=4, seq=64, new_tokens=16)


def report_rate(title: str, times: dict[str, float], tokens: int) -> None:
    """Times of ``tokens`` tokens, whose ratios are those of time per token (< 1 means we win),
    then tokens/s and their ratios (> 1 means we win)."""
    report(f"{title}: time for {tokens} tokens", times)
    ours = tokens / times["einsummable"]
    for name, t in times.items():
        ratio = "" if name == "einsummable" else f"   einsummable/{name} = {ours / (tokens / t):5.2f}"
        print(f"  {name:<28} {tokens / t:9.1f} tokens/s{ratio}")


def step_flops(cfg, batch: int, seq: int) -> float:
    """A training step's FLOPs: 6 x parameters x tokens (forward 2, backward 4) for every weight a
    GEMM multiplies (all but the embedding, a lookup), plus attention's scores and weighted sums,
    2 x 2 x batch x seq^2 x heads x head_dim a layer forward, 3x that with the backward."""
    shapes = cfg.parameter_shapes()
    weights = sum(int(np.prod(s)) for name, s in shapes.items() if name != "model.embed_tokens.weight")
    attention = 12 * cfg.num_hidden_layers * batch * seq**2 * cfg.num_attention_heads * cfg.head_dim
    return 6 * weights * batch * seq + attention


def decode_traffic(gen: Generator, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """Median bytes the driver feeds and fetches per decode step: the arrays handed to the
    engine and back (resident blocks that stay on the workers are not counted)."""
    fed, fetched = [], []
    execute = Program.execute

    def spy(prog, arrays, variables, carry=frozenset()):
        result = execute(prog, arrays, variables, carry)
        if "t" in variables or "cache_k0" in arrays:  # a decode step (resident, or driver-fed)
            fed.append(sum(a.nbytes for a in arrays.values() if not isinstance(a, Blocks)))
            fetched.append(sum(a.nbytes for a in result.values() if not isinstance(a, Blocks)))
        return result

    Program.execute = spy
    try:
        gen.generate(prompts, new_tokens)
    finally:
        Program.execute = execute
    return float(np.median(fed)), float(np.median(fetched))


def generation(model, cfg, params, args, engine: str, batch: int) -> None:
    """Resident generation (after) and the driver-fed path (before) against torch, in one run."""
    import torch

    prompts = np.random.default_rng(1).integers(0, cfg.vocab_size, (batch, args.prompt))
    resident = Generator(cfg, params, workers=args.workers)
    fed = Generator(cfg, params, workers=args.workers, resident=False)
    t_prompts = torch.from_numpy(prompts)

    # No end-of-sequence token, as ours has none: min_new_tokens would instead mask token 2's
    # logits, and a row whose argmax is 2 then went another way (224 of 256 tokens equal, not 256).
    model.generation_config.eos_token_id = None

    def torch_generate():
        with torch.no_grad():
            return model.generate(t_prompts, attention_mask=torch.ones_like(t_prompts), do_sample=False,
                                  use_cache=True, max_new_tokens=args.new_tokens, pad_token_id=0)

    theirs = np.array(torch_generate()[:, args.prompt :].tolist())
    ours = {name: np.array(gen.generate(prompts.tolist(), args.new_tokens))
            for name, gen in (("resident", resident), ("driver-fed", fed))}
    print(f"\nbatch {batch}: greedy tokens equal to torch's, of {batch * args.new_tokens}: "
          + ", ".join(f"{name} {int((ids == theirs).sum())}" for name, ids in ours.items())
          + f"; resident equal to driver-fed: {int((ours['resident'] == ours['driver-fed']).sum())}")
    for name, gen in (("before (driver-fed)", fed), ("after (resident)", resident)):
        sent, got = decode_traffic(gen, prompts.tolist(), args.new_tokens)
        print(f"  bytes per decode step, {name:<20} fed {sent:>12,.0f}   fetched {got:>10,.0f}")
    chosen = {key[0]: p.taskgraph.workers for key, p in resident._programs.items()}
    print(f"  resident prefill on {chosen['prefill']} worker(s), decode on {chosen['decode']} "
          "(the planner's simulation chose)")
    alone = Generator(cfg, params, workers=1)  # resident on one worker: residency apart from the workers
    ids = prompts.tolist()
    times = compare({"einsummable": lambda: resident.generate(ids, args.new_tokens),
                     "einsummable driver-fed": lambda: fed.generate(ids, args.new_tokens),
                     "einsummable resident, 1 worker": lambda: alone.generate(ids, args.new_tokens),
                     "torch eager generate": torch_generate}, args.repeats)
    title = (f"generation, batch {batch}, prompt {args.prompt}, {args.new_tokens} new tokens "
             f"(engine {engine}, workers {args.workers}; einsummable = resident)")
    report_rate(title, times, batch * args.new_tokens)


def training(model, cfg, params, args) -> str:
    """Times training steps; returns the engine that the default compile chose."""
    import torch

    tcfg = TrainConfig(batch=args.batch, seq=args.seq, steps=args.steps + 1)
    data = np.random.default_rng(2).integers(0, cfg.vocab_size, 1 << 20)
    start = time.perf_counter()
    trainer = Trainer(cfg, params, tcfg, data, workers=args.workers)
    print(f"compiled the training step in {time.perf_counter() - start:.1f} s")
    # the Trainer's groups: decay tensors with 2 or more dimensions only (decays() in train/optim.py)
    groups = [{"params": [p for p in model.parameters() if decays(p.shape, tcfg.decay_all)],
               "weight_decay": tcfg.weight_decay},
              {"params": [p for p in model.parameters() if not decays(p.shape, tcfg.decay_all)],
               "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.beta1, tcfg.beta2))
    torch_losses: list[float] = []

    def torch_step():
        step = len(torch_losses)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tcfg)
        tokens = torch.from_numpy(batch_at(data, tcfg, step).astype(np.int64))
        opt.zero_grad(set_to_none=True)
        loss = torch_loss(model, tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.clip_norm)
        opt.step()
        torch_losses.append(loss.item())

    times = compare({"einsummable": trainer.train_step, "torch eager + AdamW": torch_step,
                     "GEMM": gemm_peer(args.workers)}, args.steps, settle=SETTLE)
    gemm = times.pop("GEMM")
    print(f"\nlosses  einsummable {np.round(trainer.losses, 5).tolist()}\n"
          f"        torch       {np.round(torch_losses, 5).tolist()}")
    np.testing.assert_allclose(trainer.losses[0], torch_losses[0], rtol=1e-4)
    np.testing.assert_allclose(trainer.losses, torch_losses, rtol=1e-3)
    title = (f"training step, batch {args.batch} x seq {args.seq} "
             f"(engine {trainer.program.engine}, workers {args.workers})")
    report_rate(title, times, args.batch * args.seq)
    report_bound(step_flops(cfg, args.batch, args.seq), gemm, times, args.workers)
    return trainer.program.engine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a 2-layer hidden-256 model and short runs")
    add_llama_arguments(parser, layers=8)
    parser.add_argument("--steps", type=int, default=3, help="timed training steps, after one warm-up")
    parser.add_argument("--gen-batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--generation-only", action="store_true", help="skip the training benchmark")
    parser.add_argument("--training-only", action="store_true", help="skip the generation benchmark")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="timed generate calls")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args()  # explicit flags still win over --quick's sizes
    import torch

    torch.set_num_threads(args.workers)  # the same threads as our workers
    model, cfg, params = hf_model(args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate,
                                  args.vocab)
    n_params = sum(int(np.prod(s)) for s in cfg.parameter_shapes().values())
    print(machine())
    print(f"model: hidden {args.hidden}, {args.layers} layers, heads {args.heads}/{args.kv_heads}, "
          f"mlp {args.intermediate}, vocab {args.vocab}, {n_params / 1e6:.1f}M parameters")
    engine = "local"
    if not args.generation_only:
        engine = training(copy.deepcopy(model), cfg, params, args)  # generation keeps the initial weights
    for batch in [] if args.training_only else args.gen_batch:
        generation(model, cfg, params, args, engine, batch)


if __name__ == "__main__":
    main()
