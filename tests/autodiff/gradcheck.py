"""Gradient checks against central finite differences, in f64, on the reference engine."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import einsummable as es
from einsummable.frontend.tensor import Tensor
from einsummable.ir.graph import EinGraph, InputNode

EPS = 1e-6


def loss_only(graph: es.Graph, loss: es.Tensor) -> es.Program:
    """A program that computes just ``loss`` from the same nodes (for finite differences)."""
    ir = EinGraph()
    ir.nodes = list(graph.ir.nodes)
    ir.set_output("loss", loss.id)
    return es.compile(ir, engine="reference")


def check_grads(
    build: Callable[..., es.Tensor],
    shapes: dict[str, tuple[int, ...]],
    *,
    seed: int = 0,
    low: float = -1.0,
    high: float = 1.0,
    values: dict[str, np.ndarray] | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-7,
    directions: int = 0,
    fixed: tuple[str, ...] = (),
) -> dict[str, np.ndarray]:
    """Build ``y = build(**inputs)`` (it may add inputs of its own), take ``loss = <y, c>``
    for a random c, and compare ``es.grad`` with central differences: per element, or
    along random ``directions`` (the identity <J t, c> = <t, J^T c>) when that is nonzero.
    Inputs named in ``fixed`` (class ids, masks) are fed but not differentiated.
    Returns the gradients."""
    rng = np.random.default_rng(seed)
    g = es.Graph()
    ins = {name: g.input(name, shape, "f64") for name, shape in shapes.items()}
    y = build(**ins)
    ins = {n.name: Tensor(g, nid) for nid, n in enumerate(g.ir.nodes) if isinstance(n, InputNode)}
    shapes = {name: t.shape for name, t in ins.items()}
    c = g.input("cot", y.shape, "f64")
    loss = (y * c).sum() if y.shape else y * c
    wrt = [n for n in ins if n not in fixed]
    grads = es.grad(loss, [ins[n] for n in wrt])
    for name, t in zip(wrt, grads, strict=True):
        assert t.shape == ins[name].shape and t.dtype == "f64"
        g.output(f"d_{name}", t)
    g.output("loss", loss)
    g.ir.validate()
    feeds = {n: rng.uniform(low, high, s) for n, s in shapes.items()}
    feeds.update(values or {})
    feeds["cot"] = rng.standard_normal(y.shape)
    out = es.compile(g, engine="reference").run(feeds)
    fwd = loss_only(g, loss)

    def f(name: str, x: np.ndarray) -> float:
        return float(fwd.run({**feeds, name: x})["loss"])

    for name in wrt:
        analytic = out[f"d_{name}"]
        x = feeds[name]
        if directions:
            for _ in range(directions):
                t = rng.standard_normal(x.shape)
                numeric = (f(name, x + EPS * t) - f(name, x - EPS * t)) / (2 * EPS)
                np.testing.assert_allclose(np.vdot(analytic, t), numeric, rtol=rtol, atol=atol,
                                           err_msg=f"d/d{name} along a random direction")
            continue
        numeric = np.zeros_like(x)
        for k in np.ndindex(x.shape):
            e = np.zeros_like(x)
            e[k] = EPS
            numeric[k] = (f(name, x + e) - f(name, x - e)) / (2 * EPS)
        np.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol, err_msg=f"d/d{name}")
    return {name: out[f"d_{name}"] for name in wrt}
