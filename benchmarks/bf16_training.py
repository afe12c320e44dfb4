"""Issue 30's must-show: a bf16 Llama trains on the local engine and on a 2-node Ray
cluster, its losses beside the f32 run's and beside torch's.

The model (hidden 512, 4 layers, 8 heads, 4 kv heads, MLP 1376, byte vocabulary) and the
batches (the bundled corpus, batch 8 x seq 64) are the same on every side. Our bf16 run
keeps bf16 weights with f32 masters and moments (the Trainer's rule); torch's bf16 run
does the same by hand, without autocast: a bf16 copy of the f32 master weights runs the
forward and backward (the loss from its logits in f32), its gradients step the f32
masters with torch.optim.AdamW.
Run: python benchmarks/bf16_training.py [--steps 20] [--no-ray]
"""

from __future__ import annotations

import argparse
import copy
import time

import ml_dtypes
import numpy as np

import einsummable as es
from common import machine
from einsummable.models.llama.data import corpus
from einsummable.train.optim import decays
from einsummable.train.trainer import TrainConfig, Trainer, batch_at, lr_at
from llama_block import hf_model
from ray_engine import _two_nodes


def ours(cfg, params, tcfg, data, dtype: str, **options) -> tuple[list[float], float]:
    """Losses and median seconds per step of our Trainer."""
    if dtype == "bf16":
        params = {n: w.astype(ml_dtypes.bfloat16) for n, w in params.items()}
    trainer = Trainer(cfg, params, tcfg, data, **options)
    times = []
    for _ in range(tcfg.steps):
        t0 = time.perf_counter()
        trainer.train_step()
        times.append(time.perf_counter() - t0)
    return trainer.losses, float(np.median(times[1:]))


def torch_run(model, tcfg, data, bf16: bool) -> list[float]:
    """torch.optim.AdamW on f32 weights; with ``bf16`` the forward and backward run on a
    bf16 copy of them, made afresh each step."""
    import torch

    master = model
    low = copy.deepcopy(model).to(torch.bfloat16) if bf16 else model
    groups = [{"params": [p for p in master.parameters() if decays(p.shape, tcfg.decay_all)],
               "weight_decay": tcfg.weight_decay},
              {"params": [p for p in master.parameters() if not decays(p.shape, tcfg.decay_all)],
               "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.beta1, tcfg.beta2))
    losses = []
    for step in range(tcfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tcfg)
        if bf16:
            with torch.no_grad():
                for p, q in zip(master.parameters(), low.parameters(), strict=True):
                    q.copy_(p)
        tokens = torch.from_numpy(batch_at(data, tcfg, step).astype(np.int64))
        opt.zero_grad(set_to_none=True)
        low.zero_grad(set_to_none=True)
        logits = low(tokens[:, :-1], use_cache=False).logits.float()  # the loss reduces in f32, as ours
        targets = tokens[:, 1:].reshape(-1)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)
        loss.backward()
        if bf16:
            for p, q in zip(master.parameters(), low.parameters(), strict=True):
                p.grad = q.grad.float()
        torch.nn.utils.clip_grad_norm_(master.parameters(), tcfg.clip_norm)
        opt.step()
        losses.append(float(loss.item()))
    return losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--no-ray", action="store_true", help="skip the 2-node Ray runs")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    model, cfg, params = hf_model(args.hidden, args.layers, 8, 4, 1376, 256)
    tcfg = TrainConfig(batch=8, seq=64, steps=args.steps)
    data = corpus()
    print(machine())
    print(f"Llama hidden {args.hidden}, {args.layers} layers, batch 8 x seq 64, {args.steps} steps, "
          f"AdamW lr {tcfg.lr} (warmup {tcfg.warmup}, cosine)")
    runs: dict[str, list[float]] = {}
    times: dict[str, float] = {}
    for dtype in ("f32", "bf16"):
        runs[f"{dtype} local"], times[f"{dtype} local"] = ours(cfg, params, tcfg, data, dtype,
                                                               engine="local", workers=2)
    if not args.no_ray:
        import ray

        cluster = _two_nodes()
        try:
            two = es.Cluster(machines=2, cores=2)
            for dtype in ("f32", "bf16"):
                runs[f"{dtype} ray 2x2"], times[f"{dtype} ray 2x2"] = ours(
                    cfg, params, tcfg, data, dtype, engine="ray", cluster=two)
        finally:
            ray.shutdown()
            cluster.shutdown()
    runs["torch f32"] = torch_run(copy.deepcopy(model), tcfg, data, bf16=False)
    runs["torch bf16"] = torch_run(copy.deepcopy(model), tcfg, data, bf16=True)
    names = list(runs)
    print("\nstep  " + "  ".join(f"{n:>12}" for n in names))
    for step in range(args.steps):
        print(f"{step + 1:4d}  " + "  ".join(f"{runs[n][step]:12.5f}" for n in names))
    f32 = np.array(runs["f32 local"])
    print("\nmax |loss - f32 local| / f32 local over the run:")
    for name in names:
        rel = np.abs(np.array(runs[name]) - f32) / f32
        print(f"  {name:<14} {rel.max():.2e}" + (f"   {times[name] * 1e3:8.1f} ms/step (median)"
                                                  if name in times else ""))
    bf = np.array(runs["bf16 local"])
    rel = np.abs(np.array(runs["torch bf16"]) - bf) / bf
    print(f"  bf16 local against torch bf16: {rel.max():.2e}")
    for name in [n for n in names if "ray" in n]:
        same = runs[name.replace("ray 2x2", "local")]
        print(f"  {name} against {name.replace('ray 2x2', 'local')}: "
              f"{np.abs(np.array(runs[name]) - same).max():.2e} absolute")


if __name__ == "__main__":
    main()
