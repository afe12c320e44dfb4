"""config.json and checkpoint files read strictly: every malformed or unsupported field,
every tensor of the wrong shape and every shard path out of the model directory is a
project error that names the file and the field, tensor or path."""

import json
import os

import numpy as np
import pytest

from einsummable.errors import CheckpointError, ConfigError
from einsummable.models.llama import init_params, safetensors_io, weights
from einsummable.models.llama.config import LlamaConfig, RopeScaling

transformers = pytest.importorskip("transformers")

TINY = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=44, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2)


def hf_config(**changes):
    """A config.json as transformers writes it, with ``changes`` (None deletes a field)."""
    base = transformers.LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=44, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2).to_dict()
    base = json.loads(json.dumps(base))  # as it comes back from the file
    for k, v in changes.items():
        if v is None:
            base.pop(k, None)
        else:
            base[k] = v
    return base


def write_config(tmp_path, config):
    path = tmp_path / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return path


def test_a_transformers_config_reads_with_its_defaults(tmp_path):
    path = write_config(tmp_path, hf_config(num_key_value_heads=None, rms_norm_eps=None, head_dim=None))
    cfg = weights.load_config(tmp_path)
    assert (cfg.num_key_value_heads, cfg.rms_norm_eps, cfg.head_dim) == (4, 1e-6, 8)  # transformers' defaults
    hf = transformers.LlamaConfig.from_json_file(path)
    assert (hf.num_key_value_heads, hf.rms_norm_eps, hf.head_dim) == (4, 1e-6, 8)


