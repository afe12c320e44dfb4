"""Freezing parameters and LoRA in the Trainer: frozen weights get no gradient node and
no optimizer state, stay bit-identical, and a LoRA run saves, resumes and merges."""

import json

import numpy as np
import pytest

from einsummable.errors import CheckpointError, EinsummableError
from einsummable.ir.graph import InputNode
from einsummable.models.llama import lora, weights
from einsummable.models.llama.data import corpus
from einsummable.models.llama.model import LlamaConfig, init_params
from einsummable.train.trainer import TrainConfig, Trainer

# Dimensions chosen so that no activation of a batch 3 x seq 5 step has a weight's shape:
# a node of a frozen weight's shape would be its gradient.
ODD = LlamaConfig(vocab_size=256, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
BASE = {"batch": 3, "seq": 5, "steps": 6, "lr": 1e-2, "min_lr": 1e-3, "warmup": 1}


def make(params=None, accum=1, **kw):
    cfg = TrainConfig(**(BASE | {"accum": accum} | kw))
    return Trainer(ODD, init_params(ODD, seed=1) if params is None else params, cfg, corpus(),
                   engine="reference")


def computed_shapes(trainer):
    """The shapes of the training program's computed nodes (inputs left out)."""
    return {n.shape for n in trainer.program.graph.nodes if not isinstance(n, InputNode)}


def frozen_only_shapes(trainer, names):
    """The shapes of ``names`` that no trainable parameter has: a node of such a shape would be
    the gradient of a frozen weight (the dimensions of ODD make activations differ)."""
    shapes = ODD.parameter_shapes()
    only = {shapes[n] for n in names} - {shapes.get(n) for n in trainer.trainable}
    assert only, "the names share their shapes with trainable parameters: nothing to check"
    return only


def optimizer_owners(trainer):
    return {s.name.rsplit(".", 1)[0] for s in trainer.update.state if s.name != "adam.step"}


MATRICES = [n for n, s in ODD.parameter_shapes().items() if len(s) >= 2 and "embed" not in n]


@pytest.mark.parametrize("accum", [1, 2])
def test_frozen_parameters_have_no_gradient_no_state_and_do_not_change(accum):
    params = init_params(ODD, seed=1)
    patterns = ("model.layers.0.*", r"re:model\.layers\.\d+\.mlp\.(gate|up)_proj\.weight", "lm_head.weight")
    t = make(params, accum, freeze=patterns)
    frozen = {n for n in params if n.startswith("model.layers.0.") or n == "lm_head.weight"
              or (".mlp." in n and ("gate" in n or "up" in n))}
    assert set(t.trainable) == set(params) - frozen
    assert optimizer_owners(t) == set(t.trainable)
    graph = t.micro.graph if accum > 1 else t.program.graph
    # no gradient or new state of a frozen weight; the weight itself is returned as it came in
    assert not [n for n in graph.outputs if n not in frozen and any(n.endswith(f) for f in frozen)]
    assert all(getattr(graph.nodes[graph.outputs[n]], "name", None) == n for n in frozen)
    if accum == 1:
        only = frozen_only_shapes(t, frozen & set(MATRICES))
        assert not only & computed_shapes(t)
        assert only <= computed_shapes(make(params))  # trained, they have gradients: the check can fail
    t.fit()
    after = t.params
    for name in params:
        same = np.array_equal(after[name], params[name])
        assert same == (name in frozen), name


def test_lora_trains_only_the_adapters_and_matches_the_merged_model():
    params = init_params(ODD, seed=1)
    t = make(params, lora_rank=2, lora_alpha=4.0, lora_targets=("q_proj", "v_proj", "down_proj"))
    names = set(lora.shapes(ODD, lora.LoraConfig(2, 4.0, ("q_proj", "v_proj", "down_proj"))))
    assert set(t.trainable) == names and len(names) == 3 * 2 * ODD.num_hidden_layers
    assert optimizer_owners(t) == names
    only = frozen_only_shapes(t, MATRICES)
    assert not only & computed_shapes(t)  # no gradient of a base matrix is computed
    start = t.params
    np.testing.assert_array_equal(start["model.layers.1.mlp.down_proj.lora_B.weight"], 0)  # B starts at 0
    t.fit()
    after = t.params
    for name in params:
        np.testing.assert_array_equal(after[name], params[name], err_msg=name)  # bit-identical base
    assert all(not np.array_equal(after[n], start[n]) for n in names if "lora_B" in n)
    # merged weights carry the adapters: the same loss as the adapters on the base, from a full model
    merged = lora.merge(after, t.cfg.lora)
    assert set(merged) == set(params)
    full = make(merged, steps=7)
    full.step = t.step = 6
    np.testing.assert_allclose(full.train_step(), t.train_step(), rtol=1e-5)


def test_lora_checkpoint_is_peft_s_layout_and_resumes_the_same_curve(tmp_path):
    weights.save(tmp_path / "base", ODD, init_params(ODD, seed=1), tokenizer="bytes")
    cfg, params = weights.load(tmp_path / "base")
    lora_kw = {"lora_rank": 2, "lora_targets": ("o_proj", "q_proj"),  # saved in the model's order
               "freeze": ("model.layers.1.self_attn.o_proj.lora_*",)}

    def run():
        return Trainer(cfg, params, TrainConfig(**BASE | lora_kw), corpus(), engine="reference",
                       tokenizer=tmp_path / "base", base_model=tmp_path / "base")

    straight = run().fit()
    first = run()
    first.fit(3)
    first.save(tmp_path / "ck")
    saved = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert saved == ["adapter_config.json", "adapter_model.safetensors", "einsummable_tokenizer.json",
                     "optimizer.safetensors", "trainer.json"]
    config = json.loads((tmp_path / "ck" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((tmp_path / "base").resolve())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (2, 8.0, "LORA")
    resumed = Trainer.resume(tmp_path / "ck", corpus(), engine="reference")
    assert resumed.trainable == first.trainable
    assert "model.layers.1.self_attn.o_proj.lora_A.weight" not in resumed.trainable
    np.testing.assert_allclose(first.losses + resumed.fit(), straight, rtol=1e-6)
    with pytest.raises(CheckpointError, match="holds LoRA adapters, not a model: merge them"):
        weights.load(tmp_path / "ck")
    resumed.save_merged(tmp_path / "merged")
    _, merged = weights.load(tmp_path / "merged")
    np.testing.assert_array_equal(merged["model.norm.weight"], params["model.norm.weight"])
    np.testing.assert_allclose(merged["model.layers.0.self_attn.q_proj.weight"],
                               lora.merge(resumed.params, resumed.cfg.lora)[
                                   "model.layers.0.self_attn.q_proj.weight"], rtol=1e-6)
    assert (tmp_path / "merged" / "einsummable_tokenizer.json").is_file()


@pytest.mark.parametrize(("settings", "message"), [
    ({"freeze": ("model.layers.9.*",)}, "freeze pattern 'model.layers.9.\\*' matches no parameter"),
    ({"freeze": ("re:model.(",)}, "not a regex"),
    ({"freeze": ("*",)}, "freeze every trainable parameter"),
    ({"lora_rank": 2, "freeze": ("*lora_*",)}, "freeze every trainable parameter"),
    ({"lora_rank": 2, "lora_targets": ("qkv",)}, "unknown LoRA target 'qkv'"),
    ({"lora_rank": 2, "lora_alpha": 0.0}, "lora_alpha must be a finite number > 0"),
    ({"lora_rank": -1}, "'lora_rank' must be int >= 0"),
])
def test_bad_freeze_and_lora_settings_are_named(settings, message):
    with pytest.raises(EinsummableError, match=message):
        make(**settings)


def test_lora_settings_read_back_from_json():
    cfg = TrainConfig.from_dict(BASE | {"lora_rank": 4, "lora_targets": ["q_proj", "o_proj"],
                                        "freeze": ["lm_head.weight"]}, "f")
    assert cfg.lora == lora.LoraConfig(4, 8.0, ("q_proj", "o_proj")) and cfg.freeze == ("lm_head.weight",)
    with pytest.raises(EinsummableError, match="'freeze' must be tuple"):
        TrainConfig.from_dict({"freeze": "lm_head.weight"}, "f")


@pytest.mark.parametrize("accum", [1, 2])
def test_frozen_weights_stay_on_the_workers_between_steps(accum, monkeypatch):
    """A frozen weight is no optimizer's output, so without returning it unchanged the
    session would hold the driver's array and feed it on every step (across the network on
    Ray). Oracle: what the engine is handed at each run."""
    from einsummable.compile import Program
    from einsummable.engines.blocks import Blocks
    from einsummable.engines.donation import GivenUp

    params = init_params(ODD, seed=1)
    cfg = TrainConfig(**(BASE | {"accum": accum, "steps": 2}), freeze=("lm_head.weight",))
    t = Trainer(ODD, params, cfg, corpus(), engine="local", workers=2)
    fed: list[object] = []
    execute = Program.execute

    def spy(prog, arrays, variables, carry=frozenset()):
        if "lm_head.weight" in arrays:
            w = arrays["lm_head.weight"]
            fed.append((type(w), len(w.blocks) if isinstance(w, Blocks) else 0))
        return execute(prog, arrays, variables, carry)

    monkeypatch.setattr(Program, "execute", spy)
    t.fit()
    # the first run: the session's copy of the array, given up whole; then the blocks each
    # run left on the workers, fed to the next as they lie (it hands them back unchanged, so
    # giving them up would free nothing: engines/donation.py, given_up)
    assert fed[0] == (GivenUp, 1) and len(fed) == 2 * accum
    assert all(kind is Blocks and count == fed[1][1] for kind, count in fed[1:])
    np.testing.assert_array_equal(t.params["lm_head.weight"], params["lm_head.weight"])
