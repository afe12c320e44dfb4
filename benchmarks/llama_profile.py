"""Where a Llama training step's time goes: GEMMs against everything else, per task kind.

Each task of the local engine is timed as it runs (busy seconds, summed over workers).
Run with 1 and 2 workers; ``EINSUMMABLE_KERNELS=numpy`` gives the numpy path's profile.
``--ab`` instead times the step with compiled kernels against the numpy path, both
trainers built in this process and stepped in alternation (a loaded machine hits both).

    PYTHONPATH=src python benchmarks/llama_profile.py [--workers 2] [--steps 2] [--ab]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import threading
import time
import types

import numpy as np

from common import add_llama_arguments, machine
from einsummable.engines import local
from einsummable.engines.kernels import cbuild, gemm, native
from einsummable.engines.kernels import fast as kernels
from einsummable.ir import kinds
from einsummable.ir.dtypes import to_numpy
from einsummable.ir.expr import variables_used
from einsummable.lower import fusion
from einsummable.lower.taskgraph import ApplyTask, FusedTask, PartialTask
from einsummable.train.trainer import TrainConfig, Trainer
from llama_block import hf_model


def kind(task) -> str:
    """The task's op class: GEMM, elementwise join or reduction (compiled C or numpy), a fused
    pair (lower/fusion.py), moves."""
    if isinstance(task, FusedTask):
        return "GEMM (BLAS) + epilogue join" if kinds.is_gemm(task.first) else "row reduction + join"
    if isinstance(task, ApplyTask):
        op = task.op
        if op.is_contraction() and kinds.inner_size(op) > kinds.TINY_INNER:
            return "GEMM (BLAS)"
        body = kernels.prepare(op)
        compiled = any(isinstance(c.cell_contents, native._Compiled) for c in _cells(body))
        what = "reduction" if op.agg else "elementwise"
        return f"{what}, compiled C" if compiled else f"{what}, numpy"
    return "partial (sums, assembly)" if isinstance(task, PartialTask) else "input/move/view/fill"


def _cells(fn):
    """The closure cells of the prepared kernel and of the body it wraps."""
    seen = list(fn.__closure__ or ())
    for c in list(seen):
        inner = getattr(c.cell_contents, "__closure__", None)
        if callable(c.cell_contents) and inner:
            seen += list(inner)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_llama_arguments(parser, layers=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--ab", action="store_true", help="compiled against numpy kernels, alternating")
    parser.add_argument("--per-op", action="store_true",
                        help="each compiled join of the step against its numpy kernel, on its own")
    parser.add_argument("--ab-rows", action="store_true",
                        help="with row reductions fused into their readers (lower/fusion.py) against "
                             "without, alternating")
    parser.add_argument("--ab-epilogue", action="store_true",
                        help="with GEMM epilogues against without (lower/fusion.py), alternating")
    parser.add_argument("--top", type=int, default=0, help="list the costliest non-GEMM block ops")
    parser.add_argument("--gemms", action="store_true",
                        help="each GEMM block op of the step on its own, on one BLAS thread: its GF/s")
    args = parser.parse_args()
    print(machine())
    _, cfg, params = hf_model(args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate,
                              args.vocab)
    tcfg = TrainConfig(batch=args.batch, seq=args.seq, steps=args.steps + 1)
    data = np.random.default_rng(2).integers(0, cfg.vocab_size, 1 << 20)
    if args.ab:
        return ab(cfg, params, tcfg, data, args)
    if args.ab_epilogue or args.ab_rows:
        return ab_fusion(cfg, params, tcfg, data, args, rows=args.ab_rows)
    if args.per_op:
        return per_op(cfg, params, tcfg, data, args)
    if args.gemms:
        return gemms(cfg, params, tcfg, data, args)
    busy: dict[str, float] = collections.defaultdict(float)
    by_op: dict[str, float] = collections.defaultdict(float)
    lock = threading.Lock()
    original = local.LocalProgram.__init__

    def timed_init(self, tg):
        original(self, tg)
        names = [kind(t) for t in tg.tasks]

        def wrap(step, k, what):
            def run(*a):
                start = time.perf_counter()
                out = step(*a)
                with lock:
                    busy[k] += time.perf_counter() - start
                    by_op[what] += time.perf_counter() - start
                return out
            return run

        self.steps = [wrap(s, k, f"{k}: {t.op if isinstance(t, ApplyTask) else type(t).__name__} {t.shape}")
                      for s, k, t in zip(self.steps, names, tg.tasks, strict=True)]

    local.LocalProgram.__init__ = timed_init
    trainer = Trainer(cfg, params, tcfg, data, workers=args.workers)
    trainer.train_step()  # warm-up
    busy.clear()
    by_op.clear()
    with _timed_matmul() as in_matmul:
        start = time.perf_counter()
        for _ in range(args.steps):
            trainer.train_step()
        wall = (time.perf_counter() - start) / args.steps
    rows = {k: t / args.steps for k, t in busy.items()}
    gemm = sum(t for k, t in rows.items() if k.startswith("GEMM"))
    matmul = in_matmul[0] / args.steps
    rows["  of which np.matmul"] = matmul
    rows["  of which copies, casts, sums, epilogues"] = gemm - matmul
    rows["engine overhead + idle"] = args.workers * wall - sum(busy.values()) / args.steps
    print(f"workers {args.workers}: step {wall:.3f} s wall x {args.workers} = {args.workers * wall:.3f} "
          f"worker-seconds (mean of {args.steps} steps)")
    for k, t in sorted(rows.items(), key=lambda kv: (kv[0].startswith("  "), -kv[1])):
        print(f"  {k:<40} {t:8.3f} s  {100 * t / (args.workers * wall):5.1f}%")
    if args.top:
        print(f"the {args.top} costliest block ops other than GEMMs (all their tasks, a step):")
        rest = [(t, what) for what, t in by_op.items() if not what.startswith("GEMM")]
        for t, what in sorted(rest, reverse=True)[: args.top]:
            print(f"  {t / args.steps:7.3f} s  {what}")


@contextlib.contextmanager
def _timed_matmul():
    """Time every ``np.matmul`` the GEMM kernels call (summed over threads), to split a GEMM
    task's time into BLAS and the copies around it."""
    total = [0.0]
    lock = threading.Lock()
    matmul = np.matmul

    def timed(*a, **k):
        start = time.perf_counter()
        out = matmul(*a, **k)
        with lock:
            total[0] += time.perf_counter() - start
        return out

    gemm.np = types.SimpleNamespace(**{n: getattr(np, n) for n in dir(np) if not n.startswith("__")})
    gemm.np.matmul = timed
    try:
        yield total
    finally:
        gemm.np = np


