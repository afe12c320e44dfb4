"""Scalar expression nodes: the join language's syntax tree.

Leaves are inputs ``x0..xn-1``, constants and named run-time variables (``lr``).
Interior nodes are ``Call(op, args)`` with ``op`` a key of ``scalar_ops.OPS``, or
``Cast``. Nodes are frozen and hashable so that common subexpressions dedupe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from einsummable.errors import ExprError


@dataclass(frozen=True)
class Input:
    index: int


@dataclass(frozen=True)
class Const:
    value: float | complex

    def __post_init__(self) -> None:
        value = self.value
        try:
            if isinstance(value, complex) and value.imag != 0:
                object.__setattr__(self, "value", complex(value))
            else:
                object.__setattr__(self, "value", float(value.real if isinstance(value, complex) else value))
        except OverflowError:
            digits = str(value)
            shown = digits if len(digits) <= 24 else f"{digits[:12]}... ({len(digits)} digits)"
            raise ExprError(
                f"the constant {shown} is too large for a float (the largest is about 1.8e308)"
            ) from None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Const):
            return NotImplemented
        a, b = self.value, other.value
        nan_a = isinstance(a, float) and math.isnan(a)
        nan_b = isinstance(b, float) and math.isnan(b)
        return (nan_a and nan_b) or (type(a) is type(b) and a == b)

    def __hash__(self) -> int:  # agrees with __eq__: 0.0 and -0.0 alike, every nan alike
        v = self.value
        return hash(("Const", "nan" if isinstance(v, float) and math.isnan(v) else v))


@dataclass(frozen=True)
class Var:
    """A named scalar bound at run time, such as a learning rate."""

    name: str


class _Node:
    """Hash cached at construction and equality walked with a stack: derived expressions
    (gradients of deep joins) nest further than Python's recursion would compare them."""

    _hash: int

    def _key(self) -> tuple:
        raise NotImplementedError

    def _init_hash(self) -> None:
        object.__setattr__(self, "_hash", hash((type(self).__name__, *self._key())))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        return (type(self), self._key())  # rebuilt, so the hash is this process's own

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Call | Cast):
            return NotImplemented
        stack = [(self, other)]
        while stack:
            a, b = stack.pop()
            if a is b:
                continue
            if type(a) is not type(b):
                return False
            if not isinstance(a, Call | Cast):
                if a != b:  # leaves compare by value
                    return False
                continue
            if a._hash != b._hash or a._key()[0] != b._key()[0]:
                return False
            kids_a, kids_b = children(a), children(b)
            if len(kids_a) != len(kids_b):
                return False
            stack.extend(zip(kids_a, kids_b, strict=True))
        return True


@dataclass(frozen=True, eq=False)
class Call(_Node):
    op: str
    args: tuple[Expr, ...]

    def __post_init__(self) -> None:
        self._init_hash()

    def _key(self) -> tuple:
        return (self.op, self.args)


@dataclass(frozen=True, eq=False)
class Cast(_Node):
    dtype: str
    arg: Expr

    def __post_init__(self) -> None:
        self._init_hash()

    def _key(self) -> tuple:
        return (self.dtype, self.arg)


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


def depth(e: Expr) -> int:
    """Levels of nesting (a leaf is 1), measured without recursion and once per shared
    subexpression, so that a tree too deep for the recursive walkers can be refused."""
    levels: dict[int, int] = {}
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in levels:
            continue
        kids = children(node)
        if expanded or not kids:
            levels[id(node)] = 1 + max((levels[id(k)] for k in kids), default=0)
        else:
            stack.append((node, True))
            stack.extend((k, False) for k in kids)
    return levels[id(e)]


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
