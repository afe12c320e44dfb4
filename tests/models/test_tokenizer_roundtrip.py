"""The round trip from the command line, for both tokenizer kinds a Llama ships: a transformers
model with a ``tokenizer.json`` (trained here with ``tokenizers``) or a sentencepiece
``tokenizer.model`` (trained here with ``sentencepiece``) is fine-tuned by ``einsummable
train --model``, and loads back in transformers with the same logits, tokenizer and ids."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_llama import logits_program  # noqa: E402
from test_roundtrip import TEXT, hf_model_with_tokenizer  # noqa: E402

from einsummable import cli  # noqa: E402
from einsummable.models.llama import tokenizer as tok_mod  # noqa: E402
from einsummable.models.llama import weights  # noqa: E402

SP_IDS = dict(unk_token_id=0, bos_token_id=1, eos_token_id=2, pad_token_id=3)


def hf_model_with_sentencepiece(path, tmp_path):
    """A sentencepiece BPE model trained here as tokenizer.model (with the tokenizer_config.json
    transformers reads it by), beside a tiny random Llama."""
    spm = pytest.importorskip("sentencepiece")
    (tmp_path / "corpus.txt").write_text("\n".join(TEXT))
    spm.SentencePieceTrainer.train(input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "sp"),
                                   vocab_size=40, model_type="bpe", unk_id=0, bos_id=1, eos_id=2, pad_id=3,
                                   minloglevel=2)
    path.mkdir()
    (path / "tokenizer.model").write_bytes((tmp_path / "sp.model").read_bytes())
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>"}))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=44, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   **{k: v for k, v in SP_IDS.items() if k != "unk_token_id"})
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return spm.SentencePieceProcessor(model_file=str(path / "tokenizer.model"))


@pytest.mark.parametrize("kind", ["tokenizer.json", "tokenizer.model"])
def test_cli_fine_tune_round_trips_through_transformers(tmp_path, kind):
    if kind == "tokenizer.json":
        pytest.importorskip("tokenizers")
        tok = hf_model_with_tokenizer(tmp_path / "base")
        encode = lambda text: tok.encode(text).ids  # noqa: E731
        ids = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    else:
        sp = hf_model_with_sentencepiece(tmp_path / "base", tmp_path)
        encode = sp.encode
        ids = {k: v for k, v in SP_IDS.items() if k != "unk_token_id"}
    (tmp_path / "data.txt").write_text(". ".join(TEXT))
    assert cli.main(["train", "--model", str(tmp_path / "base"), "--data", str(tmp_path / "data.txt"),
                     "--steps", "2", "--batch", "2", "--seq", "8", "--out", str(tmp_path / "tuned"),
                     "--engine", "reference"]) == 0
    assert (tmp_path / "tuned" / kind).read_bytes() == (tmp_path / "base" / kind).read_bytes()
    cfg, tuned = weights.load(tmp_path / "tuned")
    _, base = weights.load(tmp_path / "base")
    assert any(not np.array_equal(tuned[n], base[n]) for n in base)  # it did train

    text = "the lazy dog saves nine"
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "tuned").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "tuned")
    base_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "base")
    want = encode(text)
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == want
    assert hf_tok(text)["input_ids"] == base_tok(text)["input_ids"]
    assert tok_mod.load(tmp_path / "tuned").encode(text) == want
    for key, value in ids.items():
        assert getattr(reloaded.config, key) == value, key
        assert getattr(hf_tok, key) == value, key
    assert tok_mod.load(tmp_path / "tuned").eos_id == ids["eos_token_id"]

    x = np.array([want])
    ours = logits_program(cfg, 1, x.shape[1]).run(tuned | {"ids": x.astype(np.float32)})["logits"]
    with torch.no_grad():
        theirs = reloaded(torch.tensor(x)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
