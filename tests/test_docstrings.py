"""Every public callable of ``einsummable`` says what it does: ``help(es.X)`` is never empty."""

import inspect

import einsummable as es
from einsummable.compile import Session
from einsummable.models.llama import Model, model


def _doc(obj) -> str:
    obj = obj.fget if isinstance(obj, property) else obj.__func__ if isinstance(obj, classmethod) else obj
    return (inspect.getdoc(obj) or "").strip()


def _public_members(cls) -> dict[str, object]:
    return {f"{cls.__name__}.{name}": value for name, value in vars(cls).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property | classmethod))}


def test_every_public_callable_and_method_has_a_docstring():
    named = {name: getattr(es, name) for name in es.__all__ if callable(getattr(es, name))}
    for cls in (es.Graph, es.Tensor, es.Program, Session, Model):
        named |= _public_members(cls)
    named["models.llama.model.forward"] = model.forward
    named["models.llama.Model.__call__"] = Model.__call__
    assert {"Graph.input", "Graph.output", "Program.run", "Program.session", "Session.run",
            "Model.generate", "Model.save", "Model.from_pretrained"} <= set(named)
    missing = sorted(name for name, obj in named.items() if not _doc(obj))
    assert not missing, f"no docstring: {missing}"
