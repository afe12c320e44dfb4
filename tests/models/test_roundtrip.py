"""A faithful round trip: a transformers model with its own tokenizer, fine-tuned here,
saved, and loaded back in transformers with the same tokenizer and special-token ids."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from test_llama import logits_program  # noqa: E402

from einsummable import cli  # noqa: E402
from einsummable.errors import CheckpointError  # noqa: E402
from einsummable.models.llama import tokenizer as tok_mod  # noqa: E402
from einsummable.models.llama import weights  # noqa: E402
from einsummable.models.llama.model import LlamaConfig, init_params  # noqa: E402
from einsummable.train.trainer import TrainConfig, Trainer  # noqa: E402

TEXT = ("the quick brown fox jumps over the lazy dog. " * 20
        + "a stitch in time saves nine. " * 20).split(". ")
TEMPLATE = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)


def hf_model_with_tokenizer(path):
    """A BPE tokenizer trained here, saved the Hugging Face way, beside a tiny random Llama."""
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=80, special_tokens=["<pad>", "<s>", "</s>",
                                                                                       "<unk>"]))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                                eos_token="</s>", unk_token="<unk>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(path)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=44,
                                   num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, **IDS)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return tok


def test_fine_tune_save_and_reload_in_transformers_keeps_tokenizer_and_ids(tmp_path):
    tok = hf_model_with_tokenizer(tmp_path / "base")
    data = np.array(tok.encode(" ".join(TEXT)).ids)
    cfg, params = weights.load(tmp_path / "base")
    trainer = Trainer(cfg, params, TrainConfig(batch=2, seq=8, steps=2, warmup=1), data, engine="reference",
                      tokenizer=tmp_path / "base")
    trainer.fit()
    trainer.save(tmp_path / "tuned")
    tuned = trainer.params
    assert any(not np.array_equal(tuned[n], params[n]) for n in params)  # it did train

    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "tuned").eval()
    for key, value in IDS.items():
        assert getattr(reloaded.config, key) == value, key
    ids = np.array([tok.encode("the lazy dog saves nine").ids])
    ours = logits_program(cfg, 1, ids.shape[1]).run(tuned | {"ids": ids.astype(np.float32)})["logits"]
    with torch.no_grad():
        theirs = reloaded(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)

    base_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "base")
    tuned_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "tuned")
    text = "the quick fox saves time"
    assert tuned_tok(text)["input_ids"] == base_tok(text)["input_ids"] == tok.encode(text).ids
    assert (tuned_tok.bos_token_id, tuned_tok.eos_token_id, tuned_tok.pad_token_id) == (1, 2, 0)
    assert tuned_tok.chat_template == TEMPLATE
    ours_tok = tok_mod.load(tmp_path / "tuned")
    assert ours_tok.encode(text) == tok.encode(text).ids and ours_tok.eos_id == 2

    resumed = Trainer.resume(tmp_path / "tuned", data, steps=3, engine="reference")
    resumed.fit()
    resumed.save(tmp_path / "tuned")  # a resumed run keeps writing them
    assert json.loads((tmp_path / "tuned" / "config.json").read_text())["eos_token_id"] == 2
    saved, base = (tmp_path / d / "tokenizer.json" for d in ("tuned", "base"))
    assert saved.read_bytes() == base.read_bytes()


def test_weights_save_with_a_tokenizer_source_and_generate_refuses_none(tmp_path, capsys):
    hf_model_with_tokenizer(tmp_path / "base")
    cfg, params = weights.load(tmp_path / "base")
    weights.save(tmp_path / "bare", cfg, params)
    with pytest.raises(CheckpointError, match="has no tokenizer"):
        tok_mod.load(tmp_path / "bare")
    assert cli.main(["generate", "--model", str(tmp_path / "bare"), "--prompt", "the", "--engine",
                     "reference"]) == 2
    assert "has no tokenizer" in capsys.readouterr().err
    weights.save(tmp_path / "full", cfg, params, tokenizer=tmp_path / "base")
    assert cli.main(["generate", "--model", str(tmp_path / "full"), "--prompt", "the quick",
                     "--max-new-tokens", "3", "--engine", "reference"]) == 0
    assert capsys.readouterr().out.startswith("the quick")
    assert transformers.AutoConfig.from_pretrained(tmp_path / "full").eos_token_id == 2


def test_byte_level_models_say_so_and_a_bad_marker_is_named(tmp_path):
    tiny = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    weights.save(tmp_path / "b", tiny, init_params(tiny, seed=0), tokenizer="bytes")
    tok = tok_mod.load(tmp_path / "b")
    assert isinstance(tok, tok_mod.ByteTokenizer) and tok.decode(tok.encode("héllo")) == "héllo"
    (tmp_path / "b" / tok_mod.BYTE_MARKER).write_text('{"type": "words"}')
    with pytest.raises(CheckpointError, match="einsummable_tokenizer.json.*bytes"):
        tok_mod.load(tmp_path / "b")


def test_sentencepiece_model_travels_with_the_weights(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    (tmp_path / "corpus.txt").write_text("\n".join(TEXT))
    spm.SentencePieceTrainer.train(input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "sp"),
                                   vocab_size=40, model_type="bpe")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "tokenizer.model").write_bytes((tmp_path / "sp.model").read_bytes())
    tiny = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    weights.save(tmp_path / "saved", tiny, init_params(tiny, seed=0), tokenizer=tmp_path / "base")
    want = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    got = tok_mod.load(tmp_path / "saved")
    assert got.encode("the lazy dog") == want.encode("the lazy dog") and got.eos_id == want.eos_id()
