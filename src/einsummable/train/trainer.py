"""Training a Llama: the data stream, the learning-rate schedule, steps and checkpoints.

A step is one compiled program (forward, backward, AdamW). With gradient
accumulation, a micro-step program adds its gradients into resident sums on the
workers (``grad:<name>``, in the session the update program shares), and an
update program applies them: its objective is <g, w>, whose gradient is exactly
the accumulated g, so clipping and AdamW are the optimizer's own. No gradient
goes through the driver. Batches are a
pure function of (seed, step), so a resumed run sees the same data it would have.

With ``lora_rank``, the base weights are frozen inputs and only LoRA adapters train
(``models/llama/lora.py``); ``freeze`` patterns freeze chosen parameters. A frozen
parameter gets no gradient node and no optimizer state: it stays resident, unchanged.

A checkpoint (``save``) replaces its directory whole, trainer.json last with a
manifest of the other files; ``resume`` checks the manifest, the optimizer's step
and the data before it trains on (see checkpoint.py and models/atomic.py).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np

from einsummable.autodiff.remat import rematerialize
from einsummable.compile import compile
from einsummable.engines.feeds import check_class_ids
from einsummable.errors import CheckpointError, EinsummableError
from einsummable.frontend.einsum import einsum
from einsummable.frontend.tensor import Graph
from einsummable.hardware.cluster import Cluster
from einsummable.ir.dtypes import to_numpy
from einsummable.models import atomic
from einsummable.models.llama import lora as adapters
from einsummable.models.llama import model as llama
from einsummable.models.llama import safetensors_io, weights
from einsummable.models.llama import tokenizer as tokenizers
from einsummable.models.llama.data import load_data
from einsummable.models.llama.model import LlamaConfig
from einsummable.models.llama.tokenizer import Tokenizer, TokenizerFiles
from einsummable.progress import Progress
from einsummable.train import checkpoint, optim
from einsummable.train.grads import ACCUMULATE, accumulate_gradients, grad_name
from einsummable.train.grads import PREFIX as GRAD_PREFIX
from einsummable.train.optim import STEP, TrainStep, adamw


@dataclass(frozen=True)
class TrainConfig:
    batch: int = 8
    seq: int = 64
    steps: int = 200
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 20
    weight_decay: float = 0.1
    decay_all: bool = False  # decay gains too; by default only tensors with 2 or more dimensions
    beta1: float = 0.9
    beta2: float = 0.95
    clip_norm: float | None = 1.0
    accum: int = 1
    seed: int = 0
    remat: bool = False  # recompute each layer's activations in the backward, from its input
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank on the frozen base weights
    lora_alpha: float = 8.0  # the adapters add (lora_alpha / lora_rank) B A, as PEFT's
    lora_targets: tuple[str, ...] = adapters.DEFAULT_TARGETS
    freeze: tuple[str, ...] = ()  # globs (or re:regex) of parameter names not to train

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.type == "tuple[str, ...]" and isinstance(getattr(self, f.name), list):  # as read from JSON
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))
            value = getattr(self, f.name)
            if not _SETTING[f.type](value) or (f.name in _AT_LEAST and value < _AT_LEAST[f.name]):
                least = f" >= {_AT_LEAST[f.name]}" if f.name in _AT_LEAST else ""
                raise EinsummableError(f"training setting {f.name!r} must be {f.type}{least}, got {value!r}")
        adapters.check_targets(self.lora_targets, "lora_targets")
        if self.lora_rank:
            adapters.LoraConfig(self.lora_rank, self.lora_alpha, self.lora_targets)  # checks alpha

    @property
    def lora(self) -> adapters.LoraConfig | None:
        """The adapters' settings, or None when the whole model trains."""
        if not self.lora_rank:
            return None
        return adapters.LoraConfig(self.lora_rank, self.lora_alpha, self.lora_targets)

    @classmethod
    def from_dict(cls, values: object, where: str,
                  error: type[EinsummableError] = EinsummableError) -> TrainConfig:
        """Settings read from a file; an error names ``where`` and the setting."""
        if not isinstance(values, dict):
            raise error(f"{where}: expected an object of training settings, got {values!r}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise error(f"{where}: unknown training setting {unknown[0]!r}; known: {names}")
        try:
            return cls(**values)
        except EinsummableError as err:
            raise error(f"{where}: {err}") from None


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


_SETTING = {"int": _is_int, "float": _is_real, "float | None": lambda x: x is None or _is_real(x),
            "bool": lambda x: isinstance(x, bool),
            "tuple[str, ...]": lambda x: isinstance(x, tuple) and all(isinstance(s, str) for s in x)}
_AT_LEAST = {"batch": 1, "seq": 1, "steps": 1, "accum": 1, "warmup": 0, "seed": 0, "lora_rank": 0,
             "lr": 0, "min_lr": 0, "weight_decay": 0, "beta1": 0, "beta2": 0}


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to ``min_lr`` at ``steps``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * frac))


