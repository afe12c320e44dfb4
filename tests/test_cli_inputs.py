"""What a shell user types into ``einsummable`` (issue 30 items 8-10, 12, 13, 15): a run's
directories are checked before step 1 and nothing finished is lost, and every bad flag, file
or prompt is a one-line error with exit status 2 that names it, never a traceback."""

import json
import os

import pytest

from einsummable import cli
from einsummable.hardware.calibrate import physical_memory
from einsummable.models.llama import weights
from einsummable.models.llama.model import LlamaConfig, init_params
from einsummable.train import checkpoint

CFG = LlamaConfig(vocab_size=256, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1)
PLAN = ["plan", "--model", "tiny", "--batch", "2", "--seq", "8", "--compare", "no"]


@pytest.fixture
def base(tmp_path):
    path = tmp_path / "base"
    weights.save(path, CFG, init_params(CFG, seed=1), tokenizer="bytes")
    return path


def _train(base, *flags) -> list[str]:
    return ["train", "--model", str(base), "--steps", "1", "--batch", "2", "--seq", "5",
            "--engine", "reference", *map(str, flags)]


def _error(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err and line.startswith(("einsummable: error: ", "einsummable ")), err
    for word in words:
        assert word in line, (word, line)
    return line


def _digests(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_merge_into_the_base_or_the_checkpoint_is_refused_before_training(base, tmp_path, capsys):
    before = _digests(base)
    lora = ["--lora-rank", 2, "--out", tmp_path / "run"]
    assert cli.main(_train(base, *lora, "--merge", base)) == 2  # was: trained, then overwrote the base
    _error(capsys, f"--merge {base} overlaps the base model")
    assert cli.main(_train(base, *lora, "--merge", tmp_path / "run")) == 2  # was: a stale merge in --out
    _error(capsys, "overlaps --out")
    assert cli.main(_train(base, *lora, "--merge", tmp_path / "run" / "merged")) == 2
    _error(capsys, "overlaps --out")
    assert _digests(base) == before and not (tmp_path / "run").exists()  # refused before step 1
    assert cli.main(_train(base, *lora, "--merge", tmp_path / "merged")) == 0
    capsys.readouterr()
    assert (tmp_path / "merged" / "config.json").is_file()
    resume = ["train", "--resume", str(tmp_path / "run"), "--engine", "reference", "--merge"]
    assert cli.main([*resume, str(base)]) == 2
    _error(capsys, "overlaps the base model")
    assert cli.main([*resume, str(tmp_path / "merged")]) == 2  # holds the first merge
    _error(capsys, "holds files already", "config.json")
    assert _digests(base) == before


def test_an_unusable_out_is_found_before_step_one_and_named_as_given(base, tmp_path, capsys, monkeypatch):
    steps = []
    monkeypatch.setattr(cli.Trainer, "train_step", lambda self: steps.append(1) or 0.0)
    (tmp_path / "afile").write_text("x")
    cases = {str(tmp_path / "afile"): "is a file",
             str(tmp_path / "afile" / "sub"): "is a file, not a directory",
             "/proc/einsummable-out": "cannot write in /proc"}
    for out, words in cases.items():
        assert cli.main(_train(base, "--out", out)) == 2
        _error(capsys, f"--out {out}", words)  # was: the first save's "/proc/.xx.einsummable-new"
    assert steps == []


def test_a_finished_run_in_out_is_moved_aside_and_other_files_refused(base, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(_train(base, "--out", out)) == 0
    first = _digests(out)
    assert cli.main(_train(base, "--out", out, "--seed", 5)) == 0  # was: replaced without a word
    err = capsys.readouterr().err
    assert f"{out} held an earlier run; moved it to {out}.old-1" in err
    assert _digests(tmp_path / "run.old-1") == first
    assert json.loads((out / checkpoint.META).read_text())["train"]["seed"] == 5
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("mine")
    assert cli.main(_train(base, "--out", junk)) == 2
    _error(capsys, f"--out {junk} holds files that are not a checkpoint (notes.txt)")
    assert (junk / "notes.txt").read_text() == "mine" and len(list(junk.iterdir())) == 1


def test_demo_keeps_the_previous_demo_aside(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "sample_text", lambda *a, **k: "")
    out = tmp_path / "demo"
    for _ in range(2):
        assert cli.main(["demo", "--steps", "1", "--out", str(out), "--engine", "reference"]) == 0
    assert f"moved it to {out}.old-1" in capsys.readouterr().err
    assert (tmp_path / "demo.old-1" / checkpoint.META).is_file() and (out / checkpoint.META).is_file()


def test_a_bad_prompt_or_tokenizer_is_one_line(base, tmp_path, capsys):
    gen = ["generate", "--model", str(base), "--max-new-tokens", "2", "--engine", "reference"]
    assert cli.main([*gen, "--prompt", b"caf\xe9".decode("utf-8", "surrogateescape")]) == 2
    _error(capsys, "--prompt is not UTF-8 text")  # was: UnicodeEncodeError
    for text in (b"{bad", b"\xff\xfe", b'{"model": 3}'):
        (base / "tokenizer.json").write_bytes(text)
        assert cli.main([*gen, "--prompt", "hi"]) == 2
        _error(capsys, f"{base / 'tokenizer.json'}: not a tokenizer file")  # was: a bare Exception
    for flags, words in ((["--temperature", "nan"], "--temperature"), (["--top-p", "-1"], "--top-p"),
                         (["--seed", "-1"], "--seed: expected an integer >= 0")):
        assert cli.main([*gen, "--prompt", "hi", *flags]) == 2
        _error(capsys, words)


def test_plan_and_simulate_read_a_model_file_or_say_what_is_wrong_with_it(tmp_path, capsys):
    files = {"bad.json": b"{bad", "null.json": b"null", "list.json": b"[1]", "latin1.json": b"\xff\xfe"}
    for name, text in files.items():
        (tmp_path / name).write_bytes(text)
    words = {"bad.json": "not a JSON config", "null.json": "got null", "list.json": "got list",
             "latin1.json": "not a JSON config", "missing.json": "no such preset or file"}
    for command in ("plan", "simulate"):
        for name, what in words.items():
            path = str(tmp_path / name)
            assert cli.main([command, "--model", path, "--batch", "2", "--seq", "8"]) == 2, (command, name)
            _error(capsys, f"--model {path}", what)
    assert cli.main(["train", "--model", str(tmp_path / "no-such-dir")]) == 2
    _error(capsys, "no such directory")  # was: "no config.json"
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
                                  "num_hidden_layers": 1, "num_attention_heads": 2}))
    assert cli.main(["plan", "--model", str(config), "--batch", "2", "--seq", "8", "--compare", "no"]) == 0


