"""``Model``: a Llama with the surface Hugging Face users expect, over the pieces of this
package (the graph in model.py, checkpoints in weights.py, tokenizers in tokenizer.py,
generation in generate.py).

    model = Model.from_pretrained("path/to/llama")     # config.json + model.safetensors
    logits = model([[1, 306, 4658]])                   # numpy [batch, seq, vocab]
    text = model.generate("Once upon a time", max_new_tokens=20)
    model.save("tuned/")                               # loads back in transformers
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import einsummable.models.llama.model as llama
import einsummable.models.llama.tokenizer as tokenizers
import einsummable.models.llama.weights as weights
from einsummable.compile import Session, compile
from einsummable.errors import CheckpointError, ConfigError, FeedError, ShapeError
from einsummable.frontend.tensor import Graph
from einsummable.ir.dtypes import to_numpy
from einsummable.models.llama.config import LlamaConfig
from einsummable.models.llama.generate import Generator, check_sampling
from einsummable.models.llama.tokenizer import Tokenizer, TokenizerFiles


class Model:
    """A Llama's configuration, its weights (numpy, in this package's layout) and, when it
    came with one, its tokenizer; calling it gives logits, ``generate`` continues a prompt
    and ``save`` writes a Hugging Face checkpoint.

        model = Model("tiny", seed=0)                 # a preset name or a LlamaConfig, random weights
        model = Model.from_pretrained("llama-dir")    # a Hugging Face checkpoint directory
        logits = model(np.array([[1, 2, 3]]))         # [1, 3, vocab], float32

    ``engine`` and ``workers`` are ``es.compile``'s: how the programs behind the calls run.
    Programs are compiled once per input shape and reused; the weights stay on the workers.
    """

    def __init__(self, config: LlamaConfig | str, params: dict[str, np.ndarray] | None = None, *,
                 seed: int = 0, dtype: str = "f32", tokenizer: str | Path | None = None,
                 engine: str | None = None, workers: int | None = None) -> None:
        """``config``: a ``LlamaConfig`` or a preset name (``llama.PRESETS``: "tiny", "demo",
        "llama-7b", ...). ``params``: the weights by Hugging Face name in this package's layout
        (``weights.load``); without them, random weights from ``init_params(config, seed)``.
        The model owns its weights: it copies ``params`` (in ``dtype``), so that changing the
        caller's arrays later changes neither its logits nor what ``save`` writes, and its own
        ``model.params`` are read-only (the workers hold them once the first call ran); a
        checkpoint read by ``from_pretrained`` is fresh already and is not copied again.
        ``dtype``: "f32" or "bf16" for the weights. ``tokenizer``: the directory whose tokenizer
        files ``generate`` uses and ``save`` copies, or "bytes" for a byte-level model."""
        if isinstance(config, str):
            if config not in llama.PRESETS:
                raise ConfigError(f"unknown model preset {config!r}; expected one of {sorted(llama.PRESETS)} "
                                  "or a LlamaConfig (Model.from_pretrained(dir) reads a checkpoint)")
            config = llama.PRESETS[config]
        if not isinstance(config, LlamaConfig):
            raise ConfigError(f"config must be a LlamaConfig or a preset name, got {type(config).__name__}")
        if dtype not in ("f32", "bf16"):
            raise ConfigError(f"dtype {dtype!r}: a Llama's weights are 'f32' or 'bf16'")
        fresh = params is None or isinstance(params, _Fresh)  # arrays no one else holds: kept, not copied
        params = llama.init_params(config, seed) if params is None else params
        _check_params(config, params)
        self.config = config
        self.dtype = dtype
        self.params = {name: _own(w, dtype, fresh) for name, w in params.items()}
        if tokenizer is not None and tokenizer != tokenizers.BYTES and not Path(tokenizer).is_dir():
            raise CheckpointError(f"tokenizer {str(tokenizer)!r}: expected a model directory or 'bytes'")
        self.tokenizer_files = TokenizerFiles.read(tokenizer)  # read now: the source may change later
        self._tokenizer_source = tokenizer
        self._tokenizer: Tokenizer | None = None
        self._options = {"engine": engine, "workers": workers}
        self._sessions: dict[tuple[int, int], Session] = {}  # one a shape, sharing one resident state
        self._root: Session | None = None
        self._generator: Generator | None = None

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: str = "f32", engine: str | None = None,
                        workers: int | None = None) -> Model:
        """Load a Hugging Face Llama directory (``config.json`` and ``model.safetensors`` or a
        sharded index; its tokenizer files, if any, come along), as ``transformers``'
        ``LlamaForCausalLM.from_pretrained`` reads it.

            model = Model.from_pretrained("TinyLlama-1.1B", dtype="bf16")
        """
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"{path}: not a directory; from_pretrained reads a model directory "
                                  "with config.json and model.safetensors")
        cfg, params = weights.load(path, dtype)
        return cls(cfg, _Fresh(params), dtype=dtype, tokenizer=path, engine=engine, workers=workers)

    # ------------------------------------------------------------ logits

    def __call__(self, ids: object) -> np.ndarray:
        """Next-token logits, float32: ``ids`` [batch, seq] gives [batch, seq, vocab], and a
        single sequence [seq] gives [seq, vocab]. ``ids`` are token ids (a numpy integer array,
        nested lists, or any array), each in 0..vocab_size-1; attention is causal.

            model([[1, 2, 3], [4, 5, 6]]).shape     # (2, 3, vocab_size)
        """
        tokens = self._tokens(ids)
        batch, seq = tokens.shape
        if (batch, seq) not in self._sessions:  # the weights stay on the workers between calls
            prog = compile(self._graph(batch, seq), **self._options)
            self._sessions[batch, seq] = prog.session(self._root or self.params)
            self._root = self._root or self._sessions[batch, seq]
        logits = self._sessions[batch, seq].run({"ids": tokens}, fetch=["logits"])["logits"]
        return logits[0] if np.ndim(ids) == 1 else logits

    def _graph(self, batch: int, seq: int) -> Graph:
        g = Graph()
        p = llama.parameters(g, self.config, self.dtype)
        ids = g.input("ids", (batch, seq), "i64")
        pos = g.ramp((batch, seq), steps=(0.0, 1.0))
        g.output("logits", llama.forward(self.config, p, ids, pos, None).astype("f32"))  # causal
        for name, w in p.items():  # returned unchanged: a run leaves the weights on the workers
            g.output(name, w)
        return g

    def _tokens(self, ids: object) -> np.ndarray:
        """``ids`` as an int64 [batch, seq] array, or a FeedError that says what is wrong."""
        try:
            arr = np.asarray(ids)
        except (ValueError, TypeError) as err:  # ragged lists
            raise FeedError(f"token ids must be a rectangular [batch, seq] array: {err}") from None
        if arr.ndim not in (1, 2) or arr.size == 0:
            raise FeedError(f"token ids must be a non-empty [batch, seq] or [seq] array, "
                            f"got shape {arr.shape}")
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        if arr.dtype.kind not in "iu":
            raise FeedError(f"token ids must be integers, got dtype {arr.dtype}")
        vocab = self.config.vocab_size
        bad = arr[(arr < 0) | (arr >= vocab)]
        if bad.size:
            raise FeedError(f"token ids {bad[:5].tolist()} are outside the vocabulary 0..{vocab - 1}")
        return arr.astype(np.int64).reshape(-1 if arr.ndim == 2 else 1, arr.shape[-1])

    # ------------------------------------------------------------ generation

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer of the directory the model came from (loaded on first use); a
        CheckpointError when it came with none."""
        if self._tokenizer is None:
            if self._tokenizer_source is None:
                raise CheckpointError("this model has no tokenizer: pass token ids, or give Model(..., "
                                      "tokenizer=) a model directory, or 'bytes' for a byte-level model")
            bytes_level = self._tokenizer_source == tokenizers.BYTES
            self._tokenizer = (tokenizers.ByteTokenizer() if bytes_level
                               else tokenizers.load(self._tokenizer_source))
        return self._tokenizer

    def generate(self, prompt: str | Sequence[int] | Sequence[Sequence[int]] | np.ndarray,
                 max_new_tokens: int = 32, *, temperature: float = 0.0, top_p: float = 1.0,
                 stop_tokens: Sequence[int] | None = None, seed: int = 0) -> str | list:
        """Continue ``prompt`` by up to ``max_new_tokens`` tokens, with a KV cache.

        As in ``transformers``, the result includes the prompt: text in, text out (through
        the model's tokenizer); one list of ids in, one list out; a batch [batch, seq] of
        ids in (rows may differ in length as lists), one list per row out. Greedy at
        temperature 0, else sampled at ``temperature`` from the ``top_p`` nucleus with
        ``seed``. A row stops after a stop token (default: the tokenizer's or config's
        end-of-sequence id), which it keeps.

            model.generate("Once upon a time", max_new_tokens=20, temperature=0.8)
            model.generate([[1, 2, 3], [4, 5]], max_new_tokens=5)   # [[1, 2, 3, ...], [4, 5, ...]]
        """
        check_sampling(max_new_tokens, temperature, top_p, () if stop_tokens is None else stop_tokens, seed)
        text = isinstance(prompt, str)
        prompts, batched = self._prompts(prompt)
        if stop_tokens is None:
            stop_tokens = self._eos(text)
        if self._generator is None:
            self._generator = Generator(self.config, self.params, **self._options)
        new = self._generator.generate(prompts, max_new_tokens, temperature=temperature, top_p=top_p,
                                       stop_tokens=stop_tokens, seed=seed)
        rows = [p + n for p, n in zip(prompts, new, strict=True)]
        if text:
            return self.tokenizer.decode(rows[0])
        return rows if batched else rows[0]

    def _prompts(self, prompt: object) -> tuple[list[list[int]], bool]:
        """The prompts as lists of ids, and whether ``prompt`` was a batch of them."""
        if isinstance(prompt, str):
            return [self.tokenizer.encode(prompt)], False
        rank = _rank(prompt)
        if rank == 1:
            return [self._tokens(prompt).ravel().tolist()], False
        if rank == 2 and isinstance(prompt, np.ndarray):
            return [row.tolist() for row in self._tokens(prompt)], True
        if rank == 2:
            return [self._tokens(p).ravel().tolist() for p in prompt], True  # rows of any lengths
        try:
            shape = str(np.shape(prompt))
        except ValueError:  # unevenly nested lists
            shape = "that nests unevenly"
        raise ShapeError(f"prompt has shape {shape}; expected [seq] or [batch, seq] token ids (a batch's "
                         "rows may differ in length as lists), or text")

    def _eos(self, text: bool) -> list[int]:
        """The end-of-sequence ids: the tokenizer's when it is in use, else config.json's."""
        if text and self.tokenizer.eos_id is not None:
            return [self.tokenizer.eos_id]
        eos = self.tokenizer_files.config.get("eos_token_id")
        return [int(e) for e in (eos if isinstance(eos, list) else [eos])] if eos is not None else []

    # ------------------------------------------------------------ saving

    def save(self, path: str | Path) -> None:
        """Write a Hugging Face checkpoint: config.json, model.safetensors and the tokenizer
        files and special-token ids the model came with. ``transformers`` loads it back
        (``LlamaForCausalLM.from_pretrained(path)``), and so does ``Model.from_pretrained``.
        The directory is replaced whole, so a crash during the save leaves the old one."""
        weights.save(path, self.config, self.params, tokenizer=self.tokenizer_files)

    @property
    def num_parameters(self) -> int:
        """How many weights the model has."""
        return sum(math.prod(w.shape) for w in self.params.values())

    def __repr__(self) -> str:
        c = self.config
        return (f"Model({self.num_parameters / 1e6:,.1f}M parameters: {c.num_hidden_layers} layers, hidden "
                f"{c.hidden_size}, {c.num_attention_heads} heads ({c.num_key_value_heads} kv), vocab "
                f"{c.vocab_size}, {self.dtype})")


