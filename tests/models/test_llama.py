"""Llama against Hugging Face transformers on tiny random configurations."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch_oracle import check_loss_gradients  # noqa: E402

import einsummable as es  # noqa: E402
from einsummable.errors import CheckpointError  # noqa: E402
from einsummable.models.llama import model as llama  # noqa: E402
from einsummable.models.llama import safetensors_io, weights  # noqa: E402
from einsummable.models.llama.generate import Generator  # noqa: E402

CONFIGS = {
    "gqa-untied": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
    "mha-tied": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True),
    "mqa-untied": dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False),
}


def hf_model(tmp_path, name, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=44, num_hidden_layers=2,
                                   rms_norm_eps=1e-5, rope_theta=10000.0, **CONFIGS[name])
    model = transformers.LlamaForCausalLM(cfg).eval()
    path = tmp_path / name
    model.save_pretrained(path)
    return model, path


def logits_program(cfg, batch, seq, engine="reference", workers=None, causal_blocks=False):
    """Through an explicit causal mask, or (causal_blocks) with the masked blocks skipped."""
    g = es.Graph()
    p = llama.parameters(g, cfg)
    ids = g.input("ids", (batch, seq))
    pos = g.ramp((batch, seq), steps=(0.0, 1.0))
    mask = None if causal_blocks else llama.causal_mask(g, seq)
    g.output("logits", llama.forward(cfg, p, ids, pos, mask))
    return es.compile(g, workers=workers, engine=engine)


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(tmp_path, name, workers):
    model, path = hf_model(tmp_path, name)
    cfg, params = weights.load(path)
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 9))
    prog = logits_program(cfg, 2, 9, engine="local", workers=workers)
    got = prog.run(params | {"ids": tokens.astype(np.float32)})["logits"]
    with torch.no_grad():
        ref = model(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("query_block", [4, 2])
@pytest.mark.parametrize("workers", [1, 2])
def test_causal_blocks_match_transformers(tmp_path, monkeypatch, query_block, workers):
    monkeypatch.setattr(llama, "QUERY_BLOCK", query_block)  # 9 queries: blocks of 4, 4, 1 or of 2s
    model, path = hf_model(tmp_path, "gqa-untied")
    cfg, params = weights.load(path)
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 9))
    prog = logits_program(cfg, 2, 9, engine="local", workers=workers, causal_blocks=True)
    got = prog.run(params | {"ids": tokens.astype(np.float32)})["logits"]
    with torch.no_grad():
        ref = model(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)


def test_causal_decoder_without_a_mask_refuses_a_cache():
    cfg = llama.PRESETS["tiny"]
    g = es.Graph()
    p = llama.parameters(g, cfg)
    ids, pos = g.input("ids", (1, 1)), g.input("pos", (1, 1))
    cache = [(g.input(f"k{i}", (1, 3, 1, 2, 8)), g.input(f"v{i}", (1, 3, 1, 16))) for i in range(1)]
    with pytest.raises(es.GraphError, match="mask"):
        llama.decoder(cfg, p, ids, pos, None, cache)


@pytest.mark.parametrize("query_block", [llama.QUERY_BLOCK, 4, 2])  # 6 queries: 1, 2 or 3 blocks
@pytest.mark.parametrize("engine,workers", [("reference", None), ("local", 3)])
@pytest.mark.parametrize("name", ["gqa-untied", "mha-tied"])
def test_loss_gradients_match_transformers(tmp_path, monkeypatch, name, engine, workers, query_block):
    monkeypatch.setattr(llama, "QUERY_BLOCK", query_block)
    model, path = hf_model(tmp_path, name)
    cfg, params = weights.load(path)
    check_loss_gradients(model, cfg, params, engine=engine, workers=workers)


def test_checkpoint_saved_here_loads_in_transformers(tmp_path):
    _, path = hf_model(tmp_path, "gqa-untied")
    cfg, params = weights.load(path)
    rng = np.random.default_rng(3)
    changed = {n: (w + 0.01 * rng.standard_normal(w.shape)).astype(np.float32) for n, w in params.items()}
    weights.save(tmp_path / "ours", cfg, changed)
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ours").eval()
    tokens = rng.integers(0, cfg.vocab_size, (1, 7))
    ours = logits_program(cfg, 1, 7).run(changed | {"ids": tokens.astype(np.float32)})["logits"]
    with torch.no_grad():
        theirs = reloaded(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_generation_with_cache_equals_without_and_matches_transformers(tmp_path):
    model, path = hf_model(tmp_path, "gqa-untied")
    cfg, params = weights.load(path)
    gen = Generator(cfg, params, engine="reference")
    prompts = [[5, 6, 7, 8], [9, 10], [3]]
    cached = gen.generate(prompts, 7)
    assert cached == gen.generate(prompts, 7, use_cache=False)
    for prompt, ours in zip(prompts, cached, strict=True):
        with torch.no_grad():
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=7, do_sample=False)
        assert ours == ref[0, len(prompt) :].tolist()


def test_sampling_and_stop_tokens(tmp_path):
    _, path = hf_model(tmp_path, "mha-tied")
    cfg, params = weights.load(path)
    gen = Generator(cfg, params, engine="reference")
    a = gen.generate([[1, 2, 3]], 6, temperature=0.9, top_p=0.8, seed=5)
    assert a == gen.generate([[1, 2, 3]], 6, temperature=0.9, top_p=0.8, seed=5)
    greedy = gen.generate([[1, 2, 3]], 6)[0]
    stopped = gen.generate([[1, 2, 3]], 6, stop_tokens=[greedy[1]])[0]
    assert stopped == greedy[: greedy.index(greedy[1]) + 1]
    with pytest.raises(es.EinsummableError, match="vocabulary"):
        gen.generate([[cfg.vocab_size + 3]], 2)


def test_bf16_load(tmp_path):
    _, path = hf_model(tmp_path, "gqa-untied")
    cfg, params = weights.load(path, dtype="bf16")
    assert all(w.dtype.name == "bfloat16" for w in params.values())
    f32 = weights.load(path)[1]
    tokens = np.array([[1, 2, 3, 4]], dtype=np.float32)
    g = es.Graph()
    p = llama.parameters(g, cfg, "bf16")
    ids = g.input("ids", (1, 4))
    pos = g.ramp((1, 4), steps=(0.0, 1.0))
    mask = llama.causal_mask(g, 4)
    h, _ = llama.decoder(cfg, p, ids, pos, mask)
    g.output("logits", llama.lm_head(cfg, p, h).astype("f32"))
    got = es.compile(g, engine="reference").run(params | {"ids": tokens})["logits"]
    ref = logits_program(cfg, 1, 4).run(f32 | {"ids": tokens})["logits"]
    np.testing.assert_allclose(got, ref, atol=0.1)


def test_embedding_does_not_materialise_a_one_hot():
    cfg = llama.LlamaConfig(vocab_size=32000, hidden_size=16, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, intermediate_size=16)
    g = es.Graph()
    p = llama.parameters(g, cfg)
    ids = g.input("ids", (1, 8))
    llama.embed(ids, p["model.embed_tokens.weight"])
    tokens_by_vocab = 8 * cfg.vocab_size
    assert all(np.prod(n.shape) < tokens_by_vocab for n in g.ir.nodes[len(p):])


def test_safetensors_reader_agrees_with_the_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float64)}
    st.save_file(arrays, tmp_path / "x.safetensors")
    loaded = safetensors_io.load(tmp_path / "x.safetensors")
    for k, v in arrays.items():
        np.testing.assert_array_equal(loaded[k], v)
    safetensors_io.save(arrays, tmp_path / "y.safetensors")
    back = st.load_file(tmp_path / "y.safetensors")
    for k, v in arrays.items():
        np.testing.assert_array_equal(back[k], v)


def test_corrupt_or_mismatched_checkpoints_name_the_tensor(tmp_path):
    _, path = hf_model(tmp_path, "gqa-untied")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match="truncated"):
        weights.load(path)
    _, path = hf_model(tmp_path, "mha-tied")
    config = json.loads((path / "config.json").read_text())
    config["hidden_size"] = 48
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="model.embed_tokens.weight"):
        weights.load(path)
    (path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CheckpointError, match="JSON"):
        weights.load(path)
