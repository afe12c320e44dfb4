"""Shared timing for the benchmarks: medians of repeated runs, printed as ratios.

Peers are timed in interleaved rounds (each round runs every peer once), so a
burst of noise on this shared machine hits all of them rather than one.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    return compare({"fn": fn}, repeats, warmup)["fn"]


def compare(fns: dict[str, Callable[[], object]], repeats: int = 5, warmup: int = 1) -> dict[str, float]:
    """Median seconds per peer, measured round-robin."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
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
