"""``einsummable simulate``: its JSON against the core-level simulation of the same plan."""

import json
from dataclasses import replace

import pytest

from einsummable.cli import main
from einsummable.cli_plan import training_graph
from einsummable.engines.simulator import simulate
from einsummable.hardware.cluster import Cluster
from einsummable.ir.fuse import fuse
from einsummable.lower.lowering import lower
from einsummable.models.llama.model import PRESETS
from einsummable.plan.planners import make_plan


def test_simulate_writes_the_step_of_the_core_level_replay(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["simulate", "--model", "tiny", "--machines", "2", "--cores", "1", "--batch", "8", "--seq",
                 "32", "--json", str(out), "--trace", str(tmp_path / "t.json")]) == 0
    got = json.loads(out.read_text())
    # the CLI's default rates; its machine-level replay models no native loop (lower/runs.py)
    cluster = replace(Cluster(machines=1, cores=64), machines=2, cores=1, native_overhead=None)
    plan = make_plan(fuse(training_graph(PRESETS["tiny"], 8, 32).ir), cluster, compare=False)  # as compile
    tg = lower(plan)
    assert got["step_seconds"] == pytest.approx(simulate.run(tg, cluster).makespan, rel=1e-9)
    assert got["tasks"]["machine_level"] == len(tg.tasks)
    assert len(got["nic_bytes_out"]) == len(got["peak_memory"]) == 2
    trace = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in trace) == len(tg.tasks)
    assert "predicted step" in capsys.readouterr().out


def test_simulate_names_an_unknown_model(capsys):
    assert main(["simulate", "--model", "gpt-9"]) == 2
    assert "gpt-9" in capsys.readouterr().err
