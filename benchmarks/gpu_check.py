"""Issue 34's check of the GPU engine (engines/gpu.py) on one CUDA device, in one run.

1. Correctness against the reference engine: random graphs x partitions x workers (several
   streams), a bf16 MLP step, a small Llama training step.
2. An 8192^3 bf16 GEMM through the engine against ``torch.matmul`` (target: >= 90% of its rate).
3. A Llama training step (hidden 2048, 16 layers, batch 8 x 2048, bf16 weights, f32 AdamW)
   against torch eager (transformers' LlamaForCausalLM under bf16 autocast, torch.optim.AdamW)
   in tokens/s (target: >= 0.9x), first losses compared within bf16 error.
4. Greedy generation of that model against Hugging Face ``generate`` (target: >= 1.0x), where
   transformers is installed; ours runs the driver-fed Generator on this engine.
Each part reports its ratio, or its failure, and the run goes on. Without CUDA it says so
and exits 0.
Run: python benchmarks/gpu_check.py [--quick] [--layers 16] [--steps 3] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from einsummable.ir.dtypes import to_numpy

HERE = Path(__file__).resolve().parent
DEVICE = "cuda"  # --cpu-smoke: "cpu", to try the script where there is no GPU (timings meaningless)


def timed(fn, repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``fn`` on the device (synchronised around each call)."""
    import torch

    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def ratio(title: str, ours: float, theirs: float, target: float, unit: str = "s") -> None:
    r = theirs / ours
    print(f"{title}: einsummable {ours * 1e3:.2f} ms, torch {theirs * 1e3:.2f} ms, ratio {r:.3f} "
          f"(target >= {target}) {'OK' if r >= target else 'BELOW TARGET'}")


def torch_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def correctness() -> None:
    import einsummable as es
    from einsummable.engines import gpu, reference
    from einsummable.hardware.cluster import Cluster
    from einsummable.lower.lowering import lower
    from einsummable.plan.plan import build

    sys.path.insert(0, str(HERE.parent / "tests"))
    from graphgen import random_graph, random_partitions

    worst = 0.0
    for seed in range(20):
        rng = random.Random(seed)
        g, feeds = random_graph(rng, n_ops=10)
        plan = build(g.ir, Cluster(machines=1, cores=rng.choice([1, 2, 4])), random_partitions(g.ir, rng))
        got, want = gpu.GpuProgram(lower(plan), DEVICE).run(feeds), reference.run(plan.graph, feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-4, atol=2e-4,
                                       err_msg=f"seed {seed} {name}")
            worst = max(worst, float(np.max(np.abs(got[name].astype(np.float64) - want[name]), initial=0)))
    print(f"random graphs: 20 of 20 match the reference (largest difference {worst:.2e})")
    gpus = 2 if DEVICE == "cuda" and torch_device_count() >= 2 else 0
    for seed in range(10 if gpus else 0):  # two GPUs as two machines: moves are device-to-device copies
        rng = random.Random(seed)
        g, feeds = random_graph(rng, n_ops=10)
        plan = build(g.ir, Cluster(machines=2, cores=rng.choice([1, 2])), random_partitions(g.ir, rng))
        got, want = gpu.GpuProgram(lower(plan), machines=2).run(feeds), reference.run(plan.graph, feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-4, atol=2e-4,
                                       err_msg=f"two GPUs, seed {seed} {name}")
    print("random graphs on two GPUs: 10 of 10 match the reference" if gpus else
          "random graphs on two GPUs: skipped (one GPU here)")
    print(f"Cluster.gpus(measure=True): {es.Cluster.gpus(measure=True)!r}")

    from einsummable.engines.feeds import check_feeds
    from einsummable.models.llama import model as llama
    from einsummable.models.llama.config import LlamaConfig

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    for dtype in ("f32", "bf16"):
        g, p, loss = llama.loss_graph(cfg, 4, 32, dtype)
        step = es.train.adamw(loss, list(p.values()), lr="lr", weight_decay=0.1)
        params = {n: w.astype(to_numpy(dtype)) for n, w in llama.init_params(cfg, seed=0).items()}
        tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (4, 33)).astype(np.int64)
        feeds = params | step.init_state(params) | {"tokens": tokens, "lr": 3e-3}
        arrays, variables = check_feeds(g.ir, feeds, variables=g.ir.variables())
        tg = es.compile(g, 2, engine="simulate").taskgraph
        got = gpu.GpuProgram(tg, DEVICE).run(arrays, variables)
        want = reference.run(g.ir, arrays, variables)
        tol = 1e-3 if dtype == "f32" else 3e-2
        for name in want:
            np.testing.assert_allclose(got[name].astype(np.float64), want[name].astype(np.float64),
                                       rtol=tol, atol=tol, err_msg=f"{dtype} {name}")
        print(f"Llama training step ({dtype}, 2 workers = 2 streams): every output matches the reference "
              f"(loss {float(got[step.loss]):.5f} against {float(want[step.loss]):.5f})")


