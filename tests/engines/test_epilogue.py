"""GEMM epilogues (lower/fusion.py's rule, engines/kernels/epilogue.py's step): the join runs in its GEMM's
task and computes what the reference engine computes, in place for a sum, with its own kernel for
other joins."""

import numpy as np
import pytest

import einsummable as es
from einsummable.engines import local
from einsummable.engines.kernels import epilogue
from einsummable.ir import kinds
from einsummable.ir.box import whole
from einsummable.ir.einsummable import Einsummable
from einsummable.ir.expr import Input, call
from einsummable.lower.fusion import fuse
from einsummable.lower.taskgraph import ApplyTask, FusedTask, InputTask, MoveTask, Output, TaskGraph


def _epilogues(tg: TaskGraph) -> list[FusedTask]:
    return [t for t in tg.tasks if isinstance(t, FusedTask) and kinds.is_gemm(t.first)]


def _feeds(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes.items()}


def _check(g: es.Graph, feeds: dict[str, np.ndarray], workers: int) -> int:
    """Run on the local engine against the reference; the number of epilogues it fused."""
    prog = es.compile(g, workers=workers)
    want = es.compile(g, engine="reference").run(feeds)
    got = prog.run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    return len(_epilogues(prog.taskgraph))


@pytest.mark.parametrize("workers", [1, 2])
def test_residual_bias_and_activation_epilogues_match_the_reference(workers):
    g = es.Graph()
    x, w, r = g.input("x", (64, 48)), g.input("w", (48, 40)), g.input("r", (64, 40))
    b, v = g.input("b", (40,)), g.input("v", (40, 40))
    g.output("residual", r + x @ w)           # a sum, the GEMM second: in place
    g.output("bias", (r @ v) + b)             # a sum with a broadcast operand: in place
    g.output("scaled", es.nn.relu(x @ w) * r)  # not a sum: the join's own kernel
    feeds = _feeds({"x": (64, 48), "w": (48, 40), "r": (64, 40), "b": (40,), "v": (40, 40)})
    assert _check(g, feeds, workers) >= (3 if workers == 1 else 1)  # two workers move some operands


def test_a_gemm_read_twice_keeps_its_own_task():
    g = es.Graph()
    x, w, r = g.input("x", (32, 32)), g.input("w", (32, 32)), g.input("r", (32, 32))
    h = x @ w
    g.output("a", h + r)
    g.output("b", h * r)
    assert _check(g, _feeds({"x": (32, 32), "w": (32, 32), "r": (32, 32)}), 1) == 0


def test_in_place_only_where_the_sum_starts_from_the_gemm():
    x0, x1, x2 = Input(0), Input(1), Input(2)
    assert epilogue._sum_order(call("add", call("add", x0, x1), x2)) == [0, 1, 2]
    assert epilogue._sum_order(call("add", x2, call("add", x0, x1))) is None  # not left to right
    assert epilogue._sum_order(call("mul", x0, x1)) is None
    assert epilogue._sum_order(call("add", x0, x0)) is None


def test_a_sum_adds_into_the_block_only_where_the_gemm_is_among_its_first_two_terms():
    """``a + b + x @ w`` adds in the join's kernel: onto the GEMM's block it would add in another
    order. ``x @ w + a + b`` and ``a + x @ w + b`` add onto the block, in the join's order."""
    g = es.Graph()
    a, b = g.input("a", (16, 24)), g.input("b", (16, 24))
    x, w = g.input("x", (16, 32)), g.input("w", (32, 24))
    g.output("late", a + b + x @ w)
    g.output("first", x @ w + a + b)
    g.output("second", a + x @ w + b)
    tg = es.compile(g, workers=1).taskgraph
    outputs = {name: tg.tasks[out.blocks[0][0]] for name, out in tg.outputs.items()}
    assert all(isinstance(t, FusedTask) for t in outputs.values())
    in_place = {name: epilogue.adds_in_place(t.first, t.then, t.k) for name, t in outputs.items()}
    assert in_place == {"late": False, "first": True, "second": True}


def test_fused_epilogues_give_the_unfused_engines_bits():
    """In place or not, the fused task computes what the two tasks compute apart, bit for bit."""
    g = es.Graph()
    x, w, r, b = g.input("x", (64, 48)), g.input("w", (48, 40)), g.input("r", (64, 40)), g.input("b", (40,))
    g.output("y", es.nn.relu(r + x @ w + b) * r + (r @ w.T) @ w)
    feeds = _feeds({"x": (64, 48), "w": (48, 40), "r": (64, 40), "b": (40,)})
    fused = es.compile(g, workers=1)
    apart = fused.unfused()
    assert _epilogues(fused.taskgraph) and not _epilogues(apart)
    np.testing.assert_array_equal(fused.run(feeds)["y"], local.run(apart, feeds)["y"])


def test_a_join_that_reads_a_move_keeps_its_gemm_apart():
    """Fused, the GEMM would wait for the other worker's block: the workers' work in series."""
    box = ((0, 32), (0, 32))
    matmul = Einsummable((32, 32, 32), ((0, 2), (2, 1)), 2, call("mul", Input(0), Input(1)), "add",
                         ("f32", "f32"))
    add = Einsummable((32, 32), ((0, 1), (0, 1)), 2, call("add", Input(0), Input(1)), None, ("f32", "f32"))
    tasks = [InputTask("x", box, "f32", 0), InputTask("w", box, "f32", 0), InputTask("r", box, "f32", 1),
             MoveTask((2,), box, 1, 0, "f32"), ApplyTask(matmul, (0, 1), 0)]

    def fused(join: ApplyTask) -> list[FusedTask]:
        tg = TaskGraph((*tasks, join), {"y": Output((32, 32), "f32", ((5, whole((32, 32))),))}, 2, 2)
        out = fuse(tg).graph
        out.validate()
        return _epilogues(out)

    assert fused(ApplyTask(add, (4, 3), 0)) == []
    tasks[2:4] = [InputTask("r", box, "f32", 0), MoveTask((2,), box, 0, 0, "f32")]  # a block of its own
    assert fused(ApplyTask(add, (4, 2), 0)) == [FusedTask(matmul, add, (0, 1, -1, 2), (0, 1, 2), 0)]
