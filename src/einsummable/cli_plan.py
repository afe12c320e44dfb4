"""``einsummable plan``, ``simulate`` and ``calibrate``: the commands about a cluster that
plan, predict and measure rather than run, beside the parser in cli.py."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

from einsummable.errors import ConfigError, EinsummableError
from einsummable.frontend.tensor import Graph
from einsummable.hardware.calibrate import physical_memory
from einsummable.hardware.cluster import Cluster
from einsummable.ir.fuse import fuse
from einsummable.ir.graph import EinGraph
from einsummable.models.llama import INDEX_ROLES, weights
from einsummable.models.llama import model as llama
from einsummable.models.llama.model import PRESETS, LlamaConfig
from einsummable.plan import report
from einsummable.plan.plan import Plan
from einsummable.plan.planners import PLANNERS, make_plan
from einsummable.progress import Progress
from einsummable.train.grads import output_gradients
from einsummable.train.optim import adamw

COMPARE_UP_TO = 512  # placing all four baselines for 2048 workers takes minutes


def cmd_plan(args: argparse.Namespace) -> None:
    cfg = _model(args.model)
    cluster, memory_from = plan_cluster(args)
    if args.mode == "train":
        g = training_graph(cfg, args.batch, args.seq, args.optimizer)
    else:
        g = inference_graph(cfg, args.batch, args.seq)
    n_params = sum(math.prod(s) for s in cfg.parameter_shapes().values())
    ir = fuse(g.ir)  # what compile plans
    print(f"{args.model}: {n_params / 1e6:,.1f}M parameters, {args.mode} at batch {args.batch} x "
          f"seq {args.seq}, {len(g.ir)} graph nodes ({len(ir)} fused)\n"
          f"on {cluster.machines} x {cluster.cores} workers, "
          f"{cluster.memory_per_machine / 2**30:.4g} GiB per machine ({memory_from})")
    compare = args.compare == "yes" or (args.compare == "auto" and cluster.workers <= COMPARE_UP_TO)
    start = time.perf_counter()
    plan = plan_with_progress(ir, cluster, args.planner, compare)
    print(f"planned in {time.perf_counter() - start:.1f} s"
          + (" (with the baselines)" if compare else
             " (baselines not planned: add --compare yes to see them side by side)"))
    print(plan if args.full else report.brief(plan, INDEX_ROLES))


def _model(name: str) -> LlamaConfig:
    """A preset, a Hugging Face config.json, or a model directory holding one."""
    if name in PRESETS:
        return PRESETS[name]
    path = Path(name)
    if path.is_dir():
        return weights.load_config(path)
    if not path.exists():
        raise EinsummableError(f"--model {name}: no such preset or file; name one of {sorted(PRESETS)}, "
                               "a config.json, or a model directory")
    try:
        config = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as err:
        raise ConfigError(f"--model {name}: cannot read it ({err.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ConfigError(f"--model {name}: not a JSON config ({err})") from None
    try:
        return LlamaConfig.from_hf(config)
    except ConfigError as err:
        raise ConfigError(f"--model {name}: {err}") from None


def plan_with_progress(g: EinGraph, cluster: Cluster, planner: str, compare: bool) -> Plan:
    """``make_plan`` with, on a terminal, a progress bar with an ETA, one step per planner
    (planning a big cluster takes minutes). The baselines are planned here, under the bar,
    rather than when the report is printed."""
    tty = sys.stderr.isatty()
    steps = len(PLANNERS) if compare else 1
    with Progress(steps, "planning", unit="planner") if tty else nullcontext() as bar:
        def tick(done: int, total: int, name: str) -> None:
            if bar is not None:
                bar.update(done - bar.done, now=name or "done")

        plan = make_plan(g, cluster, planner, compare=compare, progress=tick)
        if compare:
            _ = plan.baselines
    return plan


def training_graph(cfg: LlamaConfig, batch: int, seq: int, optimizer: str = "adamw") -> Graph:
    """One training step: forward, backward and (``adamw``) the optimizer's update, whose
    moments are inputs and outputs; ``none``: the gradients are the outputs."""
    g, p, loss = llama.loss_graph(cfg, batch, seq)
    if optimizer == "adamw":
        adamw(loss, list(p.values()), lr="lr", weight_decay=0.1)
        return g
    output_gradients(g, loss, p)
    g.output("loss", loss)
    return g


def inference_graph(cfg: LlamaConfig, batch: int, seq: int) -> Graph:
    """A causal forward pass: i64 ids in, logits out."""
    g = Graph()
    p = llama.parameters(g, cfg)
    ids = g.input("ids", (batch, seq), "i64")
    pos = g.ramp((batch, seq), steps=(0.0, 1.0))
    g.output("logits", llama.forward(cfg, p, ids, pos, llama.causal_mask(g, seq)))
    return g


UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str) -> float:
    """``256GiB``, ``64 GB``, ``1e9B``: a byte count. The unit is required: a bare 256 meant as
    GiB would otherwise plan for 256 bytes."""
    m = re.fullmatch(r"\s*(-?[0-9.eE+]+)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else None
    if m is None or unit not in UNITS:
        hint = f" (bytes? write {text.strip()}B)" if m is not None and not unit else ""
        raise EinsummableError(f"--memory {text!r}: expected a number and a unit such as 256GiB or "
                               f"64GB{hint}")
    try:
        value = float(m.group(1)) * UNITS[unit]
    except ValueError:
        raise EinsummableError(f"--memory {text!r}: {m.group(1)!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise EinsummableError(f"--memory {text!r}: memory must be a positive amount")
    return value


def plan_cluster(args: argparse.Namespace) -> tuple[Cluster, str]:
    """``--cluster`` (a file from ``einsummable calibrate``), with --machines, --cores and
    --memory overriding its figures when given; and where the memory figure comes from. With
    neither a file nor --memory, a plan for one machine is for this one, with its memory."""
    cluster = Cluster.from_json(args.cluster) if args.cluster else Cluster(machines=1, cores=64)
    changes: dict[str, float | int] = {}
    if args.machines is not None:
        changes["machines"] = args.machines
    if args.cores is not None:
        changes["cores"] = args.cores
    if args.memory is not None:
        changes["memory_per_machine"] = parse_bytes(args.memory)
        source = "--memory"
    elif args.cluster:
        source = f"from {args.cluster}"
    elif changes.get("machines", 1) == 1:
        changes["memory_per_machine"] = physical_memory()
        source = "this machine's memory; --memory sets another"
    else:
        source = "assumed; --memory sets it"
    return replace(cluster, **changes), source


def cmd_simulate(args: argparse.Namespace) -> None:
    """Plan a Llama step, lower it at the machine level and replay it task by task (issue 17)."""
    from einsummable.engines import trace as timeline
    from einsummable.engines.simulator import cluster as simulate_cluster
    from einsummable.errors import PlanError
    from einsummable.lower.cluster import cluster_graph

    cfg, (cluster, memory_from) = _model(args.model), plan_cluster(args)
    g = fuse(training_graph(cfg, args.batch, args.seq, args.optimizer).ir)  # what compile plans
    print(f"{args.model} training step, batch {args.batch} x seq {args.seq}: {len(g)} graph nodes "
          f"(fused), on {cluster} (memory: {memory_from})")
    start = time.perf_counter()
    try:
        plan = make_plan(g, cluster, args.planner, compare=False)
    except PlanError as err:
        print(f"einsummable: warning: {err}; simulating the plan that ignores memory", file=sys.stderr)
        plan = make_plan(g, cluster, args.planner, compare=False, check_memory=False)
    planned = time.perf_counter()
    cg = cluster_graph(plan)
    lowered = time.perf_counter()
    sim = simulate_cluster.run(cg)
    done = time.perf_counter()
    print(sim)
    print(f"  planner's prediction: {plan.summary.step_seconds:.3f} s; took: plan {planned - start:.1f} s, "
          f"lower {lowered - planned:.1f} s, simulate {done - lowered:.1f} s")
    if args.json:
        info = sim.to_dict() | {"model": args.model, "batch": args.batch, "seq": args.seq,
                                "planner_step_seconds": plan.summary.step_seconds,
                                "seconds": {"plan": planned - start, "lower": lowered - planned,
                                            "simulate": done - lowered},
                                "peak_rss_bytes": _peak_rss()}
        Path(args.json).write_text(json.dumps(info, indent=1) + "\n")
    if args.trace:
        events, lanes = simulate_cluster.events(cg, sim.sim.timeline)  # a machine's cores as one lane
        timeline.write(events, args.trace, lanes, f"predicted: {args.model} on {cluster}")


def _peak_rss() -> int:
    """This process's peak resident memory so far, in bytes (Linux reports KiB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def cmd_calibrate(args: argparse.Namespace) -> None:
    cluster = Cluster.measure(args.machines, args.cores)
    cluster.to_json(args.out)
    print(f"{cluster}: GEMM {cluster.flops_per_core / 1e9:.1f} GFLOP/s per core, elementwise "
          f"{cluster.elementwise_flops_per_core / 1e9:.2f} GFLOP/s (a join's further node "
          f"{cluster.elementwise_node_cost:.2f} of a pass), copy {cluster.copy_bandwidth / 1e9:.1f} GB/s, "
          f"per task {cluster.task_overhead * 1e6:.1f} us (a view {cluster.view_overhead * 1e6:.1f} us), "
          f"{cluster.memory_per_machine / 2**30:.0f} GiB per machine; wrote {args.out}")
