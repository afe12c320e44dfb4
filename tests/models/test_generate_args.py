"""What ``Model`` and ``Generator`` accept (issue 30 items 4, 7, 12): the model owns its
weights, a prompt is one sequence or a batch of them, and every sampling argument is
checked, by one function, at every entry point (the CLI's ``generate`` included)."""

import dataclasses
import math
import re

import numpy as np
import pytest

from einsummable import cli
from einsummable.errors import FeedError, ShapeError
from einsummable.models.llama import Model, weights
from einsummable.models.llama.generate import Generator
from einsummable.models.llama.model import LlamaConfig, init_params

CFG = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1)
IDS = np.array([[1, 2, 3, 4]])


@pytest.fixture(scope="module")
def model():
    return Model(CFG, seed=0, engine="reference")


def test_the_model_copies_the_callers_weights(tmp_path):
    """Changing the caller's arrays later changes neither the logits nor the saved weights.
    Oracle: a model built from a copy taken before the change."""
    params = init_params(CFG, seed=1)
    kept = {name: w.copy() for name, w in params.items()}
    m = Model(CFG, params, engine="reference")
    first = m(IDS)
    params["lm_head.weight"] *= 3.0
    params["model.norm.weight"][:] = 0.0
    np.testing.assert_array_equal(m(IDS), first)
    np.testing.assert_array_equal(Model(CFG, kept, engine="reference")(IDS), first)
    m.save(tmp_path / "m")
    _, saved = weights.load(tmp_path / "m")
    for name, w in kept.items():
        np.testing.assert_array_equal(saved[name], w, err_msg=name)
    with pytest.raises(ValueError, match="read-only"):  # the model's own copies cannot drift either
        m.params["lm_head.weight"][0, 0] = 1.0


def test_loading_from_disk_makes_no_second_copy(tmp_path, monkeypatch):
    """from_pretrained's arrays are fresh already: the model keeps them, not a copy of them."""
    weights.save(tmp_path / "m", CFG, init_params(CFG, seed=1))
    loaded = {}
    load = weights.load

    def spy(path, dtype="f32"):
        cfg, params = load(path, dtype)
        loaded.update(params)
        return cfg, params

    monkeypatch.setattr(weights, "load", spy)
    m = Model.from_pretrained(tmp_path / "m")
    assert loaded and all(np.shares_memory(m.params[n], w) for n, w in loaded.items())


def test_bf16_weights_are_converted_with_one_copy():
    params = init_params(CFG, seed=1)
    m = Model(CFG, params, dtype="bf16")
    assert m.params["lm_head.weight"].dtype.name == "bfloat16"
    assert not np.shares_memory(m.params["lm_head.weight"], params["lm_head.weight"])


@pytest.mark.parametrize("prompt", [
    [[[1, 2], [3, 4]]],                     # 3-D nested lists: was flattened into [1, 2, 3, 4]
    np.ones((1, 2, 2), np.int64),           # 3-D array
    [[1, 2], [[3, 4]]],                     # a batch whose second row is 2-D
    7,                                      # a bare id, no sequence
], ids=["3d-lists", "3d-array", "nested-row", "scalar"])
def test_a_prompt_is_one_sequence_or_a_batch(model, prompt):
    with pytest.raises(ShapeError, match=r"prompt .*shape .*expected \[seq\] or \[batch, seq\]"):
        model.generate(prompt, max_new_tokens=1)


def test_ragged_and_array_prompts_still_generate(model):
    one = model.generate([1, 2, 3], max_new_tokens=2)
    rows = model.generate([[1, 2, 3], [4, 5]], max_new_tokens=2)
    assert one == rows[0] and len(rows[1]) == 4
    assert model.generate(np.array([[1, 2, 3]]), max_new_tokens=2) == [one]
    assert model.generate(np.array([1, 2, 3]), max_new_tokens=2) == one


BAD = [  # (argument, value, what the message must say about the accepted range)
    ("max_new_tokens", 0, "an integer >= 1"),
    ("max_new_tokens", -3, "an integer >= 1"),
    ("max_new_tokens", 2.0, "an integer >= 1"),
    ("max_new_tokens", True, "an integer >= 1"),
    ("temperature", math.nan, "a finite number >= 0"),
    ("temperature", -1.0, "a finite number >= 0"),
    ("temperature", math.inf, "a finite number >= 0"),
    ("temperature", "hot", "a finite number >= 0"),
    ("top_p", 0.0, "a number in \\(0, 1\\]"),
    ("top_p", -0.5, "a number in \\(0, 1\\]"),
    ("top_p", 1.5, "a number in \\(0, 1\\]"),
    ("top_p", math.nan, "a number in \\(0, 1\\]"),
    ("top_p", "0.9", "a number in \\(0, 1\\]"),
    ("stop_tokens", 5, "a list of token ids \\(integers >= 0\\)"),
    ("stop_tokens", "ab", "a list of token ids \\(integers >= 0\\)"),
    ("stop_tokens", [1.5], "a list of token ids \\(integers >= 0\\)"),
    ("stop_tokens", [-1], "a list of token ids \\(integers >= 0\\)"),
    ("seed", -1, "an integer >= 0"),
    ("seed", 1.5, "an integer >= 0"),
    ("seed", "x", "an integer >= 0"),
]


def _kwargs(name, value):
    kw = {"max_new_tokens": 2, name: value}
    if name in ("top_p", "seed"):  # sampling, so that today's code would reach numpy with them
        kw.setdefault("temperature", 0.7)
    return kw


@pytest.mark.parametrize(("name", "value", "expected"), BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_bad_sampling_arguments_are_named_in_model_generate(model, name, value, expected):
    with pytest.raises(FeedError, match=rf"{name} must be {expected}, got {re.escape(repr(value))}"):
        model.generate([1, 2, 3], **_kwargs(name, value))


@pytest.mark.parametrize(("name", "value", "expected"), BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_bad_sampling_arguments_are_named_in_generator(model, name, value, expected):
    gen = Generator(CFG, model.params, engine="reference")
    kw = _kwargs(name, value)
    with pytest.raises(FeedError, match=rf"{name} must be {expected}, got {re.escape(repr(value))}"):
        gen.generate([[1, 2, 3]], kw.pop("max_new_tokens"), **kw)


def test_edge_values_are_accepted(model):
    gen = Generator(CFG, model.params, engine="reference")
    greedy = gen.generate([[1, 2, 3]], 2)
    assert gen.generate([[1, 2, 3]], np.int64(2), temperature=np.float32(0.0), top_p=1.0, seed=np.int64(0),
                        stop_tokens=np.array([63])) == greedy
    sampled = gen.generate([[1, 2, 3]], 3, temperature=1e-3, top_p=1e-9, seed=0)  # the argmax alone
    assert sampled[0][:2] == greedy[0]


def test_cli_generate_refuses_what_the_api_refuses(tmp_path, capsys):
    cfg = dataclasses.replace(CFG, vocab_size=256)  # the byte tokenizer's
    weights.save(tmp_path / "m", cfg, init_params(cfg, seed=0), tokenizer="bytes")
    base = ["generate", "--model", str(tmp_path / "m"), "--prompt", "ab", "--engine", "reference"]
    assert cli.main([*base, "--max-new-tokens", "0"]) == 2
    assert "argument --max-new-tokens: expected an integer >= 1, got 0" in capsys.readouterr().err
    assert cli.main([*base, "--top-p", "0"]) == 2
    assert "argument --top-p: expected a number in (0, 1], got 0" in capsys.readouterr().err
