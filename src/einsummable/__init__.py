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
from einsummable.frontend.core import (
    Graph,
    Tensor,
    broadcast_to,
    cast,
    concat,
    elementwise,
    pad,
    reduce,
    reshape,
    transpose,
    view_as_complex,
    view_as_real,
    where,
)
from einsummable.frontend.einsum import einsum, matmul
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
    "pad",
    "reduce",
    "reshape",
    "simulate",
    "stack",
    "train",
    "transpose",
    "view_as_complex",
    "view_as_real",
    "where",
]
