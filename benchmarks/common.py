"""Shared timing for the benchmarks: medians of repeated runs, printed as ratios.

Peers are timed in interleaved rounds (each round runs every peer once), so a
burst of noise on this shared machine hits all of them rather than one.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
from threadpoolctl import threadpool_info


def machine() -> str:
    """The CPU and the BLAS kernels numpy runs, for a benchmark's first line: GEMM-bound
    figures mean nothing without them. Some machines here set ``OPENBLAS_CORETYPE`` (older
    OpenBLAS builds fail on their CPUs); it holds a current numpy to older kernels (an AMD
    EPYC with AVX-512 on Haswell's: half the GEMM rate), so the line says when it is set."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    blas = ", ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture') or ''}".rstrip()
                     for i in threadpool_info() if i.get("user_api") == "blas")
    forced = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    note = f" (kernels forced by the environment: {forced})" if forced else ""
    return f"CPU: {cpu}, {os.cpu_count()} cores; numpy's BLAS: {blas}{note}"


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    return compare({"fn": fn}, repeats, warmup)["fn"]


SETTLE = 0.25  # seconds: OpenBLAS's idle threads spin 2^28 cycles (measured: 0.105 s of CPU) after a call


def compare(fns: dict[str, Callable[[], object]], repeats: int = 5, warmup: int = 1,
            settle: float = 0.0) -> dict[str, float]:
    """Median seconds per peer, measured round-robin.

    ``settle``: seconds to wait before each timed call, so that a peer's threads still
    spinning after it returned (a multi-threaded BLAS call's: ``SETTLE``) do not run
    during the next peer's timing. On 2 cores the Llama step right after the GEMM peer
    took a median 36 ms (2.4%) longer than after a pause (6 paired rounds, each longer),
    and the GEMM peer right after torch's step (its MKL/OpenMP threads) ran at 210 GF/s
    against 225 after a pause (8 rounds each): without it the GEMM-peak bound was ~7% low.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            time.sleep(settle)
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def report(title: str, times: dict[str, float], base: str = "einsummable") -> None:
    """One table: each peer's median and the ratio einsummable / peer (< 1 means we win)."""
    print(f"\n{title}")
    ours = times[base]
    for name, t in times.items():
        ratio = "" if name == base else f"   einsummable/{name} = {ours / t:5.2f}"
        print(f"  {name:<28} {t * 1e3:9.1f} ms{ratio}")


def add_llama_arguments(parser: argparse.ArgumentParser, layers: int) -> None:
    """The model and batch flags both Llama benchmarks take."""
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=1376)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)


GEMM_N = 2048  # the square f32 matmul whose rate stands for the machine's GEMM peak


def gemm_peer(threads: int, n: int = GEMM_N) -> Callable[[], object]:
    """One n x n x n f32 numpy matmul on ``threads`` BLAS threads: timed among a benchmark's
    peers (``compare``'s rounds), so its rate, the peak a step's GEMM-peak bound divides by,
    sees the same load as they do."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))

    def matmul():
        with threadpool_limits(threads, "blas"):
            return a @ b

    return matmul


def report_bound(flops: float, gemm_seconds: float, times: dict[str, float], threads: int,
                 n: int = GEMM_N) -> None:
    """The step's GEMM-peak bound (its FLOPs at the rate of ``gemm_peer``'s matmul, which took
    ``gemm_seconds``) and each peer's share of it: the fraction of peak each reaches."""
    rate = 2 * n**3 / gemm_seconds
    bound = flops / rate
    print(f"  GEMM-peak bound: {flops / 1e9:.1f} GFLOP at {rate / 1e9:.1f} GF/s "
          f"(f32 {n}^3 numpy matmul on {threads} BLAS threads, median, same rounds) = {bound * 1e3:.1f} ms")
    for name, t in times.items():
        print(f"  bound/{name:<22} = {100 * bound / t:5.1f}% of peak")
    if any(bound > t for t in times.values()):
        print("  (over 100%: the matmul ran below peak: a loaded machine stalls multi-threaded BLAS "
              "more than one-thread workers; rerun on a quiet machine)")
