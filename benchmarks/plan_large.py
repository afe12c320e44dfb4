"""Planning time for Llama-7B training (batch 8, seq 2048) on machines × 64 cores.

Times the three stages separately (cost model, EinDecomp search, placement) and,
with ``--compare``, the baseline planners that the plan report sets beside it.

    python benchmarks/plan_large.py [--machines 1 4 16 32] [--cores 64] [--compare]
"""

from __future__ import annotations

import argparse
import time

from einsummable.hardware.cluster import Cluster
from einsummable.models.llama import model as llama
from einsummable.models.llama.model import PRESETS
from einsummable.plan.cost import CostModel
from einsummable.plan.plan import build
from einsummable.plan.planners import PLANNERS, choose, partitions
from einsummable.plan.space import spaces
from einsummable.train.grads import output_gradients


def llama_train(model: str = "llama-7b", batch: int = 8, seq: int = 2048):
    g, p, loss = llama.loss_graph(PRESETS[model], batch, seq)
    output_gradients(g, loss, p)
    g.output("loss", loss)
    return g.ir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--machines", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--cores", type=int, default=64)
    ap.add_argument("--compare", action="store_true", help="also place every baseline")
    args = ap.parse_args()
    g = llama_train(args.model)
    sps, live = spaces(g), g.live()
    print(f"{args.model} train: {len(g.nodes)} nodes")
    print(f"{'cluster':>8} {'model s':>8} {'search s':>9} {'place s':>8} {'baselines s':>11} "
          f"{'blocks':>8} {'GB moved':>9}")
    for m in args.machines:
        cluster = Cluster(machines=m, cores=args.cores)
        t0 = time.perf_counter()
        model = CostModel(g, sps, cluster.workers, cluster, live)
        t1 = time.perf_counter()
        counts = choose("eindecomp", g, sps, model, live)
        t2 = time.perf_counter()
        plan = build(g, cluster, partitions(sps, counts), "eindecomp")
        t3 = time.perf_counter()
        if args.compare:
            for name in PLANNERS[1:]:
                build(g, cluster, partitions(sps, choose(name, g, sps, model, live)), name)
        t4 = time.perf_counter()
        blocks = sum(p.num_blocks for p in plan.parts)
        others = f"{t4 - t3:11.1f}" if args.compare else f"{'-':>11}"
        print(f"{m:>3}x{args.cores:<4} {t1 - t0:8.1f} {t2 - t1:9.1f} {t3 - t2:8.1f} {others} "
              f"{blocks:8d} {plan.summary.bytes_moved / 1e9:9.1f}", flush=True)


if __name__ == "__main__":
    main()
