"""The import stage: the model read once and checked against its reference, the target made, a placement
file to replay read, and the model converted to the precision the run places it at."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import attrs

from collage_core import tvm_compat
from collage_core.errors import CollageError
from collage_core.model.layout import AUTO, MODEL, resolve, with_layout
from collage_core.model.layout import describe as describe_layout
from collage_core.model.model_import import ImportedModel, check_against_reference, load_model
from collage_core.model.precision import FP32, at_precision, check_precision, with_float32_units
from collage_core.options import OptimizeOptions
from collage_core.outputs.placement_file import Placement, load_placement


@attrs.frozen
class Imported:
    """The model as given (``original``, at float32, its convolutions in the run's layout) and as it is placed
    (``model``: at the run's precision, with the float32 units of a replayed placement), the ``target``, and the
    placement file replayed, if any."""

    original: ImportedModel = attrs.field(eq=False)
    model: ImportedModel = attrs.field(eq=False)
    target: Any = attrs.field(eq=False)
    replayed: Optional[Placement]


def import_model(model: Any, example_inputs: Optional[Sequence[Any]], options: OptimizeOptions, say: Callable[[str], None]) -> Imported:
    """``model`` (see :func:`load_model`) ready to place as ``options`` say. With verification, a model
    whose outputs cannot be checked fails here, before anything is measured."""
    replayed = load_placement(options.placement) if options.placement is not None else None
    original = load_model(model, example_inputs)
    target = tvm_compat.make_target(options.target)
    precision = _recorded_or_asked("precision", options.precision, FP32, replayed, options.placement)
    check_precision(precision, target, remote=options.rpc_tracker is not None)
    asked_layout = None if options.layout == AUTO else options.layout
    layout = _recorded_or_asked("layout", asked_layout, resolve(AUTO, target, precision, original.mod), replayed, options.placement)
    if layout != MODEL:
        original = with_layout(original, layout)
        say(
            describe_layout(original)
            + (" (--layout auto: 16-bit convolutions on CUDA)" if asked_layout is None and replayed is None else "")
        )
    if options.verify:
        say(check_against_reference(original))
    converted = at_precision(original, precision)
    if replayed is not None:
        converted = with_float32_units(converted, replayed.float32_units, original)
    return Imported(original, converted, target, replayed)


def _recorded_or_asked(field: str, asked: Optional[str], default: str, replayed: Optional[Placement], placement) -> str:
    """The ``field`` (precision, layout) asked for; a replayed placement's own (``replayed``, read from the file
    ``placement``) unless the caller names the same one."""
    if replayed is None:
        return asked or default
    recorded = getattr(replayed, field)
    if asked is not None and asked != recorded:
        raise CollageError(
            f"{placement}: the placement was made at {field} {recorded}, not {asked}; "
            f"replay it at {recorded} (leave --{field} out) or search again at {asked}"
        )
    return recorded
