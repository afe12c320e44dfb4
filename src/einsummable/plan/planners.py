"""Planners by name, and ``make_plan``: choose partitions, place them, compare baselines.

    plan = make_plan(graph, Cluster.local(8))           # EinDecomp; baselines planned when printed
    plan = make_plan(graph, Cluster(machines=4, cores=8), "fsdp")
    print(plan)                                          # the report
    make_plan(graph, cluster, progress=lambda done, total, name: print(done, total, name))

One machine: the one-level search of eindecomp.py over its cores, placed by list
scheduling (placement.py). Several machines: the two-level search of twolevel.py,
laid out machine-major. Either way the plan must fit ``memory_per_machine``
(memory.py); when it does not, saved activations are recomputed in the backward
(remat.py) and the graph planned again, or PlanError says what the smallest plan
found needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from einsummable.errors import PlanError, PlanMemoryError
from einsummable.hardware.cluster import Cluster
from einsummable.ir import priority
from einsummable.ir.eager import eager
from einsummable.ir.graph import EinGraph, Formation
from einsummable.plan import baselines, eindecomp, offload, remat, twolevel
from einsummable.plan.cost import CostModel
from einsummable.plan.partition import Partition
from einsummable.plan.plan import Plan, build, check_plan
from einsummable.plan.predict import figures
from einsummable.plan.predict.memory import estimate, gib
from einsummable.plan.predict.summary import Summary
from einsummable.plan.space import Space, spaces

Counts = tuple[int, ...]
# progress(done, total, name): ``done`` of ``total`` planners are planned and ``name`` is
# planned next ("" when all are); planning a big cluster takes minutes
OnProgress = Callable[[int, int, str], None]
PLANNERS = ("eindecomp", *baselines.BASELINES)
SEEDS = ("data_parallel",)  # experts' layouts across machines, EinDecomp's other starts


def choose(
    name: str, g: EinGraph, sps: Sequence[Space], model: CostModel, live: Sequence[bool]
) -> list[Counts]:
    """Block counts per node from the named planner, on one level of ``model.p`` workers."""
    if name == "eindecomp":
        picks = eindecomp.solve(g, model, live)
        return [tuple(int(x) for x in model.cands[v][c]) for v, c in enumerate(picks)]
    if name in baselines.BASELINES:
        data = baselines.data_dims(g, sps)
        return baselines.level(name, g, sps, live, model.targets, data, [False] * len(sps), across=False)
    raise PlanError(f"unknown planner {name!r}; expected one of {list(PLANNERS)}")


def partitions(sps: Sequence[Space], counts: Sequence[Counts]) -> list[Partition]:
    return [Partition.uniform(sp.shape, c) for sp, c in zip(sps, counts, strict=True)]


def make_plan(g: EinGraph, cluster: Cluster, planner: str = "eindecomp", compare: bool = True,
              check_memory: bool = True, progress: OnProgress | None = None) -> Plan:
    """Plan with ``planner``; with ``compare``, the report also plans every other planner
    (lazily, when it is printed). ``check_memory``: raise PlanError when it does not fit.
    ``progress`` is called before each planner and once at the end, the baselines included."""
    if planner not in PLANNERS:
        raise PlanError(f"unknown planner {planner!r}; expected one of {list(PLANNERS)}")
    tick = progress or _quiet
    tick(0, len(PLANNERS) if compare else 1, planner)
    try:
        plan = _plan(g, cluster, planner, check_memory)
        plan = _eager_if_binding(plan, cluster, planner, check_memory)
    except PlanMemoryError as err:  # the activations may fit when recomputed in the backward
        plan = _recompute_or_offload(g, cluster, planner, err)
    if not compare:
        tick(1, 1, "")
        return plan
    return replace(plan, others=partial(_others, plan.graph, cluster, planner, tick))


def _eager_if_binding(plan: Plan, cluster: Cluster, planner: str, check_memory: bool) -> Plan:
    """Where memory binds (the program's order), the plan of the graph with its backward eager
    (ir/eager.py) when that holds less; else ``plan``."""
    loss = remat.loss_of(plan.graph)
    if plan.order != priority.PROGRAM or loss is None:
        return plan
    graph = eager(plan.graph, loss)
    if graph is plan.graph:
        return plan
    try:  # not always smaller: a gradient that is an output is held from its making to the end
        other = _plan(graph, cluster, planner, check_memory)
    except PlanMemoryError:
        return plan
    return other if other.summary.peak < plan.summary.peak else plan


def _recompute_or_offload(g: EinGraph, cluster: Cluster, planner: str, err: PlanMemoryError) -> Plan:
    """Remat first (plan/remat.py); when even that does not fit, part of the step's state kept in
    host storage, with remat where it helps (plan/offload.py)."""
    def fitted(graph: EinGraph) -> Plan:
        return _plan(graph, cluster, planner, True)

    try:
        plan, how = remat.replan(g, cluster, err, fitted)
        return replace(plan, remat=how)
    except PlanMemoryError as smallest:
        loss = remat.loss_of(g)
        sets = remat.keep_sets(g, loss) if loss is not None else []

        def stored(graph: EinGraph) -> Plan:
            """The stored graph as written, then eager (ir/eager.py: not always smaller), then
            rematerialised, each way: the first that fits."""
            tries = [graph]
            if loss is not None:
                again = remat.rematerialize(graph, loss, sets[0]) if sets else None
                tries += [eager(graph, loss)] + ([again, eager(again, remat.loss_of(again))] if again else [])
            for candidate in tries[:-1]:
                try:
                    return fitted(candidate)
                except PlanMemoryError:
                    continue
            return fitted(tries[-1])

        plan, how = offload.replan(g, cluster, smallest, stored)
        summary = replace(plan.summary, storage_seconds=how.seconds)
        return replace(plan, offload=how, summary=summary)


def _quiet(done: int, total: int, name: str) -> None:
    """No progress to show."""


def _others(g: EinGraph, cluster: Cluster, planner: str, tick: OnProgress) -> tuple[tuple[str, Summary], ...]:
    names = [name for name in PLANNERS if name != planner]
    out = []
    for i, name in enumerate(names):
        tick(1 + i, len(PLANNERS), name)
        out.append((name, _plan(g, cluster, name, False).summary))
    tick(len(PLANNERS), len(PLANNERS), "")
    return tuple(out)


def _plan(g: EinGraph, cluster: Cluster, planner: str, check_memory: bool) -> Plan:
    sps, live = spaces(g), g.live()
    if cluster.machines > 1:
        return _two_level(g, sps, live, cluster, planner, check_memory)
    model = CostModel(g, sps, cluster.workers, cluster, live)
    counts = choose(planner, g, sps, model, live)
    plan = build(g, cluster, partitions(sps, counts), planner, model.evaluate(counts, live), sps, live)
    memory = plan.summary.memory
    if check_memory and memory is not None and memory.peak > cluster.memory_per_machine:
        raise PlanMemoryError(f"the {planner} plan does not fit {gib(cluster.memory_per_machine)} GiB "
                              f"on one machine: it needs {memory.describe()}; add machines or memory", memory)
    return plan


def _two_level(g: EinGraph, sps: tuple[Space, ...], live: list[bool], cluster: Cluster, planner: str,
               check_memory: bool) -> Plan:
    outer = twolevel.outer_spaces(g, sps)
    model = CostModel(g, outer, cluster.machines, twolevel.machine_view(cluster), live, gather_once=True)
    if planner == "eindecomp":
        def score(cm: list[Counts]) -> float:
            nic_in, nic_out = figures.nic_bytes(g, model, cm, live, cluster.machines)
            return max(nic_in.max(), nic_out.max())

        seeds = [twolevel.expert_across(name, g, outer, live, cluster) for name in SEEDS]
        tl, memory = twolevel.solve(g, outer, model, cluster, live, score, seeds, check_memory)
    else:
        tl = twolevel.expert(planner, g, sps, outer, live, cluster)
        memory = estimate(g, outer, tl.cm, live, replicated=planner in baselines.REPLICATED,
                          budget=cluster.memory_per_machine)
        if check_memory and memory.peak > cluster.memory_per_machine:
            raise PlanMemoryError(f"the {planner} plan does not fit {gib(cluster.memory_per_machine)} "
                                  f"GiB per machine on {cluster}: it needs {memory.describe()}", memory)
    # the partial sums of the cores' blocks count too, now that they are chosen
    memory = estimate(g, outer, tl.cm, live, planner in baselines.REPLICATED, tl.cc, cluster.cores,
                      cluster.memory_per_machine)
    isps, isize = twolevel.inner(g, outer, tl.cm)
    inner_model = CostModel(g, isps, cluster.cores, cluster, live, node_bytes=isize)
    within = inner_model.evaluate(tl.cc, live) * cluster.machines
    summary = figures.summarise(g, sps, model, tl, cluster, live, memory, model.evaluate(tl.cm, live), within)
    parts = tuple(
        twolevel.nested(sp.shape, tl.cm[v], tl.cc[v]) if live[v] else Partition.whole(sp.shape)
        for v, sp in enumerate(sps))
    parts = formations_follow(g, sps, parts)
    check_plan(g, sps, parts, cluster, free_formations=True)
    rot = twolevel.rotations(g, tl, cluster.cores)

    def where(v: int, tl=tl, rot=rot) -> Sequence[int]:
        if not live[v]:
            return (0,) * parts[v].num_blocks
        return twolevel.locations(tl, v, cluster, rot[v])

    return Plan(g, cluster, planner, sps, parts, summary, where, free_formations=True, levels=tl)


def formations_follow(g: EinGraph, sps: Sequence[Space],
                      parts: tuple[Partition, ...]) -> tuple[Partition, ...]:
    """A formation of a finished value keeps its input's output partition."""
    out = list(parts)
    for v, node in enumerate(g.nodes):
        if isinstance(node, Formation) and not sps[node.inputs[0]].aggregated:
            u = node.inputs[0]
            out[v] = out[u].restrict(sps[u].out_dims)
    return tuple(out)
