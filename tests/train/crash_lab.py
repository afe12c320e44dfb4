"""Kill a checkpoint save at each of its filesystem steps (run as a script by test_checkpoint.py).

    python crash_lab.py ROOT

Trains a tiny Llama 2 steps and saves ROOT/pristine/ckpt; trains 2 more. A child
process records every filesystem call one more save makes (each write, fsync,
mkdir, link, rename, unlink, rmtree). Then, for a chosen set of those calls,
a fresh copy of the step-2 checkpoint goes to ROOT/crashNNN/ckpt and a child
saves step 4 over it and is SIGKILLed at that call (a write is cut half-way).
ROOT/old.npz and ROOT/new.npz hold the step-2 and step-4 states as numpy saw
them; ROOT/crashes.json says where each child died. Only the Trainer's public
API is used, so the same lab runs against any version of the package.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np

from einsummable.models.llama import LlamaConfig, init_params
from einsummable.models.llama.data import corpus
from einsummable.train.trainer import TrainConfig, Trainer

TINY = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1)
CALLS = [(os, "replace"), (os, "rename"), (os, "fsync"), (os, "link"), (os, "mkdir"), (os, "unlink"),
         (os, "rmdir"), (shutil, "rmtree")]


class Calls:
    """Counts filesystem calls; the ``die_at``-th is cut short by SIGKILL."""

    def __init__(self, die_at: int | None) -> None:
        self.die_at, self.log = die_at, []

    def __call__(self, kind: str, name: object, half=None) -> None:
        if len(self.log) == self.die_at:
            if half is not None:
                half()
            os.kill(os.getpid(), signal.SIGKILL)
        if isinstance(name, int):  # fsync's file descriptor: its path where /proc tells it
            try:
                name = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                name = f"fd{name}"
        self.log.append((kind, os.path.basename(str(name))))


class _Dying:
    def __init__(self, f, name, calls: Calls) -> None:
        self._f, self._name, self._calls = f, name, calls

    def write(self, data):
        def half():
            self._f.write(data[: len(data) // 2])
            self._f.flush()

        self._calls("write", self._name, half)
        return self._f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def __getattr__(self, attr):
        return getattr(self._f, attr)


def instrument(calls: Calls) -> None:
    real_open = io.open

    def opener(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return _Dying(f, file, calls) if set(mode) & set("wax+") else f

    builtins.open = io.open = opener
    for module, name in CALLS:
        real = getattr(module, name)

        def wrapped(*args, _real=real, _name=name, **kwargs):
            calls(_name, args[0] if args else "")
            return _real(*args, **kwargs)

        setattr(module, name, wrapped)


def save_in_child(trainer: Trainer, directory: Path, die_at: int | None, log: Path | None = None) -> int:
    """Fork; the child saves with ``die_at`` armed. Returns the child's wait status."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            calls = Calls(die_at)
            instrument(calls)
            trainer.save(directory)
            if log is not None:
                log.write_bytes(json.dumps(calls.log).encode())
            code = 0
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def chosen(log: list) -> list[int]:
    """Every kind of call on every file: its first, middle and last occurrence."""
    groups: dict[tuple, list[int]] = {}
    for k, (kind, name) in enumerate(log):
        groups.setdefault((kind, name), []).append(k)
    return sorted({k for ks in groups.values() for k in (ks[0], ks[len(ks) // 2], ks[-1])})


def main(root: Path) -> None:
    t = Trainer(TINY, init_params(TINY, seed=1), TrainConfig(batch=2, seq=16, steps=10, warmup=2),
                corpus(), engine="reference")
    for _ in range(2):
        t.train_step()
    t.save(root / "pristine" / "ckpt")
    np.savez(root / "old.npz", step=t.step, **t.state)
    for _ in range(2):
        t.train_step()
    np.savez(root / "new.npz", step=t.step, **t.state)
    shutil.copytree(root / "pristine", root / "dry")
    status = save_in_child(t, root / "dry" / "ckpt", None, root / "calls.json")
    assert status == 0, f"the uninterrupted save failed (wait status {status})"
    log = json.loads((root / "calls.json").read_text())
    crashes = []
    for k in chosen(log):
        shutil.copytree(root / "pristine", root / f"crash{k:03d}")
        status = save_in_child(t, root / f"crash{k:03d}" / "ckpt", k)
        crashes.append({"k": k, "call": log[k], "killed": os.WIFSIGNALED(status)
                        and os.WTERMSIG(status) == signal.SIGKILL})
    (root / "crashes.json").write_text(json.dumps(crashes))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
