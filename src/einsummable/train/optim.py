"""Optimizers as graph updates: forward, backward and update are one EinGraph.

``adamw(loss, params, lr="lr")`` appends the gradient nodes (``es.grad``) and the
update nodes to the loss's graph. Every parameter input ``w`` and every optimizer
state input (``w.m``, ``w.v``, ``adam.step``, ...) gets an output of the *same name*
holding its next value, so a training loop is ``state = step.carry(prog.run(feeds))``
and an engine that keeps state resident can match outputs to inputs by name.

A hyperparameter is a number, baked in as a constant, or a string, which names a
run-time variable fed with each run: a learning-rate schedule needs no re-plan.

    step = es.train.adamw(loss, [w, b], lr="lr", weight_decay=0.1)
    prog = es.compile(g)
    state = {"w": W, "b": B, **step.init_state()}
    for t in range(100):
        state = step.carry(prog.run({**state, "x": X, "lr": 1e-3 * min(1, t / 10)}))
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from einsummable.autodiff import grad
from einsummable.errors import OptimizerError
from einsummable.frontend.tensor import Graph, Tensor, cast, elementwise, reduce
from einsummable.ir.dtypes import to_numpy
from einsummable.ir.graph import InputNode

Hyper = float | str
STEP = "adam.step"
LOW_PRECISION = ("bf16", "f16")  # Adam keeps f32 master weights and moments for these


@dataclass(frozen=True)
class StateSpec:
    """An optimizer state input; ``master_of`` names the parameter whose f32 copy it starts as."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    master_of: str | None = None


