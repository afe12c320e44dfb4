"""Block kernels: generated C (engines/native) against the numpy path and torch, one thread.

Each pattern is the einsummables the graph holds for it, run on one block as the
local engine runs them: each op's ``kernels.prepare`` kernel, except that a row reduction
read by one elementwise step alone runs with it as one fused step (engines/kernels/rowfuse.py:
softmax backward, softmax's and rmsnorm's last two steps, rmsnorm backward's dx). The
numpy path is the same ops prepared with ``EINSUMMABLE_KERNELS=numpy``, unfused.
Each block is fed where the engine would hold it, on a cache line (``_as_block``).
Medians (and, for a loaded machine, the best) of interleaved rounds.

    PYTHONPATH=src python benchmarks/join_kernels.py [--rows 1024] [--repeats 7] [--only causal]

The causal rows are softmax's ``exp(x - m)`` on a block whose upper triangle is masked
with -1e9 or -inf (every attention's diagonal blocks): libmvec's vector exp left its
fast path for arguments below about -87; f32 exp is now inline C (engines/cprelude), and
these rows time that case (issue 18).

(Not benchmarks/kernels.py: run from benchmarks/, that name shadows the ``kernels``
package that transformers imports, and the Llama benchmarks fail.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from common import machine
from einsummable.engines import local
from einsummable.engines.kernels import aligned, cbuild, native, rowfuse
from einsummable.engines.kernels import fast as kernels
from einsummable.ir.einsummable import Einsummable
from einsummable.lower.fusion import wiring
from einsummable.lower.taskgraph import FusedTask

F32 = np.float32


def op(spec: str, shapes, join: str, agg: str | None = None) -> Einsummable:
    return Einsummable.from_spec(spec, shapes, join=join, agg=agg, dtypes=["f32"] * len(shapes))


def patterns(rows: int, ff: int, d: int, keys: int) -> dict:
    """name -> (list of (op, operand names, result name), torch function, inputs)."""
    rng = np.random.default_rng(0)

    def arr(*shape):  # torch's tensors wrap these: on a cache line, as torch allocates its own
        return _as_block(rng.standard_normal(shape).astype(F32))

    n, eps = d, 1e-6
    s, r = (rows, keys), (rows,)
    x, dy = arr(*s), arr(*s)
    y = np.exp(x - x.max(1, keepdims=True))
    y /= y.sum(1, keepdims=True)
    causal = np.arange(keys)[None, :] * rows > np.arange(rows)[:, None] * keys
    masked = {fill: np.where(causal, F32(fill), x) for fill in (-1e9, -np.inf)}
    h, w, g = arr(rows, d), arr(d), arr(rows, d)
    ms = (h * h).mean(1).astype(F32)
    p, m, v = arr(rows, ff), arr(rows, ff) * 0.1, np.abs(arr(rows, ff)) * 0.01
    scal = {"c1": np.array(0.1, F32), "c2": np.array(0.001, F32), "lr": np.array(1e-3, F32),
            "eps": np.array(1e-8, F32), "wd": np.array(0.1, F32)}
    adam_step = "x5 / x3 * x1 / (sqrt(x2) / sqrt(x4) + x6)"
    ts = {k: torch.from_numpy(a) for k, a in
          dict(x=x, dy=dy, y=y, h=h, w=w, g=g, a=arr(rows, ff), b=arr(rows, ff)).items()}
    tp = torch.from_numpy(p.copy())
    tp.grad = torch.from_numpy(arr(rows, ff))
    opt = torch.optim.AdamW([tp], lr=1e-3, weight_decay=0.1, fused=True)

    def torch_rms_bwd():
        tr = torch.rsqrt((ts["h"] * ts["h"]).mean(1, keepdim=True) + eps)
        t = (ts["g"] * ts["w"] * ts["h"]).sum(1, keepdim=True)
        dx = ts["g"] * ts["w"] * tr - ts["h"] * (tr ** 3 / n) * t
        return dx, (ts["g"] * ts["h"] * tr).sum(0)

    def causal_exp(fill):
        xm = masked[fill]
        tx, tm = torch.from_numpy(xm), torch.from_numpy(xm.max(1))
        return ([(op("ij,i->ij", [s, r], "exp(x0 - stop_gradient(x1))"), ("x", "m"), "o")],
                lambda: torch.exp(tx - tm[:, None]), {"x": xm, "m": xm.max(1)})

    return {
        "causal -1e9 exp": causal_exp(-1e9),
        "causal -inf exp": causal_exp(-np.inf),
        "silu(x) * y": ([(op("ij,ij->ij", [(rows, ff)] * 2, "silu(x0) * x1"), ("a", "b"), "o")],
                        lambda: torch.nn.functional.silu(ts["a"]) * ts["b"],
                        {"a": ts["a"].numpy(), "b": ts["b"].numpy()}),
        "softmax forward": ([
            (op("ij->i", [s], "x0", "max"), ("x",), "m"),
            (op("ij,i->i", [s, r], "exp(x0 - stop_gradient(x1))", "add"), ("x", "m"), "s"),
            (op("ij,i,i->ij", [s, r, r], "exp(x0 - stop_gradient(x1)) / x2"), ("x", "m", "s"), "o"),
        ], lambda: torch.softmax(ts["x"], 1), {"x": x}),
        "softmax backward": ([
            (op("ij,ij->i", [s, s], "x0 * x1", "add"), ("y", "dy"), "t"),
            (op("ij,ij,i->ij", [s, s, r], "x0 * (x1 - x2)"), ("y", "dy", "t"), "o"),
        ], lambda: torch._softmax_backward_data(ts["dy"], ts["y"], 1, torch.float32), {"y": y, "dy": dy}),
        "rmsnorm forward": ([
            (op("ij->i", [(rows, d)], f"x0 * x0 * {1.0 / n!r}", "add"), ("h",), "ms"),
            (op("ij,i,j->ij", [(rows, d), r, (d,)], f"x0 * rsqrt(x1 + {eps!r}) * x2"), ("h", "ms", "w"), "o"),
        ], lambda: ts["h"] * torch.rsqrt((ts["h"] * ts["h"]).mean(1, keepdim=True) + eps) * ts["w"],
            {"h": h, "w": w}),
        "rmsnorm backward": ([
            (op("ij,j,ij->i", [(rows, d), (d,), (rows, d)], "x0 * x1 * x2", "add"), ("g", "w", "h"), "t"),
            (op("ij,j,ij,i,i->ij", [(rows, d), (d,), (rows, d), r, r],
                f"x0 * x1 * rsqrt(x3 + {eps!r}) - x2 * rsqrt(x3 + {eps!r}) ** 3 * {1.0 / n!r} * x4"),
             ("g", "w", "h", "ms", "t"), "dx"),
            (op("ij,ij,i->j", [(rows, d), (rows, d), r], f"x0 * x1 * rsqrt(x2 + {eps!r})", "add"),
             ("g", "h", "ms"), "dw"),
        ], torch_rms_bwd, {"g": g, "w": w, "h": h, "ms": ms}),
        "AdamW update": ([
            (op("ij,ij->ij", [(rows, ff)] * 2, "0.9 * x0 + 0.1 * x1"), ("m", "gp"), "m2"),
            (op("ij,ij->ij", [(rows, ff)] * 2, "0.999 * x0 + 0.001 * (x1 * x1)"), ("v", "gp"), "v2"),
            (op("ij,ij,ij,,,,,->ij", [(rows, ff)] * 3 + [()] * 5, f"x0 * (1 - x5 * x7) - {adam_step}"),
             ("p", "m2", "v2", "c1", "c2", "lr", "eps", "wd"), "o"),
        ], opt.step, {"p": p, "m": m, "v": v, "gp": tp.grad.numpy(), **scal}),
    }


def numpy_path(o: Einsummable):
    """``o``'s kernel as the numpy path prepares it (EINSUMMABLE_KERNELS=numpy for this call)."""
    os.environ[cbuild.ENV] = "numpy"
    try:
        return kernels.prepare.__wrapped__(o)
    finally:
        del os.environ[cbuild.ENV]


