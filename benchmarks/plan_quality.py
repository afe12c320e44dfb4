"""Bytes moved by EinDecomp against the baseline planners and exhaustive search.

For every workload of the suite (einsummable/workloads.py) and worker count, prints the
cost-model bytes of each planner (the objective EinDecomp minimises), the exact
optimum over the same candidates where variable elimination can afford it, and
the bytes the placed plan actually moves (what its TaskGraph moves).

    python benchmarks/plan_quality.py [--workers 4 16 64 256] [--placed]
"""

from __future__ import annotations

import argparse

from einsummable.errors import PlanError
from einsummable.hardware.cluster import Cluster
from einsummable.plan import exhaustive
from einsummable.plan.cost import CostModel
from einsummable.plan.planners import PLANNERS, choose, make_plan
from einsummable.plan.space import spaces
from einsummable.workloads import SUITE


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 16, 64, 256])
    ap.add_argument("--placed", action="store_true", help="also place every plan and count its moves")
    args = ap.parse_args()
    names = [n for n in PLANNERS if n != "none"]
    cols = [*names, "exhaustive"] + ([f"{n} placed" for n in names] if args.placed else [])
    print(f"{'workload':16} {'p':>4} " + " ".join(f"{c:>16}" for c in cols) + "   (MB)")
    for name, make in SUITE.items():
        g = make()
        sps, live = spaces(g), g.live()
        for p in args.workers:
            model = CostModel(g, sps, p, Cluster.local(p), live)
            row = [model.evaluate(choose(n, g, sps, model, live), live) for n in names]
            try:
                row.append(exhaustive.optimum(g, model, live, limit=5_000_000))
            except PlanError:
                row.append(float("nan"))
            if args.placed:
                plan = make_plan(g, Cluster.local(p))
                placed = dict(plan.baselines) | {plan.planner: plan.summary}
                row += [placed[n].bytes_moved for n in names]
            print(f"{name:16} {p:>4} " + " ".join(f"{x / 1e6:>16.1f}" for x in row), flush=True)


if __name__ == "__main__":
    main()