def batch_at(data: np.ndarray, cfg: TrainConfig, step: int, micro: int = 0) -> np.ndarray:
    """Tokens [batch, seq + 1] at random offsets drawn from (seed, step, micro)."""
    if len(data) < cfg.seq + 2:
        raise CheckpointError(f"the data has {len(data)} tokens; need more than seq + 1 = {cfg.seq + 1}")
    rng = np.random.default_rng([cfg.seed, step, micro])
    starts = rng.integers(0, len(data) - cfg.seq - 1, cfg.batch)
    return np.stack([data[s : s + cfg.seq + 1] for s in starts]).astype(np.int64)


class Trainer:
    def __init__(self, model: LlamaConfig, params: dict[str, np.ndarray], cfg: TrainConfig,
                 data: np.ndarray, *, engine: str | None = None, workers: int | None = None,
                 cluster: Cluster | None = None, opt_state: dict[str, np.ndarray] | None = None,
                 step: int = 0,
                 data_source: str | None = None, tokenizer: str | Path | TokenizerFiles | None = None,
                 base_model: str | Path | None = None, base_record: dict | None = None) -> None:
        """``engine``, ``workers`` and ``cluster`` are compile's (a 2-machine Ray run:
        ``engine="ray", cluster=Cluster(machines=2, ...)``). ``data_source`` (a path, or
        ``BUNDLED``) is saved so that a resume can find the data.
        ``tokenizer`` (the model directory the weights came from, or ``"bytes"`` for a
        byte-level model) gives the tokenizer files and special-token ids every save writes.
        With ``cfg.lora_rank``, ``params`` are the base weights (adapters, if absent, start
        as PEFT's) and ``base_model`` is their directory, which the saved adapters name; its
        files' digests are taken now (``base_record``: already taken, by ``resume``), and every
        save records them, so that a resume notices a base replaced since."""
        check_class_ids("the training data", np.asarray(data), model.vocab_size, "token ids")
        self.model, self.cfg, self.data, self.step = model, cfg, data, step
        self.data_record = checkpoint.data_record(data, data_source)
        files = tokenizer if isinstance(tokenizer, TokenizerFiles) else TokenizerFiles.read(tokenizer)
        self.tokenizer = files  # read now: the source may be replaced later
        self.base_model = str(Path(base_model).resolve()) if base_model is not None else None
        if base_record is None and self.base_model is not None and cfg.lora is not None:
            base_record = checkpoint.base_record(self.base_model)
        self.base_record = base_record
        options = {"engine": engine, "workers": workers, "cluster": cluster}
        residuals: list = []
        dtypes = {str(np.asarray(w).dtype) for w in params.values()}
        if dtypes - {"float32", "bfloat16"} or len(dtypes) > 1:
            raise EinsummableError(f"the parameters must be all f32 or all bf16, got {sorted(dtypes)}")
        dtype = "bf16" if dtypes == {"bfloat16"} else "f32"  # bf16: AdamW keeps f32 masters and moments
        if cfg.lora is not None and not any(".lora_" in name for name in params):
            params = dict(params) | adapters.init(model, cfg.lora, cfg.seed, dtype)
        g, p, loss = llama.loss_graph(model, cfg.batch, cfg.seq, dtype, residuals=residuals, lora=cfg.lora)
        self.trainable = _trainable(p, params, cfg)
        train = {name: p[name] for name in self.trainable}
        for name in [n for n in p if n not in train]:  # frozen: returned unchanged, so that a run
            g.output(name, p[name])  # leaves them on the workers (Ray), not fed again each step
        if cfg.accum == 1:
            self.update = self._optimizer(train, loss)
            graph = self._remat(g, loss, residuals)
        else:
            accumulate_gradients(g, loss, train, cfg.accum)
            g.output("loss", loss)
            self.micro = compile(self._remat(g, loss, residuals), **options)
            fixed = {name: params[name] for name in p if name not in train}
            params = {name: params[name] for name in train}
            u = Graph()
            up = {name: u.input(name, w.shape, w.dtype) for name, w in train.items()}
            objective = None
            for name, w in up.items():
                letters = "abcdefgh"[: w.ndim]
                term = einsum(f"{letters},{letters}->", u.input(grad_name(name), w.shape, w.dtype), w)
                objective = term if objective is None else objective + term
            self.update = self._optimizer(up, objective)
            graph = u  # micro-batches run self.micro; the update runs on the summed gradients
        self.program = compile(graph, **options)
        if opt_state is not None:
            self._check_optimizer_state(opt_state)
        state = dict(params) | (opt_state if opt_state is not None else self.update.init_state(params))
        if cfg.accum > 1:  # the gradients' running sums, on the workers beside the weights
            state |= {grad_name(n): np.zeros(w.shape, w.dtype) for n, w in params.items()}
        self.session = self.program.session(state)  # weights and moments stay on the workers
        if cfg.accum > 1:
            self.micro_session = self.micro.session(self.session)  # reads and updates that same state
            self.micro_session.put(fixed)  # frozen weights: resident too, read by the micro-steps only
        self.names = tuple(p)  # every parameter, frozen or not, in the model's order
        self.losses: list[float] = []

    def _check_optimizer_state(self, opt_state: dict[str, np.ndarray]) -> None:
        for spec in self.update.state:
            have = opt_state.get(spec.name)
            if have is None:
                raise CheckpointError(f"optimizer tensor {spec.name!r} is missing from the checkpoint")
            if have.shape != spec.shape or have.dtype != to_numpy(spec.dtype):
                raise CheckpointError(
                    f"optimizer tensor {spec.name!r} is {have.dtype}{list(have.shape)}, "
                    f"expected {spec.dtype}{list(spec.shape)}"
                )

    def _remat(self, g: Graph, loss, residuals: list):
        return rematerialize(g.ir, loss, residuals) if self.cfg.remat else g

    def _optimizer(self, p: dict, objective) -> TrainStep:
        c = self.cfg
        return adamw(objective, list(p.values()), lr="lr", betas=(c.beta1, c.beta2),
                     weight_decay=c.weight_decay, clip_norm=c.clip_norm, decay_all=c.decay_all)

    @property
    def state(self) -> dict[str, np.ndarray]:
        """Parameters and optimizer state, gathered from the workers."""
        return {n: w for n, w in self.session.state().items() if not n.startswith(GRAD_PREFIX)}

    @property
    def params(self) -> dict[str, np.ndarray]:
        """Every parameter (frozen ones and adapters included), gathered from the workers."""
        state = self.state
        return {name: state[name] for name in self.names}

    def train_step(self) -> float:
        """One optimizer step; returns the mean loss over its micro-batches."""
        lr = lr_at(self.step, self.cfg)
        if self.cfg.accum == 1:
            tokens = batch_at(self.data, self.cfg, self.step)
            loss = float(self.session.run({"tokens": tokens, "lr": lr}, fetch=["loss"])["loss"])
        else:
            total = 0.0
            for m in range(self.cfg.accum):
                tokens = batch_at(self.data, self.cfg, self.step, m)
                feeds = {"tokens": tokens, ACCUMULATE: float(m > 0)}
                total += float(self.micro_session.run(feeds, fetch=["loss"])["loss"])
            self.session.run({"lr": lr}, fetch=[])
            loss = total / self.cfg.accum
        self.step += 1
        self.losses.append(loss)
        return loss

    def fit(self, until: int | None = None, *, callback: Callable[[Trainer, float], object] | None = None,
            progress: bool = False) -> list[float]:
        """Train up to step ``until`` (default: the config's ``steps``), calling
        ``callback(trainer, loss)`` after each step (a callback that returns ``False`` stops
        the run there); ``progress`` shows a bar with the loss and an ETA on stderr.
        Returns the losses of the steps it ran.

            trainer.fit(callback=lambda t, loss: t.step % 100 or t.save("run"), progress=True)
        """
        end = self.cfg.steps if until is None else until
        losses: list[float] = []
        with Progress(max(0, end - self.step), "train", unit="step") if progress else nullcontext() as bar:
            while self.step < end:
                losses.append(self.train_step())
                if bar is not None:
                    bar.update(1, loss=losses[-1])
                if callback is not None and callback(self, losses[-1]) is False:
                    break
        return losses

    # ------------------------------------------------------------ checkpoints

    def save(self, directory: str | Path) -> None:
        """Weights in the Hugging Face layout, optimizer state, and where the run stands.

        The directory is replaced whole: a crash leaves the previous checkpoint.
        A LoRA run writes its adapters in PEFT's layout instead of the weights; they name
        the base model's directory, which a resume reads again.
        """
        everything = self.state
        params = {name: everything[name] for name in self.names}
        with atomic.replacing(directory) as fresh:
            if self.cfg.lora is None:
                weights.write(fresh, self.model, params, tokenizer=self.tokenizer)
                names = checkpoint.FILES
            else:
                tensors = {name: w for name, w in params.items() if ".lora_" in name}
                adapters.save(fresh, self.model, self.cfg.lora, tensors, self.base_model)
                TokenizerFiles(self.tokenizer.files).write(fresh)  # no config.json to hold the ids
                names = checkpoint.ADAPTER_FILES
            state = {s.name: everything[s.name] for s in self.update.state}
            safetensors_io.save(state, fresh / "optimizer.safetensors")
            checkpoint.write(fresh, self.step, asdict(self.cfg), self.losses, self.data_record, names,
                             self.base_record)

    def save_merged(self, directory: str | Path) -> None:
        """The model as trained, adapters folded into their weights (``W + (alpha / r) B A``),
        in the Hugging Face layout with the tokenizer: what transformers and generate load."""
        params = self.params
        if self.cfg.lora is not None:
            params = adapters.merge(params, self.cfg.lora)
        weights.save(directory, self.model, params, tokenizer=self.tokenizer)

    @classmethod
    def resume(cls, directory: str | Path, data: np.ndarray | None = None, *, data_source: str | None = None,
               steps: int | None = None, **options) -> Trainer:
        """Continue a saved run, on ``data`` or, if None, on the data it was saved with.

        ``steps`` moves the end of the run (and of the cosine schedule) to that step.
        Different data than the checkpoint's gives a warning; data read back from
        the recorded file must be unchanged.
        """
        directory = Path(directory)
        meta = checkpoint.read(directory)
        where = directory / checkpoint.META
        cfg = TrainConfig.from_dict(meta["train"], f"{where}: train", CheckpointError)
        if steps is not None:
            if steps <= meta["step"]:
                raise CheckpointError(f"{directory} is at step {meta['step']}; cannot train up to {steps}")
            cfg = replace(cfg, steps=steps)
        data, data_source = _resume_data(where, meta["data"], data, data_source, _data_tokenizer(directory))
        opt_state = safetensors_io.load(directory / "optimizer.safetensors")
        bf16 = any(name.endswith(".master") for name in opt_state)  # a bf16 run keeps f32 masters
        dtype = "bf16" if bf16 else "f32"
        tokenizer: Path | TokenizerFiles = directory
        base = record = None
        if (directory / adapters.CONFIG).is_file():
            model, params, base, record = _load_adapters(directory, cfg, dtype, meta.get("base"))
            # the tokenizer files travel with the adapters; the special-token ids are the base's
            tokenizer = TokenizerFiles(TokenizerFiles.read(directory).files, TokenizerFiles.read(base).config)
        else:
            model, params = weights.load(directory, dtype)
        saved = opt_state.get(STEP)
        if saved is not None and saved.shape == () and float(saved) != meta["step"]:
            raise CheckpointError(f"{directory / 'optimizer.safetensors'} is at step {float(saved):g} but "
                                  f"{where} says {meta['step']}: the files come from different saves")
        trainer = cls(model, params, cfg, data, opt_state=opt_state, step=meta["step"],
                      data_source=data_source, tokenizer=tokenizer, base_model=base, base_record=record,
                      **options)
        trainer.losses = list(meta["losses"])
        return trainer


