"""Planning time against graph size and worker count.

The graph is a deep MLP trained by hand (forward, squared error, backward with
einsums), about 13 nodes per layer. For each size and worker count it times the
EinDecomp search alone (cost model + tree DP) and the whole plan (search,
placement and traffic), and prints a table.

    python benchmarks/plan_time.py [--nodes 1000 3000 10000] [--workers 4 16 64 256]
"""

from __future__ import annotations

import argparse
import time

import einsummable as es
from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import EinGraph
from einsummable.plan import eindecomp
from einsummable.plan.cost import CostModel
from einsummable.plan.planners import make_plan
from einsummable.plan.space import spaces


def deep_mlp(layers: int, batch: int = 8192, width: int = 2048) -> EinGraph:
    g = es.Graph()
    h = g.input("x", (batch, width))
    target = g.input("y", (batch, width))
    ws, zs, acts = [], [], [h]
    for i in range(layers):
        w = g.input(f"w{i}", (width, width))
        z = es.einsum("bi,io->bo", acts[-1], w)
        ws.append(w)
        zs.append(z)
        acts.append(es.elementwise("relu(x0)", z))
    err = es.elementwise("x0 - x1", acts[-1], target)
    g.output("loss", es.einsum("bo->", err, join="x0 * x0", agg="add"))
    grad = es.elementwise("2.0 * x0", err)
    for i in reversed(range(layers)):
        dz = es.einsum("bo,bo->bo", grad, zs[i], join="where(x1 > 0, x0, 0)")
        g.output(f"dw{i}", es.einsum("bi,bo->io", acts[i], dz))
        if i:
            grad = es.einsum("bo,io->bi", dz, ws[i])
    return g.ir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1000, 3000, 10000])
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 16, 64, 256])
    args = ap.parse_args()
    per_layer = len(deep_mlp(2)) - len(deep_mlp(1))
    print(f"{'nodes':>7} {'workers':>7} {'search s':>9} {'plan s':>8} {'blocks':>8}")
    for target in args.nodes:
        g = deep_mlp(max(1, target // per_layer))
        sps, live = spaces(g), g.live()
        for p in args.workers:
            cluster = Cluster.local(p)
            t0 = time.perf_counter()
            model = CostModel(g, sps, p, cluster, live)
            eindecomp.solve(g, model, live)
            search = time.perf_counter() - t0
            t0 = time.perf_counter()
            plan = make_plan(g, cluster, compare=False)
            whole = time.perf_counter() - t0
            blocks = sum(part.num_blocks for part in plan.parts)
            print(f"{len(g):>7} {p:>7} {search:>9.2f} {whole:>8.2f} {blocks:>8}", flush=True)


if __name__ == "__main__":
    main()
