"""Workload (d): one MLP training step (relu, softmax cross-entropy, AdamW).

Einsummable (forward, backward and AdamW in one graph) against a hand-written numpy
step and PyTorch eager, same shapes, same process.
Run: python benchmarks/mlp_step.py [--batch 8192] [--widths 1024,4096,4096,1024] [--workers 2]
"""

from __future__ import annotations

import argparse
import itertools
import os

import numpy as np

import einsummable as es
from common import SETTLE, compare, gemm_peer, machine, report, report_bound

LR, B1, B2, EPS, WD = 1e-3, 0.9, 0.999, 1e-8, 0.01


def graph(batch: int, widths: list[int]):
    g = es.Graph()
    x = g.input("x", (batch, widths[0]))
    y = g.input("y", (batch,))
    ws = [g.input(f"w{k}", (a, b)) for k, (a, b) in enumerate(itertools.pairwise(widths))]
    h = x
    for k, w in enumerate(ws):
        h = h @ w
        if k < len(ws) - 1:
            h = es.nn.relu(h)
    loss = es.nn.cross_entropy(h, y)
    step = es.train.adamw(loss, ws, lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD)
    return g, step


def numpy_step(x, labels, ws, ms, vs, t):
    acts = [x]
    h = x
    for k, w in enumerate(ws):
        h = h @ w
        if k < len(ws) - 1:
            h = np.maximum(h, 0)
        acts.append(h)
    z = h - h.max(1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(1, keepdims=True)
    n = len(x)
    loss = -np.log(p[np.arange(n), labels]).mean()
    d = p
    d[np.arange(n), labels] -= 1
    d /= n
    c1, c2 = 1 - B1**t, 1 - B2**t
    for k in reversed(range(len(ws))):
        gw = acts[k].T @ d
        if k > 0:
            d = (d @ ws[k].T) * (acts[k] > 0)
        ms[k] *= B1
        ms[k] += (1 - B1) * gw
        vs[k] *= B2
        vs[k] += (1 - B2) * gw * gw
        ws[k] -= LR * ((ms[k] / c1) / (np.sqrt(vs[k] / c2) + EPS) + WD * ws[k])
    return loss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--widths", default="1024,4096,4096,1024")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(machine())
    widths = [int(w) for w in args.widths.split(",")]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, widths[0]), dtype=np.float32)
    labels = rng.integers(0, widths[-1], args.batch)
    ws = [(rng.standard_normal((a, b), dtype=np.float32) / np.float32(np.sqrt(a)))
          for a, b in itertools.pairwise(widths)]

    g, step = graph(args.batch, widths)
    prog = es.compile(g, workers=args.workers)
    sess = prog.session({f"w{k}": w.copy() for k, w in enumerate(ws)} | step.init_state())
    feeds = {"x": x, "y": labels.astype(np.float32)}

    def ours():  # parameters and moments stay resident; only the batch goes in, the loss out
        sess.run(feeds, fetch=["loss"])

    np_state = ([w.copy() for w in ws], [np.zeros_like(w) for w in ws], [np.zeros_like(w) for w in ws])
    counter = [0]

    def hand():
        counter[0] += 1
        numpy_step(x, labels, *np_state, counter[0])

    peers = {"einsummable": ours, "numpy hand-written": hand}
    try:
        import torch

        torch.set_num_threads(os.cpu_count())
        tws = [torch.tensor(w, requires_grad=True) for w in ws]
        opt = torch.optim.AdamW(tws, lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD)
        tx, ty = torch.from_numpy(x), torch.from_numpy(labels)

        def torch_step():
            opt.zero_grad()
            h = tx
            for k, w in enumerate(tws):
                h = h @ w
                if k < len(tws) - 1:
                    h = torch.relu(h)
            torch.nn.functional.cross_entropy(h, ty).backward()
            opt.step()

        peers["torch eager"] = torch_step
    except ImportError:
        pass
    times = compare(peers | {"GEMM": gemm_peer(args.workers)}, args.repeats, settle=SETTLE)
    gemm = times.pop("GEMM")
    title = f"(d) MLP step, batch {args.batch}, widths {widths}"
    report(f"{title} (engine {prog.engine}, workers {args.workers})", times)
    report_bound(step_flops(args.batch, widths), gemm, times, args.workers)


def step_flops(batch: int, widths: list[int]) -> float:
    """The step's GEMM FLOPs: each layer's forward, weight gradient and input gradient, 2 x batch x
    w_in x w_out each, but no input gradient for the first layer (x is data). The rest (relu,
    softmax, AdamW) is O(batch x width) or O(weights), not O(batch x weights)."""
    sizes = [a * b for a, b in itertools.pairwise(widths)]
    return 2 * batch * (3 * sum(sizes) - sizes[0])


if __name__ == "__main__":
    main()
