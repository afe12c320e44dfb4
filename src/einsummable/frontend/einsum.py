"""``es.einsum``: every spec ``numpy.einsum`` accepts, lowered to Einsummable ops.

The surface is richer than the IR. Implicit outputs, ``...``, size-1 broadcasting
and repeated indices within one operand (diagonals) are rewritten here; three or
more operands under the default product are split into pairwise contractions
along opt_einsum's path.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import opt_einsum

from einsummable.errors import ShapeError, SpecError
from einsummable.frontend.tensor import Tensor, apply, promote, reshape, transpose
from einsummable.ir import scalar
from einsummable.ir.einsummable import IDENTITY, PRODUCT, Einsummable
from einsummable.ir.expr import Expr
from einsummable.ir.graph import EinsumNode

_VALID = set(string.ascii_letters)


def einsum(spec: str, *operands: Tensor, join: str | Expr | None = None, agg: str | None = None) -> Tensor:
    """``einsum("ij,jk->ik", a, b)``; ``join`` and ``agg`` generalise the product and sum."""
    for k, t in enumerate(operands):
        if not isinstance(t, Tensor):
            raise SpecError(f"operand {k} of einsum {spec!r} is a {type(t).__name__}, not a Tensor")
    terms, out = _parse(spec, [t.shape for t in operands])
    sizes = _sizes(spec, terms, operands)
    operands, terms = zip(*[_normalise(t, term, sizes) for t, term in zip(operands, terms, strict=True)],
                          strict=True) if operands else ((), ())
    if join is None:  # the product (or identity) that numpy's einsum computes promotes as numpy's does
        operands = promote(operands)
    default = join is None and agg in (None, "add")
    expr = scalar.parse(join) if join is not None else None
    if default and len(operands) > 2:
        return _contract_path(list(operands), list(terms), out, sizes)
    if expr is None:
        expr = PRODUCT if len(operands) == 2 else IDENTITY
        if len(operands) > 2:
            raise SpecError(f"einsum {spec!r} with agg={agg!r} over {len(operands)} operands needs a join")
    summed = "".join(dict.fromkeys(ch for term in terms for ch in term if ch not in out))
    if agg is None and summed and expr not in (PRODUCT, IDENTITY):  # here, in the user's letters
        raise SpecError(f"einsum {spec!r} sums out {summed!r} but no agg was given; "
                        "pass agg='add' (or mul, min, max)")
    return _single(list(operands), list(terms), out, sizes, expr, agg)


def _parse(spec: str, shapes: Sequence[tuple[int, ...]]) -> tuple[list[str], str]:
    """Expand ``...`` and the implicit output; returns letter terms and output."""
    text = spec.replace(" ", "")
    if text.count("->") > 1:
        raise SpecError(f"einsum spec {spec!r} has more than one '->'")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",") if lhs or shapes else []
    if len(terms) != len(shapes):
        raise SpecError(f"einsum spec {spec!r} names {len(terms)} operand(s) but {len(shapes)} were given")
    used = {ch for ch in text if ch in _VALID}
    spare = [ch for ch in string.ascii_letters if ch not in used]
    n_ell = 0
    for k, (term, shape) in enumerate(zip(terms, shapes, strict=True)):
        bad = set(term.replace("...", "")) - _VALID
        if bad or term.count("...") > 1:
            raise SpecError(f"operand {k} of {spec!r} has bad subscripts {term!r}: use letters and one '...'")
        named = len(term.replace("...", ""))
        if "..." in term:
            if named > len(shape):
                raise SpecError(f"operand {k} of {spec!r} is {term!r} but has rank {len(shape)}")
            n_ell = max(n_ell, len(shape) - named)
        elif named != len(shape):
            raise SpecError(
                f"operand {k} of {spec!r} is {term!r} (rank {named}) but has shape {tuple(shape)}"
            )
    ell = "".join(spare[:n_ell])
    expanded = []
    for term, shape in zip(terms, shapes, strict=True):
        if "..." in term:
            k = len(shape) - len(term.replace("...", ""))
            term = term.replace("...", ell[n_ell - k :])
        expanded.append(term)
    if arrow:
        if set(rhs.replace("...", "")) - _VALID or rhs.count("...") > 1:
            raise SpecError(f"output {rhs!r} of {spec!r} has bad subscripts")
        if n_ell and "..." not in rhs and ell:
            raise SpecError(f"{spec!r}: operands broadcast over '...' but the output names no '...'")
        out = rhs.replace("...", ell)
        if len(set(out)) != len(out):
            raise SpecError(f"output {rhs!r} of {spec!r} repeats an index")
        everywhere = "".join(expanded)
        for ch in out:
            if ch not in everywhere:
                raise SpecError(f"output index {ch!r} of {spec!r} appears in no operand")
    else:
        counts = {ch: "".join(expanded).count(ch) for ch in set("".join(expanded))}
        out = ell + "".join(sorted(ch for ch, n in counts.items() if n == 1 and ch not in ell))
    return expanded, out


def _sizes(spec: str, terms: list[str], operands: Sequence[Tensor]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for k, (term, t) in enumerate(zip(terms, operands, strict=True)):
        for ch, n in zip(term, t.shape, strict=True):
            known = sizes.get(ch)
            if known is None or known == 1:
                sizes[ch] = n
            elif n not in (1, known):
                raise ShapeError(
                    f"index {ch!r} of einsum {spec!r} has two sizes: {known} and {n} (operand {k})"
                )
    return sizes


def _normalise(t: Tensor, term: str, sizes: dict[str, int]) -> tuple[Tensor, str]:
    """Drop broadcast size-1 axes, then take diagonals of repeated indices."""
    keep = [d for d, ch in enumerate(term) if not (t.shape[d] == 1 and sizes[ch] != 1)]
    if len(keep) != len(term):
        t = reshape(t, tuple(t.shape[d] for d in keep))
        term = "".join(term[d] for d in keep)
    while len(set(term)) != len(term):
        ch = next(c for c in term if term.count(c) > 1)
        t, term = _diagonal(t, term, ch)
    return t, term


def _diagonal(t: Tensor, term: str, ch: str) -> tuple[Tensor, str]:
    """Keep the diagonal of the first two axes labelled ``ch``, via an i == j mask."""
    first = term.index(ch)
    second = term.index(ch, first + 1)
    n = t.shape[first]
    mask = t.graph.ramp((n, n), steps=(1.0, -1.0), dtype=t.dtype)  # i - j, zero on the diagonal
    out_term = term[:second] + term[second + 1 :]
    # join space: the output axes, then the second copy of ch as the summed index
    rank = len(out_term)
    x_idx = tuple(rank if d == second else (d if d < second else d - 1) for d in range(len(term)))
    shape = (*(t.shape[d] for d in range(len(term)) if d != second), n)
    op = Einsummable(shape,
                     (x_idx, (first, rank)), rank, scalar.parse("where(x1 == 0, x0, 0)"), "add",
                     (t.dtype, t.dtype))
    return apply(op, [t, mask]), out_term


def _single(operands: list[Tensor], terms: list[str], out: str, sizes: dict[str, int],
            join: Expr, agg: str | None) -> Tensor:
    if not operands:
        raise SpecError("einsum needs at least one operand")
    summed = sorted({ch for term in terms for ch in term} - set(out), key="".join(terms).index)
    order = list(out) + summed
    pos = {ch: i for i, ch in enumerate(order)}
    if agg is None and summed and join in (PRODUCT, IDENTITY):
        agg = "add"
    op = Einsummable(tuple(sizes[ch] for ch in order), tuple(tuple(pos[ch] for ch in term) for term in terms),
                     len(out), join, agg, tuple(t.dtype for t in operands))
    if len(operands) == 1 and join == IDENTITY and agg is None:
        perm = tuple(terms[0].index(ch) for ch in out)
        return transpose(operands[0], perm)
    t = apply(op, operands)
    node = t.id if isinstance(t.node, EinsumNode) else t.node.inputs[0]
    t.graph.ir.index_names[node] = "".join(order)  # the plan report shows the user's letters
    return t


def _contract_path(operands: list[Tensor], terms: list[str], out: str, sizes: dict[str, int]) -> Tensor:
    path, _ = opt_einsum.contract_path(
        f"{','.join(terms)}->{out}", *[t.shape for t in operands], shapes=True, optimize="auto"
    )
    for pair in path:
        picked = sorted(pair, reverse=True)
        group = [(operands.pop(i), terms.pop(i)) for i in picked]
        later = set(out).union(*terms)
        letters = "".join(term for _, term in group)
        inter = "".join(dict.fromkeys(ch for ch in letters if ch in later))
        if len(group) == 1:
            t, term = group[0]
            result = _single([t], [term], inter, sizes, IDENTITY, None)
        else:
            result = _single([g[0] for g in group], [g[1] for g in group], inter, sizes, PRODUCT, None)
        operands.append(result)
        terms.append(inter)
    (t,), (term,) = operands, terms
    return t if term == out else _single([t], [term], out, sizes, IDENTITY, None)
