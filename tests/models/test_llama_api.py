"""``llama.Model``, the Hugging Face-like surface (issue 20 item 12): logits, generation and
saving, each against transformers on a tiny random Llama."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_roundtrip import hf_model_with_tokenizer  # noqa: E402

from einsummable.errors import CheckpointError, ConfigError, FeedError  # noqa: E402
from einsummable.models.llama import Model, init_params  # noqa: E402
from einsummable.models.llama.model import LlamaConfig  # noqa: E402

CONFIG = dict(vocab_size=61, hidden_size=32, intermediate_size=44, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0)


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """A tiny random transformers Llama, saved, and the directory it is in."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    path = tmp_path_factory.mktemp("hf") / "llama"
    model.save_pretrained(path)
    return model, path


def _theirs(model, ids):
    with torch.no_grad():
        return model(torch.tensor(np.asarray(ids))).logits.numpy()


def test_from_pretrained_logits_match_transformers(hf):
    theirs, path = hf
    model = Model.from_pretrained(path)
    ids = np.random.default_rng(1).integers(0, 61, (2, 9))
    got = model(ids)
    assert got.shape == (2, 9, 61) and got.dtype == np.float32
    np.testing.assert_allclose(got, _theirs(theirs, ids), atol=1e-4, rtol=1e-4)
    one = model(ids[1].tolist())  # one sequence as a list: [seq, vocab]
    np.testing.assert_allclose(one, _theirs(theirs, ids[1:])[0], atol=1e-4, rtol=1e-4)


def test_generate_greedy_matches_transformers(hf):
    theirs, path = hf
    model = Model.from_pretrained(path)
    prompt = [5, 17, 3, 42]
    with torch.no_grad():
        ref = theirs.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, top_p=None,
                              top_k=None, temperature=None)[0].tolist()
    assert model.generate(prompt, max_new_tokens=6) == ref  # the prompt included, as transformers returns
    rows = model.generate([prompt, prompt[:2]], max_new_tokens=6)
    assert rows[0] == ref and rows[1][:2] == prompt[:2] and len(rows) == 2


def test_random_model_saves_a_checkpoint_transformers_loads(tmp_path):
    cfg = LlamaConfig(**CONFIG)
    model = Model(cfg, seed=3)
    for name, w in init_params(cfg, seed=3).items():
        np.testing.assert_array_equal(model.params[name], w)
    model.save(tmp_path / "saved")
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "saved").eval()
    ids = np.random.default_rng(2).integers(0, 61, (1, 7))
    np.testing.assert_allclose(model(ids), _theirs(reloaded, ids), atol=1e-4, rtol=1e-4)
    again = Model.from_pretrained(tmp_path / "saved")
    np.testing.assert_array_equal(again(ids), model(ids))


def test_text_generation_with_the_checkpoints_tokenizer_and_save_keeps_it(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tok = hf_model_with_tokenizer(tmp_path / "base")
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "base").eval()
    model = Model.from_pretrained(tmp_path / "base")
    prompt = "the quick brown fox"
    ids = tok.encode(prompt).ids
    with torch.no_grad():
        ref = theirs.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False, top_p=None, top_k=None,
                              temperature=None)[0].tolist()
    assert model.generate(prompt, max_new_tokens=5) == tok.decode(ref)
    model.save(tmp_path / "copy")
    assert tokenizers.Tokenizer.from_file(str(tmp_path / "copy" / "tokenizer.json")).encode(prompt).ids == ids
    assert Model.from_pretrained(tmp_path / "copy").generate(prompt, max_new_tokens=5) == tok.decode(ref)


def test_byte_level_model_round_trips_text(tmp_path):
    model = Model("tiny", seed=1, tokenizer="bytes")
    text = model.generate("héllo", max_new_tokens=4)
    new = model.generate(list("héllo".encode()), max_new_tokens=4)
    assert new[:6] == list("héllo".encode()) and len(new) == 10
    assert text == bytes(new).decode("utf-8", errors="replace")  # the same tokens, decoded as UTF-8
    model.save(tmp_path / "m")
    assert Model.from_pretrained(tmp_path / "m").generate("héllo", max_new_tokens=4) == text


def test_bad_input_says_what_is_wrong():
    model = Model("tiny")
    with pytest.raises(FeedError, match=r"outside the vocabulary 0\.\.255"):
        model([[1, 256]])
    with pytest.raises(FeedError, match="integers"):
        model(np.array([[0.5, 1.0]]))
    with pytest.raises(FeedError, match="rectangular"):
        model([[1, 2], [3]])
    with pytest.raises(FeedError, match="max_new_tokens"):
        model.generate([1, 2], max_new_tokens=0)
    with pytest.raises(CheckpointError, match="no tokenizer"):
        model.generate("text")
    with pytest.raises(ConfigError, match="unknown model preset 'llama-1b'"):
        Model("llama-1b")
    with pytest.raises(CheckpointError, match="missing"):
        Model("tiny", params={})


def test_bf16_weights_give_float32_logits_within_transformers_bf16_error(hf):
    theirs, path = hf
    model = Model.from_pretrained(path, dtype="bf16")
    assert {w.dtype.name for w in model.params.values()} == {"bfloat16"}
    ids = np.random.default_rng(4).integers(0, 61, (2, 8))
    exact = _theirs(theirs, ids).astype(np.float64)
    half = transformers.LlamaForCausalLM(theirs.config).eval()
    half.load_state_dict(theirs.state_dict())
    with torch.no_grad():
        rounded = half.to(torch.bfloat16)(torch.tensor(ids)).logits.double().numpy()
    got = model(ids)
    assert got.dtype == np.float32
    budget = np.linalg.norm(rounded - exact) / np.linalg.norm(exact)  # transformers' own bf16 error
    assert 0 < budget < 0.05 and np.linalg.norm(got - exact) / np.linalg.norm(exact) <= 2 * budget


def _fed(w):
    """How many blocks a fed weight is, read as it is fed (a given-up feed lets go of them)."""
    from einsummable.engines.blocks import Blocks
    return len(w.blocks) if isinstance(w, Blocks) else 0


def test_calls_read_the_weights_where_the_first_call_left_them(monkeypatch):
    """The driver feeds the weights once; later calls (any shape) read the blocks left on the
    workers (on Ray: no model through the driver per call). Oracle: what the engine is handed."""
    from einsummable.compile import Program

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    model = Model(cfg, workers=2)
    fed: list[object] = []
    execute = Program.execute
    monkeypatch.setattr(Program, "execute", lambda prog, arrays, variables, carry=frozenset():
                        fed.append(_fed(arrays["lm_head.weight"])) or execute(prog, arrays, variables, carry))
    first = model([[1, 2, 3]])
    model([[4, 5]])
    again = model([[1, 2, 3]])
    # the first call: the session's copy of the array, given up whole; then the blocks left
    assert fed[0] == 1 and all(n >= 1 for n in fed[1:]) and len(fed) == 3
    np.testing.assert_array_equal(again, first)
