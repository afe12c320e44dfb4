"""The pipeline, one stage per line: graph -> plan -> TaskGraph -> engine."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from einsummable.engines import reference
from einsummable.engines.feeds import check_feeds
from einsummable.errors import EinsummableError
from einsummable.frontend.core import Graph
from einsummable.ir.graph import EinGraph

Runner = Callable[[dict[str, np.ndarray], dict[str, float]], dict[str, np.ndarray]]


class Program:
    """A compiled graph: ``run(feeds)`` returns ``{output name: ndarray}``."""

    def __init__(self, graph: EinGraph, engine: str, runner: Runner, plan: object) -> None:
        self.graph = graph
        self.engine = engine
        self.plan = plan
        self._runner = runner

    def run(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        arrays, variables = check_feeds(self.graph, feeds)
        return self._runner(arrays, variables)

    def __repr__(self) -> str:
        return f"Program(engine={self.engine!r}, nodes={len(self.graph)}, outputs={list(self.graph.outputs)})"


def _reference(graph: EinGraph, workers: int | None) -> tuple[Runner, object]:
    plan = "reference engine: every node runs whole, in order, with numpy"
    return (lambda arrays, variables: reference.run(graph, arrays, variables)), plan


ENGINES: dict[str, Callable[[EinGraph, int | None], tuple[Runner, object]]] = {
    "reference": _reference,
}
DEFAULT_ENGINE = "reference"


def compile(graph: Graph | EinGraph, workers: int | None = None, *, engine: str | None = None) -> Program:
    ir = graph.ir if isinstance(graph, Graph) else graph
    if not isinstance(ir, EinGraph):
        raise EinsummableError(f"compile takes a Graph, got {type(graph).__name__}")
    if not ir.outputs:
        raise EinsummableError("the graph has no outputs; name some with g.output(name, tensor)")
    ir.validate()
    engine = engine or DEFAULT_ENGINE
    if engine not in ENGINES:
        raise EinsummableError(f"unknown engine {engine!r}; expected one of {sorted(ENGINES)}")
    runner, plan = ENGINES[engine](ir, workers)
    return Program(ir, engine, runner, plan)
