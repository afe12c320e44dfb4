"""Training a tiny byte-level Llama: the loss falls, resume continues the curve, checkpoints fail loudly."""

import itertools
import json

import numpy as np
import pytest

from einsummable import cli
from einsummable.errors import CheckpointError
from einsummable.models.llama import safetensors_io
from einsummable.models.llama.data import corpus
from einsummable.models.llama.model import LlamaConfig, init_params
from einsummable.train import checkpoint
from einsummable.train import trainer as trainer_mod
from einsummable.train.trainer import TrainConfig, Trainer, lr_at

TINY = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1)


def make(steps=40, **kw):
    base = {"batch": 8, "seq": 32, "steps": steps, "lr": 1e-2, "min_lr": 1e-3, "warmup": 5}
    cfg = TrainConfig(**(base | kw))
    return Trainer(TINY, init_params(TINY, seed=1), cfg, corpus(), engine="reference")


def test_loss_falls_on_the_demo_corpus():
    t = make(steps=40)
    losses = [t.train_step() for _ in range(40)]
    assert np.mean(losses[:5]) > 5.0  # about ln(256) = 5.55 at initialisation
    assert np.mean(losses[-5:]) < 0.65 * np.mean(losses[:5])


def test_resume_reproduces_the_uninterrupted_curve(tmp_path):
    straight = make(steps=10)
    full = [straight.train_step() for _ in range(10)]
    first = make(steps=10)
    for _ in range(4):
        first.train_step()
    first.save(tmp_path / "ckpt")
    resumed = Trainer.resume(tmp_path / "ckpt", corpus(), engine="reference")
    assert resumed.step == 4
    rest = [resumed.train_step() for _ in range(6)]
    np.testing.assert_allclose(first.losses + rest, full, rtol=1e-6)
    assert json.loads((tmp_path / "ckpt" / "trainer.json").read_text())["step"] == 4


