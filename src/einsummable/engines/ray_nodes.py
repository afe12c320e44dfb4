"""Which Ray nodes host the plan's machines: the one place the engine and ``es.Cluster.from_ray``
discover the cluster, so plan and engine agree on the machines. It lives beside the Ray engine's
package, not in it, so that ``Cluster.from_ray`` and ``calibrate.ray_link`` reach it without
running ``engines/ray/__init__.py`` (whose program imports lower, which imports hardware back)."""

from __future__ import annotations

import ray

from einsummable.errors import EngineError


def connect(address: str | None = None) -> None:
    """Join the Ray cluster at ``address``, or the one already joined, or start a local one."""
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, configure_logging=False)


def live_nodes(address: str | None = None) -> list[dict]:
    """The live Ray nodes with CPUs, the driver's node first (joining the cluster if not yet joined)."""
    connect(address)
    here = ray.get_runtime_context().get_node_id()
    alive = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) >= 1]
    alive.sort(key=lambda n: (n["NodeID"] != here, n["NodeID"]))
    return alive


def nodes(machines: int) -> list[dict]:
    """The Ray nodes that host the plan's machines."""
    alive = live_nodes()
    if len(alive) < machines:
        raise EngineError(f"the plan has {machines} machines but the Ray cluster has {len(alive)} live "
                          "node(s) with CPUs; plan with es.Cluster.from_ray()")
    return alive[:machines]
