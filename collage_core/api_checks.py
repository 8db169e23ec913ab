"""What each option of Collage's Python API must be, said once for the API and the ``collage`` command.

A record's field carries its :class:`Rule` and a one-line help text in its metadata (see
:func:`described`). The record's check names the field and the problem in one line
(:class:`ArgumentError`), raised before a model is imported or anything measured; the command reads
the option's text with the rule's ``parse`` and refuses it with the same problem, as argparse's usage
error."""

from __future__ import annotations

import math
import numbers
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import attrs

from collage_core.errors import CollageError

# Written and removed in the output folder before anything is measured: a file system that is full (or
# nearly) or read-only shows then, not after an hour of measuring.
PROBE_BYTES = 64 * 1024


class ArgumentError(CollageError):
    """An argument of Collage's Python API of the wrong type or out of range; the message names it."""


@attrs.frozen
class Rule:
    """What a value must be. ``problem(value)``: what is wrong with it, empty when nothing is; with
    ``names_itself`` the problem is a whole message that names the value itself (a target's, from TVM).
    ``parse(text)``: the value an option's text on the command line stands for (ValueError, whose
    message is the problem, when it stands for none). ``choices``: the values there are, where they are few.
    ``error``: what the Python API raises for a value that breaks the rule."""

    problem: Callable[[Any], str]
    parse: Callable[[str], Any] = str
    names_itself: bool = False
    choices: Optional[Sequence[str]] = None
    error: type = ArgumentError

    def or_none(self) -> "Rule":
        """The same rule, with None allowed too."""
        return attrs.evolve(self, problem=lambda value: "" if value is None else self.problem(value))

    def message(self, name: str, value: Any) -> str:
        """The one line that refuses ``value`` for the argument ``name``; empty when it is fine."""
        problem = self.problem(value)
        if not problem or self.names_itself:
            return problem
        return f"{name} {problem}"


def refuse_unless_met(name: str, rule: Rule, value: Any, of: str = "optimize") -> None:
    """Raise the rule's error (:class:`ArgumentError`) when ``value`` breaks ``rule``: one line naming ``name``,
    the argument of ``of``."""
    message = rule.message(name, value)
    if message:
        raise rule.error(message if rule.names_itself else f"{of}: {message}")


def described(default: Any, rule: Rule, help: str, converter: Optional[Callable[[Any], Any]] = None, **metadata: Any) -> Any:
    """A record's field: its default, the rule its value must meet and a one-line help text (the
    ``collage`` command's ``--help`` for its option), more ``metadata`` if any. Nothing is checked as
    the record is made: the record holding it checks it (see ``collage_core.options``)."""
    return attrs.field(default=default, converter=converter, metadata={"rule": rule, "help": help, **metadata})


def count_problem(value: Any, least: Optional[int]) -> str:
    """What is wrong with ``value`` as a whole number of at least ``least`` (None: any); empty when nothing is."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return f"must be a whole number, not {_shown(value)}"
    if least is not None and value < least:
        return f"must be at least {least}, not {value}"
    return ""


def number_problem(value: Any, least: float = 0.0, above: bool = False) -> str:
    """What is wrong with ``value`` as a finite number of at least ``least`` (``above``: more than it); empty when nothing is."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"must be a number, not {_shown(value)}"
    if not math.isfinite(value):
        return f"must be a finite number, not {value}"
    if value < least or (above and value == least):
        return f"must be {'more than' if above else 'at least'} {least:g}, not {value:g}"
    return ""


def whole(least: Optional[int]) -> Rule:
    """A whole number of at least ``least`` (None: any)."""
    return Rule(lambda value: count_problem(value, least), parse=_read(int, "a whole number"))


def number(least: float = 0.0, above: bool = False) -> Rule:
    """A finite number of at least ``least`` (``above``: more than it)."""
    return Rule(lambda value: number_problem(value, least, above), parse=_read(float, "a number"))


def one_of(choices: Sequence[str]) -> Rule:
    """One of a few names."""

    def problem(value: Any) -> str:
        return "" if value in choices else f"must be one of {', '.join(choices)}, not {_shown(value)}"

    return Rule(problem, choices=tuple(choices))


def instance_of(kind: type) -> Rule:
    """An instance of ``kind`` (True or False, for ``bool``)."""
    wanted = "True or False" if kind is bool else f"a {kind.__module__}.{kind.__name__}"
    return Rule(lambda value: "" if isinstance(value, kind) else f"must be {wanted}, not {_shown(value)}")


def _path_problem(value: Any) -> str:
    return "" if isinstance(value, (str, os.PathLike)) else f"must be a path (str or os.PathLike), not {_shown(value)}"


PATH = Rule(_path_problem)
BOOLEAN = instance_of(bool)


def _names_problem(value: Any) -> str:
    if isinstance(value, str):
        return f"must be a list of backend names, e.g. [{value!r}], not the string {value!r}"
    if not isinstance(value, (list, tuple)) or not all(isinstance(name, str) for name in value):
        return f"must be a list of backend names, not {_shown(value)}"
    return ""


# Backend names: a list in Python, comma-separated on the command line.
BACKEND_NAMES = Rule(_names_problem, parse=lambda text: text.split(","))


def refuse_unwritable_output(folder: Optional[os.PathLike]) -> None:
    """Raise :class:`ArgumentError` when files cannot be written in the output folder ``folder`` (None: a
    temporary one), before anything is measured."""
    if folder is not None and str(folder) == "":
        raise ArgumentError("optimize: output_dir is an empty string: name a folder, or leave it out for a temporary one")
    problem = unwritable_because(folder) if folder else ""
    if problem:
        raise ArgumentError(f"{folder}: the output folder cannot be written ({problem}); nothing was measured")


def unwritable_because(folder: os.PathLike) -> str:
    """Why files cannot be written in ``folder`` (or, where it does not exist yet, in the nearest folder
    above it that does, where it would be made); empty when they can. :data:`PROBE_BYTES` are written
    there and removed."""
    existing = Path(folder)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    try:
        with tempfile.TemporaryFile(dir=existing) as probe:
            probe.write(bytes(PROBE_BYTES))
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as error:
        return f"cannot write in {existing} ({error.strerror})"
    return ""


def _read(kind: type, wanted: str) -> Callable[[str], Any]:
    def read(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"must be {wanted}, not {text!r}") from None

    return read


def _shown(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # a tensor or an array: its shape, not its numbers
        return f"{type(value).__name__} of shape {tuple(value.shape)} ({value.dtype})"
    if isinstance(value, (list, tuple)) and any(hasattr(item, "shape") for item in value):  # tensors by their shapes
        items = ", ".join(_shown(item) for item in value[:3]) + (", ..." if len(value) > 3 else "")
        return f"{type(value).__name__} of {len(value)} item{'s' * (len(value) != 1)} ({items})"
    shown = " ".join(repr(value).split())  # on one line
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"{type(value).__name__} {shown}" if not isinstance(value, (int, float, str)) else shown


def _inputs_problem(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, (list, tuple)):
        return f"must be a tuple of tensors, not {_shown(value)}"
    torch = sys.modules.get("torch")  # not loaded: the model is no PyTorch module, and reads no example inputs
    for index, item in enumerate(value if torch is not None else ()):
        if not isinstance(item, torch.Tensor):
            return (
                f"must be a tuple of tensors, one per argument of forward: item {index} is {_shown(item)} (a forward that "
                "takes nested or other arguments can be wrapped in a module whose forward takes tensors one by one)"
            )
    return ""


# A PyTorch module's example inputs (None for a model that knows its own).
EXAMPLE_INPUTS = Rule(_inputs_problem)
