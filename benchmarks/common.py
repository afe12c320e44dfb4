"""Shared timing for the benchmarks: medians of repeated runs, printed as ratios."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def report(title: str, times: dict[str, float], base: str = "einsummable") -> None:
    """One table: each peer's median and the ratio einsummable / peer (< 1 means we win)."""
    print(f"\n{title}")
    ours = times[base]
    for name, t in times.items():
        ratio = "" if name == base else f"   einsummable/{name} = {ours / t:5.2f}"
        print(f"  {name:<28} {t * 1e3:9.1f} ms{ratio}")
