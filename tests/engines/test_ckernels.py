"""Generated C kernels against the numpy path (the oracle).

Random joins from the language's grammar (every op, every real dtype, broadcasting
and transposed operands, NaN/±inf/−0.0 inputs, every aggregation). They must be
bit-equal where the language defines the result exactly, and within stated ulps where
it does not:
- exact: + - * /, neg, abs, sqrt, rsqrt, ** 2 / 0.5 / -1, min, max, relu, comparisons,
  where, and min/max aggregation (whose ±0 ties may pick either zero, as numpy's do);
- within ulps of numpy, measured here over 200k values from 1e-9 to 400 in magnitude
  (glibc's libmvec against numpy's own SIMD loops); special values (±0, ±inf, NaN,
  subnormals, overflow) are bit-equal: see ULPS below;
- add/mul aggregation: reassociated (vector lanes), so within n·eps of the terms' magnitude.
Half types (f16, bf16) compute in f32 and round once: their oracle is the f32 numpy path
on the widened inputs, rounded to the half type.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from einsummable.engines.kernels import cbuild, native
from einsummable.engines.kernels import fast as kernels
from einsummable.engines.kernels import reference as reference_kernel
from einsummable.ir.dtypes import to_numpy
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.expr import Const, Expr, Input, Var, call, inputs_used

pytestmark = pytest.mark.skipif(
    not cbuild.enabled() or cbuild.compiler() is None,
    reason="compiled kernels off (EINSUMMABLE_KERNELS=numpy or no C compiler)")

EXACT_UNARY = ("neg", "abs", "sqrt", "rsqrt", "relu", "stop_gradient")
ULP_UNARY = ("exp", "log", "sin", "cos", "tanh", "sigmoid", "silu", "gelu")
BINARY = ("add", "sub", "mul", "div", "min", "max")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0]
# max ulps against numpy per function and dtype, measured (see the module docstring);
# f64 exp is 3 within +-708.4 and 4 past 708.4 (shifted into libmvec's fast range and
# scaled back: one more rounding, see cprelude); f32 exp is inline (cprelude), no libmvec.
# sigmoid, silu and gelu are 1 / (1 + e^-x), x / (1 + e^-x) and x / (1 + e^-2u): exp's ulps,
# then two roundings that can fall on either side (4 measured over 400k values, f32 and f64)
_EXP_FORMS = {"sigmoid": 4, "silu": 4, "gelu": 4}
ULPS = {"f32": {"exp": 3, "log": 5, "sin": 2, "cos": 2, "tanh": 1, "pow3": 2, **_EXP_FORMS},
        "f64": {"exp": 4, "log": 2, "sin": 3, "cos": 3, "tanh": 2, "pow3": 2, **_EXP_FORMS}}
WIDE = {"bf16": "f32", "f16": "f32", "f32": "f32", "f64": "f64"}


def _exprs(n_inputs: int, exact: bool) -> st.SearchStrategy[Expr]:
    consts = [Const(v) for v in (*SPECIAL, 1.0, 2.5, -3.0)]
    leaf = st.one_of(st.sampled_from([Input(i) for i in range(n_inputs)]),
                     st.sampled_from(consts), st.just(Var("v")))
    unary = EXACT_UNARY if exact else EXACT_UNARY + ULP_UNARY
    powers = (2.0, 0.5, -1.0, 1.0) if exact else (2.0, 0.5, -1.0, 1.0, 3.0)

    def extend(kids: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        return st.one_of(
            st.builds(lambda op, a: call(op, a), st.sampled_from(unary), kids),
            st.builds(lambda op, a, b: call(op, a, b), st.sampled_from(BINARY), kids, kids),
            st.builds(lambda a, c: call("pow", a, Const(c)), kids, st.sampled_from(powers)),
            st.builds(lambda cmp, a, b, t, f: call("where", call(cmp, a, b), t, f),
                      st.sampled_from(COMPARE), kids, kids, kids, kids),
        )

    return st.recursive(leaf, extend, max_leaves=6)


@st.composite
def _cases(draw, exact: bool) -> tuple[Einsummable, int]:
    rank = draw(st.integers(1, 3))
    sizes = tuple(draw(st.sampled_from([1, 2, 3, 5, 17, 40])) for _ in range(rank))
    n = draw(st.integers(1, 3))
    inputs = [tuple(draw(st.permutations(range(rank)))[: draw(st.integers(1, rank))]) for _ in range(n)]
    out_rank = draw(st.integers(0, rank))
    missing = [i for i in range(out_rank, rank) if not any(i in idx for idx in inputs)]
    inputs[0] = (*inputs[0], *missing)
    join = draw(_exprs(n, exact))
    for k in sorted(set(range(n)) - inputs_used(join)):  # every operand is read
        join = call(draw(st.sampled_from(BINARY)), join, Input(k))
    agg = draw(st.sampled_from(["add", "mul", "min", "max"])) if out_rank < rank else None
    dtype = draw(st.sampled_from(["f32", "f64", "bf16", "f16"]))
    op = Einsummable(sizes, tuple(inputs), out_rank, join, agg, (dtype,) * n)
    return op, draw(st.integers(0, 2**32 - 1))


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, special: bool) -> np.ndarray:
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-3, 3, shape))
    if special:
        hit = rng.random(shape) < 0.15
        x[hit] = rng.choice(SPECIAL, size=int(hit.sum()))
    out = x.astype(to_numpy(dtype))
    if out.ndim and rng.random() < 0.3:  # a strided view, as a slice of a larger block hands over
        wide = np.repeat(out, 2, axis=-1)
        out = wide[..., ::2]
    return out


def _run(cases: list[tuple[Einsummable, int]], special: bool):
    """Prepare every case, build them all in one batch, then run compiled and oracle."""
    prepared = [(op, seed, native.kernel(op, None)) for op, seed in cases]
    native.flush()
    for op, seed, kernel in prepared:
        assert kernel is not None, f"no C form for {op.spec} {op.join} {op.dtypes}"
        rng = np.random.default_rng(seed)
        shapes = [tuple(op.join_shape[i] for i in idx) for idx in op.inputs]
        arrays = [_values(rng, s, d, special) for s, d in zip(shapes, op.dtypes, strict=True)]
        variables = {"v": float(rng.choice([0.75, -2.0, 0.0, math.inf]))}
        with np.errstate(all="ignore"):
            got = kernel(arrays, variables)
            want = _oracle(op, arrays, variables)
        # a half reduction hands back its f32 accumulator; the prepared kernel rounds it once
        half_sum = op.agg is not None and op.dtype in ("bf16", "f16")
        assert got.dtype == (np.float32 if half_sum else to_numpy(op.dtype))
        got = got.astype(to_numpy(op.dtype))
        yield op, arrays, variables, got, want


def _oracle(op: Einsummable, arrays, variables, agg=True, widen=WIDE) -> np.ndarray:
    """The numpy path in the compute dtype (f32 for halves), rounded to the op's dtype."""
    wide = tuple(widen[d] for d in op.dtypes)
    if not agg:
        op = Einsummable(op.join_shape, op.inputs, op.rank, op.join, None, wide)
    else:
        op = Einsummable(op.join_shape, op.inputs, op.out_rank, op.join, op.agg, wide)
    widened = [np.asarray(a, dtype=to_numpy(d)) for a, d in zip(arrays, wide, strict=True)]
    return reference_kernel.einsum(op, widened, variables)


