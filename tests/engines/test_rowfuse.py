"""Row reductions fused with their one elementwise reader (lower/fusion.py's rule; the local
engine's step in engines/kernels/rowfuse.py, crows.py).

The fused step against two oracles: the same two ops run apart by the engine's kernels
(bit for bit: the fused function is their generated code, composed a row at a time), and
the numpy path run apart (within the reassociated sum's error). Then the local engine on
graphs with the pattern against the reference engine, and the paths that run unfused.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import einsummable as es
from einsummable.engines import local
from einsummable.engines.kernels import cbuild, native, rowfuse
from einsummable.engines.kernels import fast as kernels
from einsummable.ir import kinds, scalar
from einsummable.ir.dtypes import to_numpy
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.expr import Const, Input, Var, call, inputs_used
from einsummable.lower.fusion import wiring
from einsummable.lower.taskgraph import FusedTask, TaskGraph

pytestmark = pytest.mark.skipif(
    not cbuild.enabled() or cbuild.compiler() is None,
    reason="compiled kernels off (EINSUMMABLE_KERNELS=numpy or no C compiler)")

EPS = 1e-06
# name: (R's spec, join, agg, operand names; J's spec, join, operand names, "r" = R's block)
PATTERNS = {
    "softmax backward": ("ij,ij->i", "x0 * x1", "add", ("y", "dy"),
                         "ij,ij,i->ij", "x0 * (x1 - x2)", ("y", "dy", "r")),
    "rmsnorm forward": ("ij->i", "x0 * x0 * 0.03125", "add", ("h",),
                        "ij,i,j->ij", f"x0 * rsqrt(x1 + {EPS}) * x2", ("h", "r", "w")),
    "rmsnorm backward dx": (  # Llama's: the residual's gradient x0 added, which R does not read
        "abc,ab,c,abc->ab", f"-0.5 * (rsqrt({EPS} + x1) / ({EPS} + x1)) * x0 * x2 * x3", "add",
        ("g", "ms", "w", "h"),
        "abc,ab,abc,ab,c,abc->abc", f"x0 + rsqrt({EPS} + x3) * x4 * x5 + 0.0078125 * (x1 + x1) * x2",
        ("d", "r", "h", "ms", "w", "g")),
    "softmax last two": ("ij,i->i", "exp(x0 - x1)", "add", ("x", "m"),
                         "ij,i,i->ij", "exp(x0 - x1) / x2", ("x", "m", "r")),
    "row max": ("ij->i", "x0", "max", ("x",), "ij,i->ij", "exp(x0 - x1)", ("x", "r")),
    "two reduced dims": ("ijk,ikj->i", "x0 * x1", "add", ("a", "b"),
                         "ijk,i,ikj->ijk", "x0 * x1 + x2", ("a", "r", "b")),
    "transposed operand": ("ij,ji->i", "x0 - x1", "add", ("x", "t"),
                           "ij,i,ji->ij", "x0 / x1 * x2", ("x", "r", "t")),
    "run-time variable": ("ij->i", "(x0 - v) * x0", "add", ("x",), "ij,i->ij", "x0 - x1 * v", ("x", "r")),
    "factored, outer operand": ("ij,i,ij->i", "x0 * x1 * x2", "add", ("a", "s", "b"),
                                "ij,i,ij->ij", "x0 * x1 - x2", ("a", "r", "b")),
}
SIZES = [(1, 1, 1), (3, 5, 2), (17, 31, 3), (4, 64, 2), (5, 100, 3)]  # about the 32-lane boundaries


def _pair(name: str, dtype: str, sizes: tuple[int, ...]):
    """R, J, the position J reads R's block at, and their operand names."""
    rspec, rjoin, agg, rnames, jspec, jjoin, jnames = PATTERNS[name]
    size = dict(zip("ijkabc", sizes + sizes, strict=True))

    def op(spec, join, agg=None):
        terms = spec.split("->")[0].split(",")
        return Einsummable.from_spec(spec, [tuple(size[c] for c in t) for t in terms], join=join, agg=agg,
                                     dtypes=[dtype] * len(terms))

    return op(rspec, rjoin, agg), op(jspec, jjoin), jnames.index("r"), rnames, jnames


