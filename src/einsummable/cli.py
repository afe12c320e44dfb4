"""The einsummable command: train, sample and plan Llama models from the shell.

Configuration is read here and nowhere else; everything below is plain arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from einsummable.cli_plan import COMPARE_UP_TO, cmd_calibrate, cmd_plan, cmd_simulate
from einsummable.errors import EinsummableError
from einsummable.models.llama import INDEX_ROLES, weights
from einsummable.models.llama import tokenizer as tokenizers
from einsummable.models.llama.data import BUNDLED, corpus, load_data
from einsummable.models.llama.generate import Generator
from einsummable.models.llama.model import PRESETS, LlamaConfig, init_params
from einsummable.plan import report
from einsummable.plan.plan import Plan
from einsummable.progress import Progress
from einsummable.train.trainer import TrainConfig, Trainer

DEMO_MODEL = PRESETS["demo"]
DEMO_TRAIN = TrainConfig(batch=16, seq=64, steps=400, lr=3e-3, min_lr=3e-4, warmup=30)


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
    with Progress(cfg.steps - trainer.step, "train", unit="step") as bar:
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
    if args.save_every < 1 or args.log_every < 0:
        raise EinsummableError(f"--save-every must be >= 1 and --log-every >= 0, got {args.save_every} "
                               f"and {args.log_every}")
    source = str(Path(args.data).resolve()) if args.data else None
    merge = Path(args.merge) if args.merge else None
    if args.resume:
        trainer = _resume(args, source)
        out = Path(args.out or args.resume)
        if trainer.step >= trainer.cfg.steps:  # a finished run, resumed only to merge it
            save_merged(trainer, merge)
            return
    else:
        trainer = _new_run(args, source or BUNDLED)
        out = Path(args.out or "einsummable-run")
    run_training(trainer, out, args.save_every, args.log_every, merge)


def _new_run(args: argparse.Namespace, source: str) -> Trainer:
    """A run from scratch (a byte-level model of the config's shape), or a fine-tune of --model."""
    spec = _read_json(Path(args.config)) if args.config else {}
    train = _train_config(spec.get("train", {}), args.steps, args.config, _overrides(args))
    options = {"engine": args.engine, "workers": args.workers, "data_source": source}
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


def _targets(text: str) -> tuple[str, ...]:
    """--lora-targets q,k,v,o (or q_proj,...) as module names."""
    return tuple(t if t.endswith("_proj") else f"{t}_proj" for t in text.replace(" ", "").split(","))


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
    print(sample_text(Path(args.model), args.prompt, args.max_new_tokens, args.temperature, args.top_p,
                      args.engine, args.workers, args.seed))


class _Help(argparse.RawDescriptionHelpFormatter):
    """Help that shows each flag's default (when it has one worth showing) and keeps the
    description's line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        hidden = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        shown = action.option_strings and not hidden
        if shown and "default" not in text:
            text += " (default: %(default)s)"
        return text


def _engine_help(p: argparse.ArgumentParser) -> None:
    from einsummable.compile import DEFAULT_ENGINE, ENGINES

    p.add_argument("--workers", type=int, default=None, metavar="N", help="workers (default: all cores)")
    p.add_argument("--engine", default=None, choices=sorted(ENGINES), help=(
        f"the engine that runs the program (default: {DEFAULT_ENGINE}; reference runs every node whole "
        "with numpy; simulate only predicts a run, so it is for plan and the Python API)"))


def build_parser() -> argparse.ArgumentParser:
    """The ``einsummable`` argument parser (every flag with help, its default and its choices)."""
    from einsummable.plan.planners import PLANNERS

    parser = argparse.ArgumentParser(prog="einsummable", formatter_class=_Help,
                                     usage="%(prog)s [-h] [--version] [--debug] COMMAND ...")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, show the full traceback rather than a one-line message")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text, formatter_class=_Help)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="on an error, show the full traceback rather than a one-line message")
        return p

    demo = command("demo", "train a small byte-level Llama on the bundled corpus, then sample")
    demo.add_argument("--steps", type=int, default=DEMO_TRAIN.steps, metavar="N", help="training steps")
    demo.add_argument("--out", default="einsummable-demo", metavar="DIR",
                      help="where the model, optimizer state and loss plot go")
    _engine_help(demo)
    demo.set_defaults(fn=cmd_demo)

    train = command("train", "train a Llama on a text file (byte-level), or fine-tune one (--model)")
    train.add_argument("--config", metavar="FILE",
                       help='JSON: {"model": {...LlamaConfig}, "train": {...TrainConfig}}')
    train.add_argument("--data", metavar="FILE", help=(
        "a text file (default: the bundled corpus; with --resume, the data the "
        "checkpoint trained on, which must be unchanged)"))
    train.add_argument("--model", metavar="DIR", help=(
        "fine-tune this Hugging Face Llama (config.json, weights and tokenizer), the data tokenized with "
        "its tokenizer, rather than train a new byte-level model"))
    train.add_argument("--resume", metavar="DIR", help="a checkpoint directory written by train or demo")
    train.add_argument("--steps", type=int, default=None, metavar="N", help=(
        "the step to train up to (a total, not a count of more steps): a new run trains N steps; with "
        "--resume the run goes on from its checkpoint's step to step N, the cosine schedule stretched to "
        "end at N (default: the config's, or the checkpoint's)"))
    train.add_argument("--out", default=None, metavar="DIR", help=(
        "the checkpoint directory (default: einsummable-run; with --resume, the resumed one)"))
    for flag, kind, text in (("--seed", int, "the seed of the initial weights and the batches"),
                             ("--lr", float, "the peak learning rate"),
                             ("--batch", int, "sequences per step"), ("--seq", int, "tokens per sequence")):
        train.add_argument(flag, type=kind, default=None, metavar="N" if kind is int else "X",
                           help=f"{text}, over the config's (default: the config's; refused with --resume)")
    train.add_argument("--lora-rank", type=int, default=None, metavar="N", help=(
        "train LoRA adapters of rank N on the frozen weights of --model; checkpoints hold the adapters in "
        "PEFT's layout (adapter_config.json, adapter_model.safetensors)"))
    train.add_argument("--lora-alpha", type=float, default=None, metavar="X",
                       help=f"the adapters add (X / N) B A (default: {TrainConfig.lora_alpha:g})")
    train.add_argument("--lora-targets", type=_targets, default=None, metavar="LIST", help=(
        "the projections that get adapters, from q,k,v,o,gate,up,down (default: q,k,v,o)"))
    train.add_argument("--freeze", action="append", default=None, metavar="PATTERN", help=(
        "do not train the parameters whose names match: a glob (model.layers.0.*) or re:REGEX; "
        "repeatable"))
    train.add_argument("--merge", metavar="DIR", help=(
        "at the end, also write the merged model (adapters folded into the weights) in the Hugging "
        "Face layout, for transformers and generate; with a finished --resume, only that"))
    train.add_argument("--save-every", type=int, default=100, metavar="N",
                       help="save a checkpoint every N steps (and at the end)")
    train.add_argument("--log-every", type=int, default=0, metavar="N",
                       help="print a loss line every N steps (0: the progress bar only)")
    _engine_help(train)
    train.set_defaults(fn=cmd_train)

    gen = command("generate", "sample from a saved model")
    gen.add_argument("--model", required=True, metavar="DIR",
                     help="a directory with config.json and model.safetensors (required)")
    gen.add_argument("--prompt", required=True, help="the text to continue (required)")
    gen.add_argument("--max-new-tokens", type=int, default=100, metavar="N", help="tokens to sample")
    gen.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 is greedy")
    gen.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling: the probability mass kept")
    gen.add_argument("--seed", type=int, default=0, help="the sampler's random seed")
    _engine_help(gen)
    gen.set_defaults(fn=cmd_generate)

    plan = command("plan", "show the EinDecomp plan of a Llama for a cluster, without running it")
    plan.add_argument("--model", default="llama-7b", help=f"one of {sorted(PRESETS)}, or a config.json")
    plan.add_argument("--cluster", metavar="FILE",
                      help="a cluster JSON file, as written by einsummable calibrate")
    plan.add_argument("--machines", type=int, default=None, help="default: the cluster file's, else 1")
    plan.add_argument("--cores", type=int, default=None, help="default: the cluster file's, else 64")
    plan.add_argument("--memory", default=None,
                      help="memory per machine, e.g. 256GiB (default: the cluster's)")
    plan.add_argument("--optimizer", choices=["adamw", "none"], default="adamw",
                      help="train mode: include AdamW's update and moments, or stop at the gradients")
    plan.add_argument("--batch", type=int, default=8, help="sequences per step")
    plan.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    plan.add_argument("--mode", choices=["train", "infer"], default="train",
                      help="a training step (forward, backward, optimizer) or a forward pass")
    plan.add_argument("--planner", default="eindecomp", choices=list(PLANNERS),
                      help="eindecomp, or an expert baseline to compare with")
    plan.add_argument("--full", action="store_true", help="one line per node, not just the summary")
    plan.add_argument("--compare", choices=["auto", "yes", "no"], default="auto",
                      help=f"also plan every baseline (auto: up to {COMPARE_UP_TO} workers)")
    plan.set_defaults(fn=cmd_plan)

    cal = command("calibrate", "measure this machine's rates and write a cluster JSON file")
    cal.add_argument("--machines", type=int, default=1, help="machines like this one in the cluster")
    cal.add_argument("--cores", type=int, default=None, help="cores per machine (default: all)")
    cal.add_argument("--out", default="cluster.json", metavar="FILE", help="the file to write")
    cal.set_defaults(fn=cmd_calibrate)

    simul = command("simulate", "predict a Llama training step on a cluster, machine by machine")
    simul.add_argument("--model", default="llama-7b", help=f"one of {sorted(PRESETS)}")
    simul.add_argument("--cluster", metavar="FILE",
                       help="a cluster JSON file, as written by einsummable calibrate")
    simul.add_argument("--machines", type=int, default=None, help="default: the cluster file's, else 1")
    simul.add_argument("--cores", type=int, default=None, help="default: the cluster file's, else 64")
    simul.add_argument("--memory", default=None,
                       help="memory per machine, e.g. 256GiB (default: the cluster's)")
    simul.add_argument("--optimizer", choices=["adamw", "none"], default="adamw",
                       help="include AdamW's update and moments, or stop at the gradients")
    simul.add_argument("--batch", type=int, default=8, help="sequences per step")
    simul.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    simul.add_argument("--planner", default="eindecomp", choices=list(PLANNERS),
                       help="eindecomp, or an expert baseline to compare with")
    simul.add_argument("--json", metavar="FILE", help="also write the figures to this JSON file")
    simul.add_argument("--trace", metavar="FILE",
                       help="write the predicted timeline: Chrome trace JSON, or *.png (Gantt)")
    simul.set_defaults(fn=cmd_simulate)

    width = max(len(a.dest) for a in sub._choices_actions)
    commands = "\n".join(f"  {a.dest:<{width}}  {a.help}" for a in sub._choices_actions)
    parser.description = (f"{__doc__.splitlines()[0]}\n\ncommands:\n{commands}\n\n"
                          "`einsummable COMMAND --help` shows a command's flags.")
    return parser


def _version() -> str:
    from einsummable import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    """Run a command; a user's error is one line on stderr and exit status 2 (``--debug``: the
    traceback too)."""
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "engine", None) == "simulate":
            raise EinsummableError(f"{args.command} --engine simulate: the simulate engine computes "
                                   "nothing, it only predicts a run; `einsummable plan` shows the "
                                   "prediction, and --engine local runs it")
        args.fn(args)
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