def _same_bits(got: np.ndarray, want: np.ndarray, zeros_equal: bool) -> np.ndarray:
    got, want = got.astype(np.float64), want.astype(np.float64)
    same = (np.isnan(got) & np.isnan(want)) | (got == want)
    if not zeros_equal:
        same &= np.isnan(got) | (np.signbit(got) == np.signbit(want))
    return same


def _check(op, arrays, variables, got, want):
    assert got.dtype == to_numpy(op.dtype) and got.shape == op.out_shape
    want = want.astype(got.dtype)
    if op.agg in (None, "min", "max"):
        ok = _same_bits(got, want, zeros_equal=op.agg is not None)
        assert ok.all(), f"{op.spec} {op.join} {op.dtypes}: {got[~ok][:4]} vs {want[~ok][:4]}"
        return
    scale, bound = _reassociated(op, arrays, variables)
    half = 2.0 ** -7 if op.dtype == "bf16" else 2.0 ** -10 if op.dtype == "f16" else 0.0
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(scale) & (scale < 1e30) & (scale > 1e-30) if op.agg == "mul" else np.isfinite(scale)
    close = np.abs(g - w) <= bound + half * np.abs(w)
    ok = np.where(finite, close, _same_bits(got, want, zeros_equal=True) | ~np.isfinite(scale))
    assert ok.all(), f"{op.spec} {op.join} {op.dtypes}: {got[~ok][:4]} vs {want[~ok][:4]}"


