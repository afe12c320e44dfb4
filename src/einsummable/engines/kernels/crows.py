"""C source for a row reduction and the elementwise join that reads it, fused (engines/kernels/rowfuse.py).

One function loops over the kept dims of the reduction R (a row: softmax's, rmsnorm's);
per row it runs R's reduction into a register, then J's body over the row, which reads
that value as a broadcast operand while the row's other operands are still in L1. Two
passes over the rows from L3 (1 MB a block) become one.

Each half is ``ccodegen``'s own code for its op, in a C block scope of its own: the same
loads, steps, lanes and stores, so the fused function computes what the two kernels
compute apart (R's sum in its lanes, rounded to R's dtype before J reads it, as
``kernels.prepare`` rounds R's block). Arguments: the pointers of R's operands then J's
(J's slot for R's block is unused), R's sizes then J's, R's strides then J's.
"""

from __future__ import annotations

import hashlib

from einsummable.engines.kernels.ccodegen import (
    COMPUTE,
    IDENTITY,
    STORAGE,
    Source,
    _body,
    _Emitter,
    _generate,
    _literal,
    _loop,
    _streamed,
    loop_order,
)
from einsummable.engines.kernels.fast import factored_parts
from einsummable.errors import Unsupported
from einsummable.ir import kinds, scalar
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.expr import variables_used


def generate(red: Einsummable, join: Einsummable, k: int, rounded: str) -> Source | None:
    """The fused function for R = ``red`` (computed as written, its sum rounded to ``rounded``,
    the dtype of its block) and J = ``join`` reading that block as operand ``k``; None where
    either half has no C form. Cached by the pair's form and the size-dependent choices the code
    makes (``_layout``), not its sizes."""
    key = (red.join, red.dtypes, red.inputs, red.out_rank, red.agg, red.rank, rounded,
           join.join, join.dtypes, join.inputs, join.rank, k, _layout(red, join))
    if key not in _generated:
        try:
            _generated[key] = _generate_pair(red, join, k, rounded)
        except Unsupported:
            _generated[key] = None
    return _generated[key]


_generated: dict[tuple, Source | None] = {}


def _layout(red: Einsummable, join: Einsummable) -> tuple:
    """What the generated code depends on besides the pair's form: the loop orders (a reduction
    walks its largest operand's order) and whether R factors (only where its sum is not empty),
    with its inner sum's order and kernel."""
    parts = factored_parts(red)
    inner = None if parts is None else parts[0][0]
    return (loop_order(red), loop_order(join),
            None if inner is None else (loop_order(inner), kinds.is_gemm(inner)))


def _generate_pair(red: Einsummable, join: Einsummable, k: int, rounded: str) -> Source:
    _generate(red)  # each half alone has a C form (its dtypes, ops and casts), or this raises
    _generate(join)
    names = tuple(sorted(variables_used(red.join) | variables_used(join.join)))
    p, nr = red.out_rank, len(red.inputs)
    acc_t = "float" if red.dtype in ("f32", "bf16", "f16") else COMPUTE[red.dtype]
    key = repr(("rows", scalar.to_string(red.join), red.dtypes, red.inputs, red.out_rank, red.agg, red.rank,
                rounded, scalar.to_string(join.join), join.dtypes, join.inputs, join.rank, k,
                _layout(red, join)))
    name = "r_" + hashlib.sha256(key.encode()).hexdigest()[:20]
    lines = [f"const int64_t *const n_r = n, *const n_j = n + {red.rank};",
             f"const int64_t *const s_r = s, *const s_j = s + {nr * red.rank};",
             f"char **const in_r = in_, **const in_j = in_ + {nr};"]
    depth = 0
    for d in range(p):  # the kept dims: R's out dims are J's leading dims
        lines.append(f"{'  ' * depth}for (int64_t i{d} = 0; i{d} < n[{d}]; i{d}++) {{")
        depth += 1
    pad = "  " * depth
    lines.append(f"{pad}{acc_t} row_;")
    lines += _reduction(red, names, pad, acc_t)
    store = "st_bf16(row_)" if rounded == "bf16" else f"({STORAGE[rounded]})row_"
    head = [f"const {STORAGE[rounded]} rv_[1] = {{{store}}};",
            f"const {STORAGE[rounded]} *restrict x{k} = rv_;",
            f"{STORAGE[join.dtype]} *restrict y = ({STORAGE[join.dtype]} *)out_;"]
    stride = "1"
    for d in reversed(range(join.rank)):  # J's output: contiguous, row-major
        head.append(f"const int64_t o_{d} = {stride};")
        stride = f"o_{d} * n[{d}]"
    offsets = {k: "0", "y": " + ".join(f"i{d} * o_{d}" for d in range(p))}
    slots = [None if m == k else m for m in range(len(join.inputs))]
    lines += _scope(join, names, pad, "j", head, acc_t, offsets, slots, join.rank, p)
    for level in reversed(range(depth)):
        lines.append("  " * level + "}")
    body = "".join("  " + line + "\n" for line in lines)
    text = (f"void {name}(char **in_, const int64_t *n, const int64_t *s, const double *vars, char *out_)\n"
            f"{{\n{body}}}\n")
    return Source(name, text, (), names, False)


