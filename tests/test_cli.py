"""The ``einsummable`` command as a shell user meets it: ``python -m``, ``--version``, help
that names every command, default and choice, and errors as one line with exit status 2."""

import argparse
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import einsummable
from einsummable import cli
from einsummable.compile import ENGINES
from einsummable.plan.planners import PLANNERS

SRC = str(Path(einsummable.__file__).resolve().parents[1])


def run(*args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "einsummable", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_python_m_help_lists_every_command_in_plain_text():
    done = run("--help")
    assert done.returncode == 0, done.stderr
    commands = _subparsers(cli.build_parser())
    assert {"demo", "train", "generate", "plan", "calibrate"} <= set(commands)
    description = done.stdout.split("options:")[0]
    for name in commands:
        assert f"\n  {name} " in description, name
    assert "``" not in done.stdout and "COMMAND" in done.stdout


def test_version_is_the_installed_distribution_s():
    done = run("--version")
    assert done.returncode == 0
    assert done.stdout.split() == ["einsummable", version("einsummable")]
    assert einsummable.__version__ == version("einsummable")


def test_every_flag_has_help_shows_its_default_and_lists_its_choices():
    for name, sub in _subparsers(cli.build_parser()).items():
        text = " ".join(sub.format_help().split())
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flag = action.option_strings[0]
            assert action.help, f"{name} {flag} has no help"
            if action.default not in (None, False, argparse.SUPPRESS):
                assert f"(default: {action.default})" in text or "default" in action.help, (name, flag)
            if action.choices:
                assert "{" + ",".join(action.choices) + "}" in text, (name, flag)
    subs = _subparsers(cli.build_parser())
    engine = next(a for a in subs["generate"]._actions if "--engine" in a.option_strings)
    assert set(engine.choices) == set(ENGINES)
    planner = next(a for a in subs["plan"]._actions if "--planner" in a.option_strings)
    assert list(planner.choices) == list(PLANNERS)
    mode = next(a for a in subs["plan"]._actions if "--mode" in a.option_strings)
    assert set(mode.choices) == {"train", "infer"}


def _one_line_error(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("einsummable: error: "), done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.fixture
def configs(tmp_path):
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"train": {"lr": 1e-3, "learning_rate": 1}}))
    return {"unknown": str(unknown), "missing": str(tmp_path / "missing.json")}


def test_user_errors_are_one_line_with_exit_status_2_and_debug_shows_the_traceback(configs, tmp_path):
    _one_line_error(run("train", "--config", configs["unknown"], "--steps", "1"), "learning_rate")
    _one_line_error(run("train", "--config", configs["missing"]), "missing.json", "No such file")
    _one_line_error(run("plan", "--model", "tiny", "--cluster", configs["missing"]), "missing.json")
    _one_line_error(run("generate", "--model", str(tmp_path), "--prompt", "x", "--engine", "simulate"),
                    "simulate engine computes nothing", "--engine local")
    debug = run("plan", "--model", "tiny", "--cluster", configs["missing"], "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "FileNotFoundError" in debug.stderr


def test_without_matplotlib_the_loss_plot_is_skipped_with_a_one_line_notice(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    assert cli.plot_losses([3.0, 2.0, 1.0], tmp_path / "loss.png") is None
    assert not (tmp_path / "loss.png").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matplotlib is not installed" in err[0] and "einsummable[demo]" in err[0]
