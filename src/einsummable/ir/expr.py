"""Scalar expression nodes: the join language's syntax tree.

Leaves are inputs ``x0..xn-1``, constants and named run-time variables (``lr``).
Interior nodes are ``Call(op, args)`` with ``op`` a key of ``scalar_ops.OPS``, or
``Cast``. Nodes are frozen and hashable so that common subexpressions dedupe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Input:
    index: int


@dataclass(frozen=True)
class Const:
    value: float | complex

    def __post_init__(self) -> None:
        value = self.value
        if isinstance(value, complex) and value.imag != 0:
            object.__setattr__(self, "value", complex(value))
        else:
            object.__setattr__(self, "value", float(value.real if isinstance(value, complex) else value))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Const):
            return NotImplemented
        a, b = self.value, other.value
        nan_a = isinstance(a, float) and math.isnan(a)
        nan_b = isinstance(b, float) and math.isnan(b)
        return (nan_a and nan_b) or (type(a) is type(b) and a == b)

    def __hash__(self) -> int:
        return hash(("Const", repr(self.value)))


@dataclass(frozen=True)
class Var:
    """A named scalar bound at run time, such as a learning rate."""

    name: str


@dataclass(frozen=True)
class Call:
    op: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Cast:
    dtype: str
    arg: Expr


Expr = Input | Const | Var | Call | Cast

ZERO = Const(0.0)
ONE = Const(1.0)


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Cast):
        return (e.arg,)
    return ()


def rebuild(e: Expr, new_children: tuple[Expr, ...]) -> Expr:
    if isinstance(e, Call):
        return Call(e.op, new_children)
    if isinstance(e, Cast):
        return Cast(e.dtype, new_children[0])
    return e


def inputs_used(e: Expr) -> set[int]:
    if isinstance(e, Input):
        return {e.index}
    return set().union(*(inputs_used(c) for c in children(e)))


def variables_used(e: Expr) -> set[str]:
    if isinstance(e, Var):
        return {e.name}
    return set().union(*(variables_used(c) for c in children(e)))


def substitute(e: Expr, mapping: dict[int, Expr]) -> Expr:
    """Replace inputs: ``substitute(x0 * x1, {1: x0})`` is ``x0 * x0``."""
    if isinstance(e, Input):
        return mapping.get(e.index, e)
    kids = children(e)
    return rebuild(e, tuple(substitute(c, mapping) for c in kids)) if kids else e


def replace(e: Expr, old: Expr, new: Expr) -> Expr:
    """Replace every occurrence of the subexpression ``old``."""
    if e == old:
        return new
    kids = children(e)
    return rebuild(e, tuple(replace(c, old, new) for c in kids)) if kids else e


def call(op: str, *args: Expr) -> Call:
    return Call(op, tuple(args))


def x(i: int) -> Input:
    return Input(i)
