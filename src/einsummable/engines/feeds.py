"""Checking what a run is given, before any engine sees it."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from einsummable.engines.interop import as_array
from einsummable.errors import FeedError
from einsummable.ir.dtypes import INTS, to_numpy
from einsummable.ir.graph import EinGraph, InputNode


def check_feeds(
    graph: EinGraph, feeds: Mapping[str, object], resident: frozenset[str] = frozenset(),
    variables: set[str] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Split feeds into graph inputs and run-time variables, or say what is wrong.

    ``resident`` names inputs that an engine already holds and need not be fed;
    ``variables`` (the graph's run-time variables) may be passed in once computed.
    """
    if not isinstance(feeds, Mapping):
        raise FeedError(f"feeds must be a dict of name -> array, got {type(feeds).__name__}")
    inputs = {n.name: n for n in graph.nodes if isinstance(n, InputNode)}
    if variables is None:
        variables = graph.variables()
    extra = sorted(set(feeds) - set(inputs) - variables)
    if extra:
        raise FeedError(
            f"unknown feed(s) {extra}; the graph's inputs are {sorted(inputs)}"
            + (f" and its run-time variables {sorted(variables)}" if variables else "")
        )
    missing = sorted(set(inputs) - set(feeds) - resident)
    if missing:
        raise FeedError(f"missing input(s) {missing}; expected {_describe(inputs, missing)}")
    missing_vars = sorted(variables - set(feeds))
    if missing_vars:
        raise FeedError(f"missing run-time variable(s) {missing_vars}; give each a number in the feeds")
    arrays: dict[str, np.ndarray] = {}
    for name, node in inputs.items():
        if name not in feeds:
            continue
        arrays[name] = _check_array(name, node, feeds[name])
    _check_class_ids(graph, arrays)
    return arrays, _numbers(feeds, variables)


def _numbers(feeds: Mapping[str, object], variables: set[str]) -> dict[str, float]:
    values: dict[str, float] = {}
    for name in variables:
        value = feeds[name]
        if not isinstance(value, int | float | np.number) or isinstance(value, bool | np.bool_):
            raise FeedError(f"run-time variable {name!r} must be a number, got {type(value).__name__}")
        try:
            values[name] = float(value)
        except OverflowError:
            raise FeedError(
                f"run-time variable {name!r} is {_digits(value)}, too large for a float "
                "(the largest is about 1.8e308)"
            ) from None
    return values


class FeedCheck:
    """``check_feeds`` for one graph and one set of resident inputs, its signature derived once
    (each fed input's name, shape and dtype): feeds that match it, numpy arrays under the same
    names (every run of a loop), pass with one comparison of the names and one per array; any
    others go through ``check_feeds``, which converts them or says what is wrong. Class ids
    and run-time variables are values: checked every run."""

    def __init__(self, graph: EinGraph, resident: frozenset[str] = frozenset(),
                 variables: set[str] | None = None) -> None:
        self.graph, self.resident = graph, resident
        self.variables = graph.variables() if variables is None else variables
        fed = [n for n in graph.nodes if isinstance(n, InputNode) and n.name not in resident]
        self._names = {n.name for n in fed} | self.variables
        self._signature = [(n.name, n.shape, to_numpy(n.dtype)) for n in fed]
        self._ids = [ids for ids in graph.class_ids if ids.input in self._names]

    def __call__(self, feeds: Mapping[str, object]) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        if type(feeds) is not dict or feeds.keys() != self._names:
            return check_feeds(self.graph, feeds, self.resident, self.variables)
        arrays: dict[str, np.ndarray] = {}
        for name, shape, dtype in self._signature:
            value = feeds[name]
            if type(value) is not np.ndarray or value.shape != shape or value.dtype != dtype:
                return check_feeds(self.graph, feeds, self.resident, self.variables)
            arrays[name] = value
        for ids in self._ids:
            check_class_ids(f"input {ids.input!r}", arrays[ids.input], ids.classes, ids.use, ids.box)
        return arrays, _numbers(feeds, self.variables)


