"""The VJP rule table: one rule per EinGraph node kind, written with the frontend builders.

A rule takes the forward graph, the node id, the node's total cotangent ``g`` and
which operands want a gradient; it returns one contribution (or None) per operand.

Einsummables, by aggregation (``Y[out] = AGG_agg J(x...)``):
- add, or none: ``dXi[idx_i] = sum over the other indices of g[out] * dJ/dxi``. This one
  rule covers elementwise ops, broadcasts, contractions and fused ops such as a
  summed ``exp(x0 - x1)``.
- max, min: the gradient flows where ``J == Y``. Tie rule: tied elements *split*
  ``g`` equally, so the weights over one output element sum to one (a subgradient).
- mul: ``g * (product of the other factors) * dJ/dxi``, computed from the product of
  the nonzero factors and a count of zeros, so it is exact where factors are zero.

Complex values follow the convention ``grad = g * conj(dJ/dx)`` for holomorphic joins;
for a real loss of z = a + ib this is ``dL/da + i dL/db``, which a complex view maps
back to the (re, im) pairs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from einsummable.autodiff.cotangent import Cot, Forward, Uniform, materialize, total
from einsummable.errors import AutodiffError
from einsummable.frontend.builders import view_as_complex, view_as_real
from einsummable.frontend.tensor import Tensor, apply, reshape, select
from einsummable.ir import scalar
from einsummable.ir.box import Box, box_shape, intersect, place, volume, whole
from einsummable.ir.dtypes import COMPLEX, HALF, real_of
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.expr import (
    ONE,
    ZERO,
    Call,
    Cast,
    Const,
    Expr,
    Input,
    call,
    children,
    inputs_used,
    replace,
    substitute,
)
from einsummable.ir.graph import (
    ComplexView,
    EinsumNode,
    Fill,
    Formation,
    InputNode,
    Reshape,
    Select,
)

Grads = tuple[Cot | None, ...]
Rule = Callable[[Forward, int, Cot, tuple[bool, ...]], Grads]
NON_HOLOMORPHIC = ("real", "imag", "abs", "conj")


# ------------------------------------------------------------ structural kinds


def _no_operands(fw: Forward, nid: int, g: Cot, wants: tuple[bool, ...]) -> Grads:
    return ()


def _formation(fw: Forward, nid: int, g: Cot, wants: tuple[bool, ...]) -> Grads:
    return (g,)


def _reshape(fw: Forward, nid: int, g: Cot, wants: tuple[bool, ...]) -> Grads:
    src = fw.nodes[fw.nodes[nid].inputs[0]]
    if isinstance(g, Uniform):
        return (Uniform(g.value, src.shape, g.dtype),)
    return (reshape(g, src.shape),)


def _complex_view(fw: Forward, nid: int, g: Cot, wants: tuple[bool, ...]) -> Grads:
    t = materialize(fw.graph, g)
    return (view_as_real(t) if t.dtype in COMPLEX else view_as_complex(t),)


def _select(fw: Forward, nid: int, g: Cot, wants: tuple[bool, ...]) -> Grads:
    """The transposed select: each visible output region goes back to where it came from."""
    node = fw.nodes[nid]
    visible = _visible(node.pieces)
    grads: list[Cot | None] = []
    materialized: list[Tensor] = []
    for j, src_id in enumerate(node.inputs):
        items = [(box, _source_offset(p, box)) for p, box in visible if p.input == j]
        if not wants[j] or not items:
            grads.append(None)
            continue
        shape = fw.nodes[src_id].shape
        parts: list[Cot] = []
        for group in _disjoint_groups(items):
            covers = sum(volume(b) for b, _ in group) == math.prod(shape)
            if isinstance(g, Uniform) and covers:
                parts.append(Uniform(g.value, shape, g.dtype))
                continue
            if not materialized:
                materialized.append(materialize(fw.graph, g))
            gt = materialized[0]
            if gt.shape == shape and group == [(whole(shape), (0,) * len(shape))]:
                parts.append(gt)
            else:
                parts.append(select(shape, [(gt, b, off) for b, off in group]))
        grads.append(total(fw.graph, parts))
    return tuple(grads)


def _visible(pieces) -> list:
    """(piece, box) for each output box a piece writes that no later piece overwrites."""
    out = []
    for k, p in enumerate(pieces):
        boxes = [p.dst_box]
        for later in pieces[k + 1 :]:
            boxes = [part for b in boxes for part in _subtract(b, later.dst_box)]
        out.extend((p, b) for b in boxes if volume(b) > 0)
    return out


def _subtract(a: Box, b: Box) -> list[Box]:
    """``a`` minus ``b`` as disjoint boxes."""
    inter = intersect(a, b)
    if inter is None:
        return [a]
    out, rest = [], list(a)
    for d, ((lo, hi), (ilo, ihi)) in enumerate(zip(a, inter, strict=True)):
        if lo < ilo:
            out.append((*rest[:d], (lo, ilo), *rest[d + 1 :]))
        if ihi < hi:
            out.append((*rest[:d], (ihi, hi), *rest[d + 1 :]))
        rest[d] = (ilo, ihi)
    return out


def _source_offset(p, box: Box) -> tuple[int, ...]:
    return tuple(s[0] + b[0] - d for s, b, d in zip(p.src, box, p.dst, strict=True))


def _disjoint_groups(items: list) -> list[list]:
    """Split items so that, within a group, no two write the same input element."""
    groups: list[list] = []
    for item in items:
        target = _target_box(item)
        for group in groups:
            if all(intersect(target, _target_box(other)) is None for other in group):
                group.append(item)
                break
        else:
            groups.append([item])
    return groups


def _target_box(item) -> Box:
    box, offset = item
    return place(box_shape(box), offset)


# ------------------------------------------------------------ einsummables


def _einsum(fw: Forward, nid: int, g: Cot, wants: tuple[bool, ...]) -> Grads:
    node = fw.nodes[nid]
    _check_holomorphic(node.op, nid)
    return AGG_VJP[node.op.agg](fw, nid, g, wants)


def _by_sum(fw: Forward, nid: int, g: Cot, wants: tuple[bool, ...]) -> Grads:
    node = fw.nodes[nid]
    op = node.op
    n = len(op.inputs)
    operands = [*_forward_operands(fw, node), (g, _out(op)), (fw.tensor(nid), _out(op))]
    gexpr = _cot_expr(g, n)
    # d exp(u) = exp(u) du: where the join itself reappears, read the forward's output
    # instead of computing it again.
    joins = (op.join, scalar.simplify(op.join)) if op.agg is None else ()

    def grad_expr(d: Expr) -> Expr:
        for join in joins:
            d = replace(d, join, Input(n + 1))
        return scalar.simplify(call("mul", gexpr, _conj(d, op)))

    return _per_operand(fw, op, wants, operands, grad_expr, _names(fw, nid))


def _by_extremum(fw: Forward, nid: int, g: Cot, wants: tuple[bool, ...]) -> Grads:
    node = fw.nodes[nid]
    op = node.op
    n = len(op.inputs)
    xs = _forward_operands(fw, node)
    y = fw.formed(nid)
    # The raw join, unsimplified, so it rounds exactly as the forward pass did.
    hit = call("eq", op.join, Input(n))
    # Ties are counted, and shared out, in f32 for half types: bf16 counts 300 ties as 256.
    wide = "f32" if op.dtype in HALF else op.dtype
    count_op = Einsummable(op.join_shape, (*op.inputs, _out(op)), op.out_rank,
                           Cast(wide, call("where", hit, ONE, ZERO)), "add", (*op.dtypes, y.dtype))
    count = _named(apply(count_op, [t for t, _ in xs] + [y]), _names(fw, nid))
    operands = [*xs, (y, _out(op)), (count, _out(op)), (g, _out(op))]
    share = call("div", _as(wide, _cot_expr(g, n + 2), op.dtype), Input(n + 1))
    return _per_operand(fw, op, wants, operands,
                        lambda d: call("mul", share, call("where", hit, _as(wide, d, op.dtype), ZERO)),
                        _names(fw, nid))


def _as(dtype: str, e: Expr, was: str) -> Expr:
    return e if dtype == was else Cast(dtype, e)


def _by_product(fw: Forward, nid: int, g: Cot, wants: tuple[bool, ...]) -> Grads:
    node = fw.nodes[nid]
    op = node.op
    n = len(op.inputs)
    xs = _forward_operands(fw, node)
    tensors = [t for t, _ in xs]
    is_zero = call("eq", op.join, ZERO)
    nonzero = call("where", is_zero, ONE, op.join)
    prod_op = Einsummable(op.join_shape, op.inputs, op.out_rank, nonzero, "mul", op.dtypes)
    zeros_op = Einsummable(op.join_shape, op.inputs, op.out_rank,
                           Cast(real_of(op.dtype), call("where", is_zero, ONE, ZERO)), "add", op.dtypes)
    prod, zeros = (_named(apply(o, tensors), _names(fw, nid)) for o in (prod_op, zeros_op))
    operands = [*xs, (prod, _out(op)), (zeros, _out(op)), (g, _out(op))]
    p, nz = Input(n), Input(n + 1)
    # The product of the other factors: P / J with no zero, P at the only zero, else 0.
    others = call(
        "where", is_zero,
        call("where", call("eq", nz, ONE), p, ZERO),
        call("where", call("eq", nz, ZERO), call("div", p, nonzero), ZERO),
    )
    gexpr = _cot_expr(g, n + 2)
    return _per_operand(fw, op, wants, operands,
                        lambda d: call("mul", gexpr, _conj(call("mul", others, d), op)), _names(fw, nid))


def _per_operand(fw: Forward, op: Einsummable, wants: tuple[bool, ...], operands: list,
                 grad_expr: Callable[[Expr], Expr], names: str | None) -> Grads:
    """Each wanted operand's gradient: ``grad_expr(dJ/dxi)`` contracted onto its indices
    (None where it is not wanted or the join does not depend on it)."""
    grads: list[Cot | None] = []
    for i in range(len(op.inputs)):
        d = _partial(op, i)
        wanted = wants[i] and d != ZERO
        grads.append(_contract(fw, op, grad_expr(d), operands, op.inputs[i], op.dtypes[i], names) if wanted
                     else None)
    return tuple(grads)


def _names(fw: Forward, nid: int) -> str | None:
    """The user's index letters of forward node nid, in its join-space order, if kept."""
    return fw.graph.ir.index_names.get(nid)


