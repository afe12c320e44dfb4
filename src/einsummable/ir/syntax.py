"""The join language's surface syntax: parse a string into an Expr, print one back.

Strings are parsed with ``ast`` against an allow-list; nothing is ever ``eval``ed.
The canonical printer round-trips: ``parse(to_string(e)) == e``.

Depth is bounded so that every tree walker downstream (simplify, derivative,
dtype inference, lowering, hashing) stays far inside Python's stack. A long
chain written without parentheses, such as a generated 1000-term sum, is summed
(or multiplied) as a balanced tree, so it stays shallow; a run of unary minuses
collapses to its parity. Anything else nested deeper than ``MAX_DEPTH`` is an
``ExprError`` that names the limit.
"""

from __future__ import annotations

import ast
import keyword
import math
import re

from einsummable.errors import ExprError
from einsummable.ir.dtypes import DTYPES
from einsummable.ir.expr import Call, Cast, Const, Expr, Input, Var, call, depth
from einsummable.ir.scalar_ops import OPS

MAX_DEPTH = 100  # nesting levels of a parsed join; derivatives of it nest about twice as deep
LONG_CHAIN = 32  # a +/- or * chain (or a run of unary minuses) longer than this is rebalanced

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
        raise ExprError(f"cannot parse join expression {_short(text)}: {err.msg}") from None
    except RecursionError:
        raise ExprError(
            f"join expression {_short(text)} is nested too deeply for Python's parser; "
            f"the limit is {MAX_DEPTH} levels"
        ) from None
    _check_depth(_ast_depth(tree.body), text)
    e = _parse(tree.body, text)
    _check_depth(depth(e), text)
    return e


def check_variable_name(name: object, where: str) -> str:
    """A run-time variable's name: an identifier that no input, constant or function of
    the language already spells, so that it prints as itself and parses back to itself."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ExprError(f"run-time variable name {name!r} in {where} must be a Python identifier")
    if _INPUT.match(name):
        raise ExprError(
            f"{name!r} in {where} spells an input placeholder (x0, x1, ...); "
            "give the run-time variable another name"
        )
    if name in OPS or name in ("cast", "complex") or name in _NAMED_CONSTS or name in DTYPES:
        kind = "constant" if name in _NAMED_CONSTS else "dtype" if name in DTYPES else "function"
        raise ExprError(f"{name!r} in {where} is a {kind} of the join language, not a run-time variable name")
    if name.startswith("_"):
        raise ExprError(f"variable names may not start with '_': {name!r} in {where}")
    return name


def _short(text: str) -> str:
    return repr(text) if len(text) <= 80 else f"{text[:60]!r}... ({len(text)} characters)"


def _digits(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


def _check_depth(levels: int, text: str) -> None:
    if levels > MAX_DEPTH:
        raise ExprError(
            f"join expression {_short(text)} nests {levels} levels deep; the limit is {MAX_DEPTH}. "
            "Long + - and * chains are fine; split deeper nesting into several ops"
        )


def _continues_chain(parent: ast.AST, child: ast.AST) -> bool:
    """Whether ``child`` is parsed as part of ``parent``'s chain, adding no level of its own."""
    if isinstance(parent, ast.UnaryOp):
        return isinstance(child, ast.UnaryOp)
    if isinstance(parent, ast.BinOp) and isinstance(child, ast.BinOp) and child is parent.left:
        return _chain_kind(parent) is not None and _chain_kind(parent) == _chain_kind(child)
    return False


def _chain_kind(node: ast.BinOp) -> str | None:
    if isinstance(node.op, ast.Add | ast.Sub):
        return "sum"
    return "product" if isinstance(node.op, ast.Mult) else None


def _ast_depth(root: ast.AST) -> int:
    """Nesting of the syntax tree, chains counted once: measured without recursion, so that
    a string too deep to parse recursively is refused before it is walked."""
    best, stack = 0, [(root, 1)]
    while stack:
        node, level = stack.pop()
        best = max(best, level)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                stack.append((child, level if _continues_chain(node, child) else level + 1))
    return best


