"""The Einsummable op: construction, shape inference, predicates, normalisation, block form."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from einsummable.engines.kernels import fast as kernels
from einsummable.engines.kernels import reference as reference_kernel
from einsummable.errors import ExprError, ShapeError, SpecError
from einsummable.ir import scalar
from einsummable.ir.einsummable import Einsummable


def test_from_spec_infers_shapes_and_defaults():
    op = Einsummable.from_spec("ij,jk->ik", [(4, 5), (5, 6)])
    assert op.join_shape == (4, 6, 5)
    assert op.inputs == ((0, 2), (2, 1))
    assert op.out_shape == (4, 6)
    assert op.agg == "add"
    assert op.dtype == "f32"
    assert op.flops() == 2 * 4 * 5 * 6
    assert str(op) == "ac,cb->ab x0 * x1 agg=add"


def test_predicates():
    assert Einsummable.from_spec("ij,jk->ik", [(2, 3), (3, 4)]).is_contraction()
    assert Einsummable.from_spec("ij,ij->ij", [(2, 3), (2, 3)]).is_elementwise()
    assert Einsummable.from_spec("ij->i", [(2, 3)], agg="max").is_reduction()
    assert Einsummable((2, 3), ((1,),), 2, scalar.parse("x0"), None, ("f32",)).is_broadcast()
    assert Einsummable.from_spec("ij->ji", [(2, 3)]).is_permutation()
    assert not Einsummable.from_spec("ij->ij", [(2, 3)]).is_permutation()


def test_errors_name_the_problem():
    with pytest.raises(ShapeError, match="'j'.*3.*4"):
        Einsummable.from_spec("ij,jk->ik", [(2, 3), (4, 5)])
    with pytest.raises(SpecError, match="agg"):
        Einsummable.from_spec("ij->i", [(2, 3)], join="exp(x0)")
    with pytest.raises(SpecError, match="aggregates no index"):
        Einsummable.from_spec("ij->ij", [(2, 3)], agg="add")
    with pytest.raises(SpecError, match="unknown agg"):
        Einsummable.from_spec("ij->i", [(2, 3)], agg="mean")
    with pytest.raises(ExprError, match="x1"):
        Einsummable.from_spec("ij->ij", [(2, 3)], join="x0 + x1")
    with pytest.raises(SpecError, match="explicit output"):
        Einsummable.from_spec("ij,jk", [(2, 3), (3, 4)])


@st.composite
def ops(draw):
    rank = draw(st.integers(1, 5))
    shape = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    out_rank = draw(st.integers(0, rank))
    n = draw(st.integers(1, 2))
    inputs = []
    for _ in range(n):
        idx = draw(st.permutations(range(rank)))[: draw(st.integers(1, rank))]
        inputs.append(tuple(idx))
    used = set().union(*map(set, inputs))
    for i in range(out_rank, rank):
        if i not in used:
            inputs[0] = (*inputs[0], i)
            used.add(i)
    joins = ["x0 * x1", "x0 + x1", "max(x0, x1) * 2"] if n == 2 else ["x0", "exp(x0)", "x0 * x0"]
    join = draw(st.sampled_from(joins))
    agg = draw(st.sampled_from(["add", "max", "min", "mul"])) if out_rank < rank else None
    return Einsummable(shape, tuple(inputs), out_rank, scalar.parse(join), agg, ("f64",) * n)


@given(ops(), st.integers(0, 99))
def test_merge_adjacent_preserves_the_result(op, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in op.input_shapes]
    merged, groups = op.merge_adjacent()
    assert sum(len(g) for g in groups) == op.rank
    assert merged.rank <= op.rank
    reshaped = [a.reshape(s) for a, s in zip(arrays, merged.input_shapes, strict=True)]
    got = reference_kernel.einsum(merged, reshaped).reshape(op.out_shape)
    np.testing.assert_allclose(got, reference_kernel.einsum(op, arrays), rtol=1e-12)


def test_merge_adjacent_merges_what_travels_together():
    op = Einsummable.from_spec("abc,bcd->ad", [(2, 3, 4), (3, 4, 5)])
    merged, groups = op.merge_adjacent()
    assert merged.join_shape == (2, 5, 12)
    assert groups == ((0,), (1,), (2, 3))


def test_block_form_keeps_the_op_and_changes_the_sizes():
    op = Einsummable.from_spec("ij,jk->ik", [(4, 6), (6, 8)])
    block = op.block((2, 4, 3))
    assert block.join == op.join and block.inputs == op.inputs
    assert block.out_shape == (2, 4)
    with pytest.raises(ShapeError):
        op.block((2, 4))


@given(ops(), st.integers(0, 99), st.booleans())
def test_fast_kernel_matches_the_reference_kernel(op, seed, into_out):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in op.input_shapes]
    out = np.full(op.out_shape, np.nan) if into_out else None
    got = kernels.fast_einsum(op, arrays, out=out)
    if into_out:
        assert got is out
    np.testing.assert_allclose(got, reference_kernel.einsum(op, arrays), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("spec,shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij,kj->ik", [(3, 4), (5, 4)]),
    ("abc,cd->abd", [(2, 3, 4), (4, 5)]),
    ("ijk,jl->lk", [(2, 3, 4), (3, 5)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,ij->", [(3, 4), (3, 4)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("bc,ac->ab", [(3, 4), (5, 4)]),
    ("ij,jk->ki", [(3, 4), (4, 5)]),
    ("abc,dc->dba", [(2, 3, 4), (5, 4)]),
    ("xbi,xki->bxk", [(2, 3, 4), (2, 5, 4)]),
])
def test_fast_contractions(spec, shapes):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    op = Einsummable.from_spec(spec, shapes)
    expected = np.einsum(spec, *arrays)
    np.testing.assert_allclose(kernels.fast_einsum(op, arrays), expected, rtol=1e-4, atol=1e-5)


@st.composite
def gather_ops(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    out_rank = draw(st.integers(0, rank))
    inputs = [tuple(draw(st.permutations(range(rank)))[: draw(st.integers(0, rank))]) for _ in range(3)]
    used = set().union(*map(set, inputs))
    for i in range(out_rank, rank):
        if i not in used:
            inputs[2] = (*inputs[2], i)
    a, b, c = draw(st.permutations([0, 1, 2]))
    join = scalar.parse(f"where(x{a} == x{b}, x{c}, 0)")
    agg = "add" if out_rank < rank else None
    return Einsummable(shape, tuple(inputs), out_rank, join, agg, ("f64",) * 3)


@given(gather_ops(), st.integers(0, 99))
def test_equality_gather_kernel_matches_the_reference(op, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(0, 2, s).astype(np.float64) for s in op.input_shapes]
    arrays = [a + rng.standard_normal(a.shape) * (k == 2) for k, a in enumerate(arrays)]
    expected = reference_kernel.einsum(op, arrays)
    np.testing.assert_allclose(kernels.fast_einsum(op, arrays), expected, rtol=1e-12, atol=1e-12)


def test_the_reference_kernel_bounds_its_join_space(monkeypatch):
    monkeypatch.setattr(reference_kernel, "JOIN_LIMIT", 64)
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 30, (6, 5)).astype(np.float64)
    table = rng.standard_normal((30, 4))
    op = Einsummable.from_spec("bs,v,vd->bsd", [(6, 5), (30,), (30, 4)], join="where(x0 == x1, x2, 0)",
                               agg="add", dtypes=("f64",) * 3)
    got = reference_kernel.einsum(op, [ids, np.arange(30.0), table])
    np.testing.assert_array_equal(got, table[ids.astype(int)])
