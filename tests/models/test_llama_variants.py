"""Llama variants whose config fields change the maths, against transformers:
RoPE scaling (``linear``, ``llama3``) and the attention and MLP biases."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch_oracle import check_loss_gradients  # noqa: E402

import einsummable as es  # noqa: E402
from einsummable.models.llama import model as llama  # noqa: E402
from einsummable.models.llama import weights  # noqa: E402
from einsummable.models.llama.generate import Generator  # noqa: E402

SEQ = 24  # long enough that the scaled low frequencies turn the logits by more than 1e-4
# head_dim 16, theta 1e4: wavelengths 6.3, 20, 63, 199, 628, ... For llama3 with old = 256,
# high = 8, low = 1: the first two are kept, 63 and 199 are blended, the rest divided.
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 8.0,
          "original_max_position_embeddings": 256}
VARIANTS = {
    "rope-linear": dict(rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "rope-llama3": dict(rope_scaling=LLAMA3),
    "attention-bias": dict(attention_bias=True),
    "mlp-bias": dict(mlp_bias=True),
    "both-biases-llama3": dict(attention_bias=True, mlp_bias=True, rope_scaling=LLAMA3),
}


def hf_model(tmp_path, name, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=61, hidden_size=64, intermediate_size=44, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                                   rope_theta=10000.0, **VARIANTS[name])
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # transformers starts biases at 0, where they would test nothing
        for n, w in model.named_parameters():
            if n.endswith(".bias"):
                w.normal_(0.0, 0.5)
    path = tmp_path / name
    model.save_pretrained(path)
    return model, path


def logits(cfg, params, tokens, engine="reference", workers=None):
    g = es.Graph()
    p = llama.parameters(g, cfg)
    ids = g.input("ids", tokens.shape)
    pos = g.ramp(tokens.shape, steps=(0.0, 1.0))
    g.output("logits", llama.forward(cfg, p, ids, pos, None))
    prog = es.compile(g, engine=engine, workers=workers)
    return prog.run(params | {"ids": tokens.astype(np.float32)})["logits"]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_transformers(tmp_path, name):
    model, path = hf_model(tmp_path, name)
    cfg, params = weights.load(path)
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, SEQ))
    got = logits(cfg, params, tokens, engine="local", workers=2)
    with torch.no_grad():
        ref = model(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)


def test_llama3_frequencies_equal_transformers():
    """The scaled inverse frequencies themselves, over a real Llama 3.1 setting."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = transformers.LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_theta=500000.0,
                                  max_position_embeddings=131072,
                                  rope_scaling=LLAMA3 | {"high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 8192})
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    cfg = llama.LlamaConfig.from_hf(hf.to_dict())
    g = es.Graph()
    freq = g.ramp((cfg.head_dim // 2,), steps=(1.0,))
    g.output("f", es.elementwise(llama.inverse_frequency(cfg), freq))
    got = es.compile(g, engine="reference").run({})["f"]
    assert (ref.numpy() != ref.numpy().max() / 8).any()  # all three regions are present
    np.testing.assert_allclose(got, ref.numpy(), rtol=2e-5)


def test_generation_with_biases_and_scaling_matches_transformers(tmp_path):
    model, path = hf_model(tmp_path, "both-biases-llama3")
    cfg, params = weights.load(path)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [3]]
    ours = Generator(cfg, params, engine="reference").generate(prompts, 6)
    for prompt, got in zip(prompts, ours, strict=True):
        with torch.no_grad():
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
        assert got == ref[0, len(prompt) :].tolist()


def test_bias_gradients_match_transformers(tmp_path):
    model, path = hf_model(tmp_path, "both-biases-llama3")
    cfg, params = weights.load(path)
    names = check_loss_gradients(model, cfg, params, lambda n: n.endswith(".bias"), engine="reference")
    assert len(names) == 7 * cfg.num_hidden_layers


def test_saved_variant_loads_back_in_transformers(tmp_path):
    _, path = hf_model(tmp_path, "both-biases-llama3")
    cfg, params = weights.load(path)
    rng = np.random.default_rng(3)
    changed = {n: (w + 0.05 * rng.standard_normal(w.shape)).astype(np.float32) for n, w in params.items()}
    weights.save(tmp_path / "ours", cfg, changed)
    assert weights.load_config(tmp_path / "ours") == cfg
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ours").eval()
    tokens = rng.integers(0, cfg.vocab_size, (1, SEQ))
    with torch.no_grad():
        theirs = reloaded(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(logits(cfg, changed, tokens), theirs, atol=1e-4)
