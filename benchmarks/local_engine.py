"""The local engine against numpy, dask.array and PyTorch on the same workloads.

Run: python benchmarks/local_engine.py [--workers 2] [--size 4000]
Prints medians of several runs and the ratio einsummable / peer for each workload.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import einsummable as es
from common import compare, machine, report


def _dask(arrays, chunks, build):
    import dask.array as da

    ds = [da.from_array(a, chunks=chunks) for a in arrays]
    expr = build(*ds)
    return lambda: expr.compute(scheduler="threads", num_workers=os.cpu_count())


def _best_dask_chunks(arrays, build, sizes) -> int:
    """dask.array at its best: the chunk size with the lowest median, tried first."""
    times = compare({str(c): _dask(arrays, c, build) for c in sizes}, repeats=3)
    return int(min(times, key=times.get))


def _torch(arrays, build):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(os.cpu_count())
    ts = [torch.from_numpy(a) for a in arrays]
    return lambda: build(*ts)


def workload(name, shapes, build, workers, chunk_sizes):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    g = es.Graph()
    ts = [g.input(f"x{k}", s) for k, s in enumerate(shapes)]
    g.output("y", build(*ts))
    prog = es.compile(g, workers=workers)
    feeds = {f"x{k}": a for k, a in enumerate(arrays)}
    ours = prog.run(feeds)["y"]
    expected = build(*arrays)
    assert ours.dtype == np.float32 == expected.dtype
    np.testing.assert_allclose(ours, expected, rtol=2e-2, atol=1e-1 * np.abs(expected).max() / 1e2)
    chunk = _best_dask_chunks(arrays, build, chunk_sizes)
    peers = {"einsummable": lambda: prog.run(feeds), "numpy": lambda: build(*arrays),
             f"dask.array (chunks {chunk})": _dask(arrays, chunk, build)}
    torch_fn = _torch(arrays, build)
    if torch_fn is not None:
        peers["torch eager"] = torch_fn
    report(f"{name}  (engine {prog.engine}, workers {workers})", compare(peers))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--size", type=int, default=4000)
    args = parser.parse_args()
    print(machine())
    n = args.size
    workload("(a) matmul 4096^2", [(4096, 4096)] * 2, lambda a, b: a @ b, args.workers, [1024, 2048, 4096])
    workload(f"(b) chain A@B@C@D, {n}^2", [(n, n)] * 4, lambda a, b, c, d: a @ b @ c @ d,
             args.workers, [n // 4, n // 2, n])
    s = n
    shapes = [(s, s // 10), (s // 10, s), (s, s // 10), (s // 10, 10 * s), (10 * s, s)]
    workload(f"(c) skewed Y = C(DE) + AB, S={s}", shapes, lambda a, b, c, d, e: c @ (d @ e) + a @ b,
             args.workers, [s // 10, s // 2, s])


if __name__ == "__main__":
    main()
