"""The Ray engine: one long-lived actor per planned machine, pinned to its Ray node.

Inputs: a TaskGraph (or a ``Layout``), checked feeds and run-time variables, as for the local engine.
Outputs: arrays, or ``RayBlocks`` (blocks left inside the actors) for carried outputs.

Where things live:
- Machine m of the plan is the m-th live Ray node with CPUs (the driver's node
  first); its actor is created there with
  ``NodeAffinitySchedulingStrategy(node, soft=False)`` and ``num_cpus=0`` (the
  plan, not Ray, decides how many cores the machine's workers use). Every program
  of this driver reuses these actors; a program ships them its TaskGraph once, or on
  several machines each actor its share of the machine-level graph, which the actor
  lowers to its cores (layout.py, lower/refine.py): the driver never builds the
  core-level graph of the cluster.
- Inside an actor the local engine runs the machine's tasks: its step closures
  (``local.PREPARE``) on the shared dependency loop (``scheduler.run``), one thread
  per core of the plan (worker ``w`` is thread ``w % cores``) plus one that
  receives, with BLAS held as the local engine holds it (a machine of one core gets
  its node's Ray CPUs, ``Cluster.blas_threads``). Blocks live in the actor's
  memory; a move between two cores of a machine is a view, as in the local engine,
  so a machine keeps one copy of what its cores share.
- A move between machines: the producing actor slices its block and hands it to the
  consuming actor directly, as the argument of an actor call (``deliver``): Ray inlines
  a small block and passes a large one as an ObjectRef, which the consumer's node pulls
  before the call runs, so pulls overlap. The consumer's receive thread takes the block
  from the mailbox when it reaches the move. The driver is in neither the data path nor
  the control path of a move.
- Submission: one actor call per machine per run, all submitted at once; the driver
  only ships each machine the input blocks its workers read and fetches the
  requested outputs.

State: outputs carried by a Session come back as ``RayBlocks`` naming ``(machine,
key)`` per block; the next run reads them in place (or has the holder send the
piece to the machine that wants it). A carried run's blocks are committed only when
every machine succeeded, so a failed run leaves the previous state intact. Blocks are
dropped from the actors when their ``RayBlocks`` is garbage collected.

Faults (the behaviour chosen: fail fast, never recompute from lineage): when an
actor dies mid-run, the driver sees its call fail, aborts the other machines (their
waits on the dead one end at once) and raises ``EngineError`` naming the lost
machine, its workers, its node, and its unfinished tasks. No partial result is
returned. The next run restarts the actor on the same node, and a new program pings
the actors it would reuse and replaces any that died meanwhile. An actor found dead
when a run starts (it died between runs: it answers no ping sent with the run) ran
nothing, so it is restarted and the run made again, once. After ``ray.shutdown()`` a
program joins Ray again on its next run (the session joined since, else its
``address``) and starts its actors anew. Resident state held by a dead actor, or by a
Ray session since shut down, is reported lost (``EngineError`` naming the tensor) when a
session next reads it; it is never zeroed. Every wait has a deadline
(``RayProgram.timeout``), so a run never hangs.

    prog = es.compile(g, engine="ray", address="auto", cluster=es.Cluster.from_ray())
    prog.run({"x": X})
"""

from einsummable.engines.ray.program import RayBlocks, RayProgram
from einsummable.engines.ray_nodes import connect, live_nodes, nodes

__all__ = ["RayBlocks", "RayProgram", "connect", "live_nodes", "nodes"]
