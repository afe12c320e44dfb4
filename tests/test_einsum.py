"""es.einsum against numpy.einsum, over random specs, and its bad-input errors."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import einsummable as es
from einsummable.errors import ExprError, ShapeError, SpecError


def run(g, feeds):
    return es.compile(g, engine="reference").run(feeds)


@st.composite
def einsum_cases(draw):
    """A numpy einsum spec with operands: repeats, broadcasting, ellipses, implicit output."""
    letters = "abcde"
    size = {ch: draw(st.integers(1, 3)) for ch in letters}
    n = draw(st.integers(1, 4))
    use_ellipsis = draw(st.booleans())
    ell_shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))) if use_ellipsis else ()
    terms, shapes = [], []
    for _ in range(n):
        term = draw(st.lists(st.sampled_from(letters), min_size=0, max_size=3))
        shape = [1 if draw(st.integers(0, 5)) == 0 else size[ch] for ch in term]
        # a repeated letter must have one size within its operand
        for k, ch in enumerate(term):
            first = term.index(ch)
            shape[k] = shape[first]
        text = "".join(term)
        if use_ellipsis and draw(st.booleans()):
            k = draw(st.integers(0, len(ell_shape)))
            tail = ell_shape[len(ell_shape) - k :]
            sub = tuple(1 if draw(st.integers(0, 4)) == 0 else s for s in tail)
            text, shape = "..." + text, [*sub, *shape]
        terms.append(text)
        shapes.append(tuple(shape))
    used = sorted({ch for t in terms for ch in t if ch.isalpha()})
    if draw(st.booleans()):
        out = "".join(draw(st.permutations(used))[: draw(st.integers(0, len(used)))])
        if any("..." in t for t in terms):
            out = "..." + out
        spec = f"{','.join(terms)}->{out}"
    else:
        spec = ",".join(terms)
    share = draw(st.booleans()) and n > 1 and shapes[0] == shapes[1]
    return spec, shapes, share


@given(einsum_cases(), st.integers(0, 2**16))
def test_einsum_matches_numpy(case, seed):
    spec, shapes, share = case
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in shapes]
    if share:
        arrays[1] = arrays[0]
    try:
        expected = np.einsum(spec, *arrays)
    except ValueError:
        with pytest.raises((SpecError, ShapeError)):
            g = es.Graph()
            es.einsum(spec, *[g.input(f"x{k}", s, "f64") for k, s in enumerate(shapes)])
        return
    g = es.Graph()
    tensors = [g.input(f"x{k}", s, "f64") for k, s in enumerate(shapes) if not (share and k == 1)]
    if share:
        tensors.insert(1, tensors[0])
    g.output("y", es.einsum(spec, *tensors))
    feeds = {f"x{k}": a for k, a in enumerate(arrays) if not (share and k == 1)}
    got = run(g, feeds)["y"]
    assert got.shape == np.shape(expected)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)


def _loop_oracle(spec, arrays, join, agg):
    """Evaluate a single explicit-output op by looping over its join space."""
    lhs, out = spec.split("->")
    terms = lhs.split(",")
    size = {}
    for t, a in zip(terms, arrays, strict=True):
        size.update(zip(t, a.shape, strict=True))
    summed = [ch for ch in dict.fromkeys("".join(terms)) if ch not in out]
    combine = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}[agg]
    result = np.zeros([size[ch] for ch in out])
    for idx in itertools.product(*(range(size[ch]) for ch in out)):
        acc = None
        for sidx in itertools.product(*(range(size[ch]) for ch in summed)):
            env = dict(zip(out, idx, strict=True)) | dict(zip(summed, sidx, strict=True))
            vals = [a[tuple(env[ch] for ch in t)] for t, a in zip(terms, arrays, strict=True)]
            v = join(*vals)
            acc = v if acc is None else combine(acc, v)
        result[idx] = acc
    return result


JOINS = {
    "x0 * x1": lambda a, b: a * b,
    "exp(x0 - x1)": lambda a, b: math.exp(a - b),
    "max(x0, x1) + 1": lambda a, b: max(a, b) + 1,
    "where(x0 > x1, x0, x1 * 2)": lambda a, b: a if a > b else 2 * b,
}


@pytest.mark.parametrize("agg", ["add", "mul", "min", "max"])
@pytest.mark.parametrize("join", list(JOINS))
@pytest.mark.parametrize("spec", ["ij,jk->ik", "ij,j->i", "ijk,ik->", "ab,cb->ca"])
def test_custom_join_and_every_aggregation(spec, join, agg):
    lhs = spec.split("->")[0].split(",")
    sizes = {"i": 2, "j": 3, "k": 2, "a": 3, "b": 2, "c": 2}
    shapes = [tuple(sizes[ch] for ch in t) for t in lhs]
    rng = np.random.default_rng(len(spec) + len(join))
    arrays = [rng.uniform(0.5, 1.5, s) for s in shapes]
    g = es.Graph()
    ts = [g.input(f"x{k}", s, "f64") for k, s in enumerate(shapes)]
    g.output("y", es.einsum(spec, *ts, join=join, agg=agg))
    got = run(g, {f"x{k}": a for k, a in enumerate(arrays)})["y"]
    np.testing.assert_allclose(got, _loop_oracle(spec, arrays, JOINS[join], agg), rtol=1e-10)


def test_many_operands_split_pairwise_along_a_path():
    g = es.Graph()
    shapes = [(8, 3), (3, 40), (40, 2), (2, 9)]
    ts = [g.input(f"x{k}", s, "f64") for k, s in enumerate(shapes)]
    g.output("y", es.einsum("ab,bc,cd,de->ae", *ts))
    einsums = [n for n in g.ir.nodes if type(n).__name__ == "EinsumNode"]
    assert len(einsums) == 3
    assert all(len(n.op.inputs) == 2 for n in einsums)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in shapes]
    got = run(g, {f"x{k}": a for k, a in enumerate(arrays)})["y"]
    np.testing.assert_allclose(got, np.linalg.multi_dot(arrays), rtol=1e-10)


def test_bad_specs_raise_spec_errors():
    g = es.Graph()
    a = g.input("a", (2, 3))
    b = g.input("b", (4, 5))
    with pytest.raises(SpecError, match="operand"):
        es.einsum("ij,jk->ik", a)
    with pytest.raises(SpecError, match="rank"):
        es.einsum("ijk->i", a)
    with pytest.raises(SpecError):
        es.einsum("i1->i", a)
    with pytest.raises(SpecError, match="'z'"):
        es.einsum("ij->z", a)
    with pytest.raises(SpecError):
        es.einsum("ij->ii", a)
    with pytest.raises(ShapeError, match=r"'j'.*3.*4"):
        es.einsum("ij,jk->ik", a, b)


def test_missing_aggregation_is_an_error():
    g = es.Graph()
    a = g.input("a", (2, 3))
    b = g.input("b", (3, 4))
    with pytest.raises(SpecError, match="agg"):
        es.einsum("ij,jk->ik", a, b, join="exp(x0 - x1)")


@pytest.mark.parametrize(("spec", "shapes", "summed"), [
    ("ij,jk->ik", [(2, 3), (3, 4)], "j"),
    ("xy,yz", [(2, 3), (3, 4)], "y"),  # implicit output
    ("pq->", [(2, 3)], "pq"),
    ("...ij,jk->...ik", [(5, 2, 3), (3, 4)], "j"),
    ("zz->", [(3, 3)], "z"),  # a diagonal, summed
])
def test_missing_aggregation_names_the_users_spec_and_letters(spec, shapes, summed):
    """The op renames letters (ij,jk->ik became ac,cb->ab in the message); say what the user wrote."""
    g = es.Graph()
    ts = [g.input(f"t{k}", shape) for k, shape in enumerate(shapes)]
    join = "x0 + x1" if len(ts) == 2 else "exp(x0)"
    with pytest.raises(SpecError) as info:
        es.einsum(spec, *ts, join=join)
    message = str(info.value)
    assert f"einsum {spec!r} sums out {summed!r}" in message
    assert "agg='add'" in message and "ac,cb" not in message


def test_join_arity_mismatch_is_an_error():
    g = es.Graph()
    a = g.input("a", (2, 3))
    b = g.input("b", (3, 4))
    with pytest.raises(ExprError, match="x2"):
        es.einsum("ij,jk->ik", a, b, join="x0 * x2", agg="add")
    with pytest.raises(ExprError, match="x1"):
        es.einsum("ij,jk->ijk", a, b, join="x0")


def test_dtype_mismatch_in_a_join_is_an_error():
    """Without a join einsum promotes as numpy's does (tests/test_dtype_promotion.py); a join does not."""
    g = es.Graph()
    a = g.input("a", (2, 3), "f32")
    b = g.input("b", (3, 4), "f64")
    with pytest.raises(es.DtypeError, match=r"f32.*f64"):
        es.einsum("ij,jk->ik", a, b, join="x0 * x1", agg="add")


def test_matmul_follows_numpy():
    rng = np.random.default_rng(3)
    for sa, sb in [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((5, 1, 2, 3), (4, 3, 2)),
                   ((3,), (2, 3, 4)), ((2, 5, 3), (3,)), ((1, 2, 3), (4, 1, 3, 2)), ((2, 1, 3), (3, 1))]:
        g = es.Graph()
        a, b = g.input("a", sa, "f64"), g.input("b", sb, "f64")
        g.output("y", a @ b)
        A, B = rng.standard_normal(sa), rng.standard_normal(sb)
        np.testing.assert_allclose(run(g, {"a": A, "b": B})["y"], A @ B, rtol=1e-10)
    with pytest.raises(ShapeError):
        g = es.Graph()
        g.input("a", (2, 3)) @ g.input("b", (4, 2))
