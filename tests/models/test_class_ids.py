"""Class ids that are out of range or fractional are refused when fed, by value and
position, as torch refuses them; a Trainer refuses training data outside its vocabulary."""

import math

import numpy as np
import pytest

import einsummable as es
from einsummable.autodiff.remat import rematerialize
from einsummable.errors import FeedError
from einsummable.models.llama import LlamaConfig, init_params
from einsummable.models.llama import model as llama
from einsummable.train.trainer import TrainConfig, Trainer

torch = pytest.importorskip("torch")


def ce_program(rows=2, classes=4, engine="reference", workers=None):
    g = es.Graph()
    logits, targets = g.input("logits", (rows, classes)), g.input("targets", (rows,))
    g.output("loss", es.nn.cross_entropy(logits, targets))
    return es.compile(g, engine=engine, workers=workers)


@pytest.mark.parametrize("engine,workers", [("reference", None), ("local", 2)])
@pytest.mark.parametrize("targets,bad,position", [
    ([7, 2.5], "7.0", "(0,)"),       # the case: out of range first
    ([1, 2.5], "2.5", "(1,)"),       # fractional
    ([-1, 0], "-1.0", "(0,)"),
    ([0, math.nan], "nan", "(1,)"),
    ([math.inf, 0], "inf", "(0,)"),
])
def test_cross_entropy_refuses_bad_class_ids_as_torch_does(engine, workers, targets, bad, position):
    logits = np.zeros((2, 4), np.float32)
    integral = all(float(t).is_integer() for t in targets)
    with pytest.raises((IndexError, RuntimeError)):  # fractional ids are read as probabilities: bad shape
        torch.nn.functional.cross_entropy(torch.tensor(logits),
                                          torch.tensor(targets).long() if integral else torch.tensor(targets))
    prog = ce_program(engine=engine, workers=workers)
    with pytest.raises(FeedError, match=rf"'targets' holds {bad} at position \{position[:-1]}\).*\[0, 4\)"):
        prog.run({"logits": logits, "targets": np.array(targets, np.float32)})


def test_valid_class_ids_still_give_torch_s_loss():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((5, 4)).astype(np.float32)
    targets = np.array([0, 3, 1, 2, 3], np.float32)
    got = ce_program(rows=5).run({"logits": logits, "targets": targets})["loss"]
    ref = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(targets).long())
    np.testing.assert_allclose(got, ref.item(), rtol=1e-6)


def test_a_session_checks_class_ids_too():
    g = es.Graph()
    w, x, y = g.input("w", (3, 4)), g.input("x", (2, 3)), g.input("y", (2,))
    g.output("loss", es.nn.cross_entropy(es.einsum("bi,ij->bj", x, w), y))
    sess = es.compile(g, engine="local", workers=2).session({"w": np.zeros((3, 4), np.float32)})
    with pytest.raises(FeedError, match=r"'y' holds 4.0 at position \(1,\)"):
        sess.run({"x": np.ones((2, 3), np.float32), "y": np.array([3, 4], np.float32)})


def test_slices_and_concatenations_are_traced_to_the_fed_positions():
    """Only the positions read as class ids are checked: column 0 here is not a target."""
    g = es.Graph()
    tokens, extra = g.input("tokens", (2, 5)), g.input("extra", (1, 4))
    targets = es.concat([tokens[:, 1:], extra], axis=0)                       # [3, 4]
    logits = g.input("logits", (3, 4, 6))
    g.output("loss", es.nn.cross_entropy(logits, targets))
    prog = es.compile(g, engine="reference")
    feeds = {"tokens": np.array([[99, 1, 2, 3, 4], [-5, 5, 0, 1, 2]], np.float32),
             "extra": np.array([[0, 1, 2, 3]], np.float32), "logits": np.zeros((3, 4, 6), np.float32)}
    np.testing.assert_allclose(prog.run(feeds)["loss"], math.log(6), rtol=1e-6)
    feeds["tokens"][1, 3] = 6
    with pytest.raises(FeedError, match=r"'tokens' holds 6.0 at position \(1, 3\)"):
        prog.run(feeds)
    feeds["tokens"][1, 3] = 0
    feeds["extra"][0, 2] = 0.5
    with pytest.raises(FeedError, match=r"'extra' holds 0.5 at position \(0, 2\)"):
        prog.run(feeds)


TINY = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1)


@pytest.mark.parametrize("remat", [False, True])
def test_llama_token_ids_are_checked_in_the_embedding_and_the_targets(remat):
    residuals: list = []
    g, _, loss = llama.loss_graph(TINY, 2, 4, residuals=residuals)
    g.output("loss", loss)
    graph = rematerialize(g.ir, loss, residuals) if remat else g
    prog = es.compile(graph, engine="reference")
    params = init_params(TINY)
    tokens = np.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], np.int64)
    prog.run(params | {"tokens": tokens})
    tokens[0, 0] = 64  # read only by the embedding: it would embed as a zero row
    with pytest.raises(FeedError, match=r"'tokens' holds 64 at position \(0, 0\), read as token ids"):
        prog.run(params | {"tokens": tokens})
    tokens[0, 0], tokens[1, 4] = 1, 70  # read only as a target: the loss would be ln(64)
    with pytest.raises(FeedError, match=r"'tokens' holds 70 at position \(1, 4\), read as cross_entropy"):
        prog.run(params | {"tokens": tokens})


def test_the_trainer_refuses_data_outside_the_vocabulary():
    data = np.arange(2000, dtype=np.uint16) % 60
    data[1234] = 300
    cfg = TrainConfig(batch=2, seq=8, steps=2)
    with pytest.raises(FeedError, match=r"training data holds 300 at position \(1234,\).*\[0, 64\)"):
        Trainer(TINY, init_params(TINY), cfg, data, engine="reference")
    data[1234] = 3
    data = data.astype(np.float32)
    data[7] = 2.5
    with pytest.raises(FeedError, match=r"2.5 at position \(7,\)"):
        Trainer(TINY, init_params(TINY), cfg, data, engine="reference")
