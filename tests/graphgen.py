"""Random EinGraphs, feeds and partitions for property tests of planners and engines.

``random_graph(rng)`` covers every node kind: contractions, reductions with each
agg, fused aggregating joins, elementwise and broadcast joins, fills (constant,
tril, ramp), selects (slice, concat, pad), reshapes (merge, split, unsqueeze)
and complex views. Tensors carry index letters so shapes always agree.
"""

from __future__ import annotations

import random
import string

import numpy as np

import einsummable as es
from einsummable.engines.feeds import check_feeds
from einsummable.ir.graph import EinGraph
from einsummable.models.llama import model as llama
from einsummable.models.llama.config import LlamaConfig
from einsummable.plan.partition import Partition
from einsummable.plan.space import spaces

SIZES = (1, 2, 3, 4, 5, 6, 7)
UNARY = ("tanh(x0)", "x0 * 0.5 + 1.0", "relu(x0)", "exp(x0 * 0.1)", "-x0", "abs(x0)")
BINARY = ("x0 + x1", "x0 * x1", "x0 - x1", "max(x0, x1)", "where(x0 > x1, x0, x1)")
AGGS = ("add", "mul", "min", "max")


class _Builder:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.g = es.Graph()
        self.size: dict[str, int] = {}
        self.pool: list[tuple[es.Tensor, str]] = []  # tensor and its index letters
        self.feeds: dict[str, np.ndarray] = {}
        self.letters = iter(string.ascii_letters)

    def letter(self, size: int | None = None) -> str:
        ch = next(self.letters)
        self.size[ch] = size if size is not None else self.rng.choice(SIZES)
        return ch

    def add(self, t: es.Tensor, labels: str) -> None:
        assert t.shape == tuple(self.size[c] for c in labels), (t.shape, labels)
        self.pool.append((t, labels))

    def input(self, labels: str) -> None:
        name = f"in{len(self.feeds)}"
        shape = tuple(self.size[c] for c in labels)
        t = self.g.input(name, shape)
        # values near 1 keep products (agg=mul) tame
        self.feeds[name] = self.rng_np().uniform(0.5, 1.5, size=shape).astype(np.float32)
        self.add(t, labels)

    def rng_np(self) -> np.random.Generator:
        return np.random.default_rng(self.rng.randrange(2**32))

    def pick(self, real: bool = True) -> tuple[es.Tensor, str]:
        choices = [(t, s) for t, s in self.pool if (t.dtype == "f32") == real]
        return self.rng.choice(choices or self.pool)


def _contract(b: _Builder) -> None:
    (x, lx), (y, ly) = b.pick(), b.pick()
    union = list(dict.fromkeys(lx + ly))
    out = "".join(b.rng.sample(union, b.rng.randint(0, min(3, len(union)))))
    b.add(es.einsum(f"{lx},{ly}->{out}", x, y), out)


def _reduce(b: _Builder) -> None:
    x, lx = b.pick()
    if not lx:
        return
    agg = b.rng.choice(AGGS)
    axes = sorted(b.rng.sample(range(len(lx)), b.rng.randint(1, len(lx))))
    # products squash their terms into [0.8, 1.2] so that long ones stay finite
    join = "tanh(x0) * 0.2 + 1.0" if agg == "mul" else "x0"
    out = "".join(c for d, c in enumerate(lx) if d not in axes)
    b.add(es.reduce(x, tuple(axes), agg, join=join), out)


def _fused(b: _Builder) -> None:
    """An aggregating op with a non-product join, e.g. sum of exp(x0 - x1)."""
    (x, lx), (y, ly) = b.pick(), b.pick()
    union = list(dict.fromkeys(lx + ly))
    out = "".join(b.rng.sample(union, b.rng.randint(0, max(0, len(union) - 1))))
    agg = b.rng.choice(("add", "min", "max")) if len(out) < len(union) else None
    join = b.rng.choice(("exp((x0 - x1) * 0.1)", "x0 - x1", "max(x0, x1)"))
    b.add(es.einsum(f"{lx},{ly}->{out}", x, y, join=join, agg=agg), out)


