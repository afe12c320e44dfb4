"""silu(x) * y on one 1024 x 1376 f32 block: the generated C kernel against the numpy path
(torch's form, x / (1 + e^-x)) and against the numpy sequence of the tanh form the language
used before (0.5 tanh(x / 2) + 0.5, times x), warm and cold (64 MB written between calls).

    PYTHONPATH=src python benchmarks/silu_forms.py [--repeats 21]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from common import machine
from einsummable.engines import local
from einsummable.engines.kernels import fast as kernels
from join_kernels import _as_block, numpy_path, op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    print(machine())
    local._keep_freed_memory()  # blocks come from the reused heap, as in the engines
    rng = np.random.default_rng(0)
    a, b = (_as_block(rng.standard_normal((1024, 1376)).astype(np.float32)) for _ in range(2))
    silu = op("ij,ij->ij", [a.shape, b.shape], "silu(x0) * x1")

    def tanh_form():
        out = np.empty_like(a)
        np.multiply(a, 0.5, out=out)
        np.tanh(out, out=out)
        np.multiply(out, 0.5, out=out)
        np.add(out, 0.5, out=out)
        np.multiply(out, a, out=out)
        return np.multiply(out, b, out=out)

    numpy_kernel, compiled = numpy_path(silu), kernels.prepare(silu)
    peers = {"compiled": lambda: compiled([a, b], None), "numpy path": lambda: numpy_kernel([a, b], None),
             "numpy, tanh form": tanh_form}
    junk = np.ones(16 << 20, np.float32)
    for cold in (False, True):
        times = {k: [] for k in peers}
        for _ in range(args.repeats):
            for name, fn in peers.items():
                if cold:
                    junk += 1
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(("cold" if cold else "warm") + f" (median of {args.repeats}): " + ", ".join(
            f"{k} {v * 1e3:.3f} ms ({v / med['compiled']:.2f}x compiled)" for k, v in med.items()))


if __name__ == "__main__":
    main()