def _named(t: Tensor, names: str | None) -> Tensor:
    """t, its einsum named by ``names`` (join-space order), so the report shows the user's letters."""
    nid = t.node.inputs[0] if isinstance(t.node, Formation) else t.id  # a sum's einsum, before its formation
    if names is not None and isinstance(t.graph.ir.nodes[nid], EinsumNode):
        t.graph.ir.index_names[nid] = names
    return t


AGG_VJP: dict[str | None, Rule] = {
    None: _by_sum,
    "add": _by_sum,
    "max": _by_extremum,
    "min": _by_extremum,
    "mul": _by_product,
}


def _forward_operands(fw: Forward, node: EinsumNode) -> list[tuple[Cot, tuple[int, ...]]]:
    return [(fw.tensor(i), idx) for i, idx in zip(node.inputs, node.op.inputs, strict=True)]


def _out(op: Einsummable) -> tuple[int, ...]:
    return tuple(range(op.out_rank))


def _cot_expr(g: Cot, k: int) -> Expr:
    """The cotangent inside a join: operand ``k``, or its value when it is uniform."""
    return Const(g.value) if isinstance(g, Uniform) else Input(k)


def _partial(op: Einsummable, i: int) -> Expr:
    return scalar.simplify(_fold_casts(scalar.derivative(op.join, i)))


