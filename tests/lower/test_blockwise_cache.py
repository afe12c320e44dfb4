"""lower_blocks caches what a fetch, an einsum and a select do apart from task ids
(lower/geometry.py, lower/selects.py) and replays it for the next node of the same
geometry. Checked two ways: against lowering.py (the oracle) on graphs whose layers
repeat, so that the caches are hit; and against the same lowering with caches that
forget everything, array for array and table for table."""

import gc
from dataclasses import replace

import numpy as np
import pytest

import einsummable as es
from einsummable.cli_plan import training_graph
from einsummable.hardware.cluster import Cluster
from einsummable.lower import blockwise
from einsummable.lower.blockwise import lower_blocks
from einsummable.lower.cluster import machine_plan
from einsummable.lower.lowering import lower
from einsummable.models.llama.model import PRESETS
from einsummable.plan.partition import Partition
from einsummable.plan.plan import build
from einsummable.plan.planners import make_plan
from einsummable.plan.space import spaces

CFG = replace(PRESETS["demo"], hidden_size=256, intermediate_size=512, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=4)


class Forgetful(dict):
    """A cache that keeps nothing: every lookup misses."""

    def __setitem__(self, key, value) -> None:
        pass


def lowered(plan, monkeypatch, cached: bool):
    """(CompactGraph, the geometries worked out: all, those not of blocks in place) of
    lowering ``plan`` with or without the caches."""
    calls = []
    real_geometry, real_init = blockwise.geometry, blockwise._Lower.__init__

    def counted(*args):
        geo = real_geometry(*args)
        calls.append(geo.exact is None)
        return geo

    def forgetting(self, plan):
        real_init(self, plan)
        self.requests, self.geometries, self.einsums, self.selects = (Forgetful() for _ in range(4))

    with monkeypatch.context() as m:
        m.setattr(blockwise, "geometry", counted)
        if not cached:
            m.setattr(blockwise._Lower, "__init__", forgetting)
        cg = lower_blocks(plan)
    return cg, (len(calls), sum(calls))


def assert_same(a, b) -> None:
    for x, y in zip(a.arrays(), b.arrays(), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)
    assert (a.dtypes, a.shapes, a.aux_table, a.outputs) == (b.dtypes, b.shapes, b.aux_table, b.outputs)


def check(plan, monkeypatch) -> None:
    cg, (made, moved) = lowered(plan, monkeypatch, cached=True)
    plain, (every_time, moved_every_time) = lowered(plan, monkeypatch, cached=False)
    assert made < every_time and moved < moved_every_time  # cached geometries were replayed, moves too
    assert_same(cg, plain)
    want = lower(plan)
    got = cg.to_taskgraph()
    assert got.tasks == want.tasks and got.outputs == want.outputs


@pytest.mark.parametrize("machines, cores", [(2, 2), (4, 2), (3, 1)])
def test_repeated_llama_layers_lower_as_without_the_caches(machines, cores, monkeypatch):
    g = training_graph(CFG, 8, 128, "adamw").ir
    cluster = Cluster(machines=machines, cores=cores)
    plan = machine_plan(make_plan(g, cluster, compare=False, check_memory=False))
    check(plan, monkeypatch)


def test_repeated_half_precision_partial_sums_lower_as_without_the_caches(monkeypatch):
    """Contractions cut in 4 over 2 machines: two f32 partial sums per machine, summed where
    they live (a partial), moved, summed, rounded once; three layers of the same shapes."""
    g = es.Graph()
    x = g.input("x", (8, 16), dtype="f16")
    for k in range(3):
        x = x @ g.input(f"w{k}", (16, 16), dtype="f16")
    g.output("y", x)
    parts = [Partition.uniform(s, (1, 1, 4) if len(s) == 3 else (2,) + (1,) * (len(s) - 1))
             for s in (sp.shape for sp in spaces(g.ir))]
    check(build(g.ir, Cluster(machines=2, cores=1), parts), monkeypatch)


def test_lowering_leaves_the_garbage_collector_as_it_found_it():
    """lower_blocks turns the collector off while it runs (its keys and tuples have no
    cycles), and back to what it was."""
    g = es.Graph()
    g.output("y", g.input("x", (4, 4)) * 2.0)
    parts = [Partition.uniform(sp.shape, (2, 1)) for sp in spaces(g.ir)]
    plan = build(g.ir, Cluster(machines=2, cores=1), parts)
    assert gc.isenabled()
    lower_blocks(plan)
    assert gc.isenabled()
    gc.disable()
    try:
        lower_blocks(plan)
        assert not gc.isenabled()
    finally:
        gc.enable()