def runner(steps, feeds, prepare, fuse: bool = False):
    """The steps in order, each prepared once. With ``fuse``, a row reduction whose result one
    elementwise step alone reads runs with it as the local engine runs that pair: one fused
    step (engines/kernels/rowfuse.py), which never makes the reduction's block."""
    fused = _row_pairs(steps) if fuse else {}
    skipped = {r for r, _ in fused.values()}
    prepared = []
    for i, (o, names, out) in enumerate(steps):
        if i in fused:
            r, k = fused[i]
            red, red_names, _ = steps[r]
            inputs, slots = wiring(red_names, names, k)
            step = rowfuse.step(FusedTask(red, o, slots, tuple(range(len(inputs))), 0))
            prepared.append((lambda args, variables, step=step: step(args, {}, variables), inputs, out))
        elif i not in skipped:
            prepared.append((prepare(o), names, out))

    def run():
        env = dict(feeds)
        for kernel, names, out in prepared:
            env[out] = kernel([env[k] for k in names], None)
        return env

    return run


def _row_pairs(steps) -> dict[int, tuple[int, int]]:
    """{join step: (reduction step, operand)} where the local engine fuses them: the reduction's
    result is read by that step alone and ``rowfuse.source`` has a function for the pair."""
    out = {}
    for r, (red, _, name) in enumerate(steps):
        readers = [(j, k) for j, (_, names, _) in enumerate(steps) for k, n in enumerate(names) if n == name]
        if len(readers) == 1 and rowfuse.source(red, steps[readers[0][0]][0], readers[0][1]) is not None:
            out[readers[0][0]] = (r, readers[0][1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--ff", type=int, default=1376)
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--keys", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", default="", help="run the patterns whose name contains this")
    args = parser.parse_args()
    torch.set_num_threads(1)
    local._keep_freed_memory()  # blocks come from the reused heap, as in the engines
    print(f"{machine()}; torch {torch.__version__}")
    if not cbuild.enabled():
        raise SystemExit("compiled kernels are off (EINSUMMABLE_KERNELS=numpy or no compiler)")

    print(f"\n{'pattern':<18} {'compiled':>10} {'numpy':>10} {'torch':>10}   numpy/compiled  torch/compiled")
    with threadpool_limits(1):
        for name, (steps, torch_fn, feeds) in patterns(args.rows, args.ff, args.d, args.keys).items():
            if args.only not in name:
                continue
            feeds = {k: _as_block(v) for k, v in feeds.items()}
            ours = runner(steps, feeds, kernels.prepare, fuse=True)
            native.flush()
            base = runner(steps, feeds, numpy_path)
            a, b = ours(), base()
            for out in a.keys() & b.keys():  # the same numbers, before timing (a fused pair's one result)
                np.testing.assert_allclose(a[out], b[out], rtol=2e-4, atol=1e-5)
            runs = rounds({"compiled": ours, "numpy": base, "torch": torch_fn}, args.repeats)
            for label, stat in (("median", statistics.median), ("best", min)):
                t = {k: stat(v) for k, v in runs.items()}
                ms = " ".join(f"{t[k] * 1e3:8.3f}ms" for k in ("compiled", "numpy", "torch"))
                print(f"{name if label == 'median' else '':<18} {ms}   {t['numpy'] / t['compiled']:10.2f}x"
                      f"  {t['torch'] / t['compiled']:12.2f}x   ({label} of {args.repeats})")
            for j, (r, _) in _row_pairs(steps).items():
                print(f"{'':<18} compiled: {steps[r][2]} and {steps[j][2]} as one fused step (rowfuse.py)")


def _as_block(a: np.ndarray) -> np.ndarray:
    """``a`` where the engine keeps such a block: a GEMM's or a compiled join's output starts on
    a cache line (engines/kernels/aligned.py); numpy's arrays start 16 bytes into one. The numpy path
    and the compiled kernels read the same copies."""
    if a.ndim == 0:
        return a
    out, _ = aligned.empty(a.shape, a.dtype)
    out[...] = a
    return out


def rounds(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Every peer's time in each of ``repeats`` interleaved rounds, after one warm-up."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - start)
    return times

if __name__ == "__main__":
    main()