def _fold_casts(e: Expr) -> Expr:
    """``cast(1, f32)`` is 1: constants are weakly typed, so the cast only blocks folding."""
    if isinstance(e, Cast) and isinstance(e.arg, Const) and e.dtype not in COMPLEX:
        return e.arg
    kids = children(e)
    if not kids:
        return e
    folded = tuple(_fold_casts(k) for k in kids)
    return Cast(e.dtype, folded[0]) if isinstance(e, Cast) else Call(e.op, folded)


def _conj(d: Expr, op: Einsummable) -> Expr:
    return call("conj", d) if _is_complex(op) else d


def _is_complex(op: Einsummable) -> bool:
    return any(d in COMPLEX for d in (*op.dtypes, op.dtype))


def _check_holomorphic(op: Einsummable, nid: int) -> None:
    if not _is_complex(op):
        return
    stack = [op.join]
    while stack:
        e = stack.pop()
        stack.extend(children(e))
        arg = children(e)[0] if children(e) else None
        bad = isinstance(e, Cast) or (isinstance(e, Call) and e.op in NON_HOLOMORPHIC)
        if bad and scalar.dtype_of(arg, op.dtypes) in COMPLEX:
            raise AutodiffError(
                f"%{nid} einsum[{op}]: {scalar.to_string(e)!r} is not holomorphic in a complex "
                "operand; autodiff supports complex joins built from holomorphic operations only"
            )


