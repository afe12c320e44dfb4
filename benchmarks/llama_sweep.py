"""Issue 33's size sweep: Llama training and greedy generation against PyTorch eager, hidden 256 to 1024.

Each size is timed by issue 7's benchmark (``llama.py``), whose ``training`` and ``generation``
this module runs as they are, keeping the medians their ``compare`` returns: the same random
model on both sides (transformers' LlamaForCausalLM, its weights copied into ours), einsummable's
``Trainer`` step (forward, backward, clipping, AdamW) against torch eager + torch.optim.AdamW, the
losses checked equal step by step, the GEMM-peak bound from a numpy matmul timed in the same
rounds; then greedy generation (prompt + new tokens, the prefill included) with our resident
``Generator`` against transformers' ``generate(use_cache=True)``, the tokens compared. Their own
tables print as each size runs (with the driver-fed and one-worker generators beside ours);
this module adds one summary table, a PNG of the ratios, and the BLAS kernels each side runs.

Sizes, scaled as Llama's presets scale (``models/llama/model.py``: llama-7b and llama3-8b have
hidden / layers = 128, and Llama 3.2 1B too; llama-7b's MLP is 11008 = 43/16 x 4096), with head
dim 64 (Llama 3.2 1B's) and two query heads per kv head, as issue 7's benchmark has at 256
(its ``--quick`` model is this sweep's 256 row) and 512 (its default has 8 layers, not 4):

    hidden  layers  heads/kv  MLP    parameters (vocab 512)
       256       2     4/2     688    1.7M   (training step: 0.011 TFLOP)
       384       3     6/3    1032    5.3M   (0.035)
       512       4     8/4    1376   12.1M   (0.079)
       768       6    12/6    2064   39.9M   (0.26)
      1024       8    16/8    2752   93.9M   (0.60)

Vocab 512, untied head; training batch 4 x seq 256 (1024 tokens a step); generation prompt 16
and 32 new tokens at batch 1 and 8. Times are medians of ``--repeats`` rounds after one warm-up
(interleaved rounds, ``common.compare``). Every ratio is time ours / time torch: below 1 ours is
faster. Generation's ms/token is a call's time over its new tokens (one step of the batch).
Run: python benchmarks/llama_sweep.py [--quick] [--sizes 256,384,512,768,1024] [--repeats 3]
     [--png benchmarks/results/llama_sweep.png]
     taskset -c 1 python benchmarks/llama_sweep.py --workers 1   # one core, while another job holds one

Measured here (2-core AMD EPYC, another job holding one core throughout), time ours / torch:
- ``--sizes 256,384,512 --repeats 3`` (load 2.4 rising to 5.7): training 0.17, 0.14, 0.43;
  generation batch 1 0.33, 0.38, 1.28; batch 8 0.31, 0.62, 0.52. Torch's 2 OpenMP threads stall
  whenever the other job holds a core: a 4 x 64 step at 384 took 4.5 s on 2 threads, 0.15 s on 1.
- ``--workers 1 --sizes 256,512`` unpinned (load 2.7-3.1): 2.8-12.4 the other way: our lone worker's BLAS gets
  both cores (``blas_limit``) and stalls the same way, while torch runs on one thread.
- ``taskset -c 1 ... --workers 1 --sizes 256,512`` (load 2.3 falling to 1.1), both sides on one
  thread: training 1.02 and 0.97 (68-89% of the GEMM-peak bound each), generation 0.94-1.00.
So on a loaded machine the ratios at 2 threads measure the load, not the kernels; pin to free cores.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info

import llama
from common import GEMM_N, SETTLE, compare, gemm_peer, machine
from llama_block import hf_model, torch_loss

SIZES = "256,384,512,768,1024"
PNG = Path(__file__).resolve().parent / "results" / "llama_sweep.png"
QUICK = dict(sizes="256,384", repeats=1, seq=64, new_tokens=8)


def shape(hidden: int) -> dict[str, int]:
    """The model at a hidden size (the table in the module's docstring)."""
    heads = hidden // 64
    return dict(hidden=hidden, layers=max(1, hidden // 128), heads=heads, kv_heads=max(1, heads // 2),
                intermediate=hidden * 43 // 16)


@contextlib.contextmanager
def recorded():
    """While it is open, ``llama``'s timings also append the medians they measure to the list it yields."""
    seen: list[dict[str, float]] = []

    def compare_and_keep(*args, **kwargs):
        times = compare(*args, **kwargs)
        seen.append(dict(times))
        return times

    llama.compare = compare_and_keep
    try:
        yield seen
    finally:
        llama.compare = compare


def torch_side(times: dict[str, float]) -> float:
    return next(t for name, t in times.items() if name.startswith("torch"))


def measure(hidden: int, args) -> dict:
    """One size: issue 7's training and generation benchmarks, and the medians they measured."""
    import torch

    s = shape(hidden)
    model, cfg, params = hf_model(s["hidden"], s["layers"], s["heads"], s["kv_heads"], s["intermediate"],
                                  args.vocab)
    n_params = sum(int(np.prod(p)) for p in cfg.parameter_shapes().values())
    print(f"\n=== hidden {hidden}: {s['layers']} layers, heads {s['heads']}/{s['kv_heads']}, "
          f"mlp {s['intermediate']}, vocab {args.vocab}, {n_params / 1e6:.1f}M parameters ===", flush=True)
    if args.kernels is None:  # once: the routines do not change with the size
        ids = np.random.default_rng(0).integers(0, args.vocab, (args.batch, args.seq + 1))
        tokens = torch.from_numpy(ids)
        args.kernels = kernels(lambda: torch_loss(copy.deepcopy(model), tokens).backward())
    run = argparse.Namespace(batch=args.batch, seq=args.seq, steps=args.repeats, repeats=args.repeats,
                             prompt=args.prompt, new_tokens=args.new_tokens, workers=args.workers)
    with recorded() as seen:
        # generation keeps the initial weights
        engine = llama.training(copy.deepcopy(model), cfg, params, run)
        train = seen.pop()
        generation = {}
        for batch in args.gen_batch:
            llama.generation(model, cfg, params, run, engine, batch)
            generation[batch] = seen.pop()
    bound = llama.step_flops(cfg, args.batch, args.seq) / (2 * GEMM_N**3 / train["GEMM"])
    ours, theirs = train["einsummable"], torch_side(train)
    return dict(hidden=hidden, params=n_params, engine=engine,
                train=(ours, theirs), peak=(bound / ours, bound / theirs),
                gen={b: (t["einsummable"] / args.new_tokens, torch_side(t) / args.new_tokens)
                     for b, t in generation.items()})


def kernels(torch_step) -> list[str]:
    """The BLAS both sides run: numpy's library, which einsummable's contractions call (``np.matmul``,
    engines/kernels/gemm.py), and the MKL and oneDNN routines torch's ``torch_step`` calls, from their
    verbose logs (written to file descriptor 1, read back here)."""
    import torch

    mine = [f"{i['internal_api']} {i['version']}, {i.get('architecture')} kernels, {i.get('threading_layer')}"
            for i in threadpool_info()
            if i["user_api"] == "blas" and Path(np.__file__).parent.name + ".libs" in i["filepath"]]
    libc = ctypes.CDLL(None)
    with tempfile.TemporaryFile("w+") as log:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON), \
                    torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                torch_step()
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        lines = log.read().splitlines()
    routines = Counter(m.group(1) for ln in lines if (m := re.match(r"MKL_VERBOSE ([A-Z0-9_]+)\(", ln)))
    threads = sorted({m.group(1) for ln in lines if (m := re.search(r"NThr:(\d+)", ln))})
    header = next((ln.removeprefix("MKL_VERBOSE ") for ln in lines
                   if ln.startswith("MKL_VERBOSE") and not re.match(r"MKL_VERBOSE [A-Z0-9_]+\(", ln)), "none")
    dnn = Counter(",".join(f[f.index("exec") + 2 : f.index("exec") + 4]) for ln in lines
                  if ln.startswith("onednn_verbose") and "exec" in (f := ln.split(",")))
    return [f"einsummable: np.matmul -> numpy's {'; '.join(mine) or 'BLAS (not found)'}, "
            "one BLAS thread per worker (all the cores for one worker)",
            f"torch {torch.__version__} (CPU capability {torch.backends.cpu.get_cpu_capability()}), "
            f"one forward+backward: MKL {dict(routines) or 'none'} on {'/'.join(threads) or '?'} thread(s); "
            f"oneDNN primitives {dict(dnn) or 'none'}",
            f"  MKL: {header}"]


def gemm_rates(workers: int, repeats: int) -> str:
    """numpy's and torch's f32 GEMM_N^3 matmul rates, same rounds: each side's BLAS at its best."""
    import torch

    a, b = (torch.randn(GEMM_N, GEMM_N) for _ in range(2))
    times = compare({"numpy": gemm_peer(workers), "torch": lambda: a @ b}, repeats, settle=SETTLE)
    return ", ".join(f"{name} {2 * GEMM_N**3 / t / 1e9:.1f} GF/s" for name, t in times.items())


def table(rows: list[dict], args) -> list[str]:
    gen = "".join(f" | gen b{b} ms/token ours  torch  ratio" for b in args.gen_batch)
    out = [f"hidden params | train tok/s ours   torch  ratio | % GEMM peak ours torch{gen}"]
    tokens = args.batch * args.seq
    for r in rows:
        (ours, theirs), (p_ours, p_theirs) = r["train"], r["peak"]
        line = (f"{r['hidden']:>6} {r['params'] / 1e6:5.1f}M | {tokens / ours:16.0f} {tokens / theirs:7.0f} "
                f"{ours / theirs:6.2f} | {100 * p_ours:16.1f} {100 * p_theirs:5.1f}")
        for b in args.gen_batch:
            g_ours, g_theirs = r["gen"][b]
            line += f" | {1e3 * g_ours:20.1f} {1e3 * g_theirs:6.1f} {g_ours / g_theirs:6.2f}"
        out.append(line)
    return out


def plot(rows: list[dict], args, out: Path) -> None:
    try:
        import matplotlib
    except ModuleNotFoundError:
        print("matplotlib is not installed: no PNG")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hidden = [r["hidden"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=110)
    left.plot(hidden, [o / t for o, t in (r["train"] for r in rows)], marker="o",
              label=f"training step, {args.batch} x {args.seq}")
    for b in args.gen_batch:
        left.plot(hidden, [r["gen"][b][0] / r["gen"][b][1] for r in rows], marker="s",
                  label=f"greedy generation, batch {b}")
    left.axhline(1.0, color="grey", linewidth=0.8)
    left.set_yscale("log")
    left.set_ylabel("time einsummable / torch eager (< 1: ours faster)")
    left.set_title("einsummable / torch eager")
    for k, name in enumerate(("einsummable", "torch eager")):
        right.plot(hidden, [100 * r["peak"][k] for r in rows], marker="o", label=name)
    right.set_ylabel("% of the GEMM-peak bound (training)")
    right.set_title(f"training: fraction of numpy's {GEMM_N}^3 GEMM rate")
    for ax in (left, right):
        ax.set_xlabel("hidden size")
        ax.set_xticks(hidden)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=SIZES, help="hidden sizes, a comma list of multiples of 64")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up")
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK}")
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4, help="training batch")
    parser.add_argument("--seq", type=int, default=256, help="training sequence")
    parser.add_argument("--gen-batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--png", type=Path, default=PNG)
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args()  # explicit flags still win over --quick's
    sizes = [int(s) for s in args.sizes.split(",")]
    if any(h % 64 for h in sizes):
        parser.error(f"--sizes {args.sizes}: every hidden size must be a multiple of 64 (head dim 64)")
    import torch

    torch.set_num_threads(args.workers)  # the same threads as our workers
    print(machine())
    load, cores = os.getloadavg()[0], len(os.sched_getaffinity(0))
    if load > 0.5 and min(args.workers, cores) > 1:
        print(f"load average {load:.1f}: a multi-threaded BLAS or OpenMP region (torch's; ours with one "
              "worker) stalls while another process holds one of its cores; for a fair figure pin this run "
              "to free cores (taskset) and give --workers as many")
    rates = gemm_rates(args.workers, max(args.repeats, 3))
    print(f"f32 {GEMM_N}^3 matmul on {args.workers} threads: {rates}")
    args.kernels = None
    rows = [measure(h, args) for h in sizes]
    print("\nBLAS kernels:\n  " + "\n  ".join(args.kernels))
    print(f"\nsweep: training batch {args.batch} x seq {args.seq}, generation prompt {args.prompt} + "
          f"{args.new_tokens} new tokens, vocab {args.vocab}, workers {args.workers} (torch threads "
          f"{torch.get_num_threads()}), engine "
          f"{rows[0]['engine']}; medians of {args.repeats}; ratio = time einsummable / torch eager")
    print("\n".join(table(rows, args)))
    plot(rows, args, args.png)


if __name__ == "__main__":
    main()
