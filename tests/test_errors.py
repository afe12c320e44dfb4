"""Bad or extreme input surfaces as the package's own exception, naming the culprit
(issue 15, item 11): deep joins, huge numbers, empty max, non-int shapes, bool
arithmetic, variable names that spell something else, and DOT escaping."""

import re

import numpy as np
import pytest

import einsummable as es
from einsummable.engines.kernels import interpret
from einsummable.errors import DtypeError, ExprError, FeedError, GraphError, ShapeError
from einsummable.ir import scalar, syntax
from einsummable.ir.expr import Input, call, depth


def _run_join(join: str, x: np.ndarray, engine: str = "local") -> dict:
    g = es.Graph()
    t = g.input("x", x.shape, "f64")
    y = es.einsum("i->i", t, join=join)
    (dx,) = es.grad(y.sum(), [t])
    g.output("y", y)
    g.output("dx", dx)
    return es.compile(g, workers=2, engine=engine).run({"x": x})


# ------------------------------------------------------------ deep joins


@pytest.mark.parametrize("engine", ["local", "reference"])
def test_a_generated_1000_term_sum_runs_and_differentiates(engine):
    terms = [(-1 if k % 5 == 2 else 1, k % 7 + 1, k % 3 == 0) for k in range(1000)]  # (sign, coeff, sin?)
    join = "".join(f" {'-' if s < 0 else '+'} {'sin(x0)' if sin else 'x0'} * {c}" for s, c, sin in terms)
    join = join[3:]  # the first term is positive: drop its " + "
    x = np.array([0.3, -1.2, 2.0])
    out = _run_join(join, x, engine)
    # independent oracle: numpy, term by term, with the derivative by hand
    want_y = sum(s * c * (np.sin(x) if sin else x) for s, c, sin in terms)
    want_dx = sum(s * c * (np.cos(x) if sin else np.ones_like(x)) for s, c, sin in terms)
    np.testing.assert_allclose(out["y"], want_y, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(out["dx"], want_dx, rtol=1e-12, atol=1e-9)


def test_long_chains_are_balanced_and_round_trip():
    for join in (" + ".join(f"x{k % 3}" for k in range(1000)),
                 " - ".join(f"x{k % 3}" for k in range(1000)),
                 " * ".join(f"x{k % 3}" for k in range(300))):
        e = syntax.parse(join)
        assert depth(e) <= 12  # log2(1000) + 2
        assert syntax.parse(syntax.to_string(e)) == e
        xs = [np.array([0.9, 1.1]), np.array([1.05, 0.95]), np.array([1.0, 0.99])]
        # oracle: Python's own left-to-right evaluation of the same text
        want = eval(join, {}, {"x0": xs[0], "x1": xs[1], "x2": xs[2]})
        got = interpret.compile_expr(e, ["f64"] * 3)(*xs)
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_run_of_1000_unary_minuses_keeps_its_parity():
    x = np.array([0.5, -2.0])
    np.testing.assert_array_equal(_run_join("-" * 1000 + "x0 * 3", x)["y"], 3 * x)
    np.testing.assert_array_equal(_run_join("-" * 1001 + "x0 * 3", x)["y"], -3 * x)
    assert syntax.parse("--x0") == scalar.parse("-(-x0)")  # short runs are kept as written


@pytest.mark.parametrize("join", [
    "exp(" * 150 + "x0" + ")" * 150,
    " / ".join(["x0"] * 1000),
    "x0 * (1 + " * 120 + "x0" + ")" * 120,
], ids=["nested-calls", "division-chain", "horner"])
def test_deep_nesting_is_an_expr_error_naming_the_limit(join):
    g = es.Graph()
    x = g.input("x", (3,))
    with pytest.raises(ExprError, match=rf"nest.*the limit is {syntax.MAX_DEPTH}"):
        es.einsum("i->i", x, join=join)


def test_a_join_too_deep_for_pythons_parser_is_an_expr_error():
    with pytest.raises(ExprError, match="too deeply"):
        syntax.parse(" / ".join(["x0"] * 100_000))


def test_the_deepest_allowed_join_runs_inside_the_stack():
    join = "sin(" * (syntax.MAX_DEPTH - 1) + "x0" + ")" * (syntax.MAX_DEPTH - 1)
    e = syntax.parse(join)
    assert syntax.parse(syntax.to_string(e)) == e
    assert scalar.simplify(e) == e
    g = es.Graph()
    t = g.input("x", (2,), "f64")
    g.output("y", es.einsum("i->i", t, join=join))
    x = np.array([0.7, -0.2])
    want = x
    for _ in range(syntax.MAX_DEPTH - 1):
        want = np.sin(want)
    for engine in ("local", "reference"):
        out = es.compile(g, workers=2, engine=engine).run({"x": x})
        np.testing.assert_allclose(out["y"], want, rtol=1e-12)


def test_differentiating_past_twice_the_limit_is_an_expr_error():
    e = Input(0)
    for _ in range(2 * syntax.MAX_DEPTH):
        e = call("sin", e)
    limit = 2 * syntax.MAX_DEPTH
    with pytest.raises(ExprError, match=rf"nested {limit + 1} levels.*the limit is {limit}"):
        scalar.derivative(e, 0)


@pytest.mark.slow  # about 25 s: simplify is quadratic in a nested chain's length
def test_the_deepest_allowed_join_differentiates_inside_the_stack():
    join = "sin(" * (syntax.MAX_DEPTH - 1) + "x0" + ")" * (syntax.MAX_DEPTH - 1)
    assert depth(syntax.parse(join)) == syntax.MAX_DEPTH
    x = np.array([0.7])
    y, dy = x, np.ones_like(x)
    for _ in range(syntax.MAX_DEPTH - 1):  # oracle: the chain rule by hand
        y, dy = np.sin(y), np.cos(y) * dy
    out = _run_join(join, x, "reference")
    np.testing.assert_allclose(out["y"], y, rtol=1e-12)
    np.testing.assert_allclose(out["dx"], dy, rtol=1e-10)


# ------------------------------------------------------------ numbers too large


def test_a_400_digit_literal_is_an_expr_error_naming_it():
    g = es.Graph()
    x = g.input("x", (3,))
    with pytest.raises(ExprError, match=r"literal 100000000000\.\.\. \(401 digits\).*too large"):
        es.einsum("i->i", x, join="x0 * 1" + "0" * 400)
    with pytest.raises(ExprError, match=r"constant 100000000000\.\.\. \(401 digits\).*too large"):
        x * 10**400


def test_a_huge_run_time_variable_is_a_feed_error_naming_it():
    g = es.Graph()
    x = g.input("x", (3,))
    g.output("y", x * "lr")
    prog = es.compile(g, workers=1)
    with pytest.raises(FeedError, match=r"'lr' is 100000000000\.\.\. \(401 digits\), too large"):
        prog.run({"x": np.ones(3, np.float32), "lr": 10**400})


# ------------------------------------------------------------ empty max


@pytest.mark.parametrize("agg", ["max", "min"])
def test_max_over_an_empty_axis_is_a_graph_error_at_build_time(agg):
    g = es.Graph()
    x = g.input("x", (3, 0))
    with pytest.raises(GraphError, match=rf"{agg} over index b, which has size 0"):
        getattr(x, agg)(axis=1)
    with pytest.raises(GraphError, match="size 0"):
        es.einsum("ij->i", x, agg=agg)


@pytest.mark.parametrize("engine", ["local", "sequential", "reference"])
def test_sum_over_an_empty_axis_is_zero_on_every_engine(engine):
    g = es.Graph()
    x = g.input("x", (3, 0))
    g.output("s", x.sum(axis=1))
    out = es.compile(g, workers=2, engine=engine).run({"x": np.ones((3, 0), np.float32)})
    np.testing.assert_array_equal(out["s"], np.ones((3, 0), np.float32).sum(axis=1))


# ------------------------------------------------------------ shapes


@pytest.mark.parametrize("shape, culprit", [((2.5, 3), "2.5"), (("4",), "'4'"), ((True, 3), "True"),
                                            ((2.0, 3), "2.0"), ((np.float64(2), 3), "2.0")])
def test_shapes_must_be_ints(shape, culprit):
    g = es.Graph()
    with pytest.raises(ShapeError, match=re.escape(culprit)):
        g.input("x", shape)
    with pytest.raises(ShapeError, match=re.escape(culprit)):
        g.zeros(shape)
    t = g.input("y", (6,))
    with pytest.raises(ShapeError, match=re.escape(culprit)):
        t.reshape(shape if len(shape) == 1 else (shape[0], 3))


def test_numpy_integer_shapes_are_accepted():
    g = es.Graph()
    assert g.input("x", (np.int64(4), np.int32(3))).shape == (4, 3)
    assert g.input("y", np.array([2, 3])).shape == (2, 3)
    assert g.inputs["x"].reshape(np.int64(-1), 2).shape == (6, 2)


# ------------------------------------------------------------ bool arithmetic


def test_bool_times_a_number_is_a_dtype_error_that_says_how_to_cast():
    g = es.Graph()
    x = g.input("x", (3,))
    with pytest.raises(DtypeError, match=r"mul of a boolean.*cast\(x0 > 0, f32\)"):
        (x > 0) * 2.0
    with pytest.raises(DtypeError, match="boolean"):
        (x > 0) + "lr"
    # the ways the message suggests both work, against numpy
    a = (x > 0).astype("f32") * 2.0
    b = es.where(x > 0, 2.0, 0.0)
    g.output("a", a)
    g.output("b", b)
    X = np.array([-1.0, 0.0, 3.0], np.float32)
    out = es.compile(g, workers=1).run({"x": X})
    np.testing.assert_array_equal(out["a"], (X > 0) * np.float32(2))
    np.testing.assert_array_equal(out["b"], np.where(X > 0, 2.0, 0.0))


# ------------------------------------------------------------ variable names


@pytest.mark.parametrize("name, what", [("x0", "input placeholder"), ("x12", "input placeholder"),
                                        ("exp", "function"), ("where", "function"), ("cast", "function"),
                                        ("pi", "constant"), ("inf", "constant"), ("f32", "dtype"),
                                        ("lr rate", "identifier"), ("lambda", "identifier"),
                                        ("", "identifier")])
def test_a_string_operand_may_not_spell_anything_else(name, what):
    g = es.Graph()
    w = g.input("w", (3,))
    with pytest.raises(ExprError, match=rf"{re.escape(repr(name))}.*{what}"):
        w * name


def test_a_string_operand_names_a_run_time_variable():
    g = es.Graph()
    w = g.input("w", (3,))
    g.output("y", w * "lr0")
    assert g.ir.variables() == {"lr0"}
    out = es.compile(g, workers=1).run({"w": np.ones(3, np.float32), "lr0": 0.5})
    np.testing.assert_array_equal(out["y"], np.full(3, 0.5, np.float32))


# ------------------------------------------------------------ DOT


def _dot_tokens(text: str) -> list[str]:
    """A small DOT lexer (identifiers, numbers, quoted strings with escapes, punctuation)
    that fails on anything a DOT parser would reject at the lexical level."""
    pattern = re.compile(r'\s+|"(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z_0-9]*|-?\d+(?:\.\d+)?|->|[{}\[\];=,]')
    tokens, pos = [], 0
    while pos < len(text):
        m = pattern.match(text, pos)
        assert m, f"DOT does not lex at {text[pos:pos + 30]!r}"
        if not m.group().isspace():
            tokens.append(m.group())
        pos = m.end()
    return tokens


def _unescape(quoted: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), quoted[1:-1])


