"""Tokenizers: a built-in byte-level one, ``tokenizer.json`` and sentencepiece models.

A model directory says which it uses: ``tokenizer.json`` or ``tokenizer.model``
(Hugging Face's files), or our ``einsummable_tokenizer.json`` marker for a byte-level
model such as the demo's. A directory with none of them is refused: guessing bytes
for a model trained on another vocabulary prints garbage without a word.

``TokenizerFiles`` carries a model's tokenizer files and special-token ids from the
directory it was loaded from to every directory it is saved to, so that
transformers reloads a fine-tuned model with the same tokenizer and ``eos_token_id``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from einsummable.errors import CheckpointError, EinsummableError

BYTES = "bytes"
BYTE_MARKER = "einsummable_tokenizer.json"
# Hugging Face's tokenizer files (the chat template lives in tokenizer_config.json or
# chat_template.jinja), and generation_config.json, which holds the ids generate stops on.
FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
         "chat_template.jinja", "generation_config.json", BYTE_MARKER)
CONFIG_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


@dataclass(frozen=True)
class TokenizerFiles:
    """A model's tokenizer files (name -> bytes) and its config.json's special-token ids."""

    files: dict[str, bytes] = field(default_factory=dict)
    config: dict[str, object] = field(default_factory=dict)

    @staticmethod
    def read(source: str | Path | None) -> TokenizerFiles:
        """From a model directory, ``BYTES`` for our byte-level tokenizer, or None for none."""
        if source is None:
            return TokenizerFiles()
        if source == BYTES:
            return TokenizerFiles({BYTE_MARKER: json.dumps({"type": BYTES, "vocab_size": 256}).encode()})
        source = Path(source)
        files = {name: (source / name).read_bytes() for name in FILES if (source / name).is_file()}
        config = {}
        if (source / "config.json").is_file():
            values = _json(source / "config.json")
            if isinstance(values, dict):
                config = {k: values[k] for k in CONFIG_KEYS if values.get(k) is not None}
        return TokenizerFiles(files, config)

    def write(self, model_dir: Path) -> None:
        """Write the files beside a saved model and merge the ids into its config.json."""
        for name, data in self.files.items():
            (model_dir / name).write_bytes(data)
        if self.config:
            path = model_dir / "config.json"
            path.write_text(json.dumps(_json(path) | self.config, indent=2))


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int | None

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: 256 ids, nothing to download, any text round-trips."""

    vocab_size = 256
    eos_id: int | None = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizer.json`` through the ``tokenizers`` package."""

    def __init__(self, path: str | Path, eos_id: int | None = None) -> None:
        try:
            from tokenizers import Tokenizer as _Tokenizer
        except ImportError:
            raise EinsummableError(
                "tokenizer.json needs the 'tokenizers' package: pip install tokenizers"
            ) from None
        try:
            self._tok = _Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises a bare Exception for any file it cannot read
            raise CheckpointError(f"{path}: not a tokenizer file the tokenizers package can read "
                                  f"({err})") from None
        self.vocab_size = self._tok.get_vocab_size()
        self.eos_id = eos_id

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


class SentencePieceTokenizer:
    """A sentencepiece ``tokenizer.model`` (Llama 2)."""

    def __init__(self, path: str | Path) -> None:
        try:
            import sentencepiece
        except ImportError:
            raise EinsummableError(
                "tokenizer.model needs the 'sentencepiece' package: pip install sentencepiece"
            ) from None
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError) as err:
            raise CheckpointError(f"{path}: not a sentencepiece model ({err})") from None
        self.vocab_size = self._sp.get_piece_size()
        eos = self._sp.eos_id()
        self.eos_id = eos if eos >= 0 else None

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self._sp.decode(ids)


def load(model_dir: str | Path) -> Tokenizer:
    """The tokenizer a model directory ships; a CheckpointError if it ships none."""
    model_dir = Path(model_dir)
    eos = None
    config = model_dir / "config.json"
    if config.exists():
        values = _json(config)
        eos_value = values.get("eos_token_id") if isinstance(values, dict) else None
        eos = eos_value[0] if isinstance(eos_value, list) else eos_value
    if (model_dir / "tokenizer.json").exists():
        return HFTokenizer(model_dir / "tokenizer.json", eos)
    if (model_dir / "tokenizer.model").exists():
        return SentencePieceTokenizer(model_dir / "tokenizer.model")
    if (model_dir / BYTE_MARKER).exists():
        kind = _json(model_dir / BYTE_MARKER)
        if not isinstance(kind, dict) or kind.get("type") != BYTES:
            raise CheckpointError(f'{model_dir / BYTE_MARKER}: expected {{"type": "bytes"}}, got {kind!r}')
        return ByteTokenizer()
    raise CheckpointError(
        f"{model_dir} has no tokenizer (tokenizer.json, tokenizer.model, or {BYTE_MARKER} for a byte-level "
        "model); copy the tokenizer files of the model it was trained from into it, or, if it was trained "
        f"on raw bytes, write {{\"type\": \"bytes\"}} to {model_dir / BYTE_MARKER}"
    )


def _json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise CheckpointError(f"{path}: not readable JSON ({err})") from None