def _literal(node: ast.AST, text: str) -> float | complex | None:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float, complex):
        value = node.value
        try:
            float(value.real)
        except OverflowError:
            raise ExprError(
                f"the literal {_digits(value)} in {_short(text)} is too large for a float "
                "(the largest is about 1.8e308); write it as a float, such as 1e308 or inf"
            ) from None
        return value
    if isinstance(node, ast.Name) and node.id in _NAMED_CONSTS:
        return _NAMED_CONSTS[node.id]
    return None


def _parse(node: ast.AST, text: str) -> Expr:
    literal = _literal(node, text)
    if literal is not None:
        return Const(literal)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        return _parse_unary(node, text)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        if _chain_kind(node) is not None:
            return _parse_chain(node, text)
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


def _parse_unary(node: ast.UnaryOp, text: str) -> Expr:
    """``-x``, ``+x`` and runs of them; a run longer than LONG_CHAIN keeps only its parity
    (negation is exact, so ``--x`` is ``x`` to the bit)."""
    negations = 0
    while isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        negations += isinstance(node.op, ast.USub)
        node = node.operand
    if negations > LONG_CHAIN:
        negations %= 2
    inner = _literal(node, text)
    if negations and inner is not None:
        e: Expr = Const(-inner)
        negations -= 1
    else:
        e = _parse(node, text)
    for _ in range(negations):
        e = call("neg", e)
    return e


def _parse_chain(node: ast.BinOp, text: str) -> Expr:
    """A left-nested chain of ``+ -`` (or of ``*``), walked without recursion. Up to
    LONG_CHAIN terms it keeps the order written; a longer one is combined as a balanced
    tree, exact term by term, with depth log2(terms)."""
    kind = _chain_kind(node)
    terms: list[tuple[bool, ast.AST]] = []  # (subtracted, operand), last term first
    while isinstance(node, ast.BinOp) and _chain_kind(node) == kind:
        terms.append((isinstance(node.op, ast.Sub), node.right))
        node = node.left
    terms.append((False, node))
    terms.reverse()
    parsed = [(negative, _parse(operand, text)) for negative, operand in terms]
    if len(parsed) <= LONG_CHAIN:
        e = parsed[0][1]
        for negative, term in parsed[1:]:
            e = call("sub" if negative else _BINOPS_OF[kind], e, term)
        return e
    negative, e = _balanced(parsed, kind)
    return call("neg", e) if negative else e


_BINOPS_OF = {"sum": "add", "product": "mul"}


def _balanced(terms: list[tuple[bool, Expr]], kind: str) -> tuple[bool, Expr]:
    """Combine signed terms pairwise; returns (negated, e) with value -e when negated."""
    level = terms
    while len(level) > 1:
        pairs = [_combine(level[k], level[k + 1], kind) for k in range(0, len(level) - 1, 2)]
        level = pairs + ([level[-1]] if len(level) % 2 else [])
    return level[0]


def _combine(a: tuple[bool, Expr], b: tuple[bool, Expr], kind: str) -> tuple[bool, Expr]:
    (neg_a, ea), (neg_b, eb) = a, b
    if kind == "product":
        return False, call("mul", ea, eb)
    if neg_a == neg_b:
        return neg_a, call("add", ea, eb)
    return neg_a, call("sub", ea, eb)  # +a - b, or -(a - b) = -a + b


def _parse_name(name: str, text: str) -> Expr:
    m = _INPUT.match(name)
    if m:
        return Input(int(m.group(1)))
    if name in OPS or name in ("cast", "complex"):
        raise ExprError(f"{name!r} is a function in {text!r}; call it as {name}(...)")
    return Var(check_variable_name(name, repr(text)))


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
        inner = to_string(a)
        return f"-({inner})" if _precedence(a) < 4 else f"-{inner}"
    if rule.infix:
        a, b = e.args
        p = rule.precedence
        if p == 1:
            left_paren, right_paren = _precedence(a) <= p, _precedence(b) <= p
        elif e.op == "pow":
            left_paren, right_paren = _precedence(a) <= p, False
        else:
            left_paren, right_paren = _precedence(a) < p, _precedence(b) <= p
        left, right = to_string(a), to_string(b)
        return f"{f'({left})' if left_paren else left} {rule.infix} {f'({right})' if right_paren else right}"
    return f"{e.op}({', '.join(to_string(a) for a in e.args)})"
