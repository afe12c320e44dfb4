"""The half-precision cases of issue 15 (item 1) and the all -inf logsumexp (item 12).

Run: PYTHONPATH=src python benchmarks/half_precision.py [--llama [--hidden 512 --layers 4]]
Prints, per case, what the reference engine and the local engine on 1 and 3 workers
give, next to the expected value: an f64 numpy computation on the same half-precision
inputs or, for the Llama rows, what transformers' own bf16 run gives. Run it against another
checkout (PYTHONPATH=that/src) for a before/after table.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import warnings

import ml_dtypes
import numpy as np

import einsummable as es
from einsummable import nn

BF16, F16 = ml_dtypes.bfloat16, np.float16
# 3 workers with every index split and no minimum block: partial sums cross workers
ENGINES = (dict(engine="reference"), dict(workers=1),
           dict(cluster=es.Cluster(cores=3, min_block_seconds=0), planner="uniform"))


def run(build, feeds):
    """``build(g)`` -> {name: tensor}; returns one result dict per engine in ENGINES."""
    out = []
    for options in ENGINES:
        g = es.Graph()
        for name, t in build(g).items():
            g.output(name, t)
        prog = es.compile(g, **options)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out.append(prog.run(feeds))
    return out


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def case_sum():
    x = np.full(4096, 0.1, BF16)
    got = run(lambda g: {"y": g.input("x", x.shape, "bf16").sum()}, {"x": x})
    return "sum of 4096 x 0.1, bf16", [float(r["y"]) for r in got], float(x.astype(np.float64).sum())


def case_mean():
    x = np.full(2048, 3.0, BF16)
    got = run(lambda g: {"y": g.input("x", x.shape, "bf16").mean()}, {"x": x})
    return "mean of 2048 x 3.0, bf16", [float(r["y"]) for r in got], 3.0


def case_softmax_rowsum():
    x = (np.random.default_rng(0).standard_normal((4, 4096)) * 0.01).astype(BF16)
    got = run(lambda g: {"y": nn.softmax(g.input("x", x.shape, "bf16"))}, {"x": x})
    return "softmax over 4096 near-equal keys, bf16: max |row sum - 1|", \
        [float(np.abs(r["y"].astype(np.float64).sum(-1) - 1).max()) for r in got], 0.0


def _rmsnorm_ref(x):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)


def case_rmsnorm(dtype, scale, what):
    x = (np.random.default_rng(1).standard_normal((8, 4096)) * scale).astype(dtype)
    name = "bf16" if dtype == BF16 else "f16"
    got = run(lambda g: {"y": nn.rmsnorm(g.input("x", x.shape, name))}, {"x": x})
    return what, [rel(r["y"], _rmsnorm_ref(x)) for r in got], 0.0


def case_cross_entropy(dtype):
    rng = np.random.default_rng(2)
    name = "bf16" if dtype == BF16 else "f16"
    logits = (rng.standard_normal((4, 32000)) * 2).astype(dtype)
    targets = rng.integers(0, 32000, 4).astype(np.float32)  # bf16 holds ids exactly only up to 256
    x64 = logits.astype(np.float64)
    m = x64.max(-1)
    lse = m + np.log(np.exp(x64 - m[:, None]).sum(-1))
    want = float((lse - x64[np.arange(4), targets.astype(np.int64)]).mean())

    def build(g):
        return {"y": nn.cross_entropy(g.input("x", logits.shape, name), g.input("t", (4,)))}

    got = run(build, {"x": logits, "t": targets})
    return f"cross-entropy over 32000 classes, {name}: value", [float(r["y"]) for r in got], want


def case_max_ties():
    x = np.full(300, 1.5, BF16)

    def build(g):
        t = g.input("x", x.shape, "bf16")
        (dx,) = es.grad(t.max(), [t])
        return {"dx": dx}

    got = run(build, {"x": x})
    return "gradient of a bf16 max over 300 ties: its sum", \
        [float(r["dx"].astype(np.float64).sum()) for r in got], 1.0


def case_logsumexp_inf():
    x = np.array([[-math.inf] * 4, [0.0, 1.0, 2.0, 3.0]], np.float32)

    def build(g):
        t = g.input("x", x.shape)
        y = nn.logsumexp(t)
        return {"y": y}

    got = run(build, {"x": x})
    return "logsumexp of an all -inf row (f32)", [float(r["y"][0]) for r in got], -math.inf


def case_llama(hidden=512, layers=4):
    import torch
    import transformers

    from einsummable.models.llama import model as llama
    from einsummable.models.llama import weights

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=hidden * 2,
                                   num_hidden_layers=layers, num_attention_heads=hidden // 64,
                                   num_key_value_heads=hidden // 128, rms_norm_eps=1e-5)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        ours_cfg, params = weights.load(tmp, "bf16")
    tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, (2, 16))
    with torch.no_grad():
        f32 = model(torch.tensor(tokens)).logits.double().numpy()
        hf = model.to(torch.bfloat16)(torch.tensor(tokens)).logits.double().numpy()

    def build(g):
        p = llama.parameters(g, ours_cfg, "bf16")
        ids = g.input("ids", tokens.shape)
        pos = g.ramp(tokens.shape, steps=(0.0, 1.0))
        return {"logits": llama.forward(ours_cfg, p, ids, pos, llama.causal_mask(g, tokens.shape[1]))}

    got = [r["logits"].astype(np.float64) for r in run(build, params | {"ids": tokens.astype(np.float32)})]
    what = f"bf16 Llama d={hidden} L={layers}"
    return [(f"{what}: relative logit error vs f32", [rel(r, f32) for r in got], rel(hf, f32)),
            (f"{what}: argmax agreement with f32", [agree(r, f32) for r in got], agree(hf, f32))]


def agree(a, b) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama", action="store_true", help="also a bf16 Llama against transformers")
    ap.add_argument("--hidden", type=int, default=512, help="the Llama's hidden size")
    ap.add_argument("--layers", type=int, default=4, help="the Llama's layers")
    args = ap.parse_args()
    cases = [case_sum, case_mean, case_softmax_rowsum,
             lambda: case_rmsnorm(BF16, 1.0, "rmsnorm, bf16, width 4096: relative error"),
             lambda: case_rmsnorm(F16, 30.0, "rmsnorm, f16, |x| ~ 30: relative error"),
             lambda: case_cross_entropy(BF16), lambda: case_cross_entropy(F16),
             case_max_ties, case_logsumexp_inf]
    rows = []
    for case in cases:
        try:
            rows.append(case())
        except Exception as err:  # a case the checkout cannot run at all
            rows.append((getattr(case, "__name__", "case"), [f"{type(err).__name__}"] * 3, float("nan")))
    if args.llama:
        rows.extend(case_llama(args.hidden, args.layers))
    print(f"{'case':<62} {'reference':>11} {'local w=1':>11} {'local w=3':>11} {'expected':>10}")
    for name, values, want in rows:
        cells = " ".join(f"{v:>11.4g}" if isinstance(v, float) else f"{v:>11}" for v in values)
        print(f"{name:<62} {cells} {want:>10.4g}")


if __name__ == "__main__":
    main()