@pytest.mark.parametrize("flags, words", [
    (["--memory", "256"], "--memory '256': expected a number and a unit"),  # was: 256 bytes
    (["--memory", "-5GiB"], "memory must be a positive amount"),  # was: "expected one argument"
    (["--memory", "0GiB"], "memory must be a positive amount"),
    (["--batch", "0"], "argument --batch: expected an integer >= 1, got 0"),
    (["--cores", "-1"], "argument --cores: expected an integer >= 1, got -1"),
])
def test_plan_flags_are_checked(flags, words, capsys):
    assert cli.main([*PLAN, *flags]) == 2
    _error(capsys, words)


def test_calibrate_and_train_refuse_bad_counts_and_rates_before_any_work(tmp_path, capsys):
    out = tmp_path / "cluster.json"
    assert cli.main(["calibrate", "--cores", "0", "--out", str(out)]) == 2  # was: measured all cores
    _error(capsys, "argument --cores")
    assert not out.exists()
    assert cli.main(["train", "--lr", "-1", "--steps", "1", "--out", str(tmp_path / "r")]) == 2
    _error(capsys, "argument --lr: expected a finite number > 0, got -1")
    assert not (tmp_path / "r").exists()


def test_lora_flags_without_a_rank_are_refused(base, tmp_path, capsys):
    for flags in (["--lora-alpha", "4"], ["--lora-targets", "q,v"]):
        assert cli.main(_train(base, "--out", tmp_path / "r", *flags)) == 2  # was: tuned the whole model
        _error(capsys, flags[0], "add --lora-rank N")


def test_a_local_plan_uses_this_machines_memory_and_says_where_each_figure_comes_from(tmp_path, capsys):
    gib = physical_memory() / 2**30
    assert cli.main(PLAN) == 0
    assert f"{gib:.4g} GiB per machine (this machine's memory" in capsys.readouterr().out  # was: 256 GiB
    assert cli.main([*PLAN, "--machines", "2"]) == 0
    assert "256 GiB per machine (assumed; --memory sets it)" in capsys.readouterr().out
    assert cli.main([*PLAN, "--memory", "3GiB"]) == 0
    assert "3 GiB per machine (--memory)" in capsys.readouterr().out


def test_a_resumed_runs_bar_counts_from_its_checkpoint_step(base, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(_train(base, "--out", out, "--steps", 2)) == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--steps", "3", "--engine", "reference"]) == 0
    captured = capsys.readouterr()
    assert "steps 2..3" in captured.out
    assert "3/3" in captured.err and "1/1" not in captured.err  # was: 1/1 under "steps 2..3"


def test_no_probe_directory_is_left_behind(base, tmp_path):
    assert cli.main(_train(base, "--out", tmp_path / "run")) == 0
    assert not [n for n in os.listdir(tmp_path) if "probe" in n]
