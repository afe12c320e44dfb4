"""C source for one einsummable over a block: its join, fused with its aggregation, in one pass.

The generated function depends on the op's structure (join, dtypes, index tuples,
aggregation, loop order), not on its sizes: sizes and strides are arguments, so all
the blocks of a node, and every node of the same form, share one function.

Semantics follow the numpy path (``engines.interpret.Compiled``) value for value:
- every step of the join rounds to its dtype; constants and run-time variables are
  weak (they take the other operand's type; an all-weak step runs in double);
- half types (f16, bf16) load as f32, compute in f32 and round once at the store
  (round to nearest even), or where an explicit cast to a half type stands; reductions
  accumulate in f32 and hand the f32 accumulator back (the caller rounds it once);
- ``where`` is a select, ``min``/``max`` propagate NaN and return the second operand
  on ties (as ``np.minimum``/``np.maximum`` do); no ``-ffast-math``: NaN, ±inf and
  −0.0 keep their IEEE meaning.
- integers (i32, i64: ids and indices) are read, compared and cast to f32 or f64 here
  (a one-hot ``where(x0 == x1, g, 0)`` of int ids); a comparison with a constant runs in
  double, as numpy's does. Integer arithmetic and integer results stay on numpy (C's
  signed overflow is undefined, numpy's wraps), as do casts to integers and half types.
Unsupported ops and dtypes (complex) return None: that kernel stays on numpy.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from einsummable.engines.kernels.cprelude import VECTOR_MATH
from einsummable.errors import Unsupported
from einsummable.ir import scalar
from einsummable.ir.dtypes import INTS
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.expr import Call, Cast, Const, Expr, Input, Var, inputs_used, variables_used
from einsummable.ir.scalar_ops import expand

# storage type, compute type per dtype
STORAGE = {"f32": "float", "f64": "double", "bf16": "uint16_t", "f16": "_Float16", "bool": "uint8_t",
           "i32": "int32_t", "i64": "int64_t"}
COMPUTE = {"f32": "float", "f64": "double", "bf16": "float", "f16": "float", "bool": "int",
           "i32": "int32_t", "i64": "int64_t"}
INT_TYPES = ("int32_t", "int64_t")
IDENTITY = {"add": "0.0", "mul": "1.0", "min": "INFINITY", "max": "-INFINITY"}
LANES = {"float": 32, "double": 16, "int": 32}  # a reduction's accumulators: two 512-bit vectors


@dataclass(frozen=True)
class Source:
    """One generated function: its name, its C text, and what the caller passes it."""

    name: str
    text: str
    order: tuple[int, ...]        # join dims, outermost loop first
    variables: tuple[str, ...]    # run-time variables, in the order of the ``vars`` argument
    accumulate_f32: bool          # a half reduction: the output is an f32 accumulator


def generate(op: Einsummable) -> Source | None:
    """The C function for ``op``, or None where it has no C form.

    Cached by the op's form: a program's thousands of blocks share a few dozen functions.
    """
    key = (op.join, op.dtypes, op.inputs, op.out_rank, op.agg, op.rank, loop_order(op))
    if key not in _generated:
        try:
            _generated[key] = _generate(op)
        except Unsupported:
            _generated[key] = None
    return _generated[key]


_generated: dict[tuple, Source | None] = {}


def loop_order(op: Einsummable) -> tuple[int, ...]:
    """Join dims outermost first: output order for elementwise joins; for reductions the
    largest operand's memory order (as the numpy path walks it), so the inner loop streams."""
    if op.agg is None or not op.inputs:
        return tuple(range(op.rank))
    biggest = max(op.inputs, key=lambda idx: math.prod(op.join_shape[i] for i in idx))
    return (*(i for i in range(op.rank) if i not in biggest), *biggest)


def _generate(op: Einsummable) -> Source:
    """Everything below depends on the op's form alone, never on its sizes."""
    for d in (*op.dtypes, op.dtype):
        if d not in STORAGE:
            raise Unsupported(d)
    if op.dtype == "bool" or op.dtype in INTS:
        raise Unsupported(f"{op.dtype} output")
    order = loop_order(op)
    names = tuple(sorted(variables_used(op.join)))
    emitter = _Emitter(op, names)
    value = emitter.root()
    half_out = op.dtype in ("bf16", "f16")
    acc_t = "float" if half_out or op.dtype == "f32" else COMPUTE[op.dtype]
    key = repr((scalar.to_string(op.join), op.dtypes, op.inputs, op.out_rank, op.agg, op.rank, order))
    name = "k_" + hashlib.sha256(key.encode()).hexdigest()[:20]
    body = _loops(op, order, emitter, value, acc_t)
    text = (f"void {name}(char **in_, const int64_t *n, const int64_t *s, const double *vars, char *out_)\n"
            f"{{\n{body}}}\n")
    return Source(name, text, order, names, bool(op.agg) and half_out)