def _elementwise(b: _Builder) -> None:
    x, lx = b.pick()
    if b.rng.random() < 0.4:
        b.add(es.elementwise(b.rng.choice(UNARY), x), lx)
        return
    sub = "".join(c for c in lx if b.rng.random() < 0.6)  # broadcast a subset of x's indices
    y = next((t for t, s in b.pool if s == sub), None)
    if y is None:
        b.input(sub)
        y = b.pool[-1][0]
    b.add(es.einsum(f"{lx},{sub}->{lx}", x, y, join=b.rng.choice(BINARY)), lx)


def _fill(b: _Builder) -> None:
    x, lx = b.pick()
    shape = x.shape
    kind = b.rng.choice(("full", "tril", "ramp")) if len(lx) >= 2 else b.rng.choice(("full", "ramp"))
    if kind == "full":
        f = b.g.full(shape, b.rng.choice((0.5, 2.0)))
    elif kind == "tril":
        f = b.g.tril(shape, inside=1.0, outside=-1.0, offset=b.rng.choice((-1, 0, 1)))
    else:
        f = b.g.ramp(shape, [b.rng.choice((0.0, 0.1, -0.2)) for _ in shape], start=0.3)
    b.add(x * f, lx)


def _select(b: _Builder) -> None:
    x, lx = b.pick()
    if not lx:
        return
    d = b.rng.randrange(len(lx))
    n = x.shape[d]
    kind = b.rng.choice(("slice", "concat", "pad"))
    if kind == "slice" and n >= 2:
        lo = b.rng.randrange(n - 1)
        hi = b.rng.randint(lo + 1, n)
        key = tuple(slice(lo, hi) if e == d else slice(None) for e in range(len(lx)))
        new, t = b.letter(hi - lo), x[key]
    elif kind == "concat":
        new, t = b.letter(2 * n), es.concat([x, x * 2.0], axis=d)
    else:
        widths = [(1, 2) if e == d else (0, 0) for e in range(len(lx))]
        new, t = b.letter(n + 3), es.pad(x, widths, value=b.rng.choice((0.0, 0.25)))
    b.add(t, lx[:d] + new + lx[d + 1 :])