def gemm(n: int, repeats: int) -> None:
    import torch

    import einsummable as es
    from einsummable.engines import gpu

    g = es.Graph()
    g.output("c", g.input("a", (n, n), "bf16") @ g.input("b", (n, n), "bf16"))
    prog = gpu.GpuProgram(es.compile(g, 1, engine="simulate").taskgraph, DEVICE)
    a, b = (torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    ours = timed(lambda: prog.run_tensors({"a": a, "b": b}), repeats)
    theirs = timed(lambda: torch.matmul(a, b), repeats)
    ratio(f"{n}^3 bf16 GEMM ({2 * n ** 3 / theirs / 1e12:.0f} TFLOP/s for torch.matmul)", ours, theirs, 0.9)
    torch.testing.assert_close(prog.run_tensors({"a": a, "b": b})["c"], a @ b, rtol=2e-2, atol=1.0)


def llama_parts(args):
    sys.path.insert(0, str(HERE))
    from llama_block import hf_model

    return hf_model(args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate, args.vocab)


def training(model, cfg, params, args) -> None:
    import torch

    import einsummable as es
    from einsummable.engines import gpu
    from einsummable.engines.feeds import check_feeds
    from einsummable.models.llama import model as llama
    from llama_block import torch_loss

    lr = 1e-4
    start = time.perf_counter()
    g, p, loss = llama.loss_graph(cfg, args.batch, args.seq, "bf16")
    step = es.train.adamw(loss, list(p.values()), lr="lr", weight_decay=0.1, decay_all=True)
    prog = gpu.GpuProgram(es.compile(g, 1, engine="simulate").taskgraph, DEVICE)
    print(f"compiled the training step in {time.perf_counter() - start:.1f} s "
          f"({len(prog.tg.tasks):,} tasks)")
    half = {n: w.astype(to_numpy("bf16")) for n, w in params.items()}
    tokens = np.random.default_rng(2).integers(0, cfg.vocab_size, (args.batch, args.seq + 1)).astype(np.int64)
    arrays, variables = check_feeds(g.ir, half | step.init_state(half) | {"tokens": tokens, "lr": lr},
                                    variables=g.ir.variables())
    state = {n: gpu.to_device(a, torch.device(DEVICE)) for n, a in arrays.items()}  # resident from here
    carried = (*step.params, *(s.name for s in step.state))
    ours_losses: list[float] = []

    def ours_step():
        out = prog.run_tensors(state, variables)
        state.update({n: out[n] for n in carried})
        ours_losses.append(out[step.loss])

    model = model.to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    t_tokens = torch.from_numpy(tokens).to(DEVICE)
    theirs_losses: list[torch.Tensor] = []

    def torch_step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = torch_loss(model, t_tokens)
        loss.backward()
        opt.step()
        theirs_losses.append(loss.detach())

    ours = timed(ours_step, args.steps)
    theirs = timed(torch_step, args.steps)
    n = args.batch * args.seq
    print(f"training tokens/s: einsummable {n / ours:,.0f}, torch eager {n / theirs:,.0f}")
    ratio(f"Llama training step (hidden {args.hidden}, {args.layers} layers, "
          f"batch {args.batch} x {args.seq})",
          ours, theirs, 0.9)
    a, b = float(ours_losses[0].float()), float(theirs_losses[0].float())
    print(f"first losses: einsummable {a:.4f}, torch {b:.4f} (relative difference {abs(a - b) / b:.2e}; "
          f"bf16 error ~1e-2) {'OK' if abs(a - b) / b < 2e-2 else 'TOO FAR'}")
    state.clear()
    model.to("cpu")
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def generation(model, cfg, params, args) -> None:
    import torch

    import einsummable as es
    import einsummable.models.llama.generate as generate
    from einsummable.engines import gpu

    def on_gpu(graph, **options):  # Generator's programs, bound to this engine
        prog = es.compile(graph, **(options | {"engine": "simulate"}))
        prog.executor, prog.engine = gpu.GpuProgram(prog.taskgraph, DEVICE), "gpu"
        return prog

    generate.compile = on_gpu
    half = {n: w.astype(to_numpy("bf16")) for n, w in params.items()}
    ours_gen = generate.Generator(cfg, half, workers=1, resident=False)
    prompts = np.random.default_rng(1).integers(0, cfg.vocab_size, (args.gen_batch, args.prompt))
    model = model.to(DEVICE, torch.bfloat16)
    model.generation_config.eos_token_id = None
    t_prompts = torch.from_numpy(prompts).to(DEVICE)

    def theirs():
        with torch.no_grad():
            return model.generate(t_prompts, attention_mask=torch.ones_like(t_prompts), do_sample=False,
                                  use_cache=True, max_new_tokens=args.new_tokens, pad_token_id=0)

    ids = prompts.tolist()
    ours_t = timed(lambda: ours_gen.generate(ids, args.new_tokens), 1)
    theirs_t = timed(theirs, 3)
    same = int((np.array(ours_gen.generate(ids, args.new_tokens)) ==
                theirs()[:, args.prompt:].cpu().numpy()).sum())
    print(f"greedy tokens equal to HF's: {same} of {args.gen_batch * args.new_tokens} (bf16 ties may differ)")
    ratio(f"greedy generation, batch {args.gen_batch}, prompt {args.prompt}, {args.new_tokens} new tokens "
          "(ours driver-fed: weights fed every step)", ours_t, theirs_t, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model and GEMM, to try the script")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gemm", type=int, default=8192)
    parser.add_argument("--gen-batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--cpu-smoke", action="store_true", help="run --quick on torch's CPU device, to try "
                        "the script without a GPU (its timings mean nothing)")
    args = parser.parse_args()
    global DEVICE
    if args.cpu_smoke:
        args.quick, DEVICE = True, "cpu"
    if args.quick:
        args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate = 256, 2, 4, 2, 688
        args.vocab, args.batch, args.seq, args.gemm, args.new_tokens = 1024, 2, 128, 2048, 8
    if args.cpu_smoke:
        args.hidden, args.intermediate, args.vocab, args.seq, args.gemm, args.steps = 64, 128, 256, 32, 256, 1
    try:
        import torch
    except ModuleNotFoundError:
        print("gpu_check: torch is not installed (pip install -e '.[test]'); nothing to check")
        return
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; the GPU engine's CPU-side tests are "
              "tests/engines/test_gpu.py. Nothing to check.")
        return
    print(f"device: {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu'}, torch {torch.__version__}")
    parts = [("correctness", correctness), ("GEMM", lambda: gemm(args.gemm, 10))]
    try:
        model, cfg, params = llama_parts(args)
        parts += [("training", lambda: training(model, cfg, params, args))]
        parts += [("generation", lambda: generation(model, cfg, params, args))]
    except ModuleNotFoundError as err:
        print(f"skipping the Llama parts: {err.name} is not installed")
    failed = []
    for name, part in parts:
        print(f"\n== {name}")
        try:
            part()
        except Exception:
            traceback.print_exc()
            failed.append(name)
    print(f"\n{len(parts) - len(failed)} of {len(parts)} parts ran"
          + (f"; failed: {failed}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
