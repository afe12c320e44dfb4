"""The join language: type, simplify, differentiate and compile.

Users write joins as Python-syntax strings such as ``"exp(x0 - x1) * x2"``;
``syntax`` parses and prints them (``parse`` and ``to_string`` are re-exported here).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from einsummable.errors import DtypeError, ExprError
from einsummable.ir.dtypes import DEFAULT, INTS, to_numpy
from einsummable.ir.expr import (
    ONE,
    ZERO,
    Call,
    Cast,
    Const,
    Expr,
    Input,
    Var,
    call,
    children,
    depth,
    inputs_used,
    rebuild,
    variables_used,
)
from einsummable.ir.scalar_ops import LINEAR_UNARY, OPS, Weak, is_call
from einsummable.ir.syntax import MAX_DEPTH, parse, to_string

# ---------------------------------------------------------------- dtypes


def dtype_of(e: Expr, input_dtypes: Sequence[str]) -> Weak:
    """The expression's dtype; None where it is weakly typed (only constants)."""
    if isinstance(e, Input):
        if e.index >= len(input_dtypes):
            raise ExprError(
                f"join uses x{e.index} but the op has {len(input_dtypes)} input(s) "
                f"(x0..x{len(input_dtypes) - 1})"
            )
        return input_dtypes[e.index]
    if isinstance(e, Const):
        return "c64" if isinstance(e.value, complex) else None
    if isinstance(e, Var):
        return None
    if isinstance(e, Cast):
        dtype_of(e.arg, input_dtypes)
        return e.dtype
    rule = OPS[e.op]
    dts = tuple(dtype_of(a, input_dtypes) for a in e.args)
    out = rule.dtype(e.op, dts)
    if out in INTS:
        for a, d in zip(e.args, dts, strict=True):
            if d is None:
                _check_integral(e, a, out)
    return out


def _check_integral(e: Call, a: Expr, dtype: str) -> None:
    """A weak operand of an integer op must be an integer constant: the op computes in ``dtype``."""
    value = simplify(a) if not variables_used(a) else None
    whole = isinstance(value, Const) and not isinstance(value.value, complex) and value.value.is_integer()
    if whole and (e.op != "pow" or value.value >= 0):
        return
    what = "a run-time variable (a float)" if value is None else f"{to_string(a)!r}, not a whole number"
    if e.op == "pow":
        what = f"the exponent {to_string(a)!r}, not a non-negative whole number"
    raise DtypeError(
        f"{to_string(e)!r} computes in {dtype} but its operand is {what}; cast the integer "
        f"operand to a float first, as in cast(x0, f32)"
    )


def result_dtype(e: Expr, input_dtypes: Sequence[str]) -> str:
    """The dtype an op's output takes: a weakly typed join follows its first float input,
    so ``where(x0 > 0, 2, 0)`` over a boolean (or a one-hot of integer ids) is a number
    of the default dtype."""
    d = dtype_of(e, input_dtypes)
    if d is not None:
        return d
    return next((d for d in input_dtypes if d != "bool" and d not in INTS), DEFAULT)


# ---------------------------------------------------------------- simplify


def simplify(e: Expr) -> Expr:
    """Fold constants, drop identities and order commutative operands canonically.

    Never reorders the branches of ``where`` nor the operands of a comparison.
    """
    for _ in range(32):
        new = _simplify(e)
        if new == e:
            return new
        e = new
    return e


def fold_constants(e: Expr) -> Expr:
    """Evaluate every subexpression that reads no input and no variable: ``1 - 0.9`` is 0.1.

    Unlike ``simplify`` it never removes an input, so an op keeps its operands.
    """
    kids = children(e)
    if not kids:
        return e
    if not inputs_used(e) and not variables_used(e):
        folded = simplify(e)
        if isinstance(folded, Const):
            return folded
    return rebuild(e, tuple(fold_constants(k) for k in kids))


def _sort_key(e: Expr) -> tuple[int, str]:
    return (0 if isinstance(e, Const) else 1, to_string(e))


def _fold(op: str, values: list[float | complex]) -> Const | None:
    rule = OPS[op]
    arrays = [np.asarray(v, dtype=np.complex128 if isinstance(v, complex) else np.float64) for v in values]
    if op == "pow":
        arrays[1] = values[1]
    complex_in = any(isinstance(v, complex) for v in values)
    to_complex = complex_in and op not in ("abs", "real", "imag")
    with np.errstate(all="ignore"):
        try:
            out = np.asarray(rule.value(*arrays))
        except TypeError:
            return None
    if out.dtype.kind == "c" and not to_complex:
        return None  # a complex value where the op's result is real
    return Const(complex(out) if to_complex else float(out))


