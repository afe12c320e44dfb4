"""The hardware model: machines × cores, a flop rate, and two levels of bandwidth.

``flops_per_core`` is the GEMM rate; the simulator (engines/simulator/simulate.py) also reads
an elementwise rate, a memory-copy rate, link latencies, the per-task overheads
(``task_overhead`` for a task that runs a kernel, ``view_overhead`` for an input or a view,
``gil_seconds`` of either holding the machine's one interpreter), the memory of a machine,
and what a driver in another process pays to feed and fetch (``driver_latency``,
``driver_bandwidth``: the Ray engine). ``Cluster.measure()`` fills the rates and overheads in
for this machine, ``calibrate.ray_driver()`` the driver's costs and ``calibrate.ray_link()``
Ray's between machines (with ``overhead_across``, its cost per block) (hardware/calibrate.py),
and ``to_json``/``from_json`` keep them in a file.

Workers are numbered machine-major: worker ``w`` is core ``w % cores`` of machine
``w // cores``. ``blas_threads`` is how many cores one worker's GEMMs use: the
engines give a worker that is alone in its process (one machine of one core) all
the cores that process may run on, and hold BLAS to one thread otherwise; it also
runs its tasks inline, without threads handing them off (``alone()``).

Every field is checked when a Cluster is made (PlanError naming it; ``from_json``: ConfigError
naming the file): counts are integers, at most ``MAX_MACHINES`` machines of ``MAX_CORES`` cores
and ``MAX_WORKERS`` in all; rates, sizes and times are finite numbers, > 0, or >= 0 for
latencies and overheads (``driver_bandwidth`` may be inf). The
defaults are rough figures for the 2-core development box
(about 80 GFLOP/s per core from the measured 4000³ chain, memcpy-speed moves
inside a machine, 10 Gbit/s between machines). ``Cluster.gpus()`` describes GPUs instead: each a
machine of one worker, with its device memory.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from einsummable.errors import ConfigError, PlanError

# A kernel task's dispatch when a lone worker runs inline, without threads (scheduler.run_in_order):
# measured here 5 us a tiny task, against 19-27 us a worker's task with 2 threads handing off.
INLINE_TASK_OVERHEAD = 5e-6
# The largest cluster this model describes: beyond it planning takes hours and a plan's
# per-worker arrays gigabytes, so a typo (machines=10**30) is refused instead of planned.
MAX_MACHINES = 65_536
MAX_CORES = 65_536  # per machine (the planner views a cluster as one machine of a core per machine)
MAX_WORKERS = 2**22  # machines x cores: the plan keeps arrays over every core (32 MiB each here)
_COUNTS = {"machines": MAX_MACHINES, "cores": MAX_CORES, "blas_threads": MAX_CORES}  # BLAS: a worker alone
# figures that may be 0 (a latency, an overhead, no minimum block); the others must be > 0
_MAY_BE_ZERO = {"min_block_seconds", "elementwise_node_cost", "latency_within", "latency_across",
                "overhead_across", "task_overhead", "view_overhead", "gil_seconds", "native_overhead",
                "driver_latency"}


@dataclass(frozen=True)
class Cluster:
    machines: int = 1
    cores: int = 1
    flops_per_core: float = 8e10
    bandwidth_within: float = 1e10
    bandwidth_across: float = 1.25e9
    min_block_seconds: float = 5e-4
    elementwise_flops_per_core: float = 1e9  # joins, reductions, partial sums: passes over their elements
    # a join's each node past its first, in passes: 1 where each is a numpy ufunc pass; a compiled
    # join runs all its nodes in one loop (Cluster.measure times it: about 0.3 here)
    elementwise_node_cost: float = 1.0
    copy_bandwidth: float = 5e9  # bytes/s one core copies (fills, assembling partials)
    latency_within: float = 1e-6  # seconds before a move inside a machine lands
    latency_across: float = 2e-5  # seconds before a move between machines lands
    # seconds a move between machines holds its NICs besides its bytes: a cost per block moved,
    # one after another (Ray: the put, call and pull of an object); a plain NIC's is in the bytes
    overhead_across: float = 0.0
    task_overhead: float = 1.5e-5  # an engine's scheduling cost per kernel task, on its core
    view_overhead: float = 2e-6  # that of a task that runs no kernel (an input, a view): dispatch alone
    # of a task's time on its core, the part that holds the interpreter: the workers of one process
    # (a machine: the local engine, a Ray actor) take it in turn, so a machine dispatches at most
    # one task per gil_seconds, however many cores it has (measure(): 22 us here)
    gil_seconds: float = 1e-5
    # a task's cost on its core inside a run of the native loop (lower/runs.py: one dispatch, above,
    # for the run, then its tasks one C call after another, none holding the interpreter; measure():
    # 0.05-0.1 us here). None: the engine has no such loop (Ray's actors, the GPU engine), so every
    # task pays task_overhead and holds the interpreter for gil_seconds
    native_overhead: float | None = 1e-7
    memory_per_machine: float = 256 * 2**30  # bytes
    # bytes/s a machine moves between its memory and its host storage, each way: an offloaded
    # input's load before its reader and its new value's store (plan/offload.py); measure()
    # times a 64 MiB block written, synced and read back (0.6 GB/s on this box's disk)
    storage_bandwidth: float = 2e9
    blas_threads: int = 1  # cores one worker's GEMMs use (BLAS threads)
    # A driver in another process (the Ray engine): seconds of a run's call to a machine and
    # back, and bytes/s it ships a feed to, or fetches an output from, a machine on its own
    # node (serialisation, object store). inf: the driver shares the workers' memory (local).
    driver_latency: float = 0.0
    driver_bandwidth: float = math.inf

    def __post_init__(self) -> None:
        """Type and range of every field, so a bad figure fails here, not in the planner or a run;
        numpy numbers become plain ones (``to_json`` writes them)."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _COUNTS:
                object.__setattr__(self, f.name, _count(f.name, value))
            elif f.name == "native_overhead" and value is None:
                continue  # no native loop
            else:
                object.__setattr__(self, f.name, _figure(f.name, value))
        if self.workers > MAX_WORKERS:
            raise PlanError(f"Cluster of {self.machines:,} machines x {self.cores:,} cores is "
                            f"{self.workers:,} workers; Einsummable plans for at most {MAX_WORKERS:,}")

    @staticmethod
    def measure(machines: int = 1, cores: int | None = None, blas_threads: int | None = None) -> Cluster:
        """This machine's rates, measured with numpy (takes a few seconds).

        ``blas_threads`` defaults to the engines' rule for a machine of ``cores`` cores: all
        the cores this process may use for a lone worker, else 1 (pass 1 for the local
        engine running several one-core machines in its one process).
        """
        from einsummable.hardware.calibrate import rates  # numpy timing loops, loaded only when asked

        available = _available_cores()
        cores = available if cores is None else cores
        Cluster(machines=machines, cores=cores)  # checks the counts before seconds of timing
        threads = blas_threads or (available if cores == 1 else 1)
        return Cluster(machines=machines, cores=cores, blas_threads=threads, **rates(cores))

    @staticmethod
    def gpus(count: int | None = None, *, measure: bool = False) -> Cluster:
        """GPUs as machines of one worker each, for ``engine="gpu"`` (machine m is ``cuda:m``):
        ``count`` of them (default: every GPU torch sees), each with its device memory.

        Unmeasured, the rates are an H100's (``calibrate.NOMINAL_GPU``); ``measure=True`` times
        GPU 0 with torch (a bf16 GEMM, an elementwise pass, a copy, a copy between GPUs
        where there are two, the engine's dispatch: seconds). Without CUDA the machines are
        torch's CPU device, with this machine's memory: the engine's test path.
        """
        from einsummable.hardware.calibrate import gpu_figures  # torch, loaded only when asked

        figures = gpu_figures(count, measure)
        return Cluster(machines=figures.pop("machines"), cores=1, **figures)

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @staticmethod
    def from_json(path: str | Path) -> Cluster:
        """A cluster file (``to_json``, ``einsummable calibrate``); ConfigError names the file and
        what is wrong with it, in one line."""
        where = f"cluster file {str(path)!r}"
        try:
            values = json.loads(Path(path).read_bytes().decode("utf-8"))
        except FileNotFoundError as err:
            raise ConfigError(f"{where}: no such file") from err
        except OSError as err:
            raise ConfigError(f"{where}: cannot be read ({err.strerror or err})") from err
        except UnicodeDecodeError as err:
            raise ConfigError(f"{where}: not UTF-8 text (byte {err.start})") from err
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where}: not valid JSON: {err}") from err
        if not isinstance(values, dict):
            kind = "null" if values is None else f"a {type(values).__name__}"
            raise ConfigError(f"{where}: must hold a JSON object of cluster fields, got {kind}")
        known = {f.name for f in fields(Cluster)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown cluster fields {unknown}; known: {sorted(known)}")
        try:
            return Cluster(**values)
        except PlanError as err:
            raise ConfigError(f"{where}: {err}") from err

    @classmethod
    def from_ray(cls, address: str | None = None, **hardware: float) -> Cluster:
        """The connected Ray cluster's shape: its live nodes with CPUs, and the fewest CPUs on one.

        Joins ``address`` (or starts a local Ray) when not yet connected; ``hardware``
        sets the rates (flops_per_core, bandwidths, ...) that Ray cannot know.
        """
        try:  # the Ray engine's own node discovery, so plan and engine agree on the machines
            from einsummable.engines.ray_nodes import live_nodes
        except ModuleNotFoundError as err:  # Ray is an optional extra: the planner itself never needs it
            raise PlanError("Cluster.from_ray needs Ray: pip install 'einsummable[ray]'") from err
        cpus = [int(n["Resources"]["CPU"]) for n in live_nodes(address)]
        if not cpus:
            raise PlanError("the Ray cluster has no live node with CPUs")
        # the actors run no native loop
        return cls(machines=len(cpus), cores=min(cpus), **({"native_overhead": None} | hardware))

    @staticmethod
    def local(workers: int) -> Cluster:
        """``workers=n``: one machine with n cores; one worker is this machine ``alone`` (its BLAS
        has all the cores this process may use: the local engine's rule, as ``measure`` says)."""
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise PlanError(f"workers must be a positive integer, got {workers!r}")
        if workers == 1:
            return Cluster(cores=_available_cores()).alone()
        return Cluster(machines=1, cores=workers)

    def alone(self) -> Cluster:
        """One worker alone in its process on one of these machines, as the engines run it: its
        BLAS gets the machine's cores and it runs its tasks inline, without threads handing off."""
        return replace(self, machines=1, cores=1, blas_threads=min(self.cores * self.blas_threads, MAX_CORES),
                       task_overhead=min(self.task_overhead, INLINE_TASK_OVERHEAD))

    @property
    def workers(self) -> int:
        return self.machines * self.cores

    def machine_of(self, worker: int) -> int:
        return worker // self.cores

    @property
    def bytes_per_flop(self) -> float:
        """F of the placement rule: a received byte costs this many flops of time."""
        return self.flops_per_core / self.bandwidth_within

    @property
    def min_block_flops(self) -> float:
        """Blocks smaller than this cost more in scheduling than they save."""
        return self.flops_per_core * self.min_block_seconds

    def seconds_to_move(self, nbytes: int, src: int, dst: int) -> float:
        if src == dst:
            return 0.0
        same = self.machine_of(src) == self.machine_of(dst)
        return nbytes / (self.bandwidth_within if same else self.bandwidth_across)

    def __str__(self) -> str:
        return f"{self.machines} machine(s) × {self.cores} core(s)"


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise PlanError(f"Cluster {name} must be a positive integer, got {value!r}")
    if value > _COUNTS[name]:
        raise PlanError(f"Cluster {name} must be at most {_COUNTS[name]:,} (the largest cluster "
                        f"Einsummable plans for), got {value:,}")
    return int(value)


def _figure(name: str, value: object) -> int | float:
    """A rate, size or time: a finite number, > 0 (>= 0 for those in _MAY_BE_ZERO);
    ``driver_bandwidth`` may be inf: the driver shares the workers' memory."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise PlanError(f"Cluster {name} must be a number, got {value!r}")
    if name in _MAY_BE_ZERO and not value >= 0:
        raise PlanError(f"Cluster {name} must be >= 0, got {float(value)!r}")
    if name not in _MAY_BE_ZERO and not value > 0:
        raise PlanError(f"Cluster {name} must be positive, got {float(value)!r}")
    if math.isinf(value) and name != "driver_bandwidth":
        raise PlanError(f"Cluster {name} must be finite, got {float(value)!r}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _available_cores() -> int:
    """The cores this process may run on (its affinity), as the local engine counts them."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