def _arrays(red, join, k, rnames, jnames, dtype, seed, special):
    """Operand values by name: wide-ranging normals, some strided, with NaN / ±inf rows."""
    rng = np.random.default_rng(seed)
    shapes = {n: tuple(red.join_shape[i] for i in idx) for n, idx in zip(rnames, red.inputs, strict=True)}
    for m, (n, idx) in enumerate(zip(jnames, join.inputs, strict=True)):
        if m != k:
            shapes[n] = tuple(join.join_shape[i] for i in idx)
    out = {}
    for n, shape in shapes.items():
        x = rng.standard_normal(shape) * np.exp(rng.uniform(-2, 2, shape))
        if n in ("ms",):
            x = np.abs(x)
        if special and len(shape) > 1:
            x[0, ...] = rng.choice([np.nan, np.inf, -np.inf, 1.0], size=x[0, ...].shape)
        a = x.astype(to_numpy(dtype))
        if a.ndim and rng.random() < 0.5:  # a strided view (a slice of a larger block) or column-major
            a = np.repeat(a, 2, axis=-1)[..., ::2] if rng.random() < 0.5 else np.asfortranarray(a)
        out[n] = a
    return out


def _step(red, join, k, rnames, jnames):
    """The fused step over named operands, and the names of its arguments, each once (as
    lower/fusion.py hands them: R's operands, then J's others)."""
    names, slots = wiring(rnames, jnames, k)
    return rowfuse.step(FusedTask(red, join, slots, tuple(range(len(names))), 0)), names


def _rows(tg: TaskGraph) -> list[FusedTask]:
    return [t for t in tg.tasks if isinstance(t, FusedTask) and not kinds.is_gemm(t.first)]