def _reassociated(op, arrays, variables) -> tuple[np.ndarray, np.ndarray]:
    """An add / mul aggregation is reassociated (numpy sums pairwise, the C kernel in vector
    lanes and a tree over them): within 2 n eps of the sum (product) of the |terms|.
    Returns that sum (product) and the bound; 0 without aggregation."""
    if op.agg not in ("add", "mul"):
        return np.zeros(op.out_shape), np.zeros(op.out_shape)
    with np.errstate(all="ignore"):
        terms = np.abs(_oracle(op, arrays, variables, agg=False).astype(np.float64))
    axes = tuple(range(op.out_rank, op.rank))
    n = math.prod(op.join_shape[op.out_rank:])
    scale = terms.sum(axis=axes) if op.agg == "add" else terms.prod(axis=axes)
    eps = np.finfo(np.float32 if op.dtype != "f64" else np.float64).eps
    return scale, 2 * n * eps * scale


SETTINGS = settings(max_examples=int(os.environ.get("CKERNEL_EXAMPLES", 3)), deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])


@SETTINGS
@given(st.lists(_cases(exact=True), min_size=30, max_size=30))
def test_exact_joins_bit_equal_numpy(cases):
    for result in _run(cases, special=True):
        _check(*result)


@SETTINGS
@given(st.lists(_cases(exact=False), min_size=30, max_size=30))
def test_joins_with_vector_math_close_to_numpy(cases):
    """Transcendentals differ from numpy by a few ulps; after a random chain of ops that is
    judged against the join's own sensitivity: numpy's result moved by perturbing the inputs,
    or numpy's own error against the join evaluated in f64 (cancellation, as in gelu's
    tanh(u) + 1, magnifies an ulp of tanh as much in numpy as here)."""
    for op, arrays, variables, got, want in _run(cases, special=False):
        rng = np.random.default_rng(0)
        nudged = [(a.astype(np.float64) * (1 + 4 * _eps(op.dtype) * rng.choice([-1, 1], a.shape)))
                  .astype(a.dtype) for a in arrays]
        with np.errstate(all="ignore"):
            moved = _oracle(op, nudged, variables).astype(np.float64)
            exact = _oracle(op, arrays, variables, widen=dict.fromkeys(WIDE, "f64"))
        g, w = got.astype(np.float64), want.astype(got.dtype).astype(np.float64)
        finite = np.isfinite(w) & np.isfinite(moved)
        tol = 4 * np.maximum(np.abs(moved - w), np.abs(exact - w)) + 16 * _eps(op.dtype) * np.abs(w) + 1e-30
        with np.errstate(all="ignore"):
            tol = tol + np.nan_to_num(_reassociated(op, arrays, variables)[1], nan=0.0, posinf=np.inf)
        ok = np.where(finite, np.abs(g - w) <= tol, np.isnan(g) == np.isnan(w))
        assert ok.all(), f"{op.spec} {op.join} {op.dtypes}: {got[~ok][:4]} vs {want[~ok][:4]}"


