"""Per-worker timelines: Chrome trace JSON (Perfetto, chrome://tracing) and a PNG Gantt chart.

An event is one task on one lane: ``(name, process, thread, start, end)`` in
seconds, where a process is a machine and a thread a worker (a core, or a NIC).
The local engine records them when asked (measured); the simulators give them
from their replay (predicted). Both write the same formats:

    write_chrome(events, "trace.json")   # "X" events in µs, one per task
    write_gantt(events, "trace.png")     # one row per (machine, worker), matplotlib
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from einsummable.errors import EinsummableError
from einsummable.lower.taskgraph import MoveTask, TaskGraph


class Event(NamedTuple):
    name: str
    process: int  # a machine
    thread: int  # a worker on it
    start: float  # seconds
    end: float


def chrome(events: Sequence[Event], lanes: dict[tuple[int, int], str] | None = None) -> dict:
    """The Chrome trace format's JSON object: one complete ("X") event per task, in µs."""
    out: list[dict] = [
        {"name": e.name, "ph": "X", "pid": e.process, "tid": e.thread, "ts": e.start * 1e6,
         "dur": max(e.end - e.start, 0.0) * 1e6, "cat": e.name.split(" ", 1)[0]}
        for e in events
    ]
    meta: list[dict] = []
    for pid in sorted({e.process for e in events}):
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"name": f"machine {pid}"}})
    for (pid, tid), label in (lanes or {}).items():
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}})
    return {"traceEvents": meta + out, "displayTimeUnit": "ms"}


def write_chrome(events: Sequence[Event], path: str | Path,
                 lanes: dict[tuple[int, int], str] | None = None) -> None:
    try:
        Path(path).write_text(json.dumps(chrome(events, lanes)))
    except OSError as err:
        raise EinsummableError(f"cannot write the trace to {path}: {err.strerror}") from None


def write_gantt(events: Sequence[Event], path: str | Path, title: str = "timeline",
                lanes: dict[tuple[int, int], str] | None = None, max_bars: int = 200_000) -> None:
    """A Gantt chart, one row per (machine, worker), coloured by the kind of task (the name's first word).
    Above ``max_bars`` events only the longest are drawn, so a huge trace still renders."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = sorted(events, key=lambda e: e.end - e.start, reverse=True)[:max_bars]
    rows = sorted({(e.process, e.thread) for e in events})
    row = {r: i for i, r in enumerate(rows)}
    kinds = sorted({e.name.split(" ", 1)[0] for e in shown})
    colours = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(kinds)}
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.25 * min(len(rows), 64)), dpi=120)
    for k in kinds:
        bars = [(e.start, e.end - e.start, row[(e.process, e.thread)]) for e in shown if e.name.startswith(k)]
        by_row: dict[int, list[tuple[float, float]]] = {}
        for s, d, r in bars:
            by_row.setdefault(r, []).append((s * 1e3, d * 1e3))
        for r, spans in by_row.items():
            ax.broken_barh(spans, (r - 0.4, 0.8), color=colours[k], label=k)
    handles = {h.get_label(): h for h in ax.get_children() if getattr(h, "get_label", None) and
               h.get_label() in colours}
    ax.legend(handles.values(), handles.keys(), loc="upper right", fontsize=7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"m{p} {(lanes or {}).get((p, t), f'w{t}')}" for p, t in rows], fontsize=6)
    ax.set_xlabel("ms")
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as err:
        raise EinsummableError(f"cannot write the chart to {path}: {err.strerror}") from None
    finally:
        plt.close(fig)


KIND = {"InputTask": "input", "ConstantTask": "constant", "ApplyTask": "apply", "MoveTask": "move",
        "PartialTask": "partial", "ViewTask": "view", "FusedTask": "fused"}


def label(task: object, i: int) -> str:
    """A task's event name: its kind and id (``apply %12``), as every engine's trace names it."""
    return f"{KIND[type(task).__name__]} %{i}"


def timed(execute: Callable[[int, list], object], times: np.ndarray,
          clock: Callable[[], float] = time.perf_counter) -> Callable[[int, list], object]:
    """``execute(i, args)`` that also writes task i's start and end (``clock`` seconds) into
    ``times[i]``: the dependency loop's callback, wrapped only when a run is traced."""

    def run(i: int, args: list) -> object:
        times[i, 0] = clock()
        out = execute(i, args)
        times[i, 1] = clock()
        return out

    return run


def task_events(tg: TaskGraph, times: np.ndarray,
                measured: bool = False) -> tuple[list[Event], dict[tuple[int, int], str]]:
    """One event per task of ``tg`` from its [tasks, 2] start/end seconds, and the lanes' names.

    A task runs on its machine's core. In a prediction a move holds no core: a move
    between machines is drawn on its sender's NIC lane, one within a machine on that
    machine's lane of moves. ``measured``: every task on the worker thread that ran it."""
    cores = tg.cores
    events, lanes = [], {}
    for t, task in enumerate(tg.tasks):
        m, lane = task.loc // cores, task.loc % cores
        if isinstance(task, MoveTask) and not measured:
            src = task.src // cores
            m, lane = (src, cores) if src != m else (m, cores + 1)
        lanes.setdefault((m, lane), "NIC out" if lane == cores else "moves within" if lane > cores
                         else f"core {lane}")
        events.append(Event(label(task, t), m, lane, float(times[t, 0]), float(times[t, 1])))
    return events, lanes


def write(events: Sequence[Event], path: str | Path, lanes: dict[tuple[int, int], str] | None = None,
          title: str = "timeline") -> Path:
    """``*.png``: a Gantt chart; anything else: Chrome trace JSON."""
    path = Path(path)
    if path.suffix.lower() == ".png":
        write_gantt(events, path, title, lanes)
    else:
        write_chrome(events, path, lanes)
    return path