@dataclass(frozen=True)
class TrainStep:
    """What one training step reads and writes, by name."""

    loss: str
    params: tuple[str, ...]
    state: tuple[StateSpec, ...]
    variables: tuple[str, ...]

    def init_state(self, params: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Zeros for every optimizer state input (moments, step counter), and the f32 master
        copies of low-precision parameters, taken from ``params``."""
        masters = [s.master_of for s in self.state if s.master_of is not None]
        if masters and (params is None or any(m not in params for m in masters)):
            raise OptimizerError(f"the f32 master weights of {masters} start from the parameters: "
                                 "pass them, init_state(params)")
        return {s.name: np.asarray(params[s.master_of], np.float32) if s.master_of is not None
                else np.zeros(s.shape, to_numpy(s.dtype)) for s in self.state}

    def carry(self, outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The next step's parameters and state, picked from one run's outputs."""
        return {name: outputs[name] for name in (*self.params, *(s.name for s in self.state))}


def clip_by_global_norm(grads: Sequence[Tensor], max_norm: Hyper) -> tuple[list[Tensor], Tensor]:
    """Scale all gradients by ``min(1, max_norm / ||grads||)``; returns them and the norm."""
    common = "f64" if any(g.dtype == "f64" for g in grads) else "f32"
    squares = [cast(reduce(g, None, "add", join="x0 * x0"), common) for g in grads]
    total = elementwise(" + ".join(f"x{k}" for k in range(len(squares))), *squares)
    norm = elementwise("sqrt(x0)", total)
    _check_hypers(clip_norm=max_norm)
    scale = elementwise("min(1, x1 / (x0 + 1e-6))", norm, max_norm)
    return [g * cast(scale, g.dtype) for g in grads], norm


def sgd(loss: Tensor, params: Sequence[Tensor], lr: Hyper = "lr", momentum: Hyper = 0.0,
        nesterov: bool = False, weight_decay: Hyper = 0.0, clip_norm: Hyper | None = None) -> TrainStep:
    """SGD, optionally with (Nesterov) momentum and coupled L2 weight decay, as in PyTorch."""
    _check_hypers(lr=lr, momentum=momentum, weight_decay=weight_decay)
    graph, names, grads = _backward(loss, params, clip_norm)
    state = []
    for name, w, g in zip(names, params, grads, strict=True):
        if weight_decay != 0:
            g = elementwise("x0 + x2 * x1", g, w, weight_decay)
        if momentum == 0:
            graph.output(name, elementwise("x0 - x2 * x1", w, g, lr))
            continue
        buf = graph.input(f"{name}.momentum", w.shape, w.dtype)
        state.append(StateSpec(buf.node.name, w.shape, w.dtype))
        new_buf = elementwise("x2 * x0 + x1", buf, g, momentum)
        direction = elementwise("x0 + x2 * x1", g, new_buf, momentum) if nesterov else new_buf
        graph.output(buf.node.name, new_buf)
        graph.output(name, elementwise("x0 - x2 * x1", w, direction, lr))
    return _step(graph, names, state)


def adam(loss: Tensor, params: Sequence[Tensor], lr: Hyper = "lr", betas: tuple[Hyper, Hyper] = (0.9, 0.999),
         eps: Hyper = 1e-8, weight_decay: Hyper = 0.0, clip_norm: Hyper | None = None) -> TrainStep:
    """Adam; ``weight_decay`` here is coupled L2 (added to every gradient), as in torch.optim.Adam."""
    return _adam(loss, params, lr, betas, eps, weight_decay, clip_norm, decoupled=False, decay_all=True)


def adamw(loss: Tensor, params: Sequence[Tensor], lr: Hyper = "lr", betas: tuple[Hyper, Hyper] = (0.9, 0.999),
          eps: Hyper = 1e-8, weight_decay: Hyper = 0.01, clip_norm: Hyper | None = None,
          decay_all: bool = False) -> TrainStep:
    """AdamW: weight decay decoupled from the moments, ``w -= lr * (adam_update + wd * w)``.

    As in nanoGPT and the Hugging Face Trainer, only tensors with 2 or more dimensions
    (matrices, embeddings) decay; gains and biases do not, since shrinking an RMSNorm
    gain toward 0 is no regulariser. ``decay_all=True`` decays every parameter, as one
    torch.optim.AdamW parameter group would.

    A bf16 or f16 parameter ``w`` is updated through an f32 master copy ``w.master``
    with f32 moments, and re-cast after each step (the autocast-free bf16 recipe): in
    bf16 alone, an update below the weight's spacing (2^-8 of it) would be lost.
    ``init_state(params)`` starts the masters from the parameters.
    """
    if not isinstance(decay_all, bool):
        raise OptimizerError(f"decay_all must be True or False, got {decay_all!r}")
    return _adam(loss, params, lr, betas, eps, weight_decay, clip_norm, decoupled=True, decay_all=decay_all)


def frozen(names: Sequence[str], patterns: Sequence[str]) -> set[str]:
    """The parameter names that ``patterns`` freeze: each is a glob (``model.layers.0.*``)
    or, after ``re:``, a regular expression, matched against the whole name. A frozen
    parameter is left out of the optimizer: no gradient, no state, never changed.
    A pattern that matches no parameter is an error (a typo would freeze nothing)."""
    hits: set[str] = set()
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise OptimizerError(f"a freeze pattern must be a non-empty string, got {pattern!r}")
        if pattern.startswith("re:"):
            try:
                regex = re.compile(pattern[3:])
            except re.error as err:
                raise OptimizerError(f"freeze pattern {pattern!r}: not a regex ({err})") from None
            match = [n for n in names if regex.fullmatch(n)]
        else:
            match = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not match:
            shown = ", ".join(list(names)[:4])
            raise OptimizerError(f"freeze pattern {pattern!r} matches no parameter (they are named like "
                                 f"{shown}, ...; a glob, or re: and a regular expression, matches "
                                 "whole names)")
        hits.update(match)
    return hits


def decays(shape: Sequence[int], decay_all: bool = False) -> bool:
    """Whether AdamW decays a parameter of this shape: 2 or more dimensions, or all if asked."""
    return decay_all or len(shape) >= 2


def _adam(loss: Tensor, params: Sequence[Tensor], lr: Hyper, betas: tuple[Hyper, Hyper], eps: Hyper,
          wd: Hyper, clip_norm: Hyper | None, decoupled: bool, decay_all: bool) -> TrainStep:
    b1, b2 = betas
    _check_hypers(lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd)
    graph, names, grads = _backward(loss, params, clip_norm)
    step = graph.input(STEP, (), "f32")
    state = [StateSpec(STEP, (), "f32")]
    t = step + 1.0
    graph.output(STEP, t)
    # 1 - beta**t as 1 - exp(t log beta), since ** takes constant powers only; in f64, because
    # 1 - 0.999 computed in f32 keeps only four digits.
    corrections = [elementwise("1 - exp(x0 * log(x1))", cast(t, "f64"), b) for b in (b1, b2)]
    by_dtype: dict[str, list[Tensor]] = {}
    for name, param, g in zip(names, params, grads, strict=True):
        w = param
        if param.dtype in LOW_PRECISION:  # the update runs on an f32 master copy, with f32 moments
            w = graph.input(f"{name}.master", param.shape, "f32")
            state.append(StateSpec(w.node.name, w.shape, "f32", master_of=name))
            g = cast(g, "f32")
        if wd != 0 and not decoupled:
            g = elementwise("x0 + x2 * x1", g, w, wd)
        m = graph.input(f"{name}.m", w.shape, w.dtype)
        v = graph.input(f"{name}.v", w.shape, w.dtype)
        state += [StateSpec(f"{name}.m", w.shape, w.dtype), StateSpec(f"{name}.v", w.shape, w.dtype)]
        new_m = elementwise("x2 * x0 + (1 - x2) * x1", m, g, b1)
        new_v = elementwise("x2 * x0 + (1 - x2) * (x1 * x1)", v, g, b2)
        if w.dtype not in by_dtype:
            by_dtype[w.dtype] = [cast(c, w.dtype) for c in corrections]
        c1, c2 = by_dtype[w.dtype]
        # PyTorch's order: the scalar factors lr / c1 and sqrt(c2) are taken once, not per element
        adam_step = "x5 / x3 * x1 / (sqrt(x2) / sqrt(x4) + x6)"
        if wd != 0 and decoupled and decays(w.shape, decay_all):
            new_w = elementwise(f"x0 * (1 - x5 * x7) - {adam_step}", w, new_m, new_v, c1, c2, lr, eps, wd)
        else:
            new_w = elementwise(f"x0 - {adam_step}", w, new_m, new_v, c1, c2, lr, eps)
        graph.output(f"{name}.m", new_m)
        graph.output(f"{name}.v", new_v)
        if w is not param:
            graph.output(w.node.name, new_w)
            new_w = cast(new_w, param.dtype)
        graph.output(name, new_w)
    return _step(graph, names, state)


def _backward(loss: Tensor, params: Sequence[Tensor], clip_norm: Hyper | None
              ) -> tuple[Graph, list[str], list[Tensor]]:
    """Check the parameters, append the gradients (clipped if asked) and output the loss."""
    graph = loss.graph
    names = []
    for k, p in enumerate(params):
        if not isinstance(p, Tensor) or p.graph is not graph or not isinstance(p.node, InputNode):
            raise OptimizerError(f"params[{k}] ({p!r}) must be an input of the loss's graph, made by g.input")
        names.append(p.node.name)
    if len(set(names)) != len(names):
        raise OptimizerError(f"params name an input twice: {names}")
    grads = grad(loss, list(params))
    if clip_norm is not None:
        grads, norm = clip_by_global_norm(grads, clip_norm)
        graph.output("grad_norm", norm)
    graph.output("loss", loss)
    return graph, names, grads


def _check_hypers(**hypers: object) -> None:
    for what, value in hypers.items():
        if not (isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool))):
            raise OptimizerError(f"{what} must be a number or the name of a run-time variable, got {value!r}")


def _step(graph: Graph, names: list[str], state: list[StateSpec]) -> TrainStep:
    return TrainStep("loss", tuple(names), tuple(state), tuple(sorted(graph.ir.variables())))
