"""Signatures as docs/plugins.md writes them, for the tests that hold the docs to the code."""

from __future__ import annotations

import inspect
from typing import Any, Callable, ForwardRef, Optional

# How the docs write a default made anew for each call (an attrs factory); a function default is its name.
MADE_PER_CALL = "..."


class _Written:
    """Shown as ``text`` where ``inspect`` shows an annotation or a default by its ``repr``."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _annotation(annotation: Any) -> Any:
    if annotation is inspect.Parameter.empty:
        return annotation
    # Under ``from __future__ import annotations`` an annotation is the source's text (a NamedTuple's, a
    # ForwardRef of it); otherwise the object.
    if isinstance(annotation, ForwardRef):
        annotation = annotation.__forward_arg__
    return _Written(annotation if isinstance(annotation, str) else inspect.formatannotation(annotation))


def _default(default: Any) -> Any:
    if default is inspect.Parameter.empty:
        return default
    if type(default).__name__ == "_Nothing":  # attrs' NOTHING: a factory's default
        return _Written(MADE_PER_CALL)
    if inspect.isfunction(default):
        return _Written(default.__name__)
    return default


def signature_text(obj: Callable) -> str:
    """``obj``'s signature as the docs write it: each annotation as the source spells it (unquoted), a default
    made per call as ``...`` and a function default by its name, and a class's without its ``__init__``'s
    ``-> None``."""
    signature = inspect.signature(obj)
    parameters = [p.replace(annotation=_annotation(p.annotation), default=_default(p.default)) for p in signature.parameters.values()]
    returned = inspect.Signature.empty if inspect.isclass(obj) else _annotation(signature.return_annotation)
    return str(signature.replace(parameters=parameters, return_annotation=returned))


def documented_signature(obj: Any) -> Optional[str]:
    """The signature the API reference gives ``obj``: a function's or a class's constructor's; None for a module,
    a constant, a pytest fixture, an instance such as ``hookimpl`` and a class without one (an exception)."""
    if not (inspect.isfunction(obj) or inspect.isclass(obj)) or hasattr(obj, "_pytestfixturefunction"):
        return None
    try:
        return signature_text(obj)
    except ValueError:
        return None