def _simplify(e: Expr) -> Expr:
    kids = children(e)
    if not kids:
        return e
    kids = tuple(_simplify(k) for k in kids)
    if isinstance(e, Cast):
        (a,) = kids
        if isinstance(a, Cast) and a.dtype == e.dtype:
            return a
        return Cast(e.dtype, a)
    op = e.op
    rule = OPS[op]
    if rule.partials is not None and all(isinstance(k, Const) for k in kids):
        folded = _fold(op, [k.value for k in kids])
        if folded is not None:
            return folded
    rewritten = _rewrite(op, kids)
    if rewritten is not None:
        return rewritten
    if rule.commutative:
        kids = tuple(sorted(kids, key=_sort_key))
    return Call(op, kids)


def _rewrite(op: str, kids: tuple[Expr, ...]) -> Expr | None:
    a = kids[0]
    b = kids[1] if len(kids) > 1 else None
    if op == "add":
        if a == ZERO:
            return b
        if b == ZERO:
            return a
    elif op == "sub":
        if b == ZERO:
            return a
        if a == ZERO:
            return call("neg", b)
    elif op == "mul":
        for p, q in ((a, b), (b, a)):
            if p == ZERO:
                return ZERO
            if p == ONE:
                return q
            if p == Const(-1.0):
                return call("neg", q)
            if isinstance(p, Const) and is_call(q, "mul") and isinstance(q.args[0], Const):
                return call("mul", Const(p.value * q.args[0].value), q.args[1])
            if is_call(p, "where") and all(isinstance(t, Const) for t in p.args[1:]):
                c, t, f = p.args
                return call("where", c, call("mul", t, q), call("mul", f, q))
            if is_call(p, "neg"):
                return call("neg", call("mul", p.args[0], q))
    elif op == "div":
        if b == ONE:
            return a
    elif op == "pow":
        if b == ONE:
            return a
        if b == ZERO:
            return ONE
    elif op == "neg":
        if isinstance(a, Const):
            return Const(-a.value)
        if is_call(a, "neg"):
            return a.args[0]
    elif op == "where":
        cond, t, f = kids
        if t == f:
            return t
        if isinstance(cond, Call) and all(isinstance(k, Const) for k in cond.args):
            truth = _fold_compare(cond)
            if truth is not None:
                return t if truth else f
    return None


def _fold_compare(cond: Call) -> bool | None:
    return bool(OPS[cond.op].value(*(np.asarray(k.value) for k in cond.args)))


# ---------------------------------------------------------------- derivative


def derivative(e: Expr, i: int) -> Expr:
    """d e / d x_i, symbolic and simplified.

    A parsed join nests at most MAX_DEPTH levels and its derivative about twice that;
    differentiating again past 2 * MAX_DEPTH is refused before the recursion runs out.
    """
    e = parse(e)
    levels = depth(e)
    if levels > 2 * MAX_DEPTH:
        raise ExprError(
            f"cannot differentiate a join nested {levels} levels deep (a derivative of a "
            f"derivative of a deep join); the limit is {2 * MAX_DEPTH}"
        )
    return simplify(_d(e, i))


def _d(e: Expr, i: int) -> Expr:
    if isinstance(e, Input):
        return ONE if e.index == i else ZERO
    if isinstance(e, Const | Var):
        return ZERO
    if isinstance(e, Cast):
        # a cast to an integer is piecewise constant: no gradient flows through it
        return ZERO if e.dtype in INTS else Cast(e.dtype, _d(e.arg, i))
    if e.op == "where":
        c, a, b = e.args
        return call("where", c, _d(a, i), _d(b, i))
    if e.op in LINEAR_UNARY:
        return call(e.op, _d(e.args[0], i))
    rule = OPS[e.op]
    if rule.partials is None:
        return ZERO
    total: Expr = ZERO
    for partial, arg in zip(rule.partials(e.args), e.args, strict=True):
        inner = simplify(_d(arg, i))
        if inner != ZERO:
            total = call("add", total, call("mul", partial, inner))
    return total


# ---------------------------------------------------------------- run-time values


def constant_value(e: Expr, variables: dict[str, float] | None = None) -> float | complex:
    """An expression of constants and run-time variables, evaluated in double precision."""
    def bind(x: Expr) -> Expr:
        if isinstance(x, Var):
            return Const(_variable(x.name, variables))
        kids = children(x)
        x = rebuild(x, tuple(bind(k) for k in kids)) if kids else x
        if isinstance(x, Cast):  # a cast of a constant is that constant rounded to the dtype
            inner = simplify(x.arg)
            if isinstance(inner, Const) and not isinstance(inner.value, complex):
                return Const(float(np.asarray(inner.value).astype(to_numpy(x.dtype))))
        return x

    folded = simplify(bind(e))
    if not isinstance(folded, Const):
        raise ExprError(f"{to_string(e)!r} reads an input; expected constants and run-time variables")
    return folded.value


def _variable(name: str, variables: dict[str, float] | None) -> float:
    if variables is None or name not in variables:
        raise ExprError(f"run-time variable {name!r} was not given a value")
    return float(variables[name])
