"""The rule table of the join language: one entry per scalar operation.

Each entry holds everything about one op in one place: arity, how it prints,
its dtype rule, its partial derivatives (as expressions, so gradients stay in the
language) and its numpy kernel, which writes into an ``out`` buffer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from einsummable.errors import DtypeError
from einsummable.ir.dtypes import COMPLEX, real_of
from einsummable.ir.expr import ONE, ZERO, Call, Const, Expr, call

Weak = str | None  # None is a weakly typed real scalar (a constant or a run-time variable)
Kernel = Callable[..., None]
Partials = Callable[[tuple[Expr, ...]], tuple[Expr, ...]]


@dataclass(frozen=True)
class OpRule:
    name: str
    arity: int
    kernel: Kernel
    dtype: Callable[[str, tuple[Weak, ...]], Weak]
    partials: Partials | None
    infix: str | None = None
    precedence: int = 6
    commutative: bool = False
    inplace: bool = True  # the kernel may write into a buffer that one of its args occupies


def _unify(name: str, dts: tuple[Weak, ...]) -> Weak:
    concrete = {d for d in dts if d is not None and d != "bool"}
    if len(concrete) > 1:
        raise DtypeError(
            f"dtype mismatch in {name}: operands are {', '.join(str(d) for d in dts)}; "
            "cast one operand so that they agree"
        )
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


def _ufunc(uf: np.ufunc) -> Kernel:
    def kernel(out: np.ndarray, *args: np.ndarray) -> None:
        uf(*args, out=out)

    return kernel


def _sigmoid(out: np.ndarray, a: np.ndarray) -> None:
    # 0.5 * tanh(0.5 a) + 0.5: stable for large |a|, and four ufunc calls in place.
    np.multiply(a, 0.5, out=out)
    np.tanh(out, out=out)
    np.multiply(out, 0.5, out=out)
    np.add(out, 0.5, out=out)


def _silu(out: np.ndarray, a: np.ndarray) -> None:
    _sigmoid(out, a)
    np.multiply(out, a, out=out)


GELU_C = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715


def _gelu(out: np.ndarray, a: np.ndarray) -> None:
    # The tanh approximation (GPT-2, "gelu_new"): numpy has no vectorised erf.
    np.multiply(a, a, out=out)
    np.multiply(out, GELU_A, out=out)
    np.add(out, 1.0, out=out)
    np.multiply(out, a, out=out)
    np.multiply(out, GELU_C, out=out)
    np.tanh(out, out=out)
    np.add(out, 1.0, out=out)
    np.multiply(out, a, out=out)
    np.multiply(out, 0.5, out=out)


def _rsqrt(out: np.ndarray, a: np.ndarray) -> None:
    np.sqrt(a, out=out)
    np.reciprocal(out, out=out)


def _relu(out: np.ndarray, a: np.ndarray) -> None:
    np.maximum(a, 0, out=out)


_SAME_SIZE_INT = {2: np.int16, 4: np.int32, 8: np.int64}


def _where_kernel(out: np.ndarray, c: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    # A bitwise select, (a & m) | (b & ~m) with m all ones where c holds: exact for every
    # value (nan and inf included) and branch-free; copyto(where=) on a random mask is ~10x slower.
    itype = _SAME_SIZE_INT.get(out.dtype.itemsize)
    if itype is None or out.dtype == np.bool_ or out.dtype.kind == "c":
        np.copyto(out, b)
        np.copyto(out, a, where=c)
        return
    mask = np.asarray(c).astype(itype)
    np.negative(mask, out=mask)
    bits = out.view(itype)
    np.bitwise_and(_bits(a, out.dtype, itype), mask, out=bits)
    if not (np.ndim(b) == 0 and float(b) == 0.0 and math.copysign(1.0, float(b)) > 0):
        np.bitwise_or(bits, np.bitwise_and(_bits(b, out.dtype, itype), np.invert(mask)), out=bits)


def _bits(x: np.ndarray | float, dtype: np.dtype, itype: type) -> np.ndarray:
    arr = np.asarray(x, dtype=dtype) if not isinstance(x, np.ndarray) or x.dtype != dtype else x
    return arr.view(itype)


def _real(out: np.ndarray, a: np.ndarray) -> None:
    np.copyto(out, np.real(a))


def _imag(out: np.ndarray, a: np.ndarray) -> None:
    np.copyto(out, np.imag(a))


def _copy(out: np.ndarray, a: np.ndarray) -> None:
    np.copyto(out, a)


def _pow_kernel(out: np.ndarray, a: np.ndarray, c: float) -> None:
    if c == 2:
        np.multiply(a, a, out=out)
    elif c == 0.5:
        np.sqrt(a, out=out)
    elif c == -1:
        np.reciprocal(a, out=out)
    elif c == 1:
        np.copyto(out, a)
    else:
        np.power(a, c, out=out)


def _neg(e: Expr) -> Expr:
    return call("neg", e)


def _mul(a: Expr, b: Expr) -> Expr:
    return call("mul", a, b)


def _sub(a: Expr, b: Expr) -> Expr:
    return call("sub", a, b)


def _indicator(cond: Expr) -> Expr:
    return call("where", cond, ONE, ZERO)


def _gelu_partial(a: Expr) -> Expr:
    u = _mul(Const(GELU_C), call("add", a, _mul(Const(GELU_A), call("pow", a, Const(3.0)))))
    t = call("tanh", u)
    du = _mul(Const(GELU_C), call("add", ONE, _mul(Const(3 * GELU_A), call("pow", a, Const(2.0)))))
    left = _mul(Const(0.5), call("add", ONE, t))
    right = _mul(_mul(Const(0.5), a), _mul(_sub(ONE, call("pow", t, Const(2.0))), du))
    return call("add", left, right)


def _sig(a: Expr) -> Expr:
    return call("sigmoid", a)


def _pow_partials(args: tuple[Expr, ...]) -> tuple[Expr, ...]:
    a, c = args
    assert isinstance(c, Const)
    return (_mul(c, call("pow", a, Const(c.value - 1))), ZERO)


_ops = [
    OpRule("add", 2, _ufunc(np.add), _unify, lambda a: (ONE, ONE),
          infix="+", precedence=2, commutative=True),
    OpRule("sub", 2, _ufunc(np.subtract), _unify, lambda a: (ONE, Const(-1.0)),
          infix="-", precedence=2),
    OpRule("mul", 2, _ufunc(np.multiply), _unify, lambda a: (a[1], a[0]),
          infix="*", precedence=3, commutative=True),
    OpRule("div", 2, _ufunc(np.divide), _unify,
          lambda a: (call("div", ONE, a[1]),
                     _neg(call("div", a[0], call("pow", a[1], Const(2.0))))),
          infix="/", precedence=3),
    OpRule("pow", 2, _pow_kernel, lambda n, d: _unify(n, d[:1]), _pow_partials,
          infix="**", precedence=5),
    OpRule("neg", 1, _ufunc(np.negative), _unify, lambda a: (Const(-1.0),), precedence=4),
    OpRule("abs", 1, _ufunc(np.absolute), _to_real,
          lambda a: (call("where", call("ge", a[0], ZERO), ONE, Const(-1.0)),)),
    OpRule("exp", 1, _ufunc(np.exp), _unify, lambda a: (call("exp", a[0]),)),
    OpRule("log", 1, _ufunc(np.log), _unify, lambda a: (call("div", ONE, a[0]),)),
    OpRule("sqrt", 1, _ufunc(np.sqrt), _unify,
          lambda a: (_mul(Const(0.5), call("rsqrt", a[0])),)),
    OpRule("rsqrt", 1, _rsqrt, _unify,
          lambda a: (_mul(Const(-0.5), call("div", call("rsqrt", a[0]), a[0])),)),
    OpRule("sin", 1, _ufunc(np.sin), _unify, lambda a: (call("cos", a[0]),)),
    OpRule("cos", 1, _ufunc(np.cos), _unify, lambda a: (_neg(call("sin", a[0])),)),
    OpRule("tanh", 1, _ufunc(np.tanh), _unify,
          lambda a: (_sub(ONE, call("pow", call("tanh", a[0]), Const(2.0))),)),
    OpRule("sigmoid", 1, _sigmoid, _real_only,
          lambda a: (_mul(_sig(a[0]), _sub(ONE, _sig(a[0]))),)),
    OpRule("silu", 1, _silu, _real_only,
          lambda a: (_mul(_sig(a[0]), call("add", ONE, _mul(a[0], _sub(ONE, _sig(a[0]))))),),
          inplace=False),
    OpRule("relu", 1, _relu, _real_only, lambda a: (_indicator(call("gt", a[0], ZERO)),)),
    OpRule("gelu", 1, _gelu, _real_only, lambda a: (_gelu_partial(a[0]),), inplace=False),
    # Ties send the whole gradient to the first operand.
    OpRule("min", 2, _ufunc(np.minimum), _real_only,
          lambda a: (_indicator(call("le", a[0], a[1])), _indicator(call("gt", a[0], a[1]))),
          commutative=True),
    OpRule("max", 2, _ufunc(np.maximum), _real_only,
          lambda a: (_indicator(call("ge", a[0], a[1])), _indicator(call("lt", a[0], a[1]))),
          commutative=True),
    OpRule("lt", 2, _ufunc(np.less), _compare, None, infix="<", precedence=1),
    OpRule("le", 2, _ufunc(np.less_equal), _compare, None, infix="<=", precedence=1),
    OpRule("gt", 2, _ufunc(np.greater), _compare, None, infix=">", precedence=1),
    OpRule("ge", 2, _ufunc(np.greater_equal), _compare, None, infix=">=", precedence=1),
    OpRule("eq", 2, _ufunc(np.equal), _compare, None, infix="==", precedence=1),
    OpRule("ne", 2, _ufunc(np.not_equal), _compare, None, infix="!=", precedence=1),
    OpRule("where", 3, _where_kernel, _where, None, inplace=False),
    # The value passes through; the gradient stops (softmax's max: it shifts, never scales).
    OpRule("stop_gradient", 1, _copy, _unify, lambda a: (ZERO,)),
    OpRule("conj", 1, _ufunc(np.conjugate), _unify, None),
    OpRule("real", 1, _real, _to_real, None),
    OpRule("imag", 1, _imag, _to_real, None),
]
OPS: dict[str, OpRule] = {r.name: r for r in _ops}
INFIX: dict[str, str] = {r.infix: r.name for r in _ops if r.infix}
LINEAR_UNARY = ("conj", "real", "imag")  # differentiated by applying the op to the tangent


def is_call(e: Expr, op: str) -> bool:
    return isinstance(e, Call) and e.op == op