def _numpy_path(o: Einsummable, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv(cbuild.ENV, "numpy")
        return kernels.prepare.__wrapped__(o)


def _same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    g, w = got.astype(np.float64), want.astype(np.float64)
    return (np.isnan(g) & np.isnan(w)) | (g == w)


CASES = [(name, dtype, sizes, special) for name in PATTERNS for dtype in ("f32", "f64", "bf16")
         for sizes, special in zip(SIZES, [False, True, False, True, False], strict=True)]


def test_fused_step_gives_the_bits_of_its_two_kernels_and_the_numpy_path(monkeypatch):
    """Every pattern, dtype and size: bit-equal to R's and J's kernels run apart as the engine
    runs them unfused (a factored sum too), and as close to the numpy path run apart as a
    reassociated sum allows."""
    built = []
    for case in CASES:
        name, dtype, sizes, special = case
        red, join, k, rnames, jnames = _pair(name, dtype, sizes)
        assert rowfuse.source(red, join, k) is not None, f"{name} {dtype} does not fuse"
        step, names = _step(red, join, k, rnames, jnames)
        assert isinstance(step, rowfuse.Fused)
        apart = kernels.prepare(red), kernels.prepare(join)  # the two tasks' kernels in the engine
        built.append((case, red, join, k, rnames, jnames, (step, names), apart))
    native.flush()  # all in one batch
    for seed, ((name, dtype, sizes, special), red, join, k, rnames, jnames, (step, names), (c_red, c_join)) \
            in enumerate(built):
        arrays = _arrays(red, join, k, rnames, jnames, dtype, seed, special)
        variables = {"v": 0.75}
        with np.errstate(all="ignore"):
            got = step([arrays[n] for n in names], {}, variables)
            block = c_red([arrays[n] for n in rnames], variables)
            exact = c_join([block if m == k else arrays[n] for m, n in enumerate(jnames)], variables)
            block = _numpy_path(red, monkeypatch)([arrays[n] for n in rnames], variables)
            operands = [block if m == k else arrays[n] for m, n in enumerate(jnames)]
            near = _numpy_path(join, monkeypatch)(operands, variables)
        what = f"{name} {dtype} {sizes}"
        assert got.dtype == to_numpy(join.dtype) and got.shape == join.out_shape, what
        same = _same(got, exact)
        assert same.all(), f"{what}: {got[~same][:4]} vs {exact[~same][:4]}"
        g, w = got.astype(np.float64), near.astype(np.float64)
        assert (np.isnan(g) == np.isnan(w)).all() and (g[np.isinf(w)] == w[np.isinf(w)]).all(), what
        finite = np.isfinite(g) & np.isfinite(w)
        rtol = {"f32": 2e-4, "f64": 1e-11, "bf16": 2 ** -5}[dtype]
        scale = np.abs(w[finite]).max(initial=1.0)
        np.testing.assert_allclose(g[finite], w[finite], rtol=rtol, atol=rtol * scale, err_msg=what)


def test_two_pairs_of_one_form_walked_in_other_orders_each_give_their_own_bits():
    """A reduction walks its largest operand's order, which its sizes choose: two pairs of one
    form, built in one process, each get the function of their own order (the cache kept the
    first one's, whose sum ran in another order: bits apart from the engine's kernels)."""
    built = []
    for n0 in (1, 4):  # loop orders (0, 1, 2) and (0, 2, 1)
        red = Einsummable.from_spec("jk,ikj->i", [(40, 37), (n0, 37, 40)], join="exp(x0 * 0.01) * x1",
                                    agg="add", dtypes=["f32", "f32"])
        join = Einsummable.from_spec("i,ij->ij", [(n0,), (n0, 7)], join="x1 - x0", dtypes=["f32", "f32"])
        step, names = _step(red, join, 0, ["r0", "r1"], ["R", "j1"])
        built.append((red, join, (step, names), kernels.prepare(red), kernels.prepare(join)))
    native.flush()
    rng = np.random.default_rng(0)
    for red, join, (step, names), c_red, c_join in built:
        arrays = {"r0": rng.standard_normal((40, 37)).astype(np.float32),
                  "r1": rng.standard_normal(red.input_shapes[1]).astype(np.float32),
                  "j1": rng.standard_normal(join.input_shapes[1]).astype(np.float32)}
        got = step([arrays[n] for n in names], {}, {})
        want = c_join([c_red([arrays["r0"], arrays["r1"]], None), arrays["j1"]], None)
        assert (got == want).all(), f"{red.join_shape}: {got[got != want][:3]} vs {want[got != want][:3]}"


def test_what_stays_apart():
    """f16 stays on numpy (as its kernels do); a join that reads R's block along other dims
    than its leading ones, and a reduction walked with its kept dim innermost, have no row."""
    red, join, k, *_ = _pair("softmax backward", "f16", (4, 8, 2))
    assert rowfuse.source(red, join, k) is None
    red, join, k, *_ = _pair("softmax backward", "f32", (4, 8, 2))
    assert rowfuse.source(red, join, k) is not None

    def op(spec, shapes, join, agg=None):
        return Einsummable.from_spec(spec, shapes, join=join, agg=agg, dtypes=["f32"] * len(shapes))

    rows = op("ij->i", [(8, 8)], "x0", "add")
    assert rowfuse.source(rows, op("ij,i->ij", [(8, 8), (8,)], "x0 * x1"), 1) is not None
    assert rowfuse.source(rows, op("ij,j->ij", [(8, 8), (8,)], "x0 * x1"), 1) is None
    columns = op("ji->i", [(8, 8)], "x0", "add")  # walked down the columns: no row in L1
    assert rowfuse.source(columns, op("ij,i->ij", [(8, 8), (8,)], "x0 * x1"), 1) is None


def _graph(dtype: str = "f32") -> tuple[es.Graph, dict[str, np.ndarray]]:
    """Softmax backward, rmsnorm and log-softmax over rows: each a reduction read by one join."""
    rng = np.random.default_rng(0)
    g = es.Graph()
    shape = (48, 40)
    y, dy, h = (g.input(n, shape, dtype=dtype) for n in ("y", "dy", "h"))
    w = g.input("w", (40,), dtype=dtype)
    t = es.einsum("ij,ij->i", y, dy, join="x0 * x1", agg="add")
    g.output("softmax_grad", es.einsum("ij,ij,i->ij", y, dy, t, join="x0 * (x1 - x2)"))
    g.output("rmsnorm", es.nn.rmsnorm(h, w))
    g.output("log_softmax", es.nn.log_softmax(h))
    feeds = {n: rng.standard_normal(shape).astype(to_numpy(dtype)) for n in ("y", "dy", "h")}
    feeds["y"][3] = np.nan  # a NaN row and an inf row
    feeds["h"][5, 7] = np.inf
    feeds["w"] = rng.standard_normal(40).astype(to_numpy(dtype))
    return g, feeds


def _against_reference(g, feeds, workers, rtol):
    prog = es.compile(g, workers=workers)
    got, want = prog.run(feeds), es.compile(g, engine="reference").run(feeds)
    for name in want:
        assert got[name].dtype == want[name].dtype
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(got[name].astype(np.float64), want[name].astype(np.float64),
                                       rtol=rtol, atol=rtol, err_msg=name)
    return prog


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16", "f16"])
def test_local_engine_fuses_row_pairs_and_matches_the_reference(workers, dtype):
    """Each pattern fuses into one task and the engine computes what the reference does (f16's
    fused tasks run their two numpy kernels one after the other)."""
    g, feeds = _graph(dtype)
    rtol = {"f32": 2e-5, "f64": 1e-12, "bf16": 2 ** -6, "f16": 2 ** -9}[dtype]
    prog = _against_reference(g, feeds, workers, rtol)
    rows = _rows(prog.taskgraph)
    fused = {scalar.to_string(t.then.join) for t in rows}
    assert any("x0 * (x1 - x2)" in j for j in fused)  # the softmax gradient
    assert any("rsqrt" in j for j in fused) and any("log" in j for j in fused)  # rmsnorm, log-softmax
    assert len(prog.taskgraph) <= len(prog.unfused()) - len(rows)  # the reductions' tasks are gone
    steps = [prog.executor.steps[t] for t, task in enumerate(prog.taskgraph.tasks) if task in rows]
    assert all(isinstance(step, rowfuse.Fused) == (dtype != "f16") for step in steps)


def test_a_block_read_twice_is_handed_over_once():
    """R reads y twice and J reads it again: the fused step takes it once."""
    g = es.Graph()
    y, w = g.input("y", (16, 40)), g.input("w", (40,))
    t = es.einsum("ij,ij->i", y, y, join="x0 * x1", agg="add")
    g.output("o", es.einsum("ij,i,ij,j->ij", y, t, y, w, join="x0 / x1 - x2 * x3"))
    rng = np.random.default_rng(4)
    feeds = {"y": rng.standard_normal((16, 40), dtype=np.float32),
             "w": rng.standard_normal(40, dtype=np.float32)}
    prog = _against_reference(g, feeds, 1, 2e-5)
    (fused,) = _rows(prog.taskgraph)
    assert len(fused.inputs) == 2  # y and w


def test_a_reduction_read_twice_or_kept_as_an_output_runs_apart():
    g = es.Graph()
    y, dy = g.input("y", (16, 24)), g.input("dy", (16, 24))
    t = es.einsum("ij,ij->i", y, dy, join="x0 * x1", agg="add")
    g.output("t", t)  # wanted: its block must be made
    g.output("o", es.einsum("ij,ij,i->ij", y, dy, t, join="x0 * (x1 - x2)"))
    s = es.einsum("ij->i", dy, join="x0 * x0", agg="add")
    g.output("a", es.einsum("ij,i->ij", y, s, join="x0 * x1"))  # s read by two joins
    g.output("b", es.einsum("ij,i->ij", dy, s, join="x0 - x1"))
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((16, 24), dtype=np.float32) for n in ("y", "dy")}
    assert _rows(_against_reference(g, feeds, 1, 2e-5).taskgraph) == []