def _digits(value: object) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


def check_inputs(graph: EinGraph, arrays: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Check a subset of the inputs alone, such as the state a session keeps resident."""
    if not isinstance(arrays, Mapping):
        raise FeedError(f"expected a dict of input name -> array, got {type(arrays).__name__}")
    inputs = {n.name: n for n in graph.nodes if isinstance(n, InputNode)}
    unknown = sorted(set(arrays) - set(inputs))
    if unknown:
        raise FeedError(f"{unknown} are not inputs of the graph; its inputs are {sorted(inputs)}")
    checked = {name: _check_array(name, inputs[name], value) for name, value in arrays.items()}
    _check_class_ids(graph, checked)
    return checked


SMALL = 256  # elements: a region this small is checked in Python, where a ufunc call costs more


def check_class_ids(what: str, values: np.ndarray, classes: int, use: str,
                    box: tuple[tuple[int, int], ...] | None = None) -> None:
    """Refuse any value of ``values`` (within ``box``) that is not an integer in [0, classes),
    naming the first by value and position."""
    box = box or tuple((0, n) for n in values.shape)
    region = np.asarray(values)[tuple(slice(lo, hi) for lo, hi in box)]
    if region.dtype.kind in "iu" and region.size:  # integers: in range when their extremes are
        if region.size <= SMALL:  # a decode step's ids: Python's min and max cost less than a ufunc call
            flat = region.ravel().tolist()
            lo, hi = min(flat), max(flat)
        else:
            lo, hi = region.min(), region.max()
        if lo >= 0 and hi < classes:
            return
    if region.dtype.kind not in "iub":
        region = region.astype(np.float64)
    bad = ~((region >= 0) & (region < classes) & (region == np.floor(region)))
    if bad.any():
        first = np.argwhere(bad)[0]
        position = tuple(int(i) + lo for i, (lo, _) in zip(first, box, strict=True))
        value = region[tuple(first)].item()
        more = f" ({int(bad.sum())} such values)" if bad.sum() > 1 else ""
        raise FeedError(f"{what} holds {value!r} at position {position}, read as {use}: class ids must be "
                        f"integers in [0, {classes}){more}")


def _check_class_ids(graph: EinGraph, arrays: Mapping[str, np.ndarray]) -> None:
    for ids in graph.class_ids:
        if ids.input in arrays:
            check_class_ids(f"input {ids.input!r}", arrays[ids.input], ids.classes, ids.use, ids.box)


def _check_array(name: str, node: InputNode, value: object) -> np.ndarray:
    want = to_numpy(node.dtype)
    value = as_array(name, value)
    if isinstance(value, int | float) and not isinstance(value, bool) and node.shape == ():
        if isinstance(value, float) and node.dtype in INTS:
            raise FeedError(f"input {name!r} is the float {value!r}; it is {node.dtype}: feed an int")
        try:
            return np.asarray(value, dtype=want)
        except OverflowError:
            raise FeedError(f"input {name!r} is {_digits(value)}, too large for {node.dtype}") from None
    if not isinstance(value, np.ndarray):
        raise FeedError(
            f"input {name!r} must be an array of {node.dtype}{list(node.shape)} (numpy, or anything "
            f"with __dlpack__ or __array__, such as a torch tensor), got {type(value).__name__}"
        )
    if value.shape != node.shape:
        raise FeedError(f"input {name!r} has shape {value.shape}, expected {node.shape}")
    if value.dtype != want:
        raise FeedError(
            f"input {name!r} has dtype {value.dtype}, expected {node.dtype} ({want}); "
            f"convert it with .astype({want.name!r})"
        )
    return value


def _describe(inputs: dict[str, InputNode], names: list[str]) -> str:
    return ", ".join(f"{n}: {inputs[n].dtype}{list(inputs[n].shape)}" for n in names)
