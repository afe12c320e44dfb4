"""The package's own exceptions: every user mistake surfaces as one of these."""


class EinsummableError(Exception):
    """Base class for every error this package raises on bad input."""


class ExprError(EinsummableError):
    """A scalar (join) expression is malformed, unknown or ill-typed."""


class SpecError(EinsummableError):
    """An einsum spec is malformed or disagrees with its operands."""


class ShapeError(EinsummableError):
    """Shapes disagree: an index with two sizes, a bad slice, a bad reshape."""


class DtypeError(EinsummableError):
    """Dtypes disagree, or a dtype is not supported."""


class GraphError(EinsummableError):
    """An EinGraph is malformed: bad node ids, wrong order, dangling outputs."""


class FeedError(EinsummableError):
    """A run was given a missing, extra, misshaped or wrongly typed input."""


class AutodiffError(EinsummableError):
    """A gradient was asked of something that cannot be differentiated as given."""


class OptimizerError(EinsummableError):
    """An optimizer was given something it cannot update: a non-input parameter, a bad hyperparameter."""


class PlanError(EinsummableError):
    """A plan or TaskGraph cannot be made as asked: a bad worker count, cluster or partition."""


class PlanMemoryError(PlanError):
    """No plan found fits ``memory_per_machine``; ``memory`` is the smallest peak found
    (a plan.predict.memory.Memory, with its breakdown), so a caller can try rematerialisation."""

    def __init__(self, message: str, memory: object = None) -> None:
        super().__init__(message)
        self.memory = memory


class EngineError(EinsummableError):
    """A task failed while a program ran, or a worker was lost; names the task and its graph node."""


class SimulationError(EinsummableError):
    """A TaskGraph cannot be simulated on the given cluster."""


class CheckpointError(EinsummableError):
    """A checkpoint file is corrupt, truncated or does not match the model."""


class ConfigError(EinsummableError):
    """A configuration is malformed (a model's, a cluster file), or asks for maths this Llama
    does not implement."""


class Unsupported(EinsummableError):
    """A join has no generated C form (complex values, say): its kernel stays on numpy.
    Internal: the compiled-kernel path catches it and falls back."""