MALFORMED = {  # the cases first: what today escapes as a raw exception or is accepted
    "size as a string": (dict(hidden_size="16"), "hidden_size"),
    "no kv heads": (dict(num_key_value_heads=0), "num_key_value_heads"),
    "negative layers": (dict(num_hidden_layers=-1), "num_hidden_layers"),
    "unknown key": (dict(sliding_window=4096), "sliding_window"),
    "quantized": (dict(quantization_config={"quant_method": "gptq", "bits": 4}), "quantization_config"),
    "fractional heads": (dict(num_attention_heads=4.5), "num_attention_heads"),
    "bool size": (dict(vocab_size=True), "vocab_size"),
    "negative eps": (dict(rms_norm_eps=-1e-5), "rms_norm_eps"),
    "missing vocab": (dict(vocab_size=None), "vocab_size"),
    "heads not a multiple": (dict(num_key_value_heads=3), "num_key_value_heads"),
    "odd head_dim": (dict(head_dim=7), "head_dim"),
    "tie as a string": (dict(tie_word_embeddings="yes"), "tie_word_embeddings"),
    "bias as a number": (dict(attention_bias=1), "attention_bias"),
    # fields whose values change the maths in ways this Llama does not implement
    "gelu": (dict(hidden_act="gelu"), "hidden_act"),
    "not a llama": (dict(model_type="mistral"), "model_type"),
    "another head": (dict(architectures=["LlamaForSequenceClassification"]), "architectures"),
    "dropout": (dict(attention_dropout=0.1), "attention_dropout"),
    "partial rotary": (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    "rope yarn": (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}), "'yarn'"),
    "rope dynamic": (dict(rope_parameters=None, rope_scaling={"type": "dynamic", "factor": 2.0}),
                     "'dynamic'"),
    "rope longrope": (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}), "'longrope'"),
    "rope partial": (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                           "partial_rotary_factor": 0.5}), "partial_rotary_factor"),
    "rope unknown field": (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4,
                                                 "attention_factor": 2.0}), "attention_factor"),
    "llama3 incomplete": (dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}),
                          "low_freq_factor"),
    "llama3 factors crossed": (dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4,
                                                     "low_freq_factor": 4.0, "high_freq_factor": 1.0}),
                               "low_freq_factor"),
    "negative scaling factor": (dict(rope_parameters={"rope_type": "linear", "factor": -2.0,
                                                      "rope_theta": 1e4}), "factor"),
    "two thetas": (dict(rope_theta=500000.0), "rope_theta"),
    "two rope types": (dict(rope_parameters={"rope_type": "linear", "type": "llama3", "factor": 2.0}),
                       "'linear' and type 'llama3'"),
    "rope not an object": (dict(rope_parameters="linear"), "rope_scaling"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_or_unsupported_fields_name_the_file_and_the_field(tmp_path, case):
    changes, field = MALFORMED[case]
    path = write_config(tmp_path, hf_config(**changes))
    with pytest.raises(ConfigError, match=field) as err:
        weights.load_config(tmp_path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("text", ["{not json", '{"a": ' * 100_000, "[1, 2]", '"llama"', "\xff\xfe"])
def test_a_config_that_is_not_a_json_object(tmp_path, text):
    path = write_config(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        weights.load_config(tmp_path)
    assert str(path) in str(err.value)


def test_configs_built_in_code_are_checked_too():
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        LlamaConfig(num_key_value_heads=0)
    with pytest.raises(ConfigError, match="'mean'"):
        RopeScaling("mean", 2.0)
    cfg = LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    assert cfg.rope_scaling == RopeScaling("linear", 2.0)  # as dataclasses.asdict gives it back


# ------------------------------------------------------------ tensors


def checkpoint(tmp_path, cfg=TINY):
    weights.save(tmp_path, cfg, init_params(cfg, seed=0))
    return {k: np.array(v) for k, v in safetensors_io.load(tmp_path / "model.safetensors").items()}


def test_a_transposed_tensor_is_refused(tmp_path):
    tensors = checkpoint(tmp_path)
    name = "model.layers.1.mlp.down_proj.weight"  # [32, 44]: its transpose has as many elements
    tensors[name] = tensors[name].T.copy()
    safetensors_io.save(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=rf"{name}.*\(44, 32\).*\(32, 44\)"):
        weights.load(tmp_path)


def test_an_unexpected_tensor_is_refused_by_name(tmp_path):
    tensors = checkpoint(tmp_path)
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(32, np.float32)  # config says no bias
    safetensors_io.save(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="q_proj.bias"):
        weights.load(tmp_path)


def test_loaded_parameters_are_writable_copies(tmp_path):
    checkpoint(tmp_path)
    _, params = weights.load(tmp_path)
    params["model.norm.weight"] += 1.0  # the file's tensors are read-only maps; these are not
    _, again = weights.load(tmp_path)
    np.testing.assert_array_equal(again["model.norm.weight"], params["model.norm.weight"] - 1.0)


# ------------------------------------------------------------ shard indexes


def sharded(tmp_path, files=None):
    """A checkpoint in two shards; ``files`` maps shard names to where they really go."""
    model_dir = tmp_path / "model"
    tensors = checkpoint(model_dir)
    (model_dir / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    parts = {"model-00001-of-00002.safetensors": names[:half],
             "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for shard, part in parts.items():
        target = (files or {}).get(shard, shard)
        dest = model_dir / target if not os.path.isabs(target) else target
        safetensors_io.save({n: tensors[n] for n in part}, dest)
        weight_map |= dict.fromkeys(part, target)
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return model_dir


def test_a_sharded_checkpoint_loads_as_the_single_file(tmp_path):
    single = tmp_path / "single"
    checkpoint(single)
    _, want = weights.load(single)
    _, got = weights.load(sharded(tmp_path))
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w)


@pytest.mark.parametrize("shard", ["/etc/passwd", "/dev/zero", "../outside.safetensors", "sub/../../x"])
def test_a_shard_outside_the_model_directory_is_refused(tmp_path, shard):
    model_dir = sharded(tmp_path, {"model-00002-of-00002.safetensors": "../outside.safetensors"})
    index = model_dir / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    index.write_text(json.dumps({"weight_map": {k: shard if v.startswith("..") else v
                                                for k, v in weight_map.items()}}))
    with pytest.raises(CheckpointError, match="outside the model directory") as err:
        weights.load(model_dir)
    assert shard in str(err.value)


def test_a_symlink_out_of_the_model_directory_is_refused(tmp_path):
    model_dir = sharded(tmp_path)
    shard = model_dir / "model-00002-of-00002.safetensors"
    shard.rename(tmp_path / "elsewhere.safetensors")
    shard.symlink_to(tmp_path / "elsewhere.safetensors")
    with pytest.raises(CheckpointError, match="outside the model directory"):
        weights.load(model_dir)


def test_a_hub_snapshot_links_its_shards_into_blobs(tmp_path):
    """huggingface_hub's cache: snapshots/<rev>/<file> -> ../../blobs/<hash>, which loads."""
    model_dir = sharded(tmp_path / "models--x--tiny" / "snapshots")
    snapshot = model_dir.rename(model_dir.parent / "abc123")
    blobs = tmp_path / "models--x--tiny" / "blobs"
    blobs.mkdir()
    for k, f in enumerate(sorted(snapshot.iterdir())):
        f.rename(blobs / f"blob{k}")
        f.symlink_to(os.path.relpath(blobs / f"blob{k}", snapshot))
    _, params = weights.load(snapshot)
    assert set(params) == set(TINY.parameter_shapes())


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    model_dir = sharded(tmp_path)
    first, second = (model_dir / f"model-0000{k}-of-00002.safetensors" for k in (1, 2))
    tensors = {k: np.array(v) for k, v in safetensors_io.load(second).items()}
    dup = sorted(safetensors_io.load(first))[0]
    safetensors_io.save(tensors | {dup: np.array(safetensors_io.load(first)[dup])}, second)
    with pytest.raises(CheckpointError, match="two shards"):
        weights.load(model_dir)


@pytest.mark.parametrize("text", ["{", '{"weight_map": [1]}', '{"metadata": {}}', '{"weight_map": {"a": 3}}'])
def test_a_malformed_index_is_refused(tmp_path, text):
    model_dir = sharded(tmp_path)
    (model_dir / "model.safetensors.index.json").write_text(text)
    with pytest.raises(CheckpointError, match="index.json"):
        weights.load(model_dir)
