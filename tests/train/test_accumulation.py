"""Gradient accumulation keeps its running sums on the workers: the micro-batch program adds
into resident ``grad:<name>`` tensors that the update program, in the same session, reads."""

import numpy as np
import pytest

from einsummable.compile import Program
from einsummable.engines.blocks import Blocks
from einsummable.models.llama.data import corpus
from einsummable.models.llama.model import LlamaConfig, init_params
from einsummable.train import trainer as trainer_mod
from einsummable.train.trainer import TrainConfig, Trainer

TINY = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1)


@pytest.mark.parametrize("engine,workers", [("local", 2), ("reference", None)])
def test_three_micro_batches_equal_one_big_batch_and_no_gradient_reaches_the_driver(monkeypatch, engine,
                                                                                     workers):
    rng = np.random.default_rng(0)
    bigs = [rng.integers(0, 256, (6, 17)).astype(np.int64) for _ in range(3)]

    def fixed(data, cfg, step, micro=0):  # step s: one batch of 6, or its three thirds
        return bigs[step] if cfg.batch == 6 else bigs[step][2 * micro : 2 * micro + 2]

    monkeypatch.setattr(trainer_mod, "batch_at", fixed)
    base = dict(seq=16, steps=3, lr=1e-2, min_lr=1e-3, warmup=1)  # clipping at 1.0 on both sides
    one = Trainer(TINY, init_params(TINY, seed=1), TrainConfig(batch=6, **base), corpus(), engine="reference")
    accum = Trainer(TINY, init_params(TINY, seed=1), TrainConfig(batch=2, accum=3, **base), corpus(),
                    engine=engine, workers=workers)
    seen: list[tuple[set[str], set[str]]] = []
    execute = Program.execute

    def spy(prog, arrays, variables, carry=frozenset()):
        result = execute(prog, arrays, variables, carry)
        if prog not in (accum.micro, accum.program):
            return result
        held = accum.session._state  # what the session holds is not fed (reference: arrays)
        seen.append(({n for n, a in arrays.items() if not isinstance(a, Blocks) and held.get(n) is not a},
                     {n for n, a in result.items() if not isinstance(a, Blocks) and n not in carry}))
        return result

    monkeypatch.setattr(Program, "execute", spy)
    for _ in range(3):  # the second and third steps must start their sums afresh
        assert accum.train_step() == pytest.approx(one.train_step(), rel=1e-5)
    # Adam divides by sqrt(v): where a gradient is near 0, f32 summation order (the engines'
    # GEMMs block differently) moves the update by a fraction of lr = 1e-2 (1.5e-5 seen on
    # one element of 2048). A lost or repeated micro-batch moves updates by O(lr), 200x atol.
    for name, w in one.params.items():
        np.testing.assert_allclose(accum.params[name], w, rtol=1e-4, atol=5e-5, err_msg=name)
    assert len(seen) == 3 * 4  # per step: three micro-batches and one update
    for fed, back in seen:
        assert fed <= {"tokens"} and back <= {"loss", "grad_norm"}  # scalars
    if engine == "local":
        assert isinstance(accum.session.resident.tensors["grad:lm_head.weight"], Blocks)

