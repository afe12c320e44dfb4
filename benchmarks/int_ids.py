"""Issue 20 (item 2): token ids as i64 against ids as f32, same process, same plan.

The embedding, its tied head and the cross-entropy, forward and backward, on the local
engine. Both feeds give the same loss and gradient (checked); the ratio i64/f32 of the
median step times says what integer ids cost (1.0: nothing).

Run: PYTHONPATH=src python benchmarks/int_ids.py [--vocab 8192 --hidden 256 --repeats 7]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import einsummable as es
from einsummable.models.llama.model import embed


def program(id_dtype: str, batch: int, seq: int, vocab: int, hidden: int, workers: int) -> es.Program:
    g = es.Graph()
    tokens, table = g.input("tokens", (batch, seq + 1), id_dtype), g.input("w", (vocab, hidden))
    h = embed(tokens[:, :seq], table)
    loss = es.nn.cross_entropy(es.einsum("bsd,vd->bsv", h, table), tokens[:, 1:])
    (dw,) = es.grad(loss, [table])
    g.output("loss", loss)
    g.output("dw", dw)
    return es.compile(g, workers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    table = (0.02 * rng.standard_normal((args.vocab, args.hidden))).astype(np.float32)
    tokens = rng.integers(0, args.vocab, (args.batch, args.seq + 1))
    runs = {}
    for dtype, ids in (("f32", tokens.astype(np.float32)), ("i64", tokens)):
        prog = program(dtype, args.batch, args.seq, args.vocab, args.hidden, args.workers)
        runs[dtype] = (prog, {"tokens": ids, "w": table})
    outs = {k: prog.run(feeds) for k, (prog, feeds) in runs.items()}
    np.testing.assert_allclose(outs["i64"]["loss"], outs["f32"]["loss"], rtol=1e-6)
    np.testing.assert_allclose(outs["i64"]["dw"], outs["f32"]["dw"], rtol=1e-5, atol=1e-9)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.repeats):  # interleaved, so load drifts alike for both
        for k, (prog, feeds) in runs.items():
            start = time.perf_counter()
            prog.run(feeds)
            times[k].append(time.perf_counter() - start)
    med = {k: float(np.median(v)) for k, v in times.items()}
    for k, t in med.items():
        print(f"  ids {k}: median {t * 1e3:8.1f} ms over {args.repeats} steps")
    print(f"  i64/f32 = {med['i64'] / med['f32']:.3f}")


if __name__ == "__main__":
    main()