def _reduction(red: Einsummable, names: tuple[str, ...], pad: str, acc_t: str) -> list[str]:
    """R's value at this row into ``row_``, as ``kernels.prepare`` computes it: the sum of the join,
    or, where it factors R (``kernels.factored_parts``), the sum of the inner factors times the
    outer ones, each outer factor rounded as its own kernel rounds it."""
    parts = factored_parts(red)
    head = [f"{acc_t} y[1] = {{({acc_t}){IDENTITY[red.agg]}}};"]  # folded into by ``_inner``'s lanes
    if parts is None:
        return _scope(red, names, pad, "r", head, acc_t, {"y": "0"}, list(range(len(red.inputs))), red.rank,
                      red.out_rank)
    (inner, used), (outer, o_used) = parts
    if len(set(red.dtypes)) > 1 or kinds.is_gemm(inner) or kinds.equality_gather(inner) is not None \
            or (o_used and outer.dtype != red.dtype) or (not o_used and variables_used(outer)):
        raise Unsupported("a factored reduction numpy would promote, or a GEMM, gather or run-time scale")
    lines = _scope(inner, names, pad, "r", head, acc_t, {"y": "0"}, used, red.rank, red.out_rank)
    if not o_used:  # folded in double, then the sum's dtype (numpy's Python-number rule)
        return [*lines, f"{pad}row_ = row_ * ({acc_t}){_literal(scalar.constant_value(outer))};"]
    em = _Emitter(outer, names)
    value = em.root()
    rounded = f"ld_bf16(st_bf16((float)({value})))" if outer.dtype == "bf16" else \
        f"({COMPUTE[outer.dtype]})({value})"
    scope = ["const int64_t *s = s_r;", "char **in_ = in_r;"]
    offsets = {}
    for m, (idx, slot) in enumerate(zip(outer.inputs, o_used, strict=True)):
        t = STORAGE[outer.dtypes[m]]
        scope.append(f"const {t} *restrict x{m} = (const {t} *)in_[{slot}];")
        scope += [f"const int64_t s{m}_{i} = s[{slot * red.rank + i}];" for i in idx]
        offsets[m] = " + ".join(f"i{i} * s{m}_{i}" for i in idx) or "0"
    scope += _body(outer, em, value, None, offsets, False, acc_t, "", invariant=True)  # loads and steps
    scope.append(f"row_ = row_ * ({acc_t}){rounded};")
    return [*lines, pad + "{", *(f"{pad}  {line}" for line in scope), pad + "}"]


def _scope(op: Einsummable, names: tuple[str, ...], pad: str, half: str, head: list[str], acc_t: str,
           offsets: dict, slots: list[int | None], rank: int, p: int) -> list[str]:
    """One half, in its own block: ``n``, ``s`` and ``in_`` rebound to its own arguments, its
    operands' pointers and strides (operand m is argument ``slots[m]``; None: set in ``head``),
    their offsets at this row, then its loops over the row (its dims from ``p`` on)."""
    em = _Emitter(op, names)
    value = em.root()
    lines = [f"const int64_t *n = n_{half}, *s = s_{half};", f"char **in_ = in_{half};", *head]
    offsets = dict(offsets)
    for m, (idx, d) in enumerate(zip(op.inputs, op.dtypes, strict=True)):
        slot = slots[m]
        if slot is None:
            continue
        lines.append(f"const {STORAGE[d]} *restrict x{m} = (const {STORAGE[d]} *)in_[{slot}];")
        lines += [f"const int64_t s{m}_{i} = s[{slot * rank + i}];" for i in idx]
        terms = [f"i{i} * s{m}_{i}" for i in idx if i < p]
        offsets[m] = " + ".join(terms) or "0"
    if loop_order(op)[:p] != tuple(range(p)):
        raise Unsupported("a reduction walked with a kept dim inside: no row to fuse")
    order = loop_order(op)[p:]  # the row's dims, outermost first; the last streams
    inner = [pad + "  " + line for line in lines]
    operands = [m for m in range(len(op.inputs)) if slots[m] is not None]
    depth = 1  # R's dims past p are reduced, J's are its own: an output dim where op.agg is None
    for d in order[:-1]:
        inner += _loop(op, d, operands, offsets, pad + "  " * depth)
        depth += 1
    inner += _streamed(op, em, value, order[-1], operands, offsets, acc_t, pad + "  " * depth)
    for level in reversed(range(1, depth)):
        inner.append(pad + "  " * level + "}")
    if op.agg:
        inner.append(f"{pad}  row_ = y[0];")
    return [pad + "{", *inner, pad + "}"]