def test_output_names_are_escaped_in_dot():
    name = 'say "hi"\\ <b>\n{x}; n0 -> n1'
    g = es.Graph()
    x = g.input('in"put\\', (3,))
    g.output(name, x * 2.0)
    g.output("plain", x)
    tokens = _dot_tokens(g.to_dot())
    assert tokens[:3] == ["digraph", "eingraph", "{"] and tokens[-1] == "}"
    assert tokens.count("{") == tokens.count("}") == 1
    assert tokens.count("[") == tokens.count("]")
    labels = [_unescape(tokens[k + 2]) for k, t in enumerate(tokens) if t == "label"]
    assert name in labels
    assert "plain" in labels
    assert any(label.startswith('%0 in"put\\\n') for label in labels)
    # every statement is `id [ ... ];` or `id -> id;`, so a name never leaks out of its quotes
    edges = [tokens[k - 1:k + 2] for k, t in enumerate(tokens) if t == "->"]
    assert all(re.fullmatch(r"n\d+|out\d+", a) and re.fullmatch(r"n\d+|out\d+", b) for a, _, b in edges)


def test_output_names_are_escaped_in_the_taskgraph_dot():
    from einsummable.lower import stats

    name = 'say "hi"\\ <b>\n{x}; t0 -> t1'
    g = es.Graph()
    x = g.input('in"put\\', (4, 3))
    g.output(name, x * 2.0)
    tokens = _dot_tokens(stats.to_dot(es.compile(g, workers=2).taskgraph))
    assert tokens[:3] == ["digraph", "taskgraph", "{"] and tokens[-1] == "}"
    assert tokens.count("{") == tokens.count("}") and tokens.count("[") == tokens.count("]")
    labels = [_unescape(tokens[k + 2]) for k, t in enumerate(tokens) if t == "label"]
    assert name in labels
    edges = [tokens[k - 1:k + 2] for k, t in enumerate(tokens) if t == "->"]
    assert all(re.fullmatch(r"t\d+|out\d+", a) and re.fullmatch(r"t\d+|out\d+", b) for a, _, b in edges)
