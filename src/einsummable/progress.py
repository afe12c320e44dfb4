"""Progress for long work: a redrawn bar on a terminal, occasional plain lines elsewhere."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``with Progress(total, "train") as bar: bar.update(1, loss=2.3)``."""

    def __init__(self, total: int, label: str, unit: str = "it", stream: TextIO | None = None,
                 every: int = 0) -> None:
        self.total = total
        self.label = label
        self.unit = unit
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every = every or max(1, total // 10)
        self.done = 0
        self.start = time.perf_counter()
        self.fields: dict[str, str] = {}

    def update(self, n: int = 1, **fields: object) -> None:
        self.done += n
        self.fields.update({k: _fmt(v) for k, v in fields.items()})
        if self.tty:
            self.stream.write("\r" + self.line())
            self.stream.flush()
        elif self.done % self.every == 0 or self.done == self.total:
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def line(self) -> str:
        elapsed = time.perf_counter() - self.start
        frac = self.done / self.total if self.total else 1.0
        width = 24
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        rate = self.done / elapsed if elapsed > 0 else 0.0
        extra = " ".join(f"{k}={v}" for k, v in self.fields.items())
        return f"{self.label} [{bar}] {self.done}/{self.total} {rate:.1f} {self.unit}/s {extra}".rstrip()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
