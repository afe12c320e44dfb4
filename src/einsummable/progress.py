"""Progress for long work: tqdm's bar on a terminal when tqdm is installed, else a redrawn
bar of our own; occasional plain lines elsewhere (logs). Each shows a rate and an ETA."""

from __future__ import annotations

import sys
import time
from typing import TextIO

CLEAR_TO_END = "\x1b[K"  # so a shorter line leaves nothing of a longer one behind


class Progress:
    """``with Progress(total, "train") as bar: bar.update(1, loss=2.3)``; ``initial``: the part
    done before (a resumed run's steps), counted in the bar but not in the rate."""

    def __init__(self, total: int, label: str, unit: str = "it", stream: TextIO | None = None,
                 every: int = 0, use_tqdm: bool = True, initial: int = 0) -> None:
        self.total = total
        self.label = label
        self.unit = unit
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every = every or max(1, total // 10)
        self.done = self.initial = initial
        self.start = time.perf_counter()
        self.fields: dict[str, str] = {}
        self._tqdm = _tqdm(total, label, unit, self.stream, initial) if self.tty and use_tqdm else None

    def update(self, n: int = 1, **fields: object) -> None:
        self.done += n
        self.fields.update({k: _fmt(v) for k, v in fields.items()})
        if self._tqdm is not None:
            if fields:
                self._tqdm.set_postfix(self.fields, refresh=not n)  # nothing done yet: show the fields now
            self._tqdm.update(n)
        elif self.tty:
            self.stream.write("\r" + self.line() + CLEAR_TO_END)
            self.stream.flush()
        elif self.done % self.every == 0 or self.done == self.total:
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def line(self) -> str:
        elapsed = time.perf_counter() - self.start
        frac = min(1.0, self.done / self.total) if self.total else 1.0
        width = 24
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        rate = (self.done - self.initial) / elapsed if elapsed > 0 else 0.0
        left = max(0, self.total - self.done)
        eta = _clock(left / rate) if rate > 0 else "?"
        extra = " ".join(f"{k}={v}" for k, v in self.fields.items())
        return (f"{self.label} [{bar}] {self.done}/{self.total} {rate:.1f} {self.unit}/s "
                f"ETA {eta} {extra}").rstrip()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        elif self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _tqdm(total: int, label: str, unit: str, stream: TextIO, initial: int) -> object | None:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=label, unit=unit, file=stream, dynamic_ncols=True, initial=initial)


def _clock(seconds: float) -> str:
    """``1:05:03``, ``4:07``: hours only when there are some."""
    s = round(seconds)
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
