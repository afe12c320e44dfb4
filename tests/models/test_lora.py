"""LoRA fine-tuning from the command line, checked against peft and transformers: the adapters
load with ``PeftModel.from_pretrained`` and give our logits, the merged model loads in
transformers and gives them too, and the base weights stay bit-identical."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
peft = pytest.importorskip("peft")

from test_roundtrip import TEXT, hf_model_with_tokenizer  # noqa: E402

import einsummable as es  # noqa: E402
from einsummable import cli  # noqa: E402
from einsummable.models.llama import lora, safetensors_io, weights  # noqa: E402
from einsummable.models.llama import model as llama  # noqa: E402


def our_logits(cfg, params, ids, adapters=None):
    g = es.Graph()
    p = llama.parameters(g, cfg, lora=adapters)
    x = g.input("ids", ids.shape)
    g.output("logits", llama.forward(cfg, p, x, g.ramp(ids.shape, steps=(0.0, 1.0)), None,
                                     lora_scale=adapters.scale if adapters else 1.0))
    return es.compile(g, engine="reference").run(params | {"ids": ids.astype(np.float32)})["logits"]


def torch_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.numpy()


def test_adapters_saved_by_peft_compute_what_peft_computes(tmp_path):
    """Every target, biases on: peft's own adapters (B made nonzero) read here give peft's logits."""
    torch.manual_seed(0)
    hf = transformers.LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=44, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, attention_bias=True)
    transformers.LlamaForCausalLM(hf).save_pretrained(tmp_path / "base")
    model = peft.get_peft_model(transformers.LlamaForCausalLM.from_pretrained(tmp_path / "base"),
                                peft.LoraConfig(r=4, lora_alpha=6, target_modules=list(lora.TARGETS)))
    with torch.no_grad():
        for name, w in model.named_parameters():
            if "lora_B" in name:
                w.normal_(0, 0.1)
    model.save_pretrained(tmp_path / "adapters")
    cfg, params = weights.load(tmp_path / "base")
    config, _ = lora.read_config(tmp_path / "adapters")
    assert config == lora.LoraConfig(4, 6, lora.TARGETS)
    adapters = lora.load(tmp_path / "adapters", cfg, config)
    ids = np.random.default_rng(0).integers(0, 61, (2, 7))
    want = torch_logits(model.eval(), ids)
    np.testing.assert_allclose(our_logits(cfg, params | adapters, ids, config), want, atol=1e-5)
    merged = lora.merge(params | adapters, config)
    np.testing.assert_allclose(our_logits(cfg, merged, ids), want, atol=1e-5)
    base = torch_logits(transformers.LlamaForCausalLM.from_pretrained(tmp_path / "base").eval(), ids)
    assert np.abs(base - want).max() > 1e-2  # the adapters matter


def tensors(path):
    return {k: np.array(v) for k, v in safetensors_io.load(path).items()}


def test_cli_lora_fine_tune_loads_back_in_peft_and_merged_in_transformers(tmp_path, capsys):
    tok = hf_model_with_tokenizer(tmp_path / "base")
    base_before = tensors(tmp_path / "base" / "model.safetensors")
    (tmp_path / "data.txt").write_text(". ".join(TEXT))
    (tmp_path / "run.json").write_text(json.dumps({"train": {"warmup": 2, "min_lr": 1e-3}}))
    args = ["train", "--model", str(tmp_path / "base"), "--data", str(tmp_path / "data.txt"),
            "--config", str(tmp_path / "run.json"), "--steps", "30", "--batch", "4", "--seq", "16",
            "--lr", "2e-2", "--lora-rank", "4", "--lora-alpha", "8", "--out", str(tmp_path / "run"),
            "--merge", str(tmp_path / "merged"), "--engine", "reference"]
    assert cli.main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "trained" in out and "LoRA adapters" in out and "merged model" in out
    losses = json.loads((tmp_path / "run" / "trainer.json").read_text())["losses"]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.1  # 4.16 -> 3.95 at this writing

    # the base is untouched: its file, and every tensor the adapters do not target in the merged model
    after = tensors(tmp_path / "base" / "model.safetensors")
    merged = tensors(tmp_path / "merged" / "model.safetensors")
    for name, w in base_before.items():
        np.testing.assert_array_equal(after[name], w, err_msg=name)
        if not name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")):
            np.testing.assert_array_equal(merged[name], w, err_msg=name)

    ids = np.array([tok.encode("the lazy dog saves nine. a quick fox").ids])
    cfg, params = weights.load(tmp_path / "base")
    config, base_dir = lora.read_config(tmp_path / "run")
    assert config == lora.LoraConfig(4, 8.0) and base_dir == str((tmp_path / "base").resolve())
    ours = our_logits(cfg, params | lora.load(tmp_path / "run", cfg, config), ids, config)
    hf_base = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "base")
    with_peft = peft.PeftModel.from_pretrained(hf_base, tmp_path / "run").eval()
    np.testing.assert_allclose(torch_logits(with_peft, ids), ours, atol=1e-4)
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "merged").eval()
    np.testing.assert_allclose(torch_logits(reloaded, ids), ours, atol=1e-4)
    untuned = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "base").eval()  # peft patched hf_base
    assert np.abs(torch_logits(untuned, ids) - ours).max() > 1e-2  # the fine-tune changed them
    merged_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "merged")
    assert merged_tok("the quick fox")["input_ids"] == tok.encode("the quick fox").ids
    assert (reloaded.config.bos_token_id, reloaded.config.eos_token_id) == (1, 2)
    assert cli.main(["generate", "--model", str(tmp_path / "merged"), "--prompt", "the quick",
                     "--max-new-tokens", "3", "--engine", "reference"]) == 0
    # a finished run resumed with --merge only merges: the same model again
    assert cli.main(["train", "--resume", str(tmp_path / "run"), "--merge", str(tmp_path / "again"),
                     "--engine", "reference"]) == 0
    again = tensors(tmp_path / "again" / "model.safetensors")
    assert again.keys() == merged.keys()
    for name, w in merged.items():
        np.testing.assert_array_equal(again[name], w, err_msg=name)


def test_cli_freeze_keeps_the_matching_weights_bit_identical(tmp_path, capsys):
    hf_model_with_tokenizer(tmp_path / "base")
    before = tensors(tmp_path / "base" / "model.safetensors")
    assert cli.main(["train", "--model", str(tmp_path / "base"), "--steps", "2", "--batch", "2", "--seq", "8",
                     "--freeze", "model.embed_tokens.weight", "--freeze", r"re:.*layernorm\.weight",
                     "--out", str(tmp_path / "run"), "--engine", "reference"]) == 0
    after = tensors(tmp_path / "run" / "model.safetensors")
    for name, w in before.items():
        frozen = name == "model.embed_tokens.weight" or name.endswith("layernorm.weight")
        assert np.array_equal(after[name], w) == frozen, name
    state = safetensors_io.load(tmp_path / "run" / "optimizer.safetensors")
    assert not [n for n in state if n.startswith("model.embed_tokens") or "layernorm" in n]
    # it resumes on the same data, tokenized by the model's tokenizer as before (else: "has changed")
    resume = ["train", "--resume", str(tmp_path / "run"), "--steps", "3", "--engine", "reference"]
    assert cli.main(resume) == 0


@pytest.mark.parametrize(("flags", "message"), [
    (["--lora-rank", "2"], "LoRA fine-tunes a pretrained model: pass it with --model"),
    (["--lora-rank", "2", "--lora-targets", "q,qkv"], "unknown LoRA target 'qkv_proj'"),
    (["--freeze", "nothing.*"], "freeze pattern 'nothing.\\*' matches no parameter"),
])
def test_cli_refuses_bad_lora_and_freeze_flags(tmp_path, capsys, flags, message):
    assert cli.main(["train", "--steps", "1", "--out", str(tmp_path / "r"), *flags]) == 2
    assert message.replace("\\", "") in capsys.readouterr().err
