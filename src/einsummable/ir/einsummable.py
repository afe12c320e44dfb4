"""The Einsummable op: ``Y[out] = AGG_{aggregated} JOIN(X1[idx1], ..., Xn[idxn])``.

Indices are integers into ``join_shape``; the output is the first ``out_rank`` of
them, in order. Within one input an index appears at most once (the frontend
lowers numpy's diagonals to masks). ``agg`` is present exactly when some index is
aggregated. Example: matmul is ``Einsummable.from_spec("ij,jk->ik", ...)`` with
join_shape (i, k, j), inputs ((0, 2), (2, 1)), out_rank 2, join x0*x1, agg add.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from einsummable.errors import ExprError, ShapeError, SpecError
from einsummable.ir import scalar
from einsummable.ir.dtypes import canonical
from einsummable.ir.expr import Expr, Input, call, children, inputs_used

AGGS = ("add", "mul", "min", "max")
LETTERS = string.ascii_lowercase + string.ascii_uppercase
PRODUCT = call("mul", Input(0), Input(1))
IDENTITY = Input(0)


def letter(i: int) -> str:
    return LETTERS[i] if i < len(LETTERS) else f"[{i}]"


@dataclass(frozen=True)
class Einsummable:
    join_shape: tuple[int, ...]
    inputs: tuple[tuple[int, ...], ...]
    out_rank: int
    join: Expr
    agg: str | None
    dtypes: tuple[str, ...]

    def __post_init__(self) -> None:
        n = len(self.join_shape)
        if any(not isinstance(s, int) or s < 0 for s in self.join_shape):
            raise ShapeError(f"join shape {self.join_shape} must hold non-negative integers")
        if not 0 <= self.out_rank <= n:
            raise SpecError(f"out_rank {self.out_rank} outside 0..{n}")
        if len(self.dtypes) != len(self.inputs):
            raise SpecError(f"{len(self.inputs)} inputs but {len(self.dtypes)} dtypes")
        for k, idx in enumerate(self.inputs):
            if len(set(idx)) != len(idx) or any(not 0 <= i < n for i in idx):
                raise SpecError(f"input {k} has bad indices {idx} for a join space of rank {n}")
        used = set().union(*map(set, self.inputs)) if self.inputs else set()
        for i in range(self.out_rank, n):
            if i not in used:
                raise SpecError(f"aggregated index {letter(i)} appears in no input")
        aggregates = self.out_rank < n
        if aggregates and self.agg is None:
            raise SpecError(
                f"indices {''.join(letter(i) for i in range(self.out_rank, n))} are summed out "
                f"of {self.spec} but no agg was given; pass agg='add' (or mul, min, max)"
            )
        if not aggregates and self.agg is not None:
            raise SpecError(f"agg={self.agg!r} given but {self.spec} aggregates no index")
        if self.agg is not None and self.agg not in AGGS:
            raise SpecError(f"unknown agg {self.agg!r}; expected one of {AGGS}")
        used_inputs = inputs_used(self.join)
        expected = set(range(len(self.inputs)))
        if used_inputs != expected:
            raise ExprError(
                f"join {scalar.to_string(self.join)!r} uses inputs "
                f"{sorted(f'x{i}' for i in used_inputs)} but the op has {len(self.inputs)} "
                f"input(s): {sorted(f'x{i}' for i in expected)}"
            )
        object.__setattr__(self, "dtypes", tuple(canonical(d) for d in self.dtypes))
        scalar.dtype_of(self.join, self.dtypes)

    @staticmethod
    def from_spec(
        spec: str,
        shapes: Sequence[Sequence[int]],
        join: str | Expr | None = None,
        agg: str | None = None,
        dtypes: Sequence[str] | None = None,
    ) -> Einsummable:
        """Build from ``"ij,jk->ik"``: letters distinct per input, output explicit."""
        if "->" not in spec:
            raise SpecError(f"spec {spec!r} needs an explicit output: 'inputs->output'")
        lhs, out = spec.replace(" ", "").split("->")
        terms = lhs.split(",") if lhs else []
        if len(terms) != len(shapes):
            raise SpecError(f"spec {spec!r} names {len(terms)} input(s) but {len(shapes)} were given")
        if len(set(out)) != len(out):
            raise SpecError(f"output {out!r} of {spec!r} repeats an index")
        sizes: dict[str, int] = {}
        for k, (term, shape) in enumerate(zip(terms, shapes, strict=True)):
            if len(term) != len(shape):
                raise SpecError(
                    f"input {k} of {spec!r} is {term!r} (rank {len(term)}) but has shape {tuple(shape)}"
                )
            for ch, size in zip(term, shape, strict=True):
                if not ch.isalpha():
                    raise SpecError(f"bad index {ch!r} in {spec!r}: indices are letters")
                if sizes.setdefault(ch, size) != size:
                    raise ShapeError(
                        f"index {ch!r} of {spec!r} has two sizes: {sizes[ch]} and {size} (input {k})"
                    )
        for ch in out:
            if ch not in sizes:
                raise SpecError(f"output index {ch!r} of {spec!r} appears in no input")
        order = list(out) + sorted(set(sizes) - set(out), key=lhs.index)
        pos = {ch: i for i, ch in enumerate(order)}
        inputs = tuple(tuple(pos[ch] for ch in term) for term in terms)
        if join is None:
            join = PRODUCT if len(terms) == 2 else IDENTITY
            if len(terms) > 2:
                raise SpecError("an op with more than two inputs needs an explicit join")
        aggregates = len(order) > len(out)
        if agg is None and aggregates and join == PRODUCT:
            agg = "add"
        if agg is None and aggregates and len(terms) == 1 and join == IDENTITY:
            agg = "add"
        dtypes = tuple(dtypes) if dtypes is not None else ("f32",) * len(terms)
        return Einsummable(
            tuple(sizes[ch] for ch in order), inputs, len(out), scalar.parse(join), agg, dtypes
        )

    # ------------------------------------------------------------ derived facts

    @property
    def rank(self) -> int:
        return len(self.join_shape)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.join_shape[: self.out_rank]

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(self.join_shape[i] for i in idx) for idx in self.inputs)

    @cached_property
    def dtype(self) -> str:
        """The result's dtype (kept: a lowering asks it of every block's task)."""
        return scalar.result_dtype(self.join, self.dtypes)

    @property
    def spec(self) -> str:
        ins = ",".join("".join(letter(i) for i in idx) for idx in self.inputs)
        return f"{ins}->{''.join(letter(i) for i in range(self.out_rank))}"

    @property
    def aggregated(self) -> tuple[int, ...]:
        return tuple(range(self.out_rank, self.rank))

    def flops(self) -> int:
        """Scalar operations over the join space, counting the aggregation."""
        return math.prod(self.join_shape) * self._nodes()

    def passes(self, node_cost: float = 1.0) -> float:
        """Elementwise work in passes over the join space: the first node (or the aggregation
        alone) one pass, each further one ``node_cost`` of a pass. numpy runs a ufunc pass per
        node (1.0: ``flops()``); a compiled join runs them all in one loop (less, measured)."""
        return math.prod(self.join_shape) * (1 + node_cost * (self._nodes() - 1))

    def _nodes(self) -> int:
        """The join's operations per element, the aggregation one of them; at least one."""
        return max(1, _join_cost(self.join) + (self.agg is not None))

    # ------------------------------------------------------------ predicates

    def is_contraction(self) -> bool:
        return len(self.inputs) == 2 and self.join == PRODUCT and self.agg == "add"

    def is_elementwise(self) -> bool:
        full = tuple(range(self.out_rank))
        return self.agg is None and all(idx == full for idx in self.inputs)

    def is_reduction(self) -> bool:
        return len(self.inputs) == 1 and self.agg is not None

    def is_broadcast(self) -> bool:
        return self.agg is None and any(len(idx) < self.out_rank for idx in self.inputs)

    def is_permutation(self) -> bool:
        return (
            len(self.inputs) == 1
            and self.join == IDENTITY
            and self.agg is None
            and len(self.inputs[0]) == self.rank
            and self.inputs[0] != tuple(range(self.rank))
        )

    # ------------------------------------------------------------ transforms

    def block(self, join_shape: Sequence[int]) -> Einsummable:
        """The same op over one block of its join space."""
        if len(join_shape) != self.rank:
            raise ShapeError(f"block shape {tuple(join_shape)} has rank {len(join_shape)}, need {self.rank}")
        return replace(self, join_shape=tuple(join_shape))

    def merge_adjacent(self) -> tuple[Einsummable, tuple[tuple[int, ...], ...]]:
        """Merge indices that always travel together, in order, in every operand.

        Returns the merged op and, per merged index, the original indices it holds,
        so kernels see fewer dimensions (``bij,bjk->bik`` stays; ``abc,c->ab`` with
        ``ab`` adjacent in both output and input becomes ``xc,c->x``).
        """
        terms = [tuple(range(self.out_rank)), *self.inputs]
        groups: list[list[int]] = []
        for i in range(self.rank):
            if groups and self._travels_with(groups[-1][-1], i, terms):
                groups[-1].append(i)
            else:
                groups.append([i])
        if len(groups) == self.rank:
            return self, tuple((i,) for i in range(self.rank))
        new_of = {g[0]: k for k, g in enumerate(groups)}
        shape = tuple(math.prod(self.join_shape[i] for i in g) for g in groups)
        inputs = tuple(tuple(new_of[i] for i in idx if i in new_of) for idx in self.inputs)
        out_rank = sum(1 for g in groups if g[0] < self.out_rank)
        merged = Einsummable(shape, inputs, out_rank, self.join, self.agg, self.dtypes)
        return merged, tuple(tuple(g) for g in groups)

    def _travels_with(self, i: int, j: int, terms: list[tuple[int, ...]]) -> bool:
        if (i < self.out_rank) != (j < self.out_rank):
            return False
        for t in terms:
            if (i in t) != (j in t):
                return False
            if i in t and t.index(j) != t.index(i) + 1:
                return False
        return True

    def __str__(self) -> str:
        text = f"{self.spec} {scalar.to_string(self.join)}"
        return f"{text} agg={self.agg}" if self.agg else text


def _join_cost(e: Expr) -> int:
    kids = children(e)
    return (1 if kids else 0) + sum(_join_cost(k) for k in kids)