def ab(cfg, params, tcfg, data, args) -> None:
    """Median step time with compiled kernels and with numpy kernels, stepped in alternation."""
    trainers, built = {}, []
    build = cbuild.build

    def timed_build(sources):
        start, cpu = time.perf_counter(), os.times()
        build(sources)
        after = os.times()
        built.append((len(sources), time.perf_counter() - start,
                      after.children_user + after.children_system - cpu.children_user - cpu.children_system))

    cbuild.build = timed_build
    for mode in ("numpy", "compiled"):
        kernels.prepare.cache_clear()  # kernels are chosen at prepare: prepare again per mode
        if mode == "numpy":
            os.environ[cbuild.ENV] = "numpy"
        start = time.perf_counter()
        trainers[mode] = Trainer(cfg, params, tcfg, data, workers=args.workers)
        os.environ.pop(cbuild.ENV, None)
        print(f"{mode}: prepared in {time.perf_counter() - start:.1f} s")
    n, wall, cpu = (sum(b[i] for b in built) for i in range(3))
    print(f"compiled kernels: {n} built or loaded from the cache in {wall:.2f} s ({cpu:.2f} s compiler CPU)")
    for t in trainers.values():
        t.train_step()  # warm-up
    times: dict[str, list[float]] = {m: [] for m in trainers}
    for _ in range(args.steps):
        for mode, t in trainers.items():
            start = time.perf_counter()
            t.train_step()
            times[mode].append(time.perf_counter() - start)
    med = {m: statistics.median(ts) for m, ts in times.items()}
    np.testing.assert_allclose(trainers["compiled"].losses, trainers["numpy"].losses, rtol=1e-4)
    print(f"workers {args.workers}, median of {args.steps}: compiled {med['compiled']:.3f} s, "
          f"numpy {med['numpy']:.3f} s, numpy/compiled = {med['numpy'] / med['compiled']:.2f}")


def ab_fusion(cfg, params, tcfg, data, args, rows: bool) -> None:
    """Median step time with one rule of lower/fusion.py (``rows``: row reductions and their joins,
    else GEMM epilogues) and without it, stepped in alternation."""
    pairs = fusion._pairs

    def without(tasks, kept, readers):
        found = pairs(tasks, kept, readers)
        return {j: gk for j, gk in found.items() if kinds.is_gemm(tasks[gk[0]].op) == rows}

    trainers = {}
    try:
        for name, variant in {"fused": pairs, "apart": without}.items():
            fusion._pairs = variant
            trainers[name] = Trainer(cfg, params, tcfg, data, workers=args.workers)
    finally:
        fusion._pairs = pairs
    for name, t in trainers.items():
        fused = [kind(task) for task in t.program.taskgraph.tasks if isinstance(task, FusedTask)]
        print(f"{name}: {fused.count('GEMM (BLAS) + epilogue join')} epilogues, "
              f"{fused.count('row reduction + join')} row pairs")
        t.train_step()  # warm-up
    times: dict[str, list[float]] = {m: [] for m in trainers}
    cpu: dict[str, list[float]] = {m: [] for m in trainers}  # CPU seconds: less of the others' load
    for r in range(args.steps):  # ABBA: neither goes first every round
        for mode, t in (trainers.items() if r % 2 == 0 else reversed(trainers.items())):
            start, used = time.perf_counter(), time.process_time()
            t.train_step()
            times[mode].append(time.perf_counter() - start)
            cpu[mode].append(time.process_time() - used)
    med = {m: statistics.median(ts) for m, ts in times.items()}
    for t in trainers.values():
        np.testing.assert_allclose(t.losses, trainers["apart"].losses, rtol=1e-6)
    print(f"workers {args.workers}, median of {args.steps}: "
          + ", ".join(f"{m} {t:.3f} s" for m, t in med.items())
          + "; " + ", ".join(f"apart/{m} = {med['apart'] / t:.3f}" for m, t in med.items() if m != "apart"))
    used = {m: statistics.median(ts) for m, ts in cpu.items()}
    print("  CPU seconds a step (all threads), median: " + ", ".join(f"{m} {t:.3f}" for m, t in used.items())
          + f"; apart/fused = {used['apart'] / used['fused']:.3f}")


