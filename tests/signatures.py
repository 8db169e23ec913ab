"""Signatures as docs/plugins.md writes them, for the tests that hold the docs to the code."""

from __future__ import annotations

import inspect
from typing import Any, Callable

# How the docs write a default that is made anew for each call (an attrs factory) or is a function.
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
    # Under ``from __future__ import annotations`` an annotation is the source's text; otherwise the object.
    return _Written(annotation if isinstance(annotation, str) else inspect.formatannotation(annotation))


def _default(default: Any) -> Any:
    if default is inspect.Parameter.empty:
        return default
    if callable(default) or type(default).__name__ == "_Nothing":  # attrs' NOTHING: a factory's default
        return _Written(MADE_PER_CALL)
    return default


def signature_text(obj: Callable) -> str:
    """``obj``'s signature as the docs write it: each annotation as the source spells it (unquoted), a default
    made per call as ``...``, and a class's without its ``__init__``'s ``-> None``."""
    signature = inspect.signature(obj)
    parameters = [p.replace(annotation=_annotation(p.annotation), default=_default(p.default))
                  for p in signature.parameters.values()]
    returned = inspect.Signature.empty if inspect.isclass(obj) else _annotation(signature.return_annotation)
    return str(signature.replace(parameters=parameters, return_annotation=returned))
