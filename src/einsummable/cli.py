"""The einsummable command: train, sample and plan Llama models from the shell.

Configuration is read here and nowhere else; everything below is plain arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from einsummable.cli_args import DEMO_MODEL, DEMO_TRAIN, build_parser, join_negative_values
from einsummable.cli_plan import cmd_calibrate, cmd_plan, cmd_simulate
from einsummable.errors import CheckpointError, EinsummableError
from einsummable.models import atomic
from einsummable.models.llama import INDEX_ROLES, weights
from einsummable.models.llama import tokenizer as tokenizers
from einsummable.models.llama.data import BUNDLED, corpus, load_data
from einsummable.models.llama.generate import Generator
from einsummable.models.llama.model import LlamaConfig, init_params
from einsummable.plan import report
from einsummable.plan.plan import Plan
from einsummable.progress import Progress
from einsummable.train import checkpoint
from einsummable.train.trainer import TrainConfig, Trainer


def run_training(trainer: Trainer, out: Path, save_every: int = 100, log_every: int = 0,
                 merge: Path | None = None) -> None:
    """Train up to ``cfg.steps``, saving every ``save_every`` steps and at the end; a loss line
    every ``log_every`` steps (0: the progress bar only) leaves a record in logs. ``merge``
    names a directory for the merged full weights at the end."""
    cfg, model = trainer.cfg, trainer.model
    tokens_per_step = cfg.batch * cfg.seq * cfg.accum
    params = trainer.params
    n_params = sum(w.size for w in params.values())
    n_train = sum(params[n].size for n in trainer.trainable)
    trained = f", {n_train:,} trained" if n_train < n_params else ""
    print(f"training a {model.num_hidden_layers}-layer Llama (d={model.hidden_size}, "
          f"{n_params:,} parameters{trained}), batch {cfg.batch} x seq {cfg.seq}, "
          f"steps {trainer.step}..{cfg.steps}")
    print("settings: " + ", ".join(f"{k}={v}" for k, v in asdict(cfg).items()))
    print(_summary(trainer.program.plan))
    start, first = time.perf_counter(), trainer.step
    with Progress(cfg.steps, "train", unit="step", initial=trainer.step) as bar:
        while trainer.step < cfg.steps:
            loss = trainer.train_step()
            rate = tokens_per_step * (trainer.step - first) / (time.perf_counter() - start)
            bar.update(1, loss=loss, tok_s=f"{rate:,.0f}")
            if log_every and trainer.step % log_every == 0:
                print(f"step {trainer.step}: loss {loss:.4f}, {rate:,.0f} tokens/s")
            if trainer.step % save_every == 0 or trainer.step == cfg.steps:
                trainer.save(out)
    plot = plot_losses(trainer.losses, out / "loss.png")
    what = "LoRA adapters (PEFT's layout)" if trainer.cfg.lora else "model"
    print(f"saved the {what}, optimizer state{f' and {plot.name}' if plot else ''} to {out}/")
    if merge is not None:
        save_merged(trainer, merge)


def save_merged(trainer: Trainer, merge: Path) -> None:
    trainer.save_merged(merge)
    print(f"saved the merged model (Hugging Face layout) to {merge}/")


def _summary(plan: Plan | None) -> str:
    if plan is None:
        return "reference engine: every node runs whole, in order, with numpy"
    return report.brief(plan, INDEX_ROLES)


def plot_losses(losses: list[float], path: Path) -> Path | None:
    """The loss curve as a PNG; matplotlib is an optional extra, so without it a one-line
    notice and no plot."""
    try:
        import matplotlib
    except ImportError:
        print("einsummable: no loss plot: matplotlib is not installed (pip install 'einsummable[demo]')",
              file=sys.stderr)
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(np.arange(1, len(losses) + 1), losses, lw=1, label="loss")
    if len(losses) >= 10:
        k = max(2, len(losses) // 20)
        smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
        ax.plot(np.arange(k, len(losses) + 1), smooth, lw=2, label=f"mean of {k}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/byte)")
    ax.set_title("training loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def sample_text(model_dir: Path, prompt: str, max_new_tokens: int, temperature: float, top_p: float,
                engine: str | None, workers: int | None, seed: int = 0) -> str:
    cfg, params = weights.load(model_dir)
    tok = tokenizers.load(model_dir)
    ids = tok.encode(prompt)
    gen = Generator(cfg, params, engine=engine, workers=workers)
    stop = [tok.eos_id] if tok.eos_id is not None else []
    new = gen.generate([ids], max_new_tokens, temperature=temperature, top_p=top_p,
                       stop_tokens=stop, seed=seed)
    return tok.decode(ids + new[0])


# ------------------------------------------------------------ commands


def cmd_demo(args: argparse.Namespace) -> None:
    out = Path(args.out)
    claim_out(out, None)
    train = TrainConfig(**(asdict(DEMO_TRAIN) | {"steps": args.steps}))
    trainer = Trainer(DEMO_MODEL, init_params(DEMO_MODEL, seed=0), train, corpus(),
                      engine=args.engine, workers=args.workers, data_source=BUNDLED,
                      tokenizer=tokenizers.BYTES)
    run_training(trainer, out)
    k = max(1, min(10, len(trainer.losses) // 2))  # averages of the first and last k steps, never overlapping
    first, last = np.mean(trainer.losses[:k]), np.mean(trainer.losses[-k:])
    print(f"loss fell from {first:.3f} to {last:.3f} nats/byte")
    for prompt in ("This License ", "You may "):
        text = sample_text(out, prompt, 120, 0.8, 0.9, args.engine, args.workers)
        print(f"\n--- sample ---\n{text}")


def cmd_train(args: argparse.Namespace) -> None:
    source = str(Path(args.data).resolve()) if args.data else None
    merge = Path(args.merge) if args.merge else None
    if args.resume:
        trainer = _resume(args, source)
        out = Path(args.out or args.resume)
        if merge is not None:
            check_merge(merge, {"the base model": trainer.base_model, "--out": out, "--resume": args.resume})
        if trainer.step >= trainer.cfg.steps:  # a finished run, resumed only to merge it
            save_merged(trainer, merge)
            return
        claim_out(out, Path(args.resume))
    else:
        out = Path(args.out or "einsummable-run")
        if merge is not None:
            check_merge(merge, {"the base model (--model)": args.model, "--out": out})
        claim_out(out, None, check_only=True)
        trainer = _new_run(args, source or BUNDLED)
        claim_out(out, None)
    run_training(trainer, out, args.save_every, args.log_every, merge)


def claim_out(out: Path, resumed: Path | None, check_only: bool = False) -> None:
    """Before step 1: ``out`` can be written, and a save there loses nothing. A checkpoint
    there that is not the run being resumed is moved aside to ``OUT.old-N``, with a line that
    says so; a directory of other files is refused."""
    try:
        target = atomic.writable(out)
    except CheckpointError as err:
        raise EinsummableError(f"--out {out}: {err}") from None
    if (resumed is not None and target == Path(os.path.realpath(resumed))) or not _holds_files(target):
        return
    if not (target / checkpoint.META).is_file():
        raise EinsummableError(f"--out {out} holds files that are not a checkpoint ({_some(target)}): a save "
                               "replaces the directory whole; name a new or empty directory")
    if check_only:
        return
    n = 1
    while target.with_name(f"{target.name}.old-{n}").exists():
        n += 1
    aside = target.with_name(f"{target.name}.old-{n}")
    os.replace(target, aside)
    print(f"einsummable: {out} held an earlier run; moved it to {aside}", file=sys.stderr)


def check_merge(merge: Path, others: dict[str, str | Path | None]) -> None:
    """``--merge`` writes a new directory: not the base, the checkpoint or anything inside or
    around them (merging into the base destroys it, into the checkpoint leaves a stale merge),
    and not a directory that holds files already."""
    try:
        target = atomic.writable(merge)
    except CheckpointError as err:
        raise EinsummableError(f"--merge {merge}: {err}") from None
    for what, other in others.items():
        where = Path(os.path.realpath(other)) if other is not None else None
        if where is not None and (target.is_relative_to(where) or where.is_relative_to(target)):
            raise EinsummableError(f"--merge {merge} overlaps {what} {other}: the merge replaces its "
                                   "directory whole; name a new directory for it")
    if _holds_files(target):
        raise EinsummableError(f"--merge {merge} holds files already ({_some(target)}): name a new or "
                               "empty directory for the merged model")


def _holds_files(directory: Path) -> bool:
    return directory.is_dir() and any(directory.iterdir())


def _some(directory: Path) -> str:
    names = sorted(p.name for p in directory.iterdir())
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _new_run(args: argparse.Namespace, source: str) -> Trainer:
    """A run from scratch (a byte-level model of the config's shape), or a fine-tune of --model."""
    spec = _read_json(Path(args.config)) if args.config else {}
    train = _train_config(spec.get("train", {}), args.steps, args.config, _overrides(args))
    options = {"engine": args.engine, "workers": args.workers, "data_source": source}
    lora_flags = [f"--lora-{n}" for n in ("alpha", "targets") if getattr(args, f"lora_{n}") is not None]
    if lora_flags and not train.lora_rank:
        raise EinsummableError(f"{' and '.join(lora_flags)} shape(s) LoRA adapters, but no --lora-rank asks "
                               "for them, so the whole model would be tuned: add --lora-rank N")
    if args.model:
        if "model" in spec:
            raise EinsummableError(f"--model {args.model} fine-tunes that model; {args.config} sets up a "
                                   "model of its own ('model'): pass one or the other")
        model, params = weights.load(args.model)
        data = load_data(source, tokenizers.load(args.model))
        return Trainer(model, params, train, data, tokenizer=args.model, base_model=args.model, **options)
    if train.lora_rank:
        raise EinsummableError("LoRA fine-tunes a pretrained model: pass it with --model DIR")
    model = _model_config(spec.get("model", {}), args.config)
    return Trainer(model, init_params(model, train.seed), train, load_data(source),
                   tokenizer=tokenizers.BYTES, **options)


# flags that set a training setting of a new run
_OVERRIDES = ("seed", "lr", "batch", "seq", "lora_rank", "lora_alpha", "lora_targets", "freeze")


def _overrides(args: argparse.Namespace) -> dict:
    return {name: getattr(args, name) for name in _OVERRIDES if getattr(args, name) is not None}


def _resume(args: argparse.Namespace, source: str | None) -> Trainer:
    """The checkpoint's run, continued up to --steps (default: the end it was saved with)."""
    if args.config or args.model:
        flag = "--config" if args.config else "--model"
        raise EinsummableError(f"{flag} sets up a new run; a resumed run keeps its checkpoint's settings "
                               "(--steps moves its end)")
    if _overrides(args):
        flags = ", ".join(f"--{name}" for name in _overrides(args))
        raise EinsummableError(f"{flags} set up a new run; a resumed run keeps its checkpoint's settings "
                               "(--steps moves its end)")
    data = load_data(source) if source else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer.resume(args.resume, data, data_source=source, steps=args.steps,
                                 engine=args.engine, workers=args.workers)
    for w in caught:
        print(f"einsummable: warning: {w.message}", file=sys.stderr)
    if trainer.step >= trainer.cfg.steps and not args.merge:
        raise EinsummableError(f"{args.resume} has finished its run of {trainer.cfg.steps} steps; "
                               f"--steps N trains on up to step N (N > {trainer.step})")
    return trainer


def _read_json(path: Path) -> dict:
    try:
        spec = json.loads(path.read_text())
    except OSError as err:
        raise EinsummableError(f"cannot read {path}: {err.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise EinsummableError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(spec, dict) or set(spec) - {"model", "train"}:
        raise EinsummableError(f'{path}: expected {{"model": {{...}}, "train": {{...}}}}')
    return spec


def _model_config(values: object, where: str | None) -> LlamaConfig:
    names = [f.name for f in fields(LlamaConfig)]
    if not isinstance(values, dict) or set(values) - set(names):
        unknown = sorted(set(values) - set(names)) if isinstance(values, dict) else values
        raise EinsummableError(f"{where}: model: unknown settings {unknown}; known: {names}")
    return LlamaConfig(**(asdict(DEMO_MODEL) | values))


def _train_config(values: object, steps: int | None, where: str | None = None,
                  flags: dict | None = None) -> TrainConfig:
    """The file's settings over the demo's, the command line's flags over both."""
    merged = (asdict(DEMO_TRAIN) | values) if isinstance(values, dict) else values
    if isinstance(merged, dict):
        merged |= flags or {}
        if steps is not None:
            merged["steps"] = steps
    return TrainConfig.from_dict(merged, f"{where or 'the command line'}: train")


def cmd_generate(args: argparse.Namespace) -> None:
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as err:  # the shell passed bytes that are not UTF-8 (surrogate-escaped)
        raise EinsummableError(f"--prompt is not UTF-8 text (the byte at character {err.start} is not); "
                               "give the prompt as UTF-8") from None
    print(sample_text(Path(args.model), args.prompt, args.max_new_tokens, args.temperature, args.top_p,
                      args.engine, args.workers, args.seed))


COMMANDS = {"demo": cmd_demo, "train": cmd_train, "generate": cmd_generate, "plan": cmd_plan,
            "calibrate": cmd_calibrate, "simulate": cmd_simulate}


def main(argv: list[str] | None = None) -> int:
    """Run a command; a user's error is one line on stderr and exit status 2 (``--debug``: the
    traceback too)."""
    try:  # a bad flag: argparse's usage and its one-line reason, exit status 2; --help: 0
        args = build_parser().parse_args(join_negative_values(sys.argv[1:] if argv is None else argv))
    except SystemExit as done:
        return int(done.code or 0)
    try:
        if getattr(args, "engine", None) == "simulate":
            raise EinsummableError(f"{args.command} --engine simulate: the simulate engine computes "
                                   "nothing, it only predicts a run; `einsummable plan` shows the "
                                   "prediction, and --engine local runs it")
        COMMANDS[args.command](args)
    except (EinsummableError, OSError) as err:
        if args.debug:
            raise
        print(f"einsummable: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("einsummable: interrupted", file=sys.stderr)
        return 130
    return 0


def _one_line(err: BaseException) -> str:
    """An OSError as "path: reason" (no errno, no traceback); our own errors as written."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    return str(err)


if __name__ == "__main__":
    sys.exit(main())