def per_op(cfg, params, tcfg, data, args) -> None:
    """Every block op of the step that runs compiled, timed against its numpy kernel (best of
    5 interleaved rounds, random inputs), weighted by how many tasks run it."""
    ops = _step_ops(cfg, params, tcfg, data, args, ("elementwise, compiled C", "reduction, compiled C"))
    rng = np.random.default_rng(0)
    total = {"compiled": 0.0, "numpy": 0.0}
    for op, count in ops.items():
        shapes = [tuple(op.join_shape[i] for i in idx) for idx in op.inputs]
        arrays = [(np.abs(rng.standard_normal(s)) + 0.5).astype(to_numpy(d))
                  for s, d in zip(shapes, op.dtypes, strict=True)]
        variables = dict.fromkeys(variables_used(op.join), 1e-3)
        compiled = kernels.prepare(op)
        os.environ[cbuild.ENV] = "numpy"
        numpy_kernel = kernels.prepare.__wrapped__(op)
        os.environ.pop(cbuild.ENV)
        best = {"compiled": [], "numpy": []}
        with np.errstate(all="ignore"):
            for _ in range(5):
                for name, k in (("compiled", compiled), ("numpy", numpy_kernel)):
                    start = time.perf_counter()
                    k(arrays, variables)
                    best[name].append(time.perf_counter() - start)
        for name in total:
            total[name] += count * min(best[name])
    print(f"{sum(ops.values())} compiled join tasks ({len(ops)} block ops): "
          f"compiled {total['compiled']:.3f} s, numpy {total['numpy']:.3f} s a step, "
          f"numpy/compiled = {total['numpy'] / total['compiled']:.2f}")


def gemms(cfg, params, tcfg, data, args) -> None:
    """Every GEMM block op of the step timed alone on one BLAS thread (best of 3, random inputs),
    weighted by how many tasks run it: which shapes keep BLAS from its peak."""
    from threadpoolctl import threadpool_limits

    ops = _step_ops(cfg, params, tcfg, data, args, ("GEMM (BLAS)",))
    rng = np.random.default_rng(0)
    rows = []
    with threadpool_limits(1, "blas"):
        for op, count in ops.items():
            arrays = [rng.standard_normal([op.join_shape[i] for i in idx]).astype(to_numpy(d))
                      for idx, d in zip(op.inputs, op.dtypes, strict=True)]
            k = kernels.prepare(op)
            best = min(_seconds(k, arrays) for _ in range(3))
            rows.append((count * best, count, best, op.flops() / best, op))
    total = sum(r[0] for r in rows)
    flops = sum(r[1] * r[4].flops() for r in rows)
    print(f"{sum(ops.values())} GEMM tasks, {len(ops)} block ops: {total:.3f} s on one thread, "
          f"{flops / 1e9:.1f} GFLOP, {flops / total / 1e9:.1f} GF/s")
    for t, count, best, rate, op in sorted(rows, key=lambda r: -r[0])[:25]:
        print(f"  {t:7.3f} s  {count:4d} x {best * 1e3:7.2f} ms  {rate / 1e9:6.1f} GF/s  {op}")


def _step_ops(cfg, params, tcfg, data, args, kinds: tuple[str, ...]) -> collections.Counter:
    """The block ops of ``kinds`` (``kind``'s classes) in the training step's TaskGraph, with
    how many tasks run each: read as the Trainer prepares its program."""
    ops: collections.Counter = collections.Counter()
    original = local.LocalProgram.__init__

    def collect(self, tg):
        original(self, tg)
        ops.update(t.op for t in tg.tasks if isinstance(t, ApplyTask) and kind(t) in kinds)

    local.LocalProgram.__init__ = collect
    try:
        Trainer(cfg, params, tcfg, data, workers=args.workers)
    finally:
        local.LocalProgram.__init__ = original
    return ops


def _seconds(k, arrays) -> float:
    start = time.perf_counter()
    k(arrays, None)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