def _rank(x: object) -> int | None:
    """How deeply ``x`` nests: an array's ndim, a list one more than its items (a list of
    ids: 1), a number or text 0; None when its items nest to different depths."""
    if isinstance(x, np.ndarray):
        return x.ndim
    if isinstance(x, str) or not isinstance(x, Sequence):
        return 0
    ranks = {_rank(item) for item in x}
    if None in ranks or len(ranks) > 1:
        return None
    return 1 + (ranks.pop() if ranks else 0)


class _Fresh(dict):
    """Weights just read from a checkpoint, in the model's dtype: no caller holds them."""


def _own(w: object, dtype: str, fresh: bool) -> np.ndarray:
    """``w`` in ``dtype``, copied unless ``fresh`` (one copy when the dtype changes too), read-only."""
    owned = np.asarray(w).astype(to_numpy(dtype), copy=not fresh)
    owned.flags.writeable = False
    return owned


def _check_params(cfg: LlamaConfig, params: dict[str, np.ndarray]) -> None:
    """Every parameter of ``cfg``, in its shape, and nothing else."""
    shapes = cfg.parameter_shapes()
    if not isinstance(params, dict):
        raise CheckpointError(f"params must be a dict of name -> array, got {type(params).__name__}")
    missing, extra = sorted(set(shapes) - set(params)), sorted(set(params) - set(shapes))
    if missing or extra:
        raise CheckpointError(f"params do not match the config: missing {missing[:5]}, "
                              f"unexpected {extra[:5]}")
    for name, want in shapes.items():
        if np.shape(params[name]) != want:
            raise CheckpointError(f"parameter {name!r} has shape {np.shape(params[name])}; "
                                  f"the config says {want}")
