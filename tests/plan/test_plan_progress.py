"""Planning shows progress (issue 20 item 7): make_plan reports each planner as it starts, the
lazily planned baselines included, and ``einsummable plan`` draws a bar with an ETA on a terminal."""

import re
import sys

import pytest

import einsummable as es
from einsummable import cli, progress
from einsummable.hardware.cluster import Cluster
from einsummable.plan.planners import PLANNERS, make_plan
from fakes import Terminal

TINY = ["plan", "--model", "tiny", "--batch", "2", "--seq", "8", "--machines", "2", "--cores", "2"]


def _graph():
    g = es.Graph()
    x, w = g.input("x", (64, 32)), g.input("w", (32, 16))
    g.output("y", x @ w)
    return g.ir


def test_make_plan_reports_every_planner_before_it_runs():
    calls = []
    plan = make_plan(_graph(), Cluster(machines=2, cores=2), progress=lambda *a: calls.append(a))
    assert calls == [(0, len(PLANNERS), "eindecomp")]  # the baselines wait until they are asked for
    baselines = plan.baselines
    n = len(PLANNERS)
    assert calls == [(0, n, "eindecomp"), *((i + 1, n, name) for i, (name, _) in enumerate(baselines)),
                     (n, n, "")]
    assert [name for name, _ in baselines] == [p for p in PLANNERS if p != "eindecomp"]
    alone = []
    make_plan(_graph(), Cluster(machines=1, cores=2), "fsdp", compare=False,
              progress=lambda *a: alone.append(a))
    assert alone == [(0, 1, "fsdp"), (1, 1, "")]


def test_plan_command_draws_a_bar_with_an_eta_on_a_terminal(monkeypatch, capsys):
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    monkeypatch.setattr(progress, "_tqdm", lambda *a: None)  # our own bar, which spells out its ETA
    assert cli.main(TINY) == 0
    n = len(PLANNERS)
    assert "planning [" in term.text and "ETA" in term.text and f"{n}/{n}" in term.text
    assert "now=fsdp" in term.text  # the planner under way
    assert "planned in" in capsys.readouterr().out


def test_plan_command_is_quiet_on_stderr_off_a_terminal(capsys):
    assert cli.main(TINY) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "planned in" in captured.out and "fsdp" in captured.out


def test_tqdms_bar_names_the_first_planner_before_any_is_done(monkeypatch, capsys):
    pytest.importorskip("tqdm")
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert cli.main(TINY) == 0
    assert re.search(rf"0/{len(PLANNERS)} \[[^\r]*now=eindecomp", term.text), term.text
