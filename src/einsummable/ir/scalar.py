"""The join language: parse, print, type, simplify, differentiate and compile.

Users write joins as Python-syntax strings such as ``"exp(x0 - x1) * x2"``. They
are parsed with ``ast`` against an allow-list; nothing is ever ``eval``ed. The
canonical printer round-trips: ``parse(to_string(e)) == e``.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Sequence

import numpy as np

from einsummable.errors import ExprError
from einsummable.ir.dtypes import DEFAULT, DTYPES
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
    inputs_used,
    rebuild,
    variables_used,
)
from einsummable.ir.scalar_ops import LINEAR_UNARY, OPS, Weak, is_call

_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.Pow: "pow"}
_CMPOPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_NAMED_CONSTS = {"inf": math.inf, "nan": math.nan, "pi": math.pi}
_INPUT = re.compile(r"x(\d+)$")
_ALLOWED = "numbers, x0..xN, variable names, + - * / **, comparisons, and calls to " + ", ".join(
    sorted([*(n for n, r in OPS.items() if r.infix is None), "cast", "complex"])
)


# ---------------------------------------------------------------- parsing


def parse(text: str | Expr) -> Expr:
    """Parse a join string; an Expr passes through unchanged."""
    if not isinstance(text, str):
        return text
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as err:
        raise ExprError(f"cannot parse join expression {text!r}: {err.msg}") from None
    return _parse(tree.body, text)


def _literal(node: ast.AST) -> float | complex | None:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float, complex):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMED_CONSTS:
        return _NAMED_CONSTS[node.id]
    return None


def _parse(node: ast.AST, text: str) -> Expr:
    literal = _literal(node)
    if literal is not None:
        return Const(literal)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _literal(node.operand)
        if isinstance(node.op, ast.UAdd):
            return _parse(node.operand, text)
        if inner is not None:
            return Const(-inner)
        return call("neg", _parse(node.operand, text))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        op = _BINOPS[type(node.op)]
        left, right = _parse(node.left, text), _parse(node.right, text)
        if op == "pow" and not isinstance(right, Const):
            raise ExprError(f"'**' needs a constant exponent in {text!r}, got {ast.unparse(node.right)!r}")
        return call(op, left, right)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMPOPS:
        op = _CMPOPS[type(node.ops[0])]
        return call(op, _parse(node.left, text), _parse(node.comparators[0], text))
    if isinstance(node, ast.Name):
        return _parse_name(node.id, text)
    if isinstance(node, ast.Call):
        return _parse_call(node, text)
    raise ExprError(
        f"{type(node).__name__} ({ast.unparse(node)!r}) is not allowed in join expression "
        f"{text!r}; allowed: {_ALLOWED}"
    )


def _parse_name(name: str, text: str) -> Expr:
    m = _INPUT.match(name)
    if m:
        return Input(int(m.group(1)))
    if name in OPS or name in ("cast", "complex"):
        raise ExprError(f"{name!r} is a function in {text!r}; call it as {name}(...)")
    if name.startswith("_"):
        raise ExprError(f"variable names may not start with '_': {name!r} in {text!r}")
    return Var(name)


def _parse_call(node: ast.Call, text: str) -> Expr:
    if not isinstance(node.func, ast.Name):
        raise ExprError(
            f"only plain function calls are allowed in {text!r}, got {ast.unparse(node.func)!r}"
        )
    name = node.func.id
    if node.keywords:
        raise ExprError(f"{name}() takes no keyword arguments in {text!r}")
    if name == "cast":
        if len(node.args) != 2 or not isinstance(node.args[1], ast.Name):
            raise ExprError(f"cast takes (expr, dtype) in {text!r}, for example cast(x0, f16)")
        dtype = node.args[1].id
        if dtype not in DTYPES:
            raise ExprError(f"unknown dtype {dtype!r} in {text!r}; expected one of {DTYPES}")
        return Cast(dtype, _parse(node.args[0], text))
    if name == "complex":
        parts = [_parse(a, text) for a in node.args]
        if len(parts) != 2 or not all(isinstance(p, Const) for p in parts):
            raise ExprError(f"complex takes two number literals in {text!r}")
        return Const(complex(parts[0].value, parts[1].value))
    rule = OPS.get(name)
    if rule is None or (rule.infix is not None):
        raise ExprError(f"unknown function {name!r} in join expression {text!r}; allowed: {_ALLOWED}")
    if len(node.args) != rule.arity:
        raise ExprError(f"{name} takes {rule.arity} argument(s), got {len(node.args)} in {text!r}")
    return Call(name, tuple(_parse(a, text) for a in node.args))


# ---------------------------------------------------------------- printing


def _num(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


def _precedence(e: Expr) -> int:
    if isinstance(e, Const):
        v = e.value
        negative = isinstance(v, float) and (v < 0 or math.copysign(1.0, v) < 0) and v != 0
        return 4 if negative else 6
    if isinstance(e, Call):
        rule = OPS[e.op]
        if rule.infix or e.op == "neg":
            return rule.precedence
    return 6


def to_string(e: Expr) -> str:
    if isinstance(e, Input):
        return f"x{e.index}"
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        v = e.value
        if isinstance(v, complex):
            return f"complex({_num(v.real)}, {_num(v.imag)})"
        return _num(v)
    if isinstance(e, Cast):
        return f"cast({to_string(e.arg)}, {e.dtype})"
    rule = OPS[e.op]
    if e.op == "neg":
        (a,) = e.args
        if isinstance(a, Const):
            return f"neg({to_string(a)})"
        return "-" + _wrap(a, _precedence(a) < 4)
    if rule.infix:
        a, b = e.args
        p = rule.precedence
        if p == 1:
            left_paren, right_paren = _precedence(a) <= p, _precedence(b) <= p
        elif e.op == "pow":
            left_paren, right_paren = _precedence(a) <= p, False
        else:
            left_paren, right_paren = _precedence(a) < p, _precedence(b) <= p
        return f"{_wrap(a, left_paren)} {rule.infix} {_wrap(b, right_paren)}"
    return f"{e.op}({', '.join(to_string(a) for a in e.args)})"


def _wrap(e: Expr, paren: bool) -> str:
    s = to_string(e)
    return f"({s})" if paren else s


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
    return rule.dtype(e.op, tuple(dtype_of(a, input_dtypes) for a in e.args))


def result_dtype(e: Expr, input_dtypes: Sequence[str]) -> str:
    """The dtype an op's output takes: a weakly typed join follows its first input."""
    d = dtype_of(e, input_dtypes)
    if d is not None:
        return d
    return input_dtypes[0] if input_dtypes else DEFAULT


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
    out = np.empty((), dtype=np.complex128 if to_complex else np.float64)
    with np.errstate(all="ignore"):
        try:
            rule.kernel(out, *arrays)
        except TypeError:
            return None
    return Const(complex(out) if out.dtype.kind == "c" else float(out))


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
    out = np.empty((), dtype=bool)
    values = [np.asarray(k.value) for k in cond.args]
    OPS[cond.op].kernel(out, *values)
    return bool(out)


# ---------------------------------------------------------------- derivative


def derivative(e: Expr, i: int) -> Expr:
    """d e / d x_i, symbolic and simplified."""
    return simplify(_d(parse(e), i))


def _d(e: Expr, i: int) -> Expr:
    if isinstance(e, Input):
        return ONE if e.index == i else ZERO
    if isinstance(e, Const | Var):
        return ZERO
    if isinstance(e, Cast):
        return Cast(e.dtype, _d(e.arg, i))
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
        return rebuild(x, tuple(bind(k) for k in kids)) if kids else x

    folded = simplify(bind(e))
    if not isinstance(folded, Const):
        raise ExprError(f"{to_string(e)!r} reads an input; expected constants and run-time variables")
    return folded.value


def _variable(name: str, variables: dict[str, float] | None) -> float:
    if variables is None or name not in variables:
        raise ExprError(f"run-time variable {name!r} was not given a value")
    return float(variables[name])