def _contract(fw: Forward, op: Einsummable, expr: Expr, operands: list[tuple[Cot, tuple[int, ...]]],
              target: tuple[int, ...], dtype: str, names: str | None = None) -> Cot:
    """Sum ``expr`` over the join indices of ``op`` outside ``target``; the result has ``target``'s order.

    ``operands`` pairs each input of ``expr`` with its indices in the join space. Those
    ``expr`` does not use are dropped, and indices no operand touches fold into a factor.
    """
    # Number the operands expr uses, once each: the same tensor at the same indices is one input.
    kept: list[tuple[Cot, tuple[int, ...]]] = []
    slot: dict[tuple[int, tuple[int, ...]], int] = {}
    mapping: dict[int, Expr] = {}
    for k in sorted(inputs_used(expr)):
        t, idx = operands[k]
        key = (t.id, idx)
        if key not in slot:
            slot[key] = len(kept)
            kept.append((t, idx))
        mapping[k] = Input(slot[key])
    expr = substitute(expr, mapping)
    target_shape = tuple(op.join_shape[k] for k in target)
    present = set().union(*(set(idx) for _, idx in kept))
    summed = [k for k in range(op.rank) if k not in target]
    scale = math.prod(op.join_shape[k] for k in summed if k not in present)
    if not kept:
        if isinstance(expr, Const):
            return Uniform(expr.value * scale, target_shape, dtype)
        # A run-time variable with no tensor to carry it: broadcast it over ones.
        kept = [(fw.graph.full(target_shape, 1.0, dtype), target)]
        expr = call("mul", Input(0), expr)
    if scale != 1:
        expr = call("mul", Const(float(scale)), expr)
    dtypes = tuple(t.dtype for t, _ in kept)
    expr = _convert(expr, scalar.result_dtype(expr, dtypes), dtype)
    order = list(target) + [k for k in summed if k in present]
    pos = {k: j for j, k in enumerate(order)}
    indices = tuple(tuple(pos[k] for k in idx) for _, idx in kept)
    agg = "add" if len(order) > len(target) else None
    back = Einsummable(tuple(op.join_shape[k] for k in order), indices, len(target), expr, agg, dtypes)
    if len(kept) == 1 and expr == Input(0) and back.agg is None and back.inputs[0] == _out(back):
        return kept[0][0]
    return _named(apply(back, [t for t, _ in kept]), names and "".join(names[k] for k in order))


def _convert(e: Expr, src: str, dst: str) -> Expr:
    if src == dst:
        return e
    if src in COMPLEX and dst not in COMPLEX:
        e, src = call("real", e), real_of(src)
    return e if src == dst else Cast(dst, e)


VJP: dict[type, Rule] = {
    InputNode: _no_operands,
    EinsumNode: _einsum,
    Formation: _formation,
    Fill: _no_operands,
    Select: _select,
    Reshape: _reshape,
    ComplexView: _complex_view,
}
