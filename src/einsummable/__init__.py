"""Einsummable: say what to compute in an extended einsum language; the system plans,
decomposes and runs it."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from einsummable import train
from einsummable.autodiff import grad
from einsummable.compile import Program, compile, simulate
from einsummable.errors import (
    AutodiffError,
    CheckpointError,
    ConfigError,
    DtypeError,
    EinsummableError,
    EngineError,
    ExprError,
    FeedError,
    GraphError,
    OptimizerError,
    PlanError,
    ShapeError,
    SimulationError,
    SpecError,
)
from einsummable.frontend import nn
from einsummable.frontend.builders import broadcast_to, concat, pad, view_as_complex, view_as_real, where
from einsummable.frontend.einsum import einsum
from einsummable.frontend.gather import one_hot, take
from einsummable.frontend.tensor import Graph, Tensor, cast, elementwise, matmul, reduce, reshape, transpose
from einsummable.frontend.tensor_extras import stack
from einsummable.hardware.cluster import Cluster

try:
    __version__ = _version("einsummable")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"


__all__ = [
    "AutodiffError",
    "CheckpointError",
    "Cluster",
    "ConfigError",
    "DtypeError",
    "EinsummableError",
    "EngineError",
    "ExprError",
    "FeedError",
    "Graph",
    "GraphError",
    "OptimizerError",
    "PlanError",
    "Program",
    "ShapeError",
    "SimulationError",
    "SpecError",
    "Tensor",
    "broadcast_to",
    "cast",
    "compile",
    "concat",
    "einsum",
    "elementwise",
    "grad",
    "matmul",
    "nn",
    "one_hot",
    "pad",
    "reduce",
    "reshape",
    "simulate",
    "stack",
    "take",
    "train",
    "transpose",
    "view_as_complex",
    "view_as_real",
    "where",
]
