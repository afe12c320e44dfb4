"""LoRA trusted end to end (issue 30 items 2, 3, 6): generation from a LoRA trainer's session
uses the adapters, a resume notices a base model changed since the checkpoint, and an
adapter config's rank, alpha and targets are checked field by field."""

import hashlib
import json
import math
import re

import numpy as np
import pytest

from einsummable import cli
from einsummable.errors import CheckpointError, ConfigError, EinsummableError
from einsummable.models.llama import lora, safetensors_io, weights
from einsummable.models.llama.data import corpus
from einsummable.models.llama.generate import Generator
from einsummable.models.llama.model import LlamaConfig, init_params
from einsummable.train import checkpoint
from einsummable.train.trainer import TrainConfig, Trainer

CFG = LlamaConfig(vocab_size=256, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1)
BASE = {"batch": 2, "seq": 5, "steps": 4, "lr": 1e-2, "min_lr": 1e-3, "warmup": 1}
LORA = {"lora_rank": 2, "lora_alpha": 8.0, "lora_targets": ("q_proj", "v_proj", "down_proj")}
PROMPTS = [[5, 6, 7, 8], [9, 10], [3, 1, 4]]


def test_generation_from_a_lora_trainers_session_uses_the_adapters():
    """Oracle: the merged model (W + (alpha / r) B A, folded in numpy) generated on the
    reference engine; the adapters are large enough that the base's tokens differ."""
    params = init_params(CFG, seed=1)
    config = lora.LoraConfig(2, 8.0, LORA["lora_targets"])
    rng = np.random.default_rng(3)
    adapters = {n: rng.normal(0, 0.5, w.shape).astype(np.float32) if "lora_B" in n else w
                for n, w in lora.init(CFG, config).items()}
    trainer = Trainer(CFG, params | adapters, TrainConfig(**BASE | LORA), corpus(), engine="reference")
    trainer.train_step()
    merged = lora.merge(trainer.params, trainer.cfg.lora)
    want = Generator(CFG, merged, engine="reference").generate(PROMPTS, 4)
    assert want != Generator(CFG, params, engine="reference").generate(PROMPTS, 4)  # the adapters matter
    with pytest.raises(EinsummableError, match=r"LoRA adapters .*lora=trainer\.cfg\.lora"):
        Generator(CFG, session=trainer.session)  # was: generated the base's tokens
    with pytest.raises(EinsummableError, match=r"params hold\(s\) LoRA adapters"):
        Generator(CFG, trainer.params)
    gen = Generator(CFG, session=trainer.session, lora=trainer.cfg.lora)
    assert gen.generate(PROMPTS, 4) == want
    assert Generator(CFG, trainer.params, lora=config, resident=False).generate(PROMPTS, 4) == want
    with pytest.raises(EinsummableError, match="lack"):
        Generator(CFG, params, lora=config)  # no adapters to add


def _lora_run(tmp_path):
    weights.save(tmp_path / "base", CFG, init_params(CFG, seed=1), tokenizer="bytes")
    cfg, params = weights.load(tmp_path / "base")
    trainer = Trainer(cfg, params, TrainConfig(**BASE | LORA), corpus(), engine="reference",
                      tokenizer=tmp_path / "base", base_model=tmp_path / "base")
    trainer.fit(2)
    trainer.save(tmp_path / "ck")
    return trainer


def test_lora_resume_refuses_a_base_changed_since_the_checkpoint(tmp_path):
    _lora_run(tmp_path)
    base = (tmp_path / "base").resolve()
    recorded = json.loads((tmp_path / "ck" / "trainer.json").read_text())["base"]
    assert recorded["path"] == str(base)
    for name in ("config.json", "model.safetensors"):  # oracle: hashlib over the files as they are
        assert recorded["files"][name]["sha256"] == hashlib.sha256((base / name).read_bytes()).hexdigest()
    assert Trainer.resume(tmp_path / "ck", corpus(), engine="reference").step == 2  # unchanged: resumes
    weights.save(tmp_path / "base", CFG, init_params(CFG, seed=2), tokenizer="bytes")  # same shapes
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(base))}.* changed since the checkpoint"):
        Trainer.resume(tmp_path / "ck", corpus(), engine="reference")


def _adapter_dir(tmp_path, **fields):
    config = lora.LoraConfig(2, 8.0)
    lora.save(tmp_path, CFG, config, lora.init(CFG, config), None)
    path = tmp_path / lora.CONFIG
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))  # NaN, Infinity as Python writes them
    return tmp_path


BAD = [
    ("lora_alpha", math.inf, "lora_alpha must be a finite number > 0, got inf"),
    ("lora_alpha", math.nan, "lora_alpha must be a finite number > 0, got nan"),
    ("lora_alpha", -1.0, "lora_alpha must be a finite number > 0, got -1.0"),
    ("lora_alpha", "8", "lora_alpha must be a finite number > 0, got '8'"),
    ("r", 0, "r must be an integer >= 1, got 0"),
    ("r", -2, "r must be an integer >= 1, got -2"),
    ("r", 2.5, "r must be an integer >= 1, got 2.5"),
    ("r", "4", "r must be an integer >= 1, got '4'"),
    ("target_modules", 5, "target_modules must be a non-empty list of"),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_adapter_config_fields_are_checked(tmp_path, field, value, message):
    directory = _adapter_dir(tmp_path, **{field: value})
    with pytest.raises(ConfigError, match=re.escape(f"{directory / lora.CONFIG}: LoRA {message}")):
        lora.read_config(directory)


def test_lora_configs_built_in_python_and_from_the_command_line_are_checked(tmp_path, capsys):
    with pytest.raises(ConfigError, match="lora_alpha must be a finite number > 0, got inf"):
        lora.LoraConfig(2, math.inf)
    with pytest.raises(ConfigError, match="r must be an integer >= 1, got 0"):
        lora.LoraConfig(0, 8.0)
    with pytest.raises(EinsummableError, match="'lora_alpha' must be float"):
        TrainConfig(lora_rank=2, lora_alpha=math.inf)
    weights.save(tmp_path / "base", CFG, init_params(CFG, seed=1), tokenizer="bytes")
    args = ["train", "--model", str(tmp_path / "base"), "--steps", "1", "--out", str(tmp_path / "r"),
            "--lora-rank", "2", "--engine", "reference"]
    assert cli.main([*args, "--lora-alpha", "inf"]) == 2
    assert "argument --lora-alpha: expected a finite number > 0, got inf" in capsys.readouterr().err


def test_a_sharded_bases_record_covers_its_index_and_every_shard(tmp_path):
    weights.save(tmp_path, CFG, init_params(CFG, seed=1))
    tensors = {k: np.array(v) for k, v in safetensors_io.load(tmp_path / "model.safetensors").items()}
    (tmp_path / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        safetensors_io.save({k: tensors[k] for k in keys}, tmp_path / shard)
    index = {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    record = checkpoint.base_record(str(tmp_path))
    assert sorted(record["files"]) == sorted(["config.json", "model.safetensors.index.json", *shards])
    last = names[1]
    safetensors_io.save({k: tensors[k] * (2 if k == last else 1) for k in shards[
        "model-00002-of-00002.safetensors"]}, tmp_path / "model-00002-of-00002.safetensors")
    with pytest.raises(CheckpointError, match=r"changed since .*\(model-00002-of-00002\.safetensors differ"):
        checkpoint.check_base(tmp_path / "ck", record, str(tmp_path))
