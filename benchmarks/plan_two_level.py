"""Two-level EinDecomp against the experts' plans: the tables of issue 16.

1. Llama-7B training (forward, backward, AdamW), batch 8 x seq 2048, 256 GiB per
   machine, at 1, 4, 16 and 32 machines x 64 cores: every planner's predicted step
   time, bytes across machines, peak memory per machine and whether it fits, and
   EinDecomp's planning time.
2. The same model with 64 GiB per machine: the fewest machines at which each
   planner's plan fits.
3. Predicted against simulated: a smaller Llama is planned, lowered to its
   TaskGraph and replayed core by core by the simulator (engines/simulator/simulate.py); the
   planner's predicted step time (plan/predict/overlap.py: the plan replayed node by node,
   transfers overlapping compute, bytes across as the lowering moves them) is set
   beside the simulated makespan; the ratio is predicted / simulated.

    python benchmarks/plan_two_level.py [--tables 1 2 3] [--machines 1 4 16 32]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import replace

from einsummable.cli_plan import training_graph
from einsummable.engines.simulator import simulate
from einsummable.errors import PlanError
from einsummable.hardware.cluster import Cluster
from einsummable.lower.lowering import lower
from einsummable.models.llama import PRESETS
from einsummable.plan.planners import PLANNERS, make_plan

GiB = 2**30


def _row(name: str, s, extra: str = "") -> str:
    return (f"  {name:<15} {s.step_seconds:>11.3g} {s.bytes_across / 1e9:>13.1f} {s.peak / GiB:>9.1f} "
            f"{'yes' if s.fits else 'no':>5} {s.binding:>8}{extra}")


def table_fits(g, machines: list[int], cores: int, memory: float) -> None:
    print(f"\nLlama-7B training, batch 8 x seq 2048, {memory / GiB:.0f} GiB per machine, x {cores} cores")
    for m in machines:
        cluster = Cluster(machines=m, cores=cores, memory_per_machine=memory)
        print(f"{m} machine(s):\n  {'planner':<15} {'predicted s':>11} {'across (GB)':>13} {'peak GiB':>9} "
              f"{'fits':>5} {'binding':>8}")
        for name in PLANNERS:
            start = time.perf_counter()
            s = _plan(g, cluster, name)
            took = time.perf_counter() - start
            print(_row(name, s, f"   planned in {took:.1f} s" if name == "eindecomp" else ""), flush=True)


def _plan(g, cluster: Cluster, name: str):
    """The planner's plan; one that does not fit is shown all the same, with its needs.
    Only EinDecomp across machines changes its plan to fit memory; the others do not."""
    s = make_plan(g, cluster, name, compare=False, check_memory=False).summary
    if not s.fits and name == "eindecomp" and cluster.machines > 1:
        with contextlib.suppress(PlanError):  # nothing fits: keep the first plan and its needs
            s = make_plan(g, cluster, name, compare=False).summary
    return s


def table_smallest(g, counts: list[int], cores: int, memory: float) -> None:
    print(f"\nLlama-7B training with {memory / GiB:.0f} GiB per machine: the fewest machines (of {counts}, "
          f"x {cores} cores) at which each plan fits")
    for name in PLANNERS:
        found = "none"
        for m in counts:
            s = _plan(g, Cluster(machines=m, cores=cores, memory_per_machine=memory), name)
            if not s.fits:
                continue
            found = f"{m} (peak {s.peak / GiB:.1f} GiB, predicted {s.step_seconds:.3g} s)"
            break
        print(f"  {name:<15} {found}", flush=True)


def table_simulated(layers: int, hidden: int, batch: int, seq: int, shapes: list[tuple[int, int]]) -> None:
    cfg = replace(PRESETS["llama-7b"], num_hidden_layers=layers, hidden_size=hidden,
                  intermediate_size=hidden * 11 // 4, num_attention_heads=hidden // 128,
                  num_key_value_heads=hidden // 128, vocab_size=4096)
    g = training_graph(cfg, batch, seq).ir
    print(f"\nPredicted against simulated: Llama {layers} layers, hidden {hidden}, batch {batch} x seq "
          f"{seq}, training with AdamW ({len(g.nodes)} nodes)")
    print(f"  {'cluster':<8} {'planner':<15} {'tasks':>8} {'predicted s':>11} {'simulated s':>11} "
          f"{'ratio':>6}")
    for m, c in shapes:
        cluster = Cluster(machines=m, cores=c)
        for name in PLANNERS:
            plan = make_plan(g, cluster, name, compare=False, check_memory=False)
            tg = lower(plan)
            sim = simulate.run(tg, cluster)
            predicted = plan.summary.step_seconds
            print(f"  {m}x{c:<6} {name:<15} {len(tg.tasks):>8} {predicted:>11.3g} {sim.makespan:>11.3g} "
                  f"{predicted / sim.makespan:>6.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--machines", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--cores", type=int, default=64)
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32],
                    help="machine counts tried for table 2")
    args = ap.parse_args()
    if 1 in args.tables or 2 in args.tables:
        g = training_graph(PRESETS["llama-7b"], 8, 2048).ir
        print(f"llama-7b training graph: {len(g.nodes)} nodes")
    if 1 in args.tables:
        table_fits(g, args.machines, args.cores, 256 * GiB)
    if 2 in args.tables:
        table_smallest(g, args.counts, args.cores, 64 * GiB)
    if 3 in args.tables:
        table_simulated(layers=2, hidden=512, batch=4, seq=256, shapes=[(1, 4), (2, 4), (4, 4)])


if __name__ == "__main__":
    main()
