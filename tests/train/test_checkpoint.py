"""Checkpoints: a save killed at any step leaves a whole one, mixed or malformed ones are refused,
and a resume trains on the data, and up to the step, that it should."""

import json
import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

import einsummable
from einsummable import cli
from einsummable.errors import CheckpointError, EinsummableError
from einsummable.models.llama import LlamaConfig, init_params, safetensors_io, weights
from einsummable.models.llama.data import corpus
from einsummable.train import checkpoint
from einsummable.train.trainer import TrainConfig, Trainer

TINY = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1)
SMALL = TrainConfig(batch=2, seq=16, steps=10, warmup=2)
LAB = Path(__file__).with_name("crash_lab.py")


def trained(steps, data=None, source=None):
    where = {} if source is None else {"data_source": source}
    t = Trainer(TINY, init_params(TINY, seed=1), SMALL, corpus() if data is None else data,
                engine="reference", **where)
    for _ in range(steps):
        t.train_step()
    return t


def resume(directory, data=None, **kw):
    return Trainer.resume(directory, corpus() if data is None else data, engine="reference", **kw)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the lab forks its savers")
def test_a_save_killed_at_any_step_resumes_the_old_or_the_new_checkpoint_whole(tmp_path):
    env = os.environ | {"PYTHONPATH": str(Path(einsummable.__file__).parents[1])}
    subprocess.run([sys.executable, str(LAB), str(tmp_path)], env=env, check=True, timeout=300)
    old, new = np.load(tmp_path / "old.npz"), np.load(tmp_path / "new.npz")
    crashes = json.loads((tmp_path / "crashes.json").read_text())
    calls = {kind for c in crashes for kind in [c["call"][0]]}
    assert {"write", "fsync", "replace"} <= calls and len(crashes) >= 15
    got = []
    for c in crashes:
        assert c["killed"], c
        directory = tmp_path / f"crash{c['k']:03d}" / "ckpt"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "restored the checkpoint from before it"
            r = resume(directory)
        want = old if r.step == int(old["step"]) else new
        assert r.step == int(want["step"]), c
        state = r.state
        assert set(state) == set(want.files) - {"step"}
        for name, value in state.items():
            np.testing.assert_array_equal(value, want[name], err_msg=f"{c}: {name}")
        assert sorted(p.name for p in directory.parent.iterdir()) == ["ckpt"], c  # no leftovers
        got.append(r.step)
    assert got[0] == 2 and got[-1] == 4  # killed at the first call: old; at the last: new


def test_a_checkpoint_mixing_two_saves_is_refused(tmp_path):
    t = trained(2)
    t.save(tmp_path / "a")
    for _ in range(2):
        t.train_step()
    t.save(tmp_path / "b")
    for name in ("model.safetensors", "optimizer.safetensors"):
        mixed = tmp_path / f"mixed-{name}"
        shutil.copytree(tmp_path / "a", mixed)
        shutil.copy(tmp_path / "b" / name, mixed / name)
        with pytest.raises(CheckpointError, match=rf"{name} is not the file saved with the step-2"):
            resume(mixed)
    # even with the manifest rewritten to fit, the optimizer's own step must agree with trainer.json
    mixed = tmp_path / "mixed-optimizer.safetensors"
    meta = json.loads((mixed / "trainer.json").read_text())
    checkpoint.write(mixed, meta["step"], meta["train"], meta["losses"], meta["data"])
    with pytest.raises(CheckpointError, match=r"optimizer\.safetensors is at step 4 but .*json says 2"):
        resume(mixed)


def _edit(field, value):
    def edit(meta):
        *path, last = field.split(".")
        for key in path:
            meta = meta[key]
        meta[last] = value

    return edit