class _Emitter:
    """The join as C statements, one temporary per step, typed as the numpy path types it."""

    def __init__(self, op: Einsummable, variables: tuple[str, ...]) -> None:
        self.op = op
        self.variables = variables
        self.result = COMPUTE[op.dtype]
        self.lines: list[str] = []
        self.reads: list[set[int]] = []  # the inputs each line reads, directly or not
        self.memo: dict[Expr, tuple[str, str | None]] = {}
        self.exp_args: list[str] = []  # "outside exp's fast range" test of each f64 exp's argument

    def root(self) -> str:
        return self.emit(expand(self.op.join))[0]  # a composite op (gelu) as its primitives

    def temp(self, ctype: str, code: str) -> str:
        name = f"t{len(self.lines)}"
        self.lines.append(f"{ctype} {name} = {code};")
        return name

    def emit(self, e: Expr) -> tuple[str, str | None]:
        """(C expression, its type); type None marks a weak scalar (a Python number in numpy)."""
        if e not in self.memo:
            self.memo[e] = self._emit(e)
            if len(self.reads) < len(self.lines):  # the line just written computes e
                self.reads.append(inputs_used(e))
        return self.memo[e]

    def _emit(self, e: Expr) -> tuple[str, str | None]:
        if isinstance(e, Input):
            return f"v{e.index}", COMPUTE[self.op.dtypes[e.index]]
        if isinstance(e, Const):
            return _literal(e.value), None
        if isinstance(e, Var):
            return f"vars[{self.variables.index(e.name)}]", None
        if isinstance(e, Cast):
            code, ctype = self.emit(e.arg)
            if e.dtype not in COMPUTE or e.dtype == "bool" or ctype == "int" or e.dtype in INTS or (
                    ctype in INT_TYPES and e.dtype not in ("f32", "f64")):
                raise Unsupported(f"cast to {e.dtype}")
            target = COMPUTE[e.dtype]
            code = f"(({target})({code}))"
            if e.dtype == "bf16":
                code = f"rd_bf16({code})"
            elif e.dtype == "f16":
                code = f"rd_f16({code})"
            return self.temp(target, code), target
        assert isinstance(e, Call)
        if e.op == "stop_gradient":
            return self.emit(e.args[0])
        if e.op == "pow":
            return self._pow(e)
        operands = e.args[1:] if e.op == "where" else e.args  # a where's condition is no operand
        args = [self.emit(a) for a in operands]
        step = self._step_type(e)
        typed = [t for _, t in args if t is not None and t != "int"]
        work = "double" if "double" in typed else (typed[0] if typed else "double")
        if work in INT_TYPES and any(t is None for _, t in args):
            work = "double"  # an integer against a constant: numpy compares them as doubles

        def arg(k: int) -> str:
            code, t = args[k]
            return code if t == work else f"(({work})({code}))"

        if e.op == "where":
            cond, _ = self.emit(e.args[0])
            return self.temp(step, f"({cond}) ? ({step})({arg(0)}) : ({step})({arg(1)})"), step
        code = _call(e.op, work, [arg(k) for k in range(len(args))])
        if e.op == "exp" and work == "double":
            self.exp_args.append(f"EXP_FAR_d({arg(0)})")
        if e.op in ("lt", "le", "gt", "ge", "eq", "ne"):
            return self.temp("int", code), "int"
        return self.temp(step, f"({step})({code})"), step

    def _step_type(self, e: Expr) -> str:
        """The buffer dtype numpy gives this step: its own dtype, else the op's result dtype."""
        d = scalar.dtype_of(e, self.op.dtypes)
        if d in ("c64",):
            raise Unsupported("complex")
        if d in INTS:
            raise Unsupported("integer arithmetic")
        return COMPUTE[d] if d is not None else self.result

    def _pow(self, e: Call) -> tuple[str, str]:
        base, exponent = e.args
        assert isinstance(exponent, Const)
        c = exponent.value
        code, t = self.emit(base)
        step = self._step_type(e)
        work = t if t is not None else "double"
        a = code if t == work else f"(({work})({code}))"
        if isinstance(c, complex):
            raise Unsupported("complex")
        fn = "" if work == "double" else "f"
        if c == 2:
            out = f"{a} * {a}"
        elif c == 0.5:
            out = f"sqrt{fn}({a})"
        elif c == -1:
            out = f"({work})1.0 / {a}"
        elif c == 1:
            out = a
        else:
            out = f"pow{fn}({a}, ({work}){_literal(c)})"
        return self.temp(step, f"({step})({out})"), step


