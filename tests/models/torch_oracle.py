"""The Llama loss and its gradients against a transformers model, shared by the model tests."""

import numpy as np
import torch

import einsummable as es
from einsummable.models.llama import model as llama
from einsummable.models.llama import weights


def check_loss_gradients(model, cfg, params, select=lambda name: True, batch=2, seq=6,
                         **options) -> list[str]:
    """Compile the loss and the gradients of the parameters ``select`` picks, run them on
    random tokens, and compare with transformers' loss and ``.grad``; returns the names checked."""
    g, p, loss = llama.loss_graph(cfg, batch, seq)
    names = [n for n in p if select(n)]
    for n, d in zip(names, es.grad(loss, [p[n] for n in names]), strict=True):
        g.output("d:" + n, d)
    g.output("loss", loss)
    tokens = np.random.default_rng(2).integers(0, cfg.vocab_size, (batch, seq + 1))
    out = es.compile(g, **options).run(params | {"tokens": tokens})  # int64 ids, as torch takes them
    t = torch.tensor(tokens)
    logits = model(t[:, :-1]).logits
    ref_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), t[:, 1:].reshape(-1))
    ref_loss.backward()
    np.testing.assert_allclose(out["loss"], ref_loss.item(), rtol=1e-5)
    state = dict(model.named_parameters())
    for n in names:
        ref = weights.to_ours(cfg, n, state[n].grad.numpy())
        scale = np.abs(ref).max() + 1e-12
        np.testing.assert_allclose(out["d:" + n] / scale, ref / scale, atol=1e-4, err_msg=n)
    return names