MALFORMED = {
    "bad JSON": ("{not json", r"trainer\.json: not valid JSON"),
    "a list": ("[1, 2]", r"trainer\.json: expected a JSON object"),
    "unknown key": (lambda m: m.update(stepz=1), r"trainer\.json: unknown field stepz"),
    "missing key": (lambda m: m.pop("files"), r"trainer\.json: field files is missing"),
    "step as text": (_edit("step", "2"), r"trainer\.json: 'step' must be a non-negative integer, got '2'"),
    "negative step": (_edit("step", -1), r"trainer\.json: 'step' must be"),
    "unknown setting": (_edit("train.bs", 4), r"trainer\.json: train: unknown training setting 'bs'"),
    "batch as text": (_edit("train.batch", "2"), r"trainer\.json: train: .*'batch' must be int"),
    "lr as bool": (_edit("train.lr", True), r"trainer\.json: train: .*'lr' must be float"),
    "zero seq": (_edit("train.seq", 0), r"trainer\.json: train: .*'seq' must be int >= 1, got 0"),
    "train as list": (_edit("train", [1]), r"trainer\.json: 'train' must be an object"),
    "losses as text": (_edit("losses", "abc"), r"trainer\.json: 'losses' must be a list of numbers"),
    "data hash": (_edit("data.sha256", 7), r"trainer\.json: 'data\.sha256' must be"),
    "unknown file": (_edit("files.extra", {}), r"trainer\.json: unknown field files\.extra"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_trainer_json_names_the_file_and_the_field(tmp_path, case):
    trained(1).save(tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "trainer.json"
    change, message = MALFORMED[case]
    if callable(change):
        meta = json.loads(path.read_text())
        change(meta)
        change = json.dumps(meta)
    path.write_text(change)
    with pytest.raises(CheckpointError, match=message):
        resume(tmp_path / "ckpt")


def test_a_missing_optimizer_file_is_named(tmp_path):
    trained(1).save(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "optimizer.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"ckpt/optimizer\.safetensors is missing"):
        resume(tmp_path / "ckpt")


def test_weights_save_replaces_the_model_whole_and_keeps_other_files(tmp_path, monkeypatch):
    params = init_params(TINY, seed=1)
    weights.save(tmp_path / "m", TINY, params)
    (tmp_path / "m" / "tokenizer.json").write_text("{}")
    real_save = safetensors_io.save

    def dies_half_way(tensors, path, metadata=None):
        real_save(tensors, path, metadata)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        raise OSError("disk full")

    monkeypatch.setattr(safetensors_io, "save", dies_half_way)
    with pytest.raises(OSError, match="disk full"):
        weights.save(tmp_path / "m", TINY, init_params(TINY, seed=2))
    monkeypatch.undo()
    _, back = weights.load(tmp_path / "m")
    for name, w in params.items():
        np.testing.assert_array_equal(back[name], w, err_msg=name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    changed = init_params(TINY, seed=2)
    weights.save(tmp_path / "m", TINY, changed)
    _, back = weights.load(tmp_path / "m")
    np.testing.assert_array_equal(back["model.norm.weight"], changed["model.norm.weight"])
    np.testing.assert_array_equal(back["lm_head.weight"], changed["lm_head.weight"])
    assert (tmp_path / "m" / "tokenizer.json").read_text() == "{}"


def test_resume_reads_the_recorded_data_and_refuses_it_changed(tmp_path):
    text = tmp_path / "text.txt"
    text.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 20)
    data = np.frombuffer(text.read_bytes(), np.uint8)
    trained(2, data, str(text)).save(tmp_path / "ckpt")
    r = Trainer.resume(tmp_path / "ckpt", engine="reference")
    np.testing.assert_array_equal(r.data, data)
    with pytest.warns(UserWarning, match="different data"):
        resume(tmp_path / "ckpt", corpus())
    text.write_bytes(b"another text altogether, " * 40)
    with pytest.raises(CheckpointError, match=r"text\.txt has changed since the checkpoint"):
        Trainer.resume(tmp_path / "ckpt", engine="reference")
    trained(1).save(tmp_path / "array")  # data given as an array: there is no file to read back
    with pytest.raises(CheckpointError, match="pass the data"):
        Trainer.resume(tmp_path / "array", engine="reference")


def _train(*args):
    return cli.main(["train", *map(str, args), "--engine", "reference"])


def test_cli_resume_trains_up_to_steps_on_the_recorded_data(tmp_path, capsys):
    config = tmp_path / "run.json"
    model = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
             "num_key_value_heads": 1}
    config.write_text(json.dumps({"model": model, "train": {"batch": 2, "seq": 16, "warmup": 1}}))
    text = tmp_path / "text.txt"
    text.write_bytes(b"pack my box with five dozen liquor jugs; " * 30)
    run = tmp_path / "run"
    assert _train("--config", config, "--data", text, "--steps", 3, "--out", run) == 0
    assert _train("--resume", run, "--steps", 5) == 0  # the README's command: up to step 5, into run/
    meta = json.loads((run / "trainer.json").read_text())
    assert meta["step"] == 5 and len(meta["losses"]) == 5 and meta["train"]["steps"] == 5
    assert meta["data"]["sha256"] == checkpoint.data_digest(np.frombuffer(text.read_bytes(), np.uint8))
    capsys.readouterr()
    assert _train("--resume", run) == 2
    assert "finished its run of 5 steps" in capsys.readouterr().err
    assert _train("--resume", run, "--steps", 4) == 2
    assert "at step 5" in capsys.readouterr().err
    assert _train("--resume", run, "--steps", 6, "--config", config) == 2
    assert "--config" in capsys.readouterr().err
    text.write_bytes(b"sphinx of black quartz, judge my vow. " * 30)
    assert _train("--resume", run, "--steps", 6) == 2
    assert "has changed since the checkpoint" in capsys.readouterr().err
    assert _train("--resume", run, "--steps", 6, "--data", text) == 0  # said explicitly: a warning
    assert "warning: resuming on different data" in capsys.readouterr().err
    assert json.loads((run / "trainer.json").read_text())["step"] == 6


def test_cli_names_a_malformed_run_config(tmp_path, capsys):
    config = tmp_path / "run.json"
    config.write_text("{'train': 1}")
    assert _train("--config", config, "--steps", 1, "--out", tmp_path / "r") == 2
    assert "run.json: not valid JSON" in capsys.readouterr().err
    config.write_text(json.dumps({"train": {"lr": "fast"}}))
    assert _train("--config", config, "--steps", 1, "--out", tmp_path / "r") == 2
    assert "run.json: train: training setting 'lr' must be float" in capsys.readouterr().err


def test_train_config_checks_its_fields():
    with pytest.raises(EinsummableError, match="'accum' must be int >= 1, got 0"):
        TrainConfig(accum=0)
    assert TrainConfig(lr=1).lr == 1  # an int is a number


def test_a_save_refuses_to_replace_the_directory_it_runs_in(tmp_path, monkeypatch):
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    with pytest.raises(CheckpointError, match="holds the current directory"):
        weights.save(".", TINY, init_params(TINY, seed=1))
    assert list((tmp_path / "run").iterdir()) == []


def test_cli_flags_override_the_config_and_are_refused_on_resume(tmp_path, capsys):
    config = tmp_path / "run.json"
    model = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
             "num_key_value_heads": 1}
    config.write_text(json.dumps({"model": model, "train": {"batch": 4, "seq": 8, "warmup": 1, "lr": 1e-2}}))
    run = tmp_path / "run"
    assert _train("--config", config, "--steps", 4, "--out", run, "--seed", 7, "--lr", 2e-3, "--batch", 2,
                  "--seq", 16, "--save-every", 2, "--log-every", 2) == 0
    out = capsys.readouterr().out
    assert out.count("settings: ") == 1 and "batch=2, seq=16" in out and "lr=0.002" in out
    assert "seed=7" in out and "step 2: loss" in out and "step 4: loss" in out and "step 3: loss" not in out
    meta = json.loads((run / "trainer.json").read_text())
    want = {"seed": 7, "lr": 2e-3, "batch": 2, "seq": 16, "warmup": 1}  # flags over the file's values
    assert {k: meta["train"][k] for k in want} == want
    # the same run set up through TrainConfig, independent of the flags, gives the same losses
    cfg = TrainConfig(**(asdict(cli.DEMO_TRAIN) | want | {"steps": 4}))
    small = LlamaConfig(**(asdict(cli.DEMO_MODEL) | model))
    t = Trainer(small, init_params(small, 7), cfg, corpus(), engine="reference")
    for _ in range(4):
        t.train_step()
    np.testing.assert_allclose(meta["losses"], t.losses, rtol=1e-5)
    for flag, value in (("--lr", 1e-3), ("--seed", 1), ("--batch", 4), ("--seq", 4)):
        assert _train("--resume", run, "--steps", 6, flag, value) == 2
        assert f"{flag} set up a new run" in capsys.readouterr().err
    assert _train("--resume", run, "--steps", 5, "--save-every", 0) == 2
    assert "argument --save-every: expected an integer >= 1, got 0" in capsys.readouterr().err
    assert _train("--resume", run, "--steps", 5, "--log-every", 1) == 0  # intervals don't change the run
    assert "step 5: loss" in capsys.readouterr().out


def test_save_every_saves_checkpoints_at_its_interval(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(Trainer, "save", lambda self, out: saved.append(self.step))
    cli.run_training(trained(0), tmp_path, save_every=3)
    assert saved == [3, 6, 9, 10]
