"""The ``einsummable`` command's flags: the parser, the argument types that refuse a bad value
with the flag's name before any work starts, and the demo's settings that are flags' defaults."""

from __future__ import annotations

import argparse
import math
import re

from einsummable.cli_plan import COMPARE_UP_TO
from einsummable.models.llama.model import PRESETS
from einsummable.train.trainer import TrainConfig

TITLE = "The einsummable command: train, sample and plan Llama models from the shell."
DEMO_MODEL = PRESETS["demo"]
DEMO_TRAIN = TrainConfig(batch=16, seq=64, steps=400, lr=3e-3, min_lr=3e-4, warmup=30)


def positive_int(text: str) -> int:
    """An integer >= 1 (steps, batch, cores, machines, tokens)."""
    return _number(text, int, lambda v: v >= 1, "an integer >= 1")


def count(text: str) -> int:
    """An integer >= 0 (a seed, an interval where 0 means never)."""
    return _number(text, int, lambda v: v >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """A finite number > 0 (a learning rate, an alpha)."""
    return _number(text, float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")


def temperature(text: str) -> float:
    return _number(text, float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0 (0: greedy)")


def probability(text: str) -> float:
    return _number(text, float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def _number(text: str, kind: type, ok, what: str) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
    return value


def lora_targets(text: str) -> tuple[str, ...]:
    """--lora-targets q,k,v,o (or q_proj,...) as module names."""
    return tuple(t if t.endswith("_proj") else f"{t}_proj" for t in text.replace(" ", "").split(","))


_NEGATIVE = re.compile(r"-\.?[0-9]")


def join_negative_values(argv: list[str]) -> list[str]:
    """``--memory -5GiB`` as ``--memory=-5GiB``: argparse takes a value that starts with a dash
    and is not a plain number for a flag, and says "expected one argument", which names no
    cause; joined, the flag's type says what is wrong with the value."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NEGATIVE.match(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


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

    p.add_argument("--workers", type=positive_int, default=None, metavar="N",
                   help="workers (default: all cores)")
    p.add_argument("--engine", default=None, choices=sorted(ENGINES), help=(
        f"the engine that runs the program (default: {DEFAULT_ENGINE}; reference runs every node whole "
        "with numpy; simulate only predicts a run, so it is for plan and the Python API)"))


def _cluster_flags(p: argparse.ArgumentParser, planners: object) -> None:
    """The cluster and the step that plan and simulate share."""
    p.add_argument("--cluster", metavar="FILE",
                   help="a cluster JSON file, as written by einsummable calibrate")
    p.add_argument("--machines", type=positive_int, default=None, help="default: the cluster file's, else 1")
    p.add_argument("--cores", type=positive_int, default=None, help="default: the cluster file's, else 64")
    p.add_argument("--memory", default=None, help=(
        "memory per machine with its unit, e.g. 256GiB or 64GB (default: the cluster file's; else, for "
        "one machine, this machine's memory, and for several, 256GiB each)"))
    p.add_argument("--optimizer", choices=["adamw", "none"], default="adamw",
                   help="train mode: include AdamW's update and moments, or stop at the gradients")
    p.add_argument("--batch", type=positive_int, default=8, help="sequences per step")
    p.add_argument("--seq", type=positive_int, default=2048, help="tokens per sequence")
    p.add_argument("--planner", default="eindecomp", choices=list(planners),
                   help="eindecomp, or an expert baseline to compare with")


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
    demo.add_argument("--steps", type=positive_int, default=DEMO_TRAIN.steps, metavar="N",
                      help="training steps")
    demo.add_argument("--out", default="einsummable-demo", metavar="DIR",
                      help="where the model, optimizer state and loss plot go")
    _engine_help(demo)

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
    train.add_argument("--steps", type=positive_int, default=None, metavar="N", help=(
        "the step to train up to (a total, not a count of more steps): a new run trains N steps; with "
        "--resume the run goes on from its checkpoint's step to step N, the cosine schedule stretched to "
        "end at N (default: the config's, or the checkpoint's)"))
    train.add_argument("--out", default=None, metavar="DIR", help=(
        "the checkpoint directory (default: einsummable-run; with --resume, the resumed one)"))
    for flag, kind, text in (("--seed", count, "the seed of the initial weights and the batches"),
                             ("--lr", positive_float, "the peak learning rate"),
                             ("--batch", positive_int, "sequences per step"),
                             ("--seq", positive_int, "tokens per sequence")):
        train.add_argument(flag, type=kind, default=None, metavar="X" if kind is positive_float else "N",
                           help=f"{text}, over the config's (default: the config's; refused with --resume)")
    train.add_argument("--lora-rank", type=positive_int, default=None, metavar="N", help=(
        "train LoRA adapters of rank N on the frozen weights of --model; checkpoints hold the adapters in "
        "PEFT's layout (adapter_config.json, adapter_model.safetensors)"))
    train.add_argument("--lora-alpha", type=positive_float, default=None, metavar="X",
                       help=f"the adapters add (X / N) B A (default: {TrainConfig.lora_alpha:g}; "
                            "needs --lora-rank)")
    train.add_argument("--lora-targets", type=lora_targets, default=None, metavar="LIST", help=(
        "the projections that get adapters, from q,k,v,o,gate,up,down (default: q,k,v,o; "
        "needs --lora-rank)"))
    train.add_argument("--freeze", action="append", default=None, metavar="PATTERN", help=(
        "do not train the parameters whose names match: a glob (model.layers.0.*) or re:REGEX; "
        "repeatable"))
    train.add_argument("--merge", metavar="DIR", help=(
        "at the end, also write the merged model (adapters folded into the weights) in the Hugging "
        "Face layout, for transformers and generate; with a finished --resume, only that"))
    train.add_argument("--save-every", type=positive_int, default=100, metavar="N",
                       help="save a checkpoint every N steps (and at the end)")
    train.add_argument("--log-every", type=count, default=0, metavar="N",
                       help="print a loss line every N steps (0: the progress bar only)")
    _engine_help(train)

    gen = command("generate", "sample from a saved model")
    gen.add_argument("--model", required=True, metavar="DIR",
                     help="a directory with config.json and model.safetensors (required)")
    gen.add_argument("--prompt", required=True, help="the text to continue (required)")
    gen.add_argument("--max-new-tokens", type=positive_int, default=100, metavar="N", help="tokens to sample")
    gen.add_argument("--temperature", type=temperature, default=0.8, help="softmax temperature; 0 is greedy")
    gen.add_argument("--top-p", type=probability, default=0.9,
                     help="nucleus sampling: the probability mass kept")
    gen.add_argument("--seed", type=count, default=0, help="the sampler's random seed")
    _engine_help(gen)

    plan = command("plan", "show the EinDecomp plan of a Llama for a cluster, without running it")
    plan.add_argument("--model", default="llama-7b", help=f"one of {sorted(PRESETS)}, or a config.json")
    _cluster_flags(plan, PLANNERS)
    plan.add_argument("--mode", choices=["train", "infer"], default="train",
                      help="a training step (forward, backward, optimizer) or a forward pass")
    plan.add_argument("--full", action="store_true", help="one line per node, not just the summary")
    plan.add_argument("--compare", choices=["auto", "yes", "no"], default="auto",
                      help=f"also plan every baseline (auto: up to {COMPARE_UP_TO} workers)")

    cal = command("calibrate", "measure this machine's rates and write a cluster JSON file")
    cal.add_argument("--machines", type=positive_int, default=1, help="machines like this one in the cluster")
    cal.add_argument("--cores", type=positive_int, default=None, help="cores per machine (default: all)")
    cal.add_argument("--out", default="cluster.json", metavar="FILE", help="the file to write")

    simul = command("simulate", "predict a Llama training step on a cluster, machine by machine")
    simul.add_argument("--model", default="llama-7b", help=f"one of {sorted(PRESETS)}, or a config.json")
    _cluster_flags(simul, PLANNERS)
    simul.add_argument("--json", metavar="FILE", help="also write the figures to this JSON file")
    simul.add_argument("--trace", metavar="FILE",
                       help="write the predicted timeline: Chrome trace JSON, or *.png (Gantt)")

    width = max(len(a.dest) for a in sub._choices_actions)
    commands = "\n".join(f"  {a.dest:<{width}}  {a.help}" for a in sub._choices_actions)
    parser.description = (f"{TITLE}\n\ncommands:\n{commands}\n\n"
                          "`einsummable COMMAND --help` shows a command's flags.")
    return parser


def _version() -> str:
    from einsummable import __version__

    return __version__