def _trainable(p: dict, params: dict[str, np.ndarray], cfg: TrainConfig) -> tuple[str, ...]:
    """The names the optimizer updates: the adapters with LoRA, else every parameter, less
    those ``cfg.freeze`` matches; ``params`` must be exactly the graph's parameters."""
    missing, unexpected = sorted(set(p) - set(params)), sorted(set(params) - set(p))
    if missing or unexpected:
        what = "the model and its LoRA adapters" if cfg.lora else "the model"
        raise EinsummableError(f"the parameters do not fit {what}: missing {missing[:3]}, "
                               f"unexpected {unexpected[:3]}")
    try:
        frozen = optim.frozen(list(p), cfg.freeze)
    except EinsummableError as err:
        raise EinsummableError(f"training setting 'freeze': {err}") from None
    trainable = tuple(n for n in p if (cfg.lora is None or ".lora_" in n) and n not in frozen)
    if not trainable:
        raise EinsummableError(f"the freeze patterns {list(cfg.freeze)} freeze every trainable parameter")
    return trainable


def _load_adapters(directory: Path, cfg: TrainConfig, dtype: str, recorded: dict | None
                   ) -> tuple[LlamaConfig, dict[str, np.ndarray], str, dict | None]:
    """A LoRA checkpoint's base weights (from the directory its adapter_config.json names), its
    adapters, and the base's record: checked against ``recorded`` (trainer.json's ``base``; a
    checkpoint saved before bases were recorded has none) before the weights are read."""
    adapter_cfg, base = adapters.read_config(directory)
    if adapter_cfg != cfg.lora:
        raise CheckpointError(f"{directory / adapters.CONFIG} says {adapter_cfg} but "
                              f"{directory / checkpoint.META} says {cfg.lora}: they are from different runs")
    if base is None or not Path(base).is_dir():
        raise CheckpointError(f"{directory / adapters.CONFIG}: base_model_name_or_path {base!r} is not the "
                              "directory of the base model the adapters were trained on")
    record = checkpoint.check_base(directory, recorded, base) if recorded is not None else None
    model, params = weights.load(base, dtype)
    return model, params | adapters.load(directory, model, adapter_cfg, dtype), base, record


