"""The planner's workload suite (tests, benchmarks), written in the language: matmul, the chain
``Y = C(DE) + AB``, an MLP forward and backward (gradients by hand, with einsums),
and a Llama-style attention block. Each function returns an EinGraph."""

from __future__ import annotations

import einsummable as es
from einsummable.ir.graph import EinGraph


def matmul(n: int = 4096) -> EinGraph:
    g = es.Graph()
    a, b = g.input("a", (n, n)), g.input("b", (n, n))
    g.output("c", es.einsum("ij,jk->ik", a, b))
    return g.ir


def chain(m: int, k: int, n: int, r: int, t: int) -> EinGraph:
    """Y[m,n] = C[m,r] (D[r,t] E[t,n]) + A[m,k] B[k,n]."""
    g = es.Graph()
    a, b = g.input("A", (m, k)), g.input("B", (k, n))
    c, d, e = g.input("C", (m, r)), g.input("D", (r, t)), g.input("E", (t, n))
    de = es.einsum("rt,tn->rn", d, e)
    g.output("Y", es.einsum("mr,rn->mn", c, de) + es.einsum("mk,kn->mn", a, b))
    return g.ir


def chain_equal(n: int = 4096) -> EinGraph:
    return chain(n, n, n, n, n)


def chain_skewed() -> EinGraph:
    return chain(m=16384, k=256, n=8192, r=64, t=4096)


def mlp_train(batch: int = 8192, d: int = 1024, hidden: int = 4096, out: int = 1024) -> EinGraph:
    """Forward, squared-error loss, and the weight gradients written out by hand."""
    g = es.Graph()
    x, y = g.input("x", (batch, d)), g.input("y", (batch, out))
    w1, w2 = g.input("w1", (d, hidden)), g.input("w2", (hidden, out))
    z1 = es.einsum("bd,dh->bh", x, w1)
    a1 = es.elementwise("relu(x0)", z1)
    z2 = es.einsum("bh,ho->bo", a1, w2)
    err = es.elementwise("x0 - x1", z2, y)
    loss = es.einsum("bo->", err, join="x0 * x0", agg="add")
    dz2 = es.elementwise("2.0 * x0", err)
    dw2 = es.einsum("bh,bo->ho", a1, dz2)
    da1 = es.einsum("bo,ho->bh", dz2, w2)
    dz1 = es.einsum("bh,bh->bh", da1, z1, join="where(x1 > 0, x0, 0)")
    dw1 = es.einsum("bd,bh->dh", x, dz1)
    g.output("loss", loss)
    g.output("dw1", dw1)
    g.output("dw2", dw2)
    return g.ir


def attention(b: int = 8, s: int = 2048, d: int = 4096, h: int = 32, e: int = 128) -> EinGraph:
    """RMSNorm, per-head q/k/v, causal softmax(q k^T / sqrt(e)) v, output projection, residual."""
    g = es.Graph()
    x = g.input("x", (b, s, d))
    gain = g.input("gain", (d,))
    wq, wk, wv = (g.input(n, (d, h, e)) for n in ("wq", "wk", "wv"))
    wo = g.input("wo", (h, e, d))
    ms = es.einsum("bsd->bs", x, join=f"x0 * x0 * {1.0 / d!r}", agg="add")
    xn = es.einsum("bsd,bs,d->bsd", x, ms, gain, join="x0 * rsqrt(x1 + 1e-6) * x2")
    q = es.einsum("bsd,dhe->bhse", xn, wq)
    k = es.einsum("bsd,dhe->bhse", xn, wk)
    v = es.einsum("bsd,dhe->bhse", xn, wv)
    mask = g.tril((s, s), inside=0.0, outside=-1e9)
    scores = _scores(q, k, mask, e)
    att = es.nn.softmax(scores, axis=-1)
    o = es.einsum("bhst,bhte->bhse", att, v)
    y = es.einsum("bhse,hed->bsd", o, wo)
    g.output("y", x + y)
    return g.ir


def _scores(q, k, mask, e: int):
    raw = es.einsum("bhse,bhte->bhst", q, k)
    return es.einsum("bhst,st->bhst", raw, mask, join=f"x0 * {e ** -0.5!r} + x1")


SUITE = {
    "matmul": matmul,
    "chain (equal)": chain_equal,
    "chain (skewed)": chain_skewed,
    "mlp fwd+bwd": mlp_train,
    "attention": attention,
}