def _eps(dtype: str) -> float:
    return {"bf16": 2.0 ** -8, "f16": 2.0 ** -11, "f32": 2.0 ** -24, "f64": 2.0 ** -53}[dtype]


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units in the last place, over the ordered integers of the float's bits."""
    ints = {4: np.int32, 8: np.int64}[a.dtype.itemsize]

    def ordered(x):
        i = x.view(ints).astype(np.int64)
        return np.where(i < 0, np.iinfo(ints).min - i, i)

    return np.abs(ordered(a) - ordered(b))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_vector_math_special_values_and_ulps(dtype):
    """Each vector math function (libmvec) against numpy: special values bit-equal,
    others within the stated ulps."""
    np_dtype = to_numpy(dtype)
    tiny = np.finfo(np_dtype).smallest_subnormal
    big = np.finfo(np_dtype).max
    special = np.array([math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, tiny, -tiny, big, -big],
                       dtype=np_dtype)
    rng = np.random.default_rng(1)
    normal = (rng.standard_normal(100_000) * np.exp(rng.uniform(-20, 6, 100_000))).astype(np_dtype)
    # gelu's far negative tail, where 0.5 x (1 + tanh u) cancelled: 875M ulps apart on AVX2
    tail = np.array([-5.2517805, -5.4, -6.0, -7.2, -8.0, -9.5, -10.0], dtype=np_dtype)
    xs = np.concatenate([special, normal, tail])
    joins = {"exp": "exp(x0)", "log": "log(x0)", "sin": "sin(x0)", "cos": "cos(x0)", "tanh": "tanh(x0)",
             "pow3": "x0 ** 3", "sigmoid": "sigmoid(x0)", "silu": "silu(x0)", "gelu": "gelu(x0)"}
    ops = {name: Einsummable.from_spec("i->i", [xs.shape], join=j, dtypes=[dtype])
           for name, j in joins.items()}
    compiled = {name: native.kernel(op, None) for name, op in ops.items()}
    native.flush()
    for name, op in ops.items():
        with np.errstate(all="ignore"):
            got, want = compiled[name]([xs], None), reference_kernel.einsum(op, [xs])
        n = len(special)
        same = _same_bits(got[:n], want[:n], zeros_equal=False)
        assert same.all(), f"{name}({special[~same]}) = {got[:n][~same]}, numpy {want[:n][~same]}"
        assert (np.isnan(got) == np.isnan(want)).all(), name
        both = ~np.isnan(got)
        if name == "exp":  # overflow to inf and underflow to 0 where numpy's do
            edge = np.array((89.0, -104.0) if dtype == "f32" else (710.0, -746.0), dtype=np_dtype)
            assert (native.kernel(op.block((2,)), None)([edge], None) == np.array([math.inf, 0.0])).all()
        bound = ULPS[dtype].get(name, ULPS[dtype]["tanh"])
        worst = int(_ulps(got[both], want[both]).max())
        assert worst <= bound, f"{name} ({dtype}) is {worst} ulps from numpy; stated {bound}"


# exp's edges: libmvec's fast range ends at |x| = 87.33655 (f32) / 708.396 (f64); below
# it the result is subnormal then 0, above it inf (numpy's 0 and inf, bit for bit)
EXP_EDGES = {"f32": [-87.3, -87.33654, -87.33655, -87.5, -90.0, -95.0, -100.0, -103.9, -103.972,
                     -103.973, -104.0, -104.5, -1e9, -3e38, 87.33655, 87.5, 88.7, 88.72283, 88.7229,
                     88.8, 89.0, 1e9],
             "f64": [-708.39, -708.3964, -708.397, -708.5, -720.0, -740.0, -745.1, -745.13, -745.14,
                     -746.0, -1e9, -1e300, 708.39, 708.4, 709.5, 709.78, 709.79, 710.0, 1e300]}


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_exp_past_libmvec_fast_range_matches_numpy(dtype):
    """exp where libmvec's vector exp leaves its fast path (issue 18: a causal mask's -1e9
    or -inf in softmax's exp(x - m)): the compiled kernel shifts such arguments into the
    fast range and scales back, so it must still give numpy's values: 0, subnormals, inf
    and NaN bit for bit, the rest within the stated ulps. f64: a row with a far argument
    takes the shifting loop, a row without it the plain loop: they agree bit for bit (f32's
    inline exp has one loop: trivially so)."""
    np_dtype = to_numpy(dtype)
    edges = np.array([*EXP_EDGES[dtype], -math.inf, math.inf, math.nan, 0.0, -1.0, 2.5], dtype=np_dtype)
    rng = np.random.default_rng(5)
    far = 87.33655 if dtype == "f32" else 708.396
    top = 104.5 if dtype == "f32" else 746.5
    sweep = rng.uniform(far, top, 20_000) * rng.choice([-1, 1], 20_000)  # the shifted ranges
    near = rng.uniform(-far, far, 20_000)  # the plain range, in rows that hold a far value too
    xs = np.concatenate([near, edges, sweep]).astype(np_dtype)  # near first: in both rows' vector loop
    m = np.zeros((), dtype=np_dtype)
    kernel, plain_row = (native.kernel(Einsummable.from_spec("j,->j", [a.shape, ()], join="exp(x0 - x1)",
                                                             dtypes=[dtype] * 2), None) for a in (xs, near))
    native.flush()
    with np.errstate(all="ignore"):
        got, want = kernel([xs, m], None), np.exp(xs)
    special = (want == 0) | ~np.isfinite(want)
    exact = _same_bits(got[special], want[special], zeros_equal=False)
    assert exact.all(), f"exp({xs[special][~exact]}) = {got[special][~exact]}, numpy {want[special][~exact]}"
    assert (got[~special] > 0).all() and np.isfinite(got[~special]).all()
    subnormal = want < np.finfo(np_dtype).tiny
    assert subnormal[~special].sum() > 1000, "the sweep reaches the subnormal results"
    worst = _ulps(got[~special], want[~special])  # subnormals: ulps of the subnormal spacing
    assert worst.max() <= ULPS[dtype]["exp"], f"exp({xs[~special][worst.argmax()]}): {worst.max()} ulps off"
    plain = plain_row([near.astype(np_dtype), m], None)  # no far argument in this row
    assert _same_bits(plain, got[: len(near)], zeros_equal=False).all()


