"""The import stage: the model read once and checked against its reference, the target made, a placement
file to replay read, and the model converted to the precision the run places it at."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import attrs

from collage_core import tvm_compat
from collage_core.errors import CollageError
from collage_core.model.model_import import ImportedModel, check_against_reference, load_model
from collage_core.model.precision import FP32, at_precision, check_precision, with_float32_units
from collage_core.options import OptimizeOptions
from collage_core.outputs.placement_file import Placement, load_placement


@attrs.frozen
class Imported:
    """The model as given (``original``, at float32) and as it is placed (``model``: at the run's precision,
    with the float32 units of a replayed placement), the ``target``, and the placement file replayed, if any."""

    original: ImportedModel = attrs.field(eq=False)
    model: ImportedModel = attrs.field(eq=False)
    target: Any = attrs.field(eq=False)
    replayed: Optional[Placement]


def import_model(model: Any, example_inputs: Optional[Sequence[Any]], options: OptimizeOptions, say: Callable[[str], None]) -> Imported:
    """``model`` (see :func:`load_model`) ready to place as ``options`` say. With verification, a model
    whose outputs cannot be checked fails here, before anything is measured."""
    original = load_model(model, example_inputs)
    if options.verify:
        say(check_against_reference(original))
    target = tvm_compat.make_target(options.target)
    replayed = load_placement(options.placement) if options.placement is not None else None
    precision = _precision_wanted(options.precision, replayed, options.placement)
    check_precision(precision, target, remote=options.rpc_tracker is not None)
    converted = at_precision(original, precision)
    if replayed is not None:
        converted = with_float32_units(converted, replayed.float32_units, original)
    return Imported(original, converted, target, replayed)


def _precision_wanted(precision: Optional[str], replayed: Optional[Placement], placement) -> str:
    """The precision asked for; a replayed placement's own (``replayed``, read from the file ``placement``)
    unless the caller names the same one."""
    if replayed is None:
        return precision or FP32
    recorded = replayed.precision
    if precision is not None and precision != recorded:
        raise CollageError(
            f"{placement}: the placement was made at precision {recorded}, not {precision}; "
            f"replay it at {recorded} (leave --precision out) or search again at {precision}"
        )
    return recorded
