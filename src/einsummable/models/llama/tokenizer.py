"""Tokenizers: a built-in byte-level one, ``tokenizer.json`` and sentencepiece models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from einsummable.errors import EinsummableError


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
        self._tok = _Tokenizer.from_file(str(path))
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
        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        self.vocab_size = self._sp.get_piece_size()
        eos = self._sp.eos_id()
        self.eos_id = eos if eos >= 0 else None

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self._sp.decode(ids)


def load(model_dir: str | Path) -> Tokenizer:
    """The tokenizer a model directory ships, or the byte-level one when it ships none."""
    model_dir = Path(model_dir)
    eos = None
    config = model_dir / "config.json"
    if config.exists():
        eos_value = json.loads(config.read_text()).get("eos_token_id")
        eos = eos_value[0] if isinstance(eos_value, list) else eos_value
    if (model_dir / "tokenizer.json").exists():
        return HFTokenizer(model_dir / "tokenizer.json", eos)
    if (model_dir / "tokenizer.model").exists():
        return SentencePieceTokenizer(model_dir / "tokenizer.model")
    return ByteTokenizer()