@pytest.mark.slow  # a timing check: run it with -m slow on a quiet machine, not in every CI run
def test_exp_past_libmvec_fast_range_is_not_slow():
    """The point of issue 18: a row full of a causal mask's -1e9 (and -inf) took libmvec's
    scalar fallback per lane, ~15-35x the time of ordinary arguments. Now within a few x
    (f64's shifting loop costs ~2.5x a plain exp; f32's inline exp selects 0 there); best
    of interleaved runs, so a loaded machine disturbs both sides alike."""
    n = 1 << 18
    op = Einsummable.from_spec("j,->j", [(n,), ()], join="exp(x0 - x1)", dtypes=["f32"] * 2)
    kernel = native.kernel(op, None)
    native.flush()
    m = np.zeros((), dtype=np.float32)
    inputs = {fill: np.full(n, fill, dtype=np.float32) for fill in (-1.0, -1e9, -math.inf)}
    best = dict.fromkeys(inputs, math.inf)
    for _ in range(7):
        for fill, x in inputs.items():
            start = time.perf_counter()
            kernel([x, m], None)
            best[fill] = min(best[fill], time.perf_counter() - start)
    for fill in (-1e9, -math.inf):
        assert best[fill] < 6 * best[-1.0], f"exp({fill}) takes {best[fill] / best[-1.0]:.1f}x exp(-1)"


@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16"])
def test_min_max_where_compare_on_every_pair_of_special_values(dtype):
    """numpy's semantics, bit for bit: min/max propagate NaN and return the second operand on
    ties (so max(-0.0, 0.0) is 0.0 and max(0.0, -0.0) is -0.0); where selects exactly."""
    values = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.5]
    a, b = (np.array(v, dtype=to_numpy(dtype)).reshape(7, 7) for v in
            zip(*[(p, q) for p in values for q in values], strict=True))
    joins = ["max(x0, x1)", "min(x0, x1)", "relu(x0) + x1 * 0", "where(x0 < x1, x0, x1)",
             "where(x0 >= x1, x1, -x0)", "where(x0 != x1, abs(x0), x1)", "where(x0 == x1, 1, 0) * x1"]
    ops = [Einsummable.from_spec("ij,ij->ij", [(7, 7)] * 2, join=j, dtypes=[dtype] * 2) for j in joins]
    ops += [Einsummable.from_spec("ij,ij->i", [(7, 7)] * 2, join="x0 + x1 * 0", agg=agg, dtypes=[dtype] * 2)
            for agg in ("max", "min")]
    compiled = [native.kernel(op, None) for op in ops]
    native.flush()
    for op, kernel in zip(ops, compiled, strict=True):
        with np.errstate(all="ignore"):
            got, want = kernel([a, b], None), _oracle(op, [a, b], None).astype(to_numpy(dtype))
        same = _same_bits(got, want, zeros_equal=op.agg is not None)
        assert same.all(), f"{op.join}: {got[~same]} vs numpy {want[~same]}"


def test_half_ops_run_compiled_as_the_numpy_path_computes_them(monkeypatch):
    """bf16 ops take the C kernel (issue 18) and compute as the numpy path does: in f32,
    rounded once. A half sum hands back its f32 accumulator, for prepare to round once
    (to f32 where the sum is kept wide, as rmsnorm's square is): 4096 squares of 30 in
    f16 sum to 3686400, far past f16's 65504."""
    square = Einsummable((4, 4096), ((0, 1),), 1, call("mul", Input(0), Input(0)), "add", ("f16",))
    summed = native.kernel(square, None)
    native.flush()
    got = summed([np.full((4, 4096), 30.0, dtype=np.float16)], None)
    assert got.dtype == np.float32 and (got == 4096 * 900.0).all()
    routed = []
    real = native.kernel
    monkeypatch.setattr(native, "kernel", lambda op, body: routed.append(op.dtypes) or real(op, body))
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((40, 17)).astype(to_numpy("bf16")) for _ in range(2))
    mixed = Einsummable.from_spec("ij,ij->ij", [(40, 17)] * 2, join="(x0 - x1) * x1 / 3", dtypes=["bf16"] * 2)
    got = kernels.prepare.__wrapped__(mixed)([a, b], None)
    assert _same_bits(got, reference_kernel.einsum(mixed, [a, b]), zeros_equal=False).all()
    assert routed == [("bf16", "bf16")]


