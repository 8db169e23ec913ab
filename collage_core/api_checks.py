"""The Python API's arguments checked at its door: a value of the wrong type or out of range is one line
naming the argument (:class:`ArgumentError`), raised before a model is imported or anything measured.
The ``collage`` command's options are checked by the same rules as argparse reads them."""

from __future__ import annotations

import math
import numbers
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

from collage_core import tvm_compat
from collage_core.errors import CollageError
from collage_core.measure.timing import MeasureSettings
from collage_core.model.precision import PRECISIONS
from collage_core.search.two_level import TwoLevelSettings

SEARCHES = ("op-level", "two-level")
# Written and removed in the output folder before anything is measured: a file system that is full (or
# nearly) or read-only shows then, not after an hour of measuring.
PROBE_BYTES = 64 * 1024
# The least each TwoLevelSettings field may be: crossover draws two placements from the population.
TWO_LEVEL_LEAST = {"population": 2, "generations": 0, "patience": 1}
TWO_LEVEL_AT_LEAST_ZERO = ("budget_s", "min_gain")


class ArgumentError(CollageError):
    """An argument of Collage's Python API of the wrong type or out of range; the message names it."""


def count_problem(value: Any, least: int) -> str:
    """What is wrong with ``value`` as a whole number of at least ``least``; empty when nothing is."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return f"must be a whole number, not {_shown(value)}"
    if value < least:
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


def check_optimize_arguments(arguments: Mapping[str, Any]) -> None:
    """``optimize``'s arguments (its ``locals()`` as it starts): each of the type it takes and within
    range, the target one TVM makes, and the output folder one that can be written."""
    given = dict(arguments)
    backends = given.get("backends")
    if isinstance(backends, str):
        raise ArgumentError(f"optimize: backends must be a list of backend names, e.g. [{backends!r}], not the string "
                            f"{backends!r}")
    if backends is not None and (not isinstance(backends, (list, tuple)) or not all(isinstance(b, str) for b in backends)):
        _wrong("backends", "a list of backend names", backends)
    for name in ("placement", "cost_db", "output_dir"):
        if given.get(name) is not None and not isinstance(given[name], (str, os.PathLike)):
            _wrong(name, "a path (str or os.PathLike)", given[name])
    if given.get("example_inputs") is not None and not isinstance(given["example_inputs"], (list, tuple)):
        _wrong("example_inputs", "a tuple of tensors", given["example_inputs"])
    _instance(given, "settings", MeasureSettings)
    _instance(given, "two_level", TwoLevelSettings)
    for name in ("verify", "show_progress", "remeasure_invalid"):
        _instance(given, name, bool)
    if given.get("compare_backends") is not None:
        _instance(given, "compare_backends", bool)
    for name, choices in (("search", SEARCHES), ("precision", PRECISIONS)):
        if given.get(name) is not None and given[name] not in choices:
            _wrong(name, f"one of {', '.join(choices)}", given[name])
    _within("calibration_rounds", count_problem(given.get("calibration_rounds", 0), 0))
    _within("accuracy_blocks", count_problem(given.get("accuracy_blocks", 1), 1))
    if given.get("baseline_limit_s") is not None:
        _within("baseline_limit_s", number_problem(given["baseline_limit_s"]))
    if given.get("accuracy_budget") is not None:
        _within("accuracy_budget", number_problem(given["accuracy_budget"], above=True))
    if "settings" in given:
        _within("settings.build_workers", count_problem(given["settings"].build_workers, 0))
    if "two_level" in given:
        _check_two_level(given["two_level"])
    tvm_compat.make_target(given.get("target"))
    if given.get("output_dir"):
        problem = unwritable_because(given["output_dir"])
        if problem:
            raise ArgumentError(f"{given['output_dir']}: the output folder cannot be written ({problem}); nothing was "
                                "measured")


def _check_two_level(settings: TwoLevelSettings) -> None:
    for field, least in TWO_LEVEL_LEAST.items():
        _within(f"two_level.{field}", count_problem(getattr(settings, field), least))
    for field in TWO_LEVEL_AT_LEAST_ZERO:
        _within(f"two_level.{field}", number_problem(getattr(settings, field)))
    if settings.predict_margin is not None:
        _within("two_level.predict_margin", number_problem(settings.predict_margin))
    if isinstance(settings.seed, bool) or not isinstance(settings.seed, numbers.Integral):
        _wrong("two_level.seed", "a whole number", settings.seed)


def _instance(given: dict, name: str, kind: type) -> None:
    if name in given and not isinstance(given[name], kind):
        _wrong(name, f"a {kind.__module__}.{kind.__name__}" if kind is not bool else "True or False", given[name])


def _within(name: str, problem: str) -> None:
    if problem:
        raise ArgumentError(f"optimize: {name} {problem}")


def _wrong(name: str, wanted: str, value: Any) -> None:
    raise ArgumentError(f"optimize: {name} must be {wanted}, not {_shown(value)}")


def _shown(value: Any) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"{type(value).__name__} {shown}" if not isinstance(value, (int, float, str)) else shown
