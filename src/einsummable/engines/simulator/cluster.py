"""The simulator at the cluster level: machines task by task, each machine's cores in aggregate.

Input: a ClusterGraph (lower/cluster.py), one task per machine-level block and
moves between machines, as arrays (lower/compact.py). The replay is
engines/simulator/simulate.py's, event for event, over those arrays (replay.py), on the
cluster seen as machines of one worker each: moves hold the sender's NIC out-port and the
receiver's in-port (full duplex, one transfer at a time each way), blocks are
live on their machine from their task's start to their last reader's end.

Only a task's time on its machine differs, a per-machine compute model with the
cores' rates (as the planner's two-level cost charges them): a task its machine
cuts into ``n`` core blocks has block time ``k = (kernel + within) / n + overhead``
(kernel: simulate.py's rule for the whole machine block on one core; within: what
its core blocks spend adding partial sums and assembling repartitioned operands
inside the machine, which the core-level graph has as partial tasks: Megatron's
head-dim split of attention on one machine simulated 12 s without it, 190 s core by
core; overhead: ``task_overhead``, or ``view_overhead`` for a task that runs no
kernel, as simulate.py charges them) and takes

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

from einsummable.engines.simulator.replay import replay, secs
from einsummable.engines.simulator.simulate import KERNEL_SECONDS, Simulation, runs_no_kernel
from einsummable.engines.trace import Event
from einsummable.errors import SimulationError
from einsummable.hardware.cluster import Cluster
from einsummable.lower.cluster import ClusterGraph
from einsummable.lower.compact import KINDS, MOVE


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
            f"simulated on {self.cluster}: predicted step {secs(self.makespan)}",
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
            + " + ".join(f"{k} {secs(v)}" for k, v in self.sim.critical_time.items() if v > 0)
            + f"; {self.sim.critical_waits} waited for a busy machine or NIC",
        ])


def durations(cg: ClusterGraph) -> np.ndarray:
    """Seconds each machine-level task holds its cores (a move across: its NICs)."""
    return _timing(cg)[0]


def _timing(cg: ClusterGraph) -> tuple[np.ndarray, np.ndarray]:
    """Seconds and cores each machine-level task holds (a move across: its NICs, no core).

    simulate.py's rule per task, worked out once per distinct (kind, op or pieces,
    shape, dtype): a graph of a million tasks has a few thousand. A task's core
    blocks share the machine's cores; their partial sums and assemblies inside the
    machine (``cg.within``) come on top."""
    c, g = cg.cluster, cg.graph
    n = len(g)
    kernel = np.zeros(n)
    move = g.kind == MOVE
    key = np.stack([g.kind.astype(np.int64), g.aux, g.shape, g.dtype], axis=1)[~move]
    uniq, first, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
    rows = np.flatnonzero(~move)[first]
    per, dispatch = np.empty(len(uniq)), np.empty(len(uniq))
    for j, t in enumerate(rows.tolist()):
        task = g.task(t)
        rule = KERNEL_SECONDS.get(type(task))
        if rule is None:
            raise SimulationError(f"task %{t}: no time rule for {type(task).__name__}")
        per[j] = rule(task, c)
        dispatch[j] = c.view_overhead if runs_no_kernel(task) else c.task_overhead
    kernel[~move] = per[inv.ravel()]
    overhead = np.zeros(n)
    overhead[~move] = dispatch[inv.ravel()]
    if cg.within is not None:
        kernel += cg.within
    blocks = np.where(cg.split > 0, cg.split, c.cores).astype(float)
    k = kernel / blocks + overhead
    out = np.maximum(k, blocks * k / c.cores)
    out[move] = c.overhead_across + g.nbytes()[move] / c.bandwidth_across
    return out, np.minimum(blocks, c.cores).astype(np.int64)


def run(cg: ClusterGraph) -> ClusterSimulation:
    """Replay the machine-level graph with the per-machine compute model."""
    machines = replace(cg.cluster, cores=1)
    seconds, width = _timing(cg)
    sim = replay(cg.graph, machines, seconds, width, cg.cluster.cores)
    return ClusterSimulation(sim, cg.cluster, len(cg.graph), cg.core_blocks)


def events(cg: ClusterGraph, times: np.ndarray) -> tuple[list[Event], dict[tuple[int, int], str]]:
    """One timeline event per task (trace.task_events for arrays): a machine's tasks on
    its lane of cores, a move on its sender's NIC lane."""
    g = cg.graph
    move = g.kind == MOVE
    process = np.where(move, g.src, g.loc).tolist()
    thread = move.astype(np.int64).tolist()
    kinds = g.kind.tolist()
    starts, ends = times[:, 0].tolist(), times[:, 1].tolist()
    out = [Event(f"{KINDS[k]} %{t}", m, w, s, e)
           for t, (k, m, w, s, e) in enumerate(zip(kinds, process, thread, starts, ends, strict=True))]
    lanes = ({(m, 0): "cores" for m in set(g.loc[~move].tolist())}
             | {(m, 1): "NIC out" for m in set(g.src[move].tolist())})
    return out, lanes
