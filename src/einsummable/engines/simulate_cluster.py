"""The simulator at the cluster level: machines task by task, each machine's cores in aggregate.

Input: a ClusterGraph (lower/cluster.py), one task per machine-level block and
moves between machines. The replay is engines/simulate.py's, on the cluster seen
as machines of one worker each: moves hold the sender's NIC out-port and the
receiver's in-port (full duplex, one transfer at a time each way), blocks are
live on their machine from their task's start to their last reader's end.

Only a task's time on its machine differs, a per-machine compute model with the
cores' rates (as the planner's two-level cost charges them): a task its machine
cuts into ``n`` core blocks has block time ``k = (kernel + within) / n + task_overhead``
(kernel: simulate.py's rule for the whole machine block on one core; within: what
its core blocks spend adding partial sums and assembling repartitioned operands
inside the machine, which the core-level graph has as partial tasks: Megatron's
head-dim split of attention on one machine simulated 12 s without it, 190 s core by
core) and takes

    max(k, n · k / cores)

seconds on ``min(n, cores)`` of the machine's cores: one block when the blocks fit
the cores side by side, else the machine's cores share the work evenly. Tasks
without a node (partials, constants: the assembly of a machine block) spread over
all cores. A machine runs tasks side by side while their cores fit, the highest
ranked first, as the core-level engine fills idle cores from other ops (run one at
a time, every op of the ``none`` plan queued on one core: 769 s for two Llama-7B
layers on one machine, where the core-level graph replays in 357 s).

    sim = simulate_cluster.run(cluster_graph(plan))
    print(sim)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from einsummable.engines import simulate
from einsummable.engines.simulate import KERNEL_SECONDS, Simulation, apply_seconds
from einsummable.errors import SimulationError
from einsummable.hardware.cluster import Cluster
from einsummable.ir.einsummable import Einsummable
from einsummable.lower.cluster import ClusterGraph
from einsummable.lower.taskgraph import ApplyTask, MoveTask


@dataclass(frozen=True)
class ClusterSimulation:
    """A predicted step on machines × cores: the machine-level replay and the task counts."""

    sim: Simulation  # per machine: busy seconds, NIC links, peak memory
    cluster: Cluster
    machine_tasks: int
    core_blocks: int

    @property
    def makespan(self) -> float:
        return self.sim.makespan

    def nic_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """Bytes out of and into each machine's NIC."""
        out, into = np.zeros(self.cluster.machines), np.zeros(self.cluster.machines)
        for (s, d), n in self.sim.links.items():
            if s != d:
                out[s] += n
                into[d] += n
        return out, into

    def to_dict(self) -> dict:
        out, into = self.nic_bytes()
        use = self.sim.utilisation
        return {
            "cluster": {"machines": self.cluster.machines, "cores": self.cluster.cores},
            "step_seconds": self.makespan,
            "utilisation": {"mean": float(np.mean(use)), "min": float(np.min(use)), "max": float(np.max(use)),
                            "per_machine": [float(u) for u in use]},
            "nic_bytes_out": [int(b) for b in out],
            "nic_bytes_in": [int(b) for b in into],
            "bytes_across": self.sim.bytes_across,
            "peak_memory": list(self.sim.peak_memory),
            "memory_per_machine": self.cluster.memory_per_machine,
            "fits": self.sim.fits,
            "tasks": {"machine_level": self.machine_tasks, "core_level_blocks": self.core_blocks},
            "critical_path": {"tasks": len(self.sim.critical_path), "seconds": dict(self.sim.critical_time),
                              "waits": self.sim.critical_waits},
        }

    def __str__(self) -> str:
        out, into = self.nic_bytes()
        use = self.sim.utilisation
        gib = 2**30
        return "\n".join([
            f"simulated on {self.cluster}: predicted step {simulate._secs(self.makespan)}",
            f"  tasks: {self.machine_tasks:,} at the machine level (simulated one by one), "
            f"{self.core_blocks:,} blocks at the core level (counted, not built)",
            f"  utilisation (per machine, all cores): mean {np.mean(use):.0%}, min {np.min(use):.0%}, "
            f"max {np.max(use):.0%}",
            f"  NIC bytes: out max {out.max() / gib:.2f} GiB, in max {into.max() / gib:.2f} GiB, "
            f"total across {self.sim.bytes_across / gib:.2f} GiB",
            f"  peak memory per machine: max {max(self.sim.peak_memory) / gib:.1f} GiB, min "
            f"{min(self.sim.peak_memory) / gib:.1f} GiB of {self.cluster.memory_per_machine / gib:.0f} GiB "
            f"({'fits' if self.sim.fits else 'DOES NOT FIT'})",
            f"  critical path: {len(self.sim.critical_path)} tasks = "
            + " + ".join(f"{k} {simulate._secs(v)}" for k, v in self.sim.critical_time.items() if v > 0)
            + f"; {self.sim.critical_waits} waited for a busy machine or NIC",
        ])


def durations(cg: ClusterGraph) -> list[float]:
    """Seconds each machine-level task holds its cores (a move across: its NICs)."""
    return _timing(cg)[0]


def _timing(cg: ClusterGraph) -> tuple[list[float], list[int]]:
    """Seconds and cores each machine-level task holds (a move across: its NICs, no core)."""
    c = cg.cluster
    cores = c.cores
    cache: dict[Einsummable, float] = {}
    out = [0.0] * len(cg.tg.tasks)
    width = [1] * len(cg.tg.tasks)
    split = cg.split.tolist()
    within = cg.within.tolist() if cg.within is not None else [0.0] * len(split)
    for t, task in enumerate(cg.tg.tasks):
        if isinstance(task, MoveTask):
            out[t] = simulate._nbytes(task) / c.bandwidth_across
            continue
        if isinstance(task, ApplyTask):
            if task.op not in cache:
                cache[task.op] = apply_seconds(task.op, c)
            kernel = cache[task.op]
        else:
            rule = KERNEL_SECONDS.get(type(task))
            if rule is None:
                raise SimulationError(f"task %{t}: no time rule for {type(task).__name__}")
            kernel = rule(task, c)
        n = split[t] or cores
        k = (kernel + within[t]) / n + c.task_overhead
        width[t] = min(n, cores)
        out[t] = max(k, n * k / cores)
    return out, width


def run(cg: ClusterGraph) -> ClusterSimulation:
    """Replay the machine-level graph with the per-machine compute model."""
    machines = replace(cg.cluster, cores=1)
    seconds, width = _timing(cg)
    sim = simulate.run(cg.tg, machines, seconds, width, cg.cluster.cores)
    return ClusterSimulation(sim, cg.cluster, len(cg.tg.tasks), cg.core_blocks)
