"""A training checkpoint's ``trainer.json``: where the run stands, and what it is made of.

A checkpoint directory holds ``config.json`` and ``model.safetensors`` (the Hugging
Face layout; a LoRA run's holds PEFT's ``adapter_config.json`` and
``adapter_model.safetensors`` instead), ``optimizer.safetensors`` and, written last,
``trainer.json``:

    {"step": 4, "train": {...TrainConfig}, "losses": [...],
     "data": {"source": "/abs/corpus.txt", "sha256": "...", "tokens": 236000},
     "files": {"model.safetensors": {"bytes": ..., "sha256": "..."}, ...}}

``files`` is the manifest: resume refuses a directory whose files are not the ones
saved with that step. ``data`` says what the run trained on, so a resume without
data reads the same file and notices when it has changed. A LoRA run's also has
``base``, its base model's directory and the digests of the files a load reads from
it (``{"path": "/abs/base", "files": {"config.json": {...}, ...}}``): the adapters
mean nothing on other base weights, so resume refuses a base changed since the save.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from einsummable.errors import CheckpointError
from einsummable.models import atomic
from einsummable.models.llama import weights

META = "trainer.json"
FILES = ("config.json", "model.safetensors", "optimizer.safetensors")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors")  # a LoRA run's


def data_record(data: np.ndarray, source: str | None) -> dict:
    """The identity of the training data: where it came from and a hash of its tokens."""
    return {"source": source, "sha256": data_digest(data), "tokens": len(data)}


def data_digest(data: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(data)).hexdigest()


def base_record(directory: str) -> dict:
    """A base model's identity: its directory and the digest of each file a load reads."""
    paths = {name: Path(directory) / name for name in weights.files(directory)}
    files = {name: _digest(path) for name, path in paths.items() if path.is_file()}
    return {"path": directory, "files": files}


def check_base(where: Path, recorded: dict, directory: str) -> dict:
    """The record of the base in ``directory`` now, if it is the one ``where`` recorded."""
    now = base_record(directory)
    if now["files"] != recorded["files"]:
        names = set(now["files"]) | set(recorded["files"])
        changed = sorted(n for n in names if now["files"].get(n) != recorded["files"].get(n))
        raise CheckpointError(f"the base model {directory} has changed since the checkpoint {where} was "
                              f"saved ({', '.join(changed)} differ from the files it recorded): the adapters "
                              "were trained on the base as it was; restore it to resume")
    return now


def write(directory: Path, step: int, train: dict, losses: list[float], data: dict,
          names: tuple[str, ...] = FILES, base: dict | None = None) -> None:
    """Write trainer.json into ``directory`` once the other files (``names``) are there (it lists them);
    ``base``: a LoRA run's ``base_record``."""
    files = {name: _digest(directory / name) for name in names}
    meta = {"step": step, "train": train, "losses": losses, "data": data, "files": files}
    if base is not None:
        meta["base"] = base
    (directory / META).write_text(json.dumps(meta, indent=2))


def read(directory: str | Path) -> dict:
    """trainer.json, checked field by field, after checking the files it lists.

    Finishes (or undoes) a save that was interrupted between its renames first.
    """
    directory = Path(directory)
    atomic.recover(directory)
    path = directory / META
    if not path.exists():
        raise CheckpointError(f"{directory}: no {META}; is this a training checkpoint?")
    try:
        meta = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None
    _check_meta(path, meta)
    for name, want in meta["files"].items():
        have = directory / name
        if not have.is_file():
            raise CheckpointError(f"{have} is missing; {META} lists it as part of the step-{meta['step']} "
                                  "checkpoint")
        got = _digest(have)
        if got != want:
            raise CheckpointError(
                f"{have} is not the file saved with the step-{meta['step']} checkpoint "
                f"({got['bytes']} bytes, sha256 {got['sha256'][:16]}; {META} records {want['bytes']} bytes, "
                f"sha256 {want['sha256'][:16]}): the checkpoint mixes files from different saves; "
                "refusing to resume"
            )
    return meta


def _digest(path: Path) -> dict:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return {"bytes": path.stat().st_size, "sha256": h.hexdigest()}


def _check_meta(path: Path, meta: object) -> None:
    """Every field present, known and of its type; the error names the file and the field."""
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    _keys(path, "", meta, {"step", "train", "losses", "data", "files"}, optional={"base"})
    step = meta["step"]
    if not _is_int(step) or step < 0:
        raise CheckpointError(f"{path}: 'step' must be a non-negative integer, got {step!r}")
    if not isinstance(meta["train"], dict):
        raise CheckpointError(f"{path}: 'train' must be an object of settings, got {meta['train']!r}")
    losses = meta["losses"]
    if not isinstance(losses, list) or not all(_is_number(x) for x in losses):
        raise CheckpointError(f"{path}: 'losses' must be a list of numbers")
    data = meta["data"]
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: 'data' must be an object, got {data!r}")
    _keys(path, "data.", data, {"source", "sha256", "tokens"})
    if not (data["source"] is None or isinstance(data["source"], str)):
        raise CheckpointError(f"{path}: 'data.source' must be a path or null, got {data['source']!r}")
    if not _is_digest(data["sha256"]):
        raise CheckpointError(f"{path}: 'data.sha256' must be a sha256 hex digest, got {data['sha256']!r}")
    if not _is_int(data["tokens"]) or data["tokens"] < 0:
        raise CheckpointError(f"{path}: 'data.tokens' must be a non-negative integer, got {data['tokens']!r}")
    files = meta["files"]
    if not isinstance(files, dict):
        raise CheckpointError(f"{path}: 'files' must be an object, got {files!r}")
    _keys(path, "files.", files, set(ADAPTER_FILES if "adapter_config.json" in files else FILES))
    _check_digests(path, "files.", files)
    base = meta.get("base")
    if base is not None:
        if not isinstance(base, dict):
            raise CheckpointError(f"{path}: 'base' must be an object, got {base!r}")
        _keys(path, "base.", base, {"path", "files"})
        if not isinstance(base["path"], str) or not isinstance(base["files"], dict):
            raise CheckpointError(f"{path}: 'base' must hold a 'path' and an object of 'files', got {base!r}")
        _check_digests(path, "base.files.", base["files"])


def _check_digests(path: Path, prefix: str, files: dict) -> None:
    for name, entry in files.items():
        if not isinstance(entry, dict):
            raise CheckpointError(f"{path}: '{prefix}{name}' must be an object, got {entry!r}")
        _keys(path, f"{prefix}{name}.", entry, {"bytes", "sha256"})
        if not _is_int(entry["bytes"]) or not _is_digest(entry["sha256"]):
            raise CheckpointError(f"{path}: '{prefix}{name}' must hold an integer 'bytes' and a sha256 "
                                  f"digest, got {entry!r}")


def _keys(path: Path, prefix: str, values: dict, expected: set[str], optional: frozenset[str] = frozenset()
          ) -> None:
    unknown = sorted(set(values) - expected - optional)
    if unknown:
        known = sorted(expected | optional)
        raise CheckpointError(f"{path}: unknown field {prefix}{unknown[0]!s}; expected {known}")
    missing = sorted(expected - set(values))
    if missing:
        raise CheckpointError(f"{path}: field {prefix}{missing[0]} is missing")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:  # NaN and inf included: a diverged run's losses are saved as they were
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_digest(x: object) -> bool:
    return isinstance(x, str) and len(x) == 64 and all(c in "0123456789abcdef" for c in x)