def _literal(v: float | complex) -> str:
    if isinstance(v, complex):
        raise Unsupported("complex constant")
    v = float(v)
    if math.isnan(v):
        return "(double)NAN"
    if math.isinf(v):
        return "(double)INFINITY" if v > 0 else "(-(double)INFINITY)"
    return f"({v.hex()})"


def _call(op: str, t: str, a: list[str]) -> str:
    f = "" if t == "double" else "f"
    one = f"(({t})1.0)"
    binary = {"add": "+", "sub": "-", "mul": "*", "div": "/",
              "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
    if op in binary:
        return f"{a[0]} {binary[op]} {a[1]}"
    if op == "neg":
        return f"-{a[0]}"
    if op == "abs":
        return f"fabs{f}({a[0]})"
    if op == "exp":  # exp_f / exp_d: see cprelude; an f64 loop may call plain exp
        return f"exp_{t[0]}({a[0]})"
    if op in VECTOR_MATH or op == "sqrt":
        return f"{op}{f}({a[0]})"
    if op == "rsqrt":
        return f"{one} / sqrt{f}({a[0]})"
    if op == "sigmoid":  # ir/scalar_ops.py's forms, step for step: only exp differs (ulps)
        return f"{one} / one_plus_exp_neg_{t[0]}({a[0]})"
    if op == "silu":
        return f"{a[0]} / one_plus_exp_neg_{t[0]}({a[0]})"
    if op == "relu":
        return f"NMAX({a[0]}, ({t})0.0)"
    if op == "max":
        return f"NMAX({a[0]}, {a[1]})"
    if op == "min":
        return f"NMIN({a[0]}, {a[1]})"
    raise Unsupported(op)


def _loops(op: Einsummable, order: tuple[int, ...], em: _Emitter, value: str, acc_t: str) -> str:
    """The loop nest over the join in ``order``; the innermost loop is written twice, unit
    stride (so it vectorises) and general."""
    rank, out_rank = op.rank, op.out_rank
    lines = []
    for k, d in enumerate(op.dtypes):
        lines.append(f"const {STORAGE[d]} *restrict x{k} = (const {STORAGE[d]} *)in_[{k}];")
    out_store = acc_t if op.agg else STORAGE[op.dtype]
    lines.append(f"{out_store} *restrict y = ({out_store} *)out_;")
    for k, idx in enumerate(op.inputs):
        for d in idx:
            lines.append(f"const int64_t s{k}_{d} = s[{k * rank + d}];")
    # the output is contiguous, row-major in its first out_rank dims
    stride = "1"
    for d in reversed(range(out_rank)):
        lines.append(f"const int64_t o_{d} = {stride};")
        stride = f"o_{d} * n[{d}]"
    if op.agg:
        lines.append(f"for (int64_t i = 0; i < {stride}; i++) y[i] = ({acc_t}){IDENTITY[op.agg]};")
    offsets = {k: "0" for k in range(len(op.inputs))} | {"y": "0"}
    operands = range(len(op.inputs))
    contiguous = _contiguous(op)
    if contiguous:  # one loop over the whole block, not a loop per row (~5% on silu(x) * y)
        total = " * ".join(f"n[{d}]" for d in range(rank))
        lines += [f"if ({contiguous}) {{", f"  const int64_t n_all = {total};",
                  *_inner(op, em, value, rank - 1, dict(offsets), True, acc_t, "  ", n="n_all"),
                  "  return;", "}"]
    depth = 0
    for d in order[:-1] if rank else ():
        lines += _loop(op, d, operands, offsets, "  " * depth)
        depth += 1
    pad = "  " * depth
    if not rank:
        body = _body(op, em, value, None, offsets, False, acc_t, pad)
        lines += [pad + "{", *body, pad + "}"]
    else:
        lines += _streamed(op, em, value, order[-1], operands, offsets, acc_t, pad)
    for level in reversed(range(depth)):
        lines.append("  " * level + "}")
    return "".join("  " + line + "\n" for line in lines)


def _loop(op: Einsummable, d: int, operands: Sequence[int], offsets: dict, pad: str) -> list[str]:
    """The loop over join dim ``d`` opened (its body at ``pad`` + 2), with the offset of each of
    ``operands`` that ``d`` indexes advanced, and the output's where ``d`` is one of its dims."""
    lines = [f"{pad}for (int64_t i{d} = 0; i{d} < n[{d}]; i{d}++) {{"]
    for k in operands:
        if d in op.inputs[k]:
            lines.append(f"{pad}  const int64_t a{k}_{d} = {offsets[k]} + i{d} * s{k}_{d};")
            offsets[k] = f"a{k}_{d}"
    if d < op.out_rank:
        lines.append(f"{pad}  const int64_t ay_{d} = {offsets['y']} + i{d} * o_{d};")
        offsets["y"] = f"ay_{d}"
    return lines


def _streamed(op, em, value, d, operands, offsets, acc_t, pad) -> list[str]:
    """The innermost loop, over ``d``, written twice: unit stride (so it vectorises) and general."""
    unit = [f"s{k}_{d} == 1" for k in operands if d in op.inputs[k]]
    if d < op.out_rank:
        unit.append(f"o_{d} == 1")
    return [f"{pad}if ({' && '.join(unit) or '1'}) {{",
            *_inner(op, em, value, d, offsets, True, acc_t, pad + "  "),
            f"{pad}}} else {{",
            *_inner(op, em, value, d, offsets, False, acc_t, pad + "  "),
            f"{pad}}}"]


def _contiguous(op: Einsummable) -> str | None:
    """For an elementwise join whose operands are each the whole join or a scalar: the run-time
    test that every whole operand is C-contiguous, so the block is one flat loop."""
    full = tuple(range(op.rank))
    if op.agg or op.rank < 2 or op.out_rank != op.rank or any(idx not in (full, ()) for idx in op.inputs):
        return None
    tests = [f"s{k}_{op.rank - 1} == 1" for k, idx in enumerate(op.inputs) if idx]
    tests += [f"s{k}_{d} == n[{d + 1}] * s{k}_{d + 1}" for k, idx in enumerate(op.inputs) if idx
              for d in range(op.rank - 1)]
    return " && ".join(tests) or "1"


def _inner(op, em, value, inner, offsets, unit, acc_t, pad, n: str | None = None) -> list[str]:
    n = n or f"n[{inner}]"
    reducing = op.agg is not None and inner >= op.out_rank
    lines = _body(op, em, value, inner, offsets, unit, acc_t, pad, invariant=True)
    body = _body(op, em, value, inner, offsets, unit, acc_t, pad + "  ", invariant=False)
    if reducing:
        folds = [("acc", f"({acc_t}){IDENTITY[op.agg]}", lambda a, b: _combine(op.agg, a, b))]
        if op.agg in ORDERED:  # see _ordered
            folds = [("acc", folds[0][1], lambda a, b: _ordered(op.agg, a, b)),
                     ("nan", f"({acc_t})0", lambda a, b: f"{b} != {b} ? {b} : {a}")]
        lines += [f"{pad}{acc_t} {name}[{LANES[acc_t]}];" for name, _, _ in folds]
        loop = _lanes(pad, n, LANES[acc_t], folds, body)
    else:
        loop = [f"{pad}#pragma omp simd", f"{pad}for (int64_t j = 0; j < {n}; j++) {{", *body, pad + "}"]
    if em.exp_args:  # plain exp where every argument of this row is in its fast range
        tests = [f"{pad}  far[l] |= {test};" for test in em.exp_args]
        check = _lanes(pad, n, LANES["int"], [("far", "0", lambda a, b: f"{a} | {b}")], body[:-1] + tests)
        plain = [line.replace("exp_d(", "exp(") for line in loop]
        lines += [f"{pad}int far[{LANES['int']}];", *check,
                  f"{pad}if (far[0]) {{", *loop, f"{pad}}} else {{", *plain, pad + "}"]
    else:
        lines += loop
    if reducing:
        target = f"y[{offsets['y']}]"
        lane = "(nan[0] != nan[0] ? nan[0] : acc[0])" if op.agg in ORDERED else "acc[0]"
        lines.append(f"{pad}{target} = {_combine(op.agg, target, lane)};")
    return lines


def _lanes(pad, n, w, folds, body) -> list[str]:
    """A reduction along the inner loop into ``w`` lanes, two vectors' worth, then a tree
    over the lanes into lane 0; ``folds`` are the lane arrays, each (name, identity,
    combine). gcc's ``omp simd reduction`` left such loops scalar where the join read
    several operands (a serial chain of adds: rmsnorm backward's row sum took 0.24 ms,
    now 0.05); the lanes reassociate an add or mul as any vector reduction does.
    (One vector of lanes measured ~20% faster on rows of 512, 0.023 ms against 0.028, but
    moved tests/train/test_accumulation's local-vs-reference weights past its 1e-5.)
    ``body`` reads element ``j`` and folds it into lane ``l``."""
    head = f"{pad}  const int64_t j = j0 + l;"
    init = " ".join(f"{name}[l] = {identity};" for name, identity, _ in folds)
    return [
        f"{pad}for (int64_t l = 0; l < {w}; l++) {{ {init} }}",
        f"{pad}for (int64_t j0 = 0; j0 < {n} / {w} * {w}; j0 += {w}) {{",
        f"{pad}#pragma omp simd",
        f"{pad}for (int64_t l = 0; l < {w}; l++) {{", head, *body, pad + "}",
        pad + "}",
        f"{pad}for (int64_t j0 = {n} / {w} * {w}, l = 0; l < {n} - j0; l++) {{", head, *body, pad + "}",
    ] + [f"{pad}for (int64_t l = 0; l < {h}; l++) {{ "
         + " ".join(f"{name}[l] = {combine(f'{name}[l]', f'{name}[l + {h}]')};" for name, _, combine in folds)
         + " }" for h in (w >> k for k in range(1, w.bit_length())) if h]  # constant widths: vector halves


def _body(op, em, value, inner, offsets, unit, acc_t, pad, invariant=None) -> list[str]:
    """Loads, the join's steps and the store for the element at ``j`` of the inner loop.

    With ``invariant`` True, only the loads and steps that do not change along the inner
    loop (they read no operand indexed by it): they run once before it, as numpy's
    broadcasting runs them once at their own shape. With False, the rest and the store.
    """
    lines = []
    fixed = {k for k, idx in enumerate(op.inputs) if inner is None or inner not in idx}
    if invariant is not None:
        keep = [(reads <= fixed) == invariant for reads in em.reads]
        loads = [(k in fixed) == invariant for k in range(len(op.inputs))]
    else:
        keep, loads = [True] * len(em.lines), [True] * len(op.inputs)
    for k, (idx, d) in enumerate(zip(op.inputs, op.dtypes, strict=True)):
        if not loads[k]:
            continue
        at = offsets[k]
        if inner is not None and inner in idx:
            at = f"{at} + j" if unit else f"{at} + j * s{k}_{inner}"
        load = f"x{k}[{at}]"
        load = f"ld_bf16({load})" if d == "bf16" else f"({COMPUTE[d]}){load}"
        lines.append(f"{pad}const {COMPUTE[d]} v{k} = {load};")
    lines += [pad + line for line, kept in zip(em.lines, keep, strict=True) if kept]
    if invariant:
        return lines
    at = offsets["y"]
    if inner is not None and inner < op.out_rank:
        at = f"{at} + j" if unit else f"{at} + j * o_{inner}"
    if op.agg is None:
        if op.dtype == "bf16":
            store = f"st_bf16((float)({value}))"
        else:
            store = f"({STORAGE[op.dtype]})({COMPUTE[op.dtype]})({value})"
        lines.append(f"{pad}y[{at}] = {store};")
    else:
        v = f"({acc_t})({COMPUTE[op.dtype]})({value})"
        if inner is not None and inner >= op.out_rank and op.agg in ORDERED:
            keep_nan = "nan[l] = fold != fold ? fold : nan[l];"
            lines += [f"{pad}const {acc_t} fold = {v};",
                      f"{pad}acc[l] = {_ordered(op.agg, 'acc[l]', 'fold')}; {keep_nan}"]
        elif inner is not None and inner >= op.out_rank:
            lines.append(f"{pad}acc[l] = {_combine(op.agg, 'acc[l]', v)};")
        else:
            lines.append(f"{pad}y[{at}] = {_combine(op.agg, f'y[{at}]', v)};")
    return lines


ORDERED = ("max", "min")


def _ordered(agg: str, a: str, b: str) -> str:
    """max / min of lanes that hold no NaN: a plain select gcc makes one vector op of. A lane
    reduction carries its NaNs in lanes of their own (``nan``: the last NaN a lane met, else
    0) and lets one win at the end, as NMAX / NMIN do. With NMAX's NaN test inside the
    lanes, a softmax's row max (1M f32 in rows of 256) ran 4x slower than a row sum."""
    return f"{b} {'>' if agg == 'max' else '<'} {a} ? {b} : {a}"


def _combine(agg: str, a: str, b: str) -> str:
    return {"add": f"{a} + {b}", "mul": f"{a} * {b}", "max": f"NMAX({a}, {b})", "min": f"NMIN({a}, {b})"}[agg]
