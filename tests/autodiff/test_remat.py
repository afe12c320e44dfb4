"""Rematerialisation: the same outputs bit for bit, with less held across the backward pass."""

import numpy as np
import pytest

import einsummable as es
from einsummable import nn
from einsummable.autodiff import peak_bytes, rematerialize
from einsummable.ir.remat import gates


def deep_mlp(layers: int = 6, n: int = 32, d: int = 16):
    g = es.Graph()
    x = g.input("x", (n, d), "f64")
    ws = [g.input(f"w{k}", (d, d), "f64") for k in range(layers)]
    h, hs = x, []
    for w in ws:
        h = nn.gelu(nn.matmul(h, w)) + h  # pre-activations and the gelu output are inner values
        hs.append(h)
    loss = (h * h).mean()
    return g, loss, ws, hs


def feeds(ws, n=32, d=16, seed=0):
    rng = np.random.default_rng(seed)
    out = {"x": rng.standard_normal((n, d))}
    out.update({w.node.name: rng.standard_normal((d, d)) / np.sqrt(d) for w in ws})
    return out


def test_checkpointed_gradients_equal_plain_ones_and_hold_less():
    g, loss, ws, hs = deep_mlp()
    for k, dw in enumerate(es.grad(loss, ws)):
        g.output(f"d{k}", dw)
    g.output("loss", loss)
    remat = rematerialize(g.ir, loss, keep=hs)
    remat.validate()
    assert len(remat) > len(g.ir), "some forward nodes are recomputed"
    F = feeds(ws)
    plain = es.compile(g, engine="reference").run(F)
    checkpointed = es.compile(remat, engine="reference").run(F)
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        np.testing.assert_array_equal(plain[name], checkpointed[name], err_msg=name)
    assert peak_bytes(remat) < 0.75 * peak_bytes(g.ir)


def test_checkpointing_a_whole_training_step():
    g, loss, ws, hs = deep_mlp(layers=3)
    step = es.train.adamw(loss, ws, lr="lr")
    remat = rematerialize(g.ir, loss, keep=hs[::2])
    F = {**feeds(ws), **step.init_state(), "lr": 1e-2}
    plain = es.compile(g, engine="reference").run(F)
    checkpointed = es.compile(remat, engine="reference").run(F)
    for name in plain:
        np.testing.assert_array_equal(plain[name], checkpointed[name], err_msg=name)


def test_keeping_everything_changes_nothing():
    g, loss, ws, _ = deep_mlp(layers=2)
    for k, dw in enumerate(es.grad(loss, ws)):
        g.output(f"d{k}", dw)
    everything = list(range(len(g.ir)))
    remat = rematerialize(g.ir, loss, keep=everything)
    assert str(remat) == str(g.ir)


@pytest.mark.parametrize("keep_every", [1, 2, 3])
def test_fewer_checkpoints_recompute_more(keep_every):
    g, loss, ws, hs = deep_mlp()
    es.grad(loss, ws)

    def recomputed(keep):
        remat = rematerialize(g.ir, loss, keep=keep)
        return len(remat) - len(gates(remat)) - len(g.ir)  # the barriers order, they do not recompute

    extra = recomputed(hs[::keep_every])
    assert extra > 0
    if keep_every > 1:
        assert extra >= recomputed(hs[:: keep_every - 1])