@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16", "f16"])
@pytest.mark.parametrize("agg", ["add", "mul", "max", "min"])
def test_lane_reductions_at_the_lane_boundaries_with_special_values(dtype, agg):
    """A reduction over the inner index runs in 32 (f32 accumulators) / 16 (f64) lanes,
    a scalar tail into the same lanes, then a tree over them. Rows of every length around those widths,
    holding NaN, ±inf and ±0.0 in random lanes (a row of a NaN and a -inf, of +inf and
    -inf, ...), against numpy: min/max bit-equal (NaN wins, a ±0 tie either zero), add/mul
    within the reassociation bound (``_reassociated``), NaN where numpy's is NaN."""
    rng = np.random.default_rng(7)
    lengths = [1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 100]
    cases = []
    for n in lengths:
        op = Einsummable.from_spec("ij->i", [(24, n)], join="x0 * 1", agg=agg, dtypes=[dtype])
        x = rng.standard_normal((24, n)) * (0.9 if agg == "mul" else 1.0)
        for row in range(1, 24):  # row 0 stays finite
            k = int(rng.integers(1, 3))
            x[row, rng.choice(n, size=min(k, n), replace=False)] = rng.choice(SPECIAL, size=min(k, n))
        cases.append((op, x.astype(to_numpy(dtype))))
    kernels_ = [native.kernel(op, None) for op, _ in cases]
    native.flush()
    for (op, x), kernel in zip(cases, kernels_, strict=True):
        with np.errstate(all="ignore"):
            got = kernel([x], None).astype(to_numpy(dtype))
            want = _oracle(op, [x], None)
        _check(op, [x], None, got, want)
        assert (np.isnan(got.astype(np.float64)) == np.isnan(want.astype(np.float64))).all(), op.spec


@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16"])
def test_a_whole_block_join_loops_flat_when_contiguous_and_by_rows_when_not(dtype):
    """An elementwise join whose operands are the whole block (or a scalar) runs one flat loop
    when each operand is C-contiguous, and the row loops otherwise (a slice of a wider block,
    a transposed copy, a size-1 dim whose stride is anything): bit-equal to numpy either way."""
    shape = (3, 5, 40)
    op = Einsummable(shape, ((0, 1, 2), (0, 1, 2), ()), 3, call("where", call("gt", Input(0), Input(2)),
                     call("mul", Input(0), Input(1)), call("sub", Input(1), Input(2))), None, (dtype,) * 3)
    assert "n_all" in native.kernel(op, None).src.text  # the flat loop is there (cached source)
    rng = np.random.default_rng(0)
    dt = to_numpy(dtype)
    a, b = (_values(rng, shape, "f64", True).astype(dt) for _ in range(2))
    s = np.array(0.5, dtype=dt)
    wide = np.zeros((3, 5, 80), dtype=dt)
    wide[..., :40] = b
    flipped = np.ascontiguousarray(a.transpose(2, 1, 0)).transpose(2, 1, 0)
    odd = np.lib.stride_tricks.as_strided(a[:1], (1, 5, 40), (7, *a.strides[1:]))  # size-1 dim, stride 7
    kernel = native.kernel(op, None)
    for x, y in [(a, b), (a, wide[..., :40]), (flipped, b), (flipped, wide[..., :40])]:
        with np.errstate(all="ignore"):
            _check(op, [x, y, s], {}, kernel([x, y, s], {}), _oracle(op, [x, y, s], {}))
    small = Einsummable((1, 5, 40), op.inputs, 3, op.join, None, op.dtypes)
    with np.errstate(all="ignore"):
        _check(small, [odd, b[:1], s], {}, native.kernel(small, None)([odd, b[:1], s], {}),
               _oracle(small, [odd, b[:1], s], {}))