def _data_tokenizer(directory: Path) -> Tokenizer | None:
    """What the run's data was tokenized with: the model's tokenizer, or None for bytes."""
    has = any((directory / name).is_file() for name in ("tokenizer.json", "tokenizer.model"))
    return tokenizers.load(directory) if has else None


def _resume_data(where: Path, recorded: dict, data: np.ndarray | None,
                 source: str | None, tokenizer: Tokenizer | None = None) -> tuple[np.ndarray, str | None]:
    """The data to resume on: the given array (with a warning if it differs), or the recorded file."""
    if data is not None:
        if checkpoint.data_digest(data) == recorded["sha256"]:
            return data, source or recorded["source"]
        warnings.warn(f"resuming on different data ({source or 'an array'}, {len(data)} tokens) than the "
                      f"checkpoint trained on ({recorded['source'] or 'an array'}, {recorded['tokens']} "
                      "tokens)", stacklevel=3)
        return data, source
    if recorded["source"] is None:
        raise CheckpointError(f"{where}: the run trained on an array given in Python, not a file; "
                              "pass the data to resume on")
    data = load_data(recorded["source"], tokenizer)
    if checkpoint.data_digest(data) != recorded["sha256"]:
        raise CheckpointError(
            f"the training data {recorded['source']} has changed since the checkpoint ({len(data)} tokens "
            f"now, {recorded['tokens']} then; the hashes differ); pass it explicitly (--data) to train on "
            "it as it is"
        )
    return data, recorded["source"]
