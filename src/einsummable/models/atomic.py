"""Replace a checkpoint directory whole, so that a crash never leaves half of one.

A save writes every file into a fresh directory beside the target
(``.NAME.einsummable-new``), fsyncs the files and the directory, then swaps it in:

    rename NAME -> .NAME.einsummable-old;  rename .NAME.einsummable-new -> NAME;
    remove .NAME.einsummable-old

with the parent directory fsynced after each rename. Whenever the process dies,
one of three states is left on disk, and ``recover`` (run before every save and
every resume) turns each into a whole checkpoint:

- NAME present: it is whole (old or new); the ``-new`` and ``-old`` ones are leftovers.
- NAME absent, ``-old`` present: the crash fell between the renames; ``-old``
  is the previous checkpoint, whole (it is removed only once NAME exists again).
- neither: there was never a checkpoint.

Files in NAME that the save does not write (a loss plot, a tokenizer) are
hard-linked into the new directory, so a save replaces only what it writes.

    with replacing("run") as tmp:
        (tmp / "config.json").write_text(...)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

from einsummable.errors import CheckpointError


def _siblings(target: Path) -> tuple[Path, Path]:
    return (target.with_name(f".{target.name}.einsummable-new"),
            target.with_name(f".{target.name}.einsummable-old"))


def _resolve(directory: str | Path) -> Path:
    target = Path(os.path.realpath(directory))
    if target.parent == target:
        raise CheckpointError(f"cannot save a checkpoint as {target}: name a directory to hold it")
    if Path.cwd().resolve().is_relative_to(target):
        raise CheckpointError(f"cannot save a checkpoint into {target}, which holds the current directory: "
                              "saving replaces the directory whole; name a subdirectory")
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"{target} is a file; a checkpoint is a directory")
    return target


def writable(directory: str | Path) -> Path:
    """The directory a save of ``directory`` would replace, once the folder it goes in (its
    parent, or the nearest one above it that exists) has taken a new entry: an unusable place
    is found before the work whose result it would hold, not at the first save."""
    target = _resolve(directory)
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise CheckpointError(f"cannot save a checkpoint as {target}: {parent} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=f".{target.name}.einsummable-probe-"))
    except OSError as err:
        raise CheckpointError(f"cannot save a checkpoint as {target}: cannot write in {parent} "
                              f"({err.strerror})") from None
    return target


def recover(directory: str | Path) -> bool:
    """Put back the previous checkpoint if a save died between its renames; drop leftovers.

    Returns whether a checkpoint was put back (the interrupted save is lost).
    """
    target = Path(os.path.realpath(directory))
    saving, old = _siblings(target)
    restored = False
    if not target.exists() and old.is_dir():
        os.replace(old, target)
        _fsync_dir(target.parent)
        restored = True
        warnings.warn(f"{target}: a save was interrupted; restored the checkpoint from before it",
                      stacklevel=2)
    for leftover in (saving, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    return restored


@contextlib.contextmanager
def replacing(directory: str | Path) -> Iterator[Path]:
    """Yield an empty directory to write into; on leaving, it replaces ``directory`` whole."""
    target = _resolve(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    recover(target)
    saving, old = _siblings(target)
    saving.mkdir()
    try:
        yield saving
        for f in saving.iterdir():
            _fsync_file(f)
        if target.exists():
            _carry_over(target, saving)
        _fsync_dir(saving)
    except BaseException:
        shutil.rmtree(saving, ignore_errors=True)
        raise
    if target.exists():
        os.replace(target, old)
        _fsync_dir(target.parent)
    os.replace(saving, target)
    _fsync_dir(target.parent)
    if old.exists():
        shutil.rmtree(old)


def _carry_over(target: Path, saving: Path) -> None:
    """Hard-link what the save does not write (copy where links are not supported)."""
    for entry in target.iterdir():
        dest = saving / entry.name
        if dest.exists() or dest.is_symlink():
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(entry), dest)
        elif entry.is_dir():
            shutil.copytree(entry, dest, symlinks=True, copy_function=_link)
        else:
            _link(entry, dest)


def _link(src: str | Path, dst: str | Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _fsync_file(path: Path) -> None:
    if path.is_file() and not path.is_symlink():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_dir(path: Path) -> None:
    """Make renames and new entries durable (directories cannot be opened on Windows)."""
    if os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
