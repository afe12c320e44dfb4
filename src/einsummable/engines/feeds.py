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
    return arrays, values


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


def check_class_ids(what: str, values: np.ndarray, classes: int, use: str,
                    box: tuple[tuple[int, int], ...] | None = None) -> None:
    """Refuse any value of ``values`` (within ``box``) that is not an integer in [0, classes),
    naming the first by value and position."""
    box = box or tuple((0, n) for n in values.shape)
    region = np.asarray(values)[tuple(slice(lo, hi) for lo, hi in box)]
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