def test_accumulation_equals_one_big_batch(monkeypatch):
    rng = np.random.default_rng(0)
    big = rng.integers(0, 256, (8, 33))

    def fixed(data, cfg, step, micro=0):
        return big if cfg.batch == 8 else big[4 * micro : 4 * micro + 4]

    monkeypatch.setattr(trainer_mod, "batch_at", fixed)
    one = make(steps=2, clip_norm=None)
    accum = make(steps=2, batch=4, accum=2, clip_norm=None)
    l1, l2 = one.train_step(), accum.train_step()
    assert l1 == pytest.approx(l2, rel=1e-5)
    for name in one.params:
        np.testing.assert_allclose(accum.params[name], one.params[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_activation_checkpointing_changes_nothing_but_memory():
    from einsummable.autodiff.remat import peak_bytes

    plain, remat = make(steps=3), make(steps=3, remat=True)
    losses = [plain.train_step() for _ in range(3)]
    np.testing.assert_array_equal(losses, [remat.train_step() for _ in range(3)])
    for name in plain.params:
        np.testing.assert_array_equal(plain.params[name], remat.params[name])
    assert len(remat.program.graph) > len(plain.program.graph)
    assert peak_bytes(remat.program.graph) < peak_bytes(plain.program.graph)


def test_schedule_warms_up_then_decays():
    cfg = TrainConfig(steps=100, warmup=10, lr=1.0, min_lr=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(55, cfg) == pytest.approx(0.55)
    assert lr_at(100, cfg) == pytest.approx(0.1)
    values = [lr_at(s, cfg) for s in range(10, 101)]
    assert all(a >= b for a, b in itertools.pairwise(values))


def test_mismatched_optimizer_state_names_the_tensor(tmp_path):
    t = make(steps=2)
    t.train_step()
    t.save(tmp_path)
    state = safetensors_io.load(tmp_path / "optimizer.safetensors")
    state["model.norm.weight.m"] = np.zeros(3, np.float32)
    safetensors_io.save(state, tmp_path / "optimizer.safetensors")
    with pytest.raises(CheckpointError, match=r"optimizer\.safetensors is not the file saved"):
        Trainer.resume(tmp_path, corpus(), engine="reference")
    meta = json.loads((tmp_path / "trainer.json").read_text())  # record the bad file as the saved one
    checkpoint.write(tmp_path, meta["step"], meta["train"], meta["losses"], meta["data"])
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight\.m"):
        Trainer.resume(tmp_path, corpus(), engine="reference")
    (tmp_path / "trainer.json").unlink()
    with pytest.raises(CheckpointError, match="trainer.json"):
        Trainer.resume(tmp_path, corpus(), engine="reference")


def test_cli_demo_trains_saves_plots_and_samples(tmp_path, capsys):
    assert cli.main(["demo", "--steps", "3", "--out", str(tmp_path / "demo"), "--engine", "reference"]) == 0
    out = capsys.readouterr().out
    assert "loss fell from" in out and "--- sample ---" in out
    for f in ("config.json", "model.safetensors", "optimizer.safetensors", "trainer.json", "loss.png"):
        assert (tmp_path / "demo" / f).exists(), f
    assert (tmp_path / "demo" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code = cli.main(["generate", "--model", str(tmp_path / "demo"), "--prompt", "GNU",
                     "--max-new-tokens", "5", "--engine", "reference"])
    assert code == 0
    assert capsys.readouterr().out.startswith("GNU")


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    assert cli.main(["generate", "--model", str(tmp_path), "--prompt", "x"]) == 2
    assert "config.json" in capsys.readouterr().err


def test_cli_plan_describes_a_cluster_without_running(capsys):
    assert cli.main(["plan", "--model", "tiny", "--machines", "2", "--cores", "3", "--batch", "2",
                     "--seq", "8"]) == 0
    out = capsys.readouterr().out
    assert "2 x 3 workers" in out and "eindecomp *" in out and "data_parallel" in out
    assert cli.main(["plan", "--model", "nope"]) == 2
    assert "--model nope: no such preset or file" in capsys.readouterr().err


def test_bf16_training_keeps_f32_masters_and_moments_and_resumes(tmp_path):
    """bf16 weights train through f32 master copies; the losses follow the f32 run's
    (bf16 forward: within 2%), and a save and resume keeps the masters exactly."""
    import ml_dtypes

    base = {"batch": 8, "seq": 32, "steps": 6, "lr": 1e-2, "min_lr": 1e-3, "warmup": 2}
    params = init_params(TINY, seed=1)
    f32 = Trainer(TINY, params, TrainConfig(**base), corpus(), engine="reference")
    low = {n: w.astype(ml_dtypes.bfloat16) for n, w in params.items()}
    bf16 = Trainer(TINY, low, TrainConfig(**base), corpus(), engine="reference")
    want, got = f32.fit(4), bf16.fit(4)
    np.testing.assert_allclose(got, want, rtol=2e-2)
    state = bf16.state
    name = "model.norm.weight"
    assert state[name].dtype == ml_dtypes.bfloat16
    assert {state[f"{name}.{k}"].dtype for k in ("master", "m", "v")} == {np.dtype(np.float32)}
    np.testing.assert_array_equal(state[name], state[f"{name}.master"].astype(ml_dtypes.bfloat16))
    bf16.save(tmp_path / "ck")
    again = Trainer.resume(tmp_path / "ck", corpus(), engine="reference")
    np.testing.assert_array_equal(again.state[f"{name}.master"], state[f"{name}.master"])
    np.testing.assert_allclose(again.fit(), bf16.fit(), rtol=1e-6)


@pytest.mark.parametrize("kw", [{}, {"lora_rank": 4}, {"freeze": ("model.embed_tokens.weight",)}],
                         ids=["full", "lora", "frozen"])
def test_bf16_training_runs_on_the_local_engine_and_follows_the_f32_run(kw):
    """The optimizer's casts of constants (cast(0.9, bf16) ...) folded on the local engine's
    factored path too: bf16 training raised EngineError there (issue 30, item 1)."""
    import ml_dtypes

    base = {"batch": 4, "seq": 16, "steps": 4, "lr": 1e-2, "min_lr": 1e-3, "warmup": 1} | kw
    params = init_params(TINY, seed=1)
    low = {n: w.astype(ml_dtypes.bfloat16) for n, w in params.items()}
    f32 = Trainer(TINY, params, TrainConfig(**base), corpus(), engine="reference")
    bf16 = Trainer(TINY, low, TrainConfig(**base), corpus(), engine="local", workers=2)
    want, got = f32.fit(3), bf16.fit(3)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=2e-2)
