"""The rule table of the join language: one entry per scalar operation.

Each entry holds everything about one op in one place: arity, how it prints,
its dtype rule, its partial derivatives (as expressions, so gradients stay in the
language) and its value on numpy scalars, which constant folding computes. A primitive's
kernel forms are the backends' tables, keyed by its name (engines/kernels/interpret.py's
``KERNELS``, ccodegen.py's ``_call``, triton.py's ``EAGER`` and ``UNARY``; tests/test_scalar.py
checks each names every primitive it runs). A composite op (gelu) has one more field, its
``expansion`` in primitives: its value is computed from it, and every kernel generator reads
the join through ``expand``, so the op has no form written anywhere else.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from einsummable.errors import DtypeError
from einsummable.ir.dtypes import COMPLEX, INTS, real_of
from einsummable.ir.expr import ONE, ZERO, Call, Const, Expr, Input, call, children, rebuild

Weak = str | None  # None is a weakly typed real scalar (a constant or a run-time variable)
Partials = Callable[[tuple[Expr, ...]], tuple[Expr, ...]]


@dataclass(frozen=True)
class OpRule:
    name: str
    arity: int
    value: Callable[..., object]  # the op on numpy scalars or arrays: what constant folding computes
    dtype: Callable[[str, tuple[Weak, ...]], Weak]
    partials: Partials | None
    infix: str | None = None
    precedence: int = 6
    commutative: bool = False
    expansion: Callable[[tuple[Expr, ...]], Expr] | None = None  # a composite: the op in primitives


def _unify(name: str, dts: tuple[Weak, ...]) -> Weak:
    concrete = {d for d in dts if d is not None and d != "bool"}
    if len(concrete) > 1:
        floats = concrete <= {"f16", "bf16", "f32", "f64"}  # Tensor operators promote these; a join does not
        how = ("a join does not promote (Tensor operators do): cast one operand in the join, as in "
               "cast(x1, f32)" if floats else "cast one operand so that they agree")
        raise DtypeError(f"dtype mismatch in {name}: operands are {', '.join(str(d) for d in dts)}; {how}")
    if concrete:
        return concrete.pop()
    if all(d == "bool" for d in dts):
        raise DtypeError(f"{name} of boolean operands; cast them to a number type first")
    if "bool" in dts:  # only a constant or variable beside it: nothing says which number type
        raise DtypeError(
            f"{name} of a boolean (a comparison) and a number: the result has no number type; "
            "cast the boolean first, as in cast(x0 > 0, f32) * 2, or use where(x0 > 0, 2, 0)"
        )
    return None


def _real_only(name: str, dts: tuple[Weak, ...]) -> Weak:
    out = _unify(name, dts)
    if out in COMPLEX:
        raise DtypeError(f"{name} is not defined for complex operands ({out}); use real() or abs()")
    return out


def _float_only(name: str, dts: tuple[Weak, ...]) -> Weak:
    """Ops whose value is no integer (exp, sqrt, division, ...): integers must be cast first."""
    out = _unify(name, dts)
    if out in INTS:
        what = "div (/)" if name == "div" else name
        raise DtypeError(
            f"{what} is not defined for integer operands ({out}): its value is no integer; cast the "
            "operand to a float first: cast(x0, f32) in a join, or x.astype('f32') on a tensor"
        )
    return out


def _real_float(name: str, dts: tuple[Weak, ...]) -> Weak:
    _float_only(name, dts)
    return _real_only(name, dts)


def _float_part(name: str, dts: tuple[Weak, ...]) -> Weak:
    _float_only(name, dts)
    return _to_real(name, dts)


def _to_real(name: str, dts: tuple[Weak, ...]) -> Weak:
    out = _unify(name, dts)
    return real_of(out) if out is not None else None


def _compare(name: str, dts: tuple[Weak, ...]) -> Weak:
    if "bool" in dts and all(d in ("bool", None) for d in dts):
        return "bool"  # a boolean against a constant, such as (x0 > 0) == 1
    out = _unify(name, dts)
    if out in COMPLEX and name not in ("eq", "ne"):
        raise DtypeError(f"{name} cannot order complex operands ({out})")
    return "bool"


def _where(name: str, dts: tuple[Weak, ...]) -> Weak:
    if dts[0] != "bool":
        raise DtypeError(f"where's condition must be a comparison (bool), got {dts[0] or 'a number'}")
    return _unify(name, dts[1:])


def _sigmoid(a: np.ndarray) -> np.ndarray:
    # torch's form. e^-a overflows to inf past a = -88 (f32), giving the limit 0; the
    # 0.5 tanh(a / 2) + 0.5 form rounds to 0 already past -17 and loses sigmoid's tail.
    return 1.0 / (1.0 + np.exp(-a))


def _silu(a: np.ndarray) -> np.ndarray:
    return a / (1.0 + np.exp(-a))  # torch's form: one rounding fewer than sigmoid(a) * a


GELU_C = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715
GELU_2C = 2.0 * GELU_C


def _gelu(a: tuple[Expr, ...]) -> Expr:
    """The tanh approximation (GPT-2's "gelu_new"), written as x sigmoid(2u) = x / (1 + e^-2u),
    u = c (x + 0.044715 x^3): 0.5 x (1 + tanh u) cancels to 0 in the negative tail (f32
    gelu(-5.25) is -1.57e-7, not -0), this keeps its relative accuracy; e^-2u overflows to inf
    far out, giving the limit -0 (-inf: NaN, as torch's)."""
    x = a[0]
    z = _mul(_mul(call("add", _mul(_mul(x, x), Const(GELU_A)), ONE), x), Const(GELU_2C))  # 2u
    return call("div", x, call("add", ONE, call("exp", _neg(z))))


def _composite(expansion: Callable[[tuple[Expr, ...]], Expr], arity: int) -> Callable[..., object]:
    """A composite op's value on numpy arrays: its expansion evaluated with the primitives' values
    (past exp's range the limits come out of inf, so numpy is not to warn)."""
    body = expansion(tuple(Input(k) for k in range(arity)))

    def value(*args: object) -> object:
        with np.errstate(over="ignore", invalid="ignore"):
            return _evaluate(body, args)

    return value


def _evaluate(e: Expr, args: tuple) -> object:
    if isinstance(e, Input):
        return args[e.index]
    if isinstance(e, Const):
        return e.value
    assert isinstance(e, Call), e
    return OPS[e.op].value(*(_evaluate(k, args) for k in e.args))


def expand(e: Expr) -> Expr:
    """``e`` with every composite op written out in primitives: what the kernel generators read."""
    parts = children(e)
    if not parts:
        return e
    new = tuple(expand(k) for k in parts)
    if isinstance(e, Call) and OPS[e.op].expansion is not None:
        return expand(OPS[e.op].expansion(new))
    return e if new == parts else rebuild(e, new)


def _neg(e: Expr) -> Expr:
    return call("neg", e)


def _mul(a: Expr, b: Expr) -> Expr:
    return call("mul", a, b)


def _sub(a: Expr, b: Expr) -> Expr:
    return call("sub", a, b)


def _indicator(cond: Expr) -> Expr:
    return call("where", cond, ONE, ZERO)


def _gelu_partial(a: Expr) -> Expr:
    """d/dx x s(2u) = s(2u) + x s(2u) s(-2u) 2u': no 1 + tanh to cancel in the tail."""
    a2 = call("pow", a, Const(2.0))
    z = _mul(_mul(call("add", _mul(a2, Const(GELU_A)), ONE), a), Const(GELU_2C))  # 2u
    dz = _mul(call("add", _mul(a2, Const(3 * GELU_A)), ONE), Const(GELU_2C))  # 2u'
    s = _sig(z)
    return call("add", s, _mul(_mul(a, s), _mul(_sig(_neg(z)), dz)))


def _sig(a: Expr) -> Expr:
    return call("sigmoid", a)


def _pow_partials(args: tuple[Expr, ...]) -> tuple[Expr, ...]:
    a, c = args
    assert isinstance(c, Const)
    return (_mul(c, call("pow", a, Const(c.value - 1))), ZERO)


_ops = [
    OpRule("add", 2, np.add, _unify, lambda a: (ONE, ONE),
          infix="+", precedence=2, commutative=True),
    OpRule("sub", 2, np.subtract, _unify, lambda a: (ONE, Const(-1.0)),
          infix="-", precedence=2),
    OpRule("mul", 2, np.multiply, _unify, lambda a: (a[1], a[0]),
          infix="*", precedence=3, commutative=True),
    OpRule("div", 2, np.divide, _float_only,
          lambda a: (call("div", ONE, a[1]),
                     _neg(call("div", a[0], call("pow", a[1], Const(2.0))))),
          infix="/", precedence=3),
    OpRule("pow", 2, np.power, lambda n, d: _unify(n, d[:1]), _pow_partials,
          infix="**", precedence=5),
    OpRule("neg", 1, np.negative, _unify, lambda a: (Const(-1.0),), precedence=4),
    OpRule("abs", 1, np.absolute, _to_real,
          lambda a: (call("where", call("ge", a[0], ZERO), ONE, Const(-1.0)),)),
    OpRule("exp", 1, np.exp, _float_only, lambda a: (call("exp", a[0]),)),
    OpRule("log", 1, np.log, _float_only, lambda a: (call("div", ONE, a[0]),)),
    OpRule("sqrt", 1, np.sqrt, _float_only,
          lambda a: (_mul(Const(0.5), call("rsqrt", a[0])),)),
    OpRule("rsqrt", 1, lambda a: 1.0 / np.sqrt(a), _float_only,
          lambda a: (_mul(Const(-0.5), call("div", call("rsqrt", a[0]), a[0])),)),
    OpRule("sin", 1, np.sin, _float_only, lambda a: (call("cos", a[0]),)),
    OpRule("cos", 1, np.cos, _float_only, lambda a: (_neg(call("sin", a[0])),)),
    OpRule("tanh", 1, np.tanh, _float_only,
          lambda a: (_sub(ONE, call("pow", call("tanh", a[0]), Const(2.0))),)),
    OpRule("sigmoid", 1, _sigmoid, _real_float,
          lambda a: (_mul(_sig(a[0]), _sub(ONE, _sig(a[0]))),)),
    OpRule("silu", 1, _silu, _real_float,
          lambda a: (_mul(_sig(a[0]), call("add", ONE, _mul(a[0], _sub(ONE, _sig(a[0]))))),)),
    OpRule("relu", 1, lambda a: np.maximum(a, 0), _real_only,
          lambda a: (_indicator(call("gt", a[0], ZERO)),)),
    OpRule("gelu", 1, _composite(_gelu, 1), _real_float, lambda a: (_gelu_partial(a[0]),), expansion=_gelu),
    # Ties send the whole gradient to the first operand.
    OpRule("min", 2, np.minimum, _real_only,
          lambda a: (_indicator(call("le", a[0], a[1])), _indicator(call("gt", a[0], a[1]))),
          commutative=True),
    OpRule("max", 2, np.maximum, _real_only,
          lambda a: (_indicator(call("ge", a[0], a[1])), _indicator(call("lt", a[0], a[1]))),
          commutative=True),
    OpRule("lt", 2, np.less, _compare, None, infix="<", precedence=1),
    OpRule("le", 2, np.less_equal, _compare, None, infix="<=", precedence=1),
    OpRule("gt", 2, np.greater, _compare, None, infix=">", precedence=1),
    OpRule("ge", 2, np.greater_equal, _compare, None, infix=">=", precedence=1),
    OpRule("eq", 2, np.equal, _compare, None, infix="==", precedence=1),
    OpRule("ne", 2, np.not_equal, _compare, None, infix="!=", precedence=1),
    OpRule("where", 3, np.where, _where, None),
    # The value passes through; the gradient stops (softmax's max: it shifts, never scales).
    OpRule("stop_gradient", 1, lambda a: a, _unify, lambda a: (ZERO,)),
    OpRule("conj", 1, np.conjugate, _float_only, None),
    OpRule("real", 1, np.real, _float_part, None),
    OpRule("imag", 1, np.imag, _float_part, None),
]
OPS: dict[str, OpRule] = {r.name: r for r in _ops}
INFIX: dict[str, str] = {r.infix: r.name for r in _ops if r.infix}
LINEAR_UNARY = ("conj", "real", "imag")  # differentiated by applying the op to the tangent


def is_call(e: Expr, op: str) -> bool:
    return isinstance(e, Call) and e.op == op