def _reshape(b: _Builder) -> None:
    x, lx = b.pick()
    shape = list(x.shape)
    r = b.rng.random()
    if len(lx) >= 2 and r < 0.4:
        d = b.rng.randrange(len(lx) - 1)
        new = b.letter(shape[d] * shape[d + 1])
        b.add(x.reshape([*shape[:d], shape[d] * shape[d + 1], *shape[d + 2:]]), lx[:d] + new + lx[d + 2 :])
        return
    comps = [d for d, n in enumerate(shape) if n in (4, 6)]
    if comps and r < 0.7:
        d = b.rng.choice(comps)
        p, q = b.letter(2), b.letter(shape[d] // 2)
        b.add(x.reshape([*shape[:d], 2, shape[d] // 2, *shape[d + 1:]]), lx[:d] + p + q + lx[d + 1 :])
        return
    d = b.rng.randint(0, len(lx))
    b.add(x.reshape([*shape[:d], 1, *shape[d:]]), lx[:d] + b.letter(1) + lx[d:])


def _complex(b: _Builder) -> None:
    even = [(t, s) for t, s in b.pool if t.dtype == "f32" and s and t.shape[-1] % 2 == 0]
    if not even:
        return
    x, lx = b.rng.choice(even)
    z = es.view_as_complex(x)
    z = es.elementwise("x0 * x0", z)
    b.add(es.view_as_real(z), lx)


OPS = (_contract, _reduce, _fused, _elementwise, _fill, _select, _reshape, _complex)


def random_graph(rng: random.Random, n_ops: int = 8, n_outputs: int = 2) -> tuple[es.Graph, dict]:
    """A random graph over a few small inputs, with its feeds."""
    b = _Builder(rng)
    for _ in range(rng.randint(1, 3)):
        b.input("".join(b.letter() for _ in range(rng.randint(1, 3))))
    for _ in range(n_ops):
        if len(b.size) > 40:
            break
        rng.choice(OPS)(b)
    outs = [b.pool[-1], *rng.sample(b.pool, min(n_outputs - 1, len(b.pool)))]
    for k, (t, _) in enumerate(outs):
        b.g.output(f"out{k}", t)
    return b.g, b.feeds


def random_partitions(g: EinGraph, rng: random.Random, max_blocks: int = 3) -> list[Partition]:
    """Irregular partitions: random cut points along every dimension a node may split."""
    parts = []
    for sp in spaces(g):
        bounds = []
        for n, ok in zip(sp.shape, sp.splittable, strict=True):
            k = rng.randint(1, min(max_blocks, n)) if ok and n > 1 else 1
            cuts = sorted(rng.sample(range(1, n), k - 1)) if k > 1 else []
            bounds.append((0, *cuts, n))
        parts.append(Partition(tuple(bounds)))
    return parts


def check_lowered(plan, feeds: dict[str, np.ndarray]):
    """Validate ``plan``, lower it, and check the TaskGraph (sequential engine) reproduces
    the reference engine on ``feeds``, dtypes included; returns the TaskGraph."""
    from einsummable.engines import reference, sequential
    from einsummable.lower.lowering import lower

    plan.validate()
    tg = lower(plan)
    tg.validate()
    want = reference.run(plan.graph, feeds)
    got = sequential.run(tg, feeds)
    for name in want:
        assert got[name].dtype == want[name].dtype
        np.testing.assert_allclose(got[name], want[name], rtol=2e-4, atol=2e-4, err_msg=name)
    return tg


def deep_mlp_grads(layers: int, batch: int, width: int) -> tuple[EinGraph, dict[str, np.ndarray]]:
    """The weight gradients of a deep ReLU MLP, and its feeds: each weight is read by its
    layer's forward and, far later, by the backward's input gradient (FSDP gathers it twice)."""
    g, ws, loss = _deep_mlp(layers, batch, width, 1.0)
    for k, grad in enumerate(es.grad(loss, ws)):
        g.output(f"d{k}", grad)
    g.output("loss", loss)
    return g.ir, _mlp_feeds(layers, batch, width)


def deep_mlp_momentum(layers: int, batch: int, width: int, loss_scale: float = 1.0
                      ) -> tuple[EinGraph, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """That MLP's step with momentum, ``m' = 0.9 m + grad, w' = w - 0.01 m'`` (both outputs
    replace their inputs), its loss scaled by ``loss_scale``: the graph, its state (weights,
    momenta of 0.1) and its data (``x``)."""
    g, ws, loss = _deep_mlp(layers, batch, width, loss_scale)
    ms = [g.input(f"m{k}", (width, width)) for k in range(layers)]
    for k, (w, m, grad) in enumerate(zip(ws, ms, es.grad(loss, ws), strict=True)):
        m2 = es.elementwise("0.9 * x0 + x1", m, grad)
        g.output(f"m{k}", m2)
        g.output(f"w{k}", es.elementwise("x0 - 0.01 * x1", w, m2))
    g.output("loss", loss)
    feeds = _mlp_feeds(layers, batch, width)
    state = {name: v for name, v in feeds.items() if name != "x"}
    state |= {f"m{k}": np.full((width, width), 0.1, np.float32) for k in range(layers)}
    return g.ir, state, {"x": feeds["x"]}


def _deep_mlp(layers: int, batch: int, width: int, loss_scale: float):
    g = es.Graph()
    h = g.input("x", (batch, width))
    ws = [g.input(f"w{k}", (width, width)) for k in range(layers)]
    for w in ws:
        h = es.elementwise("relu(x0)", h @ w)
    return g, ws, es.einsum("bd->", h, join=f"x0 * x0 * {loss_scale!r}", agg="add")


def _mlp_feeds(layers: int, batch: int, width: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((batch, width), dtype=np.float32)}
    feeds |= {f"w{k}": rng.standard_normal((width, width), dtype=np.float32) / np.float32(width ** 0.5)
              for k in range(layers)}
    return feeds


def llama_step(batch: int):
    """A 1-layer Llama's AdamW training step on ``batch`` sequences of 8: graph, loss name,
    vocab, checked feeds and variables."""
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    g, p, loss = llama.loss_graph(cfg, batch, 8)
    step = es.train.adamw(loss, list(p.values()), lr="lr", weight_decay=0.1)
    params = llama.init_params(cfg, seed=0)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, 9)).astype(np.int64)
    arrays, variables = check_feeds(g.ir, params | step.init_state(params) | {"tokens": tokens, "lr": 3e-3},
                                    variables=g.ir.variables())
    return g, step.loss, cfg.vocab_size, arrays, variables