@pytest.mark.parametrize("off", [(cbuild.ENV, "numpy"), ("CC", "/nonexistent/cc")])
def test_without_compiled_kernels_the_fused_tasks_run_their_two_kernels(monkeypatch, off):
    """Forced off, or no compiler: the graph is the same (it does not depend on a compiler), and
    each fused task runs R's then J's own kernel."""
    fused = _rows(es.compile(_graph()[0], workers=1).taskgraph)
    monkeypatch.setenv(*off)
    g, feeds = _graph()
    prog = _against_reference(g, feeds, 1, 2e-5)
    assert _rows(prog.taskgraph) == fused
    assert not any(isinstance(step, rowfuse.Fused) for step in prog.executor.steps)


def test_a_failed_build_runs_the_two_kernels_apart(monkeypatch):
    """Where the compiler fails at run time, the fused step runs R's then J's own kernel."""
    red, join, k, rnames, jnames = _pair("softmax backward", "f32", (6, 40, 2))
    step, _ = _step(red, join, k, rnames, jnames)
    monkeypatch.setattr(cbuild, "function", lambda src: None)
    rng = np.random.default_rng(2)
    y, dy = (rng.standard_normal((6, 40), dtype=np.float32) for _ in range(2))
    got = step([y, dy], {}, None)
    assert step.failed and step.fn is None
    np.testing.assert_allclose(got, y * (dy - (y * dy).sum(1, keepdims=True)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("workers", [1, 2])
def test_fused_rows_give_the_unfused_engines_bits(workers):
    """A residual rmsnorm block and its gradient (rmsnorm backward's dx fuses, as in Llama's step):
    with row pairs fused the local engine gives the bits it gives with them apart."""
    g = es.Graph()
    x, w, v = g.input("x", (64, 96)), g.input("w", (96,)), g.input("v", (96, 96))
    h = x + es.nn.rmsnorm(x, w) @ v
    loss = (es.nn.rmsnorm(h, w) * h).sum()
    for name, grad in zip(("dx", "dw"), es.grad(loss, [x, w]), strict=True):
        g.output(name, grad)
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((64, 96), dtype=np.float32),
             "w": rng.standard_normal(96, dtype=np.float32),
             "v": rng.standard_normal((96, 96), dtype=np.float32) / 10}
    fused = _against_reference(g, feeds, workers, 1e-4)
    apart = fused.unfused()
    assert _rows(fused.taskgraph) and not _rows(apart)
    got, want = fused.run(feeds), local.run(apart, feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def _exprs(n_inputs: int):
    """Joins from the language's grammar: every kind of step, constants special and plain."""
    leaf = st.one_of(st.sampled_from([Input(i) for i in range(n_inputs)]),
                     st.sampled_from([Const(v) for v in (np.nan, np.inf, -0.0, 1.0, 2.5)]), st.just(Var("v")))

    def extend(kids):
        return st.one_of(
            st.builds(lambda op, a: call(op, a), st.sampled_from(["neg", "abs", "exp", "sqrt", "relu"]),
                      kids),
            st.builds(lambda op, a, b: call(op, a, b), st.sampled_from(["add", "sub", "mul", "div", "max"]),
                      kids, kids),
            st.builds(lambda a, b, t, f: call("where", call("lt", a, b), t, f), kids, kids, kids, kids))

    return st.recursive(leaf, extend, max_leaves=5)


@st.composite
def _random_pairs(draw):
    """R over rows (a product, a sum of anything, factored or not, every aggregation) and J
    reading its block at position 1, with random sizes and dtype."""
    rspec = draw(st.sampled_from(["ij,ij->i", "ij,i->i", "ij,j->i", "ij,ji->i"]))
    jspec = draw(st.sampled_from(["ij,i,ij->ij", "ij,i,j->ij", "ij,i,i->ij"]))
    rows, cols = draw(st.sampled_from([1, 3, 7])), draw(st.sampled_from([1, 5, 32, 45]))
    dtype = draw(st.sampled_from(["f32", "f64", "bf16"]))
    size = {"i": rows, "j": cols}
    ops = []
    for spec, agg in ((rspec, draw(st.sampled_from(["add", "add", "mul", "max", "min"]))), (jspec, None)):
        terms = spec.split("->")[0].split(",")
        join = draw(_exprs(len(terms)))
        for k in range(len(terms)):  # every operand read
            join = call("mul", join, Input(k)) if k not in inputs_used(join) else join
        ops.append(Einsummable.from_spec(spec, [tuple(size[c] for c in t) for t in terms], join=join, agg=agg,
                                         dtypes=[dtype] * len(terms)))
    return ops[0], ops[1], draw(st.integers(0, 2**32 - 1))


@settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(_random_pairs(), min_size=25, max_size=25))
def test_random_fused_pairs_give_the_bits_of_their_two_kernels(pairs):
    """Random joins on both sides, NaN / ±inf / -0.0 in the values and constants, strided
    operands: wherever a pair fuses, its step gives the bits of the two kernels apart."""
    built = []
    for red, join, seed in pairs:
        if rowfuse.source(red, join, 1) is not None:
            rnames, jnames = ("r0", "r1"), ("j0", "r", "j2")
            built.append((red, join, seed, rnames, jnames, _step(red, join, 1, rnames, jnames),
                          kernels.prepare(red), kernels.prepare(join)))
    assert len(built) >= 10  # most pairs fuse: this test tests something
    native.flush()
    for red, join, seed, rnames, jnames, (step, names), c_red, c_join in built:
        arrays = _arrays(red, join, 1, rnames, jnames, red.dtype, seed, special=True)
        with np.errstate(all="ignore"):
            got = step([arrays[n] for n in names], {}, {"v": -1.5})
            block = c_red([arrays[n] for n in rnames], {"v": -1.5})
            want = c_join([block if m == 1 else arrays[n] for m, n in enumerate(jnames)], {"v": -1.5})
        same = _same(got, want)
        what = f"{red.spec} {scalar.to_string(red.join)} / {join.spec} {scalar.to_string(join.join)}"
        assert same.all(), f"{what}: {got[~same][:4]} vs {want[~same][:4]}"
